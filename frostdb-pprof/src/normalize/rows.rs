//! Step 4: sample rows appended to a group's rows, and the group's batch.

use arrow::array::AsArray;

use super::*;

impl Prepared<'_> {
    /// The sample rows, with the stacks interned into `partition`, appended to
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
    pub(super) fn append(
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
        // Which profile the totals rows are of, whatever their sample labels.
        let profile = match index {
            true => crate::limits::series_key(
                &self.name,
                self.series.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ),
            false => 0,
        };
        let mut sets: Vec<usize> = Vec::new();
        // Each label set's place among the run's `sets`, by its index (usize::MAX: not in
        // the run): found by a scan of `sets`, a profile of thousands of label sets and as
        // many sample types took a comparison per set for each of its rows.
        let mut place = if index {
            vec![usize::MAX; self.label_sets.len()]
        } else {
            Vec::new()
        };
        for run in rows.chunk_by(|a, b| a.0 == b.0) {
            let t = run[0].0;
            out.constant(SAMPLE_TYPE, sample_type(t), at, run.len())?;
            out.constant(SAMPLE_UNIT, sample_unit(t), at, run.len())?;
            // Runs of rows alike in every series column and time: of a type's rows, those
            // of one label set in a row.
            let mut first = at;
            for same in run.chunk_by(|a, b| group(a.1).0 == group(b.1).0) {
                out.runs.push((first as u32, (first + same.len()) as u32));
                first += same.len();
            }
            // The series index: a row per distinct label set of the run, keyed by what
            // makes its index row; and the run's totals, a first row and a sum per label set.
            if index {
                for set in sets.drain(..) {
                    place[set] = usize::MAX;
                }
                let totals = out.totals.len();
                for (i, r) in run.iter().enumerate() {
                    let set = group(r.1).0;
                    let k = match place[set] {
                        k if k != usize::MAX => k,
                        _ => {
                            place[set] = sets.len();
                            sets.push(set);
                            let key = SERIES_KEYS.hash_one((
                                (&self.name, sample_type(t), sample_unit(t)),
                                (period_type, period_unit, &self.series),
                                (&self.label_sets[set], hour),
                            ));
                            out.series.push((key, (at + i) as u32));
                            out.totals.push(Total {
                                row: (at + i) as u32,
                                sum: 0,
                                profile,
                            });
                            sets.len() - 1
                        }
                    };
                    let sum = &mut out.totals[totals + k].sum;
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
}

/// Hashes the series index's keys: fixed, so equal rows of different groups have equal keys.
pub(crate) static SERIES_KEYS: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x5e71e5);

/// A profile totals row to be: of a profile, sample type and label set, its first sample
/// row, its rows' values summed, and which profile it is of
/// ([`frostdb_profile::schema::column::PROFILE_KEY`]: its name and request labels hashed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Total {
    pub(crate) row: u32,
    pub(crate) sum: i64,
    pub(crate) profile: u64,
}

/// Sample rows of one or more profiles, built into one batch of the samples table: string
/// columns dictionary-encoded as they are appended, a column a profile lacks null in its
/// rows.
#[derive(Default)]
pub(crate) struct SampleRows {
    profiles: usize,
    /// Rows that stand for a series index row: `(key, row)`, the key a hash of the index
    /// row's contents.
    pub(crate) series: Vec<(u64, u32)>,
    /// Per profile, type and label set, in row order: its totals row to be (see
    /// [`totals_from`]).
    pub(crate) totals: Vec<Total>,
    strings: BTreeMap<String, StringDictionaryBuilder<Int32Type>>,
    stacktrace_id: Vec<u64>,
    timestamp: Vec<i64>,
    duration: Vec<i64>,
    period: Vec<i64>,
    value: Vec<i64>,
    /// Runs of rows (first, end) alike in every series column and time, in row order.
    runs: Vec<(u32, u32)>,
    /// Rows given whole (samples given as Arrow columns): nothing is appended to them.
    built: Option<RecordBatch>,
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
    /// Rows given whole, with their series index rows and totals (see the fields), as
    /// `profiles` profiles.
    pub(crate) fn built(
        batch: RecordBatch,
        series: Vec<(u64, u32)>,
        totals: Vec<Total>,
        profiles: usize,
    ) -> Self {
        Self {
            profiles,
            series,
            totals,
            built: Some(batch),
            ..Self::default()
        }
    }

    /// Rows held.
    pub(crate) fn len(&self) -> usize {
        match &self.built {
            Some(batch) => batch.num_rows(),
            None => self.value.len(),
        }
    }

    /// Profiles whose rows are held.
    pub(crate) fn profiles(&self) -> usize {
        self.profiles
    }

    /// Sets column `name` to `value` in rows `at..at + n`, nulls before them where unset.
    pub(super) fn constant(&mut self, name: &str, value: &str, at: usize, n: usize) -> Result<()> {
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

    /// The rows as one batch in the order of `table` (the samples table's sort key), with
    /// the series index's and the totals' references to them ([`SampleRows::series`],
    /// [`SampleRows::totals`]) moved where the rows went. Stored sorted, they spare compaction and persistence the sort
    /// (they find the batch sorted in a comparison a row): the runs of rows alike in series
    /// and time are ordered (one row each, by the table's key), then the rows of each
    /// profile by stack id, which costs a sort of the series and of each profile's rows, not
    /// a sort of every row by every key column. Rows given whole come as given.
    pub(crate) fn finish_sorted(mut self, table: &frostdb_core::Table) -> Result<Finished> {
        let runs = std::mem::take(&mut self.runs);
        let mut index = std::mem::take(&mut self.series);
        let mut totals = std::mem::take(&mut self.totals);
        let batch = self.finish()?;
        if runs.is_empty() {
            // Built (or empty): as given.
            return Ok(Finished {
                batch,
                series: index,
                totals,
            });
        }
        // Each run's series (its string columns at its first row) as words, equal where
        // the series are; a row of each distinct series ranked by the table's key.
        let schema = batch.schema();
        let run_firsts = arrow::array::UInt32Array::from_iter_values(runs.iter().map(|r| r.0));
        let (fields, columns): (Vec<_>, Vec<_>) = schema
            .fields()
            .iter()
            .zip(batch.columns())
            .filter(|(_, c)| c.as_dictionary_opt::<Int32Type>().is_some())
            .map(|(f, c)| Ok((f.clone(), arrow::compute::take(c, &run_firsts, None)?)))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        let (words, width) = crate::store::series_words(&columns)?;
        let mut series: std::collections::HashMap<&[u64], u32, foldhash::fast::RandomState> =
            Default::default();
        let mut distinct: Vec<u32> = Vec::new();
        let of_run: Vec<u32> = (0..runs.len())
            .map(|r| {
                let next = distinct.len() as u32;
                *series
                    .entry(&words[r * width..(r + 1) * width])
                    .or_insert_with(|| {
                        distinct.push(r as u32);
                        next
                    })
            })
            .collect();
        let mut rank = vec![0u32; distinct.len()];
        if distinct.len() > 1 {
            let distinct = arrow::array::UInt32Array::from(distinct);
            let columns = columns
                .iter()
                .map(|c| Ok(arrow::compute::take(c, &distinct, None)?))
                .collect::<Result<Vec<_>>>()?;
            let representatives =
                RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)?;
            for (place, &s) in table.sort_indices(&representatives)?.iter().enumerate() {
                rank[s as usize] = place as u32;
            }
        }
        let times = batch
            .column_by_name(TIMESTAMP)
            .and_then(|c| c.as_primitive_opt::<arrow::datatypes::Int64Type>())
            .ok_or_else(|| Error::Corrupt("sample rows without timestamps".into()))?
            .values();
        let stack_ids = batch
            .column_by_name(STACKTRACE_ID)
            .and_then(|c| c.as_primitive_opt::<arrow::datatypes::UInt64Type>())
            .ok_or_else(|| Error::Corrupt("sample rows without stack ids".into()))?
            .values();
        let runs: Vec<(u32, i64, u32, u32)> = runs
            .iter()
            .zip(&of_run)
            .map(|(&(first, end), &s)| (rank[s as usize], times[first as usize], first, end))
            .collect();
        let Some(order) = order_runs(runs, stack_ids, batch.num_rows()) else {
            return Ok(Finished {
                batch,
                series: index,
                totals,
            });
        };
        move_rows(&order, &mut index, &mut totals);
        let indices = arrow::array::UInt32Array::from(order);
        let columns = batch
            .columns()
            .iter()
            .map(|c| Ok(arrow::compute::take(c, &indices, None)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(Finished {
            batch: RecordBatch::try_new(schema, columns)?,
            series: index,
            totals,
        })
    }

    /// The rows as one batch, in the order they were appended.
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        if let Some(batch) = self.built {
            return Ok(batch);
        }
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

/// A group's sample rows as stored ([`SampleRows::finish_sorted`]), with the series index's
/// and the totals' references to them.
pub(crate) struct Finished {
    pub(crate) batch: RecordBatch,
    pub(crate) series: Vec<(u64, u32)>,
    pub(crate) totals: Vec<Total>,
}

/// The order of rows given as runs `(series rank, time, first row, end)` (the runs in row
/// order, each a run of rows of one series and time), in the samples table's order: by
/// series rank, time and stack (`stack_ids`, a row each); `None` when they are in it
/// already. Runs are ordered, then the rows of each profile (series and time) by stack, so
/// it costs a sort of the runs and of each profile's rows, not of `rows` rows.
pub(crate) fn order_runs(
    mut runs: Vec<(u32, i64, u32, u32)>,
    stack_ids: &[u64],
    rows: usize,
) -> Option<Vec<u32>> {
    let in_order = runs.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1))
        && runs
            .iter()
            .all(|r| stack_ids[r.2 as usize..r.3 as usize].is_sorted());
    if in_order {
        return None;
    }
    runs.sort_unstable(); // first rows are distinct: rows alike keep their order
    let mut order: Vec<u32> = Vec::with_capacity(rows);
    for profile in runs.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let from = order.len();
        for run in profile {
            order.extend(run.2..run.3);
        }
        order[from..].sort_by_key(|&i| stack_ids[i as usize]);
    }
    Some(order)
}

/// Moves references to rows (the series index's `(key, row)` and the totals' `(row, sum)`)
/// to where `order` (`order[i]`: the row that comes `i`th) puts their rows.
pub(crate) fn move_rows(order: &[u32], index: &mut [(u64, u32)], totals: &mut [Total]) {
    let mut place = vec![0u32; order.len()];
    for (i, &row) in order.iter().enumerate() {
        place[row as usize] = i as u32;
    }
    for (_, row) in index {
        *row = place[*row as usize];
    }
    for total in totals {
        total.row = place[total.row as usize];
    }
}
