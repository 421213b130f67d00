//! Rollups: per series, per hour and per day, the summed value of each stack, kept by a
//! background pass and read by merges over long ranges.
//!
//! A week's merge of raw samples reads every sample row of the week; a merge that reads the
//! hourly rollups of the whole hours in its range, the daily ones of the whole days, and raw
//! samples only at the edges reads what the series *held*, not what they were sent, and gives
//! the same answer. A pass (run by the database's maintenance worker, or on request) rolls up
//! every hour that ended [`RollupOptions::delay`] ago, then every day whose hours are all
//! rolled up, each bucket as one transaction holding its rollup rows and its row in
//! [`schema::ROLLUP_BUCKETS`]. Rollup tables have the samples' columns, and blocks like any
//! table, and are expired by their own retention.
//!
//! # Late samples
//!
//! A profile may arrive for an hour already rolled up (a client catching up after an outage).
//! Its sample rows are then written, in the same transaction, to the rollup of every level
//! whose bucket holds them, so the rollup stays the sum of its bucket's raw rows. The check and
//! the submission of each group of samples happen under one lock with the pass's bookkeeping:
//! a pass waits for the last group submitted before it (so its snapshot holds it), records the
//! hours written by later groups while it aggregates, and commits a bucket only if none was
//! written meanwhile (a later pass retries it). A bucket is marked for late writes when its
//! transaction is submitted (they follow it in the WAL) and read by merges once it is visible.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch, UInt32Array, UInt64Array,
};
use arrow::datatypes::{Field, Int64Type, Schema as ArrowSchema, UInt64Type};
use arrow::row::{RowConverter, SortField};
use frostdb_core::{Db, ScanRequest, Snapshot, Submitted, Table, TableOptions, col};
use frostdb_profile::TimeRange;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::schema;
use crate::schema::column::{DURATION, PERIOD, STACKTRACE_ID, TIMESTAMP, VALUE};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// How a store keeps rollups.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `enabled` | true | passes roll up closed hours and days, and merges read them |
/// | `delay` | 10 minutes | an hour (day) is rolled up this long after it ends |
/// | `hourly_retention` | the samples' | how long hourly rollups are kept |
/// | `daily_retention` | the samples' | how long daily rollups are kept |
#[derive(Debug, Clone)]
pub struct RollupOptions {
    /// Whether passes roll up and merges read rollups.
    pub enabled: bool,
    /// How long after its end an hour or a day is rolled up (profiles of it arriving later
    /// are still counted: they are added to its rollup).
    pub delay: Duration,
    /// How long hourly rollups are kept (`None`: as long as samples).
    pub hourly_retention: Option<Duration>,
    /// How long daily rollups are kept (`None`: as long as samples).
    pub daily_retention: Option<Duration>,
}

impl RollupOptions {
    /// How long anything is kept, rollups (when on) or `samples`: `None` for ever.
    pub(crate) fn kept_longest(&self, samples: Option<Duration>) -> Option<Duration> {
        match self.enabled {
            true => self.longest_kept(samples),
            false => samples,
        }
    }

    /// How long the longest-kept rollups are kept, beside samples kept `samples` (`None`:
    /// some are kept forever).
    pub(crate) fn longest_kept(&self, samples: Option<Duration>) -> Option<Duration> {
        let hourly = self.hourly_retention.or(samples);
        let daily = self.daily_retention.or(samples);
        Some(samples?.max(hourly?).max(daily?))
    }
}

impl Default for RollupOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            delay: Duration::from_secs(600),
            hourly_retention: None,
            daily_retention: None,
        }
    }
}

/// What one pass rolled up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollupSummary {
    /// Hours rolled up.
    pub hours: usize,
    /// Days rolled up.
    pub days: usize,
    /// Rows read from their sources (samples for hours, hourly rollups for days).
    pub rows_read: usize,
    /// Rollup rows written.
    pub rows_written: usize,
    /// Buckets left for a later pass because samples of them were written meanwhile.
    pub deferred: usize,
    /// Buckets left for later passes because this one rolled up its most
    /// ([`MAX_BUCKETS_PER_PASS`] a level, the newest first).
    pub left: usize,
}

/// Buckets of one level a pass rolls up at most (each a scan and a durable write, on a
/// thread other tenants' persistence shares): profiles back-dated an hour apart across
/// decades made one pass of hundreds of thousands. The rest wait for the next passes.
pub const MAX_BUCKETS_PER_PASS: usize = 256;

