//! The index's current state as an immutable [`Version`], swapped whole on every change.

use std::sync::Arc;

use super::chunk::Chunk;
use crate::schema::TableSchema;

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

/// Everything a reader sees: all transactions up to `watermark` and none after.
///
/// A `Version` never changes; writers and compaction publish a new one. Readers hold an
/// `Arc<Version>`, so a snapshot is one atomic pointer copy and stays valid while it is used.
#[derive(Debug, Clone)]
pub(crate) struct Version {
    /// Highest committed transaction.
    pub(crate) watermark: u64,
    /// The effective schema: a superset of the columns of every part and granule.
    pub(crate) schema: Arc<TableSchema>,
    /// L0, in commit order.
    pub(crate) l0: Arc<Vec<Arc<Part>>>,
    /// L1 and deeper: `levels[0]` is L1.
    pub(crate) levels: Arc<Vec<Vec<Arc<Run>>>>,
}

impl Version {
    pub(crate) fn empty(schema: Arc<TableSchema>, levels: usize) -> Self {
        Self {
            watermark: 0,
            schema,
            l0: Arc::new(Vec::new()),
            levels: Arc::new(vec![Vec::new(); levels]),
        }
    }

    pub(crate) fn l0_rows(&self) -> usize {
        self.l0.iter().map(|p| p.chunk.rows()).sum()
    }

    pub(crate) fn rows(&self) -> usize {
        self.l0_rows()
            + self
                .levels
                .iter()
                .flatten()
                .map(|r| r.rows())
                .sum::<usize>()
    }
}
