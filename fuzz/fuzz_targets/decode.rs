//! AFL++ target: pprof decoding (gzip or raw protobuf, strict validation, limits).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::decode_target(data);
    });
}
