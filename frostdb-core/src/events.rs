//! Engine events, so that embedders can observe background work and tests can wait for it
//! instead of sleeping.

use crate::error::Error;
use crate::manifest::BlockMeta;

/// Receives engine events. Every method has an empty default; implement what you need.
///
/// Methods are called on the thread doing the work, outside of the table's locks; they should
/// return quickly.
pub trait EventListener: Send + Sync + 'static {
    /// A write was committed as transaction `tx` of `table`.
    fn on_commit(&self, table: &str, tx: u64) {
        let _ = (table, tx);
    }

    /// A compaction step starts.
    fn on_compaction_begin(&self, table: &str, job: &CompactionJob) {
        let _ = (table, job);
    }

    /// A compaction step was published.
    fn on_compaction_end(&self, table: &str, outcome: &CompactionOutcome) {
        let _ = (table, outcome);
    }

    /// A background compaction step failed; the table keeps its previous state.
    fn on_compaction_error(&self, table: &str, error: &Error) {
        let _ = (table, error);
    }

    /// The active block of `table` rotated: `rows` rows wait to be persisted.
    fn on_rotate(&self, table: &str, rows: usize) {
        let _ = (table, rows);
    }

    /// Persisting block `block` of `table` (`rows` rows) starts.
    fn on_persist_begin(&self, table: &str, block: u64, rows: usize) {
        let _ = (table, block, rows);
    }

    /// A block was persisted, recorded in the manifest, and its WAL prefix deleted.
    fn on_persist_end(&self, table: &str, block: &BlockMeta) {
        let _ = (table, block);
    }

    /// Persisting a block failed; it stays in memory (and in the WAL) and is retried.
    fn on_persist_error(&self, table: &str, error: &Error) {
        let _ = (table, error);
    }

    /// Retention deleted these blocks.
    fn on_retention(&self, table: &str, deleted: &[BlockMeta]) {
        let _ = (table, deleted);
    }
}

/// A listener that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopListener;

impl EventListener for NoopListener {}

/// A public description of a compaction step, for listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionJob {
    /// Shallowest level the inputs come from (0 = L0).
    pub from_level: usize,
    /// Level the output run goes to.
    pub to_level: usize,
    /// Number of parts and runs merged (1 for a move).
    pub inputs: usize,
    /// Rows in the inputs.
    pub rows: usize,
    /// Whether the step moved a run without rewriting it.
    pub moved: bool,
}

/// What a finished compaction step produced.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionOutcome {
    /// The step.
    pub job: CompactionJob,
    /// Granules in the output run.
    pub granules: usize,
    /// Arrow memory of the inputs.
    pub bytes_before: usize,
    /// Arrow memory of the output.
    pub bytes_after: usize,
}
