//! Generates the pprof message types from `proto/profile.proto`, the OTLP profile messages
//! from `proto/otlp.proto` and Pyroscope's push messages from `proto/push.proto` with prost;
//! protox parses the protos in Rust, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/profile.proto");
    println!("cargo:rerun-if-changed=proto/otlp.proto");
    println!("cargo:rerun-if-changed=proto/push.proto");
    let descriptors = protox::compile(
        [
            "proto/profile.proto",
            "proto/otlp.proto",
            "proto/push.proto",
        ],
        ["proto"],
    )?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
