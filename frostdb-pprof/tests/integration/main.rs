//! The crate's integration tests, one module per area, linked into one test binary: each
//! binary links the whole dependency tree (hundreds of MB unoptimised), so one binary rather
//! than one per file keeps a clean build's disk and link time down. nextest still runs every
//! test in its own process; `cargo nextest run -p CRATE -E 'test(/^crash::/)'` runs one area.

mod aggregation;
mod arrow;
mod common;
mod crash;
mod decode;
mod decode_memory;
mod dedup;
mod deep_stacks;
mod flamegraph;
mod fuzz_corpus;
mod group_commit;
mod jfr;
mod legacy_profiles;
mod limits;
mod regress;
mod rollup;
mod roundtrip;
mod rules;
mod shared;
mod store;
mod symbolize;
mod symbols;
