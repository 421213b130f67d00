//! The commit path shared by every table of a database: transaction ids, the one WAL, group
//! commit, and publication in transaction order.
//!
//! A transaction holds writes to one or more tables. It is one WAL record, so it is durable
//! whole or not at all; it is published (made visible to snapshots) only once that record is
//! durable, after every earlier transaction. Concurrent committers share fsyncs: a committer
//! whose record an fsync in flight does not cover leads the next one and syncs everything
//! appended by then; a lone committer syncs at once, waiting for nobody.
//!
//! ```text
//!  commit: prepare (no lock) -> [log lock: tx id, WAL append, queue] -> sync (shared)
//!          -> [publish lock: every durable transaction, table by table] -> visible
//! ```
//!
//! Publication order: the transactions ready at once are published together, table by table,
//! in the order their writes were added to each transaction, so a reader that reads a table
//! written later in a transaction (samples) and then one written earlier (the symbols they
//! refer to) never sees the first without the second.
//!
//! The log knows a table only as a [`Logged`]: a name for the WAL record, somewhere to
//! publish durable writes, and persistence when the WAL outgrows its limit. Tables (in
//! `table`) implement it and hold the log; the log holds them weakly.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use arrow::record_batch::RecordBatch;
use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::error::{Error, Result};
use crate::index::chunk::Chunk;
use crate::schema::ColumnName;
use crate::wal::{self, Wal};
use crate::workers::WorkerMessage;

/// What the log needs of a table.
pub(crate) trait Logged: Send + Sync + 'static {
    /// The table's name, as WAL records carry it.
    fn name(&self) -> &str;
    /// Publishes durable writes `(tx, write)`, in transaction order, as one new version.
    fn apply(&self, writes: Vec<(u64, Write)>);
    /// The oldest transaction whose rows the table holds only in memory (and the WAL).
    fn oldest_unpersisted_tx(&self) -> Option<u64>;
    /// Rotates the active block and persists every rotated one (to relieve the WAL).
    fn rotate_and_persist(&self) -> Result<()>;
}

/// Rows checked and normalised for a table.
pub(crate) struct Write {
    pub(crate) chunk: Arc<Chunk>,
    pub(crate) columns: Vec<ColumnName>,
}

/// One table's share of a transaction.
pub(crate) struct Entry<T> {
    pub(crate) table: Arc<T>,
    pub(crate) write: Write,
}

/// A transaction appended to the WAL, waiting for its fsync to be published.
struct PendingTx<T> {
    tx: u64,
    position: u64,
    entries: Vec<Entry<T>>,
}

struct LogState<T> {
    next_tx: u64,
    pending: VecDeque<PendingTx<T>>,
    /// The oldest transaction taken from `pending` to be published, until it is applied to
    /// every table it writes: meanwhile it is in neither `pending` nor (for the tables not
    /// yet applied) a table, and its WAL segment must stay.
    publishing: Option<u64>,
}

/// The database's commit log: every table commits through it.
pub(crate) struct CommitLog<T> {
    /// The WAL (on-disk databases), set once recovery has replayed it.
    wal: std::sync::OnceLock<Wal>,
    durable: bool,
    state: Mutex<LogState<T>>,
    /// Serialises publication, so that transactions become visible in order.
    publish: Mutex<()>,
    /// Highest transaction published.
    published: std::sync::atomic::AtomicU64,
    /// The tables, for WAL truncation and space management.
    tables: RwLock<Vec<Weak<T>>>,
    /// Past this size, the table holding the oldest WAL segment is persisted.
    max_wal_bytes: u64,
    /// Where to ask for that.
    persistence: Mutex<Option<std::sync::mpsc::Sender<WorkerMessage>>>,
    relieving: std::sync::atomic::AtomicBool,
    /// This log, for messages to the worker.
    this: Weak<CommitLog<T>>,
    /// One cut at a time (shared databases), and no block merge during one.
    cutting: Mutex<()>,
    /// A read-only database (a follower of a bucket, or a directory opened read-only): where
    /// it is (its prefix or directory), for the refusal.
    read_only: Option<String>,
    /// The database directory's lock (on-disk databases), held while anything can write (or,
    /// shared, while a read-only database reads it).
    _lock: Option<Box<dyn Send + Sync>>,
    /// Dropped after the lock (fields drop in order): tells [`Closed`] waiters the instance
    /// is gone.
    closing: Closing,
}

