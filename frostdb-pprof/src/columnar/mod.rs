//! Samples given as Arrow columns ([`ProfileStore::ingest_arrow`](crate::ProfileStore::ingest_arrow)),
//! in the order they pass the files:
//!
//! 1. this file: the batches checked column by column (names, types, nulls, ranges, label
//!    names and value lengths) and brought into the samples table's form: profile type
//!    and label columns dictionary-encoded, times in milliseconds, rows of value 0 dropped;
//! 2. [`stacks`]: each row's stack resolved (an id into the stacks batch, or frames given
//!    inline), the distinct stacks found, and interned into the current symbol partition
//!    once each;
//! 3. [`rows`]: the sample rows with their stacks' symbol ids, the rows of samples with a
//!    span apart, and what the group commit derives from them (the series, the series
//!    index keys, the per-profile totals).
//!
//! The group commit ([`crate::store`]) then writes them in one transaction, as it writes a
//! group of pprof profiles.
//!
//! # The samples batch
//! | column | type | |
//! |---|---|---|
//! | `name`, `sample_type`, `sample_unit`, `period_type`, `period_unit` | a string type (`Utf8`, `LargeUtf8`, `Utf8View`, or a dictionary of one) | required, no nulls, not empty: the profile type |
//! | `labels.<name>` | a string type | any number; null or empty where a row lacks the label; `<name>` a Prometheus label name not starting with `__` |
//! | `timestamp` | `Int64` (ms since the epoch) or `Timestamp` of any unit | required |
//! | `value` | `Int64` | required; rows of value 0 store nothing |
//! | `duration` (ns), `period` | `Int64` | optional (0) |
//! | `stacktrace_id` | `UInt64` | the stack, an id of the stacks batch; or: |
//! | `frames` | a list of a string type | the stack inline: function names, leaf first |
//!
//! # The stacks batch (with `stacktrace_id`)
//! `stacktrace_id` (`UInt64`, each once) and `frames` (a list of a string type: function
//! names, leaf first). Stacks no sample uses are not stored.
//!
//! A frame is a function name: it is stored as a function of that name (and system name)
//! with a location of no mapping and address, as a pprof profile holding only function names
//! stores it, so the same stack from either path is one stack.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, DictionaryArray, Int64Array, ListArray, RecordBatch, StringArray,
    UInt64Array,
};
use arrow::datatypes::{DataType, Field, Int32Type, TimeUnit};

use crate::decode::Limits;
use crate::error::{Error, Result};
use crate::limits::LabelLimits;
use crate::schema::SPAN_LABELS;
use crate::schema::column::{
    DURATION, LABEL_PREFIX, PERIOD, PROFILE_TYPE, STACKTRACE_ID, TIMESTAMP, VALUE,
};

mod rows;
mod stacks;

pub(crate) use stacks::{InternedStacks, Stacks, not_added};

/// A stacks batch (`stacktrace_id`, `frames`) checked and indexed once, for many calls of
/// [`crate::ProfileStore::ingest_arrow_with`] whose samples refer to its stacks by id: a
/// call then looks up only the stacks its rows use, and a stack's content key is computed
/// the first time a call needs it, not again. Made by
/// [`crate::ProfileStore::arrow_stacks`]; cheap to clone.
#[derive(Clone)]
pub struct ArrowStacks(pub(crate) std::sync::Arc<stacks::StackTable>);

impl std::fmt::Debug for ArrowStacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrowStacks").finish_non_exhaustive()
    }
}

impl ArrowStacks {
    /// Checks and indexes `stacks` under `limits`.
    pub(crate) fn new(stacks: &RecordBatch, limits: &Limits) -> Result<Self> {
        Ok(Self(std::sync::Arc::new(stacks::StackTable::new(
            stacks, limits,
        )?)))
    }
}

/// The inline stack column of a samples batch, and the frames column of a stacks batch.
pub const FRAMES: &str = "frames";

