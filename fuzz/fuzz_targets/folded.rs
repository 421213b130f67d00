//! AFL++ target: folded stacks and lines bodies converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::folded_target(data);
    });
}
