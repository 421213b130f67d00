//! Checks every request meets before a handler sees it, each refusal a JSON error naming the
//! limit: the request line and headers within their sizes (414, 431), the whole request
//! within its time (408), and its memory within the server's budget (503, `Retry-After`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use frostdb_core::{MemoryBudget, Reservation};
use parking_lot::Mutex;

use super::Shared;
use super::error::{ApiError, ApiResult};

/// 414 or 431 when the request's URI or headers are over `[limits]`.
pub async fn check_head(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let limits = &state.config.limits;
    let grpc = grpc_type(request.headers());
    let uri = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if uri > limits.max_uri_bytes {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!(
                "the URI has {uri} bytes, over the limit of {} (limits.max_uri_bytes); send long selectors in a POST body",
                limits.max_uri_bytes
            ),
        )
        .answer(grpc.as_ref());
    }
    let headers = request.headers();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers.len() > limits.max_headers || bytes > limits.max_header_bytes {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request has {} headers of {bytes} bytes, over the limits of {} headers (limits.max_headers) and {} bytes (limits.max_header_bytes)",
                headers.len(),
                limits.max_headers,
                limits.max_header_bytes
            ),
        )
        .answer(grpc.as_ref());
    }
    next.run(request).await
}

/// 408 when the handler takes longer than `limits.request_timeout_secs`: the handler is
/// dropped (and with it the work it waits on; see `super::work`), unless it has begun
/// storing ([`Commit`]).
///
/// A debug file upload (up to a gigabyte) has the time to send its body at
/// [`MIN_UPLOAD_RATE`] besides: cut at the request's deadline, an upload of a few hundred
/// megabytes over a fair link could never finish.
pub async fn deadline(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let secs = state.config.limits.request_timeout_secs;
    let grpc = grpc_type(request.headers());
    let limit = Duration::from_secs(secs) + upload_time(&request);
    within(limit, grpc, next.run(request)).await
}

/// The slowest rate a debug file upload is given the time to be sent at.
pub const MIN_UPLOAD_RATE: u64 = 1 << 20;

/// Most time an upload is given besides the request's deadline: well within the time after
/// which the debug info store takes an upload begun for stale (15 minutes and 2 from its
/// beginning), so that no upload still streaming is taken over by another.
pub const MAX_UPLOAD_TIME: Duration = Duration::from_secs(600);

/// The time to send a debug file upload's body at [`MIN_UPLOAD_RATE`]: its Content-Length's
/// (HTTP), or the largest's (Parca's gRPC stream, which says its size only in its first
/// message), at most [`MAX_UPLOAD_TIME`]; none for other requests.
fn upload_time(request: &Request) -> Duration {
    let path = request.uri().path();
    let bytes =
        if request.method() == axum::http::Method::PUT && path.starts_with("/api/v1/debuginfo/") {
            request
                .headers()
                .get(axum::http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .unwrap_or(0)
                .min(crate::ingest::parca::MAX_DEBUGINFO_BYTES)
        } else if path == "/parca.debuginfo.v1alpha1.DebuginfoService/Upload" {
            crate::ingest::parca::MAX_DEBUGINFO_BYTES
        } else {
            0
        };
    Duration::from_secs(bytes / MIN_UPLOAD_RATE).min(MAX_UPLOAD_TIME)
}

/// `run`'s answer, or 408 once `limit` has passed; but once `run` has begun storing
/// ([`Commit::begin`]) its own answer, however long it takes: a write is not reported
/// failed while it is being made durable.
async fn within(
    limit: Duration,
    grpc: Option<axum::http::HeaderValue>,
    run: impl std::future::Future<Output = Response>,
) -> Response {
    match until(tokio::time::Instant::now() + limit, run).await {
        Some(response) => response,
        None => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request took longer than {} s (limits.request_timeout_secs) and was cancelled",
                limit.as_secs()
            ),
        )
        .answer(grpc.as_ref()),
    }
}