/// What [`ProfileStore::ingest_arrow`](crate::ProfileStore::ingest_arrow) stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArrowSummary {
    /// Sample rows written (rows of value 0 store nothing).
    pub rows: usize,
    /// Distinct series (profile type and labels) among them.
    pub series: usize,
    /// Profiles: distinct series and timestamps.
    pub profiles: usize,
    /// Distinct stacks among the rows.
    pub stacks: usize,
    /// Stacks new to the current symbol partition.
    pub new_stacks: usize,
    /// Profile types written (`name:type:unit:period_type:period_unit`), sorted.
    pub profile_types: Vec<String>,
}

/// An input error at `at` (`samples.value`, `stacks row 3`).
pub(crate) fn invalid(at: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Convert {
        format: "Arrow samples",
        at: at.into(),
        reason: reason.into(),
    }
}

/// A string column as the store keeps it: dictionary-encoded with `Int32` keys.
pub(crate) type Strings = DictionaryArray<Int32Type>;

/// A samples batch, checked and in the samples table's form (its stacks still the
/// caller's).
pub(crate) struct Input {
    /// The five profile type columns, in [`PROFILE_TYPE`] order: no nulls.
    pub(crate) profile_type: [Strings; 5],
    /// `(label name, column)`, by name; null where a row lacks the label. Span and trace
    /// ids apart, in `span_labels`.
    pub(crate) labels: Vec<(String, Strings)>,
    /// The span and trace id columns ([`crate::schema::SPAN_LABELS`]), if given.
    pub(crate) span_labels: Vec<(String, Strings)>,
    pub(crate) timestamp: Int64Array,
    pub(crate) duration: Int64Array,
    pub(crate) period: Int64Array,
    pub(crate) value: Int64Array,
    /// The rows' stacks, resolved to the distinct stacks of the call.
    pub(crate) stacks: Stacks,
}

/// Whether `data_type` is one of the string types the batches may use.
fn is_string_type(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        // A dictionary of plain strings (one of dictionaries is not measured, and none
        // sends one).
        DataType::Dictionary(key, value) => {
            key.is_integer()
                && matches!(
                    **value,
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                )
        }
        _ => false,
    }
}

/// The longest string of `array`'s views and the bytes they name in all (saturating),
/// through dictionaries' values and lists' items, with `per_key` a dictionary's values
/// counted once per key (as a cast of a list of them copies them out). A view is 16 bytes
/// whatever it names, and a dictionary names one value from every key: so a few MB of
/// Arrow made arrow's casts allocate terabytes, before any length was checked.
fn expanded_bytes(array: &dyn Array, per_key: bool) -> (usize, usize) {
    use arrow::array::AsArray;
    match array.data_type() {
        DataType::Utf8View => {
            array
                .as_string_view()
                .views()
                .iter()
                .fold((0, 0usize), |(longest, total), &view| {
                    let length = view_length(view);
                    (longest.max(length), total.saturating_add(length))
                })
        }
        DataType::Dictionary(..) => {
            let d = array.as_any_dictionary();
            let (longest, total) = expanded_bytes(d.values().as_ref(), false);
            if !per_key || d.values().is_empty() {
                return (longest, total);
            }
            let values = d.values();
            let length = |i: usize| -> usize {
                match values.data_type() {
                    DataType::Utf8View => view_length(values.as_string_view().views()[i]),
                    DataType::Utf8 => values.as_string::<i32>().value_length(i) as usize,
                    DataType::LargeUtf8 => values.as_string::<i64>().value_length(i) as usize,
                    _ => 0,
                }
            };
            let total = d
                .normalized_keys()
                .into_iter()
                .fold(0usize, |total, k| total.saturating_add(length(k)));
            (longest, total)
        }
        DataType::List(_) => expanded_bytes(array.as_list::<i32>().values().as_ref(), true),
        DataType::LargeList(_) => expanded_bytes(array.as_list::<i64>().values().as_ref(), true),
        _ => (0, 0),
    }
}

