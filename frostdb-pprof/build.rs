//! Generates the pprof message types from `proto/profile.proto` and the OTLP profile messages
//! from `proto/otlp.proto` with prost; protox parses the protos in Rust, so no `protoc` is
//! needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/profile.proto");
    println!("cargo:rerun-if-changed=proto/otlp.proto");
    let descriptors = protox::compile(["proto/profile.proto", "proto/otlp.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
