//! The fixed profile queries straight on the engine's scans, without planning: the merge
//! sums values per stack while it reads, into one dense array per symbol partition (stack
//! ids are [`crate::ids`]: a partition and an index dense from 0), so no key is ever
//! hashed, and it yields the total and the period in the same pass. The DataFusion plans of
//! [`crate::plans`] give the same answers (the tests check one against the other).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt64Type};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use frostdb_core::{Error, ScanMetrics, ScanRequest, Snapshot, col};

use crate::ids::{split_id, symbol_id};
use crate::schema::column::{
    LABEL_PREFIX, PERIOD, PROFILE_KEY, PROFILE_TYPE, STACKTRACE_ID, TIMESTAMP, VALUE, label_column,
};
use crate::{ProfileType, Result, Selector, TimeRange};

/// What a merge read: the value per stack, and the totals of the same rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StackTotals {
    /// `(stack id, summed value)`, ids ascending, zero sums left out.
    pub stacks: Vec<(u64, i64)>,
    /// The sum of every value.
    pub total: i64,
    /// The largest sampling period among the rows.
    pub period: i64,
    /// Rows that contributed.
    pub rows: usize,
    /// What the scan read and pruned.
    pub metrics: ScanMetrics,
}

impl std::ops::Add for StackTotals {
    type Output = StackTotals;

    /// The totals of both reads (of disjoint rows: two time ranges, say), stacks summed.
    fn add(self, other: StackTotals) -> StackTotals {
        let mut stacks = Vec::with_capacity(self.stacks.len().max(other.stacks.len()));
        let (mut a, mut b) = (
            self.stacks.into_iter().peekable(),
            other.stacks.into_iter().peekable(),
        );
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.0 == y.0 => {
                    let (id, v) = (x.0, x.1.saturating_add(y.1));
                    a.next();
                    b.next();
                    (id, v)
                }
                (Some(x), Some(y)) if x.0 < y.0 => a.next().expect("peeked"),
                (Some(_), Some(_)) | (None, Some(_)) => b.next().expect("peeked"),
                (Some(_), None) => a.next().expect("peeked"),
                (None, None) => break,
            };
            if next.1 != 0 {
                stacks.push(next);
            }
        }
        let mut metrics = self.metrics;
        metrics += other.metrics;
        StackTotals {
            stacks,
            total: self.total.saturating_add(other.total),
            period: self.period.max(other.period),
            rows: self.rows + other.rows,
            metrics,
        }
    }
}

/// Reads the persisted blocks of merges elsewhere: the workers of a cluster
/// (`distributed::Cluster`), which answer what [`merge_stacks`] of a snapshot of those
/// blocks answers.
pub trait BlockMerger: Send + Sync + std::fmt::Debug {
    /// The values summed per stack over `blocks` of table `table`, for the rows `selector`
    /// selects in `range` (`narrow`: see [`merge_stacks`]), what it holds reserved from
    /// `pool` (the store's query memory) as a merge on this node is.
    #[allow(clippy::too_many_arguments)]
    fn merge_stacks(
        &self,
        table: &str,
        blocks: Vec<frostdb_core::BlockMeta>,
        selector: &Selector,
        range: TimeRange,
        lenient: bool,
        narrow: Option<frostdb_core::Predicate>,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<StackTotals>;
}

/// The predicate of `selector` over `range` on `snapshot`'s columns.
pub fn predicate(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
) -> frostdb_core::Predicate {
    let schema = snapshot.schema();
    let mut p = selector.to_predicate(&|c| schema.index_of(c).is_some());
    if range.start_ms != i64::MIN {
        p = p.and(col(TIMESTAMP).gt_eq(range.start_ms));
    }
    if range.end_ms != i64::MAX {
        p = p.and(col(TIMESTAMP).lt(range.end_ms));
    }
    p
}

/// Indices past this are not a partition's (whose size is bounded): corrupt data, refused
/// rather than allocated for.
const MAX_INDEX: usize = 1 << 27;

/// Sums per partition, one dense array each, their memory reserved from the query pool.
struct Dense {
    partitions: Vec<(u32, Vec<i64>)>,
    last: usize,
    total: i64,
    period: i64,
    rows: usize,
    reservation: MemoryReservation,
}

impl Dense {
    fn new(pool: &Arc<dyn MemoryPool>) -> Self {
        Self {
            partitions: Vec::new(),
            last: 0,
            total: 0,
            period: 0,
            rows: 0,
            reservation: MemoryConsumer::new("profile merge").register(pool),
        }
    }

    /// Grows partition slot `at` to `len` sums, reserving the memory first.
    fn grow(&mut self, at: usize, len: usize) -> Result<()> {
        let slot = &mut self.partitions[at].1;
        if len > slot.len() {
            self.reservation
                .try_grow((len - slot.len()) * std::mem::size_of::<i64>())?;
            slot.resize(len, 0);
        }
        Ok(())
    }

    /// The position of `partition`'s sums, added if new (the last one used is checked
    /// first: rows come in runs of one partition).
    #[inline]
    fn at(&mut self, partition: u32) -> usize {
        if self
            .partitions
            .get(self.last)
            .is_none_or(|p| p.0 != partition)
        {
            self.last = match self.partitions.iter().position(|p| p.0 == partition) {
                Some(i) => i,
                None => {
                    self.partitions.push((partition, Vec::new()));
                    self.partitions.len() - 1
                }
            };
        }
        self.last
    }

