//! AFL++ target: OTLP ExportProfilesServiceRequest through the request pre-scan, checked against prost, then converted one profile at a time.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::otlp_bounds_target(data);
    });
}
