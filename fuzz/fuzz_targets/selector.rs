//! AFL++ target: label selectors parsed and turned into engine predicates.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::selector_target(data);
    });
}