    fn add_batch(&mut self, b: &RecordBatch) -> Result<()> {
        let column = |name: &str| {
            b.column_by_name(name)
                .ok_or_else(|| Error::Internal(format!("a merge scan returned no column {name:?}")))
        };
        let ids = column(STACKTRACE_ID)?
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| Error::Internal("stacktrace_id is not UInt64".into()))?;
        let values = column(VALUE)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Internal("value is not Int64".into()))?;
        let periods = column(PERIOD)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Internal("period is not Int64".into()))?;
        if let Some(max) = arrow::compute::max(periods) {
            self.period = self.period.max(max);
        }
        if ids.null_count() + values.null_count() > 0 {
            // Rare (no writer stores them): the valid rows, one at a time.
            for i in 0..b.num_rows() {
                if ids.is_valid(i) && values.is_valid(i) {
                    self.add_run(&ids.values()[i..=i], &values.values()[i..=i])?;
                }
            }
            return Ok(());
        }
        let (ids, values) = (ids.values(), values.values());
        // Rows come in runs of one partition: each run is checked and grown for once, then
        // summed without a branch but the bounds check.
        let mut start = 0;
        while start < ids.len() {
            let partition = split_id(ids[start]).0;
            let end = start
                + ids[start..]
                    .iter()
                    .position(|id| split_id(*id).0 != partition)
                    .unwrap_or(ids.len() - start);
            self.add_run(&ids[start..end], &values[start..end])?;
            start = end;
        }
        Ok(())
    }

    /// Adds rows whose stack ids share one partition.
    fn add_run(&mut self, ids: &[u64], values: &[i64]) -> Result<()> {
        let Some(first) = ids.first() else {
            return Ok(());
        };
        let highest = ids.iter().map(|id| split_id(*id).1).max().unwrap_or(0) as usize;
        if highest >= MAX_INDEX {
            return Err(Error::Internal(format!(
                "stack id {:#x} has an index beyond any symbol partition's",
                symbol_id(split_id(*first).0, highest as u32)
            ))
            .into());
        }
        let at = self.at(split_id(*first).0);
        let len = self.partitions[at].1.len();
        if highest >= len {
            self.grow(at, (highest + 1).max(len * 2).min(highest + (1 << 20)))?;
        }
        let sums = &mut self.partitions[at].1;
        for (id, v) in ids.iter().zip(values) {
            let sum = &mut sums[split_id(*id).1 as usize];
            *sum = sum.saturating_add(*v);
        }
        let run = values.iter().fold(0i64, |a, v| a.saturating_add(*v));
        self.total = self.total.saturating_add(run);
        self.rows += ids.len();
        Ok(())
    }

    fn merge(mut self, other: Dense) -> Result<Dense> {
        if self.partitions.is_empty() && self.rows == 0 {
            return Ok(Dense {
                period: self.period.max(other.period),
                ..other
            });
        }
        for (p, values) in &other.partitions {
            let at = self.at(*p);
            self.grow(at, values.len())?;
            for (a, b) in self.partitions[at].1.iter_mut().zip(values) {
                *a = a.saturating_add(*b);
            }
        }
        self.total = self.total.saturating_add(other.total);
        self.period = self.period.max(other.period);
        self.rows += other.rows;
        Ok(self)
    }
}

/// Merge: the value summed per stack for the rows `selector` selects in `range`, read by up
/// to `threads` threads, its sums' memory reserved from `pool` (over its limit, the merge
/// fails with "resources exhausted"). A block that cannot be read fails the merge unless
/// `lenient`, which skips it and counts it in the metrics' `blocks_failed`. `narrow`, when
/// given, is a predicate every selected row satisfies, only checked against statistics
/// ([`ScanRequest::prune`]): the full label sets of the selected series, say.
pub fn merge_stacks(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    threads: usize,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
    narrow: Option<frostdb_core::Predicate>,
) -> Result<StackTotals> {
    let mut request = ScanRequest::new()
        .project([STACKTRACE_ID, VALUE, PERIOD])
        .filter(predicate(snapshot, selector, range))
        .lenient(lenient);
    if let Some(narrow) = narrow {
        request = request.prune(narrow);
    }
    if snapshot.schema().index_of(STACKTRACE_ID).is_none() {
        return Ok(StackTotals::default());
    }
    let (scans, mut metrics) = snapshot.scan_partitions(&request, threads.max(1))?;
    let parts: Vec<Result<(Dense, usize)>> = std::thread::scope(|s| {
        let handles: Vec<_> = scans
            .into_iter()
            .map(|mut scan| {
                s.spawn(move || {
                    let mut dense = Dense::new(pool);
                    for batch in scan.by_ref() {
                        dense.add_batch(&batch?)?;
                    }
                    Ok((dense, scan.metrics().blocks_failed))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Internal("a merge thread panicked".into()).into())
                })
            })
            .collect()
    });
    let mut dense = Dense::new(pool);
    for part in parts {
        let (part, failed_midway) = part?;
        dense = dense.merge(part)?;
        metrics.blocks_failed += failed_midway;
    }
    let mut stacks = Vec::new();
    dense.partitions.sort_by_key(|p| p.0);
    for (p, values) in &dense.partitions {
        stacks.extend(
            values
                .iter()
                .enumerate()
                .filter(|(_, v)| **v != 0)
                .map(|(i, v)| (symbol_id(*p, i as u32), *v)),
        );
    }
    Ok(StackTotals {
        stacks,
        total: dense.total,
        period: dense.period,
        rows: dense.rows,
        metrics,
    })
}

/// One series of a range query: its labels (those grouped by) and a value per time bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// Label names and values, in name order; labels a series lacks are left out.
    pub labels: Vec<(String, String)>,
    /// `(bucket start ms, summed value)`, in time order.
    pub points: Vec<(i64, i64)>,
    /// Per point, the profiles summed into it (the distinct times of its rows in each group:
    /// a profile's label sets made by pprof sample labels count once), for averages.
    pub rows: Vec<u64>,
}

impl Series {
    /// The points as `(bucket start ms, value)`: each the sum, or with `average` the mean over
    /// the rows summed into it (profiles, for the totals table).
    pub fn values(&self, average: bool) -> impl Iterator<Item = (i64, f64)> + '_ {
        self.points
            .iter()
            .zip(&self.rows)
            .map(move |(&(t, v), &n)| match (average, n) {
                (true, n) if n > 0 => (t, v as f64 / n as f64),
                _ => (t, v as f64),
            })
    }
}

/// A string column as the engine returns it: dictionary-encoded (memory and most blocks) or
/// plain.
#[derive(Debug)]
pub enum Strings<'a> {
    /// Dictionary-encoded: the keys, the values, the keys' array (for nulls).
    Dict(
        &'a [i32],
        &'a arrow::array::StringArray,
        &'a arrow::array::Int32Array,
    ),
    /// Plain strings.
    Plain(&'a arrow::array::StringArray),
}

impl<'a> Strings<'a> {
    /// The column `array` as strings; an error for a column of another type.
    pub fn of(array: &'a dyn Array) -> frostdb_core::Result<Self> {
        if let Some(d) = array.as_dictionary_opt::<arrow::datatypes::Int32Type>() {
            let values = d.values().as_string_opt::<i32>().ok_or_else(|| {
                Error::Internal("a label dictionary does not hold strings".into())
            })?;
            return Ok(Strings::Dict(d.keys().values(), values, d.keys()));
        }
        array
            .as_string_opt::<i32>()
            .map(Strings::Plain)
            .ok_or_else(|| Error::Internal(format!("a label column is {}", array.data_type())))
    }

    /// A key equal for equal values within the batch (`None`: null).
    #[inline]
    pub fn key(&self, i: usize) -> Option<usize> {
        match self {
            Strings::Dict(keys, _, array) => array.is_valid(i).then(|| keys[i] as usize),
            Strings::Plain(a) => a.is_valid(i).then_some(i),
        }
    }

