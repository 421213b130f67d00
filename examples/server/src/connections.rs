//! Accepting connections within a budget: at most `max_connections` at once (more are
//! answered 503 and closed, so the server stays reachable and says why), a header-read
//! timeout (slowloris), an idle timeout for connections between requests (HTTP/1 and
//! HTTP/2 alike, and for a socket that never sends a request), and a graceful shutdown
//! that waits at most a grace period for requests in flight. A client still taking its
//! answers is not idle, however slowly it reads, as long as it takes
//! [`PROGRESS_BYTES`] of them an idle period ([`Delivery`]). What a connection's bytes hold
//! in the server outside any request is charged to the memory budget, within its client
//! address's share of the connections' quarter of it ([`Metered`]): the bytes read before
//! a request is made of them (a head being read, HTTP/2 frames not yet taken), and the
//! answers handed to the connection and not yet written to its socket ([`Unsent`]).
//!
//! axum's own `serve` has none of these bounds; this is the same hyper machinery (one
//! [`hyper_util::server::conn::auto`] connection per socket, HTTP/1 or HTTP/2 by what the
//! client speaks) with them.

use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use frostdb_core::{MemoryBudget, Reservation};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

/// How connections are bounded (from `[limits]`).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// Connections one client address (an IPv6 client: its /64) holds at once.
    pub max_per_address: usize,
    /// Time a client has to send a request's headers: from when it connected, for its
    /// first; from a head's first byte for the next ones (HTTP/1), whatever else the
    /// connection does meanwhile.
    pub header_read_timeout: Duration,
    /// Time a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// On shutdown, how long requests in flight may take to finish.
    pub shutdown_grace: Duration,
    /// The longest request head hyper reads ([`head_buffer_bytes`]).
    pub head_bytes: usize,
    /// What connections may hold outside any request (bytes read before a request is
    /// made of them, answers not yet written): a share of the memory budget
    /// ([`connections_share`]), split between client addresses as connections are
    /// (`max_per_address` of `max_connections`).
    pub memory: MemoryBudget,
}

impl ConnectionLimits {
    /// What hyper may hold of one connection's bytes that no request has taken: a head
    /// being read (HTTP/1 reads into a buffer of at most that), and an HTTP/2
    /// connection's window of body bytes sent ahead of their handlers besides.
    fn unread_bytes(&self, multiplexed: bool) -> usize {
        match multiplexed {
            true => self.head_bytes + H2_CONNECTION_WINDOW as usize,
            false => self.head_bytes,
        }
    }

    /// The share of [`ConnectionLimits::memory`] one client address may hold: its part of
    /// the connections, at least one connection's [`ConnectionLimits::unread_bytes`].
    fn per_address_bytes(&self) -> usize {
        let part = self.memory.limit() as u128 * self.max_per_address as u128
            / self.max_connections.max(1) as u128;
        usize::try_from(part)
            .unwrap_or(usize::MAX)
            .max(self.unread_bytes(true))
    }
}

/// The name of [`connections_share`] among the budget's shares (the others are tenants').
pub const CONNECTIONS_SHARE: &str = "connections' bytes outside requests";

/// The share of `budget` connections may hold outside any request ([`Metered`],
/// [`Unsent`]): a quarter, so that heads being read and answers waiting for their clients
/// never take the room the requests need. Named so that no tenant's share can be it (a
/// tenant id has no space).
pub fn connections_share(budget: &MemoryBudget) -> MemoryBudget {
    budget.share(
        CONNECTIONS_SHARE,
        || "the connections'".to_owned(),
        budget.limit() / 4,
    )
}

/// The longest request head hyper reads: the server's own limits (the URI and the header
/// bytes) and room for what they do not count (the request line's other words, and per
/// header its separators, or HTTP/2's 32 bytes of list size), so that a head over the
/// server's limits is still answered by the server, with a JSON body. A head over this is
/// answered 431 by hyper. At most [`HYPER_MAX_HEAD_BYTES`], which the configuration
/// checks.
pub fn head_buffer_bytes(limits: &super::config::Limits) -> usize {
    (limits.max_uri_bytes + limits.max_header_bytes + 32 * HYPER_MAX_HEADERS + (4 << 10))
        .clamp(8 << 10, HYPER_MAX_HEAD_BYTES)
}

