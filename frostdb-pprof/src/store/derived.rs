//! The tables derived from the samples, written with them and rebuilt when missing: the
//! totals (what series over time read) and the series index (what label queries read).

use super::*;

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
        for (key, row) in keys {
            let hour = timestamps
                .value(row as usize)
                .div_euclid(schema::SERIES_BUCKET_MS);
            if !self.keys.contains_key(&key) && !new.iter().any(|(k, _)| *k == key) {
                new.push((key, hour));
                rows.push(row);
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some((crate::normalize::series_rows(samples, &rows)?, new)))
    }

    /// Records keys whose rows were committed.
    pub(super) fn committed(&mut self, keys: Vec<(u64, i64)>) {
        let newest = keys.iter().map(|(_, h)| *h).max().unwrap_or(i64::MIN);
        if newest > self.newest_hour {
            self.newest_hour = newest;
            let oldest = newest - SERIES_SEEN_HOURS;
            self.keys.retain(|_, hour| *hour >= oldest);
        }
        self.keys.extend(keys);
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
    let mut tx = db.transaction();
    for batch in snapshot.scan(&frostdb_core::ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        let rows = crate::normalize::totals_rows(&batch)?;
        written += rows.num_rows();
        tx.insert(totals, &rows)?;
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
    for batch in snapshot.scan(&frostdb_core::ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        let all: Vec<u32> = (0..batch.num_rows() as u32).collect();
        let rows = crate::normalize::series_rows(&batch, &all)?;
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
            let mut tx = db.transaction();
            tx.insert(index, &new)?;
            tx.submit()?.wait()?;
            written += first.len();
        }
    }
    tracing::info!(
        sample_rows = read,
        index_rows = written,
        seconds = started.elapsed().as_secs_f64(),
        "built the series index of a store written without one"
    );
    Ok(())
}
