//! The tables derived from the samples, written with them and rebuilt when missing: the
//! totals (what series over time read) and the series index (what label queries read).

use super::*;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Schema as ArrowSchema};

use crate::schema::SERIES_BUCKET_MS;
use crate::schema::column::{PROFILE_KEY, VALUE};

/// Maps keyed by rows' values: foldhash (the rows are the store's own).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Series index rows to write, and their keys and hours.
pub(super) type IndexRows = (arrow::array::RecordBatch, Vec<(u64, i64)>);

/// Series index rows written since open: key -> hour.
#[derive(Default)]
pub(super) struct SeriesSeen {
    pub(super) keys: std::collections::HashMap<u64, i64, foldhash::fast::RandomState>,
    pub(super) newest_hour: i64,
}

/// Hours of series index keys kept behind the newest: later profiles of older hours write
/// their index rows again (which queries read as one).
pub(super) const SERIES_SEEN_HOURS: i64 = 3;

impl SeriesSeen {
    /// The index rows of a group's samples (`keys`: key and sample row) not written yet, and
    /// their keys and hours; `None` when all were.
    pub(super) fn new_rows(
        &self,
        samples: &arrow::array::RecordBatch,
        keys: Vec<(u64, u32)>,
    ) -> Result<Option<IndexRows>> {
        let timestamps = samples
            .column_by_name(TIMESTAMP)
            .and_then(|c| c.as_any().downcast_ref::<arrow::array::Int64Array>())
            .ok_or_else(|| Error::Corrupt("sample rows without timestamps".into()))?;
        let mut new: Vec<(u64, i64)> = Vec::new();
        let mut rows: Vec<u32> = Vec::new();
        // The keys taken so far (a scan of `new` made a group of millions of index rows,
        // one profile's thousands of sample types times its label sets, hours of one core
        // inside the commit).
        let mut taken: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for (key, row) in keys {
            let hour = timestamps
                .value(row as usize)
                .div_euclid(schema::SERIES_BUCKET_MS);
            if !self.keys.contains_key(&key) && taken.insert(key) {
                new.push((key, hour));
                rows.push(row);
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some((series_rows(samples, &rows)?, new)))
    }

    /// Records keys whose rows were committed: those of the newest hours only (a profile
    /// dated later than now does not move them), and at most [`MAX_SERIES_SEEN`] (older
    /// hours' keys were all kept while no newer hour came: back-dated hours pushed newest
    /// first grew the map without bound).
    pub(super) fn committed(&mut self, keys: Vec<(u64, i64)>) {
        let now_hour = frostdb_core::now_ms()
            .saturating_add(crate::normalize::MAX_FUTURE_MS)
            .div_euclid(schema::SERIES_BUCKET_MS);
        let newest = keys
            .iter()
            .map(|(_, h)| *h)
            .filter(|h| *h <= now_hour)
            .max()
            .unwrap_or(i64::MIN);
        let oldest = |newest: i64| newest.saturating_sub(SERIES_SEEN_HOURS);
        if newest > self.newest_hour {
            self.newest_hour = newest;
            self.keys.retain(|_, hour| *hour >= oldest(newest));
        }
        let window = oldest(self.newest_hour)..=now_hour;
        self.keys
            .extend(keys.into_iter().filter(|(_, h)| window.contains(h)));
        if self.keys.len() > MAX_SERIES_SEEN {
            // Written again when next seen, which queries read as one.
            self.keys.clear();
        }
    }
}

/// Most keys [`SeriesSeen`] keeps (about 32 MB).
pub(super) const MAX_SERIES_SEEN: usize = 1 << 20;

/// Rows of one table inserted by one transaction, batches of a schema put together until
/// they are [`Coalesced::ROWS`] rows: a transaction takes at most 65,535 inserts, and a
/// rebuild scans a batch per granule (a store of 537 M sample rows could not be opened).
struct Coalesced<'a> {
    tx: frostdb_core::Transaction,
    table: &'a Table,
    /// Per schema, batches not yet inserted and their rows.
    pending: std::collections::HashMap<arrow::datatypes::SchemaRef, (Vec<RecordBatch>, usize)>,
}

impl<'a> Coalesced<'a> {
    const ROWS: usize = 1 << 16;

    fn new(db: &Db, table: &'a Table) -> Self {
        Self {
            tx: db.transaction(),
            table,
            pending: Default::default(),
        }
    }

    fn insert(&mut self, batch: RecordBatch) -> Result<()> {
        let (batches, rows) = self.pending.entry(batch.schema()).or_default();
        *rows += batch.num_rows();
        batches.push(batch);
        if *rows >= Self::ROWS {
            let batches = std::mem::take(batches);
            *rows = 0;
            self.put(&batches)?;
        }
        Ok(())
    }

