//! Generates the gRPC services of Pyroscope's query API (`querier.v1.QuerierService`,
//! `settings.v1.SettingsService`) and OTLP's profiles collector with tonic; their messages are
//! frostdb-pprof's (`frostdb_pprof::api`, `frostdb_pprof::convert::otlp::proto`), so only the
//! service glue is generated here. protox parses the protos in Rust, so no `protoc` is
//! needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../frostdb-pprof/proto");
    let descriptors = protox::compile(
        [
            "querier/v1/querier.proto",
            "settings/v1/setting.proto",
            "otlp_collector.proto",
        ],
        ["../frostdb-pprof/proto"],
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .extern_path(".querier.v1", "::frostdb_pprof::api::querier::v1")
        .extern_path(".types.v1", "::frostdb_pprof::api::types::v1")
        .extern_path(".settings.v1", "::frostdb_pprof::api::settings::v1")
        .extern_path(".google.v1", "::frostdb_pprof::proto")
        .extern_path(".otlp.profiles", "::frostdb_pprof::convert::otlp::proto")
        .compile_fds(descriptors)?;
    Ok(())
}
