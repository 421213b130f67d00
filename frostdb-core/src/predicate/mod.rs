//! What scans filter by, and what they check it against, below both the scans and the
//! storage that prunes for them: [`expr`] (predicates, built with [`col`]), [`stats`]
//! (exact column statistics of chunks, blocks and row groups) and [`bound`] (a predicate
//! bound to a table's schema, evaluated on rows or on statistics).

pub(crate) mod bound;
pub(crate) mod expr;
pub(crate) mod stats;

pub use expr::{CmpOp, Col, Predicate, col};
pub use stats::ColumnStats;
