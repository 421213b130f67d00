//! AFL++ target: OTLP ExportProfilesServiceRequest converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::otlp_target(data);
    });
}
