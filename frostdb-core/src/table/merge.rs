//! Merging persisted blocks (databases shared through a bucket). Their cuts write a small
//! block per table every flush interval, so that readers see new data soon; merging keeps
//! the number of blocks, and of manifest entries, logarithmic in the data: a window of
//! `fanout` consecutive blocks of about one size becomes one sorted block, in their place.
//! The blocks merged leave the manifest with the new one's arrival and are deleted after
//! the grace period (readers may still be scanning them).

use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::{Schema as ArrowSchema, SchemaRef};

use super::TableInner;
use crate::error::{Error, Result};
use crate::index::merge::{Input, Merge, SortKey};
use crate::index::version::Version;
use crate::manifest::BlockMeta;
use crate::scan::{ScanRequest, Snapshot};
use crate::storage::Block;

/// The size class of a block of `rows`: classes grow by a factor of `fanout`.
fn class(rows: u64, fanout: usize) -> u32 {
    rows.max(1).ilog(fanout as u64)
}

/// The blocks to merge next: of the windows of `fanout` consecutive blocks whose sizes are
/// within one class of each other and whose merge stays under `max_bytes`, the one with
/// the fewest rows (small blocks first: they cost queries the most per row). `None` when no
/// window qualifies.
pub(crate) fn choose(blocks: &[&BlockMeta], fanout: usize, max_bytes: u64) -> Option<Range<usize>> {
    if fanout < 2 || blocks.len() < fanout {
        return None;
    }
    (0..=blocks.len() - fanout)
        .filter(|&start| {
            let window = &blocks[start..start + fanout];
            let classes = window.iter().map(|b| class(b.rows, fanout));
            let (lo, hi) = classes.fold((u32::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
            hi - lo <= 1 && window.iter().map(|b| b.size).sum::<u64>() < max_bytes
        })
        .min_by_key(|&start| {
            blocks[start..start + fanout]
                .iter()
                .map(|b| b.rows)
                .sum::<u64>()
        })
        .map(|start| start..start + fanout)
}

impl TableInner {
    /// Merges the window of blocks [`choose`] picks, if any: their rows, read in sort order,
    /// become one new block, which takes their place in the manifest and the current
    /// version. Runs between cuts (both take block ids). Returns the new block.
    pub(crate) fn merge_blocks(&self, fanout: usize) -> Result<Option<BlockMeta>> {
        let Some(durable) = &self.durable else {
            return Ok(None);
        };
        let _one_at_a_time = self.persistence.lock();
        self.log.between_cuts(|| {
            let version = self.current.read().clone();
            let metas: Vec<&BlockMeta> = version.blocks.iter().map(|b| b.meta()).collect();
            let Some(window) = choose(&metas, fanout, self.options.block_size as u64) else {
                return Ok(None);
            };
            let inputs: Vec<Arc<Block>> = version.blocks[window.clone()].to_vec();
            let started = std::time::Instant::now();
            let entry = durable.manifest.table_entry(&self.name)?;
            let block_id = entry.next_block_id;

            // Exact statistics of the union; columns some block lacks are nulls there.
            let rows: u64 = inputs.iter().map(|b| b.rows).sum();
            let stats = crate::predicate::stats::union(
                inputs.iter().map(|b| (b.rows as usize, &b.columns)),
                rows as usize,
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
            let columns: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();

            // A snapshot of only these blocks, read in sort order (a k-way merge of them).
            let snapshot = Snapshot {
                version: Arc::new(Version {
                    blocks: Arc::new(inputs.clone()),
                    ..Version::empty(version.schema.clone(), 0)
                }),
                granule_rows: self.options.granule_rows,
                storage: Some(durable.storage.clone()),
                table: self.name.clone(),
            };
            let request = ScanRequest::new().project(columns).sorted(true);
            let key = SortKey::new(&version.schema);
            let sort_key: Vec<(String, bool, bool)> = key.columns_with_options();
            let properties =
                crate::storage::properties(&self.schema, &self.options, &schema, &sort_key)?;
            let path = durable.storage.block_path(&self.name, block_id);
            // The blocks are read on this thread and handed over two batches at a time to
            // the upload, which runs on the I/O runtime (reading blocks needs it too).
            let (tx, rx) =
                std::sync::mpsc::sync_channel::<Result<arrow::record_batch::RecordBatch>>(2);
            let written = std::thread::scope(|s| {
                let producer = s.spawn(|| -> Result<()> {
                    // Dropped when this ends, whatever happens: the upload then ends too.
                    let tx = tx;
                    let scan = snapshot.scan(&request)?;
                    let merge = Merge::new(
                        key,
                        vec![Input::sorted(Box::new(scan))],
                        schema.clone(),
                        self.options.granule_rows,
                        None,
                    )?;
                    for batch in merge {
                        let failed = batch.is_err();
                        if tx.send(batch).is_err() || failed {
                            break;
                        }
                    }
                    Ok(())
                });
                let written = durable.storage.write_block(
                    path.clone(),
                    schema.clone(),
                    properties,
                    Handed(rx),
                );
                let produced = producer
                    .join()
                    .map_err(|_| Error::Internal("the block merge's reader panicked".into()))?;
                produced.and(written)
            })?;
            if written.rows != rows {
                return Err(Error::Internal(format!(
                    "merged block {block_id} of table {:?} got {} rows, expected {rows}",
                    self.name, written.rows
                )));
            }
            let meta = BlockMeta {
                id: block_id,
                path: path.to_string(),
                size: written.size,
                rows,
                row_groups: written.row_groups,
                min_tx: inputs.iter().map(|b| b.min_tx).min().unwrap_or(0),
                max_tx: inputs.iter().map(|b| b.max_tx).max().unwrap_or(0),
                columns: stats,
            };
            let ids: std::collections::HashSet<u64> = inputs.iter().map(|b| b.id).collect();
            durable.manifest.update(|m| {
                let t = m
                    .tables
                    .get_mut(&self.name)
                    .ok_or_else(|| Error::Internal("table vanished from the manifest".into()))?;
                let at = t
                    .blocks
                    .iter()
                    .position(|b| ids.contains(&b.id))
                    .unwrap_or(t.blocks.len());
                t.blocks.retain(|b| !ids.contains(&b.id));
                t.blocks.insert(at.min(t.blocks.len()), meta.clone());
                t.next_block_id = block_id + 1;
                Ok(())
            })?;
            {
                let _swap = self.swap.lock();
                let current = self.current.read().clone();
                let mut blocks: Vec<Arc<Block>> = Vec::with_capacity(current.blocks.len());
                let mut placed = false;
                for b in current.blocks.iter() {
                    if ids.contains(&b.id) {
                        if !placed {
                            blocks.push(Arc::new(Block::new(meta.clone())));
                            placed = true;
                        }
                        // Its object goes after the grace period, once nothing here holds it.
                        b.retire(&durable.storage);
                    } else {
                        blocks.push(b.clone());
                    }
                }
                *self.current.write() = Arc::new(Version {
                    blocks: Arc::new(blocks),
                    ..(*current).clone()
                });
            }
            tracing::info!(
                table = %self.name,
                block = block_id,
                merged = inputs.len(),
                rows,
                bytes = meta.size,
                seconds = started.elapsed().as_secs_f64(),
                "blocks merged"
            );
            Ok(Some(meta))
        })
    }
}

/// Batches handed over by another thread, waited for without holding an I/O runtime worker
/// (the upload runs on the runtime, and so do the reads the other thread waits for: two
/// merges holding both workers while waiting would never be fed).
struct Handed(std::sync::mpsc::Receiver<Result<arrow::record_batch::RecordBatch>>);

impl Iterator for Handed {
    type Item = Result<arrow::record_batch::RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        tokio::task::block_in_place(|| self.0.recv().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(rows: u64) -> BlockMeta {
        BlockMeta {
            id: rows,
            path: String::new(),
            size: rows * 10,
            rows,
            row_groups: 1,
            min_tx: 0,
            max_tx: 0,
            columns: Default::default(),
        }
    }

    fn pick(rows: &[u64], fanout: usize, max_bytes: u64) -> Option<Range<usize>> {
        let blocks: Vec<BlockMeta> = rows.iter().map(|&r| block(r)).collect();
        let refs: Vec<&BlockMeta> = blocks.iter().collect();
        choose(&refs, fanout, max_bytes)
    }

    #[test]
    fn classes_grow_by_the_fanout() {
        assert_eq!(class(0, 4), 0);
        assert_eq!(class(3, 4), 0);
        assert_eq!(class(4, 4), 1);
        assert_eq!(class(15, 4), 1);
        assert_eq!(class(16, 4), 2);
        assert_eq!(class(u64::MAX, 2), 63);
    }

    #[test]
    fn the_smallest_window_of_similar_blocks_is_merged() {
        // Too few blocks.
        assert_eq!(pick(&[10, 10, 10], 4, u64::MAX), None);
        // A big block splits the small ones into runs too short to merge.
        assert_eq!(pick(&[10, 10, 10, 100_000, 10, 10, 10], 4, u64::MAX), None);
        // Four small ones after a big one: those.
        assert_eq!(pick(&[100_000, 10, 12, 9, 11], 4, u64::MAX), Some(1..5));
        // Two windows: the one with fewer rows.
        assert_eq!(
            pick(&[600, 700, 650, 900, 5, 6, 7, 8], 4, u64::MAX),
            Some(4..8)
        );
        // Nothing that would outgrow a block.
        assert_eq!(pick(&[10, 10, 10, 10], 4, 399), None);
        assert_eq!(pick(&[10, 10, 10, 10], 4, 401), Some(0..4));
    }
}