/// The length of the string a view names (its low 32 bits).
fn view_length(view: u128) -> usize {
    view as u32 as usize
}

/// Column `column` (named `at` in errors) as [`Strings`].
fn strings(column: &ArrayRef, at: &str) -> Result<Strings> {
    if !is_string_type(column.data_type()) {
        return Err(invalid(
            at,
            format!("is {}, not a string type", column.data_type()),
        ));
    }
    let cast = arrow::compute::cast(
        column,
        &DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
    )
    .map_err(|e| invalid(at, e.to_string()))?;
    Ok(cast.as_dictionary::<Int32Type>().clone())
}

/// The first row of `array` that is null (logically: a dictionary key pointing at a null
/// value counts), if any.
fn first_null(array: &dyn Array) -> Option<usize> {
    let nulls = array.logical_nulls()?;
    (0..array.len()).find(|&i| nulls.is_null(i))
}

/// `strings` with rows whose value is empty made null (a label a row lacks).
fn empty_as_null(strings: Strings) -> Result<Strings> {
    let values = strings.values().as_string::<i32>();
    let empty: Vec<bool> = (0..values.len())
        .map(|i| values.is_valid(i) && values.value(i).is_empty())
        .collect();
    if !empty.contains(&true) {
        return Ok(strings);
    }
    let keys = strings.keys();
    let keys: arrow::array::Int32Array = keys
        .iter()
        .map(|k| k.filter(|&k| !empty[k as usize]))
        .collect();
    Ok(DictionaryArray::try_new(keys, strings.values().clone())?)
}

/// Column `column` (named `at`) as a primitive array of `T` with no nulls.
fn non_null<T: arrow::datatypes::ArrowPrimitiveType>(
    column: &ArrayRef,
    at: &str,
) -> Result<arrow::array::PrimitiveArray<T>> {
    let values = column.as_primitive_opt::<T>().ok_or_else(|| {
        invalid(
            at,
            format!("is {}, not {}", column.data_type(), T::DATA_TYPE),
        )
    })?;
    if let Some(row) = first_null(values) {
        return Err(invalid(at, format!("is null at row {row}")));
    }
    Ok(values.clone())
}

/// An `Int64` column with no nulls.
fn int64s(column: &ArrayRef, at: &str) -> Result<Int64Array> {
    non_null(column, at)
}

/// The `timestamp` column in milliseconds, each within the times taken.
fn timestamps(column: &ArrayRef) -> Result<Int64Array> {
    let at = format!("samples.{TIMESTAMP}");
    let ms: Int64Array = match column.data_type() {
        DataType::Int64 => int64s(column, &at)?,
        DataType::Timestamp(unit, _) => {
            let raw = int64s(&arrow::compute::cast(column, &DataType::Int64)?, &at)?;
            match unit {
                TimeUnit::Second => seconds_to_ms(&raw, &at)?,
                TimeUnit::Millisecond => raw,
                TimeUnit::Microsecond => raw.unary(|v: i64| v.div_euclid(1_000)),
                TimeUnit::Nanosecond => raw.unary(|v: i64| v.div_euclid(1_000_000)),
            }
        }
        other => {
            return Err(invalid(
                at,
                format!("is {other}, not Int64 (milliseconds) or Timestamp"),
            ));
        }
    };
    check_times(&ms, &at)?;
    Ok(ms)
}

/// Seconds to milliseconds, refusing what overflows.
fn seconds_to_ms(seconds: &Int64Array, at: &str) -> Result<Int64Array> {
    let mut out = Vec::with_capacity(seconds.len());
    for (row, v) in seconds.values().iter().enumerate() {
        out.push(
            v.checked_mul(1000).ok_or_else(|| {
                invalid(at, format!("row {row}: {v} s is outside the times taken"))
            })?,
        );
    }
    Ok(Int64Array::from(out))
}

