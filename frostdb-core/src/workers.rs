//! The background workers: threads that compact and persist tables and enforce retention,
//! and the I/O runtime object storage runs on. A [`WorkerPool`] is shared by every
//! database given it (a server with thousands of tenant databases keeps a fixed number of
//! threads); a database given none makes its own small one.
//!
//! Each database is assigned one compaction and one persistence thread of the pool (round
//! robin), so the work of one database stays in order while databases spread over the
//! threads. A thread holds tables and tasks weakly: a dropped database's work is skipped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::io::Io;

/// What the background threads do for a table (the table does it: the threads know
/// nothing else of tables).
pub(crate) trait TableWork: Send + Sync {
    /// Compacts as the table's policy says, reporting a failure.
    fn compact_now(&self);
    /// Persists the table's frozen blocks (a failure is reported by the table; the block
    /// stays in memory for a retry).
    fn persist_now(&self);
    /// The table's periodic work at `now_ms`: retries persistence that failed, then
    /// enforces retention.
    fn every_interval(&self, now_ms: i64);
}

/// A commit log whose WAL outgrew its limit: persists the table holding its oldest segment.
pub(crate) trait RelieveWal: Send + Sync {
    /// Persists what keeps the oldest WAL segment.
    fn relieve(&self);
}

/// Messages to the background workers.
pub(crate) enum WorkerMessage {
    Compact(Weak<dyn TableWork>),
    Persist(Weak<dyn TableWork>),
    /// A table to watch every interval: retention, and retries of failed persistence.
    Register(Weak<dyn TableWork>, Duration),
    /// An embedder's task to run every interval (after retention).
    Maintenance(Weak<dyn Maintenance>, Duration),
    /// The WAL outgrew its limit: persist the table holding its oldest segment.
    RelieveWal(Weak<dyn RelieveWal>),
    Shutdown,
}

/// Senders to the background workers of one database.
#[derive(Clone)]
pub(crate) struct Workers {
    pub(crate) compaction: Option<mpsc::Sender<WorkerMessage>>,
    pub(crate) persistence: Option<mpsc::Sender<WorkerMessage>>,
    /// How often the persistence thread enforces retention on the database's tables.
    pub(crate) retention_interval: Duration,
}

/// Threads for the background work of databases, and their I/O runtime. Cheap to clone;
/// the threads stop when the last clone (and every database using it) is dropped.
///
/// ```
/// use frostdb_core::{Db, DbOptions, WorkerPool};
/// let pool = WorkerPool::new(2).unwrap();
/// let a = Db::open_in_memory(DbOptions::default().workers(pool.clone())).unwrap();
/// let b = Db::open_in_memory(DbOptions::default().workers(pool.clone())).unwrap();
/// # drop((a, b));
/// ```
#[derive(Clone)]
pub struct WorkerPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("threads", &self.inner.threads())
            .finish_non_exhaustive()
    }
}

