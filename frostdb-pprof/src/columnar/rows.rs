//! Step 3: the rows' series, the sample rows with their stacks' symbol ids, and what the
//! group commit derives from them.

use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array, UInt64Array};
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
    /// Per profile (series and timestamp): its totals row to be (the profile keyed by its
    /// series key: rows given as Arrow have no pprof sample labels).
    pub(crate) totals: Vec<crate::normalize::Total>,
    /// The series keys ([`crate::limits`]) with their days.
    pub(crate) keys: Vec<(u64, i64)>,
    /// What is stored.
    pub(crate) summary: ArrowSummary,
}

impl Derived {
    /// The rows it names (`index`, `totals`) moved to their places once the call's rows
    /// are in `order` (`order[i]`: the row that comes `i`th).
    pub(crate) fn reorder(&mut self, order: &[u32]) {
        crate::normalize::move_rows(order, &mut self.index, &mut self.totals);
    }
}

/// A string column's rows as words that are equal where the values are: a value is the
/// first key its dictionary gives it (a dictionary may hold a value twice), a null
/// `u32::MAX`.
struct Words<'a> {
    keys: &'a arrow::array::Int32Array,
    canonical: Vec<u32>,
}

impl<'a> Words<'a> {
    fn new(strings: &'a Strings) -> Self {
        let values = strings.values().as_string::<i32>();
        let mut first: HashMap<&str, u32> = HashMap::default();
        let canonical = (0..values.len())
            .map(|k| match values.is_valid(k) {
                true => *first.entry(values.value(k)).or_insert(k as u32),
                false => u32::MAX,
            })
            .collect();
        Self {
            keys: strings.keys(),
            canonical,
        }
    }

    fn word(&self, row: usize) -> u32 {
        if self.keys.is_null(row) {
            return u32::MAX;
        }
        self.canonical[self.keys.value(row) as usize]
    }
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
    /// The rows' series. Rows of one series come in runs ([`crate::store::series_runs`]),
    /// and only a run's first row is looked up, by its values (each dictionary key standing
    /// for the first key of its value).
    pub(crate) fn series(&self) -> Result<Series> {
        let n = self.len();
        if n == 0 {
            return Ok(Series {
                of_row: Vec::new(),
                first: Vec::new(),
            });
        }
        let columns: Vec<Words<'_>> = self
            .profile_type
            .iter()
            .chain(self.labels.iter().map(|(_, c)| c))
            .map(Words::new)
            .collect();
        let arrays: Vec<ArrayRef> = self
            .profile_type
            .iter()
            .chain(self.labels.iter().map(|(_, c)| c))
            .map(|c| Arc::new(c.clone()) as ArrayRef)
            .collect();
        let mut numbers: HashMap<Vec<u32>, u32> = HashMap::default();
        let (mut of_row, mut first) = (Vec::with_capacity(n), Vec::new());
        let mut row: Vec<u32> = Vec::with_capacity(columns.len());
        for run in crate::store::series_runs(&arrays, n)? {
            row.clear();
            row.extend(columns.iter().map(|c| c.word(run.start)));
            let s = match numbers.get(&row) {
                Some(&s) => s,
                None => {
                    let s = first.len() as u32;
                    numbers.insert(row.clone(), s);
                    first.push(run.start as u32);
                    s
                }
            };
            of_row.resize(run.end, s);
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

    /// One row per series (its first), its columns named as the samples table names them:
    /// what the table's sort key orders to rank the series ([`Input::order`]).
    pub(crate) fn series_rows(&self, series: &Series) -> Result<RecordBatch> {
        let firsts = UInt32Array::from(series.first.clone());
        let mut fields: Vec<Field> = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        let named = PROFILE_TYPE
            .iter()
            .map(|name| name.to_string())
            .zip(&self.profile_type)
            .chain(self.labels.iter().map(|(l, c)| (label_column(l), c)));
        for (name, column) in named {
            fields.push(field(&name, column, true));
            columns.push(arrow::compute::take(column, &firsts, None)?);
        }
        Ok(RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            columns,
        )?)
    }

    /// The order of the rows in the samples table's: by series (`rank`: each series' place
    /// in the table's order of [`Input::series_rows`]), time and stack (`stack_ids`, a row
    /// each); `None` when they are in it already. Rows of one profile (series and time)
    /// come in runs: the runs are ordered, then the rows of each profile by stack, so a
    /// call costs a sort of its profiles and of each profile's rows, not of its rows.
    pub(crate) fn order(
        &self,
        series: &Series,
        rank: &[u32],
        stack_ids: &[u64],
    ) -> Option<Vec<u32>> {
        let times = self.timestamp.values();
        // (series rank, time, first row, end)
        let mut runs: Vec<(u32, i64, u32, u32)> = Vec::new();
        for (i, (&s, &t)) in series.of_row.iter().zip(times.iter()).enumerate() {
            let r = rank[s as usize];
            match runs.last_mut() {
                Some(run) if run.0 == r && run.1 == t => run.3 = i as u32 + 1,
                _ => runs.push((r, t, i as u32, i as u32 + 1)),
            }
        }
        crate::normalize::order_runs(runs, stack_ids, self.len())
    }

    /// The samples table's rows, with their stacks' symbol ids (`stack_ids`, a row each),
    /// in `order` if given ([`Input::order`]), and the spans table's (samples labelled with
    /// a span or trace id), if any.
    pub(crate) fn batches(
        &self,
        stack_ids: Vec<u64>,
        order: Option<&[u32]>,
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
        let samples = match order {
            Some(order) => {
                arrow::compute::take_record_batch(&samples, &UInt32Array::from(order.to_vec()))?
            }
            None => samples,
        };
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
        let mut totals: Vec<crate::normalize::Total> = Vec::new();
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
                        totals.push(crate::normalize::Total {
                            row: i as u32,
                            sum: 0,
                            profile: series_keys[s as usize],
                        });
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
            let sum = &mut totals[p as usize].sum;
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
