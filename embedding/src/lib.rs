//! The README, whose Rust examples run here as doc tests (see `Cargo.toml`).
#![doc = include_str!("../../README.md")]
