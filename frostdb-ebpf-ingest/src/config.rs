//! What to sample, how often, and how often to emit profiles.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Which processes to sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Target {
    /// Every process on the machine (the idle task excluded).
    #[default]
    All,
    /// These processes (all their threads). Pids are the host's (the root pid namespace).
    Pids(Vec<u32>),
    /// Processes in this cgroup (v2) or below it, e.g. `/sys/fs/cgroup/system.slice/x.service`.
    Cgroup(PathBuf),
}

/// The sampler's configuration: `Config::default().frequency_hz(99).target(..)`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Samples per second per CPU (of CPU time). Default 19: an odd rate avoids beating with
    /// periodic work at 10, 20 or 100 Hz.
    pub frequency_hz: u64,
    /// How often a profile per process is produced. Default 10 s.
    pub interval: Duration,
    /// Which processes to sample.
    pub target: Target,
    /// Kernel memory for unwind tables (the `.eh_frame` of every sampled binary, compiled):
    /// user stacks of code without frame pointers are unwound with them. Default 32 MiB,
    /// about 2 M rows (this machine's processes, a 100 MB Rust server among them, take
    /// about 21 MiB); a binary that does not fit is walked by frame pointer, and logged.
    /// 0 walks every stack by frame pointer.
    pub unwind_table_bytes: u64,
}

/// [`Config::unwind_table_bytes`] by default.
pub const DEFAULT_UNWIND_TABLE_BYTES: u64 = 32 << 20;

/// The most [`Config::unwind_table_bytes`] may be.
pub const MAX_UNWIND_TABLE_BYTES: u64 = 1 << 30;

impl Default for Config {
    fn default() -> Self {
        Self {
            frequency_hz: 19,
            interval: Duration::from_secs(10),
            target: Target::All,
            unwind_table_bytes: DEFAULT_UNWIND_TABLE_BYTES,
        }
    }
}

impl Config {
    /// Sets [`Self::frequency_hz`].
    pub fn frequency_hz(mut self, value: u64) -> Self {
        self.frequency_hz = value;
        self
    }

    /// Sets [`Self::interval`].
    pub fn interval(mut self, value: Duration) -> Self {
        self.interval = value;
        self
    }

    /// Sets [`Self::target`].
    pub fn target(mut self, value: Target) -> Self {
        self.target = value;
        self
    }

    /// Sets [`Self::unwind_table_bytes`].
    pub fn unwind_table_bytes(mut self, value: u64) -> Self {
        self.unwind_table_bytes = value;
        self
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<()> {
        if !(1..=10_000).contains(&self.frequency_hz) {
            return Err(Error::Config(format!(
                "frequency_hz must be within 1..=10000, got {}",
                self.frequency_hz
            )));
        }
        if self.interval < Duration::from_millis(100) {
            return Err(Error::Config(format!(
                "interval must be at least 100 ms, got {:?}",
                self.interval
            )));
        }
        if self.unwind_table_bytes > MAX_UNWIND_TABLE_BYTES {
            return Err(Error::Config(format!(
                "unwind_table_bytes must be at most {MAX_UNWIND_TABLE_BYTES} (1 GiB), got {}",
                self.unwind_table_bytes
            )));
        }
        if let Target::Pids(pids) = &self.target {
            if pids.is_empty() {
                return Err(Error::Config("the pid list is empty".into()));
            }
            if pids.len() > 4096 {
                return Err(Error::Config(format!(
                    "at most 4096 pids can be listed, got {}",
                    pids.len()
                )));
            }
        }
        Ok(())
    }

    /// The sampling period in nanoseconds of CPU time.
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.frequency_hz
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let c = Config::default();
        assert_eq!((c.frequency_hz, c.interval), (19, Duration::from_secs(10)));
        assert!(c.validate().is_ok());
        assert_eq!(c.period_ns(), 52_631_578);
        let bad = |c: Config| c.validate().unwrap_err().to_string();
        assert!(
            bad(Config {
                frequency_hz: 0,
                ..Config::default()
            })
            .contains("frequency_hz")
        );
        assert!(
            bad(Config {
                interval: Duration::from_millis(10),
                ..Config::default()
            })
            .contains("interval")
        );
        assert!(
            bad(Config {
                unwind_table_bytes: MAX_UNWIND_TABLE_BYTES + 1,
                ..Config::default()
            })
            .contains("unwind_table_bytes")
        );
        assert!(
            bad(Config {
                target: Target::Pids(vec![]),
                ..Config::default()
            })
            .contains("empty")
        );
    }
}
