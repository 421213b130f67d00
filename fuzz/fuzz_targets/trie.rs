//! AFL++ target: Pyroscope's trie and tree bodies converted to pprof.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::trie_target(data);
    });
}
