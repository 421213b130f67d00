//! `frostdb serve`: a continuous-profiling server in one binary, and the `frostdb` command
//! around it (`src/main.rs`: ingest, types, query, sql, serve).
//!
//! Data flows left to right through the folders: [`ingest`] (Pyroscope push, legacy
//! `/ingest`, OTLP) and [`scrape`] (pulling `/debug/pprof/*`) turn what arrives into pprof
//! profiles and store them in the caller's [`tenants`] database, as does [`ebpf`] (sampling
//! every process on this host); [`query`] answers the API and [`web`] serves the page that
//! calls it.

pub mod codec;
pub mod config;
pub mod connections;
pub mod ebpf;
pub mod edge;
pub mod error;
pub mod health;
pub mod ingest;
pub mod querier;
pub mod query;
pub mod regressions;
pub mod remote_write;
pub mod rules;
pub mod scrape;
pub mod settings;
pub mod tenants;
pub mod web;
pub mod work;

/// Percent-encodes a URL query parameter value (everything but unreserved characters).
pub fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub mod time {
    //! Times as users write them.

    pub use frostdb_core::now_ms;
    pub use frostdb_pprof::{MAX_MS, checked_ms};

    /// Milliseconds since the Unix epoch from RFC 3339 (`2026-11-22T10:00:00Z`), Unix
    /// milliseconds (`1763805600000`), `now`, or `now-<n><unit>` / `now+<n><unit>` with units
    /// `ms`, `s`, `m`, `h`, `d`, `w`.
    pub fn parse_time(s: &str, now_ms: i64) -> Result<i64, String> {
        let ms = parse_time_unchecked(s.trim(), now_ms)?;
        checked_ms(ms, &format!("{:?}", s.trim()))
    }

    fn parse_time_unchecked(s: &str, now_ms: i64) -> Result<i64, String> {
        if let Ok(ms) = s.parse::<i64>() {
            return Ok(ms);
        }
        if let Some(rest) = s.strip_prefix("now") {
            if rest.is_empty() {
                return Ok(now_ms);
            }
            // By prefix, not by byte: the text after `now` is the user's, and may begin
            // with a character of several bytes.
            let (sign, amount) = match (rest.strip_prefix('-'), rest.strip_prefix('+')) {
                (Some(a), _) => (-1, a),
                (_, Some(a)) => (1, a),
                _ => {
                    return Err(format!(
                        "{s:?}: expected now, now-<duration> or now+<duration>"
                    ));
                }
            };
            let d = parse_duration_ms(amount).map_err(|e| format!("{s:?}: {e}"))?;
            return now_ms
                .checked_add(sign * d)
                .ok_or_else(|| format!("{s:?} is out of range"));
        }
        let t: jiff::Timestamp = s
            .parse()
            .map_err(|e| format!("{s:?} is not RFC 3339, Unix ms or now-<duration>: {e}"))?;
        Ok(t.as_millisecond())
    }

    /// A duration like `15m`, `1h`, `500ms`, `2d` in milliseconds.
    pub fn parse_duration_ms(s: &str) -> Result<i64, String> {
        let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
        let unit = &s[digits.len()..];
        let n: i64 = digits
            .parse()
            .map_err(|_| format!("{s:?} does not start with a number"))?;
        let factor = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            _ => {
                return Err(format!(
                    "unknown duration unit {unit:?} (ms, s, m, h, d, w)"
                ));
            }
        };
        n.checked_mul(factor)
            .ok_or_else(|| format!("{s:?} is too long"))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_the_forms_users_write() {
            let now = 1_700_000_000_000;
            assert_eq!(parse_time("now", now), Ok(now));
            assert_eq!(parse_time("now-1h", now), Ok(now - 3_600_000));
            assert_eq!(parse_time("now+15m", now), Ok(now + 900_000));
            assert_eq!(parse_time("1700000000123", now), Ok(1_700_000_000_123));
            assert_eq!(
                parse_time("2023-11-14T22:13:20Z", now),
                Ok(1_700_000_000_000)
            );
            assert_eq!(
                parse_time("2023-11-14T23:13:20+01:00", now),
                Ok(1_700_000_000_000)
            );
            assert!(parse_time("yesterday", now).is_err());
            assert!(parse_time("now-5x", now).is_err());
            // Whatever follows `now`, an error, never a panic.
            for bad in ["nowé", "now€1h", "now-", "now+é1h", "now1h"] {
                assert!(parse_time(bad, now).is_err(), "{bad}");
            }
            // Out of range, never wrapped.
            for bad in [
                "now+9223372036854775807ms",
                "now-9223372036854775807ms",
                "-9223372036854775808",
                "9223372036854775807",
                "-1",
                "now+8000y",
            ] {
                assert!(parse_time(bad, now).is_err(), "{bad}");
            }
            assert_eq!(parse_time("253402300799999", now), Ok(MAX_MS));
        }
    }
}

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;

