//! What clients push: each protocol turns its request into [`Incoming`] pprof profiles,
//! and [`store`] admits and stores them.

pub mod debuginfo;
pub mod legacy;
pub mod otlp;
pub mod parca;
pub mod push;
pub mod rate;

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::{post, put};
use frostdb_pprof::IngestSummary;
pub use frostdb_pprof::convert::Incoming;

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
        .route(parca::PROFILE_STORE, post(parca::handle))
        .route(parca::DEBUGINFO, post(parca::handle))
        .route("/api/v1/debuginfo/{build_id}", put(debuginfo::upload))
}

/// Stores a request's profiles whole or not at all ([`frostdb_pprof::convert::store`]),
/// once the tenant is open for writing. `decode` (decompressing, parsing and converting the
/// request) runs with the storing in the ingest lane: off the async threads, as many at once
/// as `limits.max_concurrent_ingest`, and it stops early once the request has ended (its
/// deadline passed or its client left), giving its slot back. What its decoders make (a
/// profile gunzipped inside the body, the arrays it is parsed into) is charged to the request's `memory` before it is
/// made ([`frostdb_pprof::charging`]): past the budget, 503. A client's push is held to its
/// tenant's ingest rate first ([`rate`]; 429 past it), and to the bytes it may store
/// ([`crate::tenants::Tenant::check_stored`]; 429 at them). Returns once the samples are durable,
/// a summary per profile.
pub async fn store<F>(
    state: &Shared,
    tenant: &str,
    memory: Option<RequestMemory>,
    decode: F,
) -> ApiResult<Vec<IngestSummary>>
where
    F: FnOnce() -> ApiResult<Vec<Incoming>> + Send + 'static,
{
    let id = tenant;
    let tenant = state.tenants.for_write(id).await?;
    if let Some((quota, own)) = state.config.stored_quota(id) {
        tenant.check_stored(quota, own).await?;
    }
    // Once the tenant is known to be taken (so that the buckets are at most the tenants),
    // before anything is decoded. Scrapes and the eBPF sampler send no body: not held.
    if let (Some(rates), Some(sent)) = (
        &state.ingest_rates,
        memory.as_ref().map(RequestMemory::sent),
    ) && sent > 0
    {
        rates.admit(id, sent)?;
    }
    let commit = crate::edge::commit();
    state
        .work
        .ingest
        .blocking(move |cancel| {
            // Decoding stops once the request has ended; storing, once begun, does not,
            // and the request's answer then waits for it (`edge::Commit`).
            let incoming =
                crate::work::until_cancelled(cancel, || charged(memory.clone(), decode))?;
            if commit.is_some_and(|c| !c.begin()) {
                return Err(ApiError::new(
                    axum::http::StatusCode::REQUEST_TIMEOUT,
                    "the request's deadline passed before its profiles were stored: none was",
                ));
            }
            // What storing copies (each distinct set of sample labels) is charged too.
            Ok(charged(memory, || {
                frostdb_pprof::convert::store(&tenant.store, &incoming)
            })?)
        })
        .await
}

/// [`store`] for a request of one profile.
pub async fn store_one<F>(
    state: &Shared,
    tenant: &str,
    memory: Option<RequestMemory>,
    decode: F,
) -> ApiResult<IngestSummary>
where
    F: FnOnce() -> ApiResult<Incoming> + Send + 'static,
{
    let mut summaries = store(state, tenant, memory, move || Ok(vec![decode()?])).await?;
    summaries
        .pop()
        .ok_or_else(|| ApiError::internal("a stored profile has no summary"))
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
            // Charged as it is inflated: the size the trailer states, then each MiB past
            // it (several members, or a lie) before it is made.
            let raw = charged(Some(memory.clone()), || {
                frostdb_pprof::inflate(&body, limit)
            })
            .map_err(|e| ApiError::from(e).context("Content-Encoding: gzip body"))?
            .into_owned();
            Ok(Bytes::from(raw))
        }
        other => Err(ApiError::unsupported(format!(
            "Content-Encoding {other:?} is not supported (use gzip or none)"
        ))),
    }
}

/// Runs `f` with what its decoders make charged to `memory` before it is made
/// ([`frostdb_pprof::charging`]); uncharged without one.
pub fn charged<T>(memory: Option<RequestMemory>, f: impl FnOnce() -> T) -> T {
    match memory {
        Some(memory) => frostdb_pprof::charging(
            move |bytes, what| memory.try_grow(bytes, what).map_err(refused_charge),
            f,
        ),
        None => f(),
    }
}

/// A charge the budget refused, as the decoder's error: memory that is not free now, or
/// not in the tenant's share now (a retry can succeed, and the answer says so again), or
/// more than all of it.
fn refused_charge(e: ApiError) -> frostdb_pprof::Error {
    match (e.retry_after, e.status) {
        (None, _) => frostdb_pprof::Error::OverMemory(e.message),
        (Some(_), axum::http::StatusCode::TOO_MANY_REQUESTS) => {
            frostdb_pprof::Error::OverShare(e.message)
        }
        (Some(_), _) => frostdb_pprof::Error::Unavailable(e.message),
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

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    /// A decode refused by the budget answers as the budget's own refusal would: 503 with
    /// `Retry-After` when the whole has no room now, 429 with it when the tenant's share has
    /// none (its other requests hold it), 413 when it never fits.
    #[test]
    fn a_refused_decode_answers_as_the_budget_refused_it() {
        let budget = frostdb_core::MemoryBudget::new(1 << 20);
        let share = crate::edge::tenant_share(&budget, "a");
        let others = budget.try_reserve(share.limit() / 2 * 3 / 2, "b").unwrap();
        let held = share.try_reserve(share.limit() / 2, "a").unwrap();
        let answer = |asked: usize| {
            let memory = RequestMemory::new(&share);
            ApiError::from(refused_charge(
                memory.try_grow(asked, "decoding").unwrap_err(),
            ))
        };
        // The whole is full before the share is.
        let busy = answer(share.limit() / 2);
        assert_eq!(
            (busy.status, busy.retry_after),
            (StatusCode::SERVICE_UNAVAILABLE, Some(1))
        );
        let never = answer(share.limit() + 1);
        assert_eq!(
            (never.status, never.retry_after),
            (StatusCode::PAYLOAD_TOO_LARGE, None)
        );
        drop(others);
        let limited = answer(share.limit() / 2 + 1);
        assert_eq!(
            (limited.status, limited.retry_after),
            (StatusCode::TOO_MANY_REQUESTS, Some(1))
        );
        assert!(
            limited.message.contains("tenant \"a\"'s share"),
            "{}",
            limited.message
        );
        drop(held);
    }
}
