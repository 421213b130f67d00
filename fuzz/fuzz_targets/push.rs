//! AFL++ target: Pyroscope push requests (protobuf and JSON) converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::push_target(data);
    });
}
