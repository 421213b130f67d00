//! Options of databases and tables.

use std::fmt;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::events::{EventListener, NoopListener};

/// Options of one table.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `granule_rows` | 8192 | target rows of a granule (a sorted chunk of L1 and deeper) |
/// | `l0_max_rows` | 65 536 | L0 is flushed into a sorted L1 run past this many rows ... |
/// | `l0_max_parts` | 64 | ... or this many parts |
/// | `level_fanout` | 4 | a level holding this many runs is merged into the next level; in the last level, this many runs of one size class (rows within a factor of `level_fanout`) are merged into one |
/// | `levels` | 2 | levels below L0 (L1, L2); the last one merges into itself |
/// | `max_batch_rows` | 4 194 304 | larger inserts are rejected |
/// | `max_batch_bytes` | 512 MiB | larger inserts (Arrow memory) are rejected |
/// | `block_size` | 256 MiB | past this much Arrow memory the active block rotates and is persisted (on-disk databases) |
/// | `row_group_rows` | 65 536 | rows per Parquet row group of a persisted block |
/// | `ttl` | none | persisted blocks whose newest `time_column` value is older are deleted |
/// | `time_column` | `timestamp` | an Int64 column of milliseconds since the Unix epoch, for `ttl` |
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TableOptions {
    pub(crate) granule_rows: usize,
    pub(crate) l0_max_rows: usize,
    pub(crate) l0_max_parts: usize,
    pub(crate) level_fanout: usize,
    pub(crate) levels: usize,
    pub(crate) max_batch_rows: usize,
    pub(crate) max_batch_bytes: usize,
    pub(crate) block_size: usize,
    pub(crate) row_group_rows: usize,
    pub(crate) ttl: Option<std::time::Duration>,
    pub(crate) time_column: String,
}

impl Default for TableOptions {
    fn default() -> Self {
        Self {
            granule_rows: 8192,
            l0_max_rows: 65_536,
            l0_max_parts: 64,
            level_fanout: 4,
            levels: 2,
            max_batch_rows: 4 << 20,
            max_batch_bytes: 512 << 20,
            block_size: 256 << 20,
            row_group_rows: 65_536,
            ttl: None,
            time_column: "timestamp".to_owned(),
        }
    }
}

impl TableOptions {
    /// Sets the target rows of a granule.
    pub fn granule_rows(mut self, rows: usize) -> Self {
        self.granule_rows = rows;
        self
    }

    /// Sets the L0 row count past which L0 is flushed.
    pub fn l0_max_rows(mut self, rows: usize) -> Self {
        self.l0_max_rows = rows;
        self
    }

    /// Sets the L0 part count past which L0 is flushed.
    pub fn l0_max_parts(mut self, parts: usize) -> Self {
        self.l0_max_parts = parts;
        self
    }

    /// Sets how many runs a level holds before it is merged into the next.
    pub fn level_fanout(mut self, fanout: usize) -> Self {
        self.level_fanout = fanout;
        self
    }

    /// Sets the number of levels below L0.
    pub fn levels(mut self, levels: usize) -> Self {
        self.levels = levels;
        self
    }

    /// Sets the largest accepted insert, in rows.
    pub fn max_batch_rows(mut self, rows: usize) -> Self {
        self.max_batch_rows = rows;
        self
    }

    /// Sets the largest accepted insert, in bytes of Arrow memory.
    pub fn max_batch_bytes(mut self, bytes: usize) -> Self {
        self.max_batch_bytes = bytes;
        self
    }

    /// Sets the size (bytes of Arrow memory) past which the active block is persisted.
    pub fn block_size(mut self, bytes: usize) -> Self {
        self.block_size = bytes;
        self
    }

    /// Sets the rows per row group of persisted blocks.
    pub fn row_group_rows(mut self, rows: usize) -> Self {
        self.row_group_rows = rows;
        self
    }

    /// Deletes persisted blocks whose newest row is older than `ttl`.
    pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets the column `ttl` reads time from (Int64, milliseconds since the Unix epoch).
    pub fn time_column(mut self, column: impl Into<String>) -> Self {
        self.time_column = column.into();
        self
    }

