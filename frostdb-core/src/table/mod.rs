//! Tables: the handle ([`Table`]), and what happens to a table's data after the database's
//! commit log has made a write durable.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the handle: insert, snapshots, statistics |
//! | `publish.rs` | durable writes into the active block's L0, rotation, replay |
//! | `compact.rs` | compaction steps (the pure `choose`/`execute`/`apply` live in `index`) |
//! | `persist.rs` | rotated blocks streamed into Parquet, recorded in the manifest |
//! | `merge.rs` | persisted blocks of a shared database merged as they pile up |
//! | `retention.rs` | expiry by time, and deletion of blocks a caller names |

mod compact;
mod merge;
mod persist;
mod publish;
mod retention;

pub(crate) use retention::check_time_column;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arrow::record_batch::RecordBatch;
use parking_lot::{Mutex, RwLock};

use crate::commit::{CommitLog, Entry, Logged, Write};
use crate::error::Result;
use crate::events::EventListener;
use crate::index::chunk::Chunk;
use crate::index::compaction::{self, Choice, Mode};
use crate::index::version::Version;
use crate::manifest::{BlockMeta, ManifestFile};
use crate::options::TableOptions;
use crate::scan::{ScanRequest, Snapshot};
use crate::schema::{ColumnName, Schema, TableSchema};
use crate::storage::Storage;

use crate::workers::{WorkerMessage, Workers};

/// A table: takes Arrow batches, serves consistent snapshots. Cheap to clone; all clones are
/// the same table. `Send + Sync`: insert and scan from as many threads as you like.
#[derive(Clone)]
pub struct Table {
    pub(crate) inner: Arc<TableInner>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.inner.name)
            .field("watermark", &self.inner.current.read().watermark)
            .finish_non_exhaustive()
    }
}

/// The commit log of a database's tables.
pub(crate) type Log = CommitLog<TableInner>;

pub(crate) use persist::cut;

/// What an on-disk table persists to.
pub(crate) struct Durable {
    pub(crate) storage: Arc<Storage>,
    pub(crate) manifest: Arc<ManifestFile>,
    /// A database shared through a bucket: blocks are persisted by cuts of every table at
    /// once (`cut`), so that readers of the bucket see each transaction whole.
    pub(crate) shared: bool,
}

/// Everything a table is made of.
pub(crate) struct TableConfig {
    pub(crate) name: String,
    pub(crate) schema: Schema,
    pub(crate) options: TableOptions,
    pub(crate) listener: Arc<dyn EventListener>,
    pub(crate) workers: Workers,
    pub(crate) log: Arc<Log>,
    pub(crate) durable: Option<Durable>,
    pub(crate) blocks: Vec<BlockMeta>,
    pub(crate) persisted_tx: u64,
}

pub(crate) struct TableInner {
    name: String,
    schema: Arc<Schema>,
    options: TableOptions,
    /// The retention period; changeable while the table is open.
    ttl: RwLock<Option<std::time::Duration>>,
    /// Serialises version swaps: publication, compaction, rotation, persistence, retention.
    swap: Mutex<()>,
    current: RwLock<Arc<Version>>,
    /// One compaction at a time per table.
    compaction: Mutex<()>,
    /// One persistence at a time per table.
    persistence: Mutex<()>,
    ids: AtomicU64,
    listener: Arc<dyn EventListener>,
    workers: Workers,
    compaction_queued: AtomicBool,
    persistence_queued: AtomicBool,
    log: Arc<Log>,
    durable: Option<Durable>,
    /// This table itself, for messages to the background workers.
    this: Weak<TableInner>,
}

/// Sizes of a table's levels and blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStats {
    /// Highest committed transaction that wrote to the table.
    pub watermark: u64,
    /// Rows in the table, everywhere.
    pub rows: usize,
    /// The active block: L0 first, then L1 and deeper.
    pub levels: Vec<LevelStats>,
    /// Rotated blocks waiting in memory to be persisted.
    pub frozen_blocks: usize,
    /// Rows in those.
    pub frozen_rows: usize,
    /// Persisted blocks.
    pub blocks: usize,
    /// Rows in those.
    pub block_rows: usize,
    /// Bytes of those in the object store.
    pub block_bytes: u64,
    /// Arrow memory of the active and rotated blocks.
    pub memory_bytes: usize,
    /// Bytes of the database's WAL on disk (shared by its tables).
    pub wal_bytes: u64,
}