/// An HTTP/2 connection's receive window: body bytes a client may send ahead of the
/// handlers reading them (hyper's default of 1 MiB, per connection, was held by the
/// connection outside the budget).
const H2_CONNECTION_WINDOW: u32 = 512 << 10;
/// An HTTP/2 stream's receive window.
const H2_STREAM_WINDOW: u32 = 256 << 10;

/// What one connection has going on, for its idle timer.
#[derive(Debug)]
struct Activity {
    started: Instant,
    /// Requests whose handler is running.
    in_flight: AtomicUsize,
    /// Requests started so far.
    requests: AtomicU64,
    /// When the last request ended, or the client last took [`PROGRESS_BYTES`] of its
    /// answers (ms after `started`).
    last_ms: AtomicU64,
    /// When the first bytes of a request head came while no request ran and no answer was
    /// being sent (ms after `started`; `u64::MAX`: none since the last request began). The
    /// header-read timeout counts from it. hyper's own timer starts as soon as hyper can
    /// read a next head, once an answer is all in the kernel's buffers: it closed the
    /// socket with megabytes of the answer still on their way to a slow reader (an
    /// orphan socket, which the kernel resets when the client's window stays shut).
    head_ms: AtomicU64,
    /// Bytes written to the socket so far.
    written: AtomicU64,
    /// The bytes read that no request has taken yet, charged ([`Metered`]).
    unread: parking_lot::Mutex<Reservation>,
    /// Whether the connection speaks HTTP/2: its bytes are many streams' frames, and a
    /// request starting does not tell that hyper let go of the others'.
    multiplexed: std::sync::atomic::AtomicBool,
    /// The answers' bytes handed to the connection and not yet written to its socket.
    unsent: Unsent,
    /// Why the budget closed the connection ([`Metered`]), if it did.
    refused: parking_lot::Mutex<Option<frostdb_core::OverBudget>>,
}

/// The bytes of answers a connection was handed and has not written to its socket yet,
/// charged to its client address's share of the budget. An answer's body holds its
/// request's memory until it has handed the connection its last bytes
/// ([`super::edge`]'s `Sending`); what the connection then holds until the client reads
/// it was charged to nothing: an HTTP/2 client granting a large window and reading
/// nothing had hyper buffer up to 400 KiB of each of 64 streams' answers, 25 MiB a
/// connection, while the budget counted none of it. Counted from the bytes handed,
/// less those written (which include frame and head bytes: at worst a little less than
/// what is held).
#[derive(Debug, Clone)]
pub struct Unsent(Arc<UnsentState>);

#[derive(Debug)]
struct UnsentState {
    held: parking_lot::Mutex<Reservation>,
    /// Answers being sent ([`Answer`]).
    answers: AtomicUsize,
}

impl Unsent {
    fn new(memory: &MemoryBudget) -> Self {
        Self(Arc::new(UnsentState {
            held: parking_lot::Mutex::new(memory.empty()),
            answers: AtomicUsize::new(0),
        }))
    }

    /// An answer's body starts: counted as being sent until the [`Answer`] is dropped
    /// (with the body, once the connection has its last bytes, or gave up on it).
    pub fn answer(self) -> Answer {
        self.0.answers.fetch_add(1, Ordering::AcqRel);
        Answer(self)
    }

    /// `bytes` written to the socket.
    fn written(&self, bytes: usize) {
        self.0.held.lock().shrink(bytes);
    }
}

/// An answer being sent on a connection ([`Unsent::answer`]).
#[derive(Debug)]
pub struct Answer(Unsent);

