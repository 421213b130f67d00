//! Errors of the sampler.

/// What went wrong while starting, running or stopping the sampler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// This process may not load BPF programs or open perf events.
    #[error("eBPF sampling is not permitted here: {0}")]
    NotPermitted(String),
    /// The configuration is unusable.
    #[error("invalid sampler configuration: {0}")]
    Config(String),
    /// A BPF operation failed.
    #[error("{what}: {source}")]
    Bpf {
        /// What was being done.
        what: String,
        /// The error aya reported.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The BPF object lacks a map or program this crate expects (a build mismatch).
    #[error("the BPF object has no {0}")]
    MissingMap(&'static str),
    /// Reading from /proc or /sys failed.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// The sampler's thread panicked or vanished.
    #[error("the sampler thread stopped unexpectedly: {0}")]
    Thread(String),
}

impl Error {
    pub(crate) fn bpf(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let what = what.into();
        let text = source.to_string();
        // Permission failures deserve their own variant: callers skip on them.
        if text.contains("Operation not permitted") || text.contains("Permission denied") {
            return Error::NotPermitted(format!("{what}: {text}"));
        }
        Error::Bpf {
            what,
            source: Box::new(source),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