struct PoolInner {
    /// Started by the first database that stores blocks.
    io: std::sync::OnceLock<Io>,
    compaction: Vec<mpsc::Sender<WorkerMessage>>,
    persistence: Vec<mpsc::Sender<WorkerMessage>>,
    next: AtomicUsize,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl PoolInner {
    fn threads(&self) -> usize {
        let io = if self.io.get().is_some() {
            Io::THREADS
        } else {
            0
        };
        self.compaction.len() + self.persistence.len() + io
    }
}

impl WorkerPool {
    /// A pool of `threads` compaction threads, as many persistence (and retention) threads,
    /// and an I/O runtime of [`WorkerPool::IO_THREADS`] threads (started when a database
    /// of the pool first stores blocks).
    pub fn new(threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let mut handles = Vec::new();
        let mut spawn = |name: String| -> Result<mpsc::Sender<WorkerMessage>> {
            let (tx, rx) = mpsc::channel();
            let (started, has_started) = mpsc::sync_channel(1);
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let _ = started.send(());
                    worker(rx)
                })
                .map_err(|e| Error::Io {
                    context: format!("starting the {name} thread"),
                    source: e,
                })?;
            // A thread names itself as it starts: once it runs, it shows under its name
            // (in `top -H`, `/proc/<pid>/task/*/comm`) for whoever counts it.
            let _ = has_started.recv();
            handles.push(handle);
            Ok(tx)
        };
        let compaction = (0..threads)
            .map(|i| spawn(format!("frostdb-compact-{i}")))
            .collect::<Result<Vec<_>>>()?;
        let persistence = (0..threads)
            .map(|i| spawn(format!("frostdb-persist-{i}")))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            inner: Arc::new(PoolInner {
                io: std::sync::OnceLock::new(),
                compaction,
                persistence,
                next: AtomicUsize::new(0),
                handles: Mutex::new(handles),
            }),
        })
    }

    /// Threads of the I/O runtime of a pool, at most (workers and blocking file I/O).
    pub const IO_THREADS: usize = Io::THREADS;

    /// Threads the pool runs (compaction, persistence and, once started, I/O).
    pub fn threads(&self) -> usize {
        self.inner.threads()
    }

    pub(crate) fn io(&self) -> Result<Io> {
        if let Some(io) = self.inner.io.get() {
            return Ok(io.clone());
        }
        let io = Io::new()?;
        Ok(self.inner.io.get_or_init(|| io).clone())
    }

    /// The threads one database's work goes to: the next compaction and persistence
    /// thread, round robin.
    pub(crate) fn assign(
        &self,
        compaction: bool,
        persistence: bool,
        retention_interval: Duration,
    ) -> Workers {
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let pick = |senders: &[mpsc::Sender<WorkerMessage>]| senders[i % senders.len()].clone();
        Workers {
            compaction: compaction.then(|| pick(&self.inner.compaction)),
            persistence: persistence.then(|| pick(&self.inner.persistence)),
            retention_interval,
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        for tx in self.compaction.iter().chain(&self.persistence) {
            let _ = tx.send(WorkerMessage::Shutdown);
        }
        let me = std::thread::current().id();
        for handle in self.handles.lock().drain(..) {
            // The last holder may be a task on one of the threads: it ends on its own.
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

/// Something a persistence thread runs every interval.
struct Periodic<T: ?Sized> {
    what: Weak<T>,
    every: Duration,
    next: Instant,
}

impl<T: ?Sized> Periodic<T> {
    fn new(what: Weak<T>, every: Duration) -> Self {
        Self {
            what,
            every,
            next: Instant::now() + every,
        }
    }

    /// Whether it is due at `now`.
    fn is_due(&self, now: Instant) -> bool {
        self.next <= now
    }

    /// The entry's target when it is due (and schedules the next run).
    fn due(&mut self, now: Instant) -> Option<Arc<T>> {
        if !self.is_due(now) {
            return None;
        }
        self.next = now + self.every;
        self.what.upgrade()
    }
}

/// A background thread: compacts or persists the tables it is told about, and enforces
/// retention on (and runs the maintenance tasks of) the databases assigned to it, each at
/// its own interval.
///
/// Periodic work that is due runs before the next message is taken, not only when the
/// queue is empty: a steady stream of persists (many tenants rotating blocks under heavy
/// ingest) would otherwise hold retention, retries of failed persists and the embedders'
/// tasks (symbol expiry, rollups) back for as long as it lasted.
fn worker(rx: mpsc::Receiver<WorkerMessage>) {
    let mut tables: Vec<Periodic<dyn TableWork>> = Vec::new();
    let mut tasks: Vec<Periodic<dyn Maintenance>> = Vec::new();
    loop {
        run_due(&mut tables, &mut tasks);
        let next = tables
            .iter()
            .map(|t| t.next)
            .chain(tasks.iter().map(|t| t.next))
            .min();
        let message = match next {
            None => rx.recv().ok(),
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => None,
            },
        };
        let Some(message) = message else { return };
        match message {
            WorkerMessage::Shutdown => return,
            WorkerMessage::Compact(table) => {
                if let Some(table) = table.upgrade() {
                    contained("a compaction", || table.compact_now());
                }
            }
            WorkerMessage::Register(weak, every) => {
                if !tables.iter().any(|t| t.what.ptr_eq(&weak)) {
                    tables.push(Periodic::new(weak, every));
                }
            }
            WorkerMessage::Persist(table) => {
                if let Some(table) = table.upgrade() {
                    contained("a persist", || table.persist_now());
                }
            }
            WorkerMessage::Maintenance(task, every) => tasks.push(Periodic::new(task, every)),
            WorkerMessage::RelieveWal(log) => {
                if let Some(log) = log.upgrade() {
                    contained("relieving a WAL", || log.relieve());
                }
            }
        }
    }
}

/// Runs the tables' periodic work and the tasks that are due, forgetting those dropped.
fn run_due(tables: &mut Vec<Periodic<dyn TableWork>>, tasks: &mut Vec<Periodic<dyn Maintenance>>) {
    let now = Instant::now();
    if !tables.iter().any(|t| t.is_due(now)) && !tasks.iter().any(|t| t.is_due(now)) {
        return;
    }
    let now_ms = crate::now_ms();
    tables.retain(|t| t.what.strong_count() > 0);
    for table in tables.iter_mut().filter_map(|t| t.due(now)) {
        contained("a table's periodic work", || table.every_interval(now_ms));
    }
    tasks.retain(|t| t.what.strong_count() > 0);
    for task in tasks.iter_mut().filter_map(|t| t.due(now)) {
        contained("a maintenance task", || task.run(now_ms));
    }
}

/// Runs one unit of background work with a panic in it contained and logged: a worker
/// thread serves many databases, and one that died would stop compacting, persisting and
/// expiring all of them, every later message to it dropped, with no error anywhere.
fn contained(what: &str, work: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        let message = crate::panic_message(panic.as_ref());
        tracing::error!(what, panic = %message, "background work panicked; the worker goes on");
    }
}

/// Work an embedder runs alongside the database's own retention, on its maintenance thread
/// (e.g. deleting what no retained row refers to any more).
pub trait Maintenance: Send + Sync {
    /// Runs one pass; `now_ms` is the time retention used.
    fn run(&self, now_ms: i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPACTIONS: usize = 1_000;

    /// A table whose every compaction asks for another at once, until the last: a queue
    /// that is never empty meanwhile, as under a steady stream of persists.
    struct Busy {
        tx: mpsc::Sender<WorkerMessage>,
        me: std::sync::OnceLock<Weak<dyn TableWork>>,
        compactions: AtomicUsize,
    }

    impl TableWork for Busy {
        fn compact_now(&self) {
            let done = self.compactions.fetch_add(1, Ordering::SeqCst) + 1;
            let next = if done < COMPACTIONS {
                WorkerMessage::Compact(self.me.get().expect("set").clone())
            } else {
                WorkerMessage::Shutdown
            };
            self.tx.send(next).expect("the worker listens");
        }
        fn persist_now(&self) {}
        fn every_interval(&self, _: i64) {}
    }

    /// A task noting how many compactions had run each time it ran.
    struct Noting {
        busy: Arc<Busy>,
        runs: Mutex<Vec<usize>>,
    }

    impl Maintenance for Noting {
        fn run(&self, _: i64) {
            self.runs
                .lock()
                .push(self.busy.compactions.load(Ordering::SeqCst));
        }
    }

    /// A task that panics.
    struct Panicking;

    impl Maintenance for Panicking {
        fn run(&self, _: i64) {
            panic!("one tenant's bug");
        }
    }

    /// A panic in one database's background work is contained: the worker goes on with the
    /// next message and every other database's work (its thread died, and with it the work
    /// of every database it served).
    #[test]
    fn a_panic_in_one_databases_work_leaves_the_worker_running() {
        let panicking = Arc::new(Panicking);
        let busy = busy_with(|_| Arc::downgrade(&panicking) as _);
        assert_eq!(busy.compactions.load(Ordering::SeqCst), COMPACTIONS);
    }

    /// Runs a worker on a [`Busy`] table's compactions, with the task `task` makes of it
    /// due at every turn, until the last compaction; the table, done.
    fn busy_with(task: impl FnOnce(&Arc<Busy>) -> Weak<dyn Maintenance>) -> Arc<Busy> {
        let (tx, rx) = mpsc::channel();
        let busy = Arc::new(Busy {
            tx: tx.clone(),
            me: std::sync::OnceLock::new(),
            compactions: AtomicUsize::new(0),
        });
        let weak: Weak<dyn TableWork> = Arc::downgrade(&busy) as _;
        assert!(busy.me.set(weak.clone()).is_ok(), "set once");
        tx.send(WorkerMessage::Maintenance(task(&busy), Duration::ZERO))
            .unwrap();
        tx.send(WorkerMessage::Compact(weak)).unwrap();
        worker(rx);
        busy
    }

    /// A task due at every turn runs between the messages of a queue that never empties,
    /// not once the queue is empty (before, it never ran while the queue had a message).
    #[test]
    fn due_tasks_run_while_messages_keep_coming() {
        let mut task = None;
        let busy = busy_with(|busy| {
            let noting = Arc::new(Noting {
                busy: busy.clone(),
                runs: Mutex::new(Vec::new()),
            });
            let weak = Arc::downgrade(&noting) as _;
            task = Some(noting);
            weak
        });
        let task = task.expect("made");
        assert_eq!(busy.compactions.load(Ordering::SeqCst), COMPACTIONS);
        let runs = task.runs.lock();
        assert_eq!(runs.first(), Some(&0), "ran before the first compaction");
        assert!(
            runs.iter().any(|&n| n > 0 && n < COMPACTIONS),
            "ran between compactions: {} runs",
            runs.len()
        );
    }
}