    /// The value of a key [`Strings::key`] gave.
    pub fn value(&self, key: usize) -> &'a str {
        match self {
            Strings::Dict(_, values, _) => values.value(key),
            Strings::Plain(a) => a.value(key),
        }
    }

    /// Row `i`'s value, `""` when null.
    #[inline]
    pub fn get(&self, i: usize) -> &'a str {
        self.key(i).map_or("", |k| self.value(k))
    }
}

/// Label names of the snapshot's schema (`labels.pod` gives `pod`), sorted.
fn label_names_of(snapshot: &Snapshot) -> Vec<String> {
    let mut names: Vec<String> = snapshot
        .schema()
        .arrow_schema()
        .fields()
        .iter()
        .filter_map(|f| f.name().strip_prefix(LABEL_PREFIX).map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// Each series' integer share of each stack's `merged` (rounded) value: its exact value
/// rounded down, and the units left of the stack's value to the series with the largest
/// fractions (largest remainder). A stack's shares add up to what the merge shows, and
/// each is within one of its exact value: rounded per series, a stack worth 0.3 in each
/// of a hundred series was 0 in a labelled export where the merge showed 30.
fn apportion(
    exact: Vec<(LabelSet, Vec<(u64, f64)>)>,
    merged: &std::collections::HashMap<u64, i64>,
) -> Vec<(LabelSet, Vec<(u64, i64)>)> {
    // Per stack, its entries (series, position) and their fractions, and its units left.
    let mut shares: Vec<(LabelSet, Vec<(u64, i64)>)> = Vec::with_capacity(exact.len());
    let mut entries: std::collections::HashMap<u64, Vec<(f64, usize, usize)>> = Default::default();
    let mut floors: std::collections::HashMap<u64, i64> = Default::default();
    for (s, (labels, stacks)) in exact.into_iter().enumerate() {
        let mut out = Vec::with_capacity(stacks.len());
        for (i, (id, v)) in stacks.into_iter().enumerate() {
            let floor = v.floor();
            *floors.entry(id).or_default() += floor as i64;
            entries.entry(id).or_default().push((v - floor, s, i));
            out.push((id, floor as i64));
        }
        shares.push((labels, out));
    }
    for (id, mut fractions) in entries {
        let left = merged.get(&id).copied().unwrap_or(0) - floors.get(&id).copied().unwrap_or(0);
        if left <= 0 {
            continue;
        }
        // Largest fractions first; equal ones in series order (the same answer each time).
        fractions.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        for &(_, s, i) in fractions.iter().take(left as usize) {
            shares[s].1[i].1 += 1;
        }
    }
    shares
        .into_iter()
        .filter_map(|(labels, mut stacks)| {
            stacks.retain(|(_, v)| *v != 0);
            stacks.sort_unstable_by_key(|(id, _)| *id);
            (!stacks.is_empty()).then_some((labels, stacks))
        })
        .collect()
}

/// A merge that keeps series apart: per label set (`(name, value)` pairs, `labels.` left
/// off, in name order), the value per stack, ids ascending, for the raw rows `selector`
/// selects in `range`, each series' profiles combined by `aggregation` (summed, averaged
/// over its profiles, or its latest profile). What a pprof export whose samples carry their
/// labels is built from (`go tool pprof -tags`), and a merge of a gauge. Its sums are kept
/// per series, so it holds more than [`merge_stacks`]: `pool` bounds them. A block that
/// cannot be read fails the merge unless `lenient` (skipped, counted in `blocks_failed`).
pub fn merge_stacks_by_series(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    aggregation: crate::Aggregation,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<SeriesStacks> {
    use crate::Aggregation;
    /// One label set: its sums per stack, the times of its profiles and of its last row read
    /// (average and latest), and of its latest profile (latest).
    #[derive(Default)]
    struct Of {
        sums: std::collections::HashMap<u64, i64>,
        times: std::collections::HashSet<i64>,
        last_time: Option<i64>,
        latest: Option<i64>,
    }
    struct Sink {
        sets: Vec<Of>,
        aggregation: Aggregation,
    }
    impl RowSink for Sink {
        fn row(&mut self, set: usize, t: i64, id: u64, value: i64) {
            if set == self.sets.len() {
                self.sets.push(Of::default());
            }
            let of = &mut self.sets[set];
            // A profile's rows are adjacent: its time is counted once.
            if self.aggregation != Aggregation::Sum && of.last_time != Some(t) {
                of.times.insert(t);
                of.last_time = Some(t);
            }
            if self.aggregation == Aggregation::Latest {
                match of.latest {
                    Some(l) if t < l => return,
                    Some(l) if t == l => {}
                    _ => {
                        of.sums.clear();
                        of.latest = Some(t);
                    }
                }
            }
            let sum = of.sums.entry(id).or_insert(0);
            *sum = sum.saturating_add(value);
        }

        fn bytes(&self) -> usize {
            // Per entry: a stack id and a value, and the map's own overhead.
            let entries: usize = self
                .sets
                .iter()
                .map(|o| o.sums.capacity() + o.times.capacity())
                .sum();
            entries * 32
        }
    }
    let mut sink = Sink {
        sets: Vec::new(),
        aggregation,
    };
    let read = walk_series_rows(
        snapshot,
        selector,
        range,
        lenient,
        pool,
        "merge by series",
        &mut sink,
    )?;
    // A label set's profiles are its target's: a pprof sample label (`endpoint=/slow`)
    // makes a label set of its own, present only in the profiles where such samples were,
    // and it is averaged over all of its target's profiles, and is in the latest only if
    // its target's latest profile has it.
    // What is made of the sums while they are held: each series' exact values, the
    // merged ones, and `apportion`'s entries, floors and shares (about 72 bytes a pair).
    const MADE_PER_PAIR: usize = 72;
    let pairs: usize = sink.sets.iter().map(|o| o.sums.len()).sum();
    read.held.try_grow(pairs.saturating_mul(MADE_PER_PAIR))?;
    let targets = match aggregation {
        Aggregation::Sum => Vec::new(),
        _ => {
            let times: Vec<&std::collections::HashSet<i64>> =
                sink.sets.iter().map(|o| &o.times).collect();
            let _held = targets_held(&times, pool)?;
            targets_of(&read.sets, &times)
        }
    };
    let mut merged: std::collections::HashMap<u64, f64> = Default::default();
    let mut order: Vec<(LabelSet, usize)> = read.sets.into_iter().zip(0..).collect();
    order.sort();
    // Each series' exact values first (averages are fractions), then rounded together.
    let exact: Vec<(LabelSet, Vec<(u64, f64)>)> = order
        .into_iter()
        .filter_map(|(labels, set)| {
            let of = std::mem::take(&mut sink.sets[set]);
            let scale = match aggregation {
                Aggregation::Sum => 1.0,
                Aggregation::Average => 1.0 / targets[set].profiles.max(1) as f64,
                // Not in its target's latest profile: not in use then.
                Aggregation::Latest if of.latest < Some(targets[set].latest) => return None,
                Aggregation::Latest => 1.0,
            };
            let stacks: Vec<(u64, f64)> = of
                .sums
                .into_iter()
                .map(|(id, v)| {
                    let v = v as f64 * scale;
                    *merged.entry(id).or_insert(0.0) += v;
                    (id, v)
                })
                .collect();
            Some((labels, stacks))
        })
        .collect();
    // Rounded once, summed over label sets: a stack's average of less than one in each
    // series is not lost.
    let merged: std::collections::HashMap<u64, i64> = merged
        .into_iter()
        .map(|(id, v)| (id, v.round() as i64))
        .collect();
    let series = apportion(exact, &merged);
    let mut merged: Vec<(u64, i64)> = merged.into_iter().filter(|(_, v)| *v != 0).collect();
    merged.sort_unstable_by_key(|(id, _)| *id);
    Ok(SeriesStacks {
        series,
        merged,
        period: read.period,
        rows: read.rows,
        blocks_failed: read.blocks_failed,
    })
}

/// The profiles of a label set's target: how many (in the range read) and the latest's time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Target {
    profiles: usize,
    latest: i64,
}

/// Per label set (`sets`, each with the times of its profiles in `times`), its target's
/// profiles: those of its target's own set ([`bases_of`]), or its own where they are more
/// or later.
fn targets_of(sets: &[LabelSet], times: &[&std::collections::HashSet<i64>]) -> Vec<Target> {
    let own = |i: usize| Target {
        profiles: times[i].len(),
        latest: times[i].iter().copied().max().unwrap_or(i64::MIN),
    };
    bases_of(sets, times)
        .into_iter()
        .enumerate()
        .map(|(i, base)| {
            let (mine, of) = (own(i), own(base));
            Target {
                profiles: mine.profiles.max(of.profiles),
                latest: mine.latest.max(of.latest),
            }
        })
        .collect()
}

/// Per label set (`sets`, each with the times of its profiles in `times`), the index of its
/// target's own set: of the sets found in a profile with it that it holds every label of
/// (the series' own labels, where its own add pprof sample labels), the one in the most
/// profiles; itself when there is none. Only the [`SUBSETS_TRIED`] smallest sets of each
/// profile time are tried: a target's own set is the smallest of its profiles.
fn bases_of(sets: &[LabelSet], times: &[&std::collections::HashSet<i64>]) -> Vec<usize> {
    const SUBSETS_TRIED: usize = 8;
    let mut bases: Vec<usize> = (0..sets.len()).collect();
    let mut at: std::collections::HashMap<i64, Vec<usize>> = Default::default();
    for (i, t) in times.iter().enumerate() {
        for &t in t.iter() {
            at.entry(t).or_default().push(i);
        }
    }
    // The pairs tried, at most one per profile time (what [`targets_held`] reserves): the
    // sets of one target meet at each of its profiles, and are compared once.
    let most_tried: usize = times.iter().map(|t| t.len()).sum();
    let mut tried: std::collections::HashSet<(usize, usize)> = Default::default();
    for together in at.values_mut() {
        together.sort_by_key(|&i| sets[i].len());
        let smallest = &together[..together.len().min(SUBSETS_TRIED)];
        for &set in together.iter() {
            for &sub in smallest {
                if sets[sub].len() >= sets[set].len() || tried.contains(&(sub, set)) {
                    continue;
                }
                if tried.len() < most_tried {
                    tried.insert((sub, set));
                }
                let base = bases[set];
                let better = times[sub].len() > times[base].len()
                    || (times[sub].len() == times[base].len()
                        && sets[sub].len() < sets[base].len());
                if better && is_subset(&sets[sub], &sets[set]) {
                    bases[set] = sub;
                }
            }
        }
    }
    bases
}

/// Reserves from `pool` what finding label sets' targets ([`bases_of`]) holds for the
/// profile times `times` lists: an entry by time, and the pairs of sets tried.
fn targets_held(
    times: &[&std::collections::HashSet<i64>],
    pool: &Arc<dyn MemoryPool>,
) -> Result<MemoryReservation> {
    const BYTES_PER_TIME: usize = 64;
    let entries: usize = times.iter().map(|t| t.len()).sum();
    let held = MemoryConsumer::new("profiles of label sets by time").register(pool);
    held.try_grow(entries.saturating_mul(BYTES_PER_TIME))?;
    Ok(held)
}

/// Whether every label of `small` is in `large` (both in name order).
fn is_subset(small: &LabelSet, large: &LabelSet) -> bool {
    let mut large = large.iter();
    small.iter().all(|pair| large.any(|other| other == pair))
}

/// The raw rows `selector` selects in `range`, kept apart by profile: per series (label
/// set) and time, the value per stack, ids ascending. What a comparison of two selections
/// profile by profile reads (a statistical test over profiles rather than one merged pair).
/// `pool` bounds what it holds; a block that cannot be read fails the read unless
/// `lenient` (skipped, counted in `blocks_failed`).
pub fn stacks_by_profile(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<ProfileStacks> {
    #[derive(Default)]
    struct Sink {
        index: std::collections::HashMap<(usize, i64), usize>,
        last: Option<((usize, i64), usize)>,
        profiles: Vec<ProfileRows>,
        entries: usize,
    }
    impl RowSink for Sink {
        fn row(&mut self, set: usize, t: i64, id: u64, value: i64) {
            let key = (set, t);
            let at = match self.last {
                // A profile's rows are adjacent within a block.
                Some((k, at)) if k == key => at,
                _ => {
                    let next = self.profiles.len();
                    let at = *self.index.entry(key).or_insert(next);
                    if at == next {
                        self.profiles.push(ProfileRows {
                            series: set,
                            timestamp: t,
                            stacks: Vec::new(),
                        });
                    }
                    self.last = Some((key, at));
                    at
                }
            };
            self.profiles[at].stacks.push((id, value));
            self.entries += 1;
        }

        fn bytes(&self) -> usize {
            self.entries * 16 + self.profiles.len() * 64
        }
    }
    let mut sink = Sink::default();
    let read = walk_series_rows(
        snapshot,
        selector,
        range,
        lenient,
        pool,
        "stacks by profile",
        &mut sink,
    )?;
    // A profile's label sets made by pprof sample labels are one profile, its target's:
    // counted apart, one profile of 25 labelled sets was 25 observations of a comparison.
    let mut times: Vec<std::collections::HashSet<i64>> = vec![Default::default(); read.sets.len()];
    for p in &sink.profiles {
        times[p.series].insert(p.timestamp);
    }
    let times: Vec<&std::collections::HashSet<i64>> = times.iter().collect();
    let held = targets_held(&times, pool)?;
    let bases = bases_of(&read.sets, &times);
    drop((held, times));
    let mut of_target: std::collections::HashMap<(usize, i64), usize> = Default::default();
    let mut profiles: Vec<ProfileRows> = Vec::new();
    for p in sink.profiles {
        let key = (bases[p.series], p.timestamp);
        match of_target.get(&key) {
            Some(&at) => profiles[at].stacks.extend(p.stacks),
            None => {
                of_target.insert(key, profiles.len());
                profiles.push(ProfileRows { series: key.0, ..p });
            }
        }
    }
    for p in &mut profiles {
        // One stack's rows of a profile (split over blocks, over symbol partitions' ids,
        // or over its label sets) summed, zero sums left out.
        p.stacks.sort_unstable_by_key(|(id, _)| *id);
        p.stacks.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 = kept.1.saturating_add(next.1);
            }
            same
        });
        p.stacks.retain(|(_, v)| *v != 0);
    }
    profiles.retain(|p| !p.stacks.is_empty());
    profiles.sort_unstable_by_key(|p| (p.series, p.timestamp));
    Ok(ProfileStacks {
        series: read.sets,
        profiles,
        period: read.period,
        rows: read.rows,
        blocks_failed: read.blocks_failed,
    })
}

