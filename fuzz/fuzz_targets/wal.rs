//! AFL++ target: WAL segments and record payloads (Arrow IPC, zstd).
//!
//! Without AFL's panic hook: arrow-ipc 59 panics on some malformed schemas and the WAL
//! decoder turns those panics into errors (`catch_unwind`), which the hook's abort would
//! defeat. A panic that escapes the target still aborts, through afl's own `catch_unwind`.

fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    afl::fuzz_nohook!(|data: &[u8]| {
        frostdb_core::fuzzing::wal_target(data);
    });
}
