//! Tables: the commit path (WAL, then publication in transaction order), snapshots,
//! block rotation and persistence, compaction driving, retention.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};

use arrow::datatypes::{Schema as ArrowSchema, SchemaRef};
use arrow::record_batch::RecordBatch;
use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::events::EventListener;
use crate::index::chunk::{Chunk, ColumnStats};
use crate::index::compaction::{self, Choice, Mode};
use crate::index::merge::{Input, Merge, SortKey};
use crate::index::version::{Frozen, Part, Version};
use crate::manifest::{BlockMeta, ManifestFile};
use crate::options::TableOptions;
use crate::scan::{ScanRequest, Snapshot};
use crate::schema::{ColumnName, Schema, TableSchema};
use crate::storage::Storage;
use crate::wal::{self, Wal};

use crate::write::prepare;

/// Messages to the background workers.
pub(crate) enum WorkerMessage {
    Compact(Weak<TableInner>),
    Persist(Weak<TableInner>),
    /// A table to watch: retention, and retries of failed persistence.
    Register(Weak<TableInner>),
    Shutdown,
}

/// Senders to the background workers.
#[derive(Clone)]
pub(crate) struct Workers {
    pub(crate) compaction: Option<mpsc::Sender<WorkerMessage>>,
    pub(crate) persistence: Option<mpsc::Sender<WorkerMessage>>,
}

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

/// What an on-disk table writes to.
pub(crate) struct Durable {
    /// Set once recovery has replayed the old segments.
    pub(crate) wal: std::sync::OnceLock<Wal>,
    pub(crate) storage: Arc<Storage>,
    pub(crate) manifest: Arc<ManifestFile>,
}

impl Durable {
    fn wal(&self) -> Result<&Wal> {
        self.wal
            .get()
            .ok_or_else(|| Error::Internal("the WAL is not open yet".into()))
    }
}

/// Everything a table is made of.
pub(crate) struct TableConfig {
    pub(crate) name: String,
    pub(crate) schema: Schema,
    pub(crate) options: TableOptions,
    pub(crate) listener: Arc<dyn EventListener>,
    pub(crate) workers: Workers,
    pub(crate) durable: Option<Durable>,
    pub(crate) blocks: Vec<BlockMeta>,
    pub(crate) persisted_tx: u64,
}

/// A write appended to the WAL, waiting for its fsync to be published.
struct Pending {
    tx: u64,
    position: u64,
    part: Arc<Part>,
    columns: Vec<ColumnName>,
}

struct CommitState {
    next_tx: u64,
    pending: VecDeque<Pending>,
}

pub(crate) struct TableInner {
    name: String,
    schema: Arc<Schema>,
    options: TableOptions,
    /// Serialises transaction ids, WAL appends and version swaps.
    commit: Mutex<CommitState>,
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
    durable: Option<Durable>,
    poisoned: Mutex<Option<String>>,
    /// This table itself, for messages to the background workers.
    this: Weak<TableInner>,
}

/// Sizes of a table's levels and blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStats {
    /// Highest committed transaction.
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
    /// Bytes of the WAL on disk.
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

/// Resolved names of the columns of a normalised batch.
fn column_names(schema: &Schema, batch: &RecordBatch) -> Result<Vec<ColumnName>> {
    batch
        .schema()
        .fields()
        .iter()
        .map(|f| ColumnName::resolve(schema, f.name()))
        .collect()
}

