//! Step 3: the rows' series, the sample rows with their stacks' symbol ids, and what the
//! group commit derives from them.

use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};

use super::{ArrowSummary, Input, Strings, field};
use crate::error::Result;
use crate::limits::LabelLimits;
use crate::schema::SERIES_BUCKET_MS;
use crate::schema::column::{
    DURATION, PERIOD, PROFILE_TYPE, STACKTRACE_ID, TIMESTAMP, VALUE, label_column,
};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// The series (profile type and labels) of a call's rows.
pub(crate) struct Series {
    /// Per row, its series: an index into `first`.
    of_row: Vec<u32>,
    /// Per series, its first row.
    first: Vec<u32>,
}

impl Series {
    /// Distinct series.
    pub(crate) fn len(&self) -> usize {
        self.first.len()
    }
}

/// What the group commit derives from a call's rows (computed before its stacks are
/// interned: none of it needs them).
pub(crate) struct Derived {
    /// Rows standing for a series index row: `(key, row)`.
    pub(crate) index: Vec<(u64, u32)>,
    /// Per profile (series and timestamp): its first row and its values' sum.
    pub(crate) totals: Vec<(u32, i64)>,
    /// The series keys ([`crate::limits`]) with their days.
    pub(crate) keys: Vec<(u64, i64)>,
    /// What is stored.
    pub(crate) summary: ArrowSummary,
}

/// The string of `strings` at `row` (`None`: null).
fn value_at(strings: &Strings, row: usize) -> Option<&str> {
    let key = strings.keys();
    if key.is_null(row) {
        return None;
    }
    let values = strings.values().as_string::<i32>();
    let k = key.value(row) as usize;
    values.is_valid(k).then(|| values.value(k))
}

impl Input {
    /// Profile type columns, then label columns, as arrays.
    fn series_columns(&self) -> Vec<ArrayRef> {
        self.profile_type
            .iter()
            .chain(self.labels.iter().map(|(_, c)| c))
            .map(|c| Arc::new(c.clone()) as ArrayRef)
            .collect()
    }

    /// The rows' series.
    pub(crate) fn series(&self) -> Result<Series> {
        let (words, width) = crate::store::series_words(&self.series_columns())?;
        let row = |i: usize| &words[i * width..(i + 1) * width];
        let mut numbers: HashMap<&[u64], u32> = HashMap::default();
        let (mut of_row, mut first) = (Vec::with_capacity(self.len()), Vec::new());
        let mut previous: Option<u32> = None;
        for i in 0..self.len() {
            let s = match previous {
                Some(s) if row(first[s as usize] as usize) == row(i) => s,
                _ => *numbers.entry(row(i)).or_insert_with(|| {
                    first.push(i as u32);
                    (first.len() - 1) as u32
                }),
            };
            previous = Some(s);
            of_row.push(s);
        }
        Ok(Series { of_row, first })
    }

    /// The profile type (five parts) and labels (present ones, by name) of `row`.
    fn series_at(&self, row: usize) -> ([&str; 5], Vec<(&str, &str)>) {
        let types = std::array::from_fn(|t| value_at(&self.profile_type[t], row).unwrap_or(""));
        let labels = self
            .labels
            .iter()
            .filter_map(|(l, c)| value_at(c, row).map(|v| (l.as_str(), v)))
            .collect();
        (types, labels)
    }

    /// Series `s` as text, `name{k="v",...}` (the first 8 labels, and how many more).
    pub(crate) fn series_text(&self, series: &Series, s: usize) -> String {
        let (types, labels) = self.series_at(series.first[s] as usize);
        crate::limits::series_text(types[0], &labels)
    }

    /// Checks every series against `limits` and returns its series key (what a series
    /// limit counts: the profile name and labels, as [`crate::limits`] keys a pprof
    /// profile's series).
    pub(crate) fn series_keys(&self, series: &Series, limits: &LabelLimits) -> Result<Vec<u64>> {
        let mut keys = Vec::with_capacity(series.len());
        for s in 0..series.len() {
            let (types, labels) = self.series_at(series.first[s] as usize);
            limits
                .check(labels.iter().copied(), &[], || self.series_text(series, s))
                .map_err(|e| e.at(format!("samples row {}", series.first[s])))?;
            keys.push(crate::limits::series_key(types[0], labels.into_iter()));
        }
        Ok(keys)
    }