/// `run`'s outcome, or `None` once `deadline` has passed (`run` dropped, and with it the
/// work it waits on); but once `run` has begun storing ([`Commit::begin`]) its outcome,
/// however long it takes. For work a request leaves running after its answer has begun
/// (a stream's later messages), as [`deadline`] is for the request itself.
pub async fn until<T>(
    deadline: tokio::time::Instant,
    run: impl std::future::Future<Output = T>,
) -> Option<T> {
    let commit = Commit::default();
    let run = COMMIT.scope(commit.clone(), run);
    tokio::pin!(run);
    match tokio::time::timeout_at(deadline, &mut run).await {
        Ok(outcome) => Some(outcome),
        Err(_) if !commit.give_up() => {
            tracing::info!("past the request's deadline while storing: it waits for the outcome");
            Some(run.await)
        }
        Err(_) => None,
    }
}

/// `run` with `memory` as its request's memory ([`request_memory`]): for a request's work
/// in a task of its own, whose decoders would otherwise charge nothing.
pub async fn charging_to<T>(
    memory: Option<RequestMemory>,
    run: impl std::future::Future<Output = T>,
) -> T {
    match memory {
        Some(memory) => REQUEST_MEMORY.scope(memory, run).await,
        None => run.await,
    }
}

/// Whether a request has begun storing, or its deadline came first: whichever happens
/// first decides. Storing cannot be stopped once begun (it is whole or nothing, and may be
/// committing other requests' profiles), so a request that has begun gets its real answer,
/// and one whose deadline came first never begins.
#[derive(Debug, Clone, Default)]
pub struct Commit(Arc<std::sync::atomic::AtomicU8>);

impl Commit {
    const OPEN: u8 = 0;
    const STORING: u8 = 1;
    const GIVEN_UP: u8 = 2;

    /// Storing begins, unless the deadline came first (false: store nothing).
    pub fn begin(&self) -> bool {
        self.settle(Self::STORING) == Self::STORING
    }

    /// The deadline has come: true unless storing has begun.
    fn give_up(&self) -> bool {
        self.settle(Self::GIVEN_UP) == Self::GIVEN_UP
    }

    /// `to`, if nothing was decided yet; what was decided.
    fn settle(&self, to: u8) -> u8 {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        match self.0.compare_exchange(Self::OPEN, to, AcqRel, Acquire) {
            Ok(_) => to,
            Err(decided) => decided,
        }
    }
}

tokio::task_local! {
    /// The [`Commit`] of the request whose handler this task polls ([`deadline`]).
    static COMMIT: Commit;
}

/// The [`Commit`] of the request being handled on this task (`None` outside one).
pub fn commit() -> Option<Commit> {
    COMMIT.try_with(Clone::clone).ok()
}

/// The memory a request holds of the server's budget ([`AppState::budget`]): its body as
/// it arrives, then what its handler reserves before decompressing or decoding. Released
/// when the answer is made. Handlers take it as an extractor.
///
/// [`AppState::budget`]: super::AppState::budget
#[derive(Debug, Clone)]
pub struct RequestMemory(Arc<Held>);

#[derive(Debug)]
struct Held {
    reservation: Mutex<Reservation>,
    /// Why the body could not be reserved, if it could not.
    refused: Mutex<Option<ApiError>>,
    /// Reserved for what the request's compressed gRPC messages may inflate to, until
    /// they are inflated ([`RequestMemory::inflated`]).
    inflating: Mutex<usize>,
    /// Bytes of the body received so far, as sent ([`RequestMemory::sent`]).
    sent: std::sync::atomic::AtomicUsize,
    /// Whether the body was read to its end.
    ended: std::sync::atomic::AtomicBool,
}

impl RequestMemory {
    /// Nothing held yet of `budget` (work the server does of its own, a scrape, takes one
    /// as a request does).
    pub fn new(budget: &MemoryBudget) -> Self {
        Self(Arc::new(Held {
            reservation: Mutex::new(budget.empty()),
            refused: Mutex::new(None),
            inflating: Mutex::new(0),
            sent: Default::default(),
            ended: Default::default(),
        }))
    }

    /// A compressed gRPC message was inflated to `bytes`: what was reserved for it beyond
    /// them is given back.
    pub fn inflated(&self, bytes: usize) {
        let ahead = std::mem::take(&mut *self.0.inflating.lock());
        self.0
            .reservation
            .lock()
            .shrink(ahead.saturating_sub(bytes));
    }