impl Table {
    pub(crate) fn new(config: TableConfig) -> Result<Self> {
        let TableConfig {
            name,
            schema,
            options,
            listener,
            workers,
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
        version.blocks = Arc::new(blocks.into_iter().map(Arc::new).collect());
        Ok(Self {
            inner: Arc::new_cyclic(|this| TableInner {
                this: this.clone(),
                name,
                schema,
                options,
                commit: Mutex::new(CommitState {
                    next_tx: persisted_tx + 1,
                    pending: VecDeque::new(),
                }),
                current: RwLock::new(Arc::new(version)),
                compaction: Mutex::new(()),
                persistence: Mutex::new(()),
                ids: AtomicU64::new(1),
                listener,
                workers,
                compaction_queued: AtomicBool::new(false),
                persistence_queued: AtomicBool::new(false),
                durable,
                poisoned: Mutex::new(None),
            }),
        })
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
    /// taken after this returns, all together; none of them is visible before.
    ///
    /// An empty batch changes nothing and returns the current watermark. A batch that does
    /// not fit the schema or the table's limits is rejected with a typed error and changes
    /// nothing; so is a write the WAL cannot take (a full disk), and the table stays usable.
    pub fn insert(&self, batch: &RecordBatch) -> Result<u64> {
        let inner = &self.inner;
        inner.check_poisoned()?;
        let Some(prepared) = prepare(&inner.schema, &inner.options, batch)? else {
            return Ok(inner.current.read().watermark);
        };
        let chunk = Arc::new(Chunk::new(prepared.batch)?);
        let payload = match &inner.durable {
            Some(_) => Some(wal::record::encode_batch(chunk.batch())?),
            None => None,
        };
        let id = inner.ids.fetch_add(1, Ordering::Relaxed);
        let (tx, position) = {
            let mut commit = inner.commit.lock();
            let tx = commit.next_tx;
            let position = match (&inner.durable, &payload) {
                (Some(durable), Some(payload)) => durable.wal()?.append(tx, payload)?,
                _ => 0,
            };
            commit.next_tx += 1;
            commit.pending.push_back(Pending {
                tx,
                position,
                part: Arc::new(Part { id, tx, chunk }),
                columns: prepared.columns,
            });
            (tx, position)
        };
        if let Some(durable) = &inner.durable
            && let Err(e) = durable.wal()?.sync(position)
        {
            inner.poison(&e);
            return Err(e);
        }
        inner.publish(tx)?;
        inner.listener.on_commit(&inner.name, tx);
        self.maybe_schedule_compaction();
        Ok(tx)
    }

    fn maybe_schedule_compaction(&self) {
        let Some(worker) = &self.inner.workers.compaction else {
            return;
        };
        let version = self.inner.current.read().clone();
        let due = compaction::choose(&version, &self.inner.options, Mode::Policy);
        if due != Choice::DoNothing && !self.inner.compaction_queued.swap(true, Ordering::AcqRel) {
            // A closed worker means the database is shutting down; nothing to schedule.
            let _ = worker.send(WorkerMessage::Compact(self.inner.this.clone()));
        }
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
    /// on this thread. Returns the blocks persisted. An in-memory table has nothing to do.
    pub fn persist(&self) -> Result<Vec<BlockMeta>> {
        if self.inner.durable.is_none() {
            return Ok(Vec::new());
        }
        let persisted_before = {
            let _commit = self.inner.commit.lock();
            let before = self
                .inner
                .current
                .read()
                .blocks
                .iter()
                .map(|b| b.max_tx)
                .max();
            self.inner.rotate_locked()?;
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
        TableStats {
            watermark: v.watermark,
            rows: v.rows(),
            levels,
            frozen_blocks: v.frozen.len(),
            frozen_rows: v.frozen.iter().map(|f| f.rows()).sum(),
            blocks: v.blocks.len(),
            block_rows: v.blocks.iter().map(|b| b.rows as usize).sum(),
            block_bytes: v.blocks.iter().map(|b| b.size).sum(),
            wal_bytes: self
                .inner
                .durable
                .as_ref()
                .and_then(|d| d.wal.get())
                .map_or(0, |w| w.disk_bytes()),
        }
    }
}

impl TableInner {
    pub(crate) fn name(&self) -> &str {
        &self.name
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

    fn check_poisoned(&self) -> Result<()> {
        match &*self.poisoned.lock() {
            Some(reason) => Err(Error::Poisoned {
                table: self.name.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn poison(&self, error: &Error) {
        tracing::error!(table = %self.name, %error, "WAL sync failed; the table stops accepting writes");
        *self.poisoned.lock() = Some(error.to_string());
        // Writes appended but not known durable are never published.
        self.commit.lock().pending.clear();
    }

    /// Publishes, in transaction order, every pending write the WAL has made durable, then
    /// checks that `tx` is visible.
    fn publish(&self, tx: u64) -> Result<()> {
        let mut commit = self.commit.lock();
        if !commit.pending.is_empty() {
            // Replayed records (position 0) and in-memory tables need no sync.
            let durable = self
                .durable
                .as_ref()
                .and_then(|d| d.wal.get())
                .map_or(u64::MAX, |w| w.durable_position());
            let current = self.current.read().clone();
            let mut schema = current.schema.clone();
            let mut l0 = Vec::with_capacity(current.l0.len() + commit.pending.len());
            l0.extend(current.l0.iter().cloned());
            let (mut watermark, mut bytes) = (current.watermark, current.active_bytes);
            while commit
                .pending
                .front()
                .is_some_and(|p| p.position <= durable)
            {
                let p = commit.pending.pop_front().expect("front exists");
                if let Some(grown) = schema.grown(&p.columns) {
                    schema = Arc::new(grown);
                }
                bytes += p.part.chunk.memory_size();
                watermark = p.tx;
                l0.push(p.part);
            }
            if watermark != current.watermark {
                *self.current.write() = Arc::new(Version {
                    watermark,
                    schema,
                    l0: Arc::new(l0),
                    active_bytes: bytes,
                    ..(*current).clone()
                });
                if bytes >= self.options.block_size {
                    self.rotate_locked()?;
                }
            }
        }
        drop(commit);
        if self.current.read().watermark >= tx {
            Ok(())
        } else {
            self.check_poisoned()?;
            Err(Error::Internal(format!(
                "transaction {tx} was not published"
            )))
        }
    }

    /// Moves the active block into the frozen blocks (caller holds the commit lock) and asks
    /// for it to be persisted. In-memory tables never rotate.
    fn rotate_locked(&self) -> Result<()> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let current = self.current.read().clone();
        if current.active_bytes == 0 && current.l0.is_empty() {
            return Ok(());
        }
        let frozen = Frozen {
            l0: current.l0.clone(),
            levels: current.levels.clone(),
            max_tx: current.watermark,
        };
        let rows = frozen.rows();
        let mut all = (*current.frozen).clone();
        all.push(Arc::new(frozen));
        *self.current.write() = Arc::new(Version {
            l0: Arc::new(Vec::new()),
            levels: Arc::new(vec![Vec::new(); self.options.levels]),
            active_bytes: 0,
            generation: current.generation + 1,
            frozen: Arc::new(all),
            ..(*current).clone()
        });
        // Later transactions go to a new segment, so this block's segments can go once it is
        // persisted. (During recovery there is no writer yet: replayed segments stay until
        // truncated.)
        if let Some(wal) = durable.wal.get() {
            wal.rotate(current.watermark + 1)?;
        }
        tracing::info!(table = %self.name, rows, "active block rotated");
        self.listener.on_rotate(&self.name, rows);
        if let Some(worker) = &self.workers.persistence
            && !self.persistence_queued.swap(true, Ordering::AcqRel)
        {
            let _ = worker.send(WorkerMessage::Persist(self.this.clone()));
        }
        Ok(())
    }

    pub(crate) fn compact(&self, mode: Mode) -> Result<usize> {
        let _one_at_a_time = self.compaction.lock();
        let mut steps = 0;
        loop {
            let version = self.current.read().clone();
            let choice = compaction::choose(&version, &self.options, mode);
            let Some(job) = choice.job(&version) else {
                break;
            };
            self.listener.on_compaction_begin(&self.name, &job);
            let Some(output) = compaction::execute(&version, &choice, &self.options, &self.ids)?
            else {
                break;
            };
            {
                let _commit = self.commit.lock();
                let current = self.current.read().clone();
                if current.generation != version.generation {
                    // The active block rotated meanwhile: the inputs now belong to a frozen
                    // block, and the output would duplicate them. Drop the work.
                    break;
                }
                let next = compaction::apply(&current, &output);
                *self.current.write() = Arc::new(next);
            }
            tracing::debug!(
                table = %self.name,
                from = output.outcome.job.from_level,
                to = output.outcome.job.to_level,
                rows = output.outcome.job.rows,
                granules = output.outcome.granules,
                "compacted"
            );
            self.listener.on_compaction_end(&self.name, &output.outcome);
            steps += 1;
        }
        Ok(steps)
    }

    /// Persists every frozen block, oldest first. Returns the blocks written.
    pub(crate) fn persist_frozen(&self) -> Result<Vec<BlockMeta>> {
        let Some(durable) = &self.durable else {
            return Ok(Vec::new());
        };
        let _one_at_a_time = self.persistence.lock();
        let mut written = Vec::new();
        loop {
            let version = self.current.read().clone();
            let Some(frozen) = version.frozen.first().cloned() else {
                break;
            };
            match self.persist_one(durable, &version, &frozen) {
                Ok(meta) => written.push(meta),
                Err(e) => {
                    tracing::error!(table = %self.name, error = %e, "persisting a block failed; it stays in memory and in the WAL");
                    self.listener.on_persist_error(&self.name, &e);
                    return Err(e);
                }
            }
        }
        Ok(written)
    }

    fn persist_one(
        &self,
        durable: &Durable,
        version: &Version,
        frozen: &Arc<Frozen>,
    ) -> Result<BlockMeta> {
        let entry = durable
            .manifest
            .snapshot()
            .tables
            .get(&self.name)
            .cloned()
            .ok_or_else(|| {
                Error::Internal(format!("table {:?} is not in the manifest", self.name))
            })?;
        let block_id = entry.next_block_id;
        let rows = frozen.rows();
        self.listener.on_persist_begin(&self.name, block_id, rows);
        let started = std::time::Instant::now();

        // The block's columns: those some chunk has, in schema order, with exact stats.
        let mut stats: std::collections::BTreeMap<String, ColumnStats> = Default::default();
        for chunk in frozen.chunks() {
            for (i, field) in chunk.batch().schema().fields().iter().enumerate() {
                let s = chunk.column_stats(i);
                stats
                    .entry(field.name().clone())
                    .and_modify(|acc| acc.merge(s))
                    .or_insert_with(|| s.clone());
            }
        }
        for (name, s) in stats.iter_mut() {
            // Rows of chunks lacking the column are nulls of it.
            let present: usize = frozen
                .chunks()
                .filter(|c| c.batch().schema().index_of(name).is_ok())
                .map(|c| c.rows())
                .sum();
            s.null_count += rows - present;
        }
        let fields: Vec<_> = version
            .schema
            .arrow_schema()
            .fields()
            .iter()
            .filter(|f| stats.contains_key(f.name()))
            .cloned()
            .collect();
        let schema: SchemaRef = Arc::new(ArrowSchema::new(fields));
        let key = SortKey::new(&version.schema).with_ranks(frozen.chunks().map(|c| c.batch()));
        let sort_key: Vec<(String, bool, bool)> = key.columns_with_options();
        let mut inputs: Vec<Input> = frozen
            .l0
            .iter()
            .map(|p| Input::unsorted_batch(Ok(Some(p.chunk.batch().clone()))))
            .collect();
        inputs.extend(frozen.levels.iter().flatten().map(|run| {
            let granules = run.granules.clone();
            Input::sorted(Box::new(
                granules.into_iter().map(|g| Ok(g.batch().clone())),
            ))
        }));
        let merge = Merge::new(key, inputs, schema.clone(), self.options.granule_rows, None)?;
        let properties =
            crate::storage::properties(&self.schema, &self.options, &schema, &sort_key)?;
        let path = durable.storage.block_path(&self.name, block_id);
        let written = durable
            .storage
            .write_block(path.clone(), schema, properties, merge)?;
        if written.rows as usize != rows {
            return Err(Error::Internal(format!(
                "block {block_id} got {} rows, expected {rows}",
                written.rows
            )));
        }
        let meta = BlockMeta {
            id: block_id,
            path: path.to_string(),
            size: written.size,
            rows: written.rows,
            row_groups: written.row_groups,
            min_tx: entry.persisted_tx + 1,
            max_tx: frozen.max_tx,
            columns: stats,
        };
        durable.manifest.update(|m| {
            let t = m
                .tables
                .get_mut(&self.name)
                .ok_or_else(|| Error::Internal("table vanished from the manifest".into()))?;
            t.blocks.push(meta.clone());
            t.persisted_tx = frozen.max_tx;
            t.next_block_id = block_id + 1;
            Ok(())
        })?;
        {
            let _commit = self.commit.lock();
            let current = self.current.read().clone();
            let frozen_left: Vec<_> = current
                .frozen
                .iter()
                .filter(|f| !Arc::ptr_eq(f, frozen))
                .cloned()
                .collect();
            let mut blocks = (*current.blocks).clone();
            blocks.push(Arc::new(meta.clone()));
            *self.current.write() = Arc::new(Version {
                frozen: Arc::new(frozen_left),
                blocks: Arc::new(blocks),
                ..(*current).clone()
            });
        }
        let segments = match durable.wal.get() {
            Some(wal) => wal.truncate_through(frozen.max_tx)?,
            None => 0,
        };
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(
            table = %self.name,
            block = block_id,
            rows,
            bytes = written.size,
            row_groups = written.row_groups,
            wal_segments_deleted = segments,
            seconds = secs,
            "block persisted"
        );
        self.listener.on_persist_end(&self.name, &meta);
        Ok(meta)
    }

    /// Applies a replayed WAL record (recovery).
    pub(crate) fn apply_replayed(&self, tx: u64, batch: RecordBatch) -> Result<()> {
        let columns = column_names(&self.schema, &batch)?;
        let chunk = Arc::new(Chunk::new(batch)?);
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let mut commit = self.commit.lock();
        commit.next_tx = tx + 1;
        commit.pending.push_back(Pending {
            tx,
            position: 0,
            part: Arc::new(Part { id, tx, chunk }),
            columns,
        });
        drop(commit);
        self.publish(tx)?;
        // Keep replay within one block of memory: persist what filled up, right away.
        if !self.current.read().frozen.is_empty() {
            self.persist_frozen()?;
        }
        Ok(())
    }

    /// Starts appending to `wal` after recovery, deleting segments that only hold persisted
    /// transactions.
    pub(crate) fn attach_wal(&self, wal: Wal) -> Result<()> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let persisted = durable
            .manifest
            .snapshot()
            .tables
            .get(&self.name)
            .map_or(0, |t| t.persisted_tx);
        let wal = durable.wal.get_or_init(|| wal);
        wal.truncate_through(persisted)?;
        if let Some(worker) = &self.workers.persistence {
            let _ = worker.send(WorkerMessage::Register(self.this.clone()));
        }
        Ok(())
    }

    /// The first transaction id the next write gets.
    pub(crate) fn next_tx(&self) -> u64 {
        self.commit.lock().next_tx
    }

    /// Deletes blocks whose newest row is older than the ttl, relative to `now_ms`.
    pub(crate) fn enforce_retention(&self, now_ms: i64) -> Result<Vec<BlockMeta>> {
        let (Some(durable), Some(ttl)) = (&self.durable, self.options.ttl) else {
            return Ok(Vec::new());
        };
        let cutoff = now_ms.saturating_sub(ttl.as_millis() as i64);
        let version = self.current.read().clone();
        let expired: Vec<BlockMeta> = version
            .blocks
            .iter()
            .filter(|b| match b.stats_of(&self.options.time_column).max {
                Some(crate::Scalar::Int(max)) => max < cutoff,
                _ => false,
            })
            .map(|b| (**b).clone())
            .collect();
        if expired.is_empty() {
            return Ok(expired);
        }
        let ids: std::collections::HashSet<u64> = expired.iter().map(|b| b.id).collect();
        durable.manifest.update(|m| {
            if let Some(t) = m.tables.get_mut(&self.name) {
                t.blocks.retain(|b| !ids.contains(&b.id));
            }
            Ok(())
        })?;
        {
            let _commit = self.commit.lock();
            let current = self.current.read().clone();
            let blocks: Vec<_> = current
                .blocks
                .iter()
                .filter(|b| !ids.contains(&b.id))
                .cloned()
                .collect();
            *self.current.write() = Arc::new(Version {
                blocks: Arc::new(blocks),
                ..(*current).clone()
            });
        }
        for b in &expired {
            durable.storage.delete(&b.path)?;
        }
        tracing::info!(table = %self.name, blocks = expired.len(), "retention deleted expired blocks");
        self.listener.on_retention(&self.name, &expired);
        Ok(expired)
    }
}