/// Every time within `0..=MAX_MS`, and at most [`MAX_FUTURE_MS`] past now, as a profile's.
///
/// [`MAX_FUTURE_MS`]: crate::normalize::MAX_FUTURE_MS
fn check_times(ms: &Int64Array, at: &str) -> Result<()> {
    let latest = frostdb_core::now_ms().saturating_add(crate::normalize::MAX_FUTURE_MS);
    if let Some(row) = ms
        .values()
        .iter()
        .position(|&t| frostdb_profile::checked_ms(t, "").is_err() || t > latest)
    {
        let reason = match frostdb_profile::checked_ms(ms.value(row), &format!("row {row}")) {
            Err(reason) => reason,
            Ok(t) => format!(
                "row {row}: {t} ms is past now by more than the {} s a time may be ahead",
                crate::normalize::MAX_FUTURE_MS / 1000
            ),
        };
        return Err(invalid(at, reason));
    }
    Ok(())
}

/// Whether `name` may name a label: a Prometheus label name, not reserved (`__`).
fn check_label_name(name: &str, column: &str, limits: &LabelLimits) -> Result<()> {
    let reason = if name.is_empty() {
        "the label name is empty".to_owned()
    } else if crate::normalize::sanitize_label(name) != name {
        format!(
            "{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*; {:?} would be)",
            crate::normalize::sanitize_label(name)
        )
    } else if name.starts_with("__") {
        format!("label names starting with __ are reserved ({name:?})")
    } else if name.len() > limits.max_label_name_length {
        return Err(Error::LabelLimit {
            what: format!("the label name of column {column:?}, in bytes"),
            got: name.len(),
            limit: "max_label_name_length",
            value: limits.max_label_name_length,
        });
    } else {
        return Ok(());
    };
    Err(invalid(format!("samples.{column}"), reason))
}

/// [`check_value_lengths`] of column `column` before it is cast: the strings its views
/// (or its dictionary's values' views) name are each at most `limit`, and what the cast
/// copies out at most `max_decompressed_bytes` in all: a dictionary's values whole, a
/// column of views its distinct values.
fn check_views(column: &ArrayRef, name: &str, limit: usize, limits: &Limits) -> Result<()> {
    let (longest, total) = expanded_bytes(column.as_ref(), false);
    let total = match column.data_type() {
        // Its distinct views, each copied once, when all of them name more than the limit
        // (views of overlapping windows are distinct values).
        DataType::Utf8View if total > limits.max_decompressed_bytes => {
            let mut seen = std::collections::HashSet::new();
            column
                .as_string_view()
                .views()
                .iter()
                .filter(|&&v| seen.insert(v))
                .fold(0usize, |total, &v| total.saturating_add(view_length(v)))
        }
        DataType::Utf8View => 0,
        _ => total,
    };
    if longest > limit {
        return Err(value_too_long(name, longest, limit));
    }
    if total > limits.max_decompressed_bytes {
        return Err(Error::TooLarge {
            what: "bytes the string views of a column name (max_decompressed_bytes)",
            limit: limits.max_decompressed_bytes,
        });
    }
    Ok(())
}

/// The longest value of `strings`' dictionary, in bytes, over `limit`: an error naming it.
fn check_value_lengths(strings: &Strings, column: &str, limit: usize) -> Result<()> {
    let values = strings.values().as_string::<i32>();
    let longest = (0..values.len())
        .filter(|&i| values.is_valid(i))
        .map(|i| values.value_length(i) as usize)
        .max()
        .unwrap_or(0);
    if longest > limit {
        return Err(value_too_long(column, longest, limit));
    }
    Ok(())
}

/// A value of column `column` of `got` bytes, over `max_label_value_length` (`limit`).
fn value_too_long(column: &str, got: usize, limit: usize) -> Error {
    Error::LabelLimit {
        what: format!("a value of column {column:?}, in bytes"),
        got,
        limit: "max_label_value_length",
        value: limit,
    }
}

