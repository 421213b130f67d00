//! Tables: the commit path, snapshots, and compaction driving.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};

use arrow::record_batch::RecordBatch;
use parking_lot::{Mutex, RwLock};

use crate::error::Result;
use crate::events::EventListener;
use crate::index::chunk::Chunk;
use crate::index::compaction::{self, Choice, Mode};
use crate::index::version::{Part, Version};
use crate::options::TableOptions;
use crate::scan::{ScanRequest, Snapshot};
use crate::schema::{Schema, TableSchema};
use crate::write::prepare;

/// Messages to the background compaction worker.
pub(crate) enum WorkerMessage {
    Compact(Weak<TableInner>),
    Shutdown,
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

pub(crate) struct TableInner {
    name: String,
    schema: Arc<Schema>,
    options: TableOptions,
    /// Serialises commits and version swaps; holds the next transaction id.
    commit: Mutex<u64>,
    current: RwLock<Arc<Version>>,
    /// One compaction at a time per table.
    compaction: Mutex<()>,
    ids: AtomicU64,
    listener: Arc<dyn EventListener>,
    worker: Option<mpsc::Sender<WorkerMessage>>,
    queued: AtomicBool,
}

/// Sizes of a table's levels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStats {
    /// Highest committed transaction.
    pub watermark: u64,
    /// Rows in the table.
    pub rows: usize,
    /// L0 first, then L1 and deeper.
    pub levels: Vec<LevelStats>,
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
    pub(crate) fn new(
        name: String,
        schema: Schema,
        options: TableOptions,
        listener: Arc<dyn EventListener>,
        worker: Option<mpsc::Sender<WorkerMessage>>,
    ) -> Self {
        let schema = Arc::new(schema);
        let version = Version::empty(Arc::new(TableSchema::new(schema.clone())), options.levels);
        Self {
            inner: Arc::new(TableInner {
                name,
                schema,
                options,
                commit: Mutex::new(1),
                current: RwLock::new(Arc::new(version)),
                compaction: Mutex::new(()),
                ids: AtomicU64::new(1),
                listener,
                worker,
                queued: AtomicBool::new(false),
            }),
        }
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

    /// Inserts `batch` as one transaction and returns its id. The rows are visible to every
    /// snapshot taken after this returns, all together; none of them is visible before.
    ///
    /// An empty batch changes nothing and returns the current watermark. A batch that does
    /// not fit the schema or the table's limits is rejected with a typed error and changes
    /// nothing.
    pub fn insert(&self, batch: &RecordBatch) -> Result<u64> {
        let inner = &self.inner;
        let Some(prepared) = prepare(&inner.schema, &inner.options, batch)? else {
            return Ok(inner.current.read().watermark);
        };
        let chunk = Arc::new(Chunk::new(prepared.batch)?);
        let id = inner.ids.fetch_add(1, Ordering::Relaxed);
        let tx = {
            let mut next_tx = inner.commit.lock();
            let tx = *next_tx;
            *next_tx += 1;
            let current = inner.current.read().clone();
            let schema = match current.schema.grown(&prepared.columns) {
                Some(grown) => Arc::new(grown),
                None => current.schema.clone(),
            };
            let mut l0 = Vec::with_capacity(current.l0.len() + 1);
            l0.extend(current.l0.iter().cloned());
            l0.push(Arc::new(Part { id, tx, chunk }));
            let next = Version {
                watermark: tx,
                schema,
                l0: Arc::new(l0),
                levels: current.levels.clone(),
            };
            *inner.current.write() = Arc::new(next);
            tx
        };
        inner.listener.on_commit(&inner.name, tx);
        self.maybe_schedule_compaction();
        Ok(tx)
    }

    fn maybe_schedule_compaction(&self) {
        let Some(worker) = &self.inner.worker else {
            return;
        };
        let version = self.inner.current.read().clone();
        let due = compaction::choose(&version, &self.inner.options, Mode::Policy);
        if due != Choice::DoNothing && !self.inner.queued.swap(true, Ordering::AcqRel) {
            // A closed worker means the database is shutting down; nothing to schedule.
            let _ = worker.send(WorkerMessage::Compact(Arc::downgrade(&self.inner)));
        }
    }

    /// A snapshot of the table at its current watermark.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: self.inner.current.read().clone(),
            granule_rows: self.inner.options.granule_rows,
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

    /// Compacts everything into one sorted run of the last level. Returns the number of
    /// steps.
    pub fn compact_fully(&self) -> Result<usize> {
        self.inner.compact(Mode::Full)
    }

    /// Sizes of the table's levels.
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

    pub(crate) fn clear_queued(&self) {
        self.queued.store(false, Ordering::Release);
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
}
