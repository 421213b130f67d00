//! The crate's integration tests, one module per area, linked into one test binary: each
//! binary links the whole dependency tree (hundreds of MB unoptimised), so one binary rather
//! than one per file keeps a clean build's disk and link time down. nextest still runs every
//! test in its own process; `cargo nextest run -p CRATE -E 'test(/^crash::/)'` runs one area.

mod attack_mix;
mod cli;
mod cluster;
mod common;
mod hostile;
mod mutations;
mod parca;
mod pyroscope_api;
mod pyroscope_clients;
mod readme;
mod regressions;
mod request_bounds;
mod rules;
mod server;
mod symbolize;
