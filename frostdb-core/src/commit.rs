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

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use arrow::record_batch::RecordBatch;
use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::index::chunk::Chunk;
use crate::index::version::Frozen;
use crate::manifest::BlockMeta;
use crate::schema::ColumnName;
use crate::table::{Table, TableInner};
use crate::wal::{self, Wal};
use crate::workers::WorkerMessage;
use crate::write::prepare;

/// One table's share of a transaction, checked and normalised.
pub(crate) struct Entry {
    pub(crate) table: Arc<TableInner>,
    pub(crate) chunk: Arc<Chunk>,
    pub(crate) columns: Vec<ColumnName>,
}

/// A transaction appended to the WAL, waiting for its fsync to be published.
struct PendingTx {
    tx: u64,
    position: u64,
    entries: Vec<Entry>,
}

struct LogState {
    next_tx: u64,
    pending: VecDeque<PendingTx>,
}

/// The database's commit log: every table commits through it.
pub(crate) struct CommitLog {
    /// The WAL (on-disk databases), set once recovery has replayed it.
    wal: std::sync::OnceLock<Wal>,
    durable: bool,
    state: Mutex<LogState>,
    /// Serialises publication, so that transactions become visible in order.
    publish: Mutex<()>,
    /// Highest transaction published.
    published: std::sync::atomic::AtomicU64,
    /// The tables, for WAL truncation and space management.
    tables: RwLock<Vec<Weak<TableInner>>>,
    /// Past this size, the table holding the oldest WAL segment is persisted.
    max_wal_bytes: u64,
    /// Where to ask for that.
    persistence: Mutex<Option<std::sync::mpsc::Sender<WorkerMessage>>>,
    relieving: std::sync::atomic::AtomicBool,
    /// This log, for messages to the worker.
    this: Weak<CommitLog>,
    /// One cut at a time (shared databases), and no block merge during one.
    cutting: Mutex<()>,
    /// A read-only database (a follower of a bucket, or a directory opened read-only): where
    /// it is (its prefix or directory), for the refusal.
    read_only: Option<String>,
    /// The database directory's lock (on-disk databases), held while anything can write (or,
    /// shared, while a read-only database reads it).
    _lock: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for CommitLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitLog")
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl CommitLog {
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
        })
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

    pub(crate) fn register(&self, table: &Arc<TableInner>) {
        let mut tables = self.tables.write();
        tables.retain(|t| t.strong_count() > 0);
        tables.push(Arc::downgrade(table));
    }

    pub(crate) fn tables(&self) -> Vec<Arc<TableInner>> {
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
    pub(crate) fn commit(&self, entries: Vec<Entry>) -> Result<u64> {
        match self.append(entries)? {
            Some((tx, position)) => self.finish(tx, position),
            None => Ok(self.published.load(std::sync::atomic::Ordering::Acquire)),
        }
    }

    /// Appends `entries` to the WAL as one transaction: `(tx, position)`, or `None` when
    /// there is nothing to write. On error nothing of it stays in the log.
    pub(crate) fn append(&self, entries: Vec<Entry>) -> Result<Option<(u64, u64)>> {
        if entries.is_empty() {
            return Ok(None);
        }
        self.refuse(|| format!("writing to table {:?}", entries[0].table.name()))?;
        let payload = if self.durable {
            let parts: Vec<(&str, &RecordBatch)> = entries
                .iter()
                .map(|e| (e.table.name(), e.chunk.batch()))
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
            let ready: Vec<PendingTx> = {
                let mut state = self.state.lock();
                let n = state
                    .pending
                    .iter()
                    .take_while(|p| p.position <= durable)
                    .count();
                state.pending.drain(..n).collect()
            };
            let Some(last) = ready.last().map(|p| p.tx) else {
                return;
            };
            publish_in_order(ready);
            self.published
                .fetch_max(last, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// The oldest transaction appended but not yet published.
    pub(crate) fn oldest_pending(&self) -> Option<u64> {
        self.state.lock().pending.front().map(|p| p.tx)
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

impl CommitLog {
    /// Persists every table's active data as of one transaction and records all of it in
    /// one manifest update (databases shared through a bucket): a reader of the bucket
    /// sees each transaction whole or not at all, symbols with the samples that use them.
    /// Rotation happens under the publication lock, so no transaction is half published
    /// when the tables are cut; writes go on meanwhile (into new active blocks). A failed
    /// cut leaves its blocks frozen, in memory and in the WAL: the next one writes them.
    /// Returns the blocks written, with their tables.
    pub(crate) fn cut(&self) -> Result<Vec<(String, BlockMeta)>> {
        let _one_at_a_time = self.cutting.lock();
        let tables = self.tables();
        {
            let _publish = self.publish.lock();
            for table in &tables {
                table.rotate();
            }
        }
        let Some(durable) = tables.iter().find_map(|t| t.durable()) else {
            return Ok(Vec::new());
        };
        let manifest = durable.manifest.snapshot();
        let started = std::time::Instant::now();
        let mut written: Vec<(Arc<TableInner>, Arc<Frozen>, BlockMeta)> = Vec::new();
        for table in &tables {
            let (version, frozen) = table.frozen();
            if frozen.is_empty() {
                continue;
            }
            let entry = manifest.table(table.name())?;
            let (mut id, mut persisted) = (entry.next_block_id, entry.persisted_tx);
            for f in frozen {
                let meta = table
                    .write_frozen(durable, &version, &f, id, persisted)
                    .inspect_err(|e| table.listener().on_persist_error(table.name(), e))?;
                (id, persisted) = (id + 1, f.max_tx);
                written.push((table.clone(), f, meta));
            }
        }
        if written.is_empty() {
            return Ok(Vec::new());
        }
        durable.manifest.update(|m| {
            for (table, frozen, meta) in &written {
                let entry = m.tables.get_mut(table.name()).ok_or_else(|| {
                    Error::Internal(format!("table {:?} left the manifest", table.name()))
                })?;
                entry.blocks.push(meta.clone());
                entry.persisted_tx = frozen.max_tx;
                entry.next_block_id = meta.id + 1;
            }
            Ok(())
        })?;
        let (mut rows, mut bytes) = (0, 0);
        for (table, frozen, meta) in &written {
            table.swap_in(frozen, meta);
            table.listener().on_persist_end(table.name(), meta);
            (rows, bytes) = (rows + meta.rows, bytes + meta.size);
        }
        let deleted = self.truncate().unwrap_or_else(|error| {
            tracing::warn!(%error, "deleting persisted WAL objects failed; retried after the next cut");
            0
        });
        tracing::info!(
            blocks = written.len(),
            rows,
            bytes,
            wal_objects_deleted = deleted,
            seconds = started.elapsed().as_secs_f64(),
            "cut persisted"
        );
        Ok(written
            .into_iter()
            .map(|(table, _, meta)| (table.name().to_owned(), meta))
            .collect())
    }

    /// Runs `f` while no other cut runs (block merges of shared databases, which take block
    /// ids as cuts do).
    pub(crate) fn between_cuts<R>(&self, f: impl FnOnce() -> R) -> R {
        let _one_at_a_time = self.cutting.lock();
        f()
    }

    /// Persists tables, the one holding the oldest unpersisted write first, until the WAL
    /// is back under its limit (or nothing more can be done).
    pub(crate) fn relieve_wal(&self) {
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
        self.relieving
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Publishes durable transactions: consecutive ones whose tables agree on an order are
/// applied together, one version swap per table.
fn publish_in_order(ready: Vec<PendingTx>) {
    let mut order: Vec<Arc<TableInner>> = Vec::new();
    let mut parts: Vec<Vec<(u64, Entry)>> = Vec::new();
    let flush = |order: &mut Vec<Arc<TableInner>>, parts: &mut Vec<Vec<(u64, Entry)>>| {
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
                Some(i) => parts[i].push((tx.tx, entry)),
                None => {
                    order.push(entry.table.clone());
                    parts.push(vec![(tx.tx, entry)]);
                }
            }
        }
    }
    flush(&mut order, &mut parts);
}

/// Checks `batch` for `table` and brings it into the engine's normal form; `None` for an
/// empty batch.
pub(crate) fn entry(table: &Table, batch: &RecordBatch) -> Result<Option<Entry>> {
    let inner = &table.inner;
    let Some(prepared) = prepare(inner.schema(), inner.options(), batch)? else {
        return Ok(None);
    };
    Ok(Some(Entry {
        table: inner.clone(),
        chunk: Arc::new(Chunk::new(prepared.batch)?),
        columns: prepared.columns,
    }))
}

/// A write spanning several tables of one database: one WAL record, durable and visible all
/// together or not at all.
///
/// Each [`Transaction::insert`] checks its batch at once (a batch that does not fit its
/// table's schema is an error there, and the transaction can still be committed without it);
/// nothing is written before [`Transaction::commit`]. Dropping a transaction without
/// committing it writes nothing.
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
/// use arrow::record_batch::RecordBatch;
/// use frostdb_core::{ColumnDef, Db, DbOptions, Schema, TableOptions};
///
/// let db = Db::open_in_memory(DbOptions::default())?;
/// let schema = |name: &str| Schema::builder(name)
///     .column(ColumnDef::new("id", DataType::Int64))
///     .column(ColumnDef::new("text", DataType::Utf8))
///     .build();
/// let names = db.table("names", schema("names")?, TableOptions::default())?;
/// let uses = db.table("uses", schema("uses")?, TableOptions::default())?;
/// let batch = |id: i64, text: &str| RecordBatch::try_new(
///     Arc::new(ArrowSchema::new(vec![
///         Field::new("id", DataType::Int64, false),
///         Field::new("text", DataType::Utf8, false),
///     ])),
///     vec![Arc::new(Int64Array::from(vec![id])), Arc::new(StringArray::from(vec![text]))],
/// );
/// let mut tx = db.transaction();
/// tx.insert(&names, &batch(1, "main")?)?;
/// tx.insert(&uses, &batch(1, "called from main")?)?;
/// tx.commit()?;
/// assert_eq!((names.stats().rows, uses.stats().rows), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a transaction writes nothing until it is committed"]
pub struct Transaction {
    log: Arc<CommitLog>,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field(
                "tables",
                &self
                    .entries
                    .iter()
                    .map(|e| e.table.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Transaction {
    pub(crate) fn new(log: Arc<CommitLog>) -> Self {
        Self {
            log,
            entries: Vec::new(),
        }
    }

    /// Adds `batch` to the rows this transaction inserts into `table`, which must belong to
    /// the transaction's database. Writes are published table by table in the order they
    /// were added, so add what others refer to first.
    pub fn insert(&mut self, table: &Table, batch: &RecordBatch) -> Result<&mut Self> {
        if !Arc::ptr_eq(table.inner.log(), &self.log) {
            return Err(Error::InvalidOption {
                option: "table",
                reason: format!(
                    "table {:?} belongs to another database than this transaction",
                    table.name()
                ),
            });
        }
        if let Some(entry) = entry(table, batch)? {
            self.entries.push(entry);
        }
        Ok(self)
    }

    /// Whether nothing has been added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes the transaction: returns its id once it is durable (on an on-disk database,
    /// its WAL record is fsynced) and visible to every later snapshot. An empty transaction
    /// writes nothing and returns the latest transaction id.
    pub fn commit(self) -> Result<u64> {
        self.submit()?.wait()
    }

    /// The first half of [`Transaction::commit`]: appends the transaction to the WAL, which
    /// fixes its place in the order of transactions, without waiting for it to be durable.
    /// Nothing of it is visible until [`Submitted::wait`] returns. A caller that must order
    /// its writes (the same symbols first written by one transaction and referred to by
    /// the next) submits under its own lock and waits outside it, so that concurrent
    /// committers still share fsyncs.
    pub fn submit(self) -> Result<Submitted> {
        let tables: Vec<Arc<TableInner>> = self.entries.iter().map(|e| e.table.clone()).collect();
        let appended = self.log.append(self.entries)?;
        Ok(Submitted {
            log: self.log,
            appended,
            tables,
            notified: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

/// A transaction in the WAL, not yet known durable (see [`Transaction::submit`]).
#[must_use = "a submitted transaction is acknowledged only by `wait`"]
pub struct Submitted {
    log: Arc<CommitLog>,
    appended: Option<(u64, u64)>,
    tables: Vec<Arc<TableInner>>,
    /// Whether the tables were told of the commit (once).
    notified: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitted")
            .field("tx", &self.appended.map(|a| a.0))
            .finish()
    }
}

impl Submitted {
    /// Waits until the transaction is durable and visible; returns its id. Several threads
    /// may wait for one transaction (a group commit shares it): each returns once it is.
    pub fn wait(&self) -> Result<u64> {
        let tx = match self.appended {
            Some((tx, position)) => self.log.finish(tx, position)?,
            None => return self.log.commit(Vec::new()),
        };
        if !self
            .notified
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            for t in &self.tables {
                t.committed(tx);
            }
        }
        Ok(tx)
    }
}

impl crate::workers::RelieveWal for CommitLog {
    fn relieve(&self) {
        self.relieve_wal();
    }
}
