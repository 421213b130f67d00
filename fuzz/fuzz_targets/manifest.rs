//! AFL++ target: the manifest (JSON), parsed and round-tripped.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_core::fuzzing::manifest_target(data);
    });
}
