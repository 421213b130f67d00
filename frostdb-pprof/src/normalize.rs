//! A validated profile turned into sample rows, in three steps:
//!
//! 1. [`prepare`] (no lock): series and sample labels checked and sanitized, samples with the
//!    same stack and labels merged, deltas of cumulative types taken;
//! 2. [`Prepared::intern`] (the symbol writer held): the stacks that have a value, and the
//!    locations, functions, mappings and strings they use, looked up in the current symbol
//!    partition (cheap hashes over what the profile holds, compared exactly) and added when
//!    new; each pprof string, function, location and mapping is looked up once per profile;
//! 3. [`Prepared::samples`]: the rows as one Arrow batch, dictionary-encoded already.

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

/// The previous values of the cumulative series seen, for deltas.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    previous: HashMap<String, HashMap<Fingerprint, i64>>,
}

impl Deltas {
    /// Keeps the states a stored profile left.
    pub(crate) fn apply(&mut self, states: Vec<(String, HashMap<Fingerprint, i64>)>) {
        self.previous.extend(states);
    }

    /// The states kept, to apply to others.
    pub(crate) fn into_states(self) -> Vec<(String, HashMap<Fingerprint, i64>)> {
        self.previous.into_iter().collect()
    }
}

/// A profile's timestamp in ms: `time_nanos`, repaired when a writer put microseconds in
/// it (old pyroscope-rs), or now when absent.
fn timestamp_ms(time_nanos: i64) -> i64 {
    const YEAR_2000_NS: i64 = 946_684_800_000_000_000;
    const YEAR_2000_US: i64 = YEAR_2000_NS / 1000;
    match time_nanos {
        t if t <= 0 => frostdb_core::now_ms(),
        t if t >= YEAR_2000_NS => t / 1_000_000,
        t if t >= YEAR_2000_US => t / 1000,
        t => t / 1_000_000,
    }
}

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
    pub(crate) delta_states: Vec<(String, HashMap<Fingerprint, i64>)>,
    timestamp: i64,
    /// Each group's stack content key.
    keys: Vec<StackKey>,
    /// Each location's content key, by position.
    location_keys: Vec<Key>,
    /// What tells the profile apart from every other (see [`Prepared::fingerprint`]).
    fingerprint: crate::dedup::ContentFingerprint,
}

/// What [`Prepared::intern`] has found so far in one partition: the partition's index of
/// each of the profile's strings, mappings, functions and locations, and of each group's
/// stack (`u32::MAX` where not yet known).
#[derive(Debug, Default)]
pub(crate) struct InternState {
    partition: Option<u32>,
    strings: Vec<u32>,
    mappings: Vec<u32>,
    functions: Vec<u32>,
    locations: Vec<u32>,
    stacks: Vec<u32>,
}

fn text(p: &Flat, i: i64) -> &str {
    p.string(i)
}

fn or<'a>(v: &'a str, fallback: &'a str) -> &'a str {
    if v.is_empty() { fallback } else { v }
}