    /// Reserves `bytes` more for `what`; 503 with `Retry-After` when the budget has no
    /// room now, 413 when the request would need more than the whole budget (a retry
    /// would be refused again).
    pub fn try_grow(&self, bytes: usize, what: &str) -> ApiResult<()> {
        self.0
            .reservation
            .lock()
            .try_grow(bytes, what)
            .map_err(ApiError::over_budget)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.reservation.lock().bytes()
    }

    /// Bytes of the request's body received so far, as sent (compressed, gRPC frames and
    /// all): what a tenant's ingest rate counts ([`crate::ingest::rate`]). 0 for work the
    /// server does of its own (a scrape).
    pub fn sent(&self) -> usize {
        self.0.sent.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RequestMemory {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RequestMemory>()
            .cloned()
            .ok_or_else(|| ApiError::internal("no request memory: the budget layer is missing"))
    }
}

/// The share of the memory budget one tenant may hold at once, its requests and queries
/// together: three quarters, as of a lane's slots ([`crate::work`]). However much one tenant
/// holds, a quarter of the budget stays for the others.
pub fn tenant_share(budget: &MemoryBudget, tenant: &str) -> MemoryBudget {
    budget.share(
        tenant,
        || format!("tenant {tenant:?}'s"),
        budget.limit() / 4 * 3,
    )
}

/// The tenant a request of `caller` acts for, as `authorize` will decide it: its token's
/// tenant, else `X-Scope-OrgID` (or the default tenant). `None` when authorisation will
/// refuse it (no valid token, several or malformed `X-Scope-OrgID`).
fn request_tenant(
    caller: Option<&crate::Caller>,
    headers: &axum::http::HeaderMap,
) -> Option<String> {
    match caller? {
        crate::Caller::Tenant(id) => Some(id.clone()),
        crate::Caller::Operator => {
            let mut named = headers.get_all("x-scope-orgid").iter();
            let value = match (named.next(), named.next()) {
                (None, _) => None,
                (Some(v), None) => Some(v.to_str().ok()?),
                (Some(_), Some(_)) => return None,
            };
            crate::tenants::tenant_from_header(value).ok()
        }
    }
}

/// What a request holds in flight besides its head and body (its task, its stream's state,
/// its timers), about: charged to the budget while it lasts.
pub const REQUEST_OVERHEAD: usize = 16 << 10;

/// What a streamed upload holds at most: `frostdb_pprof::debuginfo`'s [`frostdb_core::Upload`]
/// (its parts in flight and one filling) and the chunk received last (Parca Agent sends
/// 8 MiB; room for 16).
pub const STREAMED_UPLOAD_BYTES: usize =
    (frostdb_core::Upload::IN_FLIGHT + 1) * frostdb_core::Upload::PART + (16 << 20);

/// Whether a request's body is streamed to the object store in parts, never held whole:
/// debug file uploads, over HTTP and over Parca's gRPC.
fn streamed(method: &axum::http::Method, path: &str) -> bool {
    (method == axum::http::Method::PUT && path.starts_with("/api/v1/debuginfo/"))
        || path == "/parca.debuginfo.v1alpha1.DebuginfoService/Upload"
}

/// Whether a gRPC method takes a stream of messages from its client (Parca's `Write` and
/// the debug file upload); every other method is unary.
fn client_streams(path: &str) -> bool {
    path == "/parca.profilestore.v1alpha1.ProfileStoreService/Write"
        || path == "/parca.debuginfo.v1alpha1.DebuginfoService/Upload"
}

/// Reserves every request's body from the memory budget as it arrives (503 when it does
/// not fit), and gives handlers the reservation to grow ([`RequestMemory`]). A streamed
/// upload holds at most what it keeps in flight ([`STREAMED_UPLOAD_BYTES`]) for as long as
/// it lasts, not every byte it sends: a gigabyte upload never holds a gigabyte of the budget
/// the other requests and tenants share.
pub async fn budget_memory(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    // Charged to its tenant's share too: one tenant's requests (bodies stalled midway,
    // say) never hold the whole budget from the others. A request whose tenant cannot be
    // told is refused below this layer before it reads its body.
    let caller = crate::caller(&state, &parts.headers);
    let memory = match request_tenant(caller.as_ref(), &parts.headers) {
        Some(tenant) => RequestMemory::new(&tenant_share(&state.budget, &tenant)),
        None => RequestMemory::new(&state.budget),
    };
    parts.extensions.insert(crate::Resolved(caller));
    let unsent = parts
        .extensions
        .get::<crate::connections::Unsent>()
        .cloned();
    let grpc = grpc_type(&parts.headers);
    // A request in flight holds its task, head, stream state and timers whatever its body:
    // charged, so that a flood of requests whose bodies never come (256 streams on each of
    // thousands of HTTP/2 connections) is refused by the budget, not taken until the
    // deadline. Not `/metrics`: the server's memory is most worth watching when it is full.
    let overhead = match parts.uri.path() {
        "/metrics" => 0,
        _ => REQUEST_OVERHEAD,
    };
    let head: usize = parts
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum::<usize>()
        + parts.uri.path_and_query().map_or(0, |p| p.as_str().len());
    if let Err(e) = memory.try_grow(overhead + head, "a request in flight") {
        return e.answer(grpc.as_ref());
    }
    parts.extensions.insert(memory.clone());
    let streamed = streamed(&parts.method, parts.uri.path());
    // A compressed gRPC message is inflated by tonic before any decoder of ours sees it:
    // what it may inflate to is reserved with its bytes as they arrive.
    let inflates = match grpc.is_some() && compressed(&parts.headers) {
        true => crate::codec::largest_grpc_message(&state.config),
        false => 0,
    };
    // A streamed upload holds at most its parts in flight, and no more than it has sent:
    // reserved as its bytes arrive, up to that. (Reserved whole before the first byte, 256
    // streams sending nothing took the budget from everyone for the deadline's minute.)
    // A unary call's one message is followed (grpc-web-text's through its base64).
    let unary = match &grpc {
        Some(t) if !streamed && !client_streams(parts.uri.path()) => {
            Some(OneMessage::new(t.to_str().unwrap_or("").contains("text")))
        }
        _ => None,
    };
    // An HTTP/1 request answered before its body was read to its end (refused on its first
    // bytes, say) is answered `Connection: close`: hyper closes such a connection once it
    // has answered, and a client that kept it to send its next request lost that request.
    let unread_closes =
        parts.version < axum::http::Version::HTTP_2 && !http_body::Body::is_end_stream(&body);
    let body = Body::new(Budgeted {
        inner: body,
        memory: memory.clone(),
        inflates: if streamed { 0 } else { inflates },
        holds: if streamed {
            STREAMED_UPLOAD_BYTES
        } else {
            usize::MAX
        },
        unary,
    });
    let run = next.run(Request::from_parts(parts, body));
    // A streamed upload's messages are not charged one by one as decoded (they would add
    // up to the whole upload): what it holds is its parts in flight, reserved above.
    let response = match streamed {
        true => run.await,
        false => REQUEST_MEMORY.scope(memory.clone(), run).await,
    };
    let refused = memory.0.refused.lock().take();
    let ended = memory.0.ended.load(std::sync::atomic::Ordering::Acquire);
    let mut response = match refused {
        Some(why) => why.answer(grpc.as_ref()),
        None => held_until_sent(response, memory, unsent),
    };
    if unread_closes && !ended {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The answer, holding the request's memory until it is sent (or its connection closed):
/// a client that does not read keeps its answer in the server for as long as the
/// connection lasts, counted in the budget meanwhile, rather than only while it was made.
/// An answer of known size holds exactly that; one streamed, what its request held. What
/// it hands the connection is counted by the connection until written (`unsent`).
fn held_until_sent(
    response: Response,
    memory: RequestMemory,
    unsent: Option<crate::connections::Unsent>,
) -> Response {
    use http_body::Body as _;
    let (parts, body) = response.into_parts();
    if let Some(bytes) = body.size_hint().exact() {
        // Made already: held whether or not it fits, so the next requests are refused.
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        memory.0.reservation.lock().resize(bytes);
    }
    Response::from_parts(
        parts,
        Body::new(Sending {
            inner: body,
            data: Bytes::new(),
            _memory: memory,
            sent: unsent.map(|u| u.answer()),
        }),
    )
}

/// An answer's body, holding its request's memory until it is dropped. It is handed to the
/// connection in frames of at most [`Sending::FRAME`] bytes: the connection takes the next
/// only when it has sent most of the last, so the body (and the memory) lasts until the
/// client has read it. Whole, the answer left the body at once, to wait in the
/// connection's buffer.
struct Sending {
    inner: Body,
    /// Of the inner body's current data frame, what is not handed over yet.
    data: Bytes,
    _memory: RequestMemory,
    /// The connection's count of what it holds unwritten, and of the answers it is
    /// sending (none outside a connection).
    sent: Option<crate::connections::Answer>,
}

impl Sending {
    const FRAME: usize = 64 << 10;
}

impl http_body::Body for Sending {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if self.data.is_empty() {
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.data = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return other,
            }
        }
        let n = self.data.len().min(Self::FRAME);
        if let Some(sent) = &self.sent {
            sent.handed(n);
        }
        Poll::Ready(Some(Ok(http_body::Frame::data(self.data.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.inner.size_hint();
        let data = self.data.len() as u64;
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower() + data);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + data);
        }
        hint
    }
}

tokio::task_local! {
    /// The memory of the request whose handler this task polls ([`budget_memory`]).
    static REQUEST_MEMORY: RequestMemory;
}

/// The memory of the request being handled on this task: for decoders that run inside a
/// handler they cannot pass it to (tonic's codec). `None` outside a request's task, as in
/// work handed to another thread (which is given its request's memory instead), and for a
/// streamed upload (which holds its parts in flight instead).
pub fn request_memory() -> Option<RequestMemory> {
    REQUEST_MEMORY.try_with(Clone::clone).ok()
}

/// Runs `f` as a request whose memory is `memory` ([`request_memory`] answers it).
#[cfg(test)]
pub(crate) fn as_request<T>(memory: RequestMemory, f: impl FnOnce() -> T) -> T {
    REQUEST_MEMORY.sync_scope(memory, f)
}

/// The most a deflate stream inflates to, per byte of it: a 258-byte match in two bits at
/// best (RFC 1951), about 1032 to 1.
const DEFLATE_MOST_RATIO: usize = 1032;

/// The content type of a gRPC or gRPC-Web request, which its refusals are answered in.
fn grpc_type(headers: &axum::http::HeaderMap) -> Option<axum::http::HeaderValue> {
    crate::querier::is_grpc(headers)
        .then(|| headers.get(axum::http::header::CONTENT_TYPE).cloned())
        .flatten()
}

/// Whether a gRPC request's messages are compressed (`grpc-encoding`).
fn compressed(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("grpc-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("identity"))
}

/// A request body whose bytes are reserved from the budget as they arrive.
struct Budgeted {
    inner: Body,
    memory: RequestMemory,
    /// Of a compressed gRPC request, how much more its messages may still inflate to
    /// (at most the largest message a route decodes): reserved, [`DEFLATE_MOST_RATIO`]
    /// times each byte, as they arrive; the decoder gives back what was not needed
    /// ([`RequestMemory::inflated`]).
    inflates: usize,
    /// How much more of the body's own bytes are reserved as they arrive: all of them (a
    /// body read whole), or up to a streamed upload's parts in flight.
    holds: usize,
    /// Of a unary gRPC call, where its one message is: more is refused.
    unary: Option<OneMessage>,
}

/// Follows a unary gRPC call's body through its one message. tonic reads a unary call's
/// body to its end, decoding (and inflating, on the async thread) every message after the
/// first and dropping it: each was charged and none given back, so a few hundred kilobytes
/// of compressed messages held gigabytes of the budget, and a client sending two got OK
/// with the second dropped. A grpc-web-text body is base64 of the same frames (tonic-web
/// decodes it, and tonic reads on): followed through its base64.
struct OneMessage {
    frames: frostdb_query::grpc_frames::MessagePrefixes,
    /// Of a grpc-web-text body, its base64 characters not decoded yet (a chunk may end
    /// mid-quad); `None` for a binary body.
    text: Option<Vec<u8>>,
    /// A grpc-web-text body that is not base64: tonic-web refuses it, no need to follow.
    not_base64: bool,
}

impl OneMessage {
    fn new(text: bool) -> Self {
        Self {
            frames: Default::default(),
            text: text.then(Vec::new),
            not_base64: false,
        }
    }

    /// Follows `data`; an error when it goes past the message.
    fn follow(&mut self, data: &[u8]) -> Result<(), ()> {
        if self.not_base64 {
            return Ok(());
        }
        let Some(pending) = &mut self.text else {
            return Self::follow_bytes(&mut self.frames, data);
        };
        use base64::Engine;
        pending.extend_from_slice(data);
        let whole = pending.len() / 4 * 4;
        let mut decoded = vec![0u8; whole / 4 * 3];
        let mut at = 0;
        while at < whole {
            // Up to and with the first padded quad: each message's base64 may end padded.
            let end = pending[at..whole]
                .iter()
                .position(|&c| c == b'=')
                .map_or(whole, |p| (at + p) / 4 * 4 + 4);
            match base64::engine::general_purpose::STANDARD
                .decode_slice(&pending[at..end], &mut decoded)
            {
                Ok(n) => Self::follow_bytes(&mut self.frames, &decoded[..n])?,
                Err(_) => {
                    self.not_base64 = true;
                    return Ok(());
                }
            }
            at = end;
        }
        pending.drain(..whole);
        Ok(())
    }

    fn follow_bytes(
        frames: &mut frostdb_query::grpc_frames::MessagePrefixes,
        data: &[u8],
    ) -> Result<(), ()> {
        frames.follow(
            data,
            |message, _| if message > 0 { Err(()) } else { Ok(()) },
        )
    }
}

impl Budgeted {
    /// Ends the body with `why`, which the request is answered with in place of what its
    /// handler makes of a body cut short.
    fn refuse<T>(&self, why: ApiError) -> Poll<Option<Result<T, axum::Error>>> {
        let message = why.message.clone();
        *self.memory.0.refused.lock() = Some(why);
        Poll::Ready(Some(Err(axum::Error::new(message))))
    }
}

/// How long, and how many bytes, the rest of a body its handler left unread is read and
/// dropped for ([`Budgeted`]'s drop).
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(5);
const DRAIN_MOST: usize = 64 << 20;

impl Drop for Budgeted {
    /// A body its handler left unread (a request refused on its first bytes) is read to its
    /// end and dropped, for a while and up to a size, before its connection closes: closed
    /// with the client's bytes unread, the connection is reset, and the client lost the
    /// answer already sent (a 400 for a malformed form of 4 MB never reached its client).
    /// Nothing is charged for it: each frame is let go as it comes.
    fn drop(&mut self) {
        if self
            .memory
            .0
            .ended
            .load(std::sync::atomic::Ordering::Acquire)
            || http_body::Body::is_end_stream(&self.inner)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut body = std::mem::replace(&mut self.inner, Body::empty());
        runtime.spawn(async move {
            let drain = async {
                let mut left = DRAIN_MOST;
                while let Some(Ok(frame)) =
                    std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx))
                        .await
                {
                    let got = frame.data_ref().map_or(0, Bytes::len);
                    left = left.saturating_sub(got);
                    if left == 0 {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
        });
    }
}

impl http_body::Body for Budgeted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(None) => {
                self.memory
                    .0
                    .ended
                    .store(true, std::sync::atomic::Ordering::Release);
                return Poll::Ready(None);
            }
            other => return other,
        };
        if self.inner.is_end_stream() {
            self.memory
                .0
                .ended
                .store(true, std::sync::atomic::Ordering::Release);
        }
        if frame.is_trailers() {
            // tonic merges a unary call's trailers into its metadata, over its headers: an
            // `x-scope-orgid` trailer replaced the tenant `authorize` checked the token for.
            // No client sends request trailers; every request's metadata is its headers.
            return self.refuse(ApiError::bad_request(
                "request trailers are not taken: a request's tenant and token come in its headers",
            ));
        }
        if let Some(data) = frame.data_ref() {
            self.memory
                .0
                .sent
                .fetch_add(data.len(), std::sync::atomic::Ordering::Relaxed);
            if let Some(unary) = &mut self.unary
                && unary.follow(data).is_err()
            {
                return self.refuse(ApiError::bad_request(
                    "a unary gRPC call carries one message, and this one sent more",
                ));
            }
            let ahead = data
                .len()
                .saturating_mul(DEFLATE_MOST_RATIO)
                .min(self.inflates);
            let body = data.len().min(self.holds);
            let reserved = match ahead {
                0 => self.memory.try_grow(body, "the request body"),
                _ => self.memory.try_grow(
                    body + ahead,
                    "the request body and what its compressed gRPC message may inflate to",
                ),
            };
            if let Err(e) = reserved {
                return self.refuse(e);
            }
            self.inflates -= ahead;
            self.holds -= body;
            *self.memory.0.inflating.lock() += ahead;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A debug file upload has the time to send its body at the slowest rate taken, its
    /// size's (HTTP) or the largest's (gRPC); other requests none besides their deadline.
    #[test]
    fn uploads_have_the_time_to_send_their_body() {
        let request = |method: &str, path: &str, length: Option<u64>| {
            let mut r = axum::http::Request::builder().method(method).uri(path);
            if let Some(n) = length {
                r = r.header("content-length", n);
            }
            r.body(axum::body::Body::empty()).unwrap()
        };
        let big = 300 << 20;
        assert_eq!(
            upload_time(&request("PUT", "/api/v1/debuginfo/aaaa", Some(big))),
            Duration::from_secs(big / MIN_UPLOAD_RATE)
        );
        assert_eq!(
            upload_time(&request("PUT", "/api/v1/debuginfo/aaaa", Some(u64::MAX))),
            MAX_UPLOAD_TIME,
            "at most the most an upload is given"
        );
        assert_eq!(
            upload_time(&request(
                "POST",
                "/parca.debuginfo.v1alpha1.DebuginfoService/Upload",
                None
            )),
            MAX_UPLOAD_TIME
        );
        for (method, path) in [
            ("POST", "/ingest"),
            ("GET", "/api/v1/debuginfo/aaaa"),
            (
                "POST",
                "/parca.debuginfo.v1alpha1.DebuginfoService/Initiate",
            ),
        ] {
            assert_eq!(
                upload_time(&request(method, path, Some(big))),
                Duration::ZERO,
                "{method} {path}"
            );
        }
    }

    /// A streamed upload's body is reserved as its bytes arrive, and at most up to its
    /// parts in flight; one that has sent nothing holds nothing. A body read whole is
    /// reserved byte for byte. (A stalled upload held 40 MiB before sending a byte.)
    #[tokio::test]
    async fn bodies_are_reserved_as_they_arrive_and_uploads_up_to_their_parts_in_flight() {
        let budget = frostdb_core::MemoryBudget::new(1 << 30);
        let body = |holds: usize, chunks: Vec<usize>| {
            let memory = RequestMemory::new(&budget);
            let frames = chunks
                .into_iter()
                .map(|n| Ok::<_, std::io::Error>(Bytes::from(vec![0u8; n])));
            let body = Budgeted {
                inner: Body::from_stream(futures::stream::iter(frames)),
                memory: memory.clone(),
                inflates: 0,
                holds,
                unary: None,
            };
            (body, memory)
        };
        let (stalled, memory) = body(STREAMED_UPLOAD_BYTES, vec![]);
        assert_eq!(memory.bytes(), 0, "nothing sent, nothing held");
        axum::body::to_bytes(Body::new(stalled), usize::MAX)
            .await
            .unwrap();
        let (upload, memory) = body(STREAMED_UPLOAD_BYTES, vec![30 << 20, 30 << 20, 1 << 20]);
        axum::body::to_bytes(Body::new(upload), usize::MAX)
            .await
            .unwrap();
        assert_eq!(memory.bytes(), STREAMED_UPLOAD_BYTES);
        let (small, memory) = body(STREAMED_UPLOAD_BYTES, vec![1000]);
        axum::body::to_bytes(Body::new(small), usize::MAX)
            .await
            .unwrap();
        assert_eq!(memory.bytes(), 1000);
        let (whole, memory) = body(usize::MAX, vec![30 << 20, 30 << 20]);
        axum::body::to_bytes(Body::new(whole), usize::MAX)
            .await
            .unwrap();
        assert_eq!(memory.bytes(), 60 << 20);
    }

    /// A unary gRPC call's body is its one message, however its frames cut it; a byte
    /// past it (a second message) is refused, naming why, before it is decoded (tonic read
    /// every later message to the end of the body, charged it and dropped it).
    #[tokio::test]
    async fn a_unary_calls_body_is_one_message() {
        let budget = frostdb_core::MemoryBudget::new(1 << 30);
        let read = async |chunks: Vec<Vec<u8>>, text: bool| {
            let memory = RequestMemory::new(&budget);
            let frames = chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
            let body = Budgeted {
                inner: Body::from_stream(futures::stream::iter(frames)),
                memory: memory.clone(),
                inflates: 0,
                holds: usize::MAX,
                unary: Some(OneMessage::new(text)),
            };
            let read = axum::body::to_bytes(Body::new(body), usize::MAX).await;
            (read.is_ok(), memory.0.refused.lock().take())
        };
        let message = |len: u32| {
            let mut m = vec![0u8];
            m.extend(len.to_be_bytes());
            m.extend(std::iter::repeat_n(1u8, len as usize));
            m
        };
        let one = message(10);
        let cut: Vec<Vec<u8>> = one.chunks(3).map(<[u8]>::to_vec).collect();
        assert!(matches!(read(cut, false).await, (true, None)));
        assert!(matches!(read(vec![message(0)], false).await, (true, None)));
        let mut two = message(10);
        two.extend(message(10));
        let (ok, refused) = read(vec![two.clone()], false).await;
        assert!(!ok);
        assert!(
            refused.is_some_and(|e| e.message.contains("carries one message")),
            "refused naming why"
        );
        // grpc-web-text: the same frames as base64, whole or each message padded apart,
        // cut anywhere (it was not followed: a second message was decoded and dropped).
        use base64::Engine;
        let b64 = |b: &[u8]| {
            base64::engine::general_purpose::STANDARD
                .encode(b)
                .into_bytes()
        };
        let cut = |b: Vec<u8>| b.chunks(5).map(<[u8]>::to_vec).collect::<Vec<_>>();
        assert!(matches!(read(cut(b64(&one)), true).await, (true, None)));
        for two in [b64(&two), [b64(&message(10)), b64(&message(10))].concat()] {
            let (ok, refused) = read(cut(two), true).await;
            assert!(!ok);
            assert!(refused.is_some_and(|e| e.message.contains("carries one message")));
        }
        // Not base64: left to tonic-web to refuse.
        assert!(matches!(
            read(vec![b"*&^%$#@!".to_vec()], true).await,
            (true, None)
        ));
    }

    /// A handler that has begun storing gets its own answer past the deadline; one whose
    /// deadline came first gets 408 and may not begin.
    #[tokio::test]
    async fn storing_begun_outlives_the_deadline_and_a_deadline_first_stops_it() {
        let limit = Duration::from_millis(100);
        let stored = within(limit, None, async {
            assert!(commit().expect("a commit in scope").begin());
            tokio::time::sleep(limit * 3).await;
            Response::new(Body::from("stored"))
        })
        .await;
        assert_eq!(stored.status(), StatusCode::OK);

        let (tx, rx) = tokio::sync::oneshot::channel();
        let late = within(limit, None, async move {
            let commit = commit().expect("a commit in scope");
            let _ = tx.send(commit);
            tokio::time::sleep(limit * 3).await;
            Response::new(Body::from("never"))
        })
        .await;
        assert_eq!(late.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(
            !rx.await.unwrap().begin(),
            "storing began after the deadline"
        );
    }
}