/// One profile of [`stacks_by_profile`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileRows {
    /// Its series: an index into [`ProfileStacks::series`].
    pub series: usize,
    /// Its time (ms).
    pub timestamp: i64,
    /// `(stack id, value)`, ids ascending, zero values left out.
    pub stacks: Vec<(u64, i64)>,
}

/// What [`stacks_by_profile`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileStacks {
    /// The label sets of the profiles' series.
    pub series: Vec<LabelSet>,
    /// The profiles, by series and time.
    pub profiles: Vec<ProfileRows>,
    /// The largest sampling period among the rows.
    pub period: i64,
    /// Rows read.
    pub rows: usize,
    /// Blocks a lenient read skipped.
    pub blocks_failed: usize,
}

/// What takes the rows [`walk_series_rows`] reads.
trait RowSink {
    /// A row of series `set` (numbered from 0 in the order first read), time `t`.
    fn row(&mut self, set: usize, t: i64, stack: u64, value: i64);
    /// The bytes held so far, reserved from the read's memory pool.
    fn bytes(&self) -> usize;
}

/// What [`walk_series_rows`] read besides what its sink kept.
struct SeriesRows {
    /// Each series' label set, by its number.
    sets: Vec<LabelSet>,
    period: i64,
    rows: usize,
    blocks_failed: usize,
    /// What the sink and the label sets hold, reserved: kept by the caller while it holds
    /// them (and grown for what it makes of them).
    held: MemoryReservation,
}