pub use config::Config;
use error::ApiError;
use tenants::Tenants;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// The configuration the server started with.
    pub config: Config,
    /// The tenants' databases.
    pub tenants: Tenants,
    /// The scrape loops' state, for `/api/v1/targets`.
    pub targets: scrape::Targets,
    /// Per-tenant settings (`settings.v1.SettingsService`).
    pub settings: settings::Settings,
    /// Where heavy work runs, and how much of it at once.
    pub work: work::Work,
    /// The memory budget every request, query and tenant draws on (`[limits] memory`).
    pub budget: frostdb_core::MemoryBudget,
    /// Each tenant's ingest rate (`[limits] ingest_rate_per_tenant`, or the tenant's own
    /// `ingest_rate`); `None` when neither is set.
    pub ingest_rates: Option<ingest::rate::IngestRates>,
    /// Names for frames stored as addresses (`[symbolizer]`); `None` when off.
    pub symbolizer: Option<Arc<frostdb_pprof::symbolize::Symbolizer>>,
    /// Every tenant's recording rules and what they recorded.
    pub rules: Arc<rules::Rules>,
    /// What the comparisons of services' versions found (`[regressions]`).
    pub regressions: regressions::Regressions,
    /// Whether the data directory's file system folds case: tenant ids with upper case
    /// letters are then refused ([`tenants::check_case`]).
    pub folds_case: bool,
    /// How the eBPF sampler is (`--ebpf`), once started: `/healthz` and `/metrics` say
    /// when sampling has ended or lost intervals.
    pub ebpf: std::sync::OnceLock<frostdb_ebpf_ingest::SamplerHealth>,
}

/// The shared state handlers get.
pub type Shared = Arc<AppState>;

/// The symbolizer `[symbolizer]` asks for, its cache under the data directory; `None` when
/// off, or when its cache cannot be made (said in the log: queries then answer addresses).
fn symbolizer(
    config: &Config,
    budget: &frostdb_core::MemoryBudget,
) -> Option<Arc<frostdb_pprof::symbolize::Symbolizer>> {
    let c = &config.symbolizer;
    if !c.enabled {
        return None;
    }
    let mut options =
        frostdb_pprof::symbolize::SymbolizerOptions::new(config.data.join("symbolizer-cache"));
    if let Some(urls) = &c.debuginfod_urls {
        options.debuginfod_urls = urls.clone();
    }
    options.cache_bytes = c.cache_bytes;
    options.fetch_timeout = c.fetch_timeout;
    options.workers = c.workers.max(1);
    // Each debug file read reserves its size from the memory budget first.
    options.memory_budget = Some(budget.clone());
    match frostdb_pprof::symbolize::Symbolizer::new(options) {
        Ok(s) => {
            let debuginfod: Option<Vec<String>> = c.debuginfod_urls.as_ref().map(|urls| {
                urls.iter()
                    .map(|u| frostdb_core::redacted_url(u).into_owned())
                    .collect()
            });
            tracing::info!(
                ?debuginfod,
                cache_bytes = c.cache_bytes,
                workers = c.workers,
                "symbolizer: frames stored as addresses are named in the background and by \
                 the queries that reach them first"
            );
            Some(Arc::new(s))
        }
        Err(e) => {
            tracing::warn!(error = %e, "symbolizer off: its cache cannot be made");
            None
        }
    }
}