    fn put(&mut self, batches: &[RecordBatch]) -> Result<()> {
        if let Some(first) = batches.first() {
            let batch = arrow::compute::concat_batches(&first.schema(), batches)?;
            self.tx.insert(self.table, &batch)?;
        }
        Ok(())
    }

    /// Inserts what is left and commits, durably.
    fn commit(mut self) -> Result<()> {
        for (batches, _) in std::mem::take(&mut self.pending).into_values() {
            self.put(&batches)?;
        }
        self.tx.commit()?;
        Ok(())
    }
}

/// Builds the totals of a store written before it had them, from its sample rows.
pub(super) fn build_totals(db: &Db, samples: &Table, totals: &Table) -> Result<()> {
    let started = std::time::Instant::now();
    let (mut read, mut written) = (0usize, 0usize);
    let snapshot = samples.snapshot();
    let columns: Vec<String> = snapshot
        .schema()
        .arrow_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != STACKTRACE_ID)
        .collect();
    // One transaction: a crash midway leaves no totals, and the next open builds them whole.
    let mut tx = Coalesced::new(db, totals);
    for batch in snapshot.scan(&frostdb_core::ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        let rows = totals_rows(&batch)?;
        written += rows.num_rows();
        tx.insert(rows)?;
    }
    tx.commit()?;
    tracing::info!(
        sample_rows = read,
        total_rows = written,
        seconds = started.elapsed().as_secs_f64(),
        "built the profile totals of a store written without them"
    );
    Ok(())
}

/// Builds the series index of a store written before it had one, from its sample rows.
pub(super) fn build_series_index(db: &Db, samples: &Table, index: &Table) -> Result<()> {
    use arrow::row::{OwnedRow, RowConverter, SortField};
    let started = std::time::Instant::now();
    let snapshot = samples.snapshot();
    let columns: Vec<String> = snapshot
        .schema()
        .arrow_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| schema::is_series_column(n))
        .collect();
    // Rows seen, per set of columns (a batch's rows compare only with rows of its columns).
    let mut seen: std::collections::HashMap<Vec<String>, std::collections::HashSet<OwnedRow>> =
        Default::default();
    let (mut read, mut written) = (0usize, 0usize);
    // One transaction, as the totals': an index built partly before a crash was taken for
    // whole at the next open (it is built only when empty), and merges and label queries
    // left out the series it lacked.
    let mut tx = Coalesced::new(db, index);
    for batch in snapshot.scan(&frostdb_core::ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        let all: Vec<u32> = (0..batch.num_rows() as u32).collect();
        let rows = series_rows(&batch, &all)?;
        let schema = rows.schema();
        let converter = RowConverter::new(
            schema
                .fields()
                .iter()
                .map(|f| SortField::new(f.data_type().clone()))
                .collect(),
        )?;
        let keys = converter.convert_columns(rows.columns())?;
        let seen = seen
            .entry(schema.fields().iter().map(|f| f.name().clone()).collect())
            .or_default();
        let first: Vec<u32> = (0..keys.num_rows())
            .filter(|&i| seen.insert(keys.row(i).owned()))
            .map(|i| i as u32)
            .collect();
        if !first.is_empty() {
            let new = arrow::compute::take_record_batch(
                &rows,
                &arrow::array::UInt32Array::from(first.clone()),
            )?;
            tx.insert(new)?;
            written += first.len();
        }
    }
    tx.commit()?;
    tracing::info!(
        sample_rows = read,
        index_rows = written,
        seconds = started.elapsed().as_secs_f64(),
        "built the series index of a store written without one"
    );
    Ok(())
}

/// Rows `rows` of a samples batch as series index rows: the profile type and label columns,
/// and the start of the hour of their timestamp.
pub(super) fn series_rows(samples: &RecordBatch, rows: &[u32]) -> Result<RecordBatch> {
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
pub(super) fn totals_rows(samples: &RecordBatch) -> Result<RecordBatch> {
    let values = samples
        .column_by_name(VALUE)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| Error::Corrupt("sample rows without Int64 values".into()))?;
    let rows: Vec<(u32, Option<i64>)> = (0..samples.num_rows())
        .map(|i| (i as u32, values.is_valid(i).then(|| values.value(i))))
        .collect();
    totals_of(samples, &rows, None)
}

/// The rows [`totals_rows`] makes of `samples`, from `sums`: what [`SampleRows`] noted while
/// appending them (per profile, type and label set, its first row and its values' sum, in
/// row order), each with its profile's key when `keyed` (the table has
/// [`crate::schema::column::PROFILE_KEY`]). Only those rows' series columns are compared,
/// not every row's.
pub(super) fn totals_from(
    samples: &RecordBatch,
    sums: &[crate::normalize::Total],
    keyed: bool,
) -> Result<RecordBatch> {
    let rows: Vec<(u32, Option<i64>)> = sums.iter().map(|t| (t.row, Some(t.sum))).collect();
    let keys: Vec<u64> = sums.iter().map(|t| t.profile).collect();
    totals_of(samples, &rows, keyed.then_some(keys.as_slice()))
}

