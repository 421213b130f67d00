//! A sink that stores each process's profile in a frostdb-rs profile store.

use std::sync::Arc;

use frostdb_pprof::{IngestOptions, ProfileStore};

use crate::sampler::{Interval, Sink, SinkError};

/// The profile name eBPF profiles are stored under by default.
pub const PROFILE_NAME: &str = "ebpf_cpu";

/// Writes every process profile through the pprof normalizer into a [`ProfileStore`], as
/// profile `name` (default `ebpf_cpu`, so its types read
/// `ebpf_cpu:samples:count:cpu:nanoseconds` and `ebpf_cpu:cpu:nanoseconds:cpu:nanoseconds`),
/// with the process labels and any extra ones.
#[derive(Debug, Clone)]
pub struct StoreSink {
    store: Arc<ProfileStore>,
    name: String,
    labels: Vec<(String, String)>,
}

impl StoreSink {
    /// A sink into `store`.
    pub fn new(store: Arc<ProfileStore>) -> Self {
        Self {
            store,
            name: PROFILE_NAME.into(),
            labels: Vec::new(),
        }
    }

    /// Stores under another profile name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Adds a label to every series (e.g. `node`).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((key.into(), value.into()));
        self
    }
}

impl Sink for StoreSink {
    fn write(&mut self, interval: Interval) -> Result<(), SinkError> {
        let mut failed = Vec::new();
        for p in interval.profiles {
            let mut labels = p.labels();
            labels.extend(self.labels.iter().cloned());
            let options = IngestOptions::default()
                .name(self.name.clone())
                .labels(labels)
                .delta(false)
                .timestamp_ms(interval.start_ms);
            let pid = p.pid;
            let stored = frostdb_pprof::validate(p.profile, self.store.limits())
                .and_then(|profile| self.store.ingest_profile(&profile, &options));
            if let Err(e) = stored {
                failed.push(format!("pid {pid}: {e}"));
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; ").into())
        }
    }
}
