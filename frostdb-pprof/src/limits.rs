//! What a store admits beyond a profile's own size ([`crate::Limits`]): its labels
//! ([`LabelLimits`], checked on each profile before any of it is stored) and its series
//! ([`StoreOptions::max_series`](crate::StoreOptions::max_series), counted across restarts).
//!
//! A series is a profile name and label set (request and pprof sample labels alike, span
//! labels left out). Its key, a hash of those, is written to the [`SERIES_KEYS`](crate::schema::SERIES_KEYS) table in the
//! transaction of its samples, once per series and day: a store limited in series reads that
//! one column when it opens and counts the distinct keys, so a restart forgets nothing,
//! and opening costs a hash insert per stored row (no label column is read). Rows expire a
//! day after the samples' retention: a series whose samples have all expired stops counting
//! at the next open.

use std::collections::HashMap;

use arrow::array::{Array, Int64Array, RecordBatch, UInt64Array};
use frostdb_core::{Db, ScanRequest, Table};

use crate::error::{Error, Result};
use crate::schema::SERIES_KEYS_BUCKET_MS;
use crate::schema::column::{LABEL_PREFIX, NAME, TIMESTAMP};

/// Bounds on the labels of a profile's series, as Pyroscope's distributor checks them. A
/// profile over one is refused whole ([`Error::LabelLimit`], an
/// [`ErrorKind::LimitExceeded`](frostdb_core::ErrorKind::LimitExceeded)).
///
/// # Defaults
/// | limit | default | Pyroscope's |
/// |---|---|---|
/// | `max_label_names_per_series` | 30 | `max_label_names_per_series` |
/// | `max_label_name_length` | 1024 bytes | `max_label_name_length` |
/// | `max_label_value_length` | 2048 bytes | `max_label_value_length` |
///
/// Label names are also bound by the engine's column names ([`frostdb_core::MAX_NAME_LEN`],
/// 255 bytes), whatever `max_label_name_length` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelLimits {
    /// Most labels a series may have: the request's labels and the pprof sample string
    /// labels that become `labels.*` columns (span and trace ids, kept per sample, do not
    /// count; neither does the profile name).
    pub max_label_names_per_series: usize,
    /// Longest label name, in bytes (as stored: sanitized).
    pub max_label_name_length: usize,
    /// Longest label value, in bytes (span and trace ids included).
    pub max_label_value_length: usize,
}

impl Default for LabelLimits {
    fn default() -> Self {
        Self {
            max_label_names_per_series: 30,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
        }
    }
}

impl LabelLimits {
    /// No bound but the engine's (what stores written before these limits may hold).
    pub fn unlimited() -> Self {
        Self {
            max_label_names_per_series: usize::MAX,
            max_label_name_length: usize::MAX,
            max_label_value_length: usize::MAX,
        }
    }

    /// Checks one label's name and value lengths (the name also against the engine's
    /// column name length); the error names the limit and the label.
    pub(crate) fn check_label(&self, name: &str, value: &str) -> Result<()> {
        for (got, limit, value_of_limit) in [
            (
                name.len(),
                "max_label_name_length",
                self.max_label_name_length,
            ),
            (
                name.len(),
                "the engine's column name length",
                frostdb_core::MAX_NAME_LEN,
            ),
        ] {
            if got > value_of_limit {
                return Err(Error::LabelLimit {
                    what: format!("the bytes of label name {:?}", shortened(name)),
                    got,
                    limit,
                    value: value_of_limit,
                });
            }
        }
        if value.len() > self.max_label_value_length {
            return Err(Error::LabelLimit {
                what: format!("the bytes of the value of label {:?}", shortened(name)),
                got: value.len(),
                limit: "max_label_value_length",
                value: self.max_label_value_length,
            });
        }
        Ok(())
    }

    /// Checks a series' labels: `series`, the request's, and `sample`, one set of pprof
    /// sample labels (those equal to a request label already left out), `name{...}` naming
    /// the series in errors.
    pub(crate) fn check<'a>(
        &self,
        series: impl Iterator<Item = (&'a str, &'a str)> + Clone,
        sample: &'a [(String, String)],
        describe: impl Fn() -> String,
    ) -> Result<()> {
        let labels = series.chain(sample.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let names = labels
            .clone()
            .filter(|(k, _)| !crate::schema::SPAN_LABELS.contains(k))
            .count();
        if names > self.max_label_names_per_series {
            return Err(Error::LabelLimit {
                what: format!("the label names of series {}", describe()),
                got: names,
                limit: "max_label_names_per_series",
                value: self.max_label_names_per_series,
            });
        }
        for (name, value) in labels {
            self.check_label(name, value)?;
        }
        Ok(())
    }
}

