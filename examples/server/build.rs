//! Generates the gRPC services of Pyroscope's query API (`querier.v1.QuerierService`,
//! `settings.v1.SettingsService`) and OTLP's profiles collector with tonic; their messages are
//! frostdb-pprof's (`frostdb_pprof::api`, `frostdb_pprof::convert::otlp::proto`), so only the
//! service glue is generated here: the servers' with a codec that checks each request
//! within the request limits before decoding it, the clients' (for tests) with tonic's. protox parses the protos in Rust, so no `protoc` is
//! needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../frostdb-pprof/proto");
    let descriptors = protox::compile(
        [
            "querier/v1/querier.proto",
            "settings/v1/setting.proto",
            "otlp_collector.proto",
            "parca/profilestore.proto",
            "parca/debuginfo.proto",
        ],
        ["../../frostdb-pprof/proto"],
    )?;
    // Servers decode requests with the server's codec, which checks a request's bytes
    // within the request limits first (`src/codec.rs`); clients (tests) with
    // tonic's. Generated apart, into `server/` and `client/`.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    for (dir, server) in [("server", true), ("client", false)] {
        let dir = out.join(dir);
        std::fs::create_dir_all(&dir)?;
        let mut builder = tonic_prost_build::configure()
            .build_server(server)
            .build_client(!server)
            .build_transport(false)
            .out_dir(&dir)
            .extern_path(".querier.v1", "::frostdb_pprof::api::querier::v1")
            .extern_path(".types.v1", "::frostdb_pprof::api::types::v1")
            .extern_path(".settings.v1", "::frostdb_pprof::api::settings::v1")
            .extern_path(".google.v1", "::frostdb_pprof::proto")
            .extern_path(".otlp.profiles", "::frostdb_pprof::convert::otlp::proto")
            .extern_path(
                ".parca.profilestore.v1alpha1",
                "::frostdb_pprof::convert::parca::proto",
            )
            .extern_path(
                ".parca.debuginfo.v1alpha1",
                "::frostdb_pprof::debuginfo::proto",
            );
        if server {
            builder = builder.codec_path("crate::codec::BoundedCodec");
        }
        builder.compile_fds(descriptors.clone())?;
    }
    Ok(())
}
