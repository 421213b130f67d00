//! AFL++ target: WAL segments and record payloads (Arrow IPC, zstd).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_core::fuzzing::wal_target(data);
    });
}
