//! The worker port's connections, bounded before tonic sees them. Whoever can reach the
//! port can open connections, secret or not: the secret is checked on each request, once
//! its headers have arrived. So a connection is counted against
//! [`WorkerConnections::max_connections`] from its accept, must start HTTP/2 (the client's
//! 24-byte preface) within [`WorkerConnections::preface_timeout`], and is then pinged
//! while it is open, closed when a ping goes unanswered ([`WorkerConnections::keepalive`]).
//! A socket that connects and says nothing, or says anything but HTTP/2, holds a slot for
//! the preface timeout at most, and no more than `max_connections` are held at once.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// What every HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How a worker's port bounds its connections.
#[derive(Debug, Clone)]
pub struct WorkerConnections {
    /// Connections open at once; more are closed as they arrive (and logged).
    pub max_connections: usize,
    /// Time a new connection has to send the HTTP/2 preface.
    pub preface_timeout: Duration,
    /// A connection is pinged after this long without a frame from its client, and closed
    /// when the ping is not answered within as long again.
    pub keepalive: Duration,
}

impl Default for WorkerConnections {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            preface_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(20),
        }
    }
}

/// A connection that has sent the preface, holding its slot until it closes. The preface,
/// read to check it, is handed to tonic first, as if it had not been read.
#[derive(Debug)]
pub(super) struct Admitted {
    socket: TcpStream,
    /// Bytes of [`PREFACE`] not handed on yet.
    replay: usize,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.replay > 0 {
            let from = PREFACE.len() - self.replay;
            let n = self.replay.min(buf.remaining());
            buf.put_slice(&PREFACE[from..from + n]);
            self.replay -= n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::Connected::connect_info(&self.socket)
    }
}

/// Aborts the accept loop when the stream of its connections is dropped (the server
/// stopped), so the listener closes with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The connections of `listener` that passed the bounds, for tonic to serve. The accept
/// loop and each connection's wait for its preface run on tasks of their own: a slow
/// client never holds up the next one.
pub(super) fn incoming(
    listener: TcpListener,
    bounds: &WorkerConnections,
) -> impl futures::Stream<Item = io::Result<Admitted>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Admitted>(64);
    let slots = Arc::new(Semaphore::new(bounds.max_connections.max(1)));
    let (max, wait) = (bounds.max_connections, bounds.preface_timeout);
    let accepting = tokio::spawn(async move {
        let refused = AtomicU64::new(0);
        loop {
            let (socket, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors or memory: back off; open connections time out.
                    tracing::warn!("merge worker: accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        %peer,
                        max_connections = max,
                        refused = n,
                        "merge worker: connection limit reached, closing new connections"
                    );
                }
                continue; // dropped: closed
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                // Without NODELAY small answers wait out the peer's delayed ACK: 40 ms a hop.
                let _ = socket.set_nodelay(true);
                let mut socket = socket;
                let mut first = [0u8; PREFACE.len()];
                match tokio::time::timeout(wait, socket.read_exact(&mut first)).await {
                    Ok(Ok(_)) if &first == PREFACE => {
                        let admitted = Admitted {
                            socket,
                            replay: PREFACE.len(),
                            _slot: slot,
                        };
                        let _ = tx.send(admitted).await;
                        return;
                    }
                    Ok(Ok(_)) => {
                        tracing::debug!(%peer, "merge worker: closed a connection that does not speak HTTP/2");
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, "merge worker: a connection ended before its preface: {e}");
                    }
                    Err(_) => tracing::debug!(
                        %peer,
                        timeout_ms = wait.as_millis() as u64,
                        "merge worker: closed a connection that sent no HTTP/2 preface in time"
                    ),
                }
                // (Not admitted.) The slot is free before the client sees the close.
                drop(slot);
                drop(socket);
            });
        }
    });
    futures::stream::unfold((rx, AbortOnDrop(accepting)), |(mut rx, guard)| async move {
        rx.recv().await.map(|c| (Ok(c), (rx, guard)))
    })
}