impl Input {
    /// Checks `samples` (and `stacks`, the stacks its `stacktrace_id` refers to) and brings
    /// them into the samples table's form. Nothing is stored; an error names the batch,
    /// column and row at fault.
    pub(crate) fn check(
        samples: &RecordBatch,
        stacks: Option<&ArrowStacks>,
        limits: &Limits,
        label_limits: &LabelLimits,
    ) -> Result<Self> {
        if samples.num_rows() > limits.max_samples {
            return Err(Error::TooLarge {
                what: "the sample rows of an Arrow batch",
                limit: limits.max_samples,
            });
        }
        let schema = samples.schema();
        let mut profile_type: [Option<Strings>; 5] = Default::default();
        let mut labels: Vec<(String, Strings)> = Vec::new();
        let mut span_labels: Vec<(String, Strings)> = Vec::new();
        let (mut timestamp, mut value, mut duration, mut period) = (None, None, None, None);
        let (mut stack_ids, mut frames) = (None, None);
        for (field, column) in schema.fields().iter().zip(samples.columns()) {
            let name = field.name().as_str();
            let at = format!("samples.{name}");
            let given_twice = || invalid(&at, "the column is given twice");
            if let Some(t) = PROFILE_TYPE.iter().position(|&c| c == name) {
                if profile_type[t].is_some() {
                    return Err(given_twice());
                }
                check_views(column, name, label_limits.max_label_value_length, limits)?;
                let column = strings(column, &at)?;
                if let Some(row) = first_null(&column) {
                    return Err(invalid(at, format!("is null at row {row}")));
                }
                // Part of every series key of the call, as a label's value is.
                check_value_lengths(&column, name, label_limits.max_label_value_length)?;
                let values = column.values().as_string::<i32>();
                let empty: Vec<bool> = (0..values.len())
                    .map(|i| values.value(i).is_empty())
                    .collect();
                if empty.contains(&true)
                    && let Some(row) = column
                        .keys()
                        .values()
                        .iter()
                        .position(|&k| empty[k as usize])
                {
                    return Err(invalid(at, format!("is empty at row {row}")));
                }
                profile_type[t] = Some(column);
            } else if let Some(label) = name.strip_prefix(LABEL_PREFIX) {
                check_label_name(label, name, label_limits)?;
                if labels.iter().chain(&span_labels).any(|(l, _)| l == label) {
                    return Err(given_twice());
                }
                check_views(column, name, label_limits.max_label_value_length, limits)?;
                let column = empty_as_null(strings(column, &at)?)?;
                check_value_lengths(&column, name, label_limits.max_label_value_length)?;
                if SPAN_LABELS.contains(&label) {
                    span_labels.push((label.to_owned(), column));
                } else {
                    labels.push((label.to_owned(), column));
                }
            } else {
                let slot = match name {
                    TIMESTAMP => &mut timestamp,
                    VALUE => &mut value,
                    DURATION => &mut duration,
                    PERIOD => &mut period,
                    STACKTRACE_ID => &mut stack_ids,
                    FRAMES => &mut frames,
                    _ => {
                        return Err(invalid(
                            at,
                            format!(
                                "is not a column of sample rows (they are {}, labels.<name>, \
                                 {TIMESTAMP}, {VALUE}, {DURATION}, {PERIOD}, and \
                                 {STACKTRACE_ID} or {FRAMES})",
                                PROFILE_TYPE.join(", ")
                            ),
                        ));
                    }
                };
                if slot.replace(column.clone()).is_some() {
                    return Err(given_twice());
                }
            }
        }
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        let missing = |name: &str| invalid(format!("samples.{name}"), "the column is missing");
        let mut types = Vec::with_capacity(5);
        for (t, column) in profile_type.into_iter().enumerate() {
            types.push(column.ok_or_else(|| missing(PROFILE_TYPE[t]))?);
        }
        let profile_type: [Strings; 5] = types
            .try_into()
            .map_err(|_| Error::Corrupt("five profile type columns".into()))?;
        let timestamp = timestamps(&timestamp.ok_or_else(|| missing(TIMESTAMP))?)?;
        let value = int64s(
            &value.ok_or_else(|| missing(VALUE))?,
            &format!("samples.{VALUE}"),
        )?;
        // As a pprof sample's values are ([`crate::decode::MAX_SAMPLE_VALUE`]).
        if let Some((row, v)) = value
            .values()
            .iter()
            .enumerate()
            .find(|(_, v)| v.unsigned_abs() > crate::decode::MAX_SAMPLE_VALUE)
        {
            return Err(invalid(
                format!("samples.{VALUE}"),
                format!(
                    "row {row} holds {v}, beyond ±2^53 (no profiler measures that much in one sample)"
                ),
            ));
        }
        let rows = samples.num_rows();
        let optional = |column: Option<ArrayRef>, name: &str| match column {
            Some(c) => int64s(&c, &format!("samples.{name}")),
            None => Ok(Int64Array::from(vec![0; rows])),
        };
        let duration = optional(duration, DURATION)?;
        let period = optional(period, PERIOD)?;
        let stacks = match (stack_ids, frames, stacks) {
            (Some(ids), None, Some(stacks)) => Stacks::by_id(&ids, &stacks.0)?,
            (Some(_), None, None) => {
                return Err(invalid(
                    format!("samples.{STACKTRACE_ID}"),
                    "refers to a stacks batch, and none was given",
                ));
            }
            (None, Some(frames), None) => Stacks::inline(&frames, limits)?,
            (None, Some(_), Some(_)) => {
                return Err(invalid(
                    format!("samples.{FRAMES}"),
                    "stacks are given inline and as a stacks batch: give one",
                ));
            }
            (Some(_), Some(_), _) => {
                return Err(invalid(
                    "samples",
                    format!("give {STACKTRACE_ID} or {FRAMES}, not both"),
                ));
            }
            (None, None, _) => {
                return Err(invalid(
                    "samples",
                    format!(
                        "the stacks are missing: give {STACKTRACE_ID} (with a stacks batch) or {FRAMES}"
                    ),
                ));
            }
        };
        let input = Self {
            profile_type,
            labels,
            span_labels,
            timestamp,
            duration,
            period,
            value,
            stacks,
        };
        input.without_zeros()
    }

