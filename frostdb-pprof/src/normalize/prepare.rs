//! Step 1: a profile prepared without a lock: labels, merged samples, deltas.

use super::*;

/// A cumulative series' previous profile: its time, and its values by stack.
pub(crate) type Baseline = (i64, HashMap<Fingerprint, i64>);

/// The previous values of the cumulative series seen, for deltas.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    previous: HashMap<String, Baseline>,
}

impl Deltas {
    /// Keeps the states a stored profile left.
    pub(crate) fn apply(&mut self, states: Vec<(String, Baseline)>) {
        self.previous.extend(states);
    }

    /// Cumulative series whose previous values are kept.
    pub(crate) fn len(&self) -> usize {
        self.previous.len()
    }

    /// Whether the previous values of `key` are kept.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.previous.contains_key(key)
    }

    /// Bytes the kept values hold: each series' key, and each value's slot (a 16-byte
    /// fingerprint and its 8-byte value, with the map's control byte, rounded up).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.previous
            .iter()
            .map(|(key, (_, values))| 64 + key.len() + values.capacity() * 32)
            .sum()
    }

    /// Keeps `other`'s values too (a series of both: `other`'s).
    pub(crate) fn merge(&mut self, other: Deltas) {
        self.previous.extend(other.previous);
    }
}

/// How far past now a profile may be dated: clocks skew, but a profile dated later is
/// refused (one dated in 9999 kept its block, and every symbol partition after it, past
/// any retention, and the series index's map of hours written from ever shrinking).
pub const MAX_FUTURE_MS: i64 = 3_600_000;

/// A profile's timestamp in ms: `time_nanos`, repaired when a writer put microseconds in
/// it (old pyroscope-rs), or now when absent. A time before 2000 (seconds or
/// milliseconds given as nanoseconds, a clock never set), or one that is microseconds
/// only if it is dated past now, is refused rather than stored where no query looks.
pub(super) fn timestamp_ms(time_nanos: i64) -> Result<i64> {
    const YEAR_2000_NS: i64 = 946_684_800_000_000_000;
    const YEAR_2000_US: i64 = YEAR_2000_NS / 1000;
    let now = frostdb_core::now_ms();
    match time_nanos {
        t if t <= 0 => Ok(now),
        t if t >= YEAR_2000_NS => Ok(t / 1_000_000),
        t if t >= YEAR_2000_US && t / 1000 <= now + MAX_FUTURE_MS => Ok(t / 1000),
        t => Err(Error::Invalid {
            field: "time_nanos",
            reason: format!(
                "{t} is a time before 2000 read as nanoseconds (or past now read as \
                 microseconds): a time in another unit?"
            ),
        }),
    }
}

/// Refuses a profile dated more than [`MAX_FUTURE_MS`] past now, or outside the times a
/// query may name.
pub(crate) fn check_time(timestamp_ms: i64) -> Result<()> {
    let now = frostdb_core::now_ms();
    let reason = if !(0..=frostdb_profile::MAX_MS).contains(&timestamp_ms) {
        format!(
            "{timestamp_ms} ms is outside 0..={} (1970 to 9999)",
            frostdb_profile::MAX_MS
        )
    } else if timestamp_ms > now.saturating_add(MAX_FUTURE_MS) {
        format!(
            "{timestamp_ms} ms is {} s past now: a profile may be dated at most {} s ahead",
            (timestamp_ms - now) / 1000,
            MAX_FUTURE_MS / 1000
        )
    } else {
        return Ok(());
    };
    Err(Error::Invalid {
        field: "time",
        reason,
    })
}

/// Bytes storing builds per sample value: the value (8), its row (16) and its sample row's
/// columns (five ids and values of 8 bytes, five dictionary keys of 4, and room for label
/// keys: 64).
const ROW_BYTES: usize = 88;

