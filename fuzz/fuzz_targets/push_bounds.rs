//! AFL++ target: Pyroscope push requests through the request pre-scan (protobuf and JSON), checked against prost and serde, then converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::push_bounds_target(data);
    });
}