/// One level of rollups: its bucket and table.
struct Level {
    name: &'static str,
    bucket_ms: i64,
    table: Table,
    retention: Option<Duration>,
}

/// Which buckets the rollups hold, and what a pass in progress must know.
#[derive(Default)]
pub(crate) struct Coverage {
    /// Per level, buckets whose rollup is submitted: samples written in them later are
    /// written to the rollup too.
    written: [BTreeSet<i64>; 2],
    /// Per level, buckets whose rollup is visible: merges read those.
    readable: [BTreeSet<i64>; 2],
    /// While a pass aggregates: the hours samples were written in since its snapshot.
    touched: Option<BTreeSet<i64>>,
    /// The last group of samples submitted (a pass waits for it before its snapshot).
    last: Option<Arc<Submitted>>,
}

/// Where a piece of a merge's range is read from.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    /// The rollup snapshot to read, `None` for raw samples.
    pub(crate) rollup: Option<Snapshot>,
    pub(crate) range: TimeRange,
}

/// The rollups of a store.
pub(crate) struct Rollups {
    db: Db,
    samples: Table,
    series_index: Table,
    levels: [Level; 2],
    buckets: Table,
    state: Mutex<Coverage>,
    /// One pass at a time.
    pass: Mutex<()>,
    options: RollupOptions,
}

impl std::fmt::Debug for Rollups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("Rollups")
            .field("hours", &state.readable[0].len())
            .field("days", &state.readable[1].len())
            .finish_non_exhaustive()
    }
}

/// The bucket of `t` for buckets of `len` milliseconds.
fn bucket(t: i64, len: i64) -> i64 {
    t.div_euclid(len) * len
}

fn timestamps(batch: &RecordBatch) -> Result<&Int64Array> {
    batch
        .column_by_name(TIMESTAMP)
        .and_then(|c| c.as_primitive_opt::<Int64Type>())
        .ok_or_else(|| Error::Corrupt("sample rows without Int64 timestamps".into()))
}

impl Rollups {
    /// The tables of the rollups, hourly and daily: their rows refer to stacks.
    pub(crate) fn tables(&self) -> Vec<Table> {
        self.levels.iter().map(|l| l.table.clone()).collect()
    }

