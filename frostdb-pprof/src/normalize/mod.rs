//! A validated profile turned into sample rows, in the order a profile passes the files:
//!
//! 1. [`prepare`] (no lock): series and sample labels checked and sanitized, samples with the
//!    same stack and labels merged, deltas of cumulative types taken;
//! 2. [`keys`]: the content keys of its stacks, locations, functions and mappings (cheap
//!    hashes over what the profile holds), and its content fingerprint ([`crate::dedup`]);
//! 3. [`intern`] (the symbol writer held): the stacks that have a value, and the locations,
//!    functions, mappings and strings they use, looked up in the current symbol partition
//!    (by their keys, compared exactly) and added when new; each pprof string, function,
//!    location and mapping is looked up once per profile;
//! 4. [`rows`]: the sample rows appended to a group's [`SampleRows`], dictionary-encoded
//!    already, and built into one Arrow batch.
//!
//! The group commit ([`crate::store`]) then writes them, with the rows derived from them
//! (the series index and totals, `store/derived.rs`).

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayBuilder, ArrayRef, Int64Array, RecordBatch, StringDictionaryBuilder, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema as ArrowSchema};

use crate::decode::{Flat, SampleRef, ValidProfile};
use crate::error::{Error, Result};
use crate::schema::SERIES_BUCKET_MS;
use crate::schema::column::{
    DURATION, NAME, PERIOD, PERIOD_TYPE, PERIOD_UNIT, SAMPLE_TYPE, SAMPLE_UNIT, STACKTRACE_ID,
    TIMESTAMP, VALUE, label_column,
};
use crate::symbols::{FunctionRow, LineRow, MappingRow, StackKey, Writer, symbol_id};

/// Maps keyed by what a profile holds: foldhash, not SipHash (no untrusted key can cost more
/// than the profile's own size, which the limits bound).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

mod intern;
mod keys;
mod prepare;
mod rows;

pub(crate) use intern::InternState;
use keys::{Key, mapping_flags};
pub(crate) use keys::{content_key, function_key, location_line, location_start, put_str};
pub use prepare::MAX_FUTURE_MS;
pub(crate) use prepare::{Deltas, prepare};
pub(crate) use rows::SERIES_KEYS;
pub(crate) use rows::{Finished, SampleRows, Total, move_rows, order_runs};

/// How to store one profile: `IngestOptions::default().name("process_cpu").labels(..)`.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct IngestOptions {
    /// Profile name, the first part of its profile types (`process_cpu`, `memory`, ...).
    pub name: String,
    /// Series labels (target labels: job, instance, pod, ...), added to every sample.
    pub labels: Vec<(String, String)>,
    /// Store cumulative sample types (allocations, contentions, delay) as the difference
    /// from the previous profile of the same series, as Parca and Pyroscope do. The first
    /// profile of a series is kept as the baseline and stores nothing for those types.
    pub delta: bool,
    /// Timestamp (ms) to use instead of the profile's own `time_nanos`.
    pub timestamp_ms: Option<i64>,
}

impl IngestOptions {
    /// Sets [`Self::name`].
    pub fn name(mut self, value: impl Into<String>) -> Self {
        self.name = value.into();
        self
    }

    /// Sets [`Self::labels`].
    pub fn labels(mut self, value: Vec<(String, String)>) -> Self {
        self.labels = value;
        self
    }

    /// Sets [`Self::delta`].
    pub fn delta(mut self, value: bool) -> Self {
        self.delta = value;
        self
    }

    /// Sets [`Self::timestamp_ms`].
    pub fn timestamp_ms(mut self, value: impl Into<Option<i64>>) -> Self {
        self.timestamp_ms = value.into();
        self
    }
}

/// What storing a profile did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngestSummary {
    /// Sample rows written.
    pub rows: usize,
    /// Profile types written (`name:type:unit:period_type:period_unit`).
    pub profile_types: Vec<String>,
    /// Stacks new to the current symbol partition.
    pub new_stacks: usize,
    /// Timestamp of the profile (ms).
    pub timestamp_ms: i64,
    /// The profile was stored already (the same series, timestamp and samples: a client's
    /// retry, a file ingested twice), and nothing was written: `rows`, `new_stacks` and
    /// `profile_types` are then empty. See [`ProfileStore::ingest`](crate::ProfileStore::ingest).
    pub duplicate: bool,
}

