//! Decoding, normalizing and storing arbitrary bytes, then reading back what was stored.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    frostdb_pprof::fuzzing::normalize_target(data);
});
