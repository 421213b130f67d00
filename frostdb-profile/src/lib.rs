//! The profile model of frostdb-rs: what every layer above the engine agrees a stored
//! profile is, and the queries a profiler asks of it.
//!
//! - [`schema`]: the tables profiles are stored in, their columns (as constants: nothing
//!   else spells a column's name), sort orders and codecs.
//! - [`ids`]: symbol ids, a partition and an index, by which samples name stacks.
//! - [`Selector`] and [`TypedSelector`]: Prometheus/Parca label selectors; [`ProfileType`],
//!   the five (or six) parts naming what a profile measures; [`TimeRange`] and
//!   [`Aggregation`].
//! - [`native`]: the merges, series and label queries straight on the engine's scans, as
//!   the store answers them; [`plans`]: the same queries as DataFusion plans, the
//!   reference the native ones are checked against.
//! - `distributed` (feature `distributed`): a merge spread over worker processes.
//!
//! The crate sits on `frostdb-query` (DataFusion over the engine, which knows no profile
//! column) and under `frostdb-pprof` (ingest, the store, output).

#[cfg(feature = "distributed")]
pub mod distributed;
pub mod ids;
pub mod native;
pub mod plans;
mod range;
pub mod schema;
mod selector;

pub use frostdb_query::{Error, Result};
pub use range::{Aggregation, MAX_MS, TimeRange, checked_ms};
pub use selector::{
    MatchOp, Matcher, PROFILE_TYPE_LABEL, ProfileType, Selector, SelectorError, TypedSelector,
};