    /// Checks that the options can work together.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("granule_rows", self.granule_rows),
            ("l0_max_rows", self.l0_max_rows),
            ("l0_max_parts", self.l0_max_parts),
            ("levels", self.levels),
            ("max_batch_rows", self.max_batch_rows),
            ("max_batch_bytes", self.max_batch_bytes),
            ("block_size", self.block_size),
            ("row_group_rows", self.row_group_rows),
        ];
        for (option, value) in positive {
            if value == 0 {
                return Err(Error::InvalidOption {
                    option,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if self.level_fanout < 2 {
            return Err(Error::InvalidOption {
                option: "level_fanout",
                reason: format!(
                    "{} would never reduce the number of runs",
                    self.level_fanout
                ),
            });
        }
        if self.levels > 8 {
            return Err(Error::InvalidOption {
                option: "levels",
                reason: format!("{} levels below L0; at most 8 are useful", self.levels),
            });
        }
        Ok(())
    }
}

/// When a write counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Durability {
    /// Every insert returns only after an fsync covering its WAL record. Concurrent writers
    /// share fsyncs, so throughput grows with concurrency.
    #[default]
    Sync,
    /// As `Sync`, but the writer that leads an fsync first waits `max_delay` so that more
    /// writes join it: fewer fsyncs, more latency per insert.
    GroupCommit {
        /// How long a leader waits before syncing.
        max_delay: std::time::Duration,
    },
}

/// Options of a database.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `background_compaction` | true | a background thread compacts tables as their thresholds are passed; when false, call [`crate::Table::compact`] |
/// | `listener` | none | receives commit, compaction and persistence events |
/// | `durability` | `Sync` | when an insert is acknowledged (on-disk databases) |
/// | `wal_segment_bytes` | 64 MiB | size past which the WAL starts a new segment |
/// | `max_wal_bytes` | 1 GiB | past this much WAL, the table holding its oldest write is persisted (a table written rarely must not keep the whole log alive) |
/// | `retention_interval` | 60 s | how often retention (table `ttl`) is enforced |
/// | `workers` | its own | the [`crate::WorkerPool`] running background work, shared by the databases given it |
/// | `file_system` | [`crate::fs::OsFs`] | the local file layer under the WAL, the manifest and the lock |
#[derive(Clone)]
pub struct DbOptions {
    pub(crate) background_compaction: bool,
    pub(crate) listener: Arc<dyn EventListener>,
    pub(crate) durability: Durability,
    pub(crate) wal_segment_bytes: u64,
    pub(crate) max_wal_bytes: u64,
    pub(crate) retention_interval: std::time::Duration,
    pub(crate) workers: Option<crate::workers::WorkerPool>,
    pub(crate) file_system: Arc<dyn crate::fs::FileSystem>,
}

impl fmt::Debug for DbOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbOptions")
            .field("background_compaction", &self.background_compaction)
            .field("durability", &self.durability)
            .field("wal_segment_bytes", &self.wal_segment_bytes)
            .field("max_wal_bytes", &self.max_wal_bytes)
            .field("retention_interval", &self.retention_interval)
            .field("workers", &self.workers)
            .field("file_system", &self.file_system)
            .finish_non_exhaustive()
    }
}

impl Default for DbOptions {
    fn default() -> Self {
        Self {
            background_compaction: true,
            listener: Arc::new(NoopListener),
            durability: Durability::default(),
            wal_segment_bytes: 64 << 20,
            max_wal_bytes: 1 << 30,
            retention_interval: std::time::Duration::from_secs(60),
            workers: None,
            file_system: Arc::new(crate::fs::OsFs),
        }
    }
}

impl DbOptions {
    /// Turns the background compaction thread on or off.
    pub fn background_compaction(mut self, on: bool) -> Self {
        self.background_compaction = on;
        self
    }

    /// Sets when inserts are acknowledged.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the WAL segment size.
    pub fn wal_segment_bytes(mut self, bytes: u64) -> Self {
        self.wal_segment_bytes = bytes.max(1);
        self
    }

