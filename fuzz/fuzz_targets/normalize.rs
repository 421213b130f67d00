//! AFL++ target: decoding, normalizing and storing a pprof profile in memory, then reading back every stored stack.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::normalize_target(data);
    });
}