/// When a database instance is wholly closed: every handle to it dropped, its background
/// work done, its directory lock released ([`crate::Db::closed`]). A process that closes a
/// database and opens it again waits on this rather than meeting its own lock.
#[derive(Clone, Debug)]
pub struct Closed(Arc<(Mutex<bool>, parking_lot::Condvar)>);

impl Closed {
    /// Whether the instance is wholly closed.
    pub fn is_closed(&self) -> bool {
        *self.0.0.lock()
    }

    /// Waits at most `timeout` for the instance to close: whether it did.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let (closed, cv) = &*self.0;
        let mut closed = closed.lock();
        let deadline = std::time::Instant::now() + timeout;
        while !*closed {
            if cv.wait_until(&mut closed, deadline).timed_out() {
                break;
            }
        }
        *closed
    }
}

/// Marks its [`Closed`] closed when dropped.
#[derive(Debug)]
struct Closing(Closed);

impl Drop for Closing {
    fn drop(&mut self) {
        let (closed, cv) = &*(self.0).0;
        *closed.lock() = true;
        cv.notify_all();
    }
}

impl<T> std::fmt::Debug for CommitLog<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitLog")
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl<T: Logged> CommitLog<T> {
    /// A log for an in-memory database (`durable: false`) or an on-disk one, whose WAL is
    /// attached after recovery.
    pub(crate) fn new(
        durable: bool,
        max_wal_bytes: u64,
        persistence: Option<std::sync::mpsc::Sender<WorkerMessage>>,
        lock: Option<Box<dyn Send + Sync>>,
        read_only: Option<String>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            wal: std::sync::OnceLock::new(),
            durable,
            state: Mutex::new(LogState {
                next_tx: 1,
                pending: VecDeque::new(),
                publishing: None,
            }),
            publish: Mutex::new(()),
            published: std::sync::atomic::AtomicU64::new(0),
            tables: RwLock::new(Vec::new()),
            max_wal_bytes,
            persistence: Mutex::new(persistence),
            relieving: std::sync::atomic::AtomicBool::new(false),
            this: this.clone(),
            cutting: Mutex::new(()),
            read_only,
            _lock: lock,
            closing: Closing(Closed(Arc::default())),
        })
    }

    /// When this instance is wholly closed (see [`Closed`]).
    pub(crate) fn closed(&self) -> Closed {
        self.closing.0.clone()
    }

    /// The refusal of a write to a read-only database, if this is one.
    pub(crate) fn refuse(&self, what: impl FnOnce() -> String) -> Result<()> {
        match &self.read_only {
            Some(database) => Err(Error::ReadOnly {
                database: database.clone(),
                what: what(),
            }),
            None => Ok(()),
        }
    }

    /// Whether the database is read-only: nothing may be written, not even what replay read.
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only.is_some()
    }

    /// Stops acknowledging writes: the WAL refuses them from now on (the lease of a shared
    /// database was lost).
    pub(crate) fn poison(&self, reason: String) {
        if let Some(wal) = self.wal.get() {
            wal.poison(reason);
        }
    }

    pub(crate) fn register(&self, table: &Arc<T>) {
        let mut tables = self.tables.write();
        tables.retain(|t| t.strong_count() > 0);
        tables.push(Arc::downgrade(table));
    }

    pub(crate) fn tables(&self) -> Vec<Arc<T>> {
        self.tables
            .read()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Starts appending to `wal` after recovery; the next transaction is `next_tx`.
    pub(crate) fn attach(&self, wal: Wal, next_tx: u64) {
        let mut state = self.state.lock();
        state.next_tx = state.next_tx.max(next_tx);
        self.published.fetch_max(
            next_tx.saturating_sub(1),
            std::sync::atomic::Ordering::AcqRel,
        );
        let _ = self.wal.set(wal);
    }

    pub(crate) fn wal(&self) -> Option<&Wal> {
        self.wal.get()
    }

    /// The id the next transaction gets.
    pub(crate) fn next_tx(&self) -> u64 {
        self.state.lock().next_tx
    }

    /// Notes that recovery replayed transaction `tx`.
    pub(crate) fn replayed(&self, tx: u64) {
        let mut state = self.state.lock();
        state.next_tx = state.next_tx.max(tx + 1);
        self.published
            .fetch_max(tx, std::sync::atomic::Ordering::AcqRel);
    }

    /// Commits `entries` as one transaction and returns its id once it is durable and
    /// published. Nothing of it is visible before; all of it is after.
    pub(crate) fn commit(&self, entries: Vec<Entry<T>>) -> Result<u64> {
        match self.append(entries)? {
            Some((tx, position)) => self.finish(tx, position),
            None => Ok(self.published.load(std::sync::atomic::Ordering::Acquire)),
        }
    }

    /// Appends `entries` to the WAL as one transaction: `(tx, position)`, or `None` when
    /// there is nothing to write. On error nothing of it stays in the log.
    pub(crate) fn append(&self, entries: Vec<Entry<T>>) -> Result<Option<(u64, u64)>> {
        if entries.is_empty() {
            return Ok(None);
        }
        self.refuse(|| format!("writing to table {:?}", entries[0].table.name()))?;
        let payload = if self.durable {
            let parts: Vec<(&str, &RecordBatch)> = entries
                .iter()
                .map(|e| (e.table.name(), e.write.chunk.batch()))
                .collect();
            Some(wal::record::encode_entries(&parts)?)
        } else {
            None
        };
        let mut state = self.state.lock();
        let tx = state.next_tx;
        let position = match &payload {
            Some(payload) => self.wal_or_err()?.append(tx, payload)?,
            None => 0,
        };
        state.next_tx += 1;
        state.pending.push_back(PendingTx {
            tx,
            position,
            entries,
        });
        Ok(Some((tx, position)))
    }

    /// Waits until transaction `tx`, appended at `position`, is durable, then publishes it
    /// (and every durable one before it).
    pub(crate) fn finish(&self, tx: u64, position: u64) -> Result<u64> {
        if self.durable {
            let wal = self.wal_or_err()?;
            if let Err(error) = wal.sync(position) {
                return Err(self.abandon_pending(error));
            }
            if wal.total_bytes() > self.max_wal_bytes
                && !self
                    .relieving
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
                && let Some(worker) = &*self.persistence.lock()
            {
                let _ = worker.send(WorkerMessage::RelieveWal(self.this.clone()));
            }
        }
        self.publish_durable();
        if self.published.load(std::sync::atomic::Ordering::Acquire) >= tx {
            Ok(tx)
        } else {
            // Only a failed sync leaves a durable-looking write unpublished.
            match self.wal.get().and_then(Wal::poisoned) {
                Some(reason) => Err(self.abandon_pending(Error::Poisoned { reason })),
                None => Err(Error::Internal(format!(
                    "transaction {tx} was not published"
                ))),
            }
        }
    }

    /// After a failed sync (the WAL is poisoned), nothing appended will ever be published in
    /// this process: the pending writes go, and `error` is returned. They hold their tables,
    /// which hold this log: kept, they would keep the database, its lock included, alive.
    fn abandon_pending(&self, error: Error) -> Error {
        self.state.lock().pending.clear();
        error
    }

    fn wal_or_err(&self) -> Result<&Wal> {
        self.wal
            .get()
            .ok_or_else(|| Error::Internal("the WAL is not open yet".into()))
    }

    /// Publishes every transaction the WAL has made durable, in order.
    fn publish_durable(&self) {
        let _one_at_a_time = self.publish.lock();
        loop {
            let durable = match self.wal.get() {
                Some(wal) => wal.durable_position(),
                None => u64::MAX,
            };
            let ready: Vec<PendingTx<T>> = {
                let mut state = self.state.lock();
                let n = state
                    .pending
                    .iter()
                    .take_while(|p| p.position <= durable)
                    .count();
                state.publishing = state.pending.front().filter(|_| n > 0).map(|p| p.tx);
                state.pending.drain(..n).collect()
            };
            let Some(last) = ready.last().map(|p| p.tx) else {
                return;
            };
            publish_in_order(ready);
            // Left set if a table's apply panicked: the tables not applied have those rows
            // only in the WAL, whose segments then stay.
            self.state.lock().publishing = None;
            self.published
                .fetch_max(last, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// The oldest transaction appended but not yet published (to every table it writes).
    pub(crate) fn oldest_pending(&self) -> Option<u64> {
        let state = self.state.lock();
        state.publishing.or(state.pending.front().map(|p| p.tx))
    }

    /// Deletes the WAL segments every table has persisted. Returns how many.
    pub(crate) fn truncate(&self) -> Result<usize> {
        let Some(wal) = self.wal.get() else {
            return Ok(0);
        };
        // Everything before the oldest unpersisted write of any table, and before anything
        // appended but not yet published, is in some block.
        let next = self.next_tx();
        let mut keep_from = self.oldest_pending().unwrap_or(next);
        for t in self.tables() {
            if let Some(tx) = t.oldest_unpersisted_tx() {
                keep_from = keep_from.min(tx);
            }
        }
        wal.truncate_through(keep_from.saturating_sub(1))
    }
}

impl<T: Logged> CommitLog<T> {
    /// Runs `f` while no other cut runs (a cut, or a block merge of a shared database, which
    /// takes block ids as cuts do).
    pub(crate) fn between_cuts<R>(&self, f: impl FnOnce() -> R) -> R {
        let _one_at_a_time = self.cutting.lock();
        f()
    }

    /// Holds publication: no transaction becomes visible until the guard drops (a cut
    /// rotates every table under it, so no transaction is half published when they are cut).
    pub(crate) fn hold_publication(&self) -> MutexGuard<'_, ()> {
        self.publish.lock()
    }

    /// Persists tables, the one holding the oldest unpersisted write first, until the WAL
    /// is back under its limit (or nothing more can be done).
    pub(crate) fn relieve_wal(&self) {
        // Cleared however this ends: a panic persisting (caught by the worker) left it set,
        // and the WAL was never relieved again, growing until the disk was full.
        struct Relieved<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Relieved<'_> {
            fn drop(&mut self) {
                self.0.store(false, std::sync::atomic::Ordering::Release);
            }
        }
        let _relieved = Relieved(&self.relieving);
        let Some(wal) = self.wal.get() else {
            return;
        };
        let before = wal.total_bytes();
        while wal.total_bytes() > self.max_wal_bytes {
            let oldest = self
                .tables()
                .into_iter()
                .filter_map(|t| t.oldest_unpersisted_tx().map(|tx| (tx, t)))
                .min_by_key(|(tx, _)| *tx);
            let Some((_, table)) = oldest else { break };
            tracing::info!(
                table = table.name(),
                wal_bytes = wal.total_bytes(),
                limit = self.max_wal_bytes,
                "the WAL is over its limit: persisting the table holding its oldest write"
            );
            if let Err(error) = table.rotate_and_persist() {
                tracing::warn!(table = table.name(), %error, "persisting to relieve the WAL failed");
                break;
            }
            if let Err(error) = self.truncate() {
                tracing::warn!(%error, "deleting WAL segments failed");
                break;
            }
        }
        tracing::debug!(before, after = wal.total_bytes(), "WAL relieved");
    }
}

/// Publishes durable transactions: consecutive ones whose tables agree on an order are
/// applied together, one version swap per table.
fn publish_in_order<T: Logged>(ready: Vec<PendingTx<T>>) {
    let mut order: Vec<Arc<T>> = Vec::new();
    let mut parts: Vec<Vec<(u64, Write)>> = Vec::new();
    let flush = |order: &mut Vec<Arc<T>>, parts: &mut Vec<Vec<(u64, Write)>>| {
        for (table, entries) in order.drain(..).zip(parts.drain(..)) {
            table.apply(entries);
        }
    };
    for tx in ready {
        // The positions of this transaction's tables in the batch's order, if it has them.
        let positions: Vec<Option<usize>> = tx
            .entries
            .iter()
            .map(|e| order.iter().position(|t| Arc::ptr_eq(t, &e.table)))
            .collect();
        let known: Vec<usize> = positions.iter().flatten().copied().collect();
        let consistent = known.windows(2).all(|w| w[0] < w[1])
            // A table new to the batch goes last: it must not have to come before one known.
            && positions
                .iter()
                .enumerate()
                .all(|(i, p)| p.is_some() || positions[i + 1..].iter().all(Option::is_none));
        if !consistent {
            flush(&mut order, &mut parts);
        }
        for entry in tx.entries {
            match order.iter().position(|t| Arc::ptr_eq(t, &entry.table)) {
                Some(i) => parts[i].push((tx.tx, entry.write)),
                None => {
                    order.push(entry.table);
                    parts.push(vec![(tx.tx, entry.write)]);
                }
            }
        }
    }
    flush(&mut order, &mut parts);
}

impl<T: Logged> crate::workers::RelieveWal for CommitLog<T> {
    fn relieve(&self) {
        self.relieve_wal();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use arrow::array::{Int64Array, RecordBatch};

    use super::*;
    use crate::fs::OsFs;
    use crate::index::chunk::Chunk;
    use crate::options::Durability;
    use crate::wal::FileWal;

    /// A table that holds nothing in memory once applied (as if persisted at once), and
    /// whose `apply` can be made to wait.
    struct Fake {
        name: &'static str,
        entered: Mutex<Option<mpsc::Sender<()>>>,
        proceed: Mutex<Option<mpsc::Receiver<()>>>,
    }

    impl Logged for Fake {
        fn name(&self) -> &str {
            self.name
        }
        fn apply(&self, _writes: Vec<(u64, Write)>) {
            if let Some(entered) = self.entered.lock().take() {
                entered.send(()).unwrap();
                self.proceed.lock().take().unwrap().recv().unwrap();
            }
        }
        fn oldest_unpersisted_tx(&self) -> Option<u64> {
            None
        }
        fn rotate_and_persist(&self) -> Result<()> {
            Ok(())
        }
    }

    fn fake(name: &'static str) -> Arc<Fake> {
        Arc::new(Fake {
            name,
            entered: Mutex::new(None),
            proceed: Mutex::new(None),
        })
    }

    fn entry(table: &Arc<Fake>) -> Entry<Fake> {
        let batch = RecordBatch::try_from_iter([(
            "v",
            Arc::new(Int64Array::from(vec![1])) as arrow::array::ArrayRef,
        )])
        .unwrap();
        Entry {
            table: table.clone(),
            write: Write {
                chunk: Arc::new(Chunk::new(batch).unwrap()),
                columns: Vec::new(),
            },
        }
    }

    /// A transaction taken from the pending ones is being applied to its tables: one has
    /// it (and has, say, persisted it), another not yet. Its WAL segment stays until every
    /// table has it; deleted meanwhile, a crash lost the other table's share of an
    /// acknowledged transaction.
    #[test]
    fn a_transaction_being_published_keeps_its_wal_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<CommitLog<Fake>> = CommitLog::new(true, u64::MAX, None, None, None);
        let wal = FileWal::open(
            Arc::new(OsFs),
            dir.path(),
            Durability::Sync,
            1 << 20,
            Vec::new(),
            1,
        )
        .unwrap();
        log.attach(Wal::Files(wal), 1);
        let (a, b) = (fake("a"), fake("b"));
        log.register(&a);
        log.register(&b);
        let (entered_tx, entered) = mpsc::channel();
        let (proceed, proceed_rx) = mpsc::channel();
        *b.entered.lock() = Some(entered_tx);
        *b.proceed.lock() = Some(proceed_rx);
        std::thread::scope(|s| {
            let committing = s.spawn(|| log.commit(vec![entry(&a), entry(&b)]));
            // `a` has the transaction, `b` is applying it.
            entered.recv().unwrap();
            log.wal().unwrap().rotate().unwrap();
            let deleted = log.truncate().unwrap();
            proceed.send(()).unwrap();
            assert_eq!(committing.join().unwrap().unwrap(), 1);
            assert_eq!(
                deleted, 0,
                "the segment of a transaction not yet in every table was deleted"
            );
        });
        // Applied everywhere (and, here, held by no table): now it may go.
        assert_eq!(log.truncate().unwrap(), 1);
    }
}