/// About what a label set holds beside its strings' bytes (its vector, each pair's two
/// strings, a map entry).
const LABEL_SET_BYTES: usize = 96;
const LABEL_BYTES: usize = 48;

/// Reads the raw rows `selector` selects in `range` with their series' labels, giving each
/// to `sink`; what the sink holds is reserved from `pool` after each batch (`what` names
/// the reservation).
fn walk_series_rows(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
    what: &'static str,
    sink: &mut impl RowSink,
) -> Result<SeriesRows> {
    let mut out = SeriesRows {
        sets: Vec::new(),
        period: 0,
        rows: 0,
        blocks_failed: 0,
        held: MemoryConsumer::new(what).register(pool),
    };
    if snapshot.schema().index_of(STACKTRACE_ID).is_none() {
        return Ok(out);
    }
    let labels = label_names_of(snapshot);
    let mut columns: Vec<String> = [STACKTRACE_ID, VALUE, PERIOD, TIMESTAMP]
        .map(str::to_owned)
        .to_vec();
    columns.extend(labels.iter().map(|l| label_column(l)));
    let request = ScanRequest::new()
        .project(columns.iter())
        .filter(predicate(snapshot, selector, range))
        .lenient(lenient);
    // The label sets, twice each (the map's key, the list), charged as each is made: ten
    // thousand series of long labels were gigabytes no reservation saw.
    let mut set_bytes = 0usize;
    let mut set_ids: std::collections::HashMap<LabelSet, usize> = Default::default();
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        out.rows += batch.num_rows();
        let int = |c: usize, what: &str| {
            batch
                .column(c)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| Error::Internal(format!("{what} is not Int64")))
        };
        let ids = batch
            .column(0)
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| Error::Internal("stacktrace_id is not UInt64".into()))?;
        let (values, periods, times) = (int(1, VALUE)?, int(2, PERIOD)?, int(3, TIMESTAMP)?);
        if let Some(max) = arrow::compute::max(periods) {
            out.period = out.period.max(max);
        }
        let strings = (4..columns.len())
            .map(|c| Strings::of(batch.column(c).as_ref()))
            .collect::<frostdb_core::Result<Vec<_>>>()?;
        // Rows of one series are adjacent (the sort order): its set is looked up once a run.
        let mut last: Option<(Vec<Option<usize>>, usize)> = None;
        let mut keys: Vec<Option<usize>> = Vec::with_capacity(strings.len());
        for i in 0..batch.num_rows() {
            if !ids.is_valid(i) || !values.is_valid(i) {
                continue;
            }
            keys.clear();
            keys.extend(strings.iter().map(|s| s.key(i)));
            let set = match &last {
                Some((k, set)) if *k == keys => *set,
                _ => {
                    let of: LabelSet = labels
                        .iter()
                        .zip(&strings)
                        .zip(&keys)
                        .filter_map(|((name, s), k)| {
                            Some((name.clone(), s.value((*k)?).to_owned()))
                        })
                        .collect();
                    let set = match set_ids.get(&of) {
                        Some(&set) => set,
                        None => {
                            let bytes = 2 * of
                                .iter()
                                .map(|(k, v)| k.len() + v.len() + LABEL_BYTES)
                                .fold(LABEL_SET_BYTES, usize::saturating_add);
                            out.held.try_grow(bytes)?;
                            set_bytes = set_bytes.saturating_add(bytes);
                            set_ids.insert(of.clone(), out.sets.len());
                            out.sets.push(of);
                            out.sets.len() - 1
                        }
                    };
                    last = Some((keys.clone(), set));
                    set
                }
            };
            sink.row(set, times.value(i), ids.value(i), values.value(i));
        }
        out.held
            .try_resize(sink.bytes().saturating_add(set_bytes))?;
    }
    // The map's copies go with it.
    drop(set_ids);
    out.held.resize(sink.bytes().saturating_add(set_bytes / 2));
    out.blocks_failed = scan.metrics().blocks_failed;
    Ok(out)
}