/// Size of one level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LevelStats {
    /// Parts (L0) or granules (deeper levels).
    pub chunks: usize,
    /// Sorted runs (0 for L0).
    pub runs: usize,
    /// Rows.
    pub rows: usize,
    /// Bytes of Arrow memory.
    pub bytes: usize,
}

impl Table {
    pub(crate) fn new(config: TableConfig) -> Result<Self> {
        let TableConfig {
            name,
            schema,
            options,
            listener,
            workers,
            log,
            durable,
            blocks,
            persisted_tx,
        } = config;
        let schema = Arc::new(schema);
        let mut table_schema = TableSchema::new(schema.clone());
        for block in &blocks {
            let names = block
                .columns
                .keys()
                .map(|c| ColumnName::resolve(&schema, c))
                .collect::<Result<Vec<_>>>()?;
            if let Some(grown) = table_schema.grown(&names) {
                table_schema = grown;
            }
        }
        let mut version = Version::empty(Arc::new(table_schema), options.levels);
        version.watermark = persisted_tx;
        version.blocks = Arc::new(
            blocks
                .into_iter()
                .map(|b| Arc::new(crate::storage::Block::new(b)))
                .collect(),
        );
        let ttl = options.ttl;
        let table = Self {
            inner: Arc::new_cyclic(|this| TableInner {
                this: this.clone(),
                name,
                schema,
                options,
                ttl: RwLock::new(ttl),
                swap: Mutex::new(()),
                current: RwLock::new(Arc::new(version)),
                compaction: Mutex::new(()),
                persistence: Mutex::new(()),
                ids: AtomicU64::new(1),
                listener,
                workers,
                compaction_queued: AtomicBool::new(false),
                persistence_queued: AtomicBool::new(false),
                log,
                durable,
            }),
        };
        table.inner.log.register(&table.inner);
        Ok(table)
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The table's schema definition.
    pub fn schema(&self) -> &Arc<Schema> {
        &self.inner.schema
    }

    /// The table's options.
    pub fn options(&self) -> &TableOptions {
        &self.inner.options
    }

    /// Inserts `batch` as one transaction and returns its id once it is durable (on an
    /// on-disk database: its WAL record is fsynced). The rows are visible to every snapshot
    /// taken after this returns, all together; none of them is visible before. To write to
    /// several tables at once, use [`crate::Db::transaction`].
    ///
    /// An empty batch changes nothing and returns the latest transaction id. A batch that
    /// does not fit the schema or the table's limits is rejected with a typed error and
    /// changes nothing; so is a write the WAL cannot take (a full disk), and the table stays
    /// usable.
    pub fn insert(&self, batch: &RecordBatch) -> Result<u64> {
        let Some(entry) = self.inner.entry(batch)? else {
            return Ok(self.inner.current.read().watermark);
        };
        let tx = self.inner.log.commit(vec![entry])?;
        self.inner.committed(tx);
        Ok(tx)
    }

    /// The order of `batch`'s rows by the table's sort key: `order[i]` is the row that
    /// comes `i`th, rows alike in their first order. A writer that inserts its rows in this
    /// order spares compaction and persistence the sort (they find a sorted batch in one
    /// comparison a row); any order is stored the same. `batch` may hold only some of the
    /// table's columns (those it lacks read as null), each of its column's type; nothing
    /// is written.
    pub fn sort_indices(&self, batch: &RecordBatch) -> Result<Vec<u32>> {
        if batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let prepared = crate::write::normalise(&self.inner.schema, batch, false)?;
        let schema = crate::schema::TableSchema::new(self.inner.schema.clone());
        let schema = schema.grown(&prepared.columns).unwrap_or(schema);
        let key =
            crate::index::merge::SortKey::new(&schema).with_ranks(std::iter::once(&prepared.batch));
        Ok(key
            .order(&prepared.batch)?
            .unwrap_or_else(|| (0..prepared.batch.num_rows() as u32).collect()))
    }

    /// A snapshot of the table at its current watermark.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: self.inner.current.read().clone(),
            granule_rows: self.inner.options.granule_rows,
            storage: self.inner.durable.as_ref().map(|d| d.storage.clone()),
            table: self.inner.name.clone(),
        }
    }

    /// A snapshot holding only the persisted blocks (or parts of blocks: row groups)
    /// `blocks` of this table, as another process listed them (a query spread over
    /// processes reading one bucket: each reads the parts it is given). Blocks need not be
    /// in this process's view of the table; their objects must be in its storage.
    pub fn snapshot_of_blocks(&self, blocks: Vec<crate::BlockSlice>) -> Result<Snapshot> {
        let current = self.inner.current.read().clone();
        let mut schema = (*current.schema).clone();
        for crate::BlockSlice { block, .. } in &blocks {
            let names = block
                .columns
                .keys()
                .map(|c| ColumnName::resolve(&self.inner.schema, c))
                .collect::<Result<Vec<_>>>()?;
            if let Some(grown) = schema.grown(&names) {
                schema = grown;
            }
        }
        let mut version = Version::empty(Arc::new(schema), 0);
        version.watermark = blocks.iter().map(|b| b.block.max_tx).max().unwrap_or(0);
        version.blocks = Arc::new(
            blocks
                .into_iter()
                .map(|b| Arc::new(crate::storage::Block::slice(b.block, b.row_groups)))
                .collect(),
        );
        Ok(Snapshot {
            version: Arc::new(version),
            granule_rows: self.inner.options.granule_rows,
            storage: self.inner.durable.as_ref().map(|d| d.storage.clone()),
            table: self.inner.name.clone(),
        })
    }

    /// Scans a fresh snapshot and collects the batches.
    pub fn scan(&self, request: &ScanRequest) -> Result<Vec<RecordBatch>> {
        self.snapshot().collect(request)
    }

    /// Runs the compaction steps the table's thresholds call for, now, on this thread.
    /// Returns the number of steps.
    pub fn compact(&self) -> Result<usize> {
        self.inner.compact(Mode::Policy)
    }

    /// Compacts the active block into one sorted run of the last level. Returns the number
    /// of steps.
    pub fn compact_fully(&self) -> Result<usize> {
        self.inner.compact(Mode::Full)
    }

    /// Rotates the active block now (if it holds anything) and persists every rotated block,
    /// on this thread. Returns the blocks persisted. An in-memory table has nothing to do; a
    /// read-only one refuses ([`crate::Error::ReadOnly`]).
    pub fn persist(&self) -> Result<Vec<BlockMeta>> {
        if self.inner.durable.is_none() {
            return Ok(Vec::new());
        }
        self.inner
            .log
            .refuse(|| format!("persisting table {:?}", self.inner.name))?;
        let persisted_before = {
            let _swap = self.inner.swap.lock();
            let before = self
                .inner
                .current
                .read()
                .blocks
                .iter()
                .map(|b| b.max_tx)
                .max();
            self.inner.rotate_locked();
            before.unwrap_or(0)
        };
        // The background worker may be persisting the same blocks; this waits for it.
        self.inner.persist_frozen()?;
        let version = self.inner.current.read().clone();
        Ok(version
            .blocks
            .iter()
            .filter(|b| b.min_tx > persisted_before)
            .map(|b| (**b).clone())
            .collect())
    }

    /// Deletes persisted blocks wholly older than the table's `ttl` (relative to now).
    /// Returns the deleted blocks.
    pub fn enforce_retention(&self) -> Result<Vec<BlockMeta>> {
        self.inner.enforce_retention(crate::now_ms())
    }

    /// The retention period: persisted blocks whose newest row is older are deleted.
    pub fn ttl(&self) -> Option<std::time::Duration> {
        *self.inner.ttl.read()
    }

    /// Changes the retention period (`None`: keep everything), durably: the table keeps it
    /// across reopens. Takes effect at the next retention pass.
    pub fn set_ttl(&self, ttl: Option<std::time::Duration>) -> Result<()> {
        self.inner.set_ttl(ttl)
    }

    /// Deletes the persisted blocks for which `doomed` returns true: they leave the manifest
    /// and every later snapshot at once, and their objects are deleted. Rows still in memory
    /// are not affected. Returns the deleted blocks.
    pub fn delete_blocks(&self, doomed: impl Fn(&BlockMeta) -> bool) -> Result<Vec<BlockMeta>> {
        self.inner.delete_blocks(&doomed, "deleted on request")
    }

    /// The persisted blocks.
    pub fn blocks(&self) -> Vec<BlockMeta> {
        let v = self.inner.current.read().clone();
        v.blocks.iter().map(|b| (**b).clone()).collect()
    }

    /// Sizes of the table's levels and blocks.
    pub fn stats(&self) -> TableStats {
        let v = self.inner.current.read().clone();
        let mut levels = vec![LevelStats {
            chunks: v.l0.len(),
            runs: 0,
            rows: v.l0_rows(),
            bytes: v.l0.iter().map(|p| p.chunk.memory_size()).sum(),
        }];
        levels.extend(v.levels.iter().map(|runs| LevelStats {
            chunks: runs.iter().map(|r| r.granules.len()).sum(),
            runs: runs.len(),
            rows: runs.iter().map(|r| r.rows()).sum(),
            bytes: runs.iter().map(|r| r.memory_size()).sum(),
        }));
        let (parts, runs) = v.memory_chunks();
        TableStats {
            watermark: v.watermark,
            rows: v.rows(),
            levels,
            frozen_blocks: v.frozen.len(),
            frozen_rows: v.frozen.iter().map(|f| f.rows()).sum(),
            blocks: v.blocks.len(),
            block_rows: v.blocks.iter().map(|b| b.rows as usize).sum(),
            block_bytes: v.blocks.iter().map(|b| b.size).sum(),
            memory_bytes: parts
                .iter()
                .chain(runs.iter().flatten())
                .map(|c| c.memory_size())
                .sum(),
            wal_bytes: self.inner.log.wal().map_or(0, |w| w.disk_bytes()),
        }
    }
}

