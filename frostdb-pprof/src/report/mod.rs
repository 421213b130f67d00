//! What a profiler shows of a merged profile: a pprof file, a flame graph (JSON, Arrow, SVG),
//! the top table, folded stacks, diffs.

/// Maps keyed by names and symbols built per query: foldhash, not SipHash (a report hashes
/// every frame of every stack it shows; the keys come from stored symbols).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

pub mod pprof;
pub mod svg;
pub mod top;
pub mod tree;
