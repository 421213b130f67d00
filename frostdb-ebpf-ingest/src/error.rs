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
    #[error("{what}")]
    Bpf {
        /// What was being done, and the error's chain down to the errno.
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
    /// A binary's unwind information could not be read.
    #[error("unwind table: {0}")]
    Unwind(String),
    /// The sampler's thread panicked or vanished.
    #[error("the sampler thread stopped unexpectedly: {0}")]
    Thread(String),
}

impl Error {
    pub(crate) fn bpf(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        // aya's top-level messages name the syscall ("`bpf_prog_load` failed"); the errno is
        // further down the chain. Spell the chain out, and give permission failures (EPERM,
        // EACCES) their own variant: callers skip on them.
        let mut detail = source.to_string();
        let mut denied = false;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&source);
        while let Some(e) = cause {
            let io = e.downcast_ref::<std::io::Error>();
            denied |= io.is_some_and(|io| matches!(io.raw_os_error(), Some(1 | 13)));
            if let Some(next) = e.source() {
                detail.push_str(": ");
                detail.push_str(&next.to_string());
            }
            cause = e.source();
        }
        let what = format!("{}: {detail}", what.into());
        if denied {
            return Error::NotPermitted(what);
        }
        Error::Bpf {
            what,
            source: Box::new(source),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("`bpf_prog_load` failed")]
    struct Syscall(#[source] std::io::Error);

    #[test]
    fn the_errno_down_the_chain_is_named_and_classified() {
        let denied = Error::bpf("loading", Syscall(std::io::Error::from_raw_os_error(1)));
        assert!(matches!(denied, Error::NotPermitted(_)), "{denied}");
        assert!(denied.to_string().contains("not permitted"), "{denied}");
        let other = Error::bpf("loading", Syscall(std::io::Error::from_raw_os_error(22)));
        assert!(matches!(other, Error::Bpf { .. }), "{other}");
        assert!(
            other
                .to_string()
                .contains("`bpf_prog_load` failed: Invalid argument"),
            "{other}"
        );
    }
}