/// Turns a label name into a Prometheus one: `[a-zA-Z_][a-zA-Z0-9_]*`, other characters
/// replaced by `_`.
pub fn sanitize_label(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// Sample types that count since the program started (Go allocs, mutex, block).
pub fn is_cumulative(sample_type: &str) -> bool {
    matches!(
        sample_type,
        "alloc_objects" | "alloc_space" | "contentions" | "delay"
    )
}

/// A stack's content fingerprint (with its sample labels), for deltas: independent of the
/// profile's own ids and of symbol partitions.
type Fingerprint = u128;

/// Distinct (stack, sample labels) of a profile.
struct Group {
    /// A pprof sample with this stack.
    sample: usize,
    /// Index into the label sets.
    labels: u32,
}

/// A profile ready to be interned: what no lock is needed for.
pub(crate) struct Prepared<'p> {
    profile: &'p ValidProfile,
    name: String,
    series: BTreeMap<String, String>,
    /// Sample label sets; 0 is the empty one.
    label_sets: Vec<Vec<(String, String)>>,
    groups: Vec<Group>,
    /// `(type, group, value)`, values non-zero, deltas taken.
    rows: Vec<(u16, u32, i64)>,
    /// Distinct (group, label set with span labels) of samples labelled with a span.
    span_groups: Vec<(u32, u32)>,
    /// `(type, span group, value)`, values non-zero, of types that are not cumulative.
    span_rows: Vec<(u16, u32, i64)>,
    /// Deltas' states to keep once the profile is stored.
    pub(crate) delta_states: Vec<(String, prepare::Baseline)>,
    timestamp: i64,
    /// Each group's stack content key.
    keys: Vec<StackKey>,
    /// Each location's content key, by position.
    location_keys: Vec<Key>,
    /// What tells the profile apart from every other (see [`Prepared::fingerprint`]).
    fingerprint: crate::dedup::ContentFingerprint,
}

fn text(p: &Flat, i: i64) -> &str {
    p.string(i)
}

fn or<'a>(v: &'a str, fallback: &'a str) -> &'a str {
    if v.is_empty() { fallback } else { v }
}

impl Prepared<'_> {
    /// The series the profile's rows belong to: a hash of the profile name and every label
    /// (request and pprof sample labels alike) per sample label set used, with that set's
    /// index (see [`Prepared::series_text`]). What a series limit counts.
    pub(crate) fn series(&self) -> Vec<(u64, usize)> {
        let mut used = vec![false; self.label_sets.len()];
        for &(_, g, _) in &self.rows {
            used[self.groups[g as usize].labels as usize] = true;
        }
        (0..self.label_sets.len())
            .filter(|&set| used[set])
            .map(|set| {
                let key = crate::limits::series_key(&self.name, self.labels_of(set).into_iter());
                (key, set)
            })
            .collect()
    }

    /// Every label name the profile's rows may store, repeated as often as it is given:
    /// the request's, and those of every sample label set (span labels included).
    pub(crate) fn label_names(&self) -> impl Iterator<Item = &str> {
        self.series.keys().map(String::as_str).chain(
            self.label_sets
                .iter()
                .flatten()
                .map(|(name, _)| name.as_str()),
        )
    }

    /// Checks every label set of the profile (request labels with each set of sample
    /// labels) against `limits`.
    pub(crate) fn check_labels(&self, limits: &crate::limits::LabelLimits) -> Result<()> {
        let series = self.series.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        for (set, labels) in self.label_sets.iter().enumerate() {
            limits.check(series.clone(), labels, || self.series_text(set))?;
        }
        Ok(())
    }

    /// Series label set `set` as text, `name{k="v",...}` (the first 8 labels, and how many
    /// more there are).
    pub(crate) fn series_text(&self, set: usize) -> String {
        crate::limits::series_text(&self.name, &self.labels_of(set))
    }

    /// Every label of a series: the request's and sample label set `set`'s, sorted.
    fn labels_of(&self, set: usize) -> Vec<(&str, &str)> {
        let mut labels: Vec<(&str, &str)> = self
            .series
            .iter()
            .chain(self.label_sets[set].iter().map(|(k, v)| (k, v)))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        labels.sort_unstable();
        labels
    }

    /// Adds the profile to `recorder`'s rules (once it is stored).
    pub(crate) fn record(&self, recorder: &crate::rules::Recorder) {
        recorder.observe(
            self.profile,
            &self.name,
            &self.series,
            &self.label_sets,
            |g| {
                let group = &self.groups[g as usize];
                (group.sample, group.labels, self.keys[g as usize])
            },
            &self.rows,
        );
    }

    /// Whether the profile stores nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The sample rows it stores.
    pub(crate) fn row_count(&self) -> usize {
        self.rows.len()
    }

    /// Its distinct (stack, sample labels), for tests that intern by hand.
    #[cfg(test)]
    pub(crate) fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// The profile's timestamp (ms).
    pub(crate) fn timestamp(&self) -> i64 {
        self.timestamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_become_prometheus_names() {
        assert_eq!(sanitize_label("span.id"), "span_id");
        assert_eq!(sanitize_label("thread name"), "thread_name");
        assert_eq!(sanitize_label("9lives"), "_9lives");
        assert_eq!(sanitize_label(""), "_");
        assert_eq!(sanitize_label("ok_1"), "ok_1");
    }
}
