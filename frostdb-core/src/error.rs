//! The engine's error type.

use arrow::datatypes::DataType;
use arrow::error::ArrowError;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the storage engine.
///
/// Variants are structured so callers can act on them; the `Display` text names the table,
/// column or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A schema definition is invalid (bad name, duplicate column, bad sorting column, ...).
    #[error("invalid schema: {0}")]
    InvalidSchema(String),

    /// A column name in a batch, projection or predicate is malformed.
    #[error("invalid column name {name:?}: {reason}")]
    InvalidColumnName {
        /// The offending name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A batch or query names a column the table's schema does not have.
    #[error("table {table:?} has no column {column:?}")]
    UnknownColumn {
        /// Table name.
        table: String,
        /// The unknown column.
        column: String,
    },

    /// A batch column's type conflicts with the schema.
    #[error("column {column:?} of table {table:?} is {expected}, the batch has {got}")]
    TypeMismatch {
        /// Table name.
        table: String,
        /// Column name.
        column: String,
        /// The schema's type.
        expected: DataType,
        /// The batch's type.
        got: DataType,
    },

    /// A non-nullable column is missing from a batch or holds nulls.
    #[error("column {column:?} of table {table:?} is not nullable, but the batch {problem}")]
    NullViolation {
        /// Table name.
        table: String,
        /// Column name.
        column: String,
        /// "lacks the column" or "holds N nulls".
        problem: String,
    },

    /// A batch names the same column twice.
    #[error("batch for table {table:?} has column {column:?} more than once")]
    DuplicateColumn {
        /// Table name.
        table: String,
        /// Column name.
        column: String,
    },

    /// A batch exceeds the table's configured size limits.
    #[error("batch for table {table:?} has {got} {what}, the limit is {limit}")]
    BatchTooLarge {
        /// Table name.
        table: String,
        /// "rows" or "bytes".
        what: &'static str,
        /// Size of the batch.
        got: usize,
        /// The configured limit.
        limit: usize,
    },

    /// A table was reopened with a schema different from the one it has.
    #[error("table {table:?} exists with a different schema")]
    SchemaMismatch {
        /// Table name.
        table: String,
    },

    /// A predicate cannot be applied to a column (type mismatch, literal out of range, bad regex).
    #[error("invalid predicate on column {column:?}: {reason}")]
    InvalidPredicate {
        /// Column the predicate applies to.
        column: String,
        /// Why it is invalid.
        reason: String,
    },

    /// An option has a value the engine cannot work with.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// Option name.
        option: &'static str,
        /// Why it is invalid.
        reason: String,
    },

    /// An invariant of the engine does not hold: a bug, reported instead of a panic.
    #[error("internal error: {0}")]
    Internal(String),

    /// The database has been closed.
    #[error("database is closed")]
    Closed,

    /// An Arrow kernel failed.
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),

    /// A schema could not be (de)serialised.
    #[error("schema serialisation: {0}")]
    Serde(#[from] serde_json::Error),
}