/// Step 1: labels, merged samples, deltas (of cumulative types, from the first of `deltas`
/// that holds the series' previous values).
pub(crate) fn prepare<'p>(
    profile: &'p ValidProfile,
    options: &IngestOptions,
    deltas: &[&Deltas],
    limits: &crate::limits::LabelLimits,
) -> Result<Prepared<'p>> {
    let p = profile.flat();
    // Every part of the profile types written must be selectable afterwards.
    // And each is part of every series key of the profile, as a label's value is: bounded
    // as one (a 120 MiB sample type was copied whole for each series a rollup keyed).
    let part = |field: &'static str, value: &str| {
        if value.len() > limits.max_label_value_length {
            return Err(Error::LabelLimit {
                what: format!("{field}, in bytes"),
                got: value.len(),
                limit: "max_label_value_length",
                value: limits.max_label_value_length,
            });
        }
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
    // What storing builds per sample value (at most a row each): its value here, its row
    // here, and its columns in the group's sample rows. Charged before any of it is made
    // (a server charges a request's profiles as it stores them): decoding charged about 8
    // bytes a value, and storing took ten times that, counted nowhere.
    crate::decode::charge::charge(
        p.samples()
            .len()
            .saturating_mul(types)
            .saturating_mul(ROW_BYTES),
        "a profile's sample rows",
    )?;
    let mut values: Vec<i64> = Vec::with_capacity(p.samples().len() * types);
    let mut span_index: HashMap<(u32, u32), u32> = HashMap::default();
    let mut span_groups: Vec<(u32, u32)> = Vec::new();
    let mut span_values: Vec<i64> = Vec::new();
    // A sample's label set is made (its texts copied, checked and hashed) once per distinct
    // set of texts: samples are first matched by the texts their labels name, as ids of
    // the texts (`texts`), so that 500,000 samples naming one set of 30 long values copy
    // it once, not 500,000 times. Each set made is charged, twice (kept in two places).
    let mut texts = Texts::default();
    let mut sets_named: HashMap<Vec<(u32, u32)>, SetIds> = HashMap::default();
    let mut named: Vec<(u32, u32)> = Vec::new();
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
            named.clear();
            named.extend(
                sample
                    .label
                    .iter()
                    .filter(|l| l.str != 0)
                    .map(|l| (texts.id(p, l.key), texts.id(p, l.str))),
            );
            named.sort_unstable();
            named.dedup();
            match sets_named.get(&named) {
                Some(&made) => made,
                None => {
                    let set = sample_labels(p, sample, &series, limits)?;
                    let bytes: usize = set.iter().map(|(k, v)| k.len() + v.len() + 48).sum();
                    crate::decode::charge::take(2 * bytes, "sample labels")?;
                    let made = if set.iter().any(|(k, _)| is_span_label(k)) {
                        let series_only = set
                            .iter()
                            .filter(|(k, _)| !is_span_label(k))
                            .cloned()
                            .collect();
                        (intern(series_only), Some(intern(set)))
                    } else {
                        (intern(set), None)
                    };
                    sets_named.insert(named.clone(), made);
                    made
                }
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

    let timestamp = match options.timestamp_ms {
        Some(t) => t,
        None => timestamp_ms(p.time_nanos)?,
    };
    check_time(timestamp)?;
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
                match previous {
                    // Not after the series' previous profile (a retry arriving late, or a
                    // request's profiles out of order): what it counted is in the
                    // difference stored since. Taken as the baseline, the next profile
                    // counted that interval again, and its own stacks were stored whole.
                    Some((at, _)) if timestamp <= *at => continue,
                    Some((_, previous)) => {
                        // A counter that went down was reset (the process restarted): the
                        // whole profile counts from the restart, each stack from 0 (judged
                        // stack by stack, those that had grown past their old totals were
                        // stored as the difference, about nothing).
                        let reset = previous
                            .iter()
                            .any(|(fp, &before)| current.get(fp).copied().unwrap_or(0) < before);
                        for (g, v) in column {
                            let before = match reset {
                                true => 0,
                                false => previous.get(&fps[g as usize]).copied().unwrap_or(0),
                            };
                            let delta = v - before;
                            if delta != 0 {
                                prepared.rows.push((t as u16, g, delta));
                            }
                        }
                    }
                    None => {}
                }
                prepared.delta_states.push((key, (timestamp, current)));
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

/// A sample's label set, and the same with its span labels when it has any.
type SetIds = (u32, Option<u32>);

/// Ids of the texts of a profile's string table, equal for equal texts (a table may hold
/// one text at several indices): each index's text is hashed once, when first named.
#[derive(Default)]
struct Texts<'p> {
    of_index: HashMap<i64, u32>,
    of_text: HashMap<&'p str, u32>,
}