/// What [`merge_stacks_by_series`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesStacks {
    /// Per label set, in label order, `(stack id, summed value)`, ids ascending, zero sums
    /// left out.
    pub series: Vec<(LabelSet, Vec<(u64, i64)>)>,
    /// The stacks of every label set together, `(stack id, value)`, ids ascending, zeros
    /// left out: averages summed before they are rounded (each series' own are rounded).
    pub merged: Vec<(u64, i64)>,
    /// The largest sampling period among the rows.
    pub period: i64,
    /// Rows read.
    pub rows: usize,
    /// Blocks a lenient read skipped.
    pub blocks_failed: usize,
}

/// Range: the value summed per series and per `step_ms` bucket of time (buckets start at
/// multiples of the step), for the rows `selector` selects in `range`. With `group_by`,
/// series are the distinct values of those labels; without, every label set is a series.
pub fn range(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    step_ms: i64,
    group_by: Option<&[String]>,
) -> Result<Vec<Series>> {
    let pool: Arc<dyn MemoryPool> =
        Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default());
    Ok(range_counted(snapshot, selector, range, step_ms, group_by, false, &pool)?.0)
}

/// About what a range holds a point in while it is read (a hash map entry of a series and
/// bucket, and its sum), and then in its answer.
const RANGE_POINT_BYTES: usize = 64;

/// Bytes a range holds for each profile of a group it has counted (a set entry).
const PROFILE_SEEN_BYTES: usize = 32;

/// [`range()`], `lenient` or not: a lenient scan skips blocks it cannot read, and the count
/// of those comes with the series (always 0 when strict, which fails instead). The points
/// are reserved from `pool` as they are made, batch by batch: a range is a point per series
/// and step, which over all of time with a short step is a point per profile stored.
pub fn range_counted(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    step_ms: i64,
    group_by: Option<&[String]>,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<(Vec<Series>, usize)> {
    let reservation = MemoryConsumer::new("range points").register(pool);
    let step = step_ms.max(1);
    let present = label_names_of(snapshot);
    let labels: Vec<String> = match group_by {
        // Each once (a scan projects a column once): a label named twice groups as once.
        Some(g) => {
            let mut seen = std::collections::HashSet::new();
            g.iter()
                .filter(|l| present.contains(l) && seen.insert(l.as_str()))
                .cloned()
                .collect()
        }
        None => present,
    };
    let mut columns: Vec<String> = labels.iter().map(|l| label_column(l)).collect();
    columns.extend([TIMESTAMP.to_owned(), VALUE.to_owned()]);
    // Grouped, which profile each row is of: rows of one time in a group are one profile's
    // (its sample label sets) or several's (pods profiled at once). Totals stored before
    // the key have none: their profiles of one time in a group count as one.
    let keyed = group_by.is_some() && snapshot.schema().index_of(PROFILE_KEY).is_some();
    if keyed {
        columns.push(PROFILE_KEY.to_owned());
    }
    let request = ScanRequest::new()
        .project(columns)
        .filter(predicate(snapshot, selector, range))
        .lenient(lenient);
    // Each series' labels once: the (position in `labels`, value) of those it has. A tenant
    // may hold 1,000 label names, and a series has at most a few dozen of them.
    let mut groups: std::collections::HashMap<Vec<(u32, String)>, u32> = Default::default();
    // What the groups hold, charged as each is made (not per batch: one batch may make
    // thousands of groups of kilobytes each).
    let mut group_bytes = 0usize;
    let mut sums: std::collections::HashMap<(u32, i64), (i64, u64)> = Default::default();
    // The profiles (time and key) of each group seen so far.
    let mut profiles: std::collections::HashSet<(u32, i64, u64)> = Default::default();
    let n = labels.len();
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        let strings: Vec<Strings<'_>> = (0..n)
            .map(|i| Strings::of(batch.column(i).as_ref()))
            .collect::<frostdb_core::Result<_>>()?;
        let ts = batch
            .column(n)
            .as_primitive_opt::<arrow::datatypes::Int64Type>()
            .ok_or_else(|| Error::Internal("timestamp is not Int64".into()))?;
        let values = batch
            .column(n + 1)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Internal("value is not Int64".into()))?;
        let profile_keys = match keyed {
            true => Some(
                batch
                    .column_by_name(PROFILE_KEY)
                    .and_then(|c| c.as_primitive_opt::<UInt64Type>())
                    .ok_or_else(|| Error::Internal("profile_key is not UInt64".into()))?,
            ),
            false => None,
        };
        let mut last_keys: Vec<Option<usize>> = vec![None; n];
        let mut group = u32::MAX;
        // Rows come sorted by series and time: runs share a (group, bucket).
        let mut run: Option<((u32, i64), i64, u64)> = None;
        for i in 0..batch.num_rows() {
            if values.is_null(i) || ts.is_null(i) {
                continue;
            }
            let mut changed = group == u32::MAX;
            for (k, s) in strings.iter().enumerate() {
                let key = s.key(i);
                if key != last_keys[k] {
                    last_keys[k] = key;
                    changed = true;
                }
            }
            if changed {
                let tuple: Vec<(u32, String)> = strings
                    .iter()
                    .zip(&last_keys)
                    .enumerate()
                    .filter_map(|(j, (s, k))| k.map(|k| (j as u32, s.value(k).to_owned())))
                    .collect();
                group = match groups.get(&tuple) {
                    Some(g) => *g,
                    None => {
                        let g = groups.len() as u32;
                        let bytes = RANGE_POINT_BYTES
                            + tuple.iter().map(|(_, v)| 32 + v.len()).sum::<usize>();
                        reservation.try_grow(bytes)?;
                        group_bytes += bytes;
                        groups.insert(tuple, g);
                        g
                    }
                };
            }
            let t = ts.value(i);
            let bucket = t - t.rem_euclid(step);
            let key = (group, bucket);
            // A profile is counted once in its group: a pprof sample label makes another
            // label set, and another totals row, of the same profile. (Ungrouped, a label
            // set is a series, and has a row a profile.)
            let profile = match group_by {
                None => 1,
                Some(_) => {
                    let key = profile_keys
                        .filter(|k| k.is_valid(i))
                        .map_or(0, |k| k.value(i));
                    u64::from(profiles.insert((group, t, key)))
                }
            };
            match &mut run {
                Some((k, v, n)) if *k == key => {
                    *v = v.saturating_add(values.value(i));
                    *n += profile;
                }
                _ => {
                    if let Some((k, v, n)) = run.take() {
                        let sum = sums.entry(k).or_default();
                        sum.0 = sum.0.saturating_add(v);
                        sum.1 += n;
                    }
                    run = Some((key, values.value(i), profile));
                }
            }
        }
        if let Some((k, v, n)) = run {
            let sum = sums.entry(k).or_default();
            sum.0 = sum.0.saturating_add(v);
            sum.1 += n;
        }
        let held = sums
            .len()
            .saturating_mul(RANGE_POINT_BYTES)
            .saturating_add(profiles.len().saturating_mul(PROFILE_SEEN_BYTES))
            .saturating_add(group_bytes);
        if held > reservation.size() {
            reservation.try_grow(held - reservation.size())?;
        }
    }
    let mut series: Vec<Series> = (0..groups.len())
        .map(|_| Series {
            labels: Vec::new(),
            points: Vec::new(),
            rows: Vec::new(),
        })
        .collect();
    for (tuple, g) in groups {
        series[g as usize].labels = tuple
            .into_iter()
            .map(|(j, v)| (labels[j as usize].clone(), v))
            .collect();
    }
    let mut points: Vec<Vec<(i64, i64, u64)>> = vec![Vec::new(); series.len()];
    for ((g, bucket), (v, n)) in sums {
        points[g as usize].push((bucket, v, n));
    }
    for (s, mut points) in series.iter_mut().zip(points) {
        points.sort_unstable();
        s.points = points.iter().map(|&(t, v, _)| (t, v)).collect();
        s.rows = points.iter().map(|&(.., n)| n).collect();
    }
    series.retain(|s| !s.points.is_empty());
    series.sort_by(|a, b| a.labels.cmp(&b.labels));
    Ok((series, scan.metrics().blocks_failed))
}

