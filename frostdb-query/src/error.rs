//! The query layer's error type.

use datafusion::error::DataFusionError;
use frostdb_core::ErrorKind;

/// Result alias of the query layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong answering a query.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine failed (a block it cannot read, an I/O error, ...).
    #[error(transparent)]
    Engine(#[from] frostdb_core::Error),
    /// Planning or execution failed.
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    /// A setting is wrong (a worker address that is not a URL, no workers).
    #[error("{0}")]
    Config(String),
    /// A merge spread over other processes failed (a worker died or is unreachable): the
    /// answer is not given in part.
    #[error("{0}")]
    Cluster(String),
}

impl Error {
    /// Whose fault this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Config(_) => ErrorKind::InvalidInput,
            Self::Cluster(_) => ErrorKind::Unavailable,
            Self::Engine(e) => e.kind(),
            Self::DataFusion(e) => datafusion_kind(e),
        }
    }
}

/// What DataFusion's disk manager says of a spill past its bound.
const SPILL_LIMIT_PHRASE: &str = "spilling process has exceeded the allowable limit";

/// Whose fault a DataFusion error is: an engine error inside it keeps its kind; errors of
/// parsing and planning (bad SQL, unknown columns, wrong types) are the caller's; a memory
/// or resource limit is a limit (the caller's share of the memory budget a quota); the rest
/// is the server's.
pub fn datafusion_kind(e: &DataFusionError) -> ErrorKind {
    use DataFusionError as D;
    match e.find_root() {
        D::External(inner) => match inner.downcast_ref::<frostdb_core::Error>() {
            Some(engine) => engine.kind(),
            None => match inner.downcast_ref::<frostdb_core::OverBudget>() {
                Some(over) if over.never_fits() => ErrorKind::LimitExceeded,
                // The caller's share (a tenant's) is held by its own other work.
                Some(over) if over.share.is_some() => ErrorKind::QuotaExceeded,
                Some(_) => ErrorKind::Unavailable,
                None => ErrorKind::Internal,
            },
        },
        D::SQL(..) | D::Plan(_) | D::SchemaError(..) | D::NotImplemented(_) => {
            ErrorKind::InvalidInput
        }
        D::ResourcesExhausted(_) => ErrorKind::LimitExceeded,
        // Spilling to a full disk.
        D::IoError(e) if frostdb_core::is_storage_full(e) => ErrorKind::StorageFull,
        // A session's spill past its share of the bound: DataFusion's disk manager says so
        // in an I/O error (which its spill writer may wrap in Arrow's), not as a limit.
        root if root.to_string().contains(SPILL_LIMIT_PHRASE) => ErrorKind::LimitExceeded,
        D::IoError(_) | D::ObjectStore(_) => ErrorKind::Io,
        _ => ErrorKind::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query the memory budget refused is the caller's to retry when the whole budget has
    /// no room now (503), over its quota when its own share is held by its other work
    /// (429), and over a limit when it can never fit (413).
    #[test]
    fn a_refused_reservation_is_unavailable_a_quota_or_a_limit() {
        let budget = frostdb_core::MemoryBudget::new(100);
        let share = budget.share("a", || "tenant \"a\"'s".into(), 75);
        let _others = budget.try_reserve(30, "b").unwrap();
        let _held = share.try_reserve(60, "a").unwrap();
        let kind =
            |e: frostdb_core::OverBudget| datafusion_kind(&DataFusionError::External(e.into()));
        assert_eq!(
            kind(budget.try_reserve(20, "x").unwrap_err()),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind(share.try_reserve(20, "x").unwrap_err()),
            ErrorKind::QuotaExceeded
        );
        assert_eq!(
            kind(share.try_reserve(80, "x").unwrap_err()),
            ErrorKind::LimitExceeded
        );
    }
}