impl Answer {
    /// `bytes` of the answer handed to the connection: held until written, whether or not
    /// they fit (they exist already; what asks next is refused).
    pub fn handed(&self, bytes: usize) {
        self.0.0.held.lock().grow(bytes);
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.0.0.answers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    fn new(memory: &MemoryBudget) -> Self {
        Self {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            head_ms: AtomicU64::new(u64::MAX),
            written: AtomicU64::new(0),
            unread: parking_lot::Mutex::new(memory.empty()),
            multiplexed: std::sync::atomic::AtomicBool::new(false),
            unsent: Unsent::new(memory),
            refused: parking_lot::Mutex::new(None),
        }
    }

    /// When the connection counts as idle unless something happens: `None` while a request
    /// runs. A socket that never sent a request gets the header timeout, not the idle one;
    /// a head begun gets what is left of the header timeout.
    fn idle_at(&self, limits: &ConnectionLimits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64| self.started + Duration::from_millis(ms);
        if self.requests.load(Ordering::Acquire) == 0 {
            return Some(self.started + limits.header_read_timeout);
        }
        let idle = at(self.last_ms.load(Ordering::Acquire)) + limits.idle_timeout;
        Some(match self.head_ms.load(Ordering::Acquire) {
            u64::MAX => idle,
            head => idle.min(at(head) + limits.header_read_timeout),
        })
    }

    /// Whether the header timeout, not the idle one, bounds the connection now: no request
    /// came yet, or a head has begun ([`Activity::idle_at`]).
    fn awaiting_head(&self) -> bool {
        self.requests.load(Ordering::Acquire) == 0
            || self.head_ms.load(Ordering::Acquire) != u64::MAX
    }

    /// `bytes` of answers written to the socket.
    fn wrote(&self, bytes: usize) {
        self.unsent.written(bytes);
        self.written.fetch_add(bytes as u64, Ordering::AcqRel);
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Bytes of a request head read (HTTP/1): the header timer starts, unless it runs, a
    /// request runs, or an answer is being sent (a client may send its next request while
    /// it reads the last answer; hyper reads it once that answer is sent).
    fn head_read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.unsent.0.answers.load(Ordering::Acquire) == 0
            && self.head_ms.load(Ordering::Acquire) == u64::MAX
        {
            self.head_ms.store(self.now_ms(), Ordering::Release);
        }
    }
}

/// What a client must take of its answers in each idle period (`limits.idle_timeout_secs`)
/// for its connection to stay open while no request of it runs: a reader that slow or
/// slower holds a connection, and the memory of its answer, for nothing.
pub const PROGRESS_BYTES: u64 = 64 << 10;

/// How much of its answers a client has taken: the bytes written to its socket less what
/// the kernel still holds of them (not sent, or sent and not acknowledged). Bytes handed to
/// the kernel are not taken: a socket's send buffer holds megabytes, which a slow client
/// reads for a minute after the server wrote its last byte.
struct Delivery {
    fd: RawFd,
    /// What the client had taken when it last took [`PROGRESS_BYTES`] (or the rest).
    taken: u64,
}

impl Delivery {
    /// Whether the client took [`PROGRESS_BYTES`] since this was last true, or all that
    /// was left for it.
    fn advanced(&mut self, activity: &Activity) -> bool {
        let written = activity.written.load(Ordering::Acquire);
        let held = kernel_holds(self.fd);
        let taken = written.saturating_sub(held);
        let advanced = taken >= self.taken + PROGRESS_BYTES || (held == 0 && taken > self.taken);
        if advanced {
            self.taken = taken;
        }
        advanced
    }
}

/// The bytes written to socket `fd` that its peer has not acknowledged (`SIOCOUTQ`): 0
/// when that cannot be read, so that a connection is never kept for what is not known.
#[allow(unsafe_code)]
fn kernel_holds(fd: RawFd) -> u64 {
    let mut held: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one c_int through the pointer, which points at one; `fd` is
    // a socket its caller holds open (an invalid one is an error, EBADF, not undefined).
    let done = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut held as *mut libc::c_int) };
    match done {
        0 => u64::try_from(held).unwrap_or(0),
        _ => 0,
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.requests.fetch_add(1, Ordering::AcqRel);
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.head_ms.store(u64::MAX, Ordering::Release);
        // An HTTP/1 request made of the bytes read: its head is charged by the request
        // from here ([`super::edge::budget_memory`]), its body as it is read. What hyper
        // still holds is at most the body read ahead with the head.
        if !activity.multiplexed.load(Ordering::Acquire) {
            activity.unread.lock().resize(0);
        }
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.last_ms.store(a.now_ms(), Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then lets requests
/// in flight finish for at most the grace period, and closes what is left.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_LINGERING_REFUSALS));
    let (close_tx, close_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let limits = Arc::new(limits);
    let addresses = Addresses::default();
    let per_address = limits.per_address_bytes();
    let mut refused: u64 = 0;
    // A line of each at most every 10 s.
    let accept_errors = crate::LogRate::new(0.1, 1);
    let refusals = crate::LogRate::new(0.1, 1);
    tokio::pin!(shutdown);
    loop {
        // Reap finished connections, so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        let (socket, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE) or memory: back off briefly; idle
                    // connections time out and free what is needed.
                    if accept_errors.allow(std::time::Instant::now()).is_some() {
                        tracing::warn!("accepting a connection failed: {e} (open connections: {})",
                            limits.max_connections - permits.available_permits());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(held) = addresses.take(peer.ip(), limits.max_per_address) else {
            refused += 1;
            if refusals.allow(std::time::Instant::now()).is_some() {
                tracing::warn!(
                    max_per_address = limits.max_per_address,
                    client = %peer.ip(),
                    refused,
                    "a client address holds its connection limit: its new connections are answered 503"
                );
            }
            if let Ok(slot) = refusing.clone().try_acquire_owned() {
                let why = Refusal::Address(limits.max_per_address);
                connections.spawn(async move {
                    refuse(socket, why).await;
                    drop(slot);
                });
            }
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused += 1;
            if refusals.allow(std::time::Instant::now()).is_some() {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    refused,
                    "connection limit reached: new connections are answered 503"
                );
            }
            // Answered with a lingering close while few are; past that closed at once: a
            // refusal holds a descriptor, outside the budget the limits were sized from.
            match refusing.clone().try_acquire_owned() {
                Ok(slot) => {
                    let why = Refusal::Server(limits.max_connections);
                    connections.spawn(async move {
                        refuse(socket, why).await;
                        drop(slot);
                    });
                }
                Err(_) => drop(socket),
            }
            continue;
        };
        let _ = socket.set_nodelay(true);
        let address = Addresses::of(peer.ip());
        let memory = limits.memory.share(
            &address.to_string(),
            || format!("client address {address}'s"),
            per_address,
        );
        let (app, limits, close_rx) = (app.clone(), limits.clone(), close_rx.clone());
        connections.spawn(async move {
            connection(socket, peer.ip(), &memory, app, &limits, close_rx).await;
            drop((permit, held));
            tracing::trace!(%peer, "connection closed");
        });
    }
    let open = connections.len();
    tracing::info!(
        open,
        grace_secs = limits.shutdown_grace.as_secs_f64(),
        "no longer accepting connections; letting requests in flight finish"
    );
    let _ = close_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = connections.len(),
            "the shutdown grace period is over: closing the connections still open"
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}

/// One connection: HTTP/1 or HTTP/2, closed when idle or on shutdown.
async fn connection(
    socket: TcpStream,
    client: IpAddr,
    memory: &MemoryBudget,
    app: Router,
    limits: &ConnectionLimits,
    mut close: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new(memory));
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let in_flight = InFlight::start(&activity);
            request.extensions_mut().insert(activity.unsent.clone());
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(Body::new)).await;
                drop(in_flight);
                response
            }
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // The header-read timeout is the connection's own ([`Activity::idle_at`]).
        .header_read_timeout(None)
        // Above the server's own limits ([`super::edge`]), which answer with a JSON
        // body: hyper's own refusal of a larger head has none. Not much above: it is what
        // one connection may hold before any request is charged (1 MiB each, 3,000
        // connections sending unfinished heads held 3 GB under a 256 MiB budget).
        .max_buf_size(limits.head_bytes)
        .max_headers(HYPER_MAX_HEADERS);
    builder
        .http2()
        .timer(TokioTimer::new())
        // Each stream is a request in flight, charged to the budget until it ends.
        .max_concurrent_streams(64)
        .max_header_list_size(limits.head_bytes as u32)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20));
    let mut delivery = Delivery {
        fd: socket.as_raw_fd(),
        taken: 0,
    };
    let io = Metered {
        io: socket,
        activity: activity.clone(),
        most: [limits.unread_bytes(false), limits.unread_bytes(true)],
        first: true,
    };
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    // Once closing, the connection has the grace period to finish what it is doing.
    let mut closing: Option<Instant> = None;
    loop {
        let wake = match closing {
            Some(at) => at + limits.shutdown_grace,
            None => activity
                .idle_at(limits)
                .unwrap_or_else(|| Instant::now() + limits.idle_timeout),
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Some(why) = activity.refused.lock().take() {
                    CLOSED_OVER_BUDGET.fetch_add(1, Ordering::Relaxed);
                    if let Some(dropped) = OVER_BUDGET.allow(std::time::Instant::now()) {
                        tracing::warn!(
                            %client,
                            dropped,
                            "closed a connection: the bytes it sent before a request was made \
                             of them do not fit the memory budget beside what its address's \
                             connections hold: {why}"
                        );
                    }
                } else if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            changed = close.changed(), if closing.is_none() => {
                if changed.is_err() || *close.borrow() {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(Instant::now());
                }
            }
            () = tokio::time::sleep_until(wake) => {
                if closing.is_some() {
                    // Still not done after the grace period (a client that stopped
                    // reading, or a request that never finished): dropped.
                    return;
                }
                if activity.idle_at(limits).is_none_or(|at| at > Instant::now()) {
                    continue;
                }
                // Taking its answers extends the idle time, not a head's time.
                if !activity.awaiting_head() && delivery.advanced(&activity) {
                    // Still taking its answers: not idle.
                    activity.last_ms.store(activity.now_ms(), Ordering::Release);
                    continue;
                }
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now());
            }
        }
    }
}

