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
        let (tx, rx) = mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let _ = tx.send(future.await);
        });
        rx.recv().map_err(|_| Error::Closed)
    }

    /// Spawns `future` on the I/O runtime without waiting.
    pub(crate) fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle().spawn(future);
    }
}