/// A series as text, `name{k="v",...}`: its first 8 labels (names and values shortened),
/// and how many there are when more; what errors about a series show.
pub(crate) fn series_text(name: &str, labels: &[(&str, &str)]) -> String {
    const SHOWN: usize = 8;
    let mut text = labels
        .iter()
        .take(SHOWN)
        .map(|(k, v)| format!("{}={:?}", shortened(k), shortened(v)))
        .collect::<Vec<_>>()
        .join(",");
    if labels.len() > SHOWN {
        text.push_str(&format!(",… {} labels in all", labels.len()));
    }
    format!("{name}{{{text}}}")
}

/// `text` cut to its first 64 characters (with `…` when cut), for error messages.
pub(crate) fn shortened(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// A series' key: a hash of its profile name and labels, `labels` sorted by name. xxHash3,
/// a fixed algorithm: keys are stored, and must not change with the toolchain.
pub(crate) fn series_key<'a>(name: &str, labels: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    let mut buf = Vec::with_capacity(256);
    let mut put = |s: &str| {
        buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        buf.extend_from_slice(s.as_bytes());
    };
    put(name);
    for (k, v) in labels {
        put(k);
        put(v);
    }
    twox_hash::XxHash3_128::oneshot(&buf) as u64
}

/// The start of the day (UTC) of `timestamp_ms`: a series keys row's bucket.
pub(crate) fn day_of(timestamp_ms: i64) -> i64 {
    timestamp_ms.div_euclid(SERIES_KEYS_BUCKET_MS) * SERIES_KEYS_BUCKET_MS
}

/// A store's series: those it holds and those admitted since open, by key, each with the
/// newest day whose key row this process committed (`i64::MIN`: none yet).
#[derive(Debug)]
pub(crate) struct SeriesKeys {
    days: HashMap<u64, i64, foldhash::fast::RandomState>,
    /// Whether the store counts series (is limited): every key is then kept; otherwise
    /// only the recent days', to write each day's rows once.
    counting: bool,
    newest_day: i64,
}

/// Key rows to write: the batch, and the keys and days it holds.
pub(crate) type KeyRows = (RecordBatch, Vec<(u64, i64)>);

impl SeriesKeys {
    /// The series of `table` when `counting` (a hash insert per stored row; the `key`
    /// column alone is read), none otherwise.
    pub(crate) fn open(table: &Table, counting: bool) -> Result<Self> {
        let mut days: HashMap<u64, i64, foldhash::fast::RandomState> = HashMap::default();
        if counting {
            let started = std::time::Instant::now();
            let mut rows = 0usize;
            for batch in table
                .snapshot()
                .scan(&ScanRequest::new().project(["key"]))?
            {
                let batch = batch?;
                let keys = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .ok_or_else(|| Error::Corrupt("series keys are not UInt64".into()))?;
                rows += keys.len();
                for key in keys.iter().flatten() {
                    days.entry(key).or_insert(i64::MIN);
                }
            }
            tracing::debug!(
                rows,
                series = days.len(),
                seconds = started.elapsed().as_secs_f64(),
                "counted the stored series"
            );
        }
        Ok(Self {
            days,
            counting,
            newest_day: i64::MIN,
        })
    }

    /// None, counting none (a reader's: it writes no keys).
    pub(crate) fn open_empty() -> Self {
        Self {
            days: HashMap::default(),
            counting: false,
            newest_day: i64::MIN,
        }
    }

    /// Series counted.
    pub(crate) fn len(&self) -> usize {
        self.days.len()
    }