/// axum's `Query`, refused as every other error is: a 400 with a JSON body naming what was
/// wrong (axum's own refusal, `Failed to deserialize query string: duplicate field
/// 'from'`, was plain text).
#[derive(Debug, Clone)]
pub struct Query<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::new(rejection.status(), rejection.body_text())),
        }
    }
}

/// The tenant a request acts for: `X-Scope-OrgID`, or [`config::DEFAULT_TENANT`] when it is
/// absent or empty.
#[derive(Debug, Clone)]
pub struct TenantId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for TenantId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let value = match parts.headers.get("x-scope-orgid") {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .map_err(|_| ApiError::bad_request("X-Scope-OrgID is not ASCII text"))?,
            ),
        };
        Ok(Self(
            tenants::tenant_from_header(value).map_err(ApiError::bad_request)?,
        ))
    }
}

/// The whole HTTP interface.
pub fn router(state: Shared) -> Router {
    let limits = &state.config.limits;
    let api = Router::new()
        .merge(ingest::routes())
        .merge(query::routes())
        .merge(querier::routes())
        .merge(scrape::routes())
        .merge(health::metrics_routes())
        .merge(rules::routes())
        .merge(regressions::routes())
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::budget_memory,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::deadline,
        ));
    Router::new()
        .merge(api)
        .merge(web::routes())
        .merge(health::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            edge::check_head,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            handler_panicked,
        ))
        .layer(middleware::from_fn(security_headers))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Every answer is taken as the type it says (`nosniff`) and shown in no other site's
/// frame; an SVG answer (whose text is stored names) runs no script and loads nothing,
/// whatever an escaping slip let into it.
async fn security_headers(request: Request, next: Next) -> Response {
    use axum::http::HeaderValue;
    let mut response = next.run(request).await;
    let svg = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"image/svg+xml"));
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if svg {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
        );
    }
    response
}

/// A handler that panicked answers 500 and is logged, instead of its connection being
/// dropped unanswered: a bug a request reaches is that request's failure, told as one.
/// (Every panic found is a bug to fix: bad input gets a 4xx naming what was wrong.)
fn handler_panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = frostdb_core::panic_message(panic.as_ref());
    axum::response::IntoResponse::into_response(ApiError::bug(
        "the server failed answering this request",
        what,
    ))
}

/// 404 with the JSON error body, naming what was asked for.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {method} {}", uri.path()),
    )
}

/// 405 with the JSON error body.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}", uri.path()),
    )
}

/// Logs every request: failures at info (server faults at warn), the rest at debug
/// (`FROSTDB_LOG=debug` shows them).
async fn log_request(request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let asked = request
        .headers()
        .get("x-scope-orgid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(config::DEFAULT_TENANT)
        .to_owned();
    let response = next.run(request).await;
    // As authorized (a tenant's token acts for its tenant, whatever the header said).
    let tenant = response
        .extensions()
        .get::<ActedFor>()
        .map_or(asked, |t| t.0.clone());
    let status = response.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    // What the client sent is cut short in the log: a path or a tenant header of 64 KiB,
    // repeated for a few bytes each over HTTP/2's header compression, filled the disk.
    let (path, tenant) = (cut_for_log(&path), cut_for_log(&tenant));
    match status {
        // Whoever may knock: no token, no such route, no such method.
        401 | 404 | 405 => tracing::debug!(%method, %path, %tenant, status, ms, "request refused"),
        400.. => {
            // A client sending bad requests as fast as it can wrote a line each to the log
            // (about 200 bytes): at tens of thousands a second, the disk of everyone else
            // on the host. The lines past the log's rate are counted and said, not written.
            let Some(dropped) = REQUEST_LOG.allow(std::time::Instant::now()) else {
                return response;
            };
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    per_second = REQUEST_LOG.per_second,
                    "request log lines over the log's rate were not written"
                );
            }
            if status >= 500 {
                tracing::warn!(%method, %path, %tenant, status, ms, "request failed");
            } else {
                tracing::info!(%method, %path, %tenant, status, ms, "request refused");
            }
        }
        _ => tracing::debug!(%method, %path, %tenant, status, ms, "request"),
    }
    response
}

