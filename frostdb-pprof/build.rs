//! Generates, with prost, the pprof message types from `proto/profile.proto`, the OTLP profile
//! messages from `proto/otlp.proto`, Pyroscope's push messages from `proto/push.proto`,
//! Parca Agent's (`proto/parca`: its profile store and debug info upload), and
//! the messages of Pyroscope's query API (`proto/{querier,types,settings,google}/v1`), the
//! last with proto3 JSON (pbjson: int64 as strings, lowerCamel or original field names in).
//! protox parses the protos in Rust, so no `protoc` is needed.

use prost::Message as _;

/// The packages whose messages also get serde implementations: the query API's, and pprof,
/// which it returns.
const JSON_PACKAGES: [&str; 4] = [
    ".types.v1",
    ".querier.v1",
    ".settings.v1",
    ".perftools.profiles",
];

/// `google.v1.Profile`, pprof under the package the query API names it by, is the same
/// message as `perftools.profiles.Profile`: one Rust type for both.
const GOOGLE_V1: (&str, &str) = (".google.v1", "crate::proto");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(
        [
            "proto/profile.proto",
            "proto/otlp.proto",
            "proto/push.proto",
            "proto/parca/profilestore.proto",
            "proto/parca/debuginfo.proto",
            "proto/querier/v1/querier.proto",
            "proto/settings/v1/setting.proto",
        ],
        ["proto"],
    )?;
    let bytes = descriptors.encode_to_vec();
    // For the test that checks the request shapes of `bounds` against the protos.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), &bytes)?;
    prost_build::Config::new()
        .extern_path(GOOGLE_V1.0, GOOGLE_V1.1)
        .compile_fds(descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&bytes)?
        .extern_path(GOOGLE_V1.0, GOOGLE_V1.1)
        // As connect-go's protojson (`DiscardUnknown`): fields and enum names a newer client
        // sends that these protos lack are skipped, not refused (Grafana's Profiles
        // Drilldown sends `PROFILE_FORMAT_FUNCTIONS` and falls back when it gets a graph).
        .ignore_unknown_fields()
        .ignore_unknown_enum_variants()
        .build(&JSON_PACKAGES)?;
    Ok(())
}
