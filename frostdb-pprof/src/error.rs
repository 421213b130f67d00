//! Errors of pprof decoding, storing and reporting.

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong with a profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The gzip stream is damaged or truncated.
    #[error("bad gzip: {0}")]
    Gzip(String),
    /// The bytes are not a `perftools.profiles.Profile`.
    #[error("not a pprof protobuf: {0}")]
    Protobuf(String),
    /// A field breaks the format's rules (an index out of range, a missing id, ...).
    #[error("invalid pprof: {field}: {reason}")]
    Invalid {
        /// The field at fault.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A profile in another format (folded stacks, OTLP, a Pyroscope push request) could not
    /// be converted to pprof.
    #[error("invalid {format}: {at}: {reason}")]
    Convert {
        /// The format: `folded`, `lines`, `OTLP`, `push`.
        format: &'static str,
        /// Where: the line (`line 3`) or the field path
        /// (`resource_profiles[0].scope_profiles[0].profiles[2].samples[5].stack_index`).
        at: String,
        /// What is wrong.
        reason: String,
    },
    /// An error of one part of a request (a sample of a push request, a profile of an OTLP
    /// export), with where it happened; its kind is the inner error's, so a decompression
    /// bomb inside a request is still over a limit, a bad pprof still invalid input.
    #[error("{at}: {error}")]
    At {
        /// Where: `series[0].samples[1] (process_cpu)`,
        /// `resource_profiles[0].scope_profiles[0].profiles[2]`.
        at: String,
        /// What went wrong there. Shown in this error's message, so not its `source()`.
        error: Box<Error>,
    },
    /// The profile exceeds a configured limit.
    #[error("{what} exceeds the limit of {limit}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// Storing the profile would create more series than the store may hold; nothing of it
    /// was stored.
    #[error(
        "the limit of {limit} series is reached: the profile would add {new} new series, e.g. {example}"
    )]
    SeriesLimit {
        /// The limit.
        limit: usize,
        /// Series the profile would add.
        new: usize,
        /// One of them.
        example: String,
    },
    /// Storing the profile would give the store more distinct label names than it may hold
    /// ([`StoreOptions::max_label_names`](crate::StoreOptions::max_label_names)); nothing
    /// of it was stored.
    #[error(
        "the limit of {limit} label names is reached: storing this would add {new} new label names, e.g. {example:?}"
    )]
    LabelNamesLimit {
        /// The limit.
        limit: usize,
        /// Names the profile would add.
        new: usize,
        /// One of them.
        example: String,
    },
    /// A label of the profile is over a label limit of the store
    /// ([`LabelLimits`](crate::LabelLimits)); nothing of the profile was stored.
    #[error("{what}: {got}, over the limit {limit} = {value}")]
    LabelLimit {
        /// What is over it: `the label names of series cpu{…}`, `the bytes of label name "…"`.
        what: String,
        /// How many (names or bytes) it has.
        got: usize,
        /// The limit, by its option's name: `max_label_names_per_series`, ...
        limit: &'static str,
        /// The limit's value.
        value: usize,
    },
    /// Two labels map to the same name with different values.
    #[error("label {label:?} is given twice: {first} and {second}")]
    LabelCollision {
        /// The label name (sanitized).
        label: String,
        /// The first value or source.
        first: String,
        /// The second.
        second: String,
    },
    /// A query or report was asked for something it cannot answer.
    #[error("{0}")]
    Query(String),
    /// The stored symbol tables hold something they should not.
    #[error("corrupt symbol table: {0}")]
    Corrupt(String),
    /// The profile could not be stored now, through no fault of its own (the symbol
    /// partition or group it was stored with failed): storing it again can succeed.
    #[error("cannot store the profile now: {0}; retry")]
    Unavailable(String),
    /// The request needs more memory than the whole memory budget allows: it can never be
    /// served as it is, and a retry does not help (see [`crate::charging`]).
    #[error("{0}")]
    OverMemory(String),
    /// The caller's share of the memory budget has no room now: its own other work holds
    /// it (a tenant's other requests), and a retry once that is done can succeed.
    #[error("{0}")]
    OverShare(String),
    /// Committing the group of profiles this one was stored with failed.
    #[error("storing a group of profiles failed: {0}")]
    Group(std::sync::Arc<Error>),
    /// The storage engine failed.
    #[error(transparent)]
    Engine(#[from] frostdb_core::Error),
    /// A query failed.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
    /// An Arrow kernel failed.
    #[error(transparent)]
    Arrow(#[from] arrow::error::ArrowError),
}

impl Error {
    /// Whether this is (or was caused by) [`Error::OverShare`]: over a quota that frees
    /// itself, so worth retrying shortly, unlike the series and label name limits.
    pub fn is_over_share(&self) -> bool {
        match self {
            Self::OverShare(_) => true,
            Self::At { error, .. } => error.is_over_share(),
            Self::Group(e) => e.is_over_share(),
            _ => false,
        }
    }

    /// Whose fault this is: a bad or oversized profile is the sender's, a damaged symbol
    /// table or an engine failure is the server's (see [`frostdb_core::ErrorKind`]).
    pub fn kind(&self) -> frostdb_core::ErrorKind {
        use frostdb_core::ErrorKind as K;
        match self {
            Self::Gzip(_)
            | Self::Protobuf(_)
            | Self::Invalid { .. }
            | Self::Convert { .. }
            | Self::LabelCollision { .. }
            | Self::Query(_) => K::InvalidInput,
            Self::TooLarge { .. } | Self::LabelLimit { .. } | Self::OverMemory(_) => {
                K::LimitExceeded
            }
            Self::SeriesLimit { .. } | Self::LabelNamesLimit { .. } | Self::OverShare(_) => {
                K::QuotaExceeded
            }
            Self::Corrupt(_) => K::Corrupt,
            Self::Unavailable(_) => K::Unavailable,
            Self::At { error, .. } => error.kind(),
            Self::Group(e) => e.kind(),
            Self::Engine(e) => e.kind(),
            Self::DataFusion(e) => frostdb_query::datafusion_kind(e),
            Self::Arrow(_) => K::Internal,
        }
    }
}

impl Error {
    /// `self` with where it happened (see [`Error::At`]); as it is when `at` is empty (a
    /// request of one part).
    pub fn at(self, at: impl Into<String>) -> Self {
        let at = at.into();
        if at.is_empty() {
            return self;
        }
        Self::At {
            at,
            error: Box::new(self),
        }
    }

    /// The error without the context [`Error::At`] adds: what actually went wrong.
    pub fn innermost(&self) -> &Self {
        match self {
            Self::At { error, .. } => error.innermost(),
            other => other,
        }
    }
}

impl From<frostdb_query::Error> for Error {
    fn from(e: frostdb_query::Error) -> Self {
        match e {
            frostdb_query::Error::Engine(e) => Self::Engine(e),
            frostdb_query::Error::DataFusion(e) => Self::DataFusion(e),
            // A merge spread over workers that failed: retry later (503), not the query's
            // fault.
            frostdb_query::Error::Cluster(reason) => Self::Unavailable(reason),
            other => Self::Query(other.to_string()),
        }
    }
}
