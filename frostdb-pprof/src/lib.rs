//! pprof in and out for frostdb-rs.
//!
//! What comes here: a strict, bounded pprof decoder (gzip or raw `perftools.profiles.Profile`),
//! normalization of profiles into sample rows plus deduplicated stacks, locations, functions
//! and mappings, and the reports a profiler shows: merged pprof, flame graph tree, top table,
//! folded stacks and diffs.