    /// Opens the rollup tables of `db` and reads which buckets they hold (`read_only`: a
    /// follower's store, which sets no retention).
    pub(crate) fn open(
        db: &Db,
        samples: &Table,
        series_index: &Table,
        table_options: &TableOptions,
        samples_retention: Option<Duration>,
        options: RollupOptions,
        read_only: bool,
    ) -> Result<Self> {
        let set_ttl = |table: &Table, ttl| {
            if read_only {
                Ok(())
            } else {
                table.set_ttl(ttl)
            }
        };
        let level = |name: &'static str, bucket_ms, retention: Option<Duration>| {
            let table = schema::open_series_table(db, name, table_options.clone())?;
            let retention = retention.or(samples_retention);
            set_ttl(&table, retention)?;
            Ok::<_, Error>(Level {
                name,
                bucket_ms,
                table,
                retention,
            })
        };
        let levels = [
            level(schema::ROLLUPS_HOURLY, HOUR_MS, options.hourly_retention)?,
            level(schema::ROLLUPS_DAILY, DAY_MS, options.daily_retention)?,
        ];
        let buckets = db.table(
            schema::ROLLUP_BUCKETS,
            schema::rollup_buckets(),
            TableOptions::default(),
        )?;
        // A bucket's row is kept as long as the longest-kept rollups; a merge checks each
        // level's retention before it reads a bucket.
        let longest = levels
            .iter()
            .map(|l| l.retention)
            .try_fold(Duration::ZERO, |a, r| r.map(|r| a.max(r)));
        set_ttl(&buckets, longest)?;
        let coverage = Self::coverage(&levels, &buckets)?;
        Ok(Self {
            db: db.clone(),
            samples: samples.clone(),
            series_index: series_index.clone(),
            levels,
            buckets,
            state: Mutex::new(coverage),
            pass: Mutex::new(()),
            options,
        })
    }

    /// The buckets the rollup tables hold, from their bucket table.
    fn coverage(levels: &[Level; 2], buckets: &Table) -> Result<Coverage> {
        let mut coverage = Coverage::default();
        for batch in buckets
            .snapshot()
            .scan(&ScanRequest::new().project(["level", TIMESTAMP]))?
        {
            let batch = batch?;
            let names = arrow::compute::cast(
                batch
                    .column_by_name("level")
                    .ok_or_else(|| Error::Corrupt("rollup buckets without a level".into()))?,
                &arrow::datatypes::DataType::Utf8,
            )?;
            let names = names.as_string::<i32>();
            let times = timestamps(&batch)?;
            for i in 0..batch.num_rows() {
                let Some(at) = levels.iter().position(|l| l.name == names.value(i)) else {
                    return Err(Error::Corrupt(format!(
                        "rollup bucket of an unknown level {:?}",
                        names.value(i)
                    )));
                };
                coverage.written[at].insert(times.value(i));
            }
        }
        coverage.readable = coverage.written.clone();
        Ok(coverage)
    }

    /// Reads which buckets the rollup tables hold again (a follower's store, after its
    /// database took the writer's new blocks).
    pub(crate) fn reload(&self) -> Result<()> {
        let coverage = Self::coverage(&self.levels, &self.buckets)?;
        *self.state.lock() = coverage;
        Ok(())
    }

    /// Whether merges read rollups.
    pub(crate) fn enabled(&self) -> bool {
        self.options.enabled
    }

    /// Submits `tx`, which writes `samples` to the samples table: first adds the rows of
    /// `samples` that fall in rolled-up buckets to those rollups, and notes the hours written
    /// for a pass in progress.
    pub(crate) fn submit(
        &self,
        mut tx: frostdb_core::Transaction,
        samples: &RecordBatch,
    ) -> Result<Arc<Submitted>> {
        let mut state = self.state.lock();
        let times = timestamps(samples)?;
        if let Some(touched) = &mut state.touched {
            let mut last = None;
            for &t in times.values() {
                let hour = bucket(t, HOUR_MS);
                if last != Some(hour) {
                    touched.insert(hour);
                    last = Some(hour);
                }
            }
        }
        for (at, level) in self.levels.iter().enumerate() {
            if let Some(rows) = late_rows(&state.written[at], level.bucket_ms, samples, times)? {
                tx.insert(&level.table, &rows)?;
            }
        }
        let submitted = Arc::new(tx.submit()?);
        state.last = Some(submitted.clone());
        Ok(submitted)
    }

    /// Where to read each part of `range` from at `now_ms`: the visible daily and hourly
    /// rollups of the whole days and hours in it, raw samples for the rest (`rollup: None`).
    pub(crate) fn plan(&self, range: TimeRange, now_ms: i64) -> Vec<Piece> {
        let whole = vec![(range.start_ms, range.end_ms)];
        if !self.options.enabled {
            return pieces(None, whole);
        }
        let readable = self.state.lock().readable.clone();
        // Snapshots after the buckets were read: their rows are visible in them.
        let mut out = Vec::new();
        let mut rest = whole;
        for (at, level) in self.levels.iter().enumerate().rev() {
            let usable_from = level
                .retention
                .map_or(i64::MIN, |r| now_ms.saturating_sub(r.as_millis() as i64));
            let (used, left) = split(&rest, &readable[at], level.bucket_ms, usable_from);
            if !used.is_empty() {
                out.extend(pieces(Some(level.table.snapshot()), used));
            }
            rest = left;
        }
        out.extend(pieces(None, rest));
        out
    }

    /// Rolls up every hour that ended `delay` before `now_ms` and is not rolled up, then every
    /// such day whose hours all are.
    pub(crate) fn run_pass(&self, now_ms: i64) -> Result<RollupSummary> {
        let mut summary = RollupSummary::default();
        if !self.options.enabled {
            return Ok(summary);
        }
        let _one = self.pass.lock();
        let last = {
            let mut state = self.state.lock();
            state.touched = Some(BTreeSet::new());
            state.last.clone()
        };
        struct Untouch<'a>(&'a Mutex<Coverage>);
        impl Drop for Untouch<'_> {
            fn drop(&mut self) {
                self.0.lock().touched = None;
            }
        }
        let _untouch = Untouch(&self.state);
        // Every group submitted before is published once the last one is (in order); one
        // that failed is never visible.
        if let Some(last) = last {
            let _ = last.wait();
        }
        let closed_before = now_ms.saturating_sub(self.options.delay.as_millis() as i64);
        let hours = self.hours_with_samples()?;
        for at in 0..self.levels.len() {
            let len = self.levels[at].bucket_ms;
            let usable_from = self.levels[at]
                .retention
                .map_or(i64::MIN, |r| now_ms.saturating_sub(r.as_millis() as i64));
            let (done, hours_done) = {
                let state = self.state.lock();
                (state.written[at].clone(), state.written[0].clone())
            };
            let todo: BTreeSet<i64> = hours
                .iter()
                .map(|&h| bucket(h, len))
                .filter(|&b| b >= usable_from && b.saturating_add(len) <= closed_before)
                .filter(|b| !done.contains(b))
                // A day once its hours with samples are all rolled up.
                .filter(|&b| at == 0 || hours.range(b..b + len).all(|h| hours_done.contains(h)))
                .collect();
            summary.left += todo.len().saturating_sub(MAX_BUCKETS_PER_PASS);
            for b in todo.into_iter().rev().take(MAX_BUCKETS_PER_PASS) {
                match self.roll(at, b)? {
                    Some((read, written)) => {
                        if at == 0 {
                            summary.hours += 1;
                        } else {
                            summary.days += 1;
                        }
                        summary.rows_read += read;
                        summary.rows_written += written;
                    }
                    None => summary.deferred += 1,
                }
            }
        }
        if summary.hours + summary.days > 0 {
            tracing::info!(
                hours = summary.hours,
                days = summary.days,
                rows_read = summary.rows_read,
                rows_written = summary.rows_written,
                deferred = summary.deferred,
                left = summary.left,
                "rolled up closed hours and days"
            );
        }
        self.forget_expired(now_ms);
        Ok(summary)
    }

    /// Buckets past their level's retention are no longer read or written.
    fn forget_expired(&self, now_ms: i64) {
        let mut state = self.state.lock();
        let Coverage {
            written, readable, ..
        } = &mut *state;
        for (at, level) in self.levels.iter().enumerate() {
            if let Some(r) = level.retention {
                let cutoff = now_ms.saturating_sub(r.as_millis() as i64);
                written[at] = written[at].split_off(&cutoff);
                readable[at] = readable[at].split_off(&cutoff);
            }
        }
    }

    /// The hours the series index says have samples.
    fn hours_with_samples(&self) -> Result<BTreeSet<i64>> {
        let mut hours = BTreeSet::new();
        for batch in self
            .series_index
            .snapshot()
            .scan(&ScanRequest::new().project([TIMESTAMP]))?
        {
            let batch = batch?;
            hours.extend(
                timestamps(&batch)?
                    .values()
                    .iter()
                    .map(|&t| bucket(t, HOUR_MS)),
            );
        }
        Ok(hours)
    }

    /// Rolls up bucket `b` of level `at`: `(rows read, rows written)`, or `None` when samples
    /// of it were written while it was aggregated (a later pass retries).
    fn roll(&self, at: usize, b: i64) -> Result<Option<(usize, usize)>> {
        let level = &self.levels[at];
        let source = if at == 0 {
            self.samples.snapshot()
        } else {
            self.levels[at - 1].table.snapshot()
        };
        let (batches, read) = aggregate(&source, b, b + level.bucket_ms)?;
        let written: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let marker = RecordBatch::try_new(
            Arc::new(ArrowSchema::new(vec![
                Field::new("level", arrow::datatypes::DataType::Utf8, false),
                Field::new(TIMESTAMP, arrow::datatypes::DataType::Int64, false),
            ])),
            vec![
                Arc::new(arrow::array::StringArray::from(vec![level.name])),
                Arc::new(Int64Array::from(vec![b])),
            ],
        )?;
        let submitted = {
            let mut state = self.state.lock();
            if state
                .touched
                .as_ref()
                .is_some_and(|t| t.range(b..b + level.bucket_ms).next().is_some())
            {
                return Ok(None);
            }
            let mut tx = self.db.transaction();
            for batch in &batches {
                tx.insert(&level.table, batch)?;
            }
            tx.insert(&self.buckets, &marker)?;
            let submitted = tx.submit()?;
            state.written[at].insert(b);
            submitted
        };
        if let Err(e) = submitted.wait() {
            self.state.lock().written[at].remove(&b);
            return Err(e.into());
        }
        self.state.lock().readable[at].insert(b);
        Ok(Some((read, written)))
    }
}

