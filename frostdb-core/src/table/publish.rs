//! Durable writes into the active block: one version swap per publication, rotation when the
//! active block is full, and the same path for records replayed at open.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::record_batch::RecordBatch;

use super::TableInner;
use crate::commit::Write;
use crate::error::Result;
use crate::index::chunk::Chunk;
use crate::index::version::{Frozen, Part, Version};
use crate::workers::WorkerMessage;

/// Frozen blocks a replay keeps before persisting them together (see
/// [`TableInner::apply_replayed`]); blocks at least this large are persisted one by one.
const REPLAY_PERSIST_BYTES: usize = 64 << 20;

impl TableInner {
    /// Publishes durable writes `(tx, write)`, in transaction order, as one new version.
    pub(crate) fn apply(&self, entries: Vec<(u64, Write)>) {
        let Some(&(last, _)) = entries.last() else {
            return;
        };
        let _swap = self.swap.lock();
        let current = self.current.read().clone();
        let mut schema = current.schema.clone();
        let mut l0 = Vec::with_capacity(current.l0.len() + entries.len());
        l0.extend(current.l0.iter().cloned());
        let mut bytes = current.active_bytes;
        let first = entries.first().map(|(tx, _)| *tx);
        for (tx, entry) in entries {
            if let Some(grown) = schema.grown(&entry.columns) {
                schema = Arc::new(grown);
            }
            bytes += entry.chunk.memory_size();
            let id = self.ids.fetch_add(1, Ordering::Relaxed);
            l0.push(Arc::new(Part {
                id,
                tx,
                chunk: entry.chunk,
            }));
        }
        *self.current.write() = Arc::new(Version {
            watermark: last.max(current.watermark),
            schema,
            l0: Arc::new(l0),
            active_bytes: bytes,
            active_min_tx: current.active_min_tx.or(first),
            ..(*current).clone()
        });
        if bytes >= self.options.block_size {
            self.rotate_locked();
            if self.durable.as_ref().is_some_and(|d| d.shared) {
                // A cut persists it, with every other table's data up to then.
                self.request_persistence();
            }
        }
    }

    fn request_persistence(&self) {
        if let Some(worker) = &self.workers.persistence
            && !self.persistence_queued.swap(true, Ordering::AcqRel)
        {
            let _ = worker.send(WorkerMessage::Persist(self.this.clone()));
        }
    }

    /// Moves the active block into the frozen blocks (caller holds the swap lock) and asks
    /// for it to be persisted. In-memory tables never rotate.
    pub(crate) fn rotate_locked(&self) {
        if self.durable.is_none() {
            return;
        }
        let current = self.current.read().clone();
        let Some(min_tx) = current.active_min_tx else {
            return; // nothing written since the last rotation
        };
        let frozen = Frozen {
            l0: current.l0.clone(),
            levels: current.levels.clone(),
            min_tx,
            max_tx: current.watermark,
        };
        let rows = frozen.rows();
        let mut all = (*current.frozen).clone();
        all.push(Arc::new(frozen));
        *self.current.write() = Arc::new(Version {
            l0: Arc::new(Vec::new()),
            levels: Arc::new(vec![Vec::new(); self.options.levels]),
            active_bytes: 0,
            active_min_tx: None,
            generation: current.generation + 1,
            frozen: Arc::new(all),
            ..(*current).clone()
        });
        // Later transactions go to a new segment, so that the segments holding this block's
        // transactions can be deleted once it (and every other table's data in them) is
        // persisted. During recovery there is no WAL yet.
        if let Some(wal) = self.log.wal()
            && let Err(error) = wal.rotate()
        {
            tracing::warn!(table = %self.name, %error, "starting a new WAL segment failed; the current one grows on");
        }
        self.listener.on_rotate(&self.name, rows);
        if self.durable.as_ref().is_some_and(|d| !d.shared) {
            tracing::info!(table = %self.name, rows, "active block rotated");
            // (A cut persists what it rotated itself, and says so once for every table.)
            self.request_persistence();
        }
    }

    /// Checks a write read back from the WAL as an insert is checked: its rows within the
    /// larger of the table's limit and the default (a limit lowered since does not refuse
    /// what was acknowledged), and its columns of the table's types. (Its bytes are the
    /// record's, bounded as it is read; a decoded batch's columns share that one buffer,
    /// so their sizes added up say nothing.) A record's checksum says it was not damaged,
    /// not what it holds: one written by something else (a crafted segment, an object in a
    /// shared bucket) could hold a batch of 2^44 rows of no bytes, or a column of another
    /// type, which a later scan or merge would take as the table's. `None`: an empty
    /// write, nothing to apply.
    pub(crate) fn replayable(&self, batch: &RecordBatch) -> Result<Option<crate::write::Prepared>> {
        let options = crate::options::TableOptions {
            max_batch_rows: self
                .options
                .max_batch_rows
                .max(crate::options::TableOptions::default().max_batch_rows),
            max_batch_bytes: usize::MAX,
            ..self.options.clone()
        };
        crate::write::prepare(&self.schema, &options, batch)
    }

    /// Applies a write replayed from the WAL at open ([`TableInner::replayable`] first).
    /// Persists the blocks it fills once they hold [`REPLAY_PERSIST_BYTES`] (or one block,
    /// when larger), all in one manifest update, so that replay's memory stays within that
    /// whatever the WAL's length; what is left frozen is persisted once the WAL is open
    /// ([`TableInner::persist_frozen`]). A block at a time, each rewriting the whole
    /// manifest, made reopening after a crash quadratic in the blocks replayed when blocks
    /// are small (51 s for 470 blocks of a test's 64 KiB, debug build). A read-only
    /// database writes nothing, so it keeps them in memory.
    pub(crate) fn apply_replayed(&self, tx: u64, prepared: crate::write::Prepared) -> Result<()> {
        let crate::write::Prepared { columns, batch } = prepared;
        let chunk = Arc::new(Chunk::new(batch)?);
        self.apply(vec![(tx, Write { chunk, columns })]);
        if self.log.is_read_only() {
            return Ok(());
        }
        let (blocks, bytes) = {
            let current = self.current.read();
            let bytes: usize = current.frozen.iter().map(|f| f.memory_size()).sum();
            (current.frozen.len(), bytes)
        };
        if blocks > 0
            && (self.options.block_size >= REPLAY_PERSIST_BYTES || bytes >= REPLAY_PERSIST_BYTES)
        {
            self.persist_frozen()?;
        }
        Ok(())
    }
}
