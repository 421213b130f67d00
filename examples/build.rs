//! Generates the push message types (prost; protox parses the proto, no protoc). The OTLP
//! messages live in `frostdb_pprof::convert::otlp::proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["proto/push.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