/// Step 1: labels, merged samples, deltas (of cumulative types, from the first of `deltas`
/// that holds the series' previous values).
pub(crate) fn prepare<'p>(
    profile: &'p ValidProfile,
    options: &IngestOptions,
    deltas: &[&Deltas],
) -> Result<Prepared<'p>> {
    let p = profile.flat();
    // Every part of the profile types written must be selectable afterwards.
    let part = |field: &'static str, value: &str| {
        frostdb_profile::ProfileType::check_part(value).map_err(|reason| Error::Invalid {
            field,
            reason: format!("cannot be part of a profile type: {reason}"),
        })
    };
    part(NAME, &options.name)?;
    for t in &p.sample_type {
        part("sample_type.type", or(text(p, t.r#type), "samples"))?;
        part("sample_type.unit", or(text(p, t.unit), "count"))?;
    }
    if let Some(t) = &p.period_type {
        part("period_type.type", or(text(p, t.r#type), "unknown"))?;
        part("period_type.unit", or(text(p, t.unit), "unknown"))?;
    }
    // Series labels, sanitized; empty values mean "absent", as in Prometheus.
    let mut series: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in &options.labels {
        if v.is_empty() {
            continue;
        }
        let key = sanitize_label(k);
        if let Some(old) = series.insert(key.clone(), v.clone())
            && old != *v
        {
            return Err(Error::LabelCollision {
                label: key,
                first: old,
                second: v.clone(),
            });
        }
    }

    // Samples merged by (stack, sample labels).
    let mut label_sets: Vec<Vec<(String, String)>> = vec![Vec::new()];
    let mut label_index: HashMap<Vec<(String, String)>, u32> = HashMap::default();
    let mut group_index: HashMap<(&[u64], u32), u32> =
        HashMap::with_capacity_and_hasher(p.samples().len(), Default::default());
    let mut groups: Vec<Group> = Vec::with_capacity(p.samples().len());
    let types = p.sample_type.len();
    let mut values: Vec<i64> = Vec::with_capacity(p.samples().len() * types);
    let mut span_index: HashMap<(u32, u32), u32> = HashMap::default();
    let mut span_groups: Vec<(u32, u32)> = Vec::new();
    let mut span_values: Vec<i64> = Vec::new();
    let mut intern = |set: Vec<(String, String)>| -> u32 {
        if set.is_empty() {
            0
        } else if let Some(&i) = label_index.get(&set) {
            i
        } else {
            let i = label_sets.len() as u32;
            label_index.insert(set.clone(), i);
            label_sets.push(set);
            i
        }
    };
    for (i, sample) in p.samples().enumerate() {
        let (labels, with_span) = if sample.label.iter().all(|l| l.str == 0) {
            (0, None) // numeric labels are not kept
        } else {
            let set = sample_labels(p, sample, &series)?;
            if set.iter().any(|(k, _)| is_span_label(k)) {
                let series_only = set
                    .iter()
                    .filter(|(k, _)| !is_span_label(k))
                    .cloned()
                    .collect();
                (intern(series_only), Some(intern(set)))
            } else {
                (intern(set), None)
            }
        };
        let g = *group_index
            .entry((sample.location_id, labels))
            .or_insert_with(|| {
                groups.push(Group { sample: i, labels });
                values.extend(std::iter::repeat_n(0, types));
                (groups.len() - 1) as u32
            });
        add(&mut values, g, types, sample.value);
        if let Some(full) = with_span {
            let sg = *span_index.entry((g, full)).or_insert_with(|| {
                span_groups.push((g, full));
                span_values.extend(std::iter::repeat_n(0, types));
                (span_groups.len() - 1) as u32
            });
            add(&mut span_values, sg, types, sample.value);
        }
    }

    let timestamp = options
        .timestamp_ms
        .unwrap_or_else(|| timestamp_ms(p.time_nanos));
    let mut prepared = Prepared {
        profile,
        name: options.name.clone(),
        series,
        label_sets,
        groups,
        rows: Vec::new(),
        span_groups,
        span_rows: Vec::new(),
        delta_states: Vec::new(),
        timestamp,
        keys: Vec::new(),
        location_keys: Vec::new(),
        fingerprint: 0,
    };

    // Deltas of cumulative types; the first profile of a series is their baseline.
    let cumulative = |t: usize| is_cumulative(or(text(p, p.sample_type[t].r#type), "samples"));
    (prepared.keys, prepared.location_keys) = prepared.stack_keys()?;
    prepared.fingerprint = prepared.content_fingerprint(&values, &span_values, options.delta);
    let fingerprints: Option<Vec<Fingerprint>> =
        (options.delta && (0..types).any(cumulative)).then(|| prepared.fingerprints());
    for t in 0..types {
        // Span rows: values as sampled, of the types that are not cumulative (a span's
        // share of a cumulative counter has no meaning).
        if !cumulative(t) {
            prepared.span_rows.extend(
                (0..prepared.span_groups.len())
                    .map(|sg| (t as u16, sg as u32, span_values[sg * types + t]))
                    .filter(|r| r.2 != 0),
            );
        }
        let column = prepared
            .groups
            .iter()
            .enumerate()
            .map(|(g, _)| (g as u32, values[g * types + t]));
        match (&fingerprints, cumulative(t)) {
            (Some(fps), true) => {
                let vt = &p.sample_type[t];
                let key = format!(
                    "{}\u{0}{:?}\u{0}{}\u{0}{}",
                    options.name,
                    prepared.series,
                    text(p, vt.r#type),
                    text(p, vt.unit)
                );
                let current: HashMap<Fingerprint, i64> =
                    column.clone().map(|(g, v)| (fps[g as usize], v)).collect();
                let previous = deltas.iter().find_map(|d| d.previous.get(&key));
                if let Some(previous) = previous {
                    for (g, v) in column {
                        let before = previous.get(&fps[g as usize]).copied().unwrap_or(0);
                        // A counter that went down was reset (the process restarted).
                        let delta = if v >= before { v - before } else { v };
                        if delta != 0 {
                            prepared.rows.push((t as u16, g, delta));
                        }
                    }
                }
                prepared.delta_states.push((key, current));
            }
            _ => prepared.rows.extend(
                column
                    .filter(|(_, v)| *v != 0)
                    .map(|(g, v)| (t as u16, g, v)),
            ),
        }
    }
    Ok(prepared)
}

/// A mapping's has_functions, has_filenames, has_line_numbers and has_inline_frames as bits
/// 0 to 3.
fn mapping_flags(m: &crate::proto::Mapping) -> u8 {
    u8::from(m.has_functions)
        | (u8::from(m.has_filenames) << 1)
        | (u8::from(m.has_line_numbers) << 2)
        | (u8::from(m.has_inline_frames) << 3)
}

/// Appends `s` to `buf`, length first, so that consecutive strings cannot run together.
fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn content_key(buf: &[u8]) -> StackKey {
    twox_hash::XxHash3_128::oneshot(buf)
}

/// A [`StackKey`] in two words: half the room of a `u128` (which is aligned to 16 bytes),
/// and room that needs no aligned allocation.
#[derive(Debug, Clone, Copy, Default)]
struct Key([u64; 2]);

impl Key {
    fn of(key: StackKey) -> Self {
        Self([key as u64, (key >> 64) as u64])
    }

    fn get(self) -> StackKey {
        u128::from(self.0[0]) | (u128::from(self.0[1]) << 64)
    }
}

/// What [`Prepared::stack_keys`] works in, kept per thread from one profile to the next:
/// the keys of a profile's functions and mappings by position, and the bytes being hashed.
/// (The locations' keys are the profile's: intern reads them later.)
#[derive(Default)]
struct KeyScratch {
    functions: Vec<Key>,
    mappings: Vec<Key>,
    buf: Vec<u8>,
    location: Vec<u8>,
    stack: Vec<u8>,
}

thread_local! {
    static KEY_SCRATCH: std::cell::RefCell<KeyScratch> = std::cell::RefCell::default();
}

/// Adds a sample's `values` (one per type) to row `row` of `table` (`types` per row).
fn add(table: &mut [i64], row: u32, types: usize, values: &[i64]) {
    let row = &mut table[row as usize * types..(row as usize + 1) * types];
    for (acc, v) in row.iter_mut().zip(values) {
        *acc = acc.saturating_add(*v);
    }
}

/// Whether a (sanitized) sample label names a span or trace rather than a series.
fn is_span_label(key: &str) -> bool {
    crate::schema::SPAN_LABELS.contains(&key)
}

/// A sample's string labels, sanitized and sorted, without those equal to a series label.
fn sample_labels(
    p: &Flat,
    sample: SampleRef<'_>,
    series: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>> {
    let mut labels: BTreeMap<String, (String, &str)> = BTreeMap::new();
    for l in sample.label {
        if l.str == 0 {
            continue;
        }
        let (raw, value) = (text(p, l.key), text(p, l.str));
        let key = sanitize_label(raw);
        if let Some(v) = series.get(&key) {
            if v != value {
                return Err(Error::LabelCollision {
                    label: key,
                    first: format!("series label value {v:?}"),
                    second: format!("pprof label value {value:?}"),
                });
            }
            continue;
        }
        if let Some((_, other)) = labels.insert(key.clone(), (value.to_owned(), raw))
            && other != raw
        {
            return Err(Error::LabelCollision {
                label: key,
                first: format!("pprof label {other:?}"),
                second: format!("pprof label {raw:?}"),
            });
        }
    }
    Ok(labels.into_iter().map(|(k, (v, _))| (k, v)).collect())
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
        const SHOWN: usize = 8;
        let labels = self.labels_of(set);
        let mut text = labels
            .iter()
            .take(SHOWN)
            .map(|(k, v)| {
                format!(
                    "{}={:?}",
                    crate::limits::shortened(k),
                    crate::limits::shortened(v)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        if labels.len() > SHOWN {
            text.push_str(&format!(",… {} labels in all", labels.len()));
        }
        format!("{}{{{text}}}", self.name)
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

    /// Whether the profile stores nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The profile's content fingerprint ([`crate::dedup`]): a 128-bit hash of what its
    /// rows hold, equal for two profiles exactly when (up to hash collisions) they would
    /// store the same rows. The profile name, series labels, timestamp, period type and
    /// unit, period, duration and sample types, whether deltas are taken, and the merged
    /// samples (per stack content key and sample label set, its value of each type, as
    /// sampled: before deltas), those labelled with spans apart.
    ///
    /// The samples are hashed one by one and the hashes added up: the order of a profile's
    /// samples does not matter (a profile encoded again, its samples in another order, is
    /// the same profile), and hashing takes one pass, no sort.
    pub(crate) fn fingerprint(&self) -> crate::dedup::ContentFingerprint {
        self.fingerprint
    }

    /// Computes [`Prepared::fingerprint`] from the merged values of the groups
    /// (`values`) and of the span groups (`span_values`), `types` a group.
    fn content_fingerprint(&self, values: &[i64], span_values: &[i64], delta: bool) -> u128 {
        let p = self.profile.flat();
        let types = p.sample_type.len();
        let mut buf: Vec<u8> = Vec::new();
        let set_keys: Vec<u128> = self
            .label_sets
            .iter()
            .map(|set| {
                buf.clear();
                for (k, v) in set {
                    put_str(&mut buf, k);
                    put_str(&mut buf, v);
                }
                content_key(&buf)
            })
            .collect();
        // Per sample (a group, or a span group), a hash of its stack, label set and values;
        // their wrapping sum, and their count.
        let mut sample = |kind: u8, stack: StackKey, set: u32, values: &[i64]| -> Option<u128> {
            if values.iter().all(|&v| v == 0) {
                return None; // nothing of it is stored
            }
            buf.clear();
            buf.push(kind);
            buf.extend_from_slice(&stack.to_le_bytes());
            buf.extend_from_slice(&set_keys[set as usize].to_le_bytes());
            for v in values {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            Some(content_key(&buf))
        };
        let (mut sum, mut count) = (0u128, 0u64);
        for (g, (group, &stack)) in self.groups.iter().zip(&self.keys).enumerate() {
            let row = &values[g * types..(g + 1) * types];
            if let Some(h) = sample(0, stack, group.labels, row) {
                sum = sum.wrapping_add(h);
                count += 1;
            }
        }
        for (sg, &(g, set)) in self.span_groups.iter().enumerate() {
            let row = &span_values[sg * types..(sg + 1) * types];
            if let Some(h) = sample(1, self.keys[g as usize], set, row) {
                sum = sum.wrapping_add(h);
                count += 1;
            }
        }
        buf.clear();
        put_str(&mut buf, &self.name);
        buf.extend_from_slice(&(self.series.len() as u64).to_le_bytes());
        for (k, v) in &self.series {
            put_str(&mut buf, k);
            put_str(&mut buf, v);
        }
        buf.extend_from_slice(&self.timestamp.to_le_bytes());
        buf.push(u8::from(delta));
        let (period_type, period_unit) = p
            .period_type
            .as_ref()
            .map_or(("", ""), |t| (text(p, t.r#type), text(p, t.unit)));
        put_str(&mut buf, period_type);
        put_str(&mut buf, period_unit);
        buf.extend_from_slice(&p.period.to_le_bytes());
        buf.extend_from_slice(&p.duration_nanos.to_le_bytes());
        buf.extend_from_slice(&(types as u64).to_le_bytes());
        for t in &p.sample_type {
            put_str(&mut buf, text(p, t.r#type));
            put_str(&mut buf, text(p, t.unit));
        }
        buf.extend_from_slice(&sum.to_le_bytes());
        buf.extend_from_slice(&count.to_le_bytes());
        content_key(&buf)
    }

    /// Content fingerprints of the groups: their stacks' keys and their labels.
    fn fingerprints(&self) -> Vec<Fingerprint> {
        let mut buf = Vec::new();
        self.groups
            .iter()
            .zip(&self.keys)
            .map(|(g, key)| {
                buf.clear();
                buf.extend_from_slice(&key.to_le_bytes());
                for (k, v) in &self.label_sets[g.labels as usize] {
                    put_str(&mut buf, k);
                    put_str(&mut buf, v);
                }
                content_key(&buf)
            })
            .collect()
    }

    /// The content key of each group's stack: a 128-bit hash
    /// of every field the symbol tables store for its frames (each location's mapping,
    /// address, folding and lines, each line's function and number, each function's
    /// strings and start line), so equal stacks have equal keys whatever ids and string
    /// indices their profiles gave them. Functions, mappings and locations are hashed once
    /// per profile; a stack's key hashes its locations' keys.
    ///
    /// The store finds a known stack by its key alone. Two different stacks of one
    /// partition sharing a key (odds about n²/2¹²⁹ for n stacks) would be stored as one.
    fn stack_keys(&self) -> Result<(Vec<StackKey>, Vec<Key>)> {
        KEY_SCRATCH.with_borrow_mut(|scratch| {
            let keys = self.stack_keys_in(scratch);
            // A thread keeps room for a usual profile (up to 8,192 functions, under 200 KiB),
            // not for the largest it met.
            if scratch.functions.capacity() > 1 << 13 {
                *scratch = KeyScratch::default();
            }
            keys
        })
    }

    /// The stacks' keys, and the locations' by position (the profile's, for intern).
    fn stack_keys_in(&self, scratch: &mut KeyScratch) -> Result<(Vec<StackKey>, Vec<Key>)> {
        let p = self.profile.flat();
        let ids = &self.profile.ids;
        let KeyScratch {
            functions: function_keys,
            mappings: mapping_keys,
            buf,
            location,
            stack,
        } = scratch;
        // Every function, mapping and location is hashed once, in the order the profile
        // holds them: each pass reads its array and the strings front to back, and a stack
        // is then its locations' keys.
        function_keys.clear();
        for function in &p.function {
            buf.clear();
            put_str(buf, text(p, function.name));
            put_str(buf, text(p, function.system_name));
            put_str(buf, text(p, function.filename));
            buf.extend_from_slice(&function.start_line.to_le_bytes());
            function_keys.push(Key::of(content_key(buf)));
        }
        mapping_keys.clear();
        for m in &p.mapping {
            buf.clear();
            buf.extend_from_slice(&m.memory_start.to_le_bytes());
            buf.extend_from_slice(&m.memory_limit.to_le_bytes());
            buf.extend_from_slice(&m.file_offset.to_le_bytes());
            put_str(buf, text(p, m.filename));
            put_str(buf, text(p, m.build_id));
            buf.push(mapping_flags(m));
            // Never 0, the key of "no mapping".
            mapping_keys.push(Key::of(content_key(buf) | 1));
        }
        let mut location_keys = Vec::with_capacity(p.locations().len());
        for l in p.locations() {
            let mapping = if l.mapping_id == 0 {
                0
            } else {
                mapping_keys[ids.mapping(l.mapping_id)?].get()
            };
            location.clear();
            location.extend_from_slice(&mapping.to_le_bytes());
            location.extend_from_slice(&l.address.to_le_bytes());
            location.push(u8::from(l.is_folded));
            for line in l.line {
                let f = function_keys[ids.function(line.function_id)?].get();
                location.extend_from_slice(&f.to_le_bytes());
                location.extend_from_slice(&line.line.to_le_bytes());
            }
            location_keys.push(Key::of(content_key(location)));
        }
        let mut keys = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            stack.clear();
            for &id in p.sample(group.sample).location_id {
                stack.extend_from_slice(&location_keys[ids.location(id)?].get().to_le_bytes());
            }
            keys.push(content_key(stack));
        }
        Ok((keys, location_keys))
    }

    /// Step 2: the stack of every group that has a row, interned into the writer's
    /// partition (`u32::MAX` for groups without rows); `None` when the profile has symbols
    /// the partition lacks and the writer only looks up. What was found is kept in `state`:
    /// called again with an exclusive writer of the same partition, only the symbols still
    /// missing are looked up and added, so the exclusive hold is short.
    pub(crate) fn intern(
        &self,
        writer: &mut Writer<'_>,
        state: &mut InternState,
    ) -> Result<Option<Vec<u32>>> {
        let p = self.profile.flat();
        let ids = &self.profile.ids;
        const NONE: u32 = u32::MAX;
        let partition = writer.partition_id();
        if state.partition != Some(partition) {
            *state = InternState {
                partition: Some(partition),
                strings: vec![NONE; p.strings_len()],
                mappings: vec![NONE; p.mapping.len()],
                functions: vec![NONE; p.function.len()],
                locations: vec![NONE; p.locations().len()],
                stacks: vec![NONE; self.groups.len()],
            };
        }
        let InternState {
            strings,
            mappings: mapping_ix,
            functions: function_ix,
            locations: location_ix,
            stacks: out,
            ..
        } = state;
        let mut string = |writer: &mut Writer<'_>, i: i64| -> Result<Option<u32>> {
            let slot = strings
                .get_mut(i as usize)
                .ok_or_else(|| Error::Corrupt("a string index out of range".into()))?;
            if *slot == NONE {
                match writer.string(text(p, i))? {
                    Some(id) => *slot = id,
                    None => return Ok(None),
                }
            }
            Ok(Some(*slot))
        };
        // A symbol the writer lacks and may not add: the group's stack waits for an
        // exclusive writer, and the other groups are still looked up.
        let mut missing = false;
        macro_rules! known {
            ($next:lifetime, $lookup:expr) => {
                match $lookup? {
                    Some(id) => id,
                    None => {
                        missing = true;
                        continue $next;
                    }
                }
            };
        }
        let mut lines: Vec<LineRow> = Vec::new();
        let mut stack: Vec<u32> = Vec::new();
        'groups: for &(_, g, _) in &self.rows {
            if out[g as usize] != NONE {
                continue;
            }
            // A stack the partition has is found by its key: its frames are not looked up.
            if let Some(i) = writer.find_stack(self.keys[g as usize]) {
                out[g as usize] = i;
                continue;
            }
            stack.clear();
            for &id in p.sample(self.groups[g as usize].sample).location_id {
                let li = ids.location(id)?;
                if location_ix[li] == NONE
                    && let Some(i) = writer.find_location(self.location_keys[li].get())
                {
                    location_ix[li] = i;
                }
                if location_ix[li] == NONE {
                    let l = p.location(li);
                    let mapping = if l.mapping_id == 0 {
                        0
                    } else {
                        let mi = ids.mapping(l.mapping_id)?;
                        if mapping_ix[mi] == NONE {
                            let m = &p.mapping[mi];
                            let row = MappingRow {
                                memory_start: m.memory_start,
                                memory_limit: m.memory_limit,
                                file_offset: m.file_offset,
                                filename: known!('groups, string(writer, m.filename)),
                                build_id: known!('groups, string(writer, m.build_id)),
                                flags: mapping_flags(m),
                            };
                            mapping_ix[mi] = known!('groups, writer.mapping(row));
                        }
                        mapping_ix[mi] + 1
                    };
                    lines.clear();
                    for line in l.line {
                        let fi = ids.function(line.function_id)?;
                        if function_ix[fi] == NONE {
                            let f = &p.function[fi];
                            let row = FunctionRow {
                                name: known!('groups, string(writer, f.name)),
                                system_name: known!('groups, string(writer, f.system_name)),
                                filename: known!('groups, string(writer, f.filename)),
                                start_line: f.start_line,
                            };
                            function_ix[fi] = known!('groups, writer.function(row));
                        }
                        lines.push((function_ix[fi], line.line));
                    }
                    location_ix[li] = known!(
                        'groups,
                        writer.location(
                            self.location_keys[li].get(),
                            mapping,
                            l.address,
                            l.is_folded,
                            &lines
                        )
                    );
                }
                stack.push(location_ix[li]);
            }
            out[g as usize] = known!('groups, writer.stack(self.keys[g as usize], &stack));
        }
        // Once whole, the stacks are the caller's; the state is not read again.
        Ok((!missing).then(|| std::mem::take(out)))
    }

    /// Step 3: the sample rows, with the stacks interned into `partition`, appended to
    /// `out` (which may hold other profiles' rows).
    pub(crate) fn append_samples(
        &self,
        partition: u32,
        stacks: &[u32],
        out: &mut SampleRows,
    ) -> Result<IngestSummary> {
        self.append(partition, &self.rows, out, true, |g| {
            (self.groups[g as usize].labels as usize, stacks[g as usize])
        })
    }

    /// The rows of samples labelled with a span (see [`crate::schema::SPANS`]), appended
    /// to `out` as [`Prepared::append_samples`] does.
    pub(crate) fn append_spans(
        &self,
        partition: u32,
        stacks: &[u32],
        out: &mut SampleRows,
    ) -> Result<()> {
        if self.span_rows.is_empty() {
            return Ok(());
        }
        self.append(partition, &self.span_rows, out, false, |sg| {
            let (g, labels) = self.span_groups[sg as usize];
            (labels as usize, stacks[g as usize])
        })
        .map(|_| ())
    }

    /// Appends `rows` (`(type, group, value)`, type by type); `group` gives a row group's
    /// label set and interned stack. With `index`, the rows that stand for series index rows
    /// are noted in `out.series`, and the totals of each type and label set in `out.totals`.
    fn append(
        &self,
        partition: u32,
        rows: &[(u16, u32, i64)],
        out: &mut SampleRows,
        index: bool,
        group: impl Fn(u32) -> (usize, u32),
    ) -> Result<IngestSummary> {
        let p = self.profile.flat();
        let n = rows.len();
        let start = out.len();
        let sample_type = |t: u16| or(text(p, p.sample_type[t as usize].r#type), "samples");
        let sample_unit = |t: u16| or(text(p, p.sample_type[t as usize].unit), "count");
        let (period_type, period_unit) = p
            .period_type
            .as_ref()
            .map_or(("", ""), |t| (text(p, t.r#type), text(p, t.unit)));
        let (period_type, period_unit) = (or(period_type, "unknown"), or(period_unit, "unknown"));

        out.constant(NAME, &self.name, start, n)?;
        out.constant(PERIOD_TYPE, period_type, start, n)?;
        out.constant(PERIOD_UNIT, period_unit, start, n)?;
        for (k, v) in &self.series {
            out.constant(&label_column(k), v, start, n)?;
        }
        // Rows come type by type, in type order (see `prepare`): one run per type used.
        let mut used: Vec<u16> = Vec::new();
        let mut at = start;
        let hour = self.timestamp.div_euclid(SERIES_BUCKET_MS) * SERIES_BUCKET_MS;
        let mut sets: Vec<usize> = Vec::new();
        for run in rows.chunk_by(|a, b| a.0 == b.0) {
            let t = run[0].0;
            out.constant(SAMPLE_TYPE, sample_type(t), at, run.len())?;
            out.constant(SAMPLE_UNIT, sample_unit(t), at, run.len())?;
            // The series index: a row per distinct label set of the run, keyed by what
            // makes its index row; and the run's totals, a first row and a sum per label set.
            if index {
                sets.clear();
                let totals = out.totals.len();
                for (i, r) in run.iter().enumerate() {
                    let set = group(r.1).0;
                    let k = match sets.iter().position(|&s| s == set) {
                        Some(k) => k,
                        None => {
                            sets.push(set);
                            let key = SERIES_KEYS.hash_one((
                                (&self.name, sample_type(t), sample_unit(t)),
                                (period_type, period_unit, &self.series),
                                (&self.label_sets[set], hour),
                            ));
                            out.series.push((key, (at + i) as u32));
                            out.totals.push(((at + i) as u32, 0));
                            sets.len() - 1
                        }
                    };
                    let sum = &mut out.totals[totals + k].1;
                    *sum = sum.saturating_add(r.2);
                }
            }
            used.push(t);
            at += run.len();
        }
        // Sample labels: one column per key any row has, null where a row lacks it.
        if self.label_sets.len() > 1 {
            let columns: Vec<Vec<String>> = self
                .label_sets
                .iter()
                .map(|set| set.iter().map(|(k, _)| label_column(k)).collect())
                .collect();
            for (i, r) in rows.iter().enumerate() {
                let set = group(r.1).0;
                for (column, (_, v)) in columns[set].iter().zip(&self.label_sets[set]) {
                    out.constant(column, v, start + i, 1)?;
                }
            }
        }
        out.stacktrace_id
            .extend(rows.iter().map(|r| symbol_id(partition, group(r.1).1)));
        out.value.extend(rows.iter().map(|r| r.2));
        out.timestamp.extend(std::iter::repeat_n(self.timestamp, n));
        out.duration
            .extend(std::iter::repeat_n(p.duration_nanos, n));
        out.period.extend(std::iter::repeat_n(p.period, n));
        out.profiles += 1;
        Ok(IngestSummary {
            rows: n,
            profile_types: used
                .iter()
                .map(|&t| {
                    format!(
                        "{}:{}:{}:{period_type}:{period_unit}",
                        self.name,
                        sample_type(t),
                        sample_unit(t)
                    )
                })
                .collect(),
            new_stacks: 0,
            timestamp_ms: self.timestamp,
            duplicate: false,
        })
    }

    /// The profile's timestamp (ms).
    pub(crate) fn timestamp(&self) -> i64 {
        self.timestamp
    }
}

/// Hashes the series index's keys: fixed, so equal rows of different groups have equal keys.
static SERIES_KEYS: foldhash::fast::FixedState = foldhash::fast::FixedState::with_seed(0x5e71e5);

/// Sample rows of one or more profiles, built into one batch of the samples table: string
/// columns dictionary-encoded as they are appended, a column a profile lacks null in its
/// rows.
#[derive(Default)]
pub(crate) struct SampleRows {
    profiles: usize,
    /// Rows that stand for a series index row: `(key, row)`, the key a hash of the index
    /// row's contents.
    pub(crate) series: Vec<(u64, u32)>,
    /// Per profile, type and label set, in row order: its first row and the sum of its
    /// rows' values (see [`totals_from`]).
    pub(crate) totals: Vec<(u32, i64)>,
    strings: BTreeMap<String, StringDictionaryBuilder<Int32Type>>,
    stacktrace_id: Vec<u64>,
    timestamp: Vec<i64>,
    duration: Vec<i64>,
    period: Vec<i64>,
    value: Vec<i64>,
}

impl std::fmt::Debug for SampleRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleRows")
            .field("rows", &self.len())
            .field("profiles", &self.profiles)
            .finish_non_exhaustive()
    }
}

impl SampleRows {
    /// Rows held.
    pub(crate) fn len(&self) -> usize {
        self.value.len()
    }

    /// Profiles whose rows are held.
    pub(crate) fn profiles(&self) -> usize {
        self.profiles
    }

    /// Sets column `name` to `value` in rows `at..at + n`, nulls before them where unset.
    fn constant(&mut self, name: &str, value: &str, at: usize, n: usize) -> Result<()> {
        let b = match self.strings.get_mut(name) {
            Some(b) => b,
            None => self.strings.entry(name.to_owned()).or_default(),
        };
        if b.len() < at {
            b.append_nulls(at - b.len());
        }
        b.append_n(value, n)?;
        Ok(())
    }

    /// The rows as one batch.
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let len = self.len();
        let mut fields = Vec::with_capacity(self.strings.len() + 5);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.strings.len() + 5);
        for (name, mut b) in self.strings {
            if b.len() < len {
                b.append_nulls(len - b.len());
            }
            let array = b.finish();
            fields.push(Field::new(name, array.data_type().clone(), true));
            columns.push(Arc::new(array));
        }
        fields.push(Field::new(STACKTRACE_ID, DataType::UInt64, false));
        columns.push(Arc::new(UInt64Array::from(self.stacktrace_id)));
        for (name, v) in [
            (TIMESTAMP, self.timestamp),
            (DURATION, self.duration),
            (PERIOD, self.period),
            (VALUE, self.value),
        ] {
            fields.push(Field::new(name, DataType::Int64, false));
            columns.push(Arc::new(Int64Array::from(v)));
        }
        Ok(RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            columns,
        )?)
    }
}

/// Rows `rows` of a samples batch as series index rows: the profile type and label columns,
/// and the start of the hour of their timestamp.
pub(crate) fn series_rows(samples: &RecordBatch, rows: &[u32]) -> Result<RecordBatch> {
    let indices = arrow::array::UInt32Array::from(rows.to_vec());
    let schema = samples.schema();
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in schema.fields().iter().zip(samples.columns()) {
        let name = field.name().as_str();
        if !crate::schema::is_series_column(name) {
            continue;
        }
        let mut taken = arrow::compute::take(column, &indices, None)?;
        if name == TIMESTAMP {
            let hours: Int64Array = taken
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| Error::Corrupt("sample timestamps are not Int64".into()))?
                .unary(|t| t.div_euclid(SERIES_BUCKET_MS) * SERIES_BUCKET_MS);
            taken = Arc::new(hours);
        }
        fields.push(field.as_ref().clone());
        columns.push(taken);
    }
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns,
    )?)
}

/// The [`crate::schema::totals`] rows of sample rows: one per series and timestamp (a
/// profile's rows of one type and label set), its `value` their sum, its other columns its
/// first row's.
pub(crate) fn totals_rows(samples: &RecordBatch) -> Result<RecordBatch> {
    let values = samples
        .column_by_name(VALUE)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| Error::Corrupt("sample rows without Int64 values".into()))?;
    let rows: Vec<(u32, Option<i64>)> = (0..samples.num_rows())
        .map(|i| (i as u32, values.is_valid(i).then(|| values.value(i))))
        .collect();
    totals_of(samples, &rows)
}

/// The rows [`totals_rows`] makes of `samples`, from `sums`: what [`SampleRows`] noted while
/// appending them (per profile, type and label set, its first row and its values' sum, in
/// row order). Only those rows' series columns are compared, not every row's.
pub(crate) fn totals_from(samples: &RecordBatch, sums: &[(u32, i64)]) -> Result<RecordBatch> {
    let rows: Vec<(u32, Option<i64>)> = sums.iter().map(|&(row, sum)| (row, Some(sum))).collect();
    totals_of(samples, &rows)
}

/// Totals of `rows` (`(row, value)`, in row order) of `samples`, grouped by their series
/// columns (only those rows' are read).
fn totals_of(samples: &RecordBatch, rows: &[(u32, Option<i64>)]) -> Result<RecordBatch> {
    let schema = samples.schema();
    let indices = arrow::array::UInt32Array::from_iter_values(rows.iter().map(|r| r.0));
    let keys: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .zip(samples.columns())
        .filter(|(f, _)| crate::schema::is_series_column(f.name()))
        .map(|(_, c)| Ok(arrow::compute::take(c, &indices, None)?))
        .collect::<Result<_>>()?;
    let (words, width) = series_words(&keys)?;
    let row = |i: usize| &words[i * width..(i + 1) * width];
    // Rows of one label set come in runs (interleaved where samples carry pprof labels):
    // the previous row is checked before the map.
    let mut groups: HashMap<&[u64], u32> = HashMap::default();
    let (mut firsts, mut sums) = (Vec::<u32>::new(), Vec::<Option<i64>>::new());
    let mut previous: Option<(usize, u32)> = None;
    for (i, &(first, value)) in rows.iter().enumerate() {
        let g = match previous {
            Some((p, g)) if row(p) == row(i) => g,
            _ => *groups.entry(row(i)).or_insert_with(|| {
                firsts.push(first);
                sums.push(None);
                (firsts.len() - 1) as u32
            }),
        };
        previous = Some((i, g));
        if let Some(value) = value {
            let sum = &mut sums[g as usize];
            *sum = Some(sum.unwrap_or(0).saturating_add(value));
        }
    }
    let firsts = arrow::array::UInt32Array::from(firsts);
    let sums = Int64Array::from(sums);
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in schema.fields().iter().zip(samples.columns()) {
        let name = field.name().as_str();
        if name == STACKTRACE_ID {
            continue;
        }
        fields.push(field.as_ref().clone().with_nullable(true));
        columns.push(if name == VALUE {
            Arc::new(sums.clone())
        } else {
            arrow::compute::take(column, &firsts, None)?
        });
    }
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns,
    )?)
}

/// The series columns' values as words, `width` a row (returned with it), equal exactly
/// where the rows' values are: a string is the first position its value has in its column
/// (or dictionary, so a dictionary holding a value twice still compares by value), an
/// integer is itself (with a validity word if the column has nulls), and any other type
/// is the first row of its encoded value. Comparing rows is then comparing a few words,
/// not encoding every label string of every row.
fn series_words(keys: &[ArrayRef]) -> Result<(Vec<u64>, usize)> {
    use arrow::array::AsArray;
    let rows = keys.first().map_or(0, |k| k.len());
    // Each column's words, in rows order; a column may give two words a row.
    let mut columns: Vec<Vec<u64>> = Vec::new();
    fn first_positions<'a>(values: impl Iterator<Item = Option<&'a [u8]>>) -> Vec<u64> {
        let mut first: HashMap<&[u8], u64> = HashMap::default();
        values
            .enumerate()
            .map(|(i, v)| v.map_or(u64::MAX, |v| *first.entry(v).or_insert(i as u64)))
            .collect()
    }
    for column in keys {
        match column.data_type() {
            DataType::Dictionary(key, value)
                if **key == DataType::Int32 && **value == DataType::Utf8 =>
            {
                let dict = column.as_dictionary::<Int32Type>();
                let values = dict.values().as_string::<i32>();
                let canonical = first_positions(values.iter().map(|v| v.map(str::as_bytes)));
                columns.push(
                    dict.keys()
                        .iter()
                        .map(|k| k.map_or(u64::MAX, |k| canonical[k as usize]))
                        .collect(),
                );
            }
            DataType::Utf8 => {
                let strings = column.as_string::<i32>();
                columns.push(first_positions(
                    strings.iter().map(|v| v.map(str::as_bytes)),
                ));
            }
            DataType::Int64 => {
                let ints = column.as_primitive::<arrow::datatypes::Int64Type>();
                // A null's value word is 0 (its buffer slot may hold anything).
                columns.push(ints.iter().map(|v| v.map_or(0, |v| v as u64)).collect());
                if ints.null_count() > 0 {
                    columns.push((0..rows).map(|i| u64::from(ints.is_valid(i))).collect());
                }
            }
            other => {
                let converter =
                    arrow::row::RowConverter::new(vec![arrow::row::SortField::new(other.clone())])?;
                let encoded = converter.convert_columns(std::slice::from_ref(column))?;
                columns.push(first_positions(
                    (0..rows).map(|i| Some(encoded.row(i).data())),
                ));
            }
        }
    }
    let width = columns.len();
    let mut words = vec![0u64; rows * width];
    for (c, column) in columns.iter().enumerate() {
        for (i, &w) in column.iter().enumerate() {
            words[i * width + c] = w;
        }
    }
    Ok((words, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_noted_while_appending_are_the_totals_of_the_rows() {
        // Profiles of several sample types and with pprof sample labels, and one profile
        // twice (the same series at the same time: its totals are added), in one group.
        let limits = crate::Limits::default();
        let dir = crate::testing::shared_dir().join("testdata/pprof");
        let files = [
            "goapp__go119-heap.pb.gz",
            "pyroscope__go-cpu-labels.pb.gz",
            "parca__ebpf-agent-cpu-labels.pb.gz",
            "goapp__go119-heap.pb.gz",
        ];
        let mut out = SampleRows::default();
        for file in files {
            let profile = crate::decode(&std::fs::read(dir.join(file)).unwrap(), &limits).unwrap();
            let options = IngestOptions {
                name: "p".into(),
                labels: vec![("job".into(), "j".into())],
                delta: false,
                timestamp_ms: Some(1_000),
            };
            let prepared = prepare(&profile, &options, &[]).unwrap();
            let stacks: Vec<u32> = (0..prepared.groups.len() as u32).collect();
            prepared.append_samples(7, &stacks, &mut out).unwrap();
        }
        let sums = std::mem::take(&mut out.totals);
        let batch = out.finish().unwrap();
        let expected = totals_rows(&batch).unwrap();
        assert_eq!(totals_from(&batch, &sums).unwrap(), expected);
        let labelled = batch
            .schema()
            .fields()
            .iter()
            .filter(|f| f.name().starts_with("labels."))
            .count();
        assert!(labelled > 1, "some samples carry pprof labels");
        assert!(
            sums.len() > expected.num_rows(),
            "the repeated profile's totals were added"
        );
    }

    #[test]
    fn totals_group_rows_by_value_whatever_their_dictionary_keys() {
        use arrow::array::{DictionaryArray, Int32Array, StringArray};
        // "a" is in the dictionary twice: rows 0 and 1 are one label set; so are 3 and 5,
        // whose timestamps are both null; row 4's -1 is not a null.
        let pod: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![0, 2, 1, 0, 0, 2]),
                Arc::new(StringArray::from(vec!["a", "b", "a"])),
            )
            .unwrap(),
        );
        let job: ArrayRef = Arc::new(StringArray::from(vec![
            Some("j"),
            Some("j"),
            Some("j"),
            None,
            None,
            None,
        ]));
        let timestamp: ArrayRef = Arc::new(Int64Array::from(vec![
            Some(5),
            Some(5),
            Some(5),
            None,
            Some(-1),
            None,
        ]));
        let stack: ArrayRef = Arc::new(UInt64Array::from(vec![1, 2, 3, 4, 5, 6]));
        let value: ArrayRef = Arc::new(Int64Array::from(vec![1, 10, 100, 1000, 10000, 100000]));
        let schema = ArrowSchema::new(vec![
            Field::new("labels.pod", pod.data_type().clone(), true),
            Field::new("labels.job", DataType::Utf8, true),
            Field::new("timestamp", DataType::Int64, true),
            Field::new("stacktrace_id", DataType::UInt64, false),
            Field::new("value", DataType::Int64, true),
        ]);
        let batch = RecordBatch::try_new(Arc::new(schema), vec![pod, job, timestamp, stack, value])
            .unwrap();
        let totals = totals_rows(&batch).unwrap();
        let sums = totals
            .column_by_name("value")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let mut sums: Vec<i64> = sums.values().to_vec();
        sums.sort_unstable();
        assert_eq!(sums, vec![11, 100, 10_000, 101_000]);
        assert!(totals.column_by_name("stacktrace_id").is_none());
    }

    #[test]
    fn label_names_become_prometheus_names() {
        assert_eq!(sanitize_label("span.id"), "span_id");
        assert_eq!(sanitize_label("thread name"), "thread_name");
        assert_eq!(sanitize_label("9lives"), "_9lives");
        assert_eq!(sanitize_label(""), "_");
        assert_eq!(sanitize_label("ok_1"), "ok_1");
    }

    #[test]
    fn timestamps_in_microseconds_are_repaired() {
        let ns = 1_644_509_272_337_470_000;
        assert_eq!(timestamp_ms(ns), 1_644_509_272_337);
        assert_eq!(timestamp_ms(ns / 1000), 1_644_509_272_337, "microseconds");
        assert!(timestamp_ms(0) > 1_700_000_000_000, "now");
    }
}