/// Connections closed because their unread bytes did not fit: a line every 10 s at most.
static OVER_BUDGET: crate::LogRate = crate::LogRate::new(0.1, 1);

/// Connections closed because their bytes did not fit (`/metrics`).
static CLOSED_OVER_BUDGET: AtomicU64 = AtomicU64::new(0);

/// Connections closed so far because the bytes they sent did not fit their address's part
/// of the budget ([`Metered`]).
pub fn closed_over_budget() -> u64 {
    CLOSED_OVER_BUDGET.load(Ordering::Relaxed)
}

/// A connection's socket, charging the bytes read from it to the memory budget until a
/// request is made of them. hyper holds what it reads until a head is complete (and an
/// HTTP/2 connection, frames of streams not yet taken): without a charge, connections
/// sending heads they never finish held a megabyte each, thousands of them past any budget.
/// Bytes are charged as they arrive, up to what hyper may hold of a connection
/// ([`ConnectionLimits::unread_bytes`]); an HTTP/1 request made of them takes them (its
/// head charged by the request, its body as it is read), an HTTP/2 connection keeps what it
/// was charged until it closes. Bytes that do not fit close the connection.
///
/// An HTTP/1 connection is charged the bytes read since its last request began, at most
/// hyper's buffer: a request's body, or the next request's head pipelined behind it, is
/// counted until the next request takes it, so an idle connection holds at most a
/// buffer's worth it may no longer need. Uncharged here is only a body read with its head,
/// until its handler reads it (charged then, [`super::edge`]'s `Budgeted`).
struct Metered {
    io: TcpStream,
    activity: Arc<Activity>,
    /// The most an HTTP/1 and an HTTP/2 connection is charged.
    most: [usize; 2],
    /// Whether nothing was read yet (the HTTP/2 preface comes first).
    first: bool,
}