/// `(rollup, range)` pieces from intervals.
fn pieces(rollup: Option<Snapshot>, intervals: Vec<Interval>) -> Vec<Piece> {
    intervals
        .into_iter()
        .map(|(start_ms, end_ms)| Piece {
            rollup: rollup.clone(),
            range: TimeRange { start_ms, end_ms },
        })
        .collect()
}

/// `[start, end)` in milliseconds.
type Interval = (i64, i64);

/// Splits `gaps` into the runs of `buckets` (of `len`, from `usable_from`) wholly inside them,
/// and what is left.
fn split(
    gaps: &[Interval],
    buckets: &BTreeSet<i64>,
    len: i64,
    usable_from: i64,
) -> (Vec<Interval>, Vec<Interval>) {
    let (mut used, mut rest) = (Vec::<Interval>::new(), Vec::new());
    for &(start, end) in gaps {
        let mut at = start;
        for &b in buckets.range(start.max(usable_from)..) {
            if b.saturating_add(len) > end {
                break;
            }
            if b > at {
                rest.push((at, b));
            }
            match used.last_mut() {
                Some(last) if last.1 == b => last.1 = b + len,
                _ => used.push((b, b + len)),
            }
            at = b + len;
        }
        if at < end {
            rest.push((at, end));
        }
    }
    (used, rest)
}

