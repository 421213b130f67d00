//! `PUT /api/v1/debuginfo/{build_id}`: a debug file (an ELF with symbols or DWARF, or a
//! binary as linked) uploaded for the symbolizer, kept by build id in the tenant's object
//! store as Parca's `DebuginfoService` keeps them ([`frostdb_pprof::debuginfo`]). The body
//! is streamed to the store in parts, never held whole; its size must be announced
//! (`Content-Length`), at most 1 GB; an ELF file whose GNU build id is not the one named
//! is refused and deleted. `frostdb debuginfo upload FILE` sends one.

use crate::Query;
use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use frostdb_pprof::debuginfo::{self, Error as E};
use futures::StreamExt;
use serde_json::json;

use super::parca::{MAX_DEBUGINFO_BYTES, debuginfo_uploads};
use crate::error::{ApiError, ApiResult};
use crate::{Shared, TenantId};

/// `?force=true`: replace a file uploaded before.
#[derive(Debug, serde::Deserialize)]
pub struct Params {
    #[serde(default)]
    force: bool,
}

fn api_error(e: debuginfo::Error) -> ApiError {
    match e {
        E::Invalid(m) => ApiError::bad_request(m),
        E::Exists(m) => ApiError::new(
            StatusCode::CONFLICT,
            format!("{m} (?force=true replaces it)"),
        ),
        E::Precondition(m) => ApiError::new(StatusCode::CONFLICT, m),
        E::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, m),
        E::Quota(m) => ApiError::too_large(format!("{m} (limits.max_debuginfo_bytes)")),
        E::Store(e) => ApiError::busy(format!("debug info store: {e}"), 5),
    }
}

/// Stores the body as the debug file of `build_id`.
pub async fn upload(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Path(build_id): Path<String>,
    Query(params): Query<Params>,
    request: Request,
) -> ApiResult<Json<serde_json::Value>> {
    let build_id = build_id.to_ascii_lowercase();
    debuginfo::check_build_id(&build_id).map_err(api_error)?;
    let size = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::LENGTH_REQUIRED,
                "a debug file upload needs its Content-Length",
            )
        })?;
    if size > MAX_DEBUGINFO_BYTES {
        return Err(ApiError::too_large(format!(
            "the debug file is {size} bytes, over the {MAX_DEBUGINFO_BYTES} taken"
        )));
    }
    let t = state.tenants.for_write(&tenant).await?;
    let store = debuginfo_uploads(&t.store, &state.config.limits).ok_or_else(|| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "this server keeps no object store (in memory): nowhere to keep debug files",
        )
    })?;
    let id = store
        .initiate(&build_id, size as i64, "http-upload", params.force)
        .await
        .map_err(api_error)?;
    let chunks = request.into_body().into_data_stream().map(|chunk| {
        chunk.map_err(|e| debuginfo::Error::Invalid(format!("the body could not be read: {e}")))
    });
    let received = store
        .upload(&build_id, &id, Box::pin(chunks))
        .await
        .map_err(api_error)?;
    if received != size {
        return Err(ApiError::bad_request(format!(
            "the body had {received} bytes, not the {size} its Content-Length announced"
        )));
    }
    store.finish(&build_id, &id).await.map_err(api_error)?;
    // Its frames named from it, those still addresses and those named from a symbol table
    // only.
    t.store.name_again(&build_id);
    tracing::info!(%tenant, build_id, bytes = size, "debug info uploaded over HTTP");
    Ok(Json(json!({"build_id": build_id, "bytes": size})))
}
