//! Generates, with prost, the pprof message types from `proto/profile.proto`, the OTLP profile
//! messages from `proto/otlp.proto`, Pyroscope's push messages from `proto/push.proto`, and
//! the messages of Pyroscope's query API (`proto/{querier,types,settings,google}/v1`), the
//! last with proto3 JSON (pbjson: int64 as strings, lowerCamel or original field names in).
//! protox parses the protos in Rust, so no `protoc` is needed.

use prost::Message as _;

/// The query API's packages, whose messages also get serde implementations.
const API_PACKAGES: [&str; 4] = [".types.v1", ".querier.v1", ".settings.v1", ".google.v1"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(
        [
            "proto/profile.proto",
            "proto/otlp.proto",
            "proto/push.proto",
            "proto/querier/v1/querier.proto",
            "proto/settings/v1/setting.proto",
        ],
        ["proto"],
    )?;
    let bytes = descriptors.encode_to_vec();
    prost_build::Config::new().compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&bytes)?
        .build(&API_PACKAGES)?;
    Ok(())
}