impl TableInner {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn log(&self) -> &Arc<Log> {
        &self.log
    }

    pub(crate) fn durable(&self) -> Option<&Durable> {
        self.durable.as_ref()
    }

    /// Checks `batch` for this table and brings it into the engine's normal form, as a
    /// table's share of a transaction; `None` for an empty batch.
    pub(crate) fn entry(self: &Arc<Self>, batch: &RecordBatch) -> Result<Option<Entry<Self>>> {
        let Some(prepared) = crate::write::prepare(&self.schema, &self.options, batch)? else {
            return Ok(None);
        };
        Ok(Some(Entry {
            table: self.clone(),
            write: Write {
                chunk: Arc::new(Chunk::new(prepared.batch)?),
                columns: prepared.columns,
            },
        }))
    }

    /// Rotates the active block (if it holds anything).
    pub(crate) fn rotate(&self) {
        let _swap = self.swap.lock();
        self.rotate_locked();
    }

    pub(crate) fn listener(&self) -> &Arc<dyn EventListener> {
        &self.listener
    }

    pub(crate) fn clear_compaction_queued(&self) {
        self.compaction_queued.store(false, Ordering::Release);
    }

    pub(crate) fn clear_persistence_queued(&self) {
        self.persistence_queued.store(false, Ordering::Release);
    }

