//! OpenTelemetry profiles (`POST /v1development/profiles`, protobuf
//! `ExportProfilesServiceRequest` of opentelemetry-proto profiles/v1development, and the same
//! over gRPC at `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`),
//! converted to pprof by [`frostdb_pprof::convert::otlp`]: each OTLP `Profile` is stored as a
//! pprof profile under its series labels, a request's profiles whole or not at all. The request is checked within the
//! request limits on its bytes before it is decoded (over gRPC by the service's codec).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use frostdb_pprof::convert::otlp::{self, proto};
use prost::Message;

use super::{Incoming, body_bytes, content_type, store};
use crate::codec::request_limits;
use crate::edge::RequestMemory;
use crate::error::{ApiError, ApiResult};
use crate::{Shared, TenantId};

/// `POST /v1development/profiles`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: RequestMemory,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = content_type(&headers);
    if !matches!(
        kind.as_str(),
        "application/x-protobuf" | "application/protobuf" | "application/proto" | ""
    ) {
        return Err(ApiError::unsupported(format!(
            "Content-Type {kind:?}: OTLP profiles are accepted as application/x-protobuf"
        )));
    }
    let decoding = state.clone();
    let charged = memory.clone();
    export(&state, &tenant, Some(charged), move || {
        let body = body_bytes(&decoding, &headers, body, &memory)?;
        let request = otlp::parse(&body, &request_limits(&decoding.config))?;
        drop(body);
        Ok(request)
    })
    .await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        proto::ExportProfilesServiceResponse::default().encode_to_vec(),
    )
        .into_response())
}

/// Converts and stores every profile of an export request (`read` reads it), in the ingest
/// lane, whole or not at all; the count stored. Acknowledged only once durable.
pub async fn export<F>(
    state: &Shared,
    tenant: &str,
    memory: Option<RequestMemory>,
    read: F,
) -> ApiResult<usize>
where
    F: FnOnce() -> ApiResult<proto::ExportProfilesServiceRequest> + Send + 'static,
{
    let converting = state.clone();
    let stored = store(state, tenant, memory, move || {
        let request = read()?;
        let limits = converting.tenants.pprof_limits();
        otlp::profiles(&request, &limits, &request_limits(&converting.config))?
            .map(|c| Ok(Incoming::from(c?)))
            .collect()
    })
    .await?;
    tracing::debug!(%tenant, profiles = stored.len(), "otlp export");
    Ok(stored.len())
}

/// The generated gRPC glue of the collector service.
#[allow(missing_docs, clippy::all, unreachable_pub, rust_2018_idioms)]
pub mod grpc {
    include!(concat!(
        env!("OUT_DIR"),
        "/server/opentelemetry.proto.collector.profiles.v1development.rs"
    ));
    include!(concat!(
        env!("OUT_DIR"),
        "/client/opentelemetry.proto.collector.profiles.v1development.rs"
    ));
}

/// The gRPC route's path.
pub const GRPC_EXPORT: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// `Export` over gRPC: the tenant from the `x-scope-orgid` metadata.
#[derive(Debug)]
struct Collector {
    state: Shared,
}

#[tonic::async_trait]
impl grpc::profiles_service_server::ProfilesService for Collector {
    async fn export(
        &self,
        request: tonic::Request<proto::ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<proto::ExportProfilesServiceResponse>, tonic::Status> {
        let tenant = crate::querier::grpc_tenant(request.metadata())?;
        let memory = request.extensions().get::<RequestMemory>().cloned();
        let request = request.into_inner();
        export(&self.state, &tenant, memory, move || Ok(request))
            .await
            .map_err(crate::querier::status)?;
        Ok(tonic::Response::new(
            proto::ExportProfilesServiceResponse::default(),
        ))
    }
}

/// `POST` [`GRPC_EXPORT`]: gRPC (and gRPC-Web) with tonic, messages up to the body limit.
pub async fn handle_grpc(State(state): State<Shared>, request: axum::extract::Request) -> Response {
    let limit = state.config.limits.max_body_bytes;
    crate::codec::set_grpc_limits(&state.config);
    let service = grpc::profiles_service_server::ProfilesServiceServer::new(Collector { state })
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .max_decoding_message_size(limit);
    crate::querier::serve_grpc(tonic::service::Routes::new(service), request).await
}