    /// Rows.
    pub(crate) fn len(&self) -> usize {
        self.value.len()
    }

    /// The input without its rows of value 0 (which store nothing, as in a pprof profile).
    fn without_zeros(self) -> Result<Self> {
        if !self.value.values().contains(&0) {
            return Ok(self);
        }
        let keep = arrow::array::BooleanArray::from(
            self.value
                .values()
                .iter()
                .map(|&v| v != 0)
                .collect::<Vec<_>>(),
        );
        let filter = arrow::compute::FilterBuilder::new(&keep).optimize().build();
        let strings = |s: &Strings| -> Result<Strings> {
            Ok(filter.filter(s)?.as_dictionary::<Int32Type>().clone())
        };
        let ints =
            |a: &Int64Array| -> Result<Int64Array> { Ok(filter.filter(a)?.as_primitive().clone()) };
        let [a, b, c, d, e] = &self.profile_type;
        Ok(Self {
            profile_type: [
                strings(a)?,
                strings(b)?,
                strings(c)?,
                strings(d)?,
                strings(e)?,
            ],
            labels: self
                .labels
                .iter()
                .map(|(l, c)| Ok((l.clone(), strings(c)?)))
                .collect::<Result<_>>()?,
            span_labels: self
                .span_labels
                .iter()
                .map(|(l, c)| Ok((l.clone(), strings(c)?)))
                .collect::<Result<_>>()?,
            timestamp: ints(&self.timestamp)?,
            duration: ints(&self.duration)?,
            period: ints(&self.period)?,
            value: ints(&self.value)?,
            stacks: self.stacks.filter(keep.values()),
        })
    }
}