    /// After transaction `tx` wrote to this table: events and compaction.
    pub(crate) fn committed(&self, tx: u64) {
        self.listener.on_commit(&self.name, tx);
        self.maybe_schedule_compaction();
    }

    fn maybe_schedule_compaction(&self) {
        let Some(worker) = &self.workers.compaction else {
            return;
        };
        let version = self.current.read().clone();
        let due = compaction::choose(&version, &self.options, Mode::Policy);
        if due != Choice::DoNothing && !self.compaction_queued.swap(true, Ordering::AcqRel) {
            // A closed worker means the database is shutting down; nothing to schedule.
            let _ = worker.send(WorkerMessage::Compact(self.this.clone()));
        }
    }

    /// The oldest transaction whose rows this table holds only in memory (and the WAL).
    pub(crate) fn oldest_unpersisted_tx(&self) -> Option<u64> {
        let v = self.current.read().clone();
        v.frozen.first().map(|f| f.min_tx).or(v.active_min_tx)
    }

    /// Rotates the active block and persists every rotated one.
    pub(crate) fn rotate_and_persist(&self) -> Result<()> {
        {
            let _swap = self.swap.lock();
            self.rotate_locked();
        }
        self.persist_frozen().map(|_| ())
    }

    /// Takes the blocks `entry` lists (a read-only database following its bucket): blocks
    /// still listed stay as they are (footers cached), new ones are added, and those no
    /// longer listed are dropped, never deleted (their writer deletes them).
    pub(crate) fn follow(&self, entry: crate::manifest::TableEntry) -> Result<()> {
        let _swap = self.swap.lock();
        let current = self.current.read().clone();
        let mut schema = (*current.schema).clone();
        for block in &entry.blocks {
            let names = block
                .columns
                .keys()
                .map(|c| ColumnName::resolve(&self.schema, c))
                .collect::<Result<Vec<_>>>()?;
            if let Some(grown) = schema.grown(&names) {
                schema = grown;
            }
        }
        let old: std::collections::HashMap<&str, &Arc<crate::storage::Block>> = current
            .blocks
            .iter()
            .map(|b| (b.path.as_str(), b))
            .collect();
        let blocks: Vec<Arc<crate::storage::Block>> = entry
            .blocks
            .into_iter()
            .map(|meta| match old.get(meta.path.as_str()) {
                Some(&kept) => kept.clone(),
                None => Arc::new(crate::storage::Block::new(meta)),
            })
            .collect();
        if let Some(durable) = &self.durable {
            let listed: std::collections::HashSet<&str> =
                blocks.iter().map(|b| b.path.as_str()).collect();
            for gone in old.keys().filter(|p| !listed.contains(*p)) {
                durable.storage.forget(gone);
            }
        }
        *self.current.write() = Arc::new(Version {
            schema: Arc::new(schema),
            blocks: Arc::new(blocks),
            watermark: current.watermark.max(entry.persisted_tx),
            ..(*current).clone()
        });
        Ok(())
    }

