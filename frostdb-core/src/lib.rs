//! The frostdb-rs storage engine.
//!
//! Data flows in this order through the modules; each uses only those above it, except
//! where noted:
//!
//! | module | what |
//! |---|---|
//! | `schema`, `scalar` | column definitions, dynamic columns (`labels.*`), sorting columns, the effective schema; typed values |
//! | `predicate` | what scans filter by (`col`), exact column statistics, predicates bound to a schema and checked against rows or statistics |
//! | `write`, `dictionary` | checking and normalising inserted batches |
//! | `wal` | the checksummed, segmented log a write is fsynced to before it is acknowledged |
//! | `io`, `fs`, `storage`, `manifest` | blocks written as Parquet to an object store and read back pruned; the manifest that lists them |
//! | `index` | the LSM levels: L0 parts, sorted runs of granules with exact statistics, compaction |
//! | `scan` | snapshots, projections, pruning, sorted merges |
//! | `events` | what background work tells an embedder (compactions, persistence, retention) |
//! | `workers` | the threads that persist, compact and run maintenance for every table of a pool: they run what a table or commit log asks (`TableWork`, `RelieveWal`, which those implement) and know nothing else of them (`options` names a pool) |
//! | `commit` | the commit log: transaction ids, the one WAL, group commit, publication in transaction order; it knows a table only as `Logged` (a name, somewhere to publish, persistence when the WAL is too long) |
//! | `table` | a table: writes through the log, snapshot publication, persistence (and the cut of every table of a shared database), retention, compaction driving |
//! | `transaction` | writes to several tables committed as one |
//! | `db` | opening, recovery, the tables of a database, shared buckets and leases |
//!
//! A table's state is an immutable version swapped atomically on each commit or compaction:
//! a reader's snapshot is one pointer copy and sees every transaction up to its watermark,
//! none after, and never half of one.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{Int64Array, StringArray};
//! use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
//! use arrow::record_batch::RecordBatch;
//! use frostdb_core::{ColumnDef, Db, DbOptions, Encoding, ScanRequest, Schema, SortingColumn,
//!     TableOptions, col};
//!
//! let db = Db::open_in_memory(DbOptions::default())?;
//! let schema = Schema::builder("samples")
//!     .column(ColumnDef::new("name", DataType::Utf8).encoding(Encoding::RleDictionary))
//!     .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
//!     .column(ColumnDef::new("timestamp", DataType::Int64))
//!     .column(ColumnDef::new("value", DataType::Int64))
//!     .sort_by(SortingColumn::asc("name"))
//!     .sort_by(SortingColumn::asc("labels"))
//!     .sort_by(SortingColumn::asc("timestamp"))
//!     .build()?;
//! let samples = db.table("samples", schema, TableOptions::default())?;
//!
//! let batch = RecordBatch::try_new(
//!     Arc::new(ArrowSchema::new(vec![
//!         Field::new("name", DataType::Utf8, false),
//!         Field::new("labels.pod", DataType::Utf8, true),
//!         Field::new("timestamp", DataType::Int64, false),
//!         Field::new("value", DataType::Int64, false),
//!     ])),
//!     vec![
//!         Arc::new(StringArray::from(vec!["cpu", "cpu", "cpu"])),
//!         Arc::new(StringArray::from(vec!["api-1", "api-2", "db-1"])),
//!         Arc::new(Int64Array::from(vec![1000, 1000, 2000])),
//!         Arc::new(Int64Array::from(vec![10, 20, 30])),
//!     ],
//! )?;
//! samples.insert(&batch)?;
//!
//! let api = samples.scan(
//!     &ScanRequest::new()
//!         .project(["labels.*", "value"])
//!         .filter(col("labels.pod").regex_match("^api-"))
//!         .sorted(true),
//! )?;
//! let rows: usize = api.iter().map(|b| b.num_rows()).sum();
//! assert_eq!(rows, 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bucket;
mod budget;
mod commit;
mod db;
mod dictionary;
mod error;
mod events;
pub mod fs;
#[doc(hidden)]
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod index;
mod io;
pub mod ipc;
mod lease;
mod lock;
mod manifest;
mod options;
mod predicate;
mod scalar;
mod scan;
mod schema;
mod storage;
mod table;
#[doc(hidden)]
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod transaction;
mod wal;
mod workers;
mod write;

pub use bucket::Bucket;
pub use budget::{MemoryBudget, OverBudget, Reservation, available_memory};
pub use commit::Closed;
pub use db::Db;
pub use error::{
    Error, ErrorKind, Result, is_storage_full, panic_message, redacted_url, without_userinfo,
};
pub use events::{CompactionJob, CompactionOutcome, EventListener, NoopListener};
pub use lock::{DirLock, LOCK_FILE};
pub use manifest::{BlockMeta, BlockSlice, MirrorHealth};
pub use options::{DbOptions, Durability, SharedOptions, TableOptions};
pub use predicate::{CmpOp, Col, ColumnStats, Predicate, col};
pub use scalar::Scalar;
pub use scan::stop::{stop_scans_when, stopped_now};
pub use scan::{Projection, Scan, ScanMetrics, ScanRequest, Snapshot};
pub use schema::{
    ColumnDef, Compression, Encoding, MAX_NAME_LEN, Schema, SchemaBuilder, SortingColumn,
    TableSchema,
};
pub use storage::Upload;
pub use table::{LevelStats, Table, TableStats};
pub use transaction::{Submitted, Transaction};
pub use wal::WalStats;
pub use workers::{Maintenance, WorkerPool};

/// Milliseconds since the Unix epoch, now: the clock of timestamps, retention and ingest
/// (0 if the system clock is before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

// The README's Rust examples run as doc tests of `embedding/`, a crate outside the
// workspace that depends on frostdb-pprof and frostdb-core as an embedder does.
