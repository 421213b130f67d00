//! OpenTelemetry profiles (`POST /v1development/profiles`, protobuf
//! `ExportProfilesServiceRequest` of opentelemetry-proto profiles/v1development), converted
//! to pprof by [`frostdb_pprof::convert::otlp`]: each OTLP `Profile` is stored as a pprof
//! profile under its series labels.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use frostdb_pprof::convert::otlp::{self, proto};
use prost::Message;

use super::{Incoming, body_bytes, content_type, store};
use crate::server::error::{ApiError, ApiResult};
use crate::server::{Shared, TenantId};

/// `POST /v1development/profiles`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
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
    let body = body_bytes(&state, &headers, &body)?;
    let request = proto::ExportProfilesServiceRequest::decode(body.as_slice())
        .map_err(|e| ApiError::bad_request(format!("ExportProfilesServiceRequest: {e}")))?;
    let converted = otlp::convert(&request, &state.tenants.pprof_limits())?;
    let profiles = converted.len();
    for c in converted {
        let incoming = Incoming {
            profile: c.profile,
            previous: None,
            name: c.name,
            labels: c.labels,
            delta: false,
            timestamp_ms: None,
        };
        store(&state, &tenant, incoming).await?;
    }
    tracing::debug!(%tenant, profiles, "otlp export");
    Ok((
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        proto::ExportProfilesServiceResponse::default().encode_to_vec(),
    )
        .into_response())
}