    /// Registers the table with the persistence worker (retention, retries).
    pub(crate) fn watch(&self) {
        if let Some(worker) = &self.workers.persistence {
            let _ = worker.send(WorkerMessage::Register(
                self.this.clone(),
                self.workers.retention_interval,
            ));
        }
    }
}

impl crate::workers::TableWork for TableInner {
    fn compact_now(&self) {
        self.clear_compaction_queued();
        if let Err(error) = self.compact(compaction::Mode::Policy) {
            tracing::warn!(table = self.name(), %error, "background compaction failed");
            self.listener().on_compaction_error(self.name(), &error);
        }
    }

    fn persist_now(&self) {
        self.clear_persistence_queued();
        // Errors are reported by the table; the block stays in memory for a retry.
        let _ = self.persist_frozen();
    }

    fn every_interval(&self, now_ms: i64) {
        // Retry blocks whose persistence failed, then expire old ones.
        let _ = self.persist_frozen();
        if let Err(error) = self.enforce_retention(now_ms) {
            tracing::warn!(table = self.name(), %error, "retention failed");
        }
    }
}

impl Logged for TableInner {
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, writes: Vec<(u64, Write)>) {
        TableInner::apply(self, writes);
    }

    fn oldest_unpersisted_tx(&self) -> Option<u64> {
        TableInner::oldest_unpersisted_tx(self)
    }

    fn rotate_and_persist(&self) -> Result<()> {
        TableInner::rotate_and_persist(self)
    }
}
