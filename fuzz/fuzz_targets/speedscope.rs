//! AFL++ target: speedscope files converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::speedscope_target(data);
    });
}
