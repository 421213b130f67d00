//! Errors as HTTP answers: 4xx with a message saying what was wrong with the request, 5xx
//! only for faults of the server (logged).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use frostdb_core::ErrorKind;

/// An error answer. The body is JSON `{"error": msg, "code": c, "message": msg}`: `error`
/// for people and scripts, `code`/`message` as Connect clients (the Pyroscope SDKs) read.
/// The message is cut to [`MAX_MESSAGE_BYTES`], so an error echoing its input (a bad
/// selector of megabytes) stays small.
#[derive(Debug)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
    /// Seconds after which a retry may succeed (`Retry-After`), for refusals of load.
    pub retry_after: Option<u64>,
}

/// When a write last failed for lack of storage (Unix seconds; 0: never).
static STORAGE_FULL_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long after a write failed for lack of storage `/healthz` says so.
pub const STORAGE_FULL_SHOWN_SECS: u64 = 300;

/// The `Retry-After` of a write refused for lack of storage.
const STORAGE_FULL_RETRY_SECS: u64 = 30;

/// How many seconds ago a write last failed for lack of storage, if within
/// [`STORAGE_FULL_SHOWN_SECS`].
pub fn storage_full_lately() -> Option<u64> {
    let at = STORAGE_FULL_AT.load(std::sync::atomic::Ordering::Relaxed);
    let ago = unix_secs().saturating_sub(at);
    (at > 0 && ago <= STORAGE_FULL_SHOWN_SECS).then_some(ago)
}

/// Seconds since the Unix epoch (0 on a clock before it).
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The longest message an error answer carries; longer ones are cut, saying how much.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] (on a character boundary), saying how
/// many bytes were left out.
fn bounded(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let cut = message.len() - end;
    message.truncate(end);
    message.push_str(&format!("… ({cut} more bytes not shown)"));
    message
}

impl ApiError {
    /// An error with `status`.
    /// An error answered with `status`; one over a limit (413, 429) whose message does not
    /// say which setting raises it gets that named (see [`limit_setting`]).
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if matches!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS
        ) && !message.contains("limits.")
            && let Some(key) = limit_setting(&message)
        {
            message.push_str(&format!(" (raise it with limits.{key})"));
        }
        Self {
            status,
            message: bounded(message),
            retry_after: None,
        }
    }

    /// 503: the server is busy right now; retry after `secs`.
    pub fn busy(message: impl Into<String>, secs: u64) -> Self {
        Self {
            retry_after: Some(secs),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// A reservation the memory budget refused: 503 with `Retry-After` when it has no room
    /// now, 429 with `Retry-After` when the tenant's share of it has none (its own other
    /// requests and queries hold it), 413 when what asked needs more than the whole budget
    /// or share (with what its reservation held already), which no retry can change.
    pub fn over_budget(e: frostdb_core::OverBudget) -> Self {
        if e.never_fits() {
            let whole = match &e.share {
                Some(whose) => format!(
                    "{whose} whole share of the server's memory budget (three quarters of \
                     limits.memory, {} bytes)",
                    e.limit
                ),
                None => format!(
                    "the server's whole budget (limits.memory, {} bytes)",
                    e.limit
                ),
            };
            Self::too_large(format!(
                "{} needs {} bytes of memory which, with the {} bytes this request holds already, \
                 is more than {whole}: it can never be served; ask for less",
                e.what, e.asked, e.held
            ))
        } else if e.share.is_some() {
            Self {
                retry_after: Some(1),
                ..Self::limited(format!(
                    "{e}: the tenant's other requests and queries hold it; retry shortly"
                ))
            }
        } else {
            Self::busy(format!("{e}; retry shortly"), 1)
        }
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 413: the request or what it decompresses to is too large.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// 415: a format this server does not read.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message)
    }

    /// 429: a limit of the tenant is reached.
    pub fn limited(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message)
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// A blocking or spawned job that panicked (or was cancelled): 500, its error logged
    /// and not answered, as the router's catch of a handler's panic does. A panic's
    /// message may quote another tenant's data.
    pub fn job_failed(what: impl std::fmt::Display, e: tokio::task::JoinError) -> Self {
        Self::bug(format_args!("{what} failed"), e)
    }

    /// A bug that `what` met: 500, `detail` logged and not answered (a panic's message may
    /// quote another tenant's data).
    pub fn bug(what: impl std::fmt::Display, detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "{what}");
        Self::internal(format!("{what} (a bug, logged)"))
    }

    /// A write the server's storage had no room for: 503 with `Retry-After`, which every
    /// agent retries (OTLP's exporters retry 503 and 429 only, so a 507 would be dropped),
    /// and space comes back without a restart (retention, an operator). `detail` (which
    /// names the server's paths) is logged, not answered; `/healthz` says so for
    /// [`STORAGE_FULL_SHOWN_SECS`] ([`storage_full_lately`]).
    pub fn storage_full(detail: String) -> Self {
        tracing::error!(%detail, "a write failed: the server's storage is full");
        STORAGE_FULL_AT.store(unix_secs(), std::sync::atomic::Ordering::Relaxed);
        Self::busy(
            "the server's storage is full: nothing of this request was stored; retry once \
             space is freed",
            STORAGE_FULL_RETRY_SECS,
        )
    }

    /// Prefixes the message with where the error happened.
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.message = bounded(format!("{what}: {}", self.message));
        self
    }

    /// An error of `kind` (the engine's, the query layer's or the profile layer's):
    /// invalid input 400, over a limit 413, over a quota 429, not found 404, conflict 409,
    /// unavailable 503 (retry), storage full 503 ([`Self::storage_full`]); corrupt data,
    /// I/O and bugs 500.
    pub fn of_kind(kind: ErrorKind, message: impl Into<String>) -> Self {
        if kind == ErrorKind::StorageFull {
            return Self::storage_full(message.into());
        }
        let status = match kind {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::LimitExceeded => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut error = Self::new(status, message);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            error.retry_after = Some(1);
        }
        error
    }

    fn connect_code(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST | StatusCode::UNSUPPORTED_MEDIA_TYPE => "invalid_argument",
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => "unimplemented",
            StatusCode::CONFLICT => "already_exists",
            StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::TOO_MANY_REQUESTS
            | StatusCode::URI_TOO_LONG
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "resource_exhausted",
            StatusCode::REQUEST_TIMEOUT => "deadline_exceeded",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::MISDIRECTED_REQUEST => "unavailable",
            StatusCode::FORBIDDEN => "permission_denied",
            StatusCode::PRECONDITION_FAILED => "failed_precondition",
            status if status.is_client_error() => "invalid_argument",
            _ => "internal",
        }
    }
}

