//! The engine's I/O runtime. The engine itself is synchronous; object storage and Parquet
//! I/O are async, so a database owns a small tokio runtime and runs I/O futures on it.

use std::future::Future;
use std::sync::Arc;
use std::sync::mpsc;

use crate::error::{Error, Result};

/// A handle on the database's I/O runtime. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Io {
    runtime: Arc<RuntimeGuard>,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Io")
    }
}

/// Shuts the runtime down without blocking, so that a database may be dropped anywhere,
/// including inside another runtime.
struct RuntimeGuard(Option<tokio::runtime::Runtime>);

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl Io {
    /// Worker threads of the runtime.
    const WORKERS: usize = 2;
    /// Threads for blocking calls (local file I/O of `object_store`), at most.
    const BLOCKING: usize = 4;
    /// Threads of the runtime, at most.
    pub(crate) const THREADS: usize = Self::WORKERS + Self::BLOCKING;

    pub(crate) fn new() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(Self::WORKERS)
            .max_blocking_threads(Self::BLOCKING)
            .thread_name("frostdb-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Io {
                context: "starting the I/O runtime".into(),
                source: e,
            })?;
        Ok(Self {
            runtime: Arc::new(RuntimeGuard(Some(runtime))),
        })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime
            .0
            .as_ref()
            .expect("the runtime lives until the guard drops")
            .handle()
    }

    /// Runs `future` on the I/O runtime and waits for it. Callable from any thread, inside
    /// another async runtime too (it then blocks that thread while waiting).
    pub(crate) fn run<F>(&self, future: F) -> Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        use futures::FutureExt;
        let (tx, rx) = mpsc::sync_channel(1);
        self.handle().spawn(async move {
            // A panic is answered as the bug it is, not as the runtime gone: a closed
            // database is a retry, a panic on the same bytes would be one again.
            let done = std::panic::AssertUnwindSafe(future).catch_unwind().await;
            let _ = tx.send(done.map_err(|panic| {
                let message = crate::panic_message(panic.as_ref());
                Error::Internal(format!("an I/O task panicked: {message}"))
            }));
        });
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Spawns `future` on the I/O runtime without waiting.
    pub(crate) fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle().spawn(future);
    }
}

/// The bytes of an object `got` reads, refused before any is read when its size is over
/// `max` (what `what` may hold): objects read back from a bucket are read whole, and one
/// damaged, or written by something else, may be of any size.
pub(crate) async fn bytes_within(
    got: object_store::GetResult,
    what: &str,
    max: u64,
) -> std::result::Result<bytes::Bytes, object_store::Error> {
    let size = got.meta.size;
    if size > max {
        return Err(object_store::Error::Generic {
            store: "frostdb",
            source: format!(
                "{what} {} is {size} bytes, more than the {max} one may hold: it is damaged, or not this database's",
                got.meta.location
            )
            .into(),
        });
    }
    got.bytes().await
}

/// Most bytes of a manifest object: thousands of blocks take a few megabytes.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// Most bytes of a lease object (a writer's name and epoch).
pub(crate) const MAX_LEASE_BYTES: u64 = 64 << 10;

/// Most bytes of a WAL object: the records of one upload, each at most a header and
/// [`crate::wal::record::MAX_PAYLOAD`]; room for two.
pub(crate) const MAX_WAL_OBJECT_BYTES: u64 =
    2 * (crate::wal::record::HEADER + crate::wal::record::MAX_PAYLOAD) as u64;

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that panics (a decoder of a damaged footer) is answered as the bug it is,
    /// naming it, not as the runtime gone ("database is closed", a retry that fails again
    /// for ever); the runtime goes on running the next.
    #[test]
    fn a_task_that_panics_is_an_internal_error_not_a_closed_database() {
        let io = Io::new().unwrap();
        let err = io
            .run(async { panic!("a schema of bit width 24") as () })
            .unwrap_err();
        assert!(
            matches!(&err, Error::Internal(m) if m.contains("bit width 24")),
            "{err:?}"
        );
        assert_eq!(io.run(async { 7 }).unwrap(), 7);
    }
}