/// The distinct timestamps (ms, ascending) of the rows `selector` selects in `range`,
/// `lenient` or not (see [`range_counted`]), with the count of blocks a lenient scan skipped.
pub fn timestamps_counted(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<(Vec<i64>, usize)> {
    // A time per stored profile over all of time: reserved from the pool as they are
    // found, batch by batch (a set entry, then the answer's and its JSON's share).
    let reservation = MemoryConsumer::new("profile timestamps").register(pool);
    let request = ScanRequest::new()
        .project([TIMESTAMP])
        .filter(predicate(snapshot, selector, range))
        .lenient(lenient);
    let mut seen = std::collections::BTreeSet::new();
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        let ts = batch
            .column(0)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Internal("timestamp is not Int64".into()))?;
        seen.extend(ts.iter().flatten());
        let held = seen.len().saturating_mul(RANGE_POINT_BYTES);
        if held > reservation.size() {
            reservation.try_grow(held - reservation.size())?;
        }
    }
    Ok((seen.into_iter().collect(), scan.metrics().blocks_failed))
}

/// `batch`'s columns by name. Arrow's `column_by_name` compares names one by one, which for
/// each of a series index's thousands of label columns costs their square.
fn columns_by_name(batch: &RecordBatch) -> std::collections::HashMap<&str, &ArrayRef> {
    batch
        .schema_ref()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .zip(batch.columns())
        .collect()
}

/// A series' labels: `(column, value)` pairs.
pub type LabelSet = Vec<(String, String)>;

/// The label sets of the series `selector` selects in `range` of a series index: each as
/// `(column, value)` pairs; `None` when there are more than `limit`.
pub fn series_of(
    index: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    limit: usize,
) -> Result<Option<Vec<LabelSet>>> {
    let columns: Vec<String> = label_names_of(index)
        .into_iter()
        .map(|n| label_column(&n))
        .collect();
    let request = ScanRequest::new()
        .project(columns.iter())
        .filter(predicate(index, selector, range));
    let mut out: std::collections::BTreeSet<LabelSet> = Default::default();
    for batch in index.scan(&request)? {
        let batch = batch?;
        let by_name = columns_by_name(&batch);
        let strings = columns
            .iter()
            .map(|c| {
                by_name
                    .get(c.as_str())
                    .map(|a| Strings::of(a.as_ref()))
                    .transpose()
            })
            .collect::<frostdb_core::Result<Vec<_>>>()?;
        for i in 0..batch.num_rows() {
            let set: Vec<(String, String)> = columns
                .iter()
                .zip(&strings)
                .filter_map(|(c, s)| {
                    let s = s.as_ref()?;
                    Some((c.clone(), s.value(s.key(i)?).to_owned()))
                })
                .collect();
            out.insert(set);
            if out.len() > limit {
                return Ok(None);
            }
        }
    }
    Ok(Some(out.into_iter().collect()))
}

/// Whether the snapshot's table has the profile type columns.
fn has_type_columns(snapshot: &Snapshot) -> bool {
    PROFILE_TYPE
        .iter()
        .all(|p| snapshot.schema().index_of(p).is_some())
}

/// One series as listed: its profile type and labels (`(name, value)`, `labels.` left off,
/// in name order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeriesLabels {
    /// The profile type.
    pub profile_type: ProfileType,
    /// The labels.
    pub labels: LabelSet,
}

/// Each distinct profile type and label set `selector` selects in `range`, sorted: with
/// `only`, the labels left are those named (and series equal in them are one).
pub fn series_labels(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    only: Option<&[String]>,
) -> Result<Vec<SeriesLabels>> {
    let pool: Arc<dyn MemoryPool> =
        Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default());
    Ok(series_labels_counted(snapshot, selector, range, only, false, &pool)?.0)
}