    /// Admits `keys` (key, and an index into the profile's label sets), all or none, within
    /// `limit` series. Over it: how many are new, and one of them (its label set index).
    pub(crate) fn admit(
        &mut self,
        keys: &[(u64, usize)],
        limit: usize,
    ) -> std::result::Result<(), (usize, usize)> {
        let mut new: Vec<(u64, usize)> = keys
            .iter()
            .copied()
            .filter(|(k, _)| !self.days.contains_key(k))
            .collect();
        new.sort_unstable_by_key(|s| s.0);
        new.dedup_by_key(|s| s.0);
        if let Some(&(_, example)) = new.first()
            && self.days.len() + new.len() > limit
        {
            return Err((new.len(), example));
        }
        self.days
            .extend(new.into_iter().map(|(k, _)| (k, i64::MIN)));
        Ok(())
    }

    /// The key rows of `keys` (key, day) not committed yet, and their keys and days;
    /// `None` when all were.
    pub(crate) fn new_rows(&self, keys: &[(u64, i64)]) -> Result<Option<KeyRows>> {
        let mut new: Vec<(u64, i64)> = keys
            .iter()
            .copied()
            .filter(|(k, day)| self.days.get(k).is_none_or(|done| done < day))
            .collect();
        if new.is_empty() {
            return Ok(None);
        }
        new.sort_unstable();
        new.dedup();
        Ok(Some((key_rows(&new)?, new)))
    }

    /// Records key rows committed.
    pub(crate) fn committed(&mut self, keys: Vec<(u64, i64)>) {
        for (key, day) in keys {
            let done = self.days.entry(key).or_insert(day);
            *done = (*done).max(day);
            self.newest_day = self.newest_day.max(day);
        }
        if !self.counting {
            // Only to write each day's rows once: yesterday's keys may still come.
            let oldest = self.newest_day.saturating_sub(SERIES_KEYS_BUCKET_MS);
            self.days.retain(|_, day| *day >= oldest);
        }
    }
}

/// `(key, day)` rows of the [`schema::series_keys`] table.
fn key_rows(rows: &[(u64, i64)]) -> Result<RecordBatch> {
    use arrow::datatypes::{DataType, Field, Schema};
    let schema = Schema::new(vec![
        Field::new("key", DataType::UInt64, false),
        Field::new(TIMESTAMP, DataType::Int64, false),
    ]);
    Ok(RecordBatch::try_new(
        std::sync::Arc::new(schema),
        vec![
            std::sync::Arc::new(UInt64Array::from_iter_values(rows.iter().map(|k| k.0))),
            std::sync::Arc::new(Int64Array::from_iter_values(rows.iter().map(|k| k.1))),
        ],
    )?)
}

