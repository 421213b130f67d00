//! What a profiler shows of a merged profile: a pprof file, a flame graph (JSON, Arrow, SVG),
//! the top table, folded stacks, diffs.

pub mod pprof;
pub mod svg;
pub mod top;
pub mod tree;