/// [`series_labels`], `lenient` or not, with the count of blocks a lenient scan skipped.
/// Each distinct series' copies are reserved from `pool` as they are made: a tenant of
/// 10,000 series of 30 labels of 2 KiB values is 600 MB of them.
pub fn series_labels_counted(
    snapshot: &Snapshot,
    selector: &Selector,
    range: TimeRange,
    only: Option<&[String]>,
    lenient: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<(Vec<SeriesLabels>, usize)> {
    let reservation = MemoryConsumer::new("series labels").register(pool);
    if !has_type_columns(snapshot) {
        return Ok((Vec::new(), 0));
    }
    let labels: Vec<String> = label_names_of(snapshot)
        .into_iter()
        .filter(|l| only.is_none_or(|o| o.contains(l)))
        .collect();
    let mut columns: Vec<String> = PROFILE_TYPE.iter().map(|p| (*p).to_owned()).collect();
    columns.extend(labels.iter().map(|l| label_column(l)));
    let request = ScanRequest::new()
        .project(columns.iter())
        .filter(predicate(snapshot, selector, range))
        .lenient(lenient);
    let mut out: std::collections::BTreeSet<SeriesLabels> = Default::default();
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        let strings = (0..columns.len())
            .map(|c| Strings::of(batch.column(c).as_ref()))
            .collect::<frostdb_core::Result<Vec<_>>>()?;
        let mut last: Option<Vec<Option<usize>>> = None;
        for i in 0..batch.num_rows() {
            let keys: Vec<Option<usize>> = strings.iter().map(|s| s.key(i)).collect();
            if last.as_ref() == Some(&keys)
                || keys[..PROFILE_TYPE.len()].iter().any(Option::is_none)
            {
                continue;
            }
            let part = |c: usize| strings[c].value(keys[c].expect("checked")).to_owned();
            let new = out.insert(SeriesLabels {
                profile_type: ProfileType {
                    name: part(0),
                    sample_type: part(1),
                    sample_unit: part(2),
                    period_type: part(3),
                    period_unit: part(4),
                    delta: false,
                },
                labels: labels
                    .iter()
                    .enumerate()
                    .filter_map(|(l, name)| {
                        let c = PROFILE_TYPE.len() + l;
                        keys[c].map(|k| (name.clone(), strings[c].value(k).to_owned()))
                    })
                    .collect(),
            });
            if new {
                // A series' bytes, and a set entry's share, reserved once it is kept (a row
                // of a series seen already is dropped).
                let bytes: usize = (0..columns.len())
                    .filter_map(|c| keys[c].map(|k| strings[c].value(k).len() + 48))
                    .sum();
                reservation.try_grow(bytes + 64)?;
            }
            last = Some(keys);
        }
    }
    Ok((out.into_iter().collect(), scan.metrics().blocks_failed))
}

/// The profile types of the rows in `range`, sorted.
pub fn profile_types(snapshot: &Snapshot, range: TimeRange) -> Result<Vec<ProfileType>> {
    Ok(profile_types_counted(snapshot, range, false)?.0)
}

/// [`profile_types`], `lenient` or not, with the count of blocks a lenient scan skipped.
pub fn profile_types_counted(
    snapshot: &Snapshot,
    range: TimeRange,
    lenient: bool,
) -> Result<(Vec<ProfileType>, usize)> {
    if !has_type_columns(snapshot) {
        return Ok((Vec::new(), 0));
    }
    let request = ScanRequest::new()
        .project(PROFILE_TYPE)
        .filter(predicate(snapshot, &Selector::default(), range))
        .lenient(lenient);
    let mut out: std::collections::BTreeSet<[String; 5]> = Default::default();
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        let columns = (0..PROFILE_TYPE.len())
            .map(|c| Strings::of(batch.column(c).as_ref()))
            .collect::<frostdb_core::Result<Vec<_>>>()?;
        let mut last: Option<[Option<usize>; 5]> = None;
        for i in 0..batch.num_rows() {
            let keys: [Option<usize>; 5] = std::array::from_fn(|c| columns[c].key(i));
            if last == Some(keys) || keys.iter().any(Option::is_none) {
                continue;
            }
            last = Some(keys);
            out.insert(std::array::from_fn(|c| {
                columns[c].value(keys[c].expect("checked")).to_owned()
            }));
        }
    }
    let types = out
        .into_iter()
        .map(
            |[name, sample_type, sample_unit, period_type, period_unit]| ProfileType {
                name,
                sample_type,
                sample_unit,
                period_type,
                period_unit,
                delta: false,
            },
        )
        .collect();
    Ok((types, scan.metrics().blocks_failed))
}

/// The names of the labels the rows `selector` (if any) selects in `range` have, sorted.
pub fn label_names(
    snapshot: &Snapshot,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<Vec<String>> {
    Ok(label_names_counted(snapshot, selector, range, false)?.0)
}

/// [`label_names`], `lenient` or not, with the count of blocks a lenient scan skipped.
pub fn label_names_counted(
    snapshot: &Snapshot,
    selector: Option<&Selector>,
    range: TimeRange,
    lenient: bool,
) -> Result<(Vec<String>, usize)> {
    let names = label_names_of(snapshot);
    if names.is_empty() {
        return Ok((names, 0));
    }
    let everything = Selector::default();
    let filter = predicate(snapshot, selector.unwrap_or(&everything), range);
    let columns: Vec<String> = names.iter().map(|n| label_column(n)).collect();
    let request = ScanRequest::new()
        .project(columns.iter())
        .filter(filter)
        .lenient(lenient);
    let mut present = vec![false; names.len()];
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        let by_name = columns_by_name(&batch);
        for (i, column) in columns.iter().enumerate() {
            if !present[i]
                && let Some(c) = by_name.get(column.as_str())
            {
                present[i] = c.null_count() < c.len();
            }
        }
        if present.iter().all(|p| *p) {
            break;
        }
    }
    let present = names
        .into_iter()
        .zip(present)
        .filter_map(|(n, p)| p.then_some(n))
        .collect();
    Ok((present, scan.metrics().blocks_failed))
}

/// The distinct values of label `name` in the rows `selector` (if any) selects in `range`,
/// sorted.
pub fn label_values(
    snapshot: &Snapshot,
    name: &str,
    selector: Option<&Selector>,
    range: TimeRange,
) -> Result<Vec<String>> {
    Ok(label_values_counted(snapshot, name, selector, range, false)?.0)
}

/// [`label_values`], `lenient` or not, with the count of blocks a lenient scan skipped.
pub fn label_values_counted(
    snapshot: &Snapshot,
    name: &str,
    selector: Option<&Selector>,
    range: TimeRange,
    lenient: bool,
) -> Result<(Vec<String>, usize)> {
    let column = label_column(name);
    if snapshot.schema().index_of(&column).is_none() {
        return Ok((Vec::new(), 0));
    }
    let everything = Selector::default();
    let filter = predicate(snapshot, selector.unwrap_or(&everything), range)
        .and(col(column.as_str()).is_not_null());
    let request = ScanRequest::new()
        .project([column.as_str()])
        .filter(filter)
        .lenient(lenient);
    let mut out: std::collections::BTreeSet<String> = Default::default();
    let mut scan = snapshot.scan(&request)?;
    for batch in scan.by_ref() {
        let batch = batch?;
        let strings = Strings::of(batch.column(0).as_ref())?;
        let mut last = None;
        for i in 0..batch.num_rows() {
            let key = strings.key(i);
            if key.is_some() && key != last {
                last = key;
                if let Some(k) = key
                    && !out.contains(strings.value(k))
                {
                    out.insert(strings.value(k).to_owned());
                }
            }
        }
    }
    Ok((out.into_iter().collect(), scan.metrics().blocks_failed))
}