    /// Sets the WAL size past which the table holding its oldest write is persisted.
    pub fn max_wal_bytes(mut self, bytes: u64) -> Self {
        self.max_wal_bytes = bytes.max(1);
        self
    }

    /// Sets how often retention runs.
    pub fn retention_interval(mut self, every: std::time::Duration) -> Self {
        self.retention_interval = every;
        self
    }

    /// Runs the database's background work (compaction, persistence, retention, object
    /// storage I/O) on `pool`, shared with the other databases given it. Without one, the
    /// database starts its own: a compaction and a persistence thread and an I/O runtime.
    pub fn workers(mut self, pool: crate::workers::WorkerPool) -> Self {
        self.workers = Some(pool);
        self
    }

    /// Puts the WAL, the manifest and the directory lock on `fs` rather than the operating
    /// system's files (persisted blocks go to the object store either way).
    pub fn file_system(mut self, fs: Arc<dyn crate::fs::FileSystem>) -> Self {
        self.file_system = fs;
        self
    }

    /// Sets the listener that receives engine events.
    pub fn listener(mut self, listener: Arc<dyn EventListener>) -> Self {
        self.listener = listener;
        self
    }
}

/// How a process writes a database shared through a bucket ([`crate::Db::open_shared`]).
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `holder` | (required) | this writer's name in the lease: a restarted writer of the same name takes its lease back at once |
/// | `lease_ttl` | 15 s | how long the lease runs without renewal (renewed every third of it): after a writer dies, how long until another may take over |
/// | `flush_interval` | 10 s | how often every table's new data is persisted as blocks in one cut: how stale readers of the bucket may be |
/// | `retire_grace` | 5 min | how long a block merged or expired away stays in the bucket for readers still scanning it (longer than the longest query plus a reader's refresh interval) |
/// | `merge_blocks` | 8 | how many blocks of one size class are merged into one (compaction of the bucket's blocks); 0 turns merging off |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedOptions {
    pub(crate) holder: String,
    pub(crate) lease_ttl: std::time::Duration,
    pub(crate) flush_interval: std::time::Duration,
    pub(crate) retire_grace: std::time::Duration,
    pub(crate) merge_blocks: usize,
}

impl SharedOptions {
    /// Options for the writer `holder` (a name unique among the writers of the bucket, such
    /// as the host name).
    pub fn new(holder: impl Into<String>) -> Self {
        Self {
            holder: holder.into(),
            lease_ttl: std::time::Duration::from_secs(15),
            flush_interval: std::time::Duration::from_secs(10),
            retire_grace: std::time::Duration::from_secs(300),
            merge_blocks: 8,
        }
    }

    /// Sets how long the lease runs without renewal.
    pub fn lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Sets how often new data is persisted for readers.
    pub fn flush_interval(mut self, every: std::time::Duration) -> Self {
        self.flush_interval = every;
        self
    }

    /// Sets how long retired blocks stay in the bucket.
    pub fn retire_grace(mut self, grace: std::time::Duration) -> Self {
        self.retire_grace = grace;
        self
    }

    /// Sets how many blocks of a size class are merged into one (0: never).
    pub fn merge_blocks(mut self, blocks: usize) -> Self {
        self.merge_blocks = blocks;
        self
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        let invalid = |option, reason: &str| {
            Err(Error::InvalidOption {
                option,
                reason: reason.into(),
            })
        };
        if self.holder.is_empty() {
            return invalid("holder", "a writer needs a name");
        }
        if self.lease_ttl < std::time::Duration::from_millis(300) {
            return invalid(
                "lease_ttl",
                "under 300 ms the lease cannot be renewed in time",
            );
        }
        if self.flush_interval.is_zero() {
            return invalid("flush_interval", "must be positive");
        }
        if self.merge_blocks == 1 {
            return invalid("merge_blocks", "merging one block into one does nothing");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_option() {
        assert!(TableOptions::default().validate().is_ok());
        let err = TableOptions::default()
            .granule_rows(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("granule_rows"));
        let err = TableOptions::default()
            .level_fanout(1)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("level_fanout"));
    }
}
