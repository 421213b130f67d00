//! The engine's error type.

use arrow::datatypes::DataType;
use arrow::error::ArrowError;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whose fault an error is, and what a caller can do about it: what a server maps to a
/// status code (400, 413, 429, 404, 409, 503, 500) and a client to "fix the request", "retry" or
/// "call someone".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's input is wrong (a bad name, type, predicate, option or profile): fix it.
    InvalidInput,
    /// The input is well-formed but over a configured limit.
    LimitExceeded,
    /// The input is fine, but a quota of the caller (a tenant's series limit) is used up:
    /// more of its kind are refused until the quota is raised or freed.
    QuotaExceeded,
    /// What was asked for does not exist.
    NotFound,
    /// The request conflicts with what is stored (a table reopened with another schema).
    Conflict,
    /// The database cannot serve now (held by another process, closed, or refusing writes
    /// after a failed fsync): retry later or elsewhere.
    Unavailable,
    /// Stored data is damaged (a block, the WAL, the manifest): nothing the caller can fix.
    Corrupt,
    /// The file system or object store failed.
    Io,
    /// The storage holding the database is full (no space left, or over its quota):
    /// nothing of the write was kept; it succeeds again once space is freed, without a
    /// restart (retention, or an operator).
    StorageFull,
    /// A bug: an invariant of the engine does not hold.
    Internal,
}

impl ErrorKind {
    /// Whether the caller is at fault (a 4xx), not the server.
    pub fn is_client_error(self) -> bool {
        matches!(
            self,
            Self::InvalidInput
                | Self::LimitExceeded
                | Self::QuotaExceeded
                | Self::NotFound
                | Self::Conflict
        )
    }
}

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

    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and on which path.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// An object store operation failed.
    #[error("{context}: {source}")]
    ObjectStore {
        /// What was being done, and on which object.
        context: String,
        /// The store's error.
        #[source]
        source: object_store::Error,
    },

    /// A Parquet file could not be written or read.
    #[error("{context}: {source}")]
    Parquet {
        /// What was being done, and on which block.
        context: String,
        /// Parquet's error.
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// A WAL segment holds a damaged record before its end: data would be lost silently if it
    /// were skipped, so opening stops here.
    #[error("WAL segment {segment} is corrupt at byte offset {offset}: {reason}")]
    WalCorrupt {
        /// Path of the segment.
        segment: String,
        /// Offset of the damaged record.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// A persisted block is missing, truncated or not readable Parquet.
    #[error("block {block} of table {table:?} ({path}) is unreadable: {reason}")]
    BlockUnreadable {
        /// Table name.
        table: String,
        /// Block id.
        block: u64,
        /// Object path.
        path: String,
        /// What is wrong.
        reason: String,
    },

    /// The manifest could not be read or is inconsistent.
    #[error("manifest {path}: {reason}")]
    Manifest {
        /// Where the manifest is.
        path: String,
        /// What is wrong.
        reason: String,
    },

    /// A write could not be made durable (an fsync of the WAL failed); the database refuses
    /// writes until it is reopened, since what reached the disk is unknown.
    #[error("the database stopped accepting writes: {reason}")]
    Poisoned {
        /// The failure that stopped it.
        reason: String,
    },

    /// Another process (or another open in this one) owns the database directory: a writer
    /// when this one opens it to read or write, or readers when this one opens it to write.
    #[error(
        "database {} is in use by {holder}: a writer opens it alone, readers only while no \
         writer has it (stop the other, or query it through the server that holds it)",
        dir.display()
    )]
    Locked {
        /// The database directory.
        dir: std::path::PathBuf,
        /// Who holds it: `process <pid>` (a writer), or read-only opens.
        holder: String,
    },
    /// Another writer holds the lease of a database shared through a bucket.
    #[error(
        "database {prefix} is written by {holder} (its lease runs {expires_in_ms} ms more): \
         one writer at a time; send writes there, or retry once the lease has expired"
    )]
    LeaseHeld {
        /// The database's prefix in the bucket.
        prefix: String,
        /// The writer holding the lease, as it named itself.
        holder: String,
        /// How long the lease runs before another writer may take it.
        expires_in_ms: i64,
    },

    /// Another writer took over a database shared through a bucket: this process may no
    /// longer write it (what it acknowledged before is kept; nothing after is).
    #[error("database {prefix}: another writer took over ({reason}); this one stopped writing")]
    Fenced {
        /// The database's prefix in the bucket.
        prefix: String,
        /// What showed it.
        reason: String,
    },

    /// A write to a database opened read-only (a follower of a bucket, or a directory opened
    /// by [`Db::open_read_only`](crate::Db::open_read_only)).
    #[error("database {database} is open read-only: {what} is refused")]
    ReadOnly {
        /// Where the database is: its directory, or its prefix in the bucket.
        database: String,
        /// What was refused.
        what: String,
    },

    /// A scan stopped because the work it was for was called off
    /// ([`stop_scans_when`](crate::stop_scans_when)): the request it answered ended.
    #[error("the read was stopped: {reason}")]
    Stopped {
        /// Why.
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

impl Error {
    /// Whose fault this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            Self::InvalidSchema(_)
            | Self::InvalidColumnName { .. }
            | Self::UnknownColumn { .. }
            | Self::TypeMismatch { .. }
            | Self::NullViolation { .. }
            | Self::DuplicateColumn { .. }
            | Self::InvalidPredicate { .. }
            | Self::InvalidOption { .. } => K::InvalidInput,
            Self::BatchTooLarge { .. } => K::LimitExceeded,
            Self::SchemaMismatch { .. } => K::Conflict,
            Self::Locked { .. }
            | Self::Closed
            | Self::Poisoned { .. }
            | Self::LeaseHeld { .. }
            | Self::Fenced { .. }
            | Self::Stopped { .. } => K::Unavailable,
            Self::ReadOnly { .. } => K::Conflict,
            Self::Io { source, .. } if is_storage_full(source) => K::StorageFull,
            Self::Io { .. } | Self::ObjectStore { .. } => K::Io,
            Self::Parquet { .. }
            | Self::WalCorrupt { .. }
            | Self::BlockUnreadable { .. }
            | Self::Manifest { .. }
            | Self::Serde(_) => K::Corrupt,
            Self::Internal(_) | Self::Arrow(_) => K::Internal,
        }
    }
}