impl AsyncRead for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        let read = buf.filled().len() - before;
        if read == 0 {
            return Poll::Ready(Ok(()));
        }
        if std::mem::take(&mut self.first) && buf.filled()[before..].starts_with(b"PRI * HTTP/2") {
            self.activity.multiplexed.store(true, Ordering::Release);
        }
        let multiplexed = self.activity.multiplexed.load(Ordering::Acquire);
        if !multiplexed {
            self.activity.head_read();
        }
        let most = self.most[usize::from(multiplexed)];
        let mut unread = self.activity.unread.lock();
        let more = (unread.bytes() + read).min(most) - unread.bytes().min(most);
        if more > 0
            && let Err(refusal) = unread.try_grow(more, "a connection's bytes before a request")
        {
            let error = std::io::Error::other(refusal.to_string());
            *self.activity.refused.lock() = Some(refusal);
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.activity.wrote(written);
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = std::task::ready!(Pin::new(&mut self.io).poll_write_vectored(cx, bufs))?;
        self.activity.wrote(written);
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The largest request head (request line and headers) the configuration may let hyper
/// read ([`head_buffer_bytes`] is what it reads), and the most headers: above what the
/// server accepts (see [`super::edge`]), so that a head over the server's limits is
/// answered by the server, with a JSON body.
pub const HYPER_MAX_HEAD_BYTES: usize = 1 << 20;
/// See [`HYPER_MAX_HEAD_BYTES`].
pub const HYPER_MAX_HEADERS: usize = 512;
/// The longest URI hyper reads (a constant of hyper's): a longer one is answered 414 by
/// hyper itself, without a body.
pub const HYPER_MAX_URI_BYTES: usize = 65_534;

/// Refusals answered at once (each a descriptor for up to a second), of the descriptors
/// kept besides connections and tenants ([`BASE_DESCRIPTORS`]); more are closed unanswered.
const MAX_LINGERING_REFUSALS: usize = 64;

/// Connections open by client address: an IPv4 address, or an IPv6 client's /64 (one
/// machine's share of a network; a client holding a /64 could otherwise take a connection
/// from each of its 2^64 addresses).
#[derive(Debug, Clone, Default)]
struct Addresses(Arc<parking_lot::Mutex<std::collections::HashMap<IpAddr, usize>>>);

/// A connection counted against its address until dropped.
struct AddressHeld {
    addresses: Addresses,
    address: IpAddr,
}

impl Addresses {
    /// The client address `ip` is counted as.
    fn of(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
            },
        }
    }

    /// Counts a connection from `ip`, unless its address holds `max` already.
    fn take(&self, ip: IpAddr, max: usize) -> Option<AddressHeld> {
        let address = Self::of(ip);
        let mut open = self.0.lock();
        let count = open.entry(address).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(AddressHeld {
            addresses: self.clone(),
            address,
        })
    }
}