/// Builds the series keys of a store written before it had them, from its series index:
/// a row per series and day, in one transaction (a crash midway leaves none, and the next
/// open builds them whole).
pub(crate) fn build_series_keys(db: &Db, index: &Table, keys: &Table) -> Result<()> {
    let started = std::time::Instant::now();
    let snapshot = index.snapshot();
    let mut labels: Vec<(String, String)> = snapshot
        .schema()
        .arrow_schema()
        .fields()
        .iter()
        .filter_map(|f| {
            Some((
                f.name().strip_prefix(LABEL_PREFIX)?.to_owned(),
                f.name().clone(),
            ))
        })
        .collect();
    labels.sort();
    let mut columns = vec![NAME.to_owned(), TIMESTAMP.to_owned()];
    columns.extend(labels.iter().map(|(_, c)| c.clone()));
    let (mut read, mut rows) = (0usize, std::collections::BTreeSet::<(u64, i64)>::new());
    for batch in snapshot.scan(&ScanRequest::new().project(columns.iter()))? {
        let batch = batch?;
        read += batch.num_rows();
        // Once per store: plain strings, whatever the columns' encoding.
        let strings: Vec<arrow::array::ArrayRef> = (0..batch.num_columns())
            .filter(|&c| c != 1)
            .map(|c| arrow::compute::cast(batch.column(c), &arrow::datatypes::DataType::Utf8))
            .collect::<std::result::Result<_, _>>()?;
        let strings: Vec<&arrow::array::StringArray> = strings
            .iter()
            .map(|a| a.as_any().downcast_ref::<arrow::array::StringArray>())
            .collect::<Option<_>>()
            .ok_or_else(|| Error::Corrupt("series index labels are not strings".into()))?;
        let timestamps = batch
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| Error::Corrupt("series index timestamps are not Int64".into()))?;
        for row in 0..batch.num_rows() {
            let value = |c: usize| strings[c].is_valid(row).then(|| strings[c].value(row));
            let Some(name) = value(0) else { continue };
            let set = labels
                .iter()
                .enumerate()
                .filter_map(|(l, (label, _))| Some((label.as_str(), value(l + 1)?)));
            rows.insert((series_key(name, set), day_of(timestamps.value(row))));
        }
    }
    let rows: Vec<(u64, i64)> = rows.into_iter().collect();
    if !rows.is_empty() {
        let mut tx = db.transaction();
        tx.insert(keys, &key_rows(&rows)?)?;
        tx.commit()?;
    }
    tracing::info!(
        index_rows = read,
        key_rows = rows.len(),
        seconds = started.elapsed().as_secs_f64(),
        "built the series keys of a store written without them"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_admit_all_or_none_and_rows_are_written_once_a_day() {
        let mut keys = SeriesKeys {
            days: HashMap::default(),
            counting: true,
            newest_day: i64::MIN,
        };
        keys.admit(&[(1, 0), (2, 1), (1, 2)], 2).unwrap();
        assert_eq!(keys.len(), 2);
        // One new of two known: over a limit of 2, refused, nothing admitted.
        assert_eq!(keys.admit(&[(1, 0), (3, 1)], 2), Err((1, 1)));
        assert_eq!(keys.len(), 2);
        keys.admit(&[(2, 0)], 2).unwrap();

        let day = day_of(1_700_000_000_000);
        let (batch, new) = keys
            .new_rows(&[(1, day), (2, day), (1, day)])
            .unwrap()
            .unwrap();
        assert_eq!(batch.num_rows(), 2);
        keys.committed(new);
        assert!(keys.new_rows(&[(1, day), (2, day)]).unwrap().is_none());
        let next = day + SERIES_KEYS_BUCKET_MS;
        let (_, new) = keys.new_rows(&[(1, next)]).unwrap().unwrap();
        assert_eq!(new, [(1, next)]);
    }

    #[test]
    fn label_limits_name_the_limit_and_its_value() {
        let limits = LabelLimits {
            max_label_names_per_series: 2,
            max_label_name_length: 8,
            max_label_value_length: 4,
        };
        let series = [("job", "api")];
        let ok = |sample: &[(String, String)]| {
            limits.check(series.iter().copied(), sample, || "cpu{}".into())
        };
        let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        ok(&[pair("pod", "a")]).unwrap();
        // Span ids are per sample: not series labels, not counted.
        ok(&[pair("pod", "a"), pair("span_id", "abcd")]).unwrap();
        for (sample, limit, value, got) in [
            (
                vec![pair("pod", "a"), pair("node", "n")],
                "max_label_names_per_series",
                2,
                3,
            ),
            (
                vec![pair("much_too_long", "a")],
                "max_label_name_length",
                8,
                13,
            ),
            (vec![pair("pod", "abcde")], "max_label_value_length", 4, 5),
            (
                vec![pair("span_id", "abcde")],
                "max_label_value_length",
                4,
                5,
            ),
        ] {
            let err = ok(&sample).unwrap_err();
            assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded);
            let text = err.to_string();
            assert!(text.contains(&format!("{limit} = {value}")), "{text}");
            assert!(text.contains(&format!(" {got},")), "{text}");
        }
        // The engine's own bound applies whatever the limit.
        let unlimited = LabelLimits::unlimited();
        let long = "n".repeat(frostdb_core::MAX_NAME_LEN + 1);
        let err = unlimited
            .check(std::iter::empty(), &[pair(&long, "v")], || "cpu{}".into())
            .unwrap_err();
        assert!(
            err.to_string().contains("column name length = 255"),
            "{err}"
        );
    }

    #[test]
    fn a_series_key_is_its_name_and_sorted_labels() {
        let a = series_key("cpu", [("job", "api"), ("pod", "p1")].into_iter());
        assert_eq!(
            a,
            series_key("cpu", [("job", "api"), ("pod", "p1")].into_iter())
        );
        assert_ne!(
            a,
            series_key("mem", [("job", "api"), ("pod", "p1")].into_iter())
        );
        assert_ne!(a, series_key("cpu", [("job", "api")].into_iter()));
        // Framed: a label cannot run into the next.
        assert_ne!(
            series_key("cpu", [("a", "bc")].into_iter()),
            series_key("cpu", [("ab", "c")].into_iter())
        );
    }
}
