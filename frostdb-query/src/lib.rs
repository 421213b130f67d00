//! DataFusion over frostdb-rs tables, knowing no table's layout (the profile model is
//! `frostdb-profile`'s).
//!
//! - [`FrostTable`]: a `TableProvider` with projection, filter and limit pushdown (filters
//!   the engine evaluates exactly are `Exact`), statistics from granules and the block
//!   manifest, and partitioned streaming scans; [`FrostScanExec`] shows in `EXPLAIN` what was
//!   pushed down and pruned.
//! - [`session`] / [`register_db`]: a `SessionContext` that sees every table of a `Db`, a
//!   fresh consistent snapshot per query; strict (a block that cannot be read fails the
//!   query) unless made with [`lenient_session`].
//! - [`memory_pool`] / [`budgeted_memory_pool`]: the query memory a session may use;
//!   [`check_sql_shape`]: SQL refused before it is planned (too long, too deep, writes).
//!
//! ```
//! # async fn demo() -> datafusion::error::Result<()> {
//! use frostdb_core::{ColumnDef, Db, DbOptions, Schema, TableOptions};
//! use arrow::datatypes::DataType;
//!
//! let db = Db::open_in_memory(DbOptions::default()).map_err(frostdb_query::to_datafusion)?;
//! let schema = Schema::builder("samples")
//!     .column(ColumnDef::dynamic("labels", DataType::Utf8))
//!     .column(ColumnDef::new("value", DataType::Int64))
//!     .build()
//!     .map_err(frostdb_query::to_datafusion)?;
//! db.table("samples", schema, TableOptions::default()).map_err(frostdb_query::to_datafusion)?;
//! let ctx = frostdb_query::session(&db)?;
//! let rows = ctx.sql("SELECT count(*) FROM samples").await?.collect().await?;
//! assert_eq!(rows.len(), 1);
//! # Ok(())
//! # }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

mod cancel;
#[cfg(feature = "distributed")]
pub mod distributed;
mod error;
mod exec;
mod filter;
mod functions;
pub mod grpc_frames;
mod memory;
mod provider;
pub mod regex_cost;
mod sql_shape;
mod tap;
mod window_input;

pub use cancel::{Cancel, cancellable};
pub use error::{Error, Result, datafusion_kind};
pub use exec::FrostScanExec;
pub use memory::{Spill, budgeted_memory_pool, memory_pool};
pub use provider::{
    BlocksFailed, FrostSchema, FrostTable, lenient_session, lenient_session_with, register_db,
    session, session_with,
};
pub use sql_shape::{
    MAX_FIXED_WIDTH, MAX_LITERAL_BYTES, SqlLimits, check_sql_physical_plan, check_sql_plan,
    check_sql_shape, read_only_sql, read_sql,
};

/// An engine error as a DataFusion error.
pub fn to_datafusion(e: frostdb_core::Error) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::External(Box::new(e))
}