/// The request log's rate: failed and refused requests are logged at most this many a
/// second on average, in bursts of up to [`LogRate::burst`].
static REQUEST_LOG: LogRate = LogRate::new(50.0, 200);

/// A token bucket for log lines: `per_second` on average, `burst` at once; the lines it
/// refuses are counted and handed to the next line it allows.
#[derive(Debug)]
pub(crate) struct LogRate {
    per_second: f64,
    burst: u32,
    state: parking_lot::Mutex<Option<LogBucket>>,
}

#[derive(Debug)]
struct LogBucket {
    tokens: f64,
    at: std::time::Instant,
    dropped: u64,
}

impl LogRate {
    pub(crate) const fn new(per_second: f64, burst: u32) -> Self {
        Self {
            per_second,
            burst,
            state: parking_lot::Mutex::new(None),
        }
    }

    /// Whether a line may be written `now`: `Some` with the lines refused since the last
    /// one allowed, or `None` (the line is counted).
    pub(crate) fn allow(&self, now: std::time::Instant) -> Option<u64> {
        let mut state = self.state.lock();
        let bucket = state.get_or_insert(LogBucket {
            tokens: f64::from(self.burst),
            at: now,
            dropped: 0,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.per_second).min(f64::from(self.burst));
        bucket.at = bucket.at.max(now);
        if bucket.tokens < 1.0 {
            bucket.dropped += 1;
            return None;
        }
        bucket.tokens -= 1.0;
        Some(std::mem::take(&mut bucket.dropped))
    }
}

/// `text` as a log shows it: its first 128 characters, then how many more there were.
fn cut_for_log(text: &str) -> std::borrow::Cow<'_, str> {
    const MOST: usize = 128;
    match text.char_indices().nth(MOST) {
        None => std::borrow::Cow::Borrowed(text),
        Some((at, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} bytes)", &text[..at], text.len()))
        }
    }
}

/// The caller of a request as [`edge::budget_memory`] found it ([`caller`]), for
/// [`authorize`] below it: every token is compared once a request, not twice.
#[derive(Debug, Clone)]
pub(crate) struct Resolved(pub(crate) Option<Caller>);

/// Who a request's bearer token says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The server's `token` (or no token is configured): acts for whichever tenant
    /// `X-Scope-OrgID` names, and sees every tenant in `/metrics` and `/healthz`.
    Operator,
    /// A tenant's own token (`[tenants.<id>] token`): acts for that tenant only.
    Tenant(String),
}

