//! AFL++ target: Parca Agent's WriteRaw requests and WriteArrow records converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::parca_target(data);
    });
}