/// The rows of `samples` in buckets of `written` (of `len`), their timestamps set to the
/// bucket's start; `None` when there are none.
fn late_rows(
    written: &BTreeSet<i64>,
    len: i64,
    samples: &RecordBatch,
    times: &Int64Array,
) -> Result<Option<RecordBatch>> {
    let Some(&newest) = written.last() else {
        return Ok(None);
    };
    let min = arrow::compute::min(times).unwrap_or(i64::MAX);
    if bucket(min, len) > newest {
        return Ok(None); // the usual case: rows of hours not rolled up yet
    }
    let mut last = (i64::MIN, false);
    let mask: BooleanArray = times
        .values()
        .iter()
        .map(|&t| {
            let b = bucket(t, len);
            if b != last.0 {
                last = (b, written.contains(&b));
            }
            Some(last.1)
        })
        .collect();
    if mask.true_count() == 0 {
        return Ok(None);
    }
    let rows = arrow::compute::filter_record_batch(samples, &mask)?;
    let at = rows
        .schema()
        .index_of(TIMESTAMP)
        .map_err(|_| Error::Corrupt("sample rows without timestamps".into()))?;
    let mut columns = rows.columns().to_vec();
    columns[at] = Arc::new(timestamps(&rows)?.unary::<_, Int64Type>(|t| bucket(t, len)));
    Ok(Some(RecordBatch::try_new(rows.schema(), columns)?))
}

/// Rows of rollup output per insert.
const OUT_ROWS: usize = 256 * 1024;

