//! The crate's integration tests, one module per area, linked into one test binary: each
//! binary links the whole dependency tree (hundreds of MB unoptimised), so one binary rather
//! than one per file keeps a clean build's disk and link time down. nextest still runs every
//! test in its own process; `cargo nextest run -p CRATE -E 'test(/^crash::/)'` runs one area.

mod common;
mod concurrency;
mod crash;
mod durability;
mod enospc;
mod fuzz_corpus;
mod model;
mod model_faults;
mod read_only;
mod s3;
mod shared;
mod shared_faults;
mod table;
mod workers;
