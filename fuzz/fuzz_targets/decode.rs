//! pprof decoding on arbitrary bytes (gzip or raw protobuf).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    frostdb_pprof::fuzzing::decode_target(data);
});