/// A field of a built batch.
pub(crate) fn field(name: &str, array: &dyn Array, nullable: bool) -> Field {
    Field::new(name, array.data_type().clone(), nullable)
}

/// `List<Utf8>` of column `column` (named `at`): the stacks' frames, each non-null, each
/// name at most [`crate::convert::trie::MAX_FRAME_BYTES`], and at most `max_locations` (and
/// `max_functions`) distinct names, as a pprof profile's (each distinct name becomes a
/// function, a location and a string of the symbol partition).
pub(crate) fn frame_lists(column: &ArrayRef, at: &str, limits: &Limits) -> Result<ListArray> {
    let max_depth = limits.max_stack_depth;
    let item_ok = |t: &DataType| is_string_type(t);
    let ok = match column.data_type() {
        DataType::List(item) | DataType::LargeList(item) => item_ok(item.data_type()),
        _ => false,
    };
    if !ok {
        return Err(invalid(
            at,
            format!(
                "is {}, not a list of function names (List<Utf8>)",
                column.data_type()
            ),
        ));
    }
    const MAX_NAME: usize = crate::convert::trie::MAX_FRAME_BYTES;
    // Checked before the cast copies the names out of views or dictionaries.
    let (longest, total) = expanded_bytes(column.as_ref(), false);
    if longest > MAX_NAME {
        return Err(invalid(
            at,
            format!("has a frame name of {longest} bytes, over the limit of {MAX_NAME}"),
        ));
    }
    if total > limits.max_decompressed_bytes {
        return Err(Error::TooLarge {
            what: "bytes the frame names of a column name (max_decompressed_bytes)",
            limit: limits.max_decompressed_bytes,
        });
    }
    let list = arrow::compute::cast(
        column,
        &DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
    )
    .map_err(|e| invalid(at, e.to_string()))?;
    let list = list.as_list::<i32>().clone();
    if let Some(row) = first_null(&list) {
        return Err(invalid(
            at,
            format!("is null at row {row} (an empty list is a stack of no frames)"),
        ));
    }
    let offsets = list.value_offsets();
    if let Some(row) = offsets
        .windows(2)
        .position(|w| (w[1] - w[0]) as usize > max_depth)
    {
        return Err(invalid(
            at,
            format!(
                "row {row} has {} frames, over the limit of {max_depth} (max_stack_depth)",
                offsets[row + 1] - offsets[row]
            ),
        ));
    }
    let names: &StringArray = list.values().as_string::<i32>();
    // Only the frames the rows reach: a sliced list may hold others.
    let (first, last) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
    let row_of = |i: usize| offsets.partition_point(|&o| o as usize <= i) - 1;
    if let Some(i) = (first..last).find(|&i| names.is_null(i)) {
        return Err(invalid(at, format!("row {} has a null frame", row_of(i))));
    }
    if let Some(i) = (first..last).find(|&i| names.value(i).len() > MAX_NAME) {
        return Err(invalid(
            at,
            format!(
                "row {} has a frame name of {} bytes, over the limit of {MAX_NAME}",
                row_of(i),
                names.value(i).len()
            ),
        ));
    }
    let most = limits.max_locations.min(limits.max_functions);
    if last - first <= most {
        // No more names than that in all.
        return Ok(list);
    }
    let mut distinct: std::collections::HashSet<&str, foldhash::fast::RandomState> =
        Default::default();
    for i in first..last {
        if distinct.insert(names.value(i)) && distinct.len() > most {
            return Err(Error::TooLarge {
                what: "distinct frame names of an Arrow batch (max_locations, max_functions)",
                limit: most,
            });
        }
    }
    Ok(list)
}

/// `UInt64` ids with no nulls.
pub(crate) fn ids(column: &ArrayRef, at: &str) -> Result<UInt64Array> {
    non_null(column, at)
}