/// The configuration key (`[limits]`) of the limit a refusal's message names, for the
/// engine's refusals, which know their limit but not what the server calls it.
pub fn limit_setting(message: &str) -> Option<&'static str> {
    const KEYS: [(&str, &str); 12] = [
        ("decompressed", "max_decompressed_bytes"),
        ("sample count", "max_samples_per_profile"),
        ("location count", "max_locations_per_profile"),
        ("function count", "max_locations_per_profile"),
        ("series is reached", "max_series_per_tenant"),
        ("label names is reached", "max_label_names_per_tenant"),
        ("query memory limit", "max_query_memory_bytes"),
        ("spilling process has exceeded", "max_spill_bytes"),
        ("DiskManager is disabled", "max_spill_bytes"),
        ("length limit exceeded", "max_body_bytes"),
        ("label names of", "max_label_names_per_series"),
        ("decoded request bytes", "max_decompressed_bytes"),
    ];
    KEYS.iter()
        .find(|(phrase, _)| message.contains(phrase))
        .map(|(_, key)| *key)
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl ApiError {
    /// The error as the answer to a request: to a gRPC or gRPC-Web request (`grpc`, its
    /// content type) a gRPC status in the headers (trailers-only), which its clients read
    /// whatever the HTTP status would say; to the rest, [`IntoResponse`]'s JSON.
    pub fn answer(self, grpc: Option<&axum::http::HeaderValue>) -> Response {
        let Some(content_type) = grpc else {
            return self.into_response();
        };
        tracing::debug!(status = self.status.as_u16(), "{}", self.message);
        let retry_after = self.retry_after;
        let mut response = crate::querier::status(self).into_http::<axum::body::Body>();
        let headers = response.headers_mut();
        headers.insert(axum::http::header::CONTENT_TYPE, content_type.clone());
        if let Some(secs) = retry_after {
            headers.insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), "{}", self.message);
        } else {
            tracing::debug!(status = self.status.as_u16(), "{}", self.message);
        }
        let body = serde_json::json!({
            "error": self.message,
            "code": self.connect_code(),
            "message": self.message,
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

impl From<frostdb_pprof::Error> for ApiError {
    fn from(e: frostdb_pprof::Error) -> Self {
        // The kind is the innermost error's, whatever context `Error::At` adds.
        let mut error = Self::of_kind(e.kind(), e.to_string());
        if e.is_over_share() {
            error.retry_after = Some(1);
        }
        error
    }
}

impl From<frostdb_core::Error> for ApiError {
    fn from(e: frostdb_core::Error) -> Self {
        Self::of_kind(e.kind(), e.to_string())
    }
}

impl From<frostdb_query::Error> for ApiError {
    fn from(e: frostdb_query::Error) -> Self {
        Self::of_kind(e.kind(), e.to_string())
    }
}

impl From<datafusion::error::DataFusionError> for ApiError {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        Self::of_kind(frostdb_query::datafusion_kind(&e), e.to_string())
    }
}

impl From<frostdb_profile::SelectorError> for ApiError {
    fn from(e: frostdb_profile::SelectorError) -> Self {
        Self::bad_request(e.to_string())
    }
}

/// Result alias of handlers.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Connect clients read `code`: a refusal is never the server's `internal` (a 403 of
    /// another tenant's name was).
    #[test]
    fn refusals_carry_the_connect_code_of_their_status() {
        for (status, code) in [
            (StatusCode::FORBIDDEN, "permission_denied"),
            (StatusCode::MISDIRECTED_REQUEST, "unavailable"),
            (StatusCode::LENGTH_REQUIRED, "invalid_argument"),
            (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        ] {
            assert_eq!(ApiError::new(status, "x").connect_code(), code, "{status}");
        }
    }

    #[test]
    fn a_refusal_over_a_limit_names_the_setting_that_raises_it() {
        let e = ApiError::of_kind(
            ErrorKind::LimitExceeded,
            "invalid pprof: sample count exceeds the limit of 10",
        );
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            e.message
                .ends_with("(raise it with limits.max_samples_per_profile)"),
            "{}",
            e.message
        );
        let body = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body: Failed to buffer the body: length limit exceeded",
        );
        assert!(
            body.message.contains("limits.max_body_bytes"),
            "{}",
            body.message
        );
        // A message that names its setting already is left as it is; other statuses too.
        let named = ApiError::too_large("over 5 (limits.max_settings_bytes)");
        assert_eq!(named.message, "over 5 (limits.max_settings_bytes)");
        let bad = ApiError::bad_request("sample count exceeds nothing");
        assert!(!bad.message.contains("limits."));
    }
}
