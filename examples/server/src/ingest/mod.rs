//! What clients push: each protocol turns its request into [`Incoming`] pprof profiles,
//! and [`store`] admits and stores them.

pub mod legacy;
pub mod otlp;
pub mod push;

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use frostdb_pprof::{IngestSummary, ValidProfile};

use super::Shared;
use super::edge::RequestMemory;
use super::error::{ApiError, ApiResult};

/// The ingest routes.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/push.v1.PusherService/Push", post(push::handle))
        .route("/ingest", post(legacy::handle))
        .route("/pyroscope/ingest", post(legacy::handle))
        .route("/v1development/profiles", post(otlp::handle))
        .route(otlp::GRPC_EXPORT, post(otlp::handle_grpc))
}

/// One profile to store.
#[derive(Debug)]
pub struct Incoming {
    /// The profile, checked against the limits.
    pub profile: ValidProfile,
    /// The same process's earlier profile: cumulative types are stored as the difference.
    pub previous: Option<ValidProfile>,
    /// Profile name (`process_cpu`, `memory`, ...).
    pub name: String,
    /// Series labels.
    pub labels: Vec<(String, String)>,
    /// Store cumulative types as deltas between consecutive profiles of the series.
    pub delta: bool,
    /// When the profile was taken, if the request says (else the profile's `time_nanos`).
    pub timestamp_ms: Option<i64>,
}

/// Whether a pushed label is stored: names beginning with `__` are Pyroscope's own (the
/// profile name, its type, `__delta__`) and are dropped as Pyroscope drops them at
/// ingestion, except `__session_id__`, which it keeps.
fn allowed_label(name: &str) -> bool {
    !name.starts_with("__") || name == "__session_id__"
}

/// Admits the series against the tenant's limit, then stores the profile in the ingest
/// lane (off the async threads, as many at once as `limits.max_concurrent_ingest`).
/// Returns once the samples are durable.
pub async fn store(state: &Shared, tenant: &str, incoming: Incoming) -> ApiResult<IngestSummary> {
    let tenant = state.tenants.for_write(tenant).await?;
    let mut labels: Vec<(String, String)> = incoming
        .labels
        .into_iter()
        .filter(|(k, v)| !v.is_empty() && allowed_label(k))
        .map(|(k, v)| (frostdb_pprof::sanitize_label(&k), v))
        .collect();
    labels.sort();
    if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::bad_request(format!(
            "label {:?} is given twice (after making label names column-safe)",
            w[0].0
        )));
    }
    if incoming.name.is_empty() {
        return Err(ApiError::bad_request("the profile has no name"));
    }
    let options = frostdb_pprof::IngestOptions::default()
        .name(incoming.name)
        .labels(labels)
        .delta(incoming.delta)
        .timestamp_ms(incoming.timestamp_ms);
    let (profile, previous) = (incoming.profile, incoming.previous);
    state
        .work
        .ingest
        .blocking(move |_| match previous {
            Some(previous) => Ok(tenant
                .store
                .ingest_with_previous(&profile, &previous, &options)?),
            None => Ok(tenant.store.ingest_profile(&profile, &options)?),
        })
        .await
}

/// The body, decompressed when `Content-Encoding: gzip`, within the decompressed limit;
/// the decompressed bytes are reserved from the request's memory before they are made (by
/// the size the gzip trailer states, then by what they really are).
pub fn body_bytes(
    state: &Shared,
    headers: &HeaderMap,
    body: Bytes,
    memory: &RequestMemory,
) -> ApiResult<Bytes> {
    let encoding = headers
        .get(axum::http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "identity" | "" => Ok(body),
        "gzip" | "x-gzip" => {
            let limit = state.config.limits.max_decompressed_bytes;
            let stated = body
                .len()
                .checked_sub(4)
                .and_then(|at| body.get(at..))
                .and_then(|t| <[u8; 4]>::try_from(t).ok())
                .map_or(0, |t| u32::from_le_bytes(t) as usize);
            let expected = stated.min(limit);
            memory.try_grow(expected, "decompressing the request body")?;
            let raw = frostdb_pprof::inflate(&body, limit)
                .map_err(|e| ApiError::from(e).context("Content-Encoding: gzip body"))?
                .into_owned();
            // The trailer may understate (several members, or a lie): what is over is
            // reserved now that it exists, so that other work sees it.
            if raw.len() > expected {
                memory.try_grow(raw.len() - expected, "decompressing the request body")?;
            }
            Ok(Bytes::from(raw))
        }
        other => Err(ApiError::unsupported(format!(
            "Content-Encoding {other:?} is not supported (use gzip or none)"
        ))),
    }
}

/// The content type without parameters, lower case.
pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}
