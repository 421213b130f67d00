//! The index's current state as an immutable [`Version`], swapped whole on every change.

use std::sync::Arc;

use super::chunk::Chunk;
use crate::schema::TableSchema;
use crate::storage::Block;

/// An L0 part: one inserted batch, as it came (columns normalised, rows unsorted).
#[derive(Debug)]
pub(crate) struct Part {
    pub(crate) id: u64,
    pub(crate) tx: u64,
    pub(crate) chunk: Arc<Chunk>,
}

/// A sorted run: granules in sort order, not overlapping each other. Runs of one level may
/// overlap.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) id: u64,
    pub(crate) granules: Vec<Arc<Chunk>>,
    /// Highest transaction whose rows the run holds.
    pub(crate) max_tx: u64,
}

impl Run {
    pub(crate) fn rows(&self) -> usize {
        self.granules.iter().map(|g| g.rows()).sum()
    }

    pub(crate) fn memory_size(&self) -> usize {
        self.granules.iter().map(|g| g.memory_size()).sum()
    }
}

/// A rotated block: the active data of its time, no longer written to, waiting in memory
/// until it is persisted.
#[derive(Debug)]
pub(crate) struct Frozen {
    pub(crate) l0: Arc<Vec<Arc<Part>>>,
    pub(crate) levels: Arc<Vec<Vec<Arc<Run>>>>,
    /// Lowest transaction it holds.
    pub(crate) min_tx: u64,
    /// Highest transaction it holds; everything of this table up to it is in it or
    /// persisted before it.
    pub(crate) max_tx: u64,
}

impl Frozen {
    /// Every chunk: L0 parts, then granules run by run.
    pub(crate) fn chunks(&self) -> impl Iterator<Item = &Arc<Chunk>> {
        let parts = self.l0.iter().map(|p| &p.chunk);
        parts.chain(self.levels.iter().flatten().flat_map(|r| &r.granules))
    }

    pub(crate) fn rows(&self) -> usize {
        self.chunks().map(|c| c.rows()).sum()
    }

    pub(crate) fn memory_size(&self) -> usize {
        self.chunks().map(|c| c.memory_size()).sum()
    }
}

/// Everything a reader sees: all transactions up to `watermark` and none after.
///
/// A `Version` never changes; writers, compaction and persistence publish a new one. Readers
/// hold an `Arc<Version>`, so a snapshot is one atomic pointer copy and stays valid while it
/// is used.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    /// Highest committed transaction.
    pub(crate) watermark: u64,
    /// The effective schema: a superset of the columns of every part, granule and block.
    pub(crate) schema: Arc<TableSchema>,
    /// The active block's L0, in commit order.
    pub(crate) l0: Arc<Vec<Arc<Part>>>,
    /// The active block's L1 and deeper: `levels[0]` is L1.
    pub(crate) levels: Arc<Vec<Vec<Arc<Run>>>>,
    /// Arrow memory of the active block.
    pub(crate) active_bytes: usize,
    /// Lowest transaction in the active block (`None`: nothing written since it started).
    pub(crate) active_min_tx: Option<u64>,
    /// Counts rotations: work computed on one active block must not land in the next.
    pub(crate) generation: u64,
    /// Rotated blocks being persisted, oldest first.
    pub(crate) frozen: Arc<Vec<Arc<Frozen>>>,
    /// Persisted blocks, oldest first.
    pub(crate) blocks: Arc<Vec<Arc<Block>>>,
}

impl Version {
    pub(crate) fn empty(schema: Arc<TableSchema>, levels: usize) -> Self {
        Self {
            watermark: 0,
            schema,
            l0: Arc::new(Vec::new()),
            levels: Arc::new(vec![Vec::new(); levels]),
            active_bytes: 0,
            active_min_tx: None,
            generation: 0,
            frozen: Arc::new(Vec::new()),
            blocks: Arc::new(Vec::new()),
        }
    }

    pub(crate) fn l0_rows(&self) -> usize {
        self.l0.iter().map(|p| p.chunk.rows()).sum()
    }

    /// Rows of the active block.
    pub(crate) fn active_rows(&self) -> usize {
        self.l0_rows()
            + self
                .levels
                .iter()
                .flatten()
                .map(|r| r.rows())
                .sum::<usize>()
    }

    /// Rows of the whole table.
    pub(crate) fn rows(&self) -> usize {
        self.active_rows()
            + self.frozen.iter().map(|f| f.rows()).sum::<usize>()
            + self.blocks.iter().map(|b| b.rows as usize).sum::<usize>()
    }

    /// Arrow memory of the active block, counted afresh.
    pub(crate) fn count_active_bytes(&self) -> usize {
        self.l0.iter().map(|p| p.chunk.memory_size()).sum::<usize>()
            + self
                .levels
                .iter()
                .flatten()
                .map(|r| r.memory_size())
                .sum::<usize>()
    }

    /// Chunks in memory: the active block's, then the frozen blocks'.
    pub(crate) fn memory_chunks(&self) -> (Vec<Arc<Chunk>>, Vec<Vec<Arc<Chunk>>>) {
        let mut parts: Vec<Arc<Chunk>> = self.l0.iter().map(|p| p.chunk.clone()).collect();
        let mut runs: Vec<Vec<Arc<Chunk>>> = self
            .levels
            .iter()
            .flatten()
            .map(|r| r.granules.clone())
            .collect();
        for f in self.frozen.iter() {
            parts.extend(f.l0.iter().map(|p| p.chunk.clone()));
            runs.extend(f.levels.iter().flatten().map(|r| r.granules.clone()));
        }
        (parts, runs)
    }
}