/// Whether `e` says the storage is full: no space left on the device, or the user's quota
/// used up (`ENOSPC`, `EDQUOT`).
pub fn is_storage_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// What a caught panic said: its message, or "a panic without a message" (a payload that
/// is neither a `String` nor a `&str`).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message")
}

/// `url` as it may be logged, shown or stored: a password in its userinfo
/// (`scheme://user:password@host/...`, or `user:password@host:port` without a scheme)
/// replaced by `xxxxx`; anything else unchanged.
pub fn redacted_url(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((start, at)) = userinfo(url) else {
        return url.into();
    };
    match url[start..at].find(':').map(|i| start + i) {
        Some(colon) => format!("{}:xxxxx{}", &url[..colon], &url[at..]).into(),
        None => url.into(),
    }
}

/// `target` (`host:port`, `user:password@host:port`, or a URL) without its userinfo: what
/// may be a label or an address shown to others.
pub fn without_userinfo(target: &str) -> std::borrow::Cow<'_, str> {
    match userinfo(target) {
        Some((0, at)) => target[at + 1..].into(),
        Some((start, at)) => format!("{}{}", &target[..start], &target[at + 1..]).into(),
        None => target.into(),
    }
}

/// Where `url`'s userinfo is: where it starts (after `scheme://`, if any) and the `@` that
/// ends it, in the authority (before any path, query or fragment).
fn userinfo(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    url[start..end].rfind('@').map(|at| (start, start + at))
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_redacted_and_userinfo_left_out_of_targets() {
        for (url, shown) in [
            (
                "https://user:s3cret@mimir:9009/api/prom/push",
                "https://user:xxxxx@mimir:9009/api/prom/push",
            ),
            ("http://u:p@w@h/x?a=b@c", "http://u:xxxxx@h/x?a=b@c"),
            ("u:s3cret@127.0.0.1:6060", "u:xxxxx@127.0.0.1:6060"),
            ("http://user@h/x", "http://user@h/x"),
            ("http://h:80/x@y", "http://h:80/x@y"),
            ("", ""),
        ] {
            assert_eq!(redacted_url(url), shown, "{url}");
        }
        assert_eq!(
            without_userinfo("u:s3cret@127.0.0.1:6060"),
            "127.0.0.1:6060"
        );
        assert_eq!(without_userinfo("127.0.0.1:6060"), "127.0.0.1:6060");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_refused_for_lack_of_space_is_told_apart_from_other_io_errors() {
        let io = |source: std::io::Error| Error::Io {
            context: "appending to WAL segment 1".into(),
            source,
        };
        // ENOSPC and EDQUOT, as the kernel reports them.
        for errno in [28, 122] {
            let e = io(std::io::Error::from_raw_os_error(errno));
            assert_eq!(e.kind(), ErrorKind::StorageFull, "{e}");
            assert!(!e.kind().is_client_error());
        }
        let e = io(std::io::Error::from_raw_os_error(5)); // EIO
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    }
}