/// Whose the bearer token of `headers` is; `None` when a token is required and the one
/// given (if any) is nobody's. Tokens are compared in constant time, every one of them.
pub fn caller(state: &AppState, headers: &axum::http::HeaderMap) -> Option<Caller> {
    let config = &state.config;
    let tenant_tokens = config
        .tenants
        .iter()
        .filter_map(|(id, t)| Some((id, t.token.as_deref()?)));
    if config.token.is_none() && tenant_tokens.clone().next().is_none() {
        return Some(Caller::Operator);
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?
        .trim();
    let same = |token: &str| {
        use subtle::ConstantTimeEq;
        bool::from(given.as_bytes().ct_eq(token.as_bytes()))
    };
    let mut found = None;
    if config.token.as_deref().is_some_and(same) {
        found = Some(Caller::Operator);
    }
    for (id, token) in tenant_tokens {
        if same(token) {
            found = Some(Caller::Tenant(id.clone()));
        }
    }
    found
}

/// Checks the bearer token when one is configured. A tenant's token makes the request that
/// tenant's: `X-Scope-OrgID` naming another is refused (403), and absent it is set, so every
/// route and gRPC method below reads the tenant it may act for. More than one
/// `X-Scope-OrgID` is refused (400): which one a proxy meant is not for us to guess.
async fn authorize(State(state): State<Shared>, mut request: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    // Found once a request: the memory budget's layer above found it for the tenant's share.
    let caller = match request.extensions_mut().remove::<Resolved>() {
        Some(Resolved(caller)) => caller,
        None => caller(&state, request.headers()),
    };
    let Some(caller) = caller else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a bearer token is required (Authorization: Bearer <token>)",
        )
        .into_response();
    };
    if let Err(e) = same_origin(&state, &request) {
        return e.into_response();
    }
    let named: Vec<_> = request.headers().get_all("x-scope-orgid").iter().collect();
    if named.len() > 1 {
        return ApiError::bad_request(format!(
            "X-Scope-OrgID is given {} times; give one tenant",
            named.len()
        ))
        .into_response();
    }
    if let Caller::Tenant(id) = &caller {
        let asked = named
            .first()
            .map(|v| v.to_str().map(str::trim).unwrap_or("?"))
            .unwrap_or("");
        if !asked.is_empty() && asked != id {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!("this token acts for tenant {id:?} only, not {asked:?} (X-Scope-OrgID)"),
            )
            .into_response();
        }
        match axum::http::HeaderValue::from_str(id) {
            Ok(v) => {
                request.headers_mut().insert("x-scope-orgid", v);
            }
            Err(_) => {
                return ApiError::internal("a tenant id is not a header value").into_response();
            }
        }
    }
    // The tenant the request acted for, for the request log (which runs outside this
    // layer and saw the header before it was rewritten).
    let acted_for = request
        .headers()
        .get("x-scope-orgid")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(id) = &acted_for
        && let Err(e) = tenants::check_case(id.trim(), state.folds_case)
    {
        return ApiError::bad_request(e).into_response();
    }
    request.extensions_mut().insert(caller);
    // Each tenant's share of the lanes is counted by the tenant the request acts for.
    let tenant: Arc<str> = tenants::tenant_from_header(acted_for.as_deref())
        .unwrap_or_else(|_| acted_for.clone().unwrap_or_default())
        .into();
    let mut response = work::TENANT.scope(tenant, next.run(request)).await;
    if let Some(tenant) = acted_for {
        response.extensions_mut().insert(ActedFor(tenant));
    }
    response
}

/// On loopback with no token, where the address is the only boundary: refuses a request
/// naming another host (a web page whose name was made to point here, DNS rebinding, would
/// otherwise read and change every tenant), and a change asked for by another site's page
/// (a form posted across sites needs no rebinding).
fn same_origin(state: &AppState, request: &Request) -> Result<(), ApiError> {
    let config = &state.config;
    let tokens = config.token.is_some() || config.tenants.values().any(|t| t.token.is_some());
    if tokens || !config.listen.ip().is_loopback() {
        return Ok(());
    }
    let headers = request.headers();
    let named = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    let host_of = |authority: &str| -> String {
        let authority = authority.trim();
        match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or("").to_owned(),
            None => authority.split(':').next().unwrap_or("").to_owned(),
        }
        .to_ascii_lowercase()
    };
    if let Some(named) = &named {
        let host = host_of(named);
        let loopback = host == "localhost"
            || host.ends_with(".localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the request names host {host:?}: with no token set, a server on loopback \
                     answers only requests naming it by a loopback name (set a token to serve \
                     other names)"
                ),
            ));
        }
    }
    let reads = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    let cross_site = headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
        || headers
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|origin| {
                let origin = origin.split_once("://").map_or(origin, |(_, rest)| rest);
                named.as_deref().map(str::to_ascii_lowercase) != Some(origin.to_ascii_lowercase())
            });
    if !reads && cross_site {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "a change asked for by another site's page: with no token set, changes are taken \
             only from this server's own origin (set a token to take them from elsewhere)",
        ));
    }
    Ok(())
}

/// The tenant a request acted for, as [`authorize`] let it (for the request log).
#[derive(Debug, Clone)]
struct ActedFor(String);

/// Whether `headers` carry the server's own token (or it requires none): whether the
/// caller may see every tenant.
pub fn authorized(state: &AppState, headers: &axum::http::HeaderMap) -> bool {
    caller(state, headers) == Some(Caller::Operator)
}

