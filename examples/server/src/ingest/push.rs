//! Pyroscope's Connect push API, `POST /push.v1.PusherService/Push`: binary protobuf
//! (`application/proto`) or proto JSON (`application/json`, `rawProfile` in base64), gzip
//! or not. The request is read (its counts and size checked on its bytes first, within the
//! request limits) and its samples decoded by [`frostdb_pprof::convert::push`]
//! (series labels `__name__`, the profile name, and `__delta__`); this is the HTTP around it.
//! A request's profiles are stored whole or not at all.

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
    // Read, decoded and stored in the ingest lane, whole or not at all.
    let (decoding, request_limits) = (state.clone(), crate::codec::request_limits(&state.config));
    let charged = memory.clone();
    let stored = store(&state, &tenant, Some(charged), move || {
        let body = body_bytes(&decoding, &headers, body, &memory)?;
        let request = push::parse(encoding, &body, &request_limits)
            .map_err(|e| crate::codec::push_refusal(e, &decoding.config))?;
        drop(body);
        let limits = decoding.tenants.pprof_limits();
        push::profiles(&request, &limits, &request_limits)?
            .map(|p| Ok(Incoming::from(p?)))
            .collect()
    })
    .await?;
    let profiles = stored.len();
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