    /// The samples table's rows, with their stacks' symbol ids (`stack_ids`, a row each),
    /// and the spans table's (samples labelled with a span or trace id), if any.
    pub(crate) fn batches(
        &self,
        stack_ids: Vec<u64>,
    ) -> Result<(RecordBatch, Option<RecordBatch>)> {
        let mut fields: Vec<Field> = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (name, column) in PROFILE_TYPE.iter().zip(&self.profile_type) {
            fields.push(field(name, column, true));
            columns.push(Arc::new(column.clone()));
        }
        for (label, column) in &self.labels {
            fields.push(field(&label_column(label), column, true));
            columns.push(Arc::new(column.clone()));
        }
        fields.push(Field::new(STACKTRACE_ID, DataType::UInt64, false));
        columns.push(Arc::new(UInt64Array::from(stack_ids)));
        for (name, column) in [
            (TIMESTAMP, &self.timestamp),
            (DURATION, &self.duration),
            (PERIOD, &self.period),
            (VALUE, &self.value),
        ] {
            fields.push(Field::new(name, DataType::Int64, false));
            columns.push(Arc::new(column.clone()));
        }
        let samples = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)?;
        let spans = self.spans_of(&samples)?;
        Ok((samples, spans))
    }

    /// What the group commit derives from the rows; `series_keys` from
    /// [`Input::series_keys`].
    pub(crate) fn derive(&self, series: &Series, series_keys: &[u64]) -> Derived {
        let n = self.len();
        // Per profile (series and timestamp), its first row and sum; per series and hour,
        // an index row; per series and day, a series key. Rows of one profile come in runs:
        // the previous row's is tried first.
        let times = self.timestamp.values();
        let values = self.value.values();
        let mut profiles: HashMap<(u32, i64), u32> = HashMap::default();
        let mut totals: Vec<(u32, i64)> = Vec::new();
        let mut hours: HashSet<(u32, i64)> = HashSet::default();
        let mut index: Vec<(u64, u32)> = Vec::new();
        let mut days: HashSet<(u32, i64)> = HashSet::default();
        let mut keys: Vec<(u64, i64)> = Vec::new();
        let mut previous: Option<(u32, i64, u32)> = None;
        for i in 0..n {
            let (s, t) = (series.of_row[i], times[i]);
            let p = match previous {
                Some((ps, pt, p)) if ps == s && pt == t => p,
                _ => {
                    let p = *profiles.entry((s, t)).or_insert_with(|| {
                        totals.push((i as u32, 0));
                        (totals.len() - 1) as u32
                    });
                    let hour = t.div_euclid(SERIES_BUCKET_MS) * SERIES_BUCKET_MS;
                    if hours.insert((s, hour)) {
                        index.push((
                            self.index_key(series.first[s as usize] as usize, hour),
                            i as u32,
                        ));
                    }
                    let day = crate::limits::day_of(t);
                    if days.insert((s, day)) {
                        keys.push((series_keys[s as usize], day));
                    }
                    p
                }
            };
            previous = Some((s, t, p));
            let sum = &mut totals[p as usize].1;
            *sum = sum.saturating_add(values[i]);
        }
        let mut profile_types: Vec<String> = series
            .first
            .iter()
            .map(|&row| self.series_at(row as usize).0.join(":"))
            .collect();
        profile_types.sort_unstable();
        profile_types.dedup();
        let summary = ArrowSummary {
            rows: n,
            series: series.len(),
            profiles: totals.len(),
            stacks: self.stacks.len(),
            new_stacks: 0,
            profile_types,
        };
        Derived {
            index,
            totals,
            keys,
            summary,
        }
    }

    /// The series index key of `row`'s series and `hour`: the key a pprof profile of the
    /// same series (its labels all the request's) gives its index row, so the two paths
    /// write one row.
    fn index_key(&self, row: usize, hour: i64) -> u64 {
        let ([name, sample_type, sample_unit, period_type, period_unit], labels) =
            self.series_at(row);
        let no_labels: &[(&str, &str)] = &[];
        crate::normalize::SERIES_KEYS.hash_one((
            (name, sample_type, sample_unit),
            (period_type, period_unit, &labels[..]),
            (no_labels, hour),
        ))
    }

    /// The rows of `samples` labelled with a span or trace id, with those labels, of the
    /// types that are not cumulative (as a pprof profile's are kept: see
    /// [`crate::schema::SPANS`]).
    fn spans_of(&self, samples: &RecordBatch) -> Result<Option<RecordBatch>> {
        if self.span_labels.is_empty() {
            return Ok(None);
        }
        let sample_type = &self.profile_type[1];
        let keep: BooleanArray = (0..self.len())
            .map(|i| {
                let labelled = self
                    .span_labels
                    .iter()
                    .any(|(_, c)| value_at(c, i).is_some());
                let cumulative =
                    value_at(sample_type, i).is_some_and(crate::normalize::is_cumulative);
                Some(labelled && !cumulative)
            })
            .collect();
        if keep.true_count() == 0 {
            return Ok(None);
        }
        let mut fields: Vec<Field> = samples
            .schema()
            .fields()
            .iter()
            .map(|f| (**f).clone())
            .collect();
        let mut columns: Vec<ArrayRef> = samples.columns().to_vec();
        for (label, column) in &self.span_labels {
            fields.push(field(&label_column(label), column, true));
            columns.push(Arc::new(column.clone()));
        }
        let all = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)?;
        Ok(Some(arrow::compute::filter_record_batch(&all, &keep)?))
    }
}