impl<'p> Texts<'p> {
    fn id(&mut self, p: &'p Flat, index: i64) -> u32 {
        if let Some(&id) = self.of_index.get(&index) {
            return id;
        }
        let next = self.of_text.len() as u32;
        let id = *self.of_text.entry(text(p, index)).or_insert(next);
        self.of_index.insert(index, id);
        id
    }
}

/// A sample's string labels, sanitized and sorted, without those equal to a series label.
/// Each is checked against `limits` before its texts are copied; a name given two values
/// is refused (which one is meant is not said), as two names that sanitize alike are.
pub(super) fn sample_labels(
    p: &Flat,
    sample: SampleRef<'_>,
    series: &BTreeMap<String, String>,
    limits: &crate::limits::LabelLimits,
) -> Result<Vec<(String, String)>> {
    let mut labels: BTreeMap<String, (String, &str)> = BTreeMap::new();
    let mut names = 0;
    for l in sample.label {
        if l.str == 0 {
            continue;
        }
        let (raw, value) = (text(p, l.key), text(p, l.str));
        // A sanitized name has a byte for each character at least: one over the limit in
        // characters is refused before it is copied.
        if raw.len() > limits.max_label_name_length
            && raw.chars().count() > limits.max_label_name_length
        {
            limits.check_label(raw, "")?;
        }
        let key = sanitize_label(raw);
        limits.check_label(&key, value)?;
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
        if let Some((first, other)) = labels.get(&key) {
            if *other != raw {
                return Err(Error::LabelCollision {
                    label: key,
                    first: format!("pprof label {other:?}"),
                    second: format!("pprof label {raw:?}"),
                });
            }
            if first != value {
                return Err(Error::LabelCollision {
                    label: key,
                    first: format!("pprof label value {first:?}"),
                    second: format!("pprof label value {value:?}"),
                });
            }
            continue;
        }
        if !is_span_label(&key) {
            names += 1;
            if names > limits.max_label_names_per_series {
                return Err(Error::LabelLimit {
                    what: "the label names of a sample".to_owned(),
                    got: names,
                    limit: "max_label_names_per_series",
                    value: limits.max_label_names_per_series,
                });
            }
        }
        labels.insert(key, (value.to_owned(), raw));
    }
    Ok(labels.into_iter().map(|(k, (v, _))| (k, v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_microseconds_are_repaired() {
        let ns = 1_644_509_272_337_470_000;
        assert_eq!(timestamp_ms(ns).unwrap(), 1_644_509_272_337);
        assert_eq!(
            timestamp_ms(ns / 1000).unwrap(),
            1_644_509_272_337,
            "microseconds"
        );
        assert!(timestamp_ms(0).unwrap() > 1_700_000_000_000, "now");
    }

    /// Times in another unit are refused rather than stored where no query looks: before
    /// 2000 read as nanoseconds (1980 in nanoseconds was read as microseconds: year
    /// 11,968; seconds in the field: 1970), or past now read as microseconds. A time more
    /// than an hour ahead is refused, whatever gave it.
    #[test]
    fn times_in_another_unit_or_the_future_are_refused() {
        let refused = |t: Result<i64>| {
            let e = t.unwrap_err().to_string();
            assert!(e.contains("time"), "{e}");
        };
        refused(timestamp_ms(315_532_800_000_000_000)); // 1980 in ns
        refused(timestamp_ms(900_000_000_000_000_000));
        refused(timestamp_ms(1_700_000_000)); // seconds
        refused(timestamp_ms(1_700_000_000_000)); // milliseconds
        let now = frostdb_core::now_ms();
        check_time(now + MAX_FUTURE_MS / 2).unwrap();
        check_time(1_000).unwrap();
        for t in [now + 2 * MAX_FUTURE_MS, 253_402_300_799_000, -1, i64::MAX] {
            assert!(check_time(t).is_err(), "{t}");
        }
    }

    /// `testing::profile`'s first `samples` samples, each labelled with `labels` labels of
    /// `value_bytes`-byte values: one set of texts shared by all (each sample naming its
    /// own copies of the texts, at other indices), or a set of its own per sample.
    fn labelled(samples: usize, labels: usize, value_bytes: usize, shared: bool) -> ValidProfile {
        use crate::proto::Label;
        let mut p = crate::testing::profile(0, samples, 3);
        p.sample.truncate(samples);
        for (i, sample) in p.sample.iter_mut().enumerate() {
            for j in 0..labels {
                let value = match shared {
                    true => format!("{j:0>value_bytes$}"),
                    false => format!("{i}-{j:0>value_bytes$}"),
                };
                let key = p.string_table.len() as i64;
                p.string_table.push(format!("k{j}"));
                p.string_table.push(value);
                sample.label.push(Label {
                    key,
                    str: key + 1,
                    ..Label::default()
                });
            }
        }
        crate::decode::validate(p, &crate::Limits::default()).unwrap()
    }

    /// A label set is made once per distinct set of texts, and charged as it is made:
    /// 2,000 samples naming one set of 30 values of 2,000 bytes (each through texts of its
    /// own) make and charge one set; 200 samples of sets of their own are refused past the
    /// budget, naming the labels. Before, every sample copied (and hashed) its labels,
    /// uncharged: 256 sets of 64 values of 1 MiB were 32 GiB from a 20 KB gzip.
    #[test]
    fn label_sets_are_made_once_per_distinct_set_and_charged() {
        let limits = crate::limits::LabelLimits::default();
        let options = IngestOptions::default().name("x".to_owned());
        let one_set = labelled(2_000, 30, 2_000, true);
        let (prepared, charged) = crate::decode::charge::under_budget(1 << 20, || {
            prepare(&one_set, &options, &[], &limits).map(|p| p.label_sets.len())
        });
        assert_eq!(prepared.unwrap(), 2, "the empty set and the one shared");
        assert!(
            charged > 2 * 30 * 2_000,
            "the set made is charged: {charged}"
        );

        let own_sets = labelled(200, 30, 2_000, false);
        let (prepared, _) = crate::decode::charge::under_budget(4 << 20, || {
            prepare(&own_sets, &options, &[], &limits).map(|p| p.label_sets.len())
        });
        let e = prepared.map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("sample labels"), "{e}");
        assert_eq!(
            prepare(&own_sets, &options, &[], &limits)
                .unwrap()
                .label_sets
                .len(),
            201,
            "without a budget, every set is made"
        );
    }

    fn refused(prepared: Result<Prepared<'_>>) -> String {
        match prepared {
            Ok(_) => panic!("prepared"),
            Err(e) => e.to_string(),
        }
    }

    /// Labels past the limits are refused from the texts themselves, before a set is made;
    /// a name given two values is refused rather than one of them kept.
    #[test]
    fn labels_past_the_limits_or_of_two_values_are_refused() {
        let limits = crate::limits::LabelLimits::default();
        let options = IngestOptions::default().name("x".to_owned());
        let long = labelled(1, 1, limits.max_label_value_length + 1, true);
        let e = refused(prepare(&long, &options, &[], &limits));
        assert!(e.contains("max_label_value_length"), "{e}");
        let many = labelled(1, limits.max_label_names_per_series + 1, 4, true);
        let e = refused(prepare(&many, &options, &[], &limits));
        assert!(e.contains("max_label_names_per_series"), "{e}");

        let mut p = crate::testing::profile(0, 1, 3);
        p.sample.truncate(1);
        let at = p.string_table.len() as i64;
        p.string_table.extend(["pod", "a", "b"].map(str::to_owned));
        for value in [at + 1, at + 2] {
            p.sample[0].label.push(crate::proto::Label {
                key: at,
                str: value,
                ..Default::default()
            });
        }
        let two = crate::decode::validate(p, &crate::Limits::default()).unwrap();
        let e = refused(prepare(&two, &options, &[], &limits));
        assert!(e.contains("\"pod\"") || e.contains("pod"), "{e}");
        assert!(e.contains("\"a\"") && e.contains("\"b\""), "{e}");
    }
}