/// Sums `source`'s rows with timestamps in `[start, end)` per series and stack: rows stamped
/// `start`, the value summed, period and duration the largest. Returns the rows and the
/// number of rows read.
fn aggregate(source: &Snapshot, start: i64, end: i64) -> Result<(Vec<RecordBatch>, usize)> {
    let schema = source.schema().arrow_schema().clone();
    let series: Vec<usize> = (0..schema.fields().len())
        .filter(|&i| {
            let name = schema.field(i).name();
            schema::is_series_column(name) && name != TIMESTAMP
        })
        .collect();
    if schema.index_of(STACKTRACE_ID).is_err() {
        return Ok((Vec::new(), 0));
    }
    let converter = RowConverter::new(
        series
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )?;
    // Series by their encoded labels; groups by stack, per series (a series' map is small
    // enough to stay in cache while its run of rows is summed).
    let mut series_ids: hashbrown::HashMap<Box<[u8]>, u32, foldhash::fast::RandomState> =
        Default::default();
    let mut series_rows = converter.empty_rows(0, 0);
    let mut groups: Vec<hashbrown::HashMap<u64, u32, foldhash::fast::RandomState>> = Vec::new();
    let (mut keys, mut sums, mut periods, mut durations) =
        (Vec::<(u32, u64)>::new(), Vec::new(), Vec::new(), Vec::new());
    let mut read = 0;
    let request =
        ScanRequest::new().filter(col(TIMESTAMP).gt_eq(start).and(col(TIMESTAMP).lt(end)));
    for batch in source.scan(&request)? {
        let batch = batch?;
        read += batch.num_rows();
        // The table's columns in the schema's order (a batch may lack label columns).
        let columns: Vec<ArrayRef> = series
            .iter()
            .map(|&i| {
                let field = schema.field(i);
                batch.column_by_name(field.name()).cloned().map_or_else(
                    || {
                        Ok(arrow::array::new_null_array(
                            field.data_type(),
                            batch.num_rows(),
                        ))
                    },
                    |c| arrow::compute::cast(&c, field.data_type()),
                )
            })
            .collect::<std::result::Result<_, _>>()?;
        let int = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .ok_or_else(|| Error::Corrupt(format!("rollup source rows without {name}")))
        };
        let (values, period, duration) = (int(VALUE)?, int(PERIOD)?, int(DURATION)?);
        let stacks = batch
            .column_by_name(STACKTRACE_ID)
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| Error::Corrupt("rollup source rows without stacktrace_id".into()))?;
        // Rows come sorted by series: each run of one series is found by comparing the
        // columns, and only its first row is encoded and looked up.
        let runs = crate::store::series_runs(&columns, batch.num_rows())?;
        let firsts = UInt32Array::from_iter_values(runs.iter().map(|r| r.start as u32));
        let firsts = columns
            .iter()
            .map(|c| arrow::compute::take(c.as_ref(), &firsts, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let run_rows = converter.convert_columns(&firsts)?;
        for (r, run) in runs.into_iter().enumerate() {
            let row = run_rows.row(r);
            let next = series_ids.len() as u32;
            let id = *series_ids.entry(row.as_ref().into()).or_insert_with(|| {
                series_rows.push(row);
                groups.push(Default::default());
                next
            });
            let groups = &mut groups[id as usize];
            for i in run {
                if !(stacks.is_valid(i) && values.is_valid(i)) {
                    continue;
                }
                let g = *groups.entry(stacks.value(i)).or_insert_with(|| {
                    keys.push((id, stacks.value(i)));
                    sums.push(0i64);
                    periods.push(i64::MIN);
                    durations.push(i64::MIN);
                    (keys.len() - 1) as u32
                }) as usize;
                sums[g] = sums[g].saturating_add(values.value(i));
                if period.is_valid(i) {
                    periods[g] = periods[g].max(period.value(i));
                }
                if duration.is_valid(i) {
                    durations[g] = durations[g].max(duration.value(i));
                }
            }
        }
    }
    drop(groups);
    let mut out = Vec::new();
    // Dictionary columns come back from the row format as their values' type.
    let fields: Vec<Field> = series
        .iter()
        .map(|&i| {
            let field = schema.field(i);
            let data_type = match field.data_type() {
                arrow::datatypes::DataType::Dictionary(_, values) => values.as_ref().clone(),
                other => other.clone(),
            };
            Field::new(field.name(), data_type, true)
        })
        .chain([
            Field::new(STACKTRACE_ID, arrow::datatypes::DataType::UInt64, false),
            Field::new(TIMESTAMP, arrow::datatypes::DataType::Int64, false),
            Field::new(DURATION, arrow::datatypes::DataType::Int64, true),
            Field::new(PERIOD, arrow::datatypes::DataType::Int64, true),
            Field::new(VALUE, arrow::datatypes::DataType::Int64, false),
        ])
        .collect();
    let out_schema = Arc::new(ArrowSchema::new(fields));
    let known = |v: i64| (v != i64::MIN).then_some(v);
    for from in (0..keys.len()).step_by(OUT_ROWS) {
        let to = (from + OUT_ROWS).min(keys.len());
        let mut columns = converter.convert_rows(
            keys[from..to]
                .iter()
                .map(|(s, _)| series_rows.row(*s as usize)),
        )?;
        columns.push(Arc::new(UInt64Array::from_iter_values(
            keys[from..to].iter().map(|(_, stack)| *stack),
        )));
        columns.push(Arc::new(Int64Array::from(vec![start; to - from])));
        columns.push(Arc::new(Int64Array::from_iter(
            durations[from..to].iter().map(|&v| known(v)),
        )));
        columns.push(Arc::new(Int64Array::from_iter(
            periods[from..to].iter().map(|&v| known(v)),
        )));
        columns.push(Arc::new(Int64Array::from(sums[from..to].to_vec())));
        out.push(RecordBatch::try_new(out_schema.clone(), columns)?);
    }
    Ok((out, read))
}

impl frostdb_core::Maintenance for Rollups {
    fn run(&self, now_ms: i64) {
        if let Err(error) = self.run_pass(now_ms) {
            tracing::warn!(%error, "rolling up samples failed; retried at the next pass");
        }
    }
}
