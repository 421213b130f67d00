//! Step 1: a profile prepared without a lock: labels, merged samples, deltas.

use super::*;

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
pub(super) fn timestamp_ms(time_nanos: i64) -> i64 {
    const YEAR_2000_NS: i64 = 946_684_800_000_000_000;
    const YEAR_2000_US: i64 = YEAR_2000_NS / 1000;
    match time_nanos {
        t if t <= 0 => frostdb_core::now_ms(),
        t if t >= YEAR_2000_NS => t / 1_000_000,
        t if t >= YEAR_2000_US => t / 1000,
        t => t / 1_000_000,
    }
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

/// Adds a sample's `values` (one per type) to row `row` of `table` (`types` per row).
pub(super) fn add(table: &mut [i64], row: u32, types: usize, values: &[i64]) {
    let row = &mut table[row as usize * types..(row as usize + 1) * types];
    for (acc, v) in row.iter_mut().zip(values) {
        *acc = acc.saturating_add(*v);
    }
}

/// Whether a (sanitized) sample label names a span or trace rather than a series.
pub(super) fn is_span_label(key: &str) -> bool {
    crate::schema::SPAN_LABELS.contains(&key)
}

/// A sample's string labels, sanitized and sorted, without those equal to a series label.
pub(super) fn sample_labels(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_microseconds_are_repaired() {
        let ns = 1_644_509_272_337_470_000;
        assert_eq!(timestamp_ms(ns), 1_644_509_272_337);
        assert_eq!(timestamp_ms(ns / 1000), 1_644_509_272_337, "microseconds");
        assert!(timestamp_ms(0) > 1_700_000_000_000, "now");
    }
}
