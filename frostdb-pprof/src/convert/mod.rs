//! The other formats profiles arrive in, converted to pprof: [`folded`] stacks (and
//! "lines"), OpenTelemetry profiles ([`otlp`]), Grafana Pyroscope's push requests
//! ([`push`], pprof samples under series labels) and its legacy `/ingest` ([`legacy`]).
//! Each yields [`Incoming`] profiles; [`store`] stores a request's profiles whole or not at
//! all, under the series labels Pyroscope keeps ([`series_labels`]). A conversion that fails says where with
//! [`Error::Convert`](crate::Error::Convert) (the line or the field path) or, over a limit,
//! [`Error::TooLarge`](crate::Error::TooLarge); a profile within a request that fails the
//! pprof checks is [`Error::At`](crate::Error::At), naming it and keeping the check's kind.

pub mod folded;
pub mod gperftools;
pub mod jfr;
pub mod legacy;
pub mod otlp;
pub mod parca;
pub mod push;
pub mod speedscope;
pub mod trie;

use crate::{Error, IngestOptions, IngestSummary, ProfileStore, Result, ValidProfile};

/// A profile as a protocol delivers it: what [`store`] stores.
#[derive(Debug)]
pub struct Incoming {
    /// The profile, checked against the limits.
    pub profile: ValidProfile,
    /// The same process's earlier profile: cumulative types are stored as the difference
    /// (the legacy `/ingest`'s `prev_profile`).
    pub previous: Option<ValidProfile>,
    /// Profile name (`process_cpu`, `memory`, ...).
    pub name: String,
    /// Series labels, as sent ([`series_labels`] says which are stored).
    pub labels: Vec<(String, String)>,
    /// Store cumulative types as deltas between consecutive profiles of the series.
    pub delta: bool,
    /// When the profile was taken, if the request says (else the profile's `time_nanos`).
    pub timestamp_ms: Option<i64>,
    /// Where the profile is in its request (`series[0].samples[1] (process_cpu)`), for
    /// errors; empty for a request of one profile.
    pub at: String,
}

impl Incoming {
    /// How the store takes it: its name, the labels [`series_labels`] keeps, its time.
    pub fn options(&self) -> Result<IngestOptions> {
        if self.name.is_empty() {
            return Err(Error::Invalid {
                field: "profile name",
                reason: "the profile has no name".into(),
            });
        }
        Ok(IngestOptions::default()
            .name(self.name.clone())
            .labels(series_labels(&self.labels)?)
            .delta(self.delta)
            .timestamp_ms(self.timestamp_ms))
    }
}

impl From<push::Pushed> for Incoming {
    fn from(p: push::Pushed) -> Self {
        Self {
            profile: p.profile,
            previous: None,
            name: p.name,
            labels: p.labels,
            delta: p.delta,
            timestamp_ms: None,
            at: p.at,
        }
    }
}

impl From<otlp::Converted> for Incoming {
    fn from(c: otlp::Converted) -> Self {
        Self {
            profile: c.profile,
            previous: None,
            name: c.name,
            labels: c.labels,
            delta: false,
            timestamp_ms: None,
            at: c.at,
        }
    }
}

/// The bytes a copy of a series' `name` and `labels` takes (each label two strings of 24
/// bytes besides their text), which a converter giving every profile of a series its own
/// copy bounds and charges.
pub(crate) fn labels_bytes(name: &str, labels: &[(String, String)]) -> usize {
    name.len()
        + labels
            .iter()
            .map(|(k, v)| k.len() + v.len() + 48)
            .sum::<usize>()
}

/// The series labels stored of those a client sends, as Pyroscope keeps them: empty values
/// are absent; names beginning with `__` are Pyroscope's own (the profile name, its type,
/// `__delta__`) and dropped, except `__session_id__`; names are made column-safe
/// ([`crate::sanitize_label`]). Sorted by name; two labels of one name (after making names
/// safe) are an error.
pub fn series_labels(labels: &[(String, String)]) -> Result<Vec<(String, String)>> {
    let mut kept: Vec<(String, String)> = labels
        .iter()
        .filter(|(k, v)| !v.is_empty() && (!k.starts_with("__") || k == "__session_id__"))
        .map(|(k, v)| (crate::sanitize_label(k), v.clone()))
        .collect();
    kept.sort();
    if let Some(w) = kept.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::LabelCollision {
            label: w[0].0.clone(),
            first: format!("{:?}", w[0].1),
            second: format!("{:?} (label names are made column-safe)", w[1].1),
        });
    }
    Ok(kept)
}

/// Stores a request's profiles whole or not at all ([`ProfileStore::ingest_all`]), an
/// error naming the profile at fault. A profile with a [`Incoming::previous`] is stored as
/// [`ProfileStore::ingest_with_previous`] stores it; it comes alone, as the legacy
/// `/ingest` sends it.
pub fn store(store: &ProfileStore, incoming: &[Incoming]) -> Result<Vec<IngestSummary>> {
    let options = incoming
        .iter()
        .map(|i| i.options().map_err(|e| e.at(i.at.clone())))
        .collect::<Result<Vec<_>>>()?;
    if let [one] = incoming
        && let Some(previous) = &one.previous
    {
        let summary = store
            .ingest_with_previous(&one.profile, previous, &options[0])
            .map_err(|e| e.at(one.at.clone()))?;
        return Ok(vec![summary]);
    }
    if incoming.iter().any(|i| i.previous.is_some()) {
        return Err(Error::Query(
            "a profile with a previous profile is stored alone".into(),
        ));
    }
    let profiles: Vec<_> = incoming
        .iter()
        .zip(&options)
        .map(|(i, o)| (&i.profile, o))
        .collect();
    store.ingest_all_at(&profiles, |k| incoming[k].at.clone())
}

/// The profile name Pyroscope gives a pprof by its sample types (`process_cpu`, `memory`,
/// `goroutines`, `mutex`, `block`, `wall`, else its last sample type): the first part of the
/// profile types it is stored as, when its sender does not name it.
pub fn profile_name(p: &ValidProfile) -> String {
    let types: Vec<&str> = p
        .sample_types()
        .iter()
        .map(|t| p.string(t.r#type))
        .collect();
    // Pyroscope's rules (`metricName` of its pprof ingestion): a `wall` type makes the whole
    // profile `wall` (Node's wall profile with CPU time is `wall:cpu:…` too); else the first
    // type that names a kind.
    if types.contains(&"wall") {
        return "wall".to_owned();
    }
    for t in &types {
        let name = if t.contains("cpu") {
            "process_cpu"
        } else if t.contains("alloc_") || t.contains("inuse_") || *t == "space" || *t == "objects" {
            "memory"
        } else if t.contains("mutex_") || *t == "contentions" || *t == "delay" {
            "mutex"
        } else if t.contains("block_") {
            "block"
        } else if t.starts_with("goroutine") {
            "goroutines"
        } else {
            continue;
        };
        return name.to_owned();
    }
    let period = p.period_type().map(|t| p.string(t.r#type)).unwrap_or("");
    match period {
        "cpu" => "process_cpu".to_owned(),
        _ => types.last().copied().unwrap_or("unknown").to_owned(),
    }
}