/// Runs the server until SIGTERM or Ctrl-C, then flushes every tenant.
pub async fn serve(config: Config) -> Result<(), String> {
    config.validate()?;
    std::fs::create_dir_all(&config.data)
        .map_err(|e| format!("cannot create {}: {e}", config.data.display()))?;
    // One server per data directory (each tenant's database is locked too, when opened).
    let _lock = frostdb_core::DirLock::acquire(&config.data).map_err(|e| e.to_string())?;
    let folds_case = tenants::folds_case(&config.data)
        .map_err(|e| format!("cannot probe {}: {e}", config.data.display()))?;
    if folds_case {
        tracing::warn!(data = %config.data.display(), "the data directory's file system does not tell case apart: tenant ids with upper case letters are refused");
        let configured = config
            .tenants
            .keys()
            .chain(config.scrape.iter().map(|j| &j.tenant))
            .chain(config.ebpf.iter().map(|e| &e.tenant));
        for id in configured {
            tenants::check_case(id, true)?;
        }
    }
    let descriptors = connections::descriptor_budget(&config.limits)?;
    tracing::info!(
        nofile = descriptors.nofile,
        max_connections = descriptors.max_connections,
        max_open_tenants = descriptors.max_open_tenants,
        "descriptor budget"
    );
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    // Background work of every tenant: half the cores compact, as many persist.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let workers = frostdb_core::WorkerPool::new((cores / 2).max(1))
        .map_err(|e| format!("cannot start the worker threads: {e}"))?;
    tracing::info!(
        threads = workers.threads(),
        "worker pool shared by every tenant"
    );
    let queries = config.limits.max_concurrent_queries.unwrap_or(2 * cores);
    let work = work::Work::new(queries, config.limits.max_concurrent_ingest, cores)
        .map_err(|e| format!("cannot start the query threads: {e}"))?;
    let storage = match &config.storage {
        None => tenants::Storage::Local(config.data.join("tenants")),
        Some(bucket) => {
            let store = bucket.store().map_err(|e| format!("[storage]: {e}"))?;
            let cluster = &config.cluster;
            let node = cluster.node_name(address.port());
            let shared = frostdb_core::SharedOptions::new(node.clone())
                .lease_ttl(cluster.lease_ttl)
                .flush_interval(cluster.flush_interval);
            tracing::info!(bucket = %bucket.url, role = ?cluster.role, %node, "tenants in a shared bucket");
            tenants::Storage::Bucket(Arc::new(tenants::SharedBucket {
                bucket: bucket.clone(),
                store,
                role: cluster.role.clone(),
                shared,
            }))
        }
    };
    let budget = frostdb_core::MemoryBudget::new(config.limits.memory_budget() as usize);
    tracing::info!(
        bytes = budget.limit(),
        "memory budget of requests, queries and tenants (limits.memory)"
    );
    let symbolizer = symbolizer(&config, &budget);
    let spill_dir = config.data.join("spill");
    // Each query its share: at most `queries` run at once, so all of them stay within the
    // bound, and one tenant's spilling queries leave the others' room.
    let spill = frostdb_query::Spill::to(&spill_dir, config.limits.max_spill_bytes)
        .map_err(|e| format!("cannot use {} for spilling: {e}", spill_dir.display()))?
        .shared_by(queries);
    tracing::info!(
        dir = %spill_dir.display(),
        bytes = config.limits.max_spill_bytes,
        a_query = spill.session_bytes(),
        "SQL spills past the query memory limit (limits.max_spill_bytes)"
    );
    let rules = Arc::new(rules::Rules::new(
        &config.data,
        config
            .tenants
            .iter()
            .filter(|(_, t)| !t.recording_rules.is_empty())
            .map(|(id, t)| (id.clone(), t.recording_rules.clone()))
            .collect(),
        frostdb_pprof::rules::RuleLimits {
            max_rules: config.limits.max_recording_rules,
            max_series: config.limits.max_recording_rule_series,
        },
    )?);
    let tenants =
        Tenants::with_storage(storage, config.limits.clone(), config.retention(), workers)
            .max_open(descriptors.max_open_tenants)
            .budget(budget.clone())
            .spill(spill)
            .symbolizer(symbolizer.clone())
            .rules(rules.clone());
    let state = Arc::new(AppState {
        symbolizer,
        rules,
        regressions: regressions::Regressions::default(),
        folds_case,
        ebpf: std::sync::OnceLock::new(),
        tenants,
        targets: scrape::Targets::default(),
        settings: settings::Settings::new(
            &config.data,
            config.limits.max_settings,
            config.limits.max_settings_bytes,
        ),
        work,
        budget,
        ingest_rates: ingest::rate::IngestRates::of(&config),
        config,
    });
    // Merges of this node read persisted blocks on the cluster's workers; tasks too small
    // to spread run here, on this node's tenants, which the tasks it serves read too.
    let source: Arc<dyn frostdb_profile::distributed::StackSource> = Arc::new(
        tenants::TenantTables::new(&state, tokio::runtime::Handle::current()),
    );
    let cluster = &state.config.cluster;
    let options = frostdb_profile::distributed::ClusterOptions::default()
        .workers(cluster.workers.clone())
        .listen(cluster.worker_listen)
        .secret(state.config.cluster_secret().map(str::to_owned))
        .memory_budget(state.budget.clone())
        .connections(frostdb_profile::distributed::WorkerConnections {
            // Peers hold a few connections each: a quarter of the HTTP allowance is ample.
            max_connections: (descriptors.max_connections / 4).max(16),
            preface_timeout: Duration::from_secs(state.config.limits.header_read_timeout_secs),
            ..Default::default()
        });
    let mut node = frostdb_profile::distributed::Node::start(&options, source)
        .await
        .map_err(|e| format!("[cluster]: {e}"))?;
    if let Some(cluster) = node.cluster() {
        state.tenants.set_cluster(cluster.clone());
    }
    open_existing(&state).await?;
    // A reader takes what writers persisted, every refresh interval.
    let refresher = state.tenants.read_only().then(|| {
        let state = state.clone();
        let every = state.config.cluster.refresh_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let state = state.clone();
                let _ = tokio::task::spawn_blocking(move || state.tenants.refresh_all()).await;
            }
        })
    });
    if !address.ip().is_loopback() && state.config.token.is_none() {
        tracing::warn!(%address, "listening beyond loopback without a bearer token");
    }
    tracing::info!(
        %address,
        data = %state.config.data.display(),
        tenants = state.tenants.open_count(),
        "frostdb server listening on http://{address}/"
    );
    let governor = tokio::spawn(Tenants::govern_memory(
        state.clone(),
        Duration::from_secs(1),
    ));
    let scrapers = scrape::start(state.clone());
    let comparer = regressions::start(state.clone());
    let remote_writer = state
        .config
        .remote_write
        .clone()
        .map(|c| tokio::spawn(remote_write::run(state.clone(), c)));
    let sampler = match &state.config.ebpf {
        Some(ebpf) => {
            let sampler = ebpf::start(state.clone(), ebpf)?;
            let _ = state.ebpf.set(sampler.health());
            Some(sampler)
        }
        None => None,
    };
    let limits = &state.config.limits;
    let connection_limits = connections::ConnectionLimits {
        max_connections: descriptors.max_connections,
        max_per_address: limits
            .max_connections_per_address
            .unwrap_or((descriptors.max_connections / 2).max(1)),
        header_read_timeout: Duration::from_secs(limits.header_read_timeout_secs),
        idle_timeout: Duration::from_secs(limits.idle_timeout_secs),
        shutdown_grace: Duration::from_secs(limits.shutdown_grace_secs),
        head_bytes: connections::head_buffer_bytes(limits),
        memory: connections::connections_share(&state.budget),
    };
    connections::serve(
        listener,
        router(state.clone()),
        connection_limits,
        shutdown_signal(),
    )
    .await;
    for s in scrapers {
        s.abort();
    }
    for task in refresher
        .into_iter()
        .chain([governor])
        .chain(remote_writer)
        .chain(comparer)
    {
        task.abort();
    }
    node.stop().await;
    if let Some(sampler) = sampler {
        // Stores the last partial interval, then detaches from every CPU.
        let stop = tokio::task::spawn_blocking(move || sampler.stop());
        match tokio::time::timeout(Duration::from_secs(FLUSH_GRACE_SECS), stop).await {
            Ok(stopped) => {
                stopped
                    .map_err(|e| format!("eBPF sampler: {e}"))?
                    .map_err(|e| format!("eBPF sampler: {e}"))?;
            }
            Err(_) => tracing::warn!(
                "the eBPF sampler took over {FLUSH_GRACE_SECS} s to stop: stopping anyway (its last interval is lost)"
            ),
        }
    }
    tracing::info!("shutting down: flushing tenants");
    let flushing = state.clone();
    let flush = tokio::task::spawn_blocking(move || flushing.tenants.flush_all());
    // Everything acknowledged is in the WAL already: a flush that takes too long is left,
    // and the next start replays what it did not persist.
    match tokio::time::timeout(Duration::from_secs(FLUSH_GRACE_SECS), flush).await {
        Ok(done) => done.map_err(|e| format!("flush failed: {e}"))?,
        Err(_) => tracing::warn!(
            "flushing took over {FLUSH_GRACE_SECS} s: stopping anyway (the WAL holds what was not persisted; the next start replays it)"
        ),
    }
    tracing::info!("stopped");
    Ok(())
}