impl Drop for AddressHeld {
    fn drop(&mut self) {
        let mut open = self.addresses.0.lock();
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

/// Why a connection is refused.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The server holds `limits.max_connections`.
    Server(usize),
    /// The client's address holds `limits.max_connections_per_address`.
    Address(usize),
}

/// Answers a connection over a limit with 503 naming it, and closes it.
async fn refuse(mut socket: TcpStream, why: Refusal) {
    let message = match why {
        Refusal::Server(max) => format!(
            "the server holds its limit of {max} connections (limits.max_connections); retry shortly"
        ),
        Refusal::Address(max) => format!(
            "your address holds its limit of {max} connections \
             (limits.max_connections_per_address); close some, or retry shortly"
        ),
    };
    let body = serde_json::json!({
        "error": message,
        "code": "unavailable",
        "message": message,
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // A lingering close: the answer, then what the client still sends is read and dropped
    // until it closes (a second at most, 64 KiB at most), so the client reads the 503
    // rather than a reset for a request it had written before the answer came.
    let answer = async {
        socket.write_all(response.as_bytes()).await?;
        socket.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 64 << 10 {
            match socket.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}

/// Descriptors a server needs besides its connections and tenants: its listeners, the
/// runtimes' event fds, the worker pool, the data directory's lock, log files, scrape and
/// cluster clients, the block files the queries and persistence in flight have open (a
/// scan opens a table's block files while it reads them, and closes them after), and the
/// connections being refused ([`MAX_LINGERING_REFUSALS`]).
pub const BASE_DESCRIPTORS: u64 = 256;

/// Descriptors an open tenant holds: its database's lock and WAL segment (measured: 2 per
/// tenant at rest, with 20 tenants of persisted blocks queried after a restart and with 50
/// written to; no threads per tenant, the worker pool is shared), and room for a WAL
/// segment being rotated and a block being written. The spray test in
/// `examples/server/tests/integration/hostile.rs` checks the peak under a limit of 1,024.
pub const DESCRIPTORS_PER_TENANT: u64 = 4;

/// What the descriptor limit leaves for connections and open tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorBudget {
    /// The process's descriptor limit (`RLIMIT_NOFILE`), after raising it.
    pub nofile: u64,
    /// Connections open at once.
    pub max_connections: usize,
    /// Tenants open at once.
    pub max_open_tenants: usize,
}

/// Raises the process's descriptor limit to its hard limit (as Go's runtime does), then
/// splits it between connections and open tenants: what `[limits]` sets, else half for
/// each. An error, saying what to raise, when the limit cannot hold what `[limits]` asks.
pub fn descriptor_budget(limits: &super::config::Limits) -> Result<DescriptorBudget, String> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut rlimit = getrlimit(Resource::Nofile);
    if rlimit.current < rlimit.maximum {
        let raised = rustix::process::Rlimit {
            current: rlimit.maximum,
            maximum: rlimit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => rlimit = getrlimit(Resource::Nofile),
            Err(e) => tracing::warn!("cannot raise the descriptor limit to its maximum: {e}"),
        }
    }
    let nofile = rlimit.current.unwrap_or(u64::MAX).min(1 << 20);
    split_descriptors(nofile, limits)
}

/// [`descriptor_budget`] for a limit of `nofile`.
pub fn split_descriptors(
    nofile: u64,
    limits: &super::config::Limits,
) -> Result<DescriptorBudget, String> {
    let usable = nofile.saturating_sub(BASE_DESCRIPTORS);
    let tenants_cap = limits.max_tenants as u64;
    let (connections, tenants) = match (limits.max_connections, limits.max_open_tenants) {
        (Some(c), Some(t)) => (c as u64, t as u64),
        (Some(c), None) => (
            c as u64,
            (usable.saturating_sub(c as u64) / DESCRIPTORS_PER_TENANT).min(tenants_cap),
        ),
        (None, Some(t)) => (
            usable
                .saturating_sub(t as u64 * DESCRIPTORS_PER_TENANT)
                .min(16_384),
            t as u64,
        ),
        (None, None) => {
            let tenants = (usable / 2 / DESCRIPTORS_PER_TENANT).min(tenants_cap);
            (
                usable
                    .saturating_sub(tenants * DESCRIPTORS_PER_TENANT)
                    .min(16_384),
                tenants,
            )
        }
    };
    let needed = BASE_DESCRIPTORS + connections + tenants * DESCRIPTORS_PER_TENANT;
    if connections < 1 || tenants < 1 || needed > nofile {
        return Err(format!(
            "the descriptor limit (ulimit -n) is {nofile}, and this server needs {needed}: \
             {BASE_DESCRIPTORS} of its own, {connections} connections (limits.max_connections) and \
             {tenants} open tenants (limits.max_open_tenants) of {DESCRIPTORS_PER_TENANT} each; raise it \
             (`ulimit -n {}`, or LimitNOFILE= in a systemd unit) or lower those limits",
            needed
                .max(BASE_DESCRIPTORS + 1 + DESCRIPTORS_PER_TENANT)
                .next_power_of_two()
                .max(1024)
        ));
    }
    Ok(DescriptorBudget {
        nofile,
        max_connections: connections as usize,
        max_open_tenants: tenants as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper reads a head just past the server's own limits, and a client address may hold
    /// its part of the connections' share, never less than one connection's unread bytes.
    #[test]
    fn a_connections_unread_bytes_are_bounded_by_the_servers_limits() {
        let config = crate::config::Limits::default();
        let head = head_buffer_bytes(&config);
        assert!(head > config.max_uri_bytes + config.max_header_bytes);
        assert!(head <= 128 << 10, "{head} bytes of head, was 1 MiB");
        let budget = MemoryBudget::new(256 << 20);
        let limits = |max_connections, max_per_address| ConnectionLimits {
            max_connections,
            max_per_address,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(1),
            head_bytes: head,
            memory: connections_share(&budget),
        };
        assert_eq!(limits(1000, 500).memory.limit(), 64 << 20);
        assert_eq!(limits(1000, 500).per_address_bytes(), 32 << 20);
        assert_eq!(limits(1000, 1000).per_address_bytes(), 64 << 20);
        let one = limits(1_000_000, 1);
        assert_eq!(one.per_address_bytes(), one.unread_bytes(true));
        assert!(one.unread_bytes(false) < one.unread_bytes(true));
    }

    /// An address holds at most its share, an IPv6 client's /64 counts as one address
    /// (an IPv4 client reached over IPv6 as its IPv4 address), and a connection closed
    /// gives its place back.
    #[test]
    fn connections_are_counted_by_client_address() {
        let addresses = Addresses::default();
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let held: Vec<AddressHeld> = (0..3).map(|_| addresses.take(v4, 3).unwrap()).collect();
        assert!(addresses.take(v4, 3).is_none());
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert!(
            addresses.take(mapped, 3).is_none(),
            "the same client over IPv6"
        );
        assert!(addresses.take("192.0.2.8".parse().unwrap(), 3).is_some());
        drop(held);
        assert!(
            addresses.take(v4, 3).is_some(),
            "closed ones give their place back"
        );

        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let _a = addresses.take(a, 1).unwrap();
        assert!(addresses.take(b, 1).is_none(), "one /64");
        assert!(
            addresses
                .take("2001:db8:1:3::1".parse().unwrap(), 1)
                .is_some()
        );
        // Only the addresses with connections are kept.
        drop(_a);
        assert!(addresses.0.lock().is_empty());
    }
}
