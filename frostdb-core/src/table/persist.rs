//! Persistence: a rotated block streamed into one sorted Parquet object (bounded memory),
//! recorded in the manifest, then dropped from memory; the WAL segments it no longer needs
//! are deleted.

use std::sync::Arc;

use arrow::datatypes::{Schema as ArrowSchema, SchemaRef};

use super::{Durable, Log, TableInner};
use crate::error::{Error, Result};
use crate::index::merge::{Input, Merge, SortKey};
use crate::index::version::{Frozen, Version};
use crate::manifest::BlockMeta;
use crate::predicate::ColumnStats;
use crate::storage::Block;

impl TableInner {
    /// Persists every frozen block, oldest first. Returns the blocks written.
    pub(crate) fn persist_frozen(&self) -> Result<Vec<BlockMeta>> {
        let Some(durable) = &self.durable else {
            return Ok(Vec::new());
        };
        self.log
            .refuse(|| format!("persisting table {:?}", self.name))?;
        if durable.shared {
            // Every table at once, at one transaction, in one manifest update (when this
            // one has something to persist: a rotated block, or one a failed cut left).
            if self.current.read().frozen.is_empty() {
                return Ok(Vec::new());
            }
            let written = match cut(&self.log) {
                Ok(written) => written,
                Err(e) => {
                    tracing::error!(table = %self.name, error = %e, "cutting the shared database failed; its data stays in memory and in the bucket's WAL");
                    self.listener.on_persist_error(&self.name, &e);
                    return Err(e);
                }
            };
            return Ok(written
                .into_iter()
                .filter(|(table, _)| table == &self.name)
                .map(|(_, meta)| meta)
                .collect());
        }
        let _one_at_a_time = self.persistence.lock();
        let (version, frozen) = self.frozen();
        if frozen.is_empty() {
            return Ok(Vec::new());
        }
        let started = std::time::Instant::now();
        let entry = durable.manifest.table_entry(&self.name)?;
        let (mut id, mut persisted) = (entry.next_block_id, entry.persisted_tx);
        // Every frozen block written, then all recorded in one manifest update (a block
        // that failed, and those after it, stay frozen for the next attempt): the manifest,
        // rewritten whole, is written once however many blocks wait (after a crash, replay
        // freezes many).
        let mut written: Vec<(Arc<Frozen>, BlockMeta)> = Vec::new();
        let mut failed = None;
        for f in frozen {
            match self.write_frozen(durable, &version, &f, id, persisted) {
                Ok(meta) => {
                    (id, persisted) = (id + 1, f.max_tx);
                    written.push((f, meta));
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let report = |e: Error| {
            tracing::error!(table = %self.name, error = %e, "persisting a block failed; it stays in memory and in the WAL");
            self.listener.on_persist_error(&self.name, &e);
            e
        };
        if !written.is_empty() {
            // Unrecorded, the blocks written are orphans, deleted at the next open.
            durable
                .manifest
                .update(|m| {
                    let t = m.tables.get_mut(&self.name).ok_or_else(|| {
                        Error::Internal("table vanished from the manifest".into())
                    })?;
                    for (f, meta) in &written {
                        t.blocks.push(meta.clone());
                        t.persisted_tx = f.max_tx;
                        t.next_block_id = meta.id + 1;
                    }
                    Ok(())
                })
                .map_err(report)?;
        }
        for (f, meta) in &written {
            self.swap_in(f, meta);
        }
        // The WAL segments that only held persisted writes can go.
        let segments = match self.log.truncate() {
            Ok(n) => n,
            Err(error) => {
                tracing::warn!(table = %self.name, %error, "deleting persisted WAL segments failed; they are retried after the next block");
                0
            }
        };
        let secs = started.elapsed().as_secs_f64();
        for (_, meta) in &written {
            tracing::info!(
                table = %self.name,
                block = meta.id,
                rows = meta.rows,
                bytes = meta.size,
                row_groups = meta.row_groups,
                wal_segments_deleted = segments,
                seconds = secs,
                "block persisted"
            );
            self.listener.on_persist_end(&self.name, meta);
        }
        match failed {
            Some(e) => Err(report(e)),
            None => Ok(written.into_iter().map(|(_, meta)| meta).collect()),
        }
    }

    /// Streams a frozen block into a new object, block `block_id`, sorted; returns what the
    /// manifest is to record of it (`persisted_tx`: the table's persisted transaction).
    pub(crate) fn write_frozen(
        &self,
        durable: &Durable,
        version: &Version,
        frozen: &Arc<Frozen>,
        block_id: u64,
        persisted_tx: u64,
    ) -> Result<BlockMeta> {
        let rows = frozen.rows();
        self.listener.on_persist_begin(&self.name, block_id, rows);

        // The block's columns: those some chunk has, in schema order, with exact stats.
        // With the rows of the chunks that have each: rows of chunks lacking the column are
        // nulls of it.
        let stats = crate::predicate::stats::union(
            frozen.chunks().map(|chunk| {
                let schema = chunk.batch().schema();
                let columns: Vec<(String, &ColumnStats)> = schema
                    .fields()
                    .iter()
                    .enumerate()
                    .map(|(i, field)| (field.name().clone(), chunk.column_stats(i)))
                    .collect();
                (chunk.rows(), columns)
            }),
            rows,
        );
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
            min_tx: persisted_tx + 1,
            max_tx: frozen.max_tx,
            columns: stats,
        };
        Ok(meta)
    }

    /// Replaces the frozen block `frozen` by the persisted block `meta` in the current
    /// version (once the manifest records it).
    pub(crate) fn swap_in(&self, frozen: &Arc<Frozen>, meta: &BlockMeta) {
        let _swap = self.swap.lock();
        let current = self.current.read().clone();
        let frozen_left: Vec<_> = current
            .frozen
            .iter()
            .filter(|f| !Arc::ptr_eq(f, frozen))
            .cloned()
            .collect();
        let mut blocks = (*current.blocks).clone();
        blocks.push(Arc::new(Block::new(meta.clone())));
        *self.current.write() = Arc::new(Version {
            frozen: Arc::new(frozen_left),
            blocks: Arc::new(blocks),
            ..(*current).clone()
        });
    }

    /// The frozen blocks waiting to be persisted, oldest first.
    pub(crate) fn frozen(&self) -> (Arc<Version>, Vec<Arc<Frozen>>) {
        let version = self.current.read().clone();
        let frozen = version.frozen.iter().cloned().collect();
        (version, frozen)
    }
}

/// Persists every table's active data as of one transaction and records all of it in one
/// manifest update (databases shared through a bucket): a reader of the bucket sees each
/// transaction whole or not at all, symbols with the samples that use them. Rotation
/// happens while the log holds publication, so no transaction is half published when the
/// tables are cut; writes go on meanwhile (into new active blocks). A failed cut leaves its
/// blocks frozen, in memory and in the WAL: the next one writes them. Returns the blocks
/// written, with their tables.
pub(crate) fn cut(log: &Log) -> Result<Vec<(String, BlockMeta)>> {
    log.between_cuts(|| {
        let tables = log.tables();
        {
            let _publication = log.hold_publication();
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
        let deleted = log.truncate().unwrap_or_else(|error| {
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
    })
}
