//! Pyroscope's Connect push API, `POST /push.v1.PusherService/Push`: binary protobuf
//! (`application/proto`) or proto JSON (`application/json`, `rawProfile` in base64), gzip
//! or not. The request is read (its counts and size checked on its bytes first, within the
//! request limits) and its samples decoded by [`frostdb_pprof::convert::push`]
//! (series labels `__name__`, the profile name, and `__delta__`); this is the HTTP around it.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use frostdb_pprof::convert::push::{self, Encoding, proto};
use prost::Message;

use super::{Incoming, body_bytes, content_type, store};
use crate::edge::RequestMemory;
use crate::error::{ApiError, ApiResult};
use crate::{Shared, TenantId};

/// `POST /push.v1.PusherService/Push`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: RequestMemory,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = content_type(&headers);
    let encoding = match kind.as_str() {
        "application/proto" | "application/protobuf" | "application/x-protobuf" | "" => {
            Encoding::Protobuf
        }
        "application/json" => Encoding::Json,
        other => {
            return Err(ApiError::unsupported(format!(
                "Content-Type {other:?}: send application/proto or application/json"
            )));
        }
    };
    let limits = crate::codec::request_limits(&state.config);
    let request = push::parse(
        encoding,
        &body_bytes(&state, &headers, body, &memory)?,
        &limits,
    )
    .map_err(|e| crate::codec::push_refusal(e, &state.config))?;
    let limits = state.tenants.pprof_limits();
    // One decoded profile at a time: the request may hold many.
    let mut profiles = 0;
    for pushed in push::profiles(&request, &limits)? {
        let pushed = pushed?;
        let incoming = Incoming {
            profile: pushed.profile,
            previous: None,
            name: pushed.name,
            labels: pushed.labels,
            delta: pushed.delta,
            timestamp_ms: None,
        };
        store(&state, &tenant, incoming)
            .await
            .map_err(|e| e.context(&pushed.at))?;
        profiles += 1;
    }
    tracing::debug!(%tenant, profiles, "push");
    Ok(match encoding {
        Encoding::Json => ([(header::CONTENT_TYPE, "application/json")], "{}").into_response(),
        Encoding::Protobuf => (
            [(header::CONTENT_TYPE, "application/proto")],
            proto::PushResponse::default().encode_to_vec(),
        )
            .into_response(),
    })
}
