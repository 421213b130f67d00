//! A decoded profile turned into sample rows and deduplicated symbols.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeBinaryArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Field, Schema as ArrowSchema};

use crate::error::{Error, Result};
use crate::proto::Profile;
use crate::symbols::{Function, Id, Location, Mapping, NewSymbols, Symbols, hash_id};

/// How to store one profile.
#[derive(Debug, Clone, Default)]
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

/// What storing a profile did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngestSummary {
    /// Sample rows written.
    pub rows: usize,
    /// Profile types written (`name:type:unit:period_type:period_unit`).
    pub profile_types: Vec<String>,
    /// New stacks stored.
    pub new_stacks: usize,
    /// Timestamp of the profile (ms).
    pub timestamp_ms: i64,
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

/// The previous values of the cumulative series seen, for deltas.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    previous: HashMap<String, HashMap<(Id, String), i64>>,
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

/// A sample's string labels, sorted by name.
type SampleLabels = Vec<(String, String)>;

/// The rows and symbols of one profile.
pub(crate) struct Normalized {
    pub(crate) samples: Option<RecordBatch>,
    pub(crate) symbols: NewSymbols,
    pub(crate) summary: IngestSummary,
}

/// Normalizes `p` (validated) against the symbols already known.
pub(crate) fn normalize(
    p: &Profile,
    options: &IngestOptions,
    known: &Symbols,
    mut deltas: Option<&mut Deltas>,
) -> Result<Normalized> {
    let strings = &p.string_table;
    let s = |i: i64| strings.get(i as usize).map_or("", String::as_str);
    let or = |v: &str, fallback: &str| {
        if v.is_empty() {
            fallback.to_owned()
        } else {
            v.to_owned()
        }
    };

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

    // Symbols, by pprof id, with their content ids.
    let mut new = NewSymbols::default();
    let mut new_ids: std::collections::HashSet<Id> = std::collections::HashSet::new();
    let mut mapping_ids: HashMap<u64, Id> = HashMap::new();
    for m in &p.mapping {
        let mapping = Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: s(m.filename).to_owned(),
            build_id: s(m.build_id).to_owned(),
            flags: u8::from(m.has_functions)
                | (u8::from(m.has_filenames) << 1)
                | (u8::from(m.has_line_numbers) << 2)
                | (u8::from(m.has_inline_frames) << 3),
        };
        let id = hash_id(
            b'm',
            &[
                &mapping.memory_start.to_le_bytes(),
                &mapping.memory_limit.to_le_bytes(),
                &mapping.file_offset.to_le_bytes(),
                mapping.filename.as_bytes(),
                mapping.build_id.as_bytes(),
                &[mapping.flags],
            ],
        );
        if !known.mappings.contains_key(&id) && new_ids.insert(id) {
            new.mappings.push((id, mapping));
        }
        mapping_ids.insert(m.id, id);
    }
    let mut function_ids: HashMap<u64, Id> = HashMap::new();
    for f in &p.function {
        let function = Function {
            name: s(f.name).to_owned(),
            system_name: s(f.system_name).to_owned(),
            filename: s(f.filename).to_owned(),
            start_line: f.start_line,
        };
        let id = hash_id(
            b'f',
            &[
                function.name.as_bytes(),
                function.system_name.as_bytes(),
                function.filename.as_bytes(),
                &function.start_line.to_le_bytes(),
            ],
        );
        if !known.functions.contains_key(&id) && new_ids.insert(id) {
            new.functions.push((id, function));
        }
        function_ids.insert(f.id, id);
    }
    let mut location_ids: HashMap<u64, Id> = HashMap::new();
    for l in &p.location {
        let mapping = mapping_ids.get(&l.mapping_id).copied();
        let lines: Vec<(Id, i64)> = l
            .line
            .iter()
            .map(|line| (function_ids[&line.function_id], line.line))
            .collect();
        let mut parts: Vec<Vec<u8>> = vec![
            mapping.map_or(vec![0; 16], |m| m.to_vec()),
            l.address.to_le_bytes().to_vec(),
            vec![u8::from(l.is_folded)],
        ];
        for (f, line) in &lines {
            parts.push(f.to_vec());
            parts.push(line.to_le_bytes().to_vec());
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let id = hash_id(b'l', &refs);
        if !known.locations.contains_key(&id) && new_ids.insert(id) {
            new.locations.push((
                id,
                Location {
                    mapping,
                    address: l.address,
                    lines,
                    is_folded: l.is_folded,
                },
            ));
        }
        location_ids.insert(l.id, id);
    }

    // Samples: merged by (stack, sample labels), per sample type.
    let mut stack_cache: HashMap<Vec<u64>, Id> = HashMap::new();
    let mut seen_new_stacks: BTreeSet<Id> = BTreeSet::new();
    let mut merged: BTreeMap<(Id, SampleLabels), Vec<i64>> = BTreeMap::new();
    let types = p.sample_type.len();
    for sample in &p.sample {
        let stack = match stack_cache.get(&sample.location_id) {
            Some(id) => *id,
            None => {
                let locs: Vec<Id> = sample.location_id.iter().map(|l| location_ids[l]).collect();
                let refs: Vec<&[u8]> = locs.iter().map(|l| l.as_slice()).collect();
                let id = hash_id(b's', &refs);
                if !known.stacks.contains_key(&id) && seen_new_stacks.insert(id) {
                    new.stacks.push((id, Arc::from(locs)));
                }
                stack_cache.insert(sample.location_id.clone(), id);
                id
            }
        };
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        let mut raw_keys: BTreeMap<String, String> = BTreeMap::new();
        for l in &sample.label {
            if l.str == 0 {
                continue; // numeric labels are not kept
            }
            let (raw, value) = (s(l.key), s(l.str));
            let key = sanitize_label(raw);
            if let Some(other) = raw_keys.insert(key.clone(), raw.to_owned())
                && other != raw
            {
                return Err(Error::LabelCollision {
                    label: key,
                    first: format!("pprof label {other:?}"),
                    second: format!("pprof label {raw:?}"),
                });
            }
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
            labels.insert(key, value.to_owned());
        }
        let entry = merged
            .entry((stack, labels.into_iter().collect()))
            .or_insert_with(|| vec![0; types]);
        for (acc, v) in entry.iter_mut().zip(&sample.value) {
            *acc = acc.saturating_add(*v);
        }
    }

    let timestamp = options
        .timestamp_ms
        .unwrap_or_else(|| timestamp_ms(p.time_nanos));
    let (period_type, period_unit) = p
        .period_type
        .as_ref()
        .map_or(("", ""), |t| (s(t.r#type), s(t.unit)));
    let series_key = format!("{}\u{0}{:?}", options.name, series);

    // Rows: (type index, stack, sample labels, value).
    let mut rows: Vec<(usize, Id, &SampleLabels, i64)> = Vec::new();
    let mut profile_types = Vec::new();
    for (t, vt) in p.sample_type.iter().enumerate() {
        let sample_type = or(s(vt.r#type), "samples");
        let mut values: Vec<(Id, &SampleLabels, i64)> = merged
            .iter()
            .map(|((stack, labels), v)| (*stack, labels, v[t]))
            .collect();
        if let Some(deltas) = deltas.as_deref_mut()
            && is_cumulative(&sample_type)
        {
            let key = format!("{series_key}\u{0}{sample_type}\u{0}{}", s(vt.unit));
            let current: HashMap<(Id, String), i64> = values
                .iter()
                .map(|(stack, labels, v)| ((*stack, format!("{labels:?}")), *v))
                .collect();
            let previous = deltas.previous.insert(key, current);
            let Some(previous) = previous else {
                continue; // the baseline
            };
            for (stack, labels, v) in values.iter_mut() {
                let before = previous
                    .get(&(*stack, format!("{labels:?}")))
                    .copied()
                    .unwrap_or(0);
                // A counter that went down was reset (the process restarted).
                *v = if *v >= before { *v - before } else { *v };
            }
        }
        let mut any = false;
        for (stack, labels, v) in values {
            if v != 0 {
                rows.push((t, stack, labels, v));
                any = true;
            }
        }
        if any {
            profile_types.push(format!(
                "{}:{}:{}:{}:{}",
                options.name,
                sample_type,
                or(s(vt.unit), "count"),
                or(period_type, "unknown"),
                or(period_unit, "unknown")
            ));
        }
    }

    let samples = if rows.is_empty() {
        None
    } else {
        let n = rows.len();
        let type_column = |f: &dyn Fn(usize) -> String| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| f(r.0))))
        };
        let sample_types = &p.sample_type;
        let mut columns: Vec<(String, ArrayRef)> = vec![
            (
                "name".into(),
                Arc::new(StringArray::from(vec![options.name.as_str(); n])),
            ),
            (
                "sample_type".into(),
                type_column(&|t| or(s(sample_types[t].r#type), "samples")),
            ),
            (
                "sample_unit".into(),
                type_column(&|t| or(s(sample_types[t].unit), "count")),
            ),
            (
                "period_type".into(),
                Arc::new(StringArray::from(vec![or(period_type, "unknown"); n])),
            ),
            (
                "period_unit".into(),
                Arc::new(StringArray::from(vec![or(period_unit, "unknown"); n])),
            ),
        ];
        for (k, v) in &series {
            columns.push((
                format!("labels.{k}"),
                Arc::new(StringArray::from(vec![v.as_str(); n])),
            ));
        }
        let sample_keys: BTreeSet<&String> = rows
            .iter()
            .flat_map(|r| r.2.iter().map(|(k, _)| k))
            .collect();
        for key in sample_keys {
            let values: StringArray = rows
                .iter()
                .map(|r| r.2.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()))
                .collect();
            columns.push((format!("labels.{key}"), Arc::new(values)));
        }
        columns.push((
            "stacktrace_id".into(),
            Arc::new(FixedSizeBinaryArray::try_from_iter(
                rows.iter().map(|r| r.1),
            )?),
        ));
        columns.push((
            "timestamp".into(),
            Arc::new(Int64Array::from(vec![timestamp; n])),
        ));
        columns.push((
            "duration".into(),
            Arc::new(Int64Array::from(vec![p.duration_nanos; n])),
        ));
        columns.push((
            "period".into(),
            Arc::new(Int64Array::from(vec![p.period; n])),
        ));
        columns.push((
            "value".into(),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        ));
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, a)| Field::new(name, a.data_type().clone(), true))
            .collect();
        Some(RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            columns.into_iter().map(|(_, a)| a).collect(),
        )?)
    };
    let summary = IngestSummary {
        rows: samples.as_ref().map_or(0, |b| b.num_rows()),
        profile_types,
        new_stacks: new.stacks.len(),
        timestamp_ms: timestamp,
    };
    Ok(Normalized {
        samples,
        symbols: new,
        summary,
    })
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

    #[test]
    fn timestamps_in_microseconds_are_repaired() {
        let ns = 1_644_509_272_337_470_000;
        assert_eq!(timestamp_ms(ns), 1_644_509_272_337);
        assert_eq!(timestamp_ms(ns / 1000), 1_644_509_272_337, "microseconds");
        assert!(timestamp_ms(0) > 1_700_000_000_000, "now");
    }
}
