//! AFL++ target: JFR recordings converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::jfr_target(data);
    });
}