/// How long the flush at shutdown may take.
const FLUSH_GRACE_SECS: u64 = 30;

/// Opens the tenants with data, as many as may be open at once, so their WALs replay
/// before the first request; the others open on their first request. A tenant that cannot
/// open (damaged, or held by another writer of a shared bucket) is logged and left for its
/// requests to report: it never keeps the server from starting.
async fn open_existing(state: &Shared) -> Result<(), String> {
    let existing = state
        .tenants
        .existing()
        .await
        .map_err(|e| format!("listing tenants: {e}"))?;
    let room = state.tenants.open_limit();
    if existing.len() > room {
        tracing::info!(
            tenants = existing.len(),
            opened = room,
            "more tenants than may be open at once (limits.max_open_tenants): the others open on their first request"
        );
    }
    for id in existing.iter().take(room) {
        if let Err(e) = state.tenants.for_read(id).await {
            tracing::warn!(tenant = %id, "not opened at start: {e}");
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = ctrl_c => tracing::info!("received Ctrl-C"),
        _ = term => tracing::info!("received SIGTERM"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a client sent is logged cut short, on a character's boundary, saying how long
    /// it was.
    #[test]
    fn a_long_path_or_tenant_is_logged_cut_short() {
        assert_eq!(cut_for_log("/api/v1/query"), "/api/v1/query");
        let long = "é".repeat(40_000);
        let cut = cut_for_log(&long);
        assert!(cut.starts_with(&"é".repeat(128)), "{cut}");
        assert!(cut.ends_with("… (80000 bytes)"), "{cut}");
        assert!(cut.len() < 300);
    }

    /// A flood of bad requests is logged at the log's rate: a burst, then the average, the
    /// lines refused meanwhile counted and said by the next line written.
    #[test]
    fn the_request_log_keeps_its_rate_and_counts_what_it_drops() {
        let rate = LogRate::new(10.0, 20);
        let start = std::time::Instant::now();
        let allowed = (0..1_000).filter(|_| rate.allow(start).is_some()).count();
        assert_eq!(allowed, 20, "a burst");
        // A tenth of a second later: one line's room, which says how many were dropped.
        let later = start + Duration::from_millis(100);
        assert_eq!(rate.allow(later), Some(980));
        assert_eq!(rate.allow(later), None);
        // After ten idle seconds the bucket holds a burst again, not a hundred lines.
        let idle = later + Duration::from_secs(10);
        let allowed = (0..1_000).filter(|_| rate.allow(idle).is_some()).count();
        assert_eq!(allowed, 20);
        // A clock read out of order (threads racing to the lock) takes nothing back.
        assert_eq!(rate.allow(start), None);
    }
}