/// Totals of `rows` (`(row, value)`, in row order) of `samples`, grouped by their series
/// columns (only those rows' are read); with `profiles` (a profile key per row), each with
/// the key of its first row.
fn totals_of(
    samples: &RecordBatch,
    rows: &[(u32, Option<i64>)],
    profiles: Option<&[u64]>,
) -> Result<RecordBatch> {
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
    // Each group's first entry of `rows`.
    let mut first_of = Vec::<usize>::new();
    let mut previous: Option<(usize, u32)> = None;
    for (i, &(first, value)) in rows.iter().enumerate() {
        let g = match previous {
            Some((p, g)) if row(p) == row(i) => g,
            _ => *groups.entry(row(i)).or_insert_with(|| {
                firsts.push(first);
                first_of.push(i);
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
    let profile_keys = profiles
        .map(|keys| arrow::array::UInt64Array::from_iter_values(first_of.iter().map(|&i| keys[i])));
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
    if let Some(profile_keys) = profile_keys {
        fields.push(Field::new(PROFILE_KEY, DataType::UInt64, true));
        columns.push(Arc::new(profile_keys));
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
pub(crate) fn series_words(keys: &[ArrayRef]) -> Result<(Vec<u64>, usize)> {
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

/// The runs of rows of one series in `columns` (the series columns of rows sorted by
/// series). A dictionary column is compared by its keys: a run may then be split where two
/// keys hold one value, which only costs a second lookup of the same series.
pub(crate) fn series_runs(
    columns: &[ArrayRef],
    rows: usize,
) -> Result<Vec<std::ops::Range<usize>>> {
    use arrow::array::AsArray;
    if columns.is_empty() || rows == 0 {
        return Ok(std::iter::once(0..rows).collect());
    }
    let compared: Vec<ArrayRef> = columns
        .iter()
        .map(|c| match c.as_any_dictionary_opt() {
            Some(dictionary) => dictionary.keys().slice(0, c.len()),
            None => c.clone(),
        })
        .collect();
    Ok(arrow::compute::kernels::partition::partition(&compared)?.ranges())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys of hours older than the window are not kept, nor keys of hours past now, and
    /// the map has a bound: back-dated hours pushed newest first, or one profile dated in
    /// 9999, kept every key since.
    #[test]
    fn the_keys_kept_are_those_of_the_newest_hours_up_to_now() {
        let now_hour = frostdb_core::now_ms().div_euclid(schema::SERIES_BUCKET_MS);
        let mut seen = SeriesSeen::default();
        seen.committed(vec![(1, now_hour - 100)]);
        assert_eq!(seen.keys.len(), 1);
        // Newest first, each an hour older: only the window's stay.
        for k in 0..100 {
            seen.committed(vec![(1000 + k, now_hour - 101 - k as i64)]);
        }
        assert!(
            seen.keys.len() <= SERIES_SEEN_HOURS as usize + 1,
            "{}",
            seen.keys.len()
        );
        // A far-future hour does not become the newest.
        seen.committed(vec![(7, 2_000_000_000)]);
        assert!(!seen.keys.contains_key(&7));
        assert_eq!(seen.newest_hour, now_hour - 100);
        seen.committed(
            (0..MAX_SERIES_SEEN as u64 + 1)
                .map(|k| (k, now_hour))
                .collect(),
        );
        assert!(seen.keys.len() <= MAX_SERIES_SEEN);
    }
    use arrow::array::UInt64Array;
    use arrow::datatypes::Field;

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
            let prepared = prepare(&profile, &options, &[], &Default::default()).unwrap();
            let stacks: Vec<u32> = (0..prepared.group_count() as u32).collect();
            prepared.append_samples(7, &stacks, &mut out).unwrap();
        }
        let sums = std::mem::take(&mut out.totals);
        let batch = out.finish().unwrap();
        let expected = totals_rows(&batch).unwrap();
        assert_eq!(totals_from(&batch, &sums, false).unwrap(), expected);
        // Keyed, each row names its profile by its name and request labels, whatever its
        // sample labels.
        let keyed = totals_from(&batch, &sums, true).unwrap();
        let keys = keyed
            .column_by_name(PROFILE_KEY)
            .unwrap()
            .as_any()
            .downcast_ref::<UInt64Array>()
            .unwrap();
        let key = crate::limits::series_key("p", [("job", "j")].into_iter());
        assert!(keys.len() > 4 && keys.null_count() == 0);
        assert!(keys.values().iter().all(|&k| k == key));
        assert_eq!(
            keyed
                .project(&(0..expected.num_columns()).collect::<Vec<_>>())
                .unwrap(),
            expected
        );
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
}
