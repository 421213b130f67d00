//! What Parca Agent writes to Parca's `ProfileStoreService`, as profiles: `WriteRaw`
//! requests (gzipped pprof profiles under label sets, each named by its `__name__` label),
//! as the agent sends them up to v0.31 ([`write_raw`]), the `Write` stream's two Arrow
//! records (schema `v1`: samples, then the locations of the stack trace ids the server asks
//! for; agents v0.32 to v0.47, [`write_v1_wanted`], [`write_v1`]), and `WriteArrow` records
//! (Arrow IPC, schema `v2`), as it sends them from v0.48 on ([`write_arrow`]). The agent's frames
//! stay as it sends them (unsymbolized native frames as addresses in mappings with their
//! build ids), stored as our own sampler's are.

use super::Incoming;
use crate::{Error, Limits, Result};

/// The messages of `parca.profilestore.v1alpha1` (`proto/parca/profilestore.proto`).
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/parca.profilestore.v1alpha1.rs"));
}

/// The label naming a series' profile (`parca_agent_cpu`).
pub const NAME_LABEL: &str = "__name__";

/// A `WriteRaw` request's profiles: each sample's pprof (gzip or not) under its series'
/// labels, named by `__name__`. A series without `__name__`, or a sample that is not a
/// valid pprof within `limits`, is an error naming it (`series[1].samples[0]`).
pub fn write_raw(request: &proto::WriteRawRequest, limits: &Limits) -> Result<Vec<Incoming>> {
    let mut out = Vec::new();
    for (i, series) in request.series.iter().enumerate() {
        let at = format!("series[{i}]");
        let labels = series
            .labels
            .as_ref()
            .map(|l| l.labels.as_slice())
            .unwrap_or_default();
        let name = labels
            .iter()
            .find(|l| l.name == NAME_LABEL)
            .map(|l| l.value.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Error::Convert {
                format: "Parca WriteRaw",
                at: format!("{at}.labels"),
                reason: format!("no {NAME_LABEL} label names the profile"),
            })?;
        let labels: Vec<(String, String)> = labels
            .iter()
            .filter(|l| l.name != NAME_LABEL)
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect();
        // Each sample's profile gets a copy of its series' name and labels: charged as it is
        // made (one label of 10 MiB over 10,000 empty samples was 100 GB of copies).
        let copy = super::labels_bytes(&name, &labels);
        for (j, sample) in series.samples.iter().enumerate() {
            let at = format!("{at}.samples[{j}]");
            let profile =
                crate::decode(&sample.raw_profile, limits).map_err(|e| e.at(at.clone()))?;
            crate::decode::charge::take(copy, "series labels copied to each of their samples")
                .map_err(|e| e.at(at.clone()))?;
            out.push(Incoming {
                profile,
                previous: None,
                name: name.clone(),
                labels: labels.clone(),
                delta: false,
                timestamp_ms: None,
                at,
            });
        }
    }
    Ok(out)
}

/// The column names of Parca Agent's records: its wire format (parca-agent
/// `reporter/arrow.go`, `reporter/arrow_v2.go`), not our tables' columns.
pub mod wire {
    /// `labels`.
    pub const LABELS: &str = "labels";
    /// `stacktrace`.
    pub const STACKTRACE: &str = "stacktrace";
    /// `stacktrace_id`.
    pub const STACKTRACE_ID: &str = "stacktrace_id";
    /// `value`.
    pub const VALUE: &str = "value";
    /// `producer`.
    pub const PRODUCER: &str = "producer";
    /// `sample_type`.
    pub const SAMPLE_TYPE: &str = "sample_type";
    /// `sample_unit`.
    pub const SAMPLE_UNIT: &str = "sample_unit";
    /// `period_type`.
    pub const PERIOD_TYPE: &str = "period_type";
    /// `period_unit`.
    pub const PERIOD_UNIT: &str = "period_unit";
    /// `temporality`.
    pub const TEMPORALITY: &str = "temporality";
    /// `period`.
    pub const PERIOD: &str = "period";
    /// `duration`.
    pub const DURATION: &str = "duration";
    /// `timestamp`.
    pub const TIMESTAMP: &str = "timestamp";
    /// `locations`.
    pub const LOCATIONS: &str = "locations";
}

/// The schema metadata key naming a record's layout (`v1`, `v2`).
pub const SCHEMA_VERSION_KEY: &str = "parca_write_schema_version";

fn arrow_error(at: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Convert {
        format: "Parca WriteArrow",
        at: at.into(),
        reason: reason.into(),
    }
}

/// The bytes an Arrow IPC stream's buffers decompress to, before any is decompressed: what
/// decoding it would allocate, refused as soon as it passes `limit`
/// ([`frostdb_core::ipc::IpcBytes`] counts each message). The stream's framing
/// (continuation marker, metadata length, flatbuffer message, body) is checked as it is
/// walked.
pub fn ipc_decompressed_bytes(ipc: &[u8], limit: usize) -> Result<usize> {
    use frostdb_core::ipc::{IpcBytes, IpcFault};
    let mut at = 0usize;
    let mut total = 0usize;
    let mut counted = IpcBytes::default();
    let bad = |at: usize, reason: String| arrow_error(format!("byte {at}"), reason);
    while at < ipc.len() {
        let word = |i: usize| -> Result<i32> {
            ipc.get(i..i + 4)
                .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
                .ok_or_else(|| bad(i, "the IPC stream ends inside a message's framing".into()))
        };
        let mut len = word(at)?;
        at += 4;
        if len == -1 {
            len = word(at)?;
            at += 4;
        }
        if len == 0 {
            break; // end of stream
        }
        let len = usize::try_from(len).map_err(|_| bad(at, format!("metadata length {len}")))?;
        let meta = ipc
            .get(at..at.saturating_add(len))
            .ok_or_else(|| bad(at, format!("a message of {len} bytes runs past the end")))?;
        let message = arrow::ipc::root_as_message(meta)
            .map_err(|e| bad(at, format!("not an Arrow IPC message: {e}")))?;
        at += len;
        let body_len = usize::try_from(message.bodyLength())
            .map_err(|_| bad(at, "a negative body length".into()))?;
        let body = ipc
            .get(at..at.saturating_add(body_len))
            .ok_or_else(|| bad(at, format!("a body of {body_len} bytes runs past the end")))?;
        total += match counted.message(&message, body, limit - total) {
            Ok(bytes) => bytes,
            Err(IpcFault::TooLarge) => {
                return Err(Error::TooLarge {
                    what: "Arrow record (decompressed)",
                    limit,
                });
            }
            Err(IpcFault::Invalid(reason)) => return Err(bad(at, reason)),
        };
        at += body_len;
    }
    Ok(total)
}

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int32Type, UInt32Type};

use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use crate::string_table::StringTable;

/// Most time the rows of one profile of an Arrow record may span (from the earliest's
/// time to the latest's end): an agent's record holds a few seconds of samples.
const MAX_RECORD_SPAN_NS: i64 = 3_600 * 1_000_000_000;

/// The columns that key a record's rows to profiles, as errors name them.
const KEY_NAMES: [&str; 6] = [
    "producer",
    "sample type",
    "sample unit",
    "period type",
    "period unit",
    "temporality",
];
/// Longest value of a key column: each becomes a profile's name or a label.
const MAX_KEY_BYTES: usize = 1024;
/// Most profiles (distinct producers and sample types) one request's records make: an
/// agent sends a few.
pub const MAX_GROUPS: usize = 1_024;
/// About what a profile of a request holds before its first sample, beside its key's
/// copies: its struct, its string table and its entry in the request's map.
const GROUP_BYTES: usize = 1_024;
/// What a distinct sample takes besides its stack and labels, in words: its map slot,
/// value and the pprof sample made of it.
const SAMPLE_SLOTS: usize = 24;
/// What a distinct location takes besides its strings: its location, line, function and
/// map slots.
const LOCATION_BYTES: usize = 320;
/// What a distinct mapping takes besides its strings: the mapping and its key's slot.
const MAPPING_BYTES: usize = std::mem::size_of::<Mapping>() + 48;
/// What a distinct function takes besides its strings: the function and its key's slot.
const FUNCTION_BYTES: usize = std::mem::size_of::<Function>() + 48;

/// Logical row `i` of `array` as bytes: text, a view, binary, a dictionary of them or a
/// run-end encoding of those (the agent's label, type, id and frame columns). `None` when
/// null.
fn bytes_at(array: &dyn Array, i: usize) -> Result<Option<&[u8]>> {
    let (mut a, mut i) = (array, i);
    // Encodings nest two deep in the agent's schemas (run ends of a dictionary).
    for _ in 0..4 {
        if i >= a.len() {
            return Err(arrow_error(
                format!("row {i}"),
                format!("an index past the {} values of a column", a.len()),
            ));
        }
        let valid = a.is_valid(i);
        match a.data_type() {
            DataType::Utf8 => return Ok(valid.then(|| a.as_string::<i32>().value(i).as_bytes())),
            DataType::LargeUtf8 => {
                return Ok(valid.then(|| a.as_string::<i64>().value(i).as_bytes()));
            }
            DataType::Utf8View => {
                return Ok(valid.then(|| a.as_string_view().value(i).as_bytes()));
            }
            DataType::Binary => return Ok(valid.then(|| a.as_binary::<i32>().value(i))),
            DataType::LargeBinary => return Ok(valid.then(|| a.as_binary::<i64>().value(i))),
            DataType::FixedSizeBinary(_) => {
                return Ok(valid.then(|| a.as_fixed_size_binary().value(i)));
            }
            DataType::Dictionary(k, _) if **k == DataType::UInt32 => {
                if !valid {
                    return Ok(None);
                }
                let d = a.as_dictionary::<UInt32Type>();
                i = d.keys().value(i) as usize;
                a = d.values().as_ref();
            }
            DataType::Dictionary(k, _) if **k == DataType::Int32 => {
                if !valid {
                    return Ok(None);
                }
                let d = a.as_dictionary::<Int32Type>();
                i = usize::try_from(d.keys().value(i))
                    .map_err(|_| arrow_error(format!("row {i}"), "a negative dictionary key"))?;
                a = d.values().as_ref();
            }
            DataType::RunEndEncoded(r, _) if *r.data_type() == DataType::Int32 => {
                let r = a.as_run::<Int32Type>();
                i = r.get_physical_index(i);
                a = r.values().as_ref();
            }
            other => {
                return Err(arrow_error(
                    "schema",
                    format!("a column of {other}, where strings are expected"),
                ));
            }
        }
    }
    Err(arrow_error("schema", "encodings nested too deep"))
}

/// Logical row `i` of `array` as a string (see [`bytes_at`]).
fn string_at(array: &dyn Array, i: usize) -> Result<Option<&str>> {
    bytes_at(array, i)?
        .map(|b| {
            std::str::from_utf8(b)
                .map_err(|_| arrow_error(format!("row {i}"), "a string is not UTF-8"))
        })
        .transpose()
}

/// Logical row `i` of a sample's integer column (plain or run-end encoded: its value,
/// time, period, duration), as i64 (an unsigned value past `i64::MAX` is `i64::MAX`; a
/// timestamp in nanoseconds, whatever its unit). A null is an error naming the row: read,
/// it would be whatever bytes lie under it.
fn int_at(array: &dyn Array, i: usize) -> Result<i64> {
    number_at(array, i)?.signed().ok_or_else(|| {
        arrow_error(
            format!("row {i}"),
            "a null where a sample's number is expected",
        )
    })
}

/// Logical row `i` of a location's integer column (a line number, a start line): a null
/// is 0, none known.
fn optional_int_at(array: &dyn Array, i: usize) -> Result<i64> {
    Ok(number_at(array, i)?.signed().unwrap_or(0))
}

/// Logical row `i` of an address column: an unsigned value as it is (kernel addresses are
/// past `i64::MAX`), a signed one as its bits, a null 0.
fn address_at(array: &dyn Array, i: usize) -> Result<u64> {
    Ok(match number_at(array, i)? {
        Number::Null => 0,
        Number::Signed(v) => v as u64,
        Number::Unsigned(v) => v,
    })
}

enum Number {
    Null,
    Signed(i64),
    Unsigned(u64),
}

impl Number {
    /// As i64 (an unsigned value past `i64::MAX` is `i64::MAX`); `None` for a null.
    fn signed(self) -> Option<i64> {
        match self {
            Number::Null => None,
            Number::Signed(v) => Some(v),
            Number::Unsigned(v) => Some(i64::try_from(v).unwrap_or(i64::MAX)),
        }
    }
}

/// Logical row `i` of an integer or timestamp column (plain or run-end encoded).
fn number_at(array: &dyn Array, i: usize) -> Result<Number> {
    use arrow::datatypes::{
        Int64Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
        TimestampNanosecondType, TimestampSecondType, UInt64Type,
    };
    let (mut a, mut i) = (array, i);
    for _ in 0..2 {
        if i >= a.len() {
            return Err(arrow_error(
                format!("row {i}"),
                "an index past a column's values",
            ));
        }
        if a.is_null(i) && !matches!(a.data_type(), DataType::RunEndEncoded(..)) {
            return Ok(Number::Null);
        }
        let scaled = |v: i64, by: i64| Number::Signed(v.saturating_mul(by));
        match a.data_type() {
            DataType::Int64 => return Ok(Number::Signed(a.as_primitive::<Int64Type>().value(i))),
            DataType::UInt64 => {
                return Ok(Number::Unsigned(a.as_primitive::<UInt64Type>().value(i)));
            }
            DataType::Timestamp(unit, _) => {
                return Ok(match unit {
                    TimeUnit::Nanosecond => {
                        Number::Signed(a.as_primitive::<TimestampNanosecondType>().value(i))
                    }
                    TimeUnit::Microsecond => {
                        scaled(a.as_primitive::<TimestampMicrosecondType>().value(i), 1_000)
                    }
                    TimeUnit::Millisecond => scaled(
                        a.as_primitive::<TimestampMillisecondType>().value(i),
                        1_000_000,
                    ),
                    TimeUnit::Second => scaled(
                        a.as_primitive::<TimestampSecondType>().value(i),
                        1_000_000_000,
                    ),
                });
            }
            DataType::RunEndEncoded(r, _) if *r.data_type() == DataType::Int32 => {
                let r = a.as_run::<Int32Type>();
                i = r.get_physical_index(i);
                a = r.values().as_ref();
            }
            other => {
                return Err(arrow_error(
                    "schema",
                    format!("a column of {other}, where integers are expected"),
                ));
            }
        }
    }
    Err(arrow_error("schema", "encodings nested too deep"))
}

/// The (offset, length) of row `i` of a list or list view column.
fn list_range(array: &dyn Array, i: usize) -> Result<Option<(usize, usize)>> {
    if i >= array.len() {
        return Err(arrow_error(
            format!("row {i}"),
            "an index past a list column",
        ));
    }
    if array.is_null(i) {
        return Ok(None);
    }
    let (offset, len) = match array.data_type() {
        DataType::ListView(_) => {
            let l = array.as_list_view::<i32>();
            (l.value_offsets()[i], l.value_sizes()[i])
        }
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let o = l.value_offsets();
            (o[i], o[i + 1] - o[i])
        }
        other => {
            return Err(arrow_error(
                "schema",
                format!("a column of {other}, where lists are expected"),
            ));
        }
    };
    let (offset, len) = (
        usize::try_from(offset)
            .map_err(|_| arrow_error(format!("row {i}"), "a negative list offset"))?,
        usize::try_from(len)
            .map_err(|_| arrow_error(format!("row {i}"), "a negative list size"))?,
    );
    Ok(Some((offset, len)))
}

/// The values of a list or list view column.
fn list_values(array: &dyn Array) -> Result<&dyn Array> {
    match array.data_type() {
        DataType::ListView(_) => Ok(array.as_list_view::<i32>().values().as_ref()),
        DataType::List(_) => Ok(array.as_list::<i32>().values().as_ref()),
        other => Err(arrow_error(
            "schema",
            format!("a column of {other}, where lists are expected"),
        )),
    }
}

/// Index `i` of a dictionary-encoded struct column (or a plain struct column): the struct
/// array and the row in it.
fn struct_at(array: &dyn Array, i: usize) -> Result<(&arrow::array::StructArray, usize)> {
    if i >= array.len() {
        return Err(arrow_error(
            format!("index {i}"),
            "past the values of a struct column",
        ));
    }
    let (a, i) = match array.data_type() {
        DataType::Dictionary(k, _) if **k == DataType::UInt32 => {
            let d = array.as_dictionary::<UInt32Type>();
            // A null's key slot holds anything (zero, as writers fill it): read, it was
            // another stack's location.
            if d.keys().is_null(i) {
                return Err(arrow_error(format!("index {i}"), "a null location"));
            }
            (d.values().as_ref(), d.keys().value(i) as usize)
        }
        _ => (array, i),
    };
    let s = a.as_struct_opt().ok_or_else(|| {
        arrow_error(
            "schema",
            format!("a column of {}, where structs are expected", a.data_type()),
        )
    })?;
    if i >= s.len() {
        return Err(arrow_error(
            format!("index {i}"),
            "a dictionary key past its values",
        ));
    }
    Ok((s, i))
}

fn field<'a>(s: &'a arrow::array::StructArray, name: &str) -> Result<&'a dyn Array> {
    s.column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| arrow_error("schema", format!("no {name:?} field")))
}

/// A sample's stack (location ids, leaf first) and labels (string table indexes).
type SampleKey = (Vec<u64>, Vec<(i64, i64)>);

/// One profile of a record: a producer's samples of one type.
struct ArrowProfile {
    strings: StringTable,
    mappings: Vec<Mapping>,
    /// Mappings by their file name's and build id's indices in `strings`.
    mapping_ids: HashMap<(i64, i64), u64>,
    functions: Vec<Function>,
    /// Functions by their name's and file name's indices in `strings`, and start line.
    function_ids: HashMap<(i64, i64, i64), u64>,
    locations: Vec<Location>,
    /// Locations (the array holding them, their row) to location ids.
    location_ids: HashMap<(usize, usize), u64>,
    samples: HashMap<SampleKey, i64>,
    name: String,
    types: [String; 4],
    period: i64,
    first_ns: i64,
    last_ns: i64,
}

/// The record batches of an Arrow IPC stream whose schema is marked `version`: its
/// decompressed size checked first (on the sizes its buffers state), then decoded.
pub fn read_ipc(ipc: &[u8], version: &str, limits: &Limits) -> Result<Vec<RecordBatch>> {
    let decompressed = ipc_decompressed_bytes(ipc, limits.max_decompressed_bytes)?;
    // Charged before the buffers are inflated (`frostdb_pprof::charging`).
    crate::decode::charge::charge(decompressed, "decompressing an Arrow record")?;
    // arrow's IPC reader trusts more of a stream than the checks above cover (it panics on
    // some corrupt records): its decoding is one place a panic is caught and made an error.
    let decoded = std::panic::catch_unwind(|| -> Result<(Option<String>, Vec<RecordBatch>)> {
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)
            .map_err(|e| arrow_error("the IPC stream", e.to_string()))?;
        let version = reader.schema().metadata().get(SCHEMA_VERSION_KEY).cloned();
        let batches = reader
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| arrow_error("the IPC stream", e.to_string()))?;
        Ok((version, batches))
    })
    .map_err(|panic| {
        let what = frostdb_core::panic_message(panic.as_ref());
        arrow_error(
            "the IPC stream",
            format!("not a valid Arrow record: {what}"),
        )
    })??;
    let (found, batches) = decoded;
    if found.as_deref() != Some(version) {
        return Err(arrow_error(
            "schema metadata",
            format!(
                "{SCHEMA_VERSION_KEY} is {found:?}, not {version:?} (WriteArrow takes v2 records, the Write stream v1)"
            ),
        ));
    }
    Ok(batches)
}

/// A `WriteArrow` request's record (schema `v2`, as Parca Agent v0.48 and later send it:
/// an Arrow IPC stream, LZ4 compressed, one row per sample with its stack) as profiles: one
/// per producer and sample type, named by the producer (`parca_agent`), at the first
/// sample's time, each row's labels the sample's labels. Native frames come as the agent
/// sends them (an address in a mapping named by file and build id, no lines), others with
/// their function, file and line.
pub fn write_arrow(ipc: &[u8], limits: &Limits) -> Result<Vec<Incoming>> {
    let mut grouping = Grouping::new();
    for batch in read_ipc(ipc, "v2", limits)? {
        let stacks = Stacks::Inline(column(&batch, wire::STACKTRACE)?);
        grouping.add(&batch, stacks, limits)?;
    }
    grouping.finish(limits)
}

/// The profiles a stream's records are grouped into as they are added: one for each
/// producer and types, in order.
struct Grouping {
    groups: Vec<ArrowProfile>,
    ids: HashMap<[String; 6], usize>,
    rows: usize,
    /// Across the stream's records: a stream of many small ones is one conversion.
    pace: crate::decode::charge::Pace,
}

impl Grouping {
    fn new() -> Self {
        Self {
            groups: Vec::new(),
            ids: HashMap::new(),
            rows: 0,
            pace: crate::decode::charge::Pace::new(),
        }
    }

    /// Adds a record's rows, at most `limits.max_samples` over the stream.
    fn add(&mut self, batch: &RecordBatch, stacks: Stacks<'_>, limits: &Limits) -> Result<()> {
        self.rows += batch.num_rows();
        if self.rows > limits.max_samples {
            return Err(Error::TooLarge {
                what: "samples",
                limit: limits.max_samples,
            });
        }
        add_batch(batch, stacks, limits, self)
    }

    /// The profiles, in the order their first rows came.
    fn finish(self, limits: &Limits) -> Result<Vec<Incoming>> {
        self.groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| g.finish(i, limits))
            .collect()
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a dyn Array> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| arrow_error("schema", format!("no {name:?} column")))
}

/// Where the rows' stacks are.
enum Stacks<'a> {
    /// In the record (v2): each row's list of dictionary-encoded locations.
    Inline(&'a dyn Array),
    /// In the record the agent sent after (v1): each row's stack trace id, and the list
    /// of locations (a column and its row) of each id.
    ById {
        ids: &'a dyn Array,
        found: &'a HashMap<Vec<u8>, (&'a dyn Array, usize)>,
    },
}

/// Adds a record's rows to the profiles of their producer and types.
fn add_batch(
    batch: &RecordBatch,
    stacks: Stacks<'_>,
    limits: &Limits,
    grouping: &mut Grouping,
) -> Result<()> {
    let Grouping {
        groups,
        ids: group_ids,
        pace,
        ..
    } = grouping;
    // Labels: a struct column (v2) or `labels.<name>` columns (v1). A null struct row has
    // no labels, whatever its children hold there.
    let mut labels_nulls = None;
    let labels: Vec<(&str, &dyn Array)> = match batch.column_by_name(wire::LABELS) {
        Some(l) => {
            let l = l
                .as_struct_opt()
                .ok_or_else(|| arrow_error("schema", "\"labels\" is not a struct"))?;
            labels_nulls = l.logical_nulls();
            l.fields()
                .iter()
                .map(|f| f.name().as_str())
                .zip(l.columns().iter().map(|c| c.as_ref()))
                .collect()
        }
        None => batch
            .schema_ref()
            .fields()
            .iter()
            .zip(batch.columns())
            .filter_map(|(f, c)| {
                let name = f.name().strip_prefix(wire::LABELS)?.strip_prefix('.')?;
                Some((name, c.as_ref()))
            })
            .collect(),
    };
    let value = column(batch, wire::VALUE)?;
    let text = [
        column(batch, wire::PRODUCER)?,
        column(batch, wire::SAMPLE_TYPE)?,
        column(batch, wire::SAMPLE_UNIT)?,
        column(batch, wire::PERIOD_TYPE)?,
        column(batch, wire::PERIOD_UNIT)?,
        column(batch, wire::TEMPORALITY)?,
    ];
    let period = column(batch, wire::PERIOD)?;
    let duration = column(batch, wire::DURATION)?;
    let timestamp = column(batch, wire::TIMESTAMP)?;
    // The previous row's key and group: rows of one group come in runs, and a row like the
    // one before is not copied into a key to look up.
    let mut previous: Option<([&str; 6], usize)> = None;
    for row in 0..batch.num_rows() {
        pace.tick()?;
        let at = |reason: String| arrow_error(format!("row {row}"), reason);
        let mut key: [&str; 6] = Default::default();
        for ((k, c), name) in key.iter_mut().zip(text).zip(KEY_NAMES) {
            let v = string_at(c, row)?.unwrap_or("");
            // A dictionary or run-end column names one long value for every row for a
            // few bytes each: refused before it is copied and hashed, row after row.
            if v.len() > MAX_KEY_BYTES {
                return Err(at(format!(
                    "its {name} is {} bytes, more than {MAX_KEY_BYTES}",
                    v.len()
                )));
            }
            *k = v;
        }
        if key[0].is_empty() || key[1].is_empty() {
            return Err(at("no producer or sample type".into()));
        }
        let g = match previous {
            Some((p, g)) if p == key => g,
            _ => {
                let owned: [String; 6] = key.map(str::to_owned);
                let g = match group_ids.get(&owned) {
                    Some(&g) => g,
                    None => {
                        // Each row may name a producer and types of its own: a record of
                        // a million rows made as many profiles, each holding copies of its
                        // key (gigabytes no charge saw, before the series limit).
                        if groups.len() == MAX_GROUPS {
                            return Err(Error::TooLarge {
                                what: "profiles (producers and sample types) in one request",
                                limit: MAX_GROUPS,
                            });
                        }
                        let key_bytes: usize = owned.iter().map(String::len).sum();
                        crate::decode::charge::take(
                            3 * key_bytes + GROUP_BYTES,
                            "converting an Arrow record",
                        )?;
                        groups.push(ArrowProfile::new(&owned, int_at(period, row)?));
                        group_ids.insert(owned, groups.len() - 1);
                        groups.len() - 1
                    }
                };
                previous = Some((key, g));
                g
            }
        };
        let profile = &mut groups[g];
        let ts = int_at(timestamp, row)?;
        profile.first_ns = profile.first_ns.min(ts);
        profile.last_ns = profile
            .last_ns
            .max(ts.saturating_add(int_at(duration, row)?.max(0)));
        // A group is stored as one profile at its earliest row's time: one row dated far
        // from the others moved them all (a bad clock, seconds read as nanoseconds).
        let span = profile.last_ns.saturating_sub(profile.first_ns);
        if span > MAX_RECORD_SPAN_NS {
            return Err(at(format!(
                "its time makes its profile's rows span {} s, more than the {} s one \
                 profile of a record may",
                span / 1_000_000_000,
                MAX_RECORD_SPAN_NS / 1_000_000_000
            )));
        }
        let (list, list_row) = match &stacks {
            Stacks::Inline(list) => (*list, row),
            Stacks::ById { ids, found } => {
                let id = bytes_at(*ids, row)?.ok_or_else(|| at("no stack trace id".into()))?;
                *found.get(id).ok_or_else(|| {
                    at("its stack trace id is not in the locations record the agent sent".into())
                })?
            }
        };
        let Some((offset, len)) = list_range(list, list_row)? else {
            return Err(at("a sample without a stack".into()));
        };
        if len > limits.max_stack_depth {
            return Err(Error::TooLarge {
                what: "stack depth",
                limit: limits.max_stack_depth,
            });
        }
        let locations = list_values(list)?;
        let mut stack = Vec::with_capacity(len);
        for j in offset..offset.saturating_add(len) {
            pace.tick()?;
            stack.push(profile.location(locations, j, limits, pace)?);
        }
        let mut sample_labels = Vec::new();
        let labelled = labels_nulls.as_ref().is_none_or(|n| n.is_valid(row));
        for (name, c) in labels.iter().filter(|_| labelled) {
            if let Some(v) = string_at(*c, row)?
                && !v.is_empty()
            {
                sample_labels.push((profile.strings.get(name)?, profile.strings.get(v)?));
            }
        }
        if profile.samples.len() >= limits.max_samples {
            return Err(Error::TooLarge {
                what: "samples",
                limit: limits.max_samples,
            });
        }
        let v = int_at(value, row)?;
        let total = match profile.samples.entry((stack, sample_labels)) {
            Entry::Occupied(total) => total.into_mut(),
            Entry::Vacant(new) => {
                let (stack, labels) = new.key();
                crate::decode::charge::take(
                    (stack.len() + 2 * labels.len() + SAMPLE_SLOTS) * std::mem::size_of::<u64>(),
                    "converting an Arrow record",
                )?;
                new.insert(0)
            }
        };
        *total = total.saturating_add(v);
    }
    Ok(())
}

/// The stack trace ids of a `Write` stream's samples record (schema `v1`, agents v0.32 to
/// v0.47), each once, in order: what the server asks the agent to send the stacks of.
pub fn write_v1_wanted(samples: &[u8], limits: &Limits) -> Result<Vec<Vec<u8>>> {
    let mut seen: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
    let mut ids = Vec::new();
    let mut rows = 0usize;
    for batch in read_ipc(samples, "v1", limits)? {
        // As `write_v1` refuses them, before an id per row is kept twice.
        rows += batch.num_rows();
        if rows > limits.max_samples {
            return Err(Error::TooLarge {
                what: "samples",
                limit: limits.max_samples,
            });
        }
        let column = column(&batch, wire::STACKTRACE_ID)?;
        for row in 0..batch.num_rows() {
            let id = bytes_at(column, row)?
                .ok_or_else(|| arrow_error(format!("row {row}"), "no stack trace id"))?;
            // Each distinct id is kept twice (the set, the answer), charged as it is.
            if !seen.contains(id) {
                crate::decode::charge::take(
                    2 * (id.len() + std::mem::size_of::<Vec<u8>>()) + 16,
                    "the stack trace ids of a Write stream's samples",
                )?;
                seen.insert(id.to_vec());
                ids.push(id.to_vec());
            }
        }
    }
    Ok(ids)
}

/// The record that asks the agent for the stacks of `ids`: one binary column,
/// `stacktrace_id`, schema `v1`.
pub fn write_v1_request(ids: &[Vec<u8>]) -> Result<Vec<u8>> {
    use std::sync::Arc;
    let schema = Arc::new(
        arrow::datatypes::Schema::new(vec![arrow::datatypes::Field::new(
            wire::STACKTRACE_ID,
            DataType::Binary,
            false,
        )])
        .with_metadata([(SCHEMA_VERSION_KEY.to_owned(), "v1".to_owned())].into()),
    );
    let column = arrow::array::BinaryArray::from_iter_values(ids);
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)])?;
    let mut out = Vec::new();
    let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut out, &schema)?;
    writer.write(&batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

/// A `Write` stream's two records, the samples and then the locations of their stack
/// trace ids (`stacktrace_id`, `is_complete`, `locations`), as profiles: as
/// [`write_arrow`] makes them of a v2 record.
pub fn write_v1(samples: &[u8], locations: &[u8], limits: &Limits) -> Result<Vec<Incoming>> {
    let stack_batches = read_ipc(locations, "v1", limits)?;
    let mut found: HashMap<Vec<u8>, (&dyn Array, usize)> = HashMap::new();
    // Stacks answer the samples' ids, one each: no more of them than a record may have
    // samples (`max_samples`), each kept (and charged) once. A run-end encoded column states billions of rows in a few bytes.
    let mut rows = 0usize;
    let mut pace = crate::decode::charge::Pace::new();
    for batch in &stack_batches {
        rows = rows.saturating_add(batch.num_rows());
        if rows > limits.max_samples {
            return Err(Error::TooLarge {
                what: "stacks of the locations record",
                limit: limits.max_samples,
            });
        }
        let ids = column(batch, wire::STACKTRACE_ID)?;
        let lists = column(batch, wire::LOCATIONS)?;
        for row in 0..batch.num_rows() {
            pace.tick()?;
            let id = bytes_at(ids, row)?
                .ok_or_else(|| arrow_error(format!("locations row {row}"), "no stack trace id"))?;
            crate::decode::charge::take(id.len() + 64, "converting an Arrow record")?;
            if found.insert(id.to_vec(), (lists, row)).is_some() {
                return Err(arrow_error(
                    format!("locations row {row}"),
                    "a stack trace id given twice",
                ));
            }
        }
    }
    let mut grouping = Grouping::new();
    for batch in read_ipc(samples, "v1", limits)? {
        let ids = column(&batch, wire::STACKTRACE_ID)?;
        let stacks = Stacks::ById { ids, found: &found };
        grouping.add(&batch, stacks, limits)?;
    }
    grouping.finish(limits)
}

impl ArrowProfile {
    fn new(key: &[String; 6], period: i64) -> Self {
        Self {
            strings: StringTable::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            samples: HashMap::new(),
            name: key[0].clone(),
            types: [
                key[1].clone(),
                key[2].clone(),
                key[3].clone(),
                key[4].clone(),
            ],
            period,
            first_ns: i64::MAX,
            last_ns: i64::MIN,
        }
    }

    /// The location id of entry `j` of the stacks' values (a dictionary of locations).
    fn location(
        &mut self,
        locations: &dyn Array,
        j: usize,
        limits: &Limits,
        pace: &mut crate::decode::charge::Pace,
    ) -> Result<u64> {
        let (s, i) = struct_at(locations, j)?;
        // The location's identity: its row in the dictionary's values (or the list's), in
        // the array holding it.
        let key = (std::ptr::from_ref(s).cast::<()>() as usize, i);
        if let Some(&id) = self.location_ids.get(&key) {
            return Ok(id);
        }
        if self.locations.len() >= limits.max_locations {
            return Err(Error::TooLarge {
                what: "locations",
                limit: limits.max_locations,
            });
        }
        crate::decode::charge::take(LOCATION_BYTES, "converting an Arrow record")?;
        let address = address_at(field(s, "address")?, i)?;
        let file = string_at(field(s, "mapping_file")?, i)?.unwrap_or("");
        let build_id = string_at(field(s, "mapping_build_id")?, i)?.unwrap_or("");
        // Hashed for every location in the mapping: bounded as a frame's name is. The
        // mapping is known by its strings' indices, each string kept (and charged) once:
        // keyed by copies, one 64 MiB file name of 64 build ids was 4 GiB of keys.
        if file.len().max(build_id.len()) > crate::convert::trie::MAX_FRAME_BYTES {
            return Err(Error::TooLarge {
                what: "bytes of a mapping's file name or build id",
                limit: crate::convert::trie::MAX_FRAME_BYTES,
            });
        }
        let mapping_id = if file.is_empty() && build_id.is_empty() {
            0
        } else {
            let (filename, build_id) = (self.strings.get(file)?, self.strings.get(build_id)?);
            let next = self.mappings.len() as u64 + 1;
            let id = *self.mapping_ids.entry((filename, build_id)).or_insert(next);
            if id == next {
                crate::decode::charge::take(MAPPING_BYTES, "converting an Arrow record")?;
                // v1 sends the mapping's range (zero from the agents seen: addresses are
                // already file-relative).
                let range = |name: &str| -> Result<u64> {
                    s.column_by_name(name)
                        .map(|c| address_at(c.as_ref(), i))
                        .unwrap_or(Ok(0))
                };
                self.mappings.push(Mapping {
                    id,
                    filename,
                    build_id,
                    memory_start: range("mapping_start")?,
                    memory_limit: range("mapping_limit")?,
                    file_offset: range("mapping_offset")?,
                    ..Mapping::default()
                });
            }
            id
        };
        let mut line = Vec::new();
        let lines = field(s, "lines")?;
        if let Some((offset, len)) = list_range(lines, i)? {
            // A location's lines are frames of every stack it is in: no more than a stack
            // may hold, charged before they are made (a list view may show every location
            // the same million lines).
            if len > limits.max_stack_depth {
                return Err(Error::TooLarge {
                    what: "lines of a location (inlined frames)",
                    limit: limits.max_stack_depth,
                });
            }
            crate::decode::charge::take(
                len.saturating_mul(std::mem::size_of::<Line>()),
                "converting an Arrow record",
            )?;
            let values = list_values(lines)?;
            let values = values
                .as_struct_opt()
                .ok_or_else(|| arrow_error("schema", "\"lines\" is not a list of structs"))?;
            for k in offset..offset.saturating_add(len) {
                if k >= values.len() {
                    return Err(arrow_error(
                        format!("location {i}"),
                        "a line past the lines' values",
                    ));
                }
                pace.tick()?;
                let number = optional_int_at(field(values, "line")?, k)?;
                // v2: a dictionary-encoded function struct; v1: the function's columns.
                let (name, filename, start) = match values.column_by_name("function") {
                    Some(function) => {
                        let (f, fi) = struct_at(function.as_ref(), k)?;
                        (
                            string_at(field(f, "system_name")?, fi)?,
                            string_at(field(f, "filename")?, fi)?,
                            optional_int_at(field(f, "start_line")?, fi)?,
                        )
                    }
                    None => (
                        string_at(field(values, "function_system_name")?, k)?
                            .filter(|n| !n.is_empty())
                            .or(string_at(field(values, "function_name")?, k)?),
                        string_at(field(values, "function_filename")?, k)?,
                        optional_int_at(field(values, "function_start_line")?, k)?,
                    ),
                };
                let (name, filename) = (name.unwrap_or(""), filename.unwrap_or(""));
                // Copied and hashed for every line that names the function: refused past
                // a frame name's bound before they are.
                if name.len().max(filename.len()) > crate::convert::trie::MAX_FRAME_BYTES {
                    return Err(Error::TooLarge {
                        what: "bytes of a function's name or file name",
                        limit: crate::convert::trie::MAX_FRAME_BYTES,
                    });
                }
                let (n, fname) = (self.strings.get(name)?, self.strings.get(filename)?);
                let next = self.functions.len() as u64 + 1;
                let function_id = *self.function_ids.entry((n, fname, start)).or_insert(next);
                if function_id == next {
                    // Counted and charged as they are made, not only when the profile is
                    // validated: one name with a million start lines is a million.
                    if self.functions.len() >= limits.max_functions {
                        return Err(Error::TooLarge {
                            what: "functions",
                            limit: limits.max_functions,
                        });
                    }
                    crate::decode::charge::take(FUNCTION_BYTES, "converting an Arrow record")?;
                    self.functions.push(Function {
                        id: function_id,
                        name: n,
                        system_name: n,
                        filename: fname,
                        start_line: start,
                    });
                }
                line.push(Line {
                    function_id,
                    line: number,
                    ..Line::default()
                });
            }
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id,
            address,
            line,
            ..Location::default()
        });
        self.location_ids.insert(key, id);
        Ok(id)
    }

    fn finish(mut self, index: usize, limits: &Limits) -> Result<Incoming> {
        let sample_type = ValueType {
            r#type: self.strings.get(&self.types[0])?,
            unit: self.strings.get(&self.types[1])?,
        };
        let period_type = ValueType {
            r#type: self.strings.get(&self.types[2])?,
            unit: self.strings.get(&self.types[3])?,
        };
        let mut samples: Vec<_> = self.samples.into_iter().collect();
        samples.sort_unstable();
        let profile = Profile {
            sample_type: vec![sample_type],
            sample: samples
                .into_iter()
                .map(|((location_id, labels), v)| Sample {
                    location_id,
                    value: vec![v],
                    label: labels
                        .into_iter()
                        .map(|(key, str)| Label {
                            key,
                            str,
                            ..Label::default()
                        })
                        .collect(),
                })
                .collect(),
            mapping: self.mappings,
            location: self.locations,
            function: self.functions,
            string_table: self.strings.into_table(),
            time_nanos: self.first_ns,
            duration_nanos: self.last_ns.saturating_sub(self.first_ns).max(0),
            period_type: Some(period_type),
            period: self.period,
            ..Profile::default()
        };
        let at = format!(
            "{} {}:{} ({index})",
            self.name, self.types[0], self.types[1]
        );
        Ok(Incoming {
            profile: crate::validate(profile, limits).map_err(|e| e.at(at.clone()))?,
            previous: None,
            name: self.name,
            labels: Vec::new(),
            delta: false,
            timestamp_ms: None,
            at,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    /// A series label copied to each of a `WriteRaw` series' samples is charged each time:
    /// 64 copies of a 1 MiB label are refused under an 8 MiB budget (before, made
    /// uncharged), and within a budget that holds them, stored.
    #[test]
    fn write_raw_charges_the_labels_it_copies_to_each_sample() {
        use proto::{Label, LabelSet, RawProfileSeries, RawSample, WriteRawRequest};
        let label = |name: &str, value: &str| Label {
            name: name.into(),
            value: value.into(),
        };
        let big = "A".repeat(1 << 20);
        let request = WriteRawRequest {
            series: vec![RawProfileSeries {
                labels: Some(LabelSet {
                    labels: vec![label(NAME_LABEL, "x"), label("a", &big)],
                }),
                samples: vec![
                    RawSample {
                        raw_profile: vec![0x32, 0],
                        ..Default::default()
                    };
                    64
                ],
            }],
            ..Default::default()
        };
        let (got, _) = crate::decode::charge::under_budget(8 << 20, || {
            write_raw(&request, &Limits::default())
        });
        assert!(
            got.unwrap_err()
                .to_string()
                .contains("copied to each of their samples")
        );
        let (got, asked) = crate::decode::charge::under_budget(usize::MAX, || {
            write_raw(&request, &Limits::default())
        });
        assert_eq!(got.unwrap().len(), 64);
        assert!(asked >= 64 << 20, "{asked}");
    }

    /// The rows of one profile of a record are stored at the earliest's time: a row dated
    /// far from the others (1970 here) is refused, naming it, rather than moving them all.
    #[test]
    fn a_record_whose_profile_spans_more_than_an_hour_is_refused() {
        let t = 1_763_805_600_000_000_000;
        let (ok, ..) = crate::testing::parca_agent_record_at("00", 1, [t, t + 1_000_000_000, t]);
        write_arrow(&ok, &Limits::default()).unwrap();
        let (bad, ..) = crate::testing::parca_agent_record_at("00", 1, [t, 1, t]);
        let e = write_arrow(&bad, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1") && e.contains("span"), "{e}");
    }

    /// An IPC stream of one LZ4-compressed Int64 column of `n` values, schema `v2`.
    fn stream(n: i64) -> Vec<u8> {
        let schema = Arc::new(
            Schema::new(vec![Field::new("value", DataType::Int64, false)])
                .with_metadata([(SCHEMA_VERSION_KEY.to_owned(), "v2".to_owned())].into()),
        );
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..n))],
        )
        .unwrap();
        let options = arrow::ipc::writer::IpcWriteOptions::default()
            .try_with_compression(Some(arrow::ipc::CompressionType::LZ4_FRAME))
            .unwrap();
        let mut out = Vec::new();
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new_with_options(&mut out, &schema, options)
                .unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        out
    }

    #[test]
    fn a_record_that_states_more_than_the_limit_is_refused_before_it_is_decompressed() {
        let ipc = stream(10_000);
        assert!(ipc_decompressed_bytes(&ipc, usize::MAX).unwrap() >= 80_000);
        // The column's buffer states its length (80,000 bytes) in front: make it 1 TiB.
        let stated = 80_000i64.to_le_bytes();
        let at = ipc.windows(8).position(|w| w == stated).unwrap();
        let mut bomb = ipc.clone();
        bomb[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
        let e = ipc_decompressed_bytes(&bomb, 1 << 30).unwrap_err();
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded, "{e}");
        let e = write_arrow(&bomb, &Limits::default()).unwrap_err();
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded, "{e}");
        // Cut short, or not IPC at all: an error naming the byte.
        for bad in [
            &ipc[..ipc.len() / 2],
            b"\xff\xff\xff\xff\x10\x00\x00\x00abc",
        ] {
            let e = ipc_decompressed_bytes(bad, usize::MAX).unwrap_err();
            assert!(e.to_string().contains("byte "), "{e}");
        }
    }

    #[test]
    fn an_lz4_buffer_that_inflates_past_what_it_states_is_refused_before_arrow_inflates_it() {
        // arrow inflates an LZ4 frame to its end, taking the stated length as a hint: a
        // buffer stating 8 bytes held all 80,000 of the frame, counted as 8.
        let ipc = stream(10_000);
        let stated = 80_000i64.to_le_bytes();
        let at = ipc.windows(8).position(|w| w == stated).unwrap();
        let mut bomb = ipc.clone();
        bomb[at..at + 8].copy_from_slice(&8i64.to_le_bytes());
        let e = ipc_decompressed_bytes(&bomb, usize::MAX).unwrap_err();
        assert!(e.to_string().contains("inflates past the 8 bytes"), "{e}");
        let e = write_arrow(&bomb, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("LZ4"), "{e}");
        // Stating more than the frame holds is refused as well (a truncated frame).
        bomb[at..at + 8].copy_from_slice(&80_008i64.to_le_bytes());
        let e = ipc_decompressed_bytes(&bomb, usize::MAX).unwrap_err();
        assert!(e.to_string().contains("not the 80008"), "{e}");
    }

    #[test]
    fn each_dictionary_delta_counts_the_whole_dictionary_it_makes() {
        use arrow::array::DictionaryArray;
        // A delta is a few bytes, but arrow copies the dictionary whole to extend it, and
        // each batch keeps the copy it was decoded with.
        let field = Field::new(
            "s",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        );
        let schema = Arc::new(Schema::new(vec![field]));
        let options = arrow::ipc::writer::IpcWriteOptions::default()
            .with_dictionary_handling(arrow::ipc::writer::DictionaryHandling::Delta);
        let big = "x".repeat(1 << 16);
        let mut ipc = Vec::new();
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new_with_options(&mut ipc, &schema, options)
                .unwrap();
        let mut values = vec![big.clone()];
        for i in 0..32 {
            if i > 0 {
                values.push(format!("a{i}"));
            }
            let keys = arrow::array::Int32Array::from(vec![0]);
            let dictionary = arrow::array::StringArray::from(values.clone());
            let array = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(dictionary)).unwrap();
            w.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(array)]).unwrap())
                .unwrap();
        }
        w.finish().unwrap();
        drop(w);
        let counted = ipc_decompressed_bytes(&ipc, usize::MAX).unwrap();
        assert!(counted >= 32 << 16, "the copies are counted: {counted}");
        // The stream that names them is a fraction of that.
        assert!(
            ipc.len() < 4 << 16,
            "the stream itself is small: {}",
            ipc.len()
        );
        let e = ipc_decompressed_bytes(&ipc, 16 << 16).unwrap_err();
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded, "{e}");
    }

    /// The agent's record (`testing::parca_agent_record`) as batches, and back as an
    /// uncompressed IPC stream of `batches`.
    fn agent_batches() -> Vec<RecordBatch> {
        let (ipc, _, _) = crate::testing::parca_agent_record("00112233445566778899");
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(ipc), None)
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn ipc_of(batches: &[RecordBatch]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w =
            arrow::ipc::writer::StreamWriter::try_new(&mut out, &batches[0].schema()).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.finish().unwrap();
        drop(w);
        out
    }

    /// `b` with its column `name` replaced by `column` (of any type).
    fn with_column(b: &RecordBatch, name: &str, column: arrow::array::ArrayRef) -> RecordBatch {
        let at = b.schema().index_of(name).unwrap();
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[at] = Field::new(name, column.data_type().clone(), column.null_count() > 0);
        let mut columns = b.columns().to_vec();
        columns[at] = column;
        let schema = Arc::new(Schema::new(fields).with_metadata(b.schema().metadata().clone()));
        RecordBatch::try_new(schema, columns).unwrap()
    }

    /// A key column's value is refused on its length before it is copied, and the row loop
    /// stops once its request has ended: a dictionary or run-end column names one long
    /// value from every row for a few bytes, and each row was copied and hashed whole,
    /// for minutes after the request had timed out.
    #[test]
    fn a_long_key_value_is_refused_and_the_row_loop_stops_when_its_request_ends() {
        let batches = agent_batches();
        let limits = Limits::default();
        assert!(!write_arrow(&ipc_of(&batches), &limits).unwrap().is_empty());
        // The producer, one value of 1,025 bytes for every row.
        let b = &batches[0];
        let long = "p".repeat(MAX_KEY_BYTES + 1);
        let long = with_column(
            b,
            wire::PRODUCER,
            Arc::new(arrow::array::StringArray::from(vec![
                long.as_str();
                b.num_rows()
            ])),
        );
        let Err(e) = write_arrow(&ipc_of(&[long]), &limits) else {
            panic!("a long producer copied");
        };
        assert!(e.to_string().contains("its producer is 1025 bytes"), "{e}");
        // Enough rows and frames for the pace to ask, under a request that has ended.
        let many: Vec<RecordBatch> = std::iter::repeat_n(batches, 200).flatten().collect();
        let ipc = ipc_of(&many);
        assert!(!write_arrow(&ipc, &limits).unwrap().is_empty());
        let Err(e) = frostdb_core::stop_scans_when(
            || Some("the request ended".to_owned()),
            || write_arrow(&ipc, &limits),
        ) else {
            panic!("converted under a request that had ended");
        };
        assert_eq!(e.kind(), frostdb_core::ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("the request ended"), "{e}");
    }

    /// A request's rows make at most MAX_GROUPS profiles: a row each naming a sample type
    /// of its own made a profile each (a million of them from a record of a few MB, each
    /// holding copies of its key), before any series limit was asked.
    #[test]
    fn a_record_of_more_producers_and_types_than_profiles_may_be_is_refused() {
        let batches = agent_batches();
        let rows = |n: usize| {
            let many: Vec<RecordBatch> =
                std::iter::repeat_n(batches.clone(), n.div_ceil(batches[0].num_rows()))
                    .flatten()
                    .collect();
            let b = arrow::compute::concat_batches(&many[0].schema(), &many).unwrap();
            let b = b.slice(0, n);
            let types: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            with_column(
                &b,
                wire::SAMPLE_TYPE,
                Arc::new(arrow::array::StringArray::from(types)),
            )
        };
        let limits = Limits::default();
        let most = write_arrow(&ipc_of(&[rows(MAX_GROUPS)]), &limits).unwrap();
        assert_eq!(most.len(), MAX_GROUPS);
        let e = write_arrow(&ipc_of(&[rows(MAX_GROUPS + 1)]), &limits).unwrap_err();
        assert!(
            e.to_string()
                .contains("profiles (producers and sample types)"),
            "{e}"
        );
    }

    /// The `Write` stream's stacks record answers the samples' ids: no more rows than
    /// samples may be, each id once. A run-end encoded id column stated billions of rows,
    /// each kept and hashed, with no pace and no charge; an id given twice kept the last.
    #[test]
    fn a_locations_record_of_more_stacks_than_samples_or_an_id_twice_is_refused() {
        let (samples, locations, ..) =
            crate::testing::parca_agent_v1_records("00112233445566778899");
        let limits = Limits::default();
        assert_eq!(write_v1(&samples, &locations, &limits).unwrap().len(), 2);
        let stacks: Vec<RecordBatch> =
            arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(&locations), None)
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let rows: usize = stacks.iter().map(RecordBatch::num_rows).sum();
        let few = Limits {
            max_samples: rows - 1,
            ..limits
        };
        let e = write_v1(&samples, &locations, &few).unwrap_err();
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded, "{e}");
        assert!(
            e.to_string().contains("stacks of the locations record"),
            "{e}"
        );
        let twice: Vec<RecordBatch> = stacks.iter().chain(&stacks).cloned().collect();
        let e = write_v1(&samples, &ipc_of(&twice), &limits).unwrap_err();
        assert!(
            e.to_string().contains("a stack trace id given twice"),
            "{e}"
        );
        // Each id kept is charged.
        let (_, asked) = crate::decode::charge::under_budget(usize::MAX, || {
            write_v1(&samples, &locations, &limits).unwrap()
        });
        assert!(asked >= rows * 64, "{asked}");
    }

    /// A null in an Arrow column is no value, whatever its slot holds: a null location in a
    /// stack is refused (its key slot, zero, named another stack's location), and a null
    /// labels row has no labels (its children's values there are undefined).
    #[test]
    fn a_null_location_is_refused_and_a_null_labels_row_has_no_labels() {
        use arrow::array::{DictionaryArray, ListViewArray, StructArray, UInt32Array};
        use arrow::buffer::NullBuffer;
        let batches = agent_batches();
        let b = &batches[0];
        let limits = Limits::default();
        let labelled = |incoming: &[Incoming]| -> usize {
            incoming
                .iter()
                .map(|i| {
                    i.profile
                        .flat()
                        .samples()
                        .filter(|s| !s.label.is_empty())
                        .count()
                })
                .sum()
        };
        let all = labelled(&write_arrow(&ipc_of(&batches), &limits).unwrap());
        assert_eq!(all, b.num_rows(), "every sample of the record is labelled");
        let labels = b.column_by_name(wire::LABELS).unwrap().as_struct().clone();
        let (fields, columns, _) = labels.into_parts();
        let mut valid = vec![true; b.num_rows()];
        valid[0] = false;
        let nulled = StructArray::try_new(fields, columns, Some(NullBuffer::from(valid))).unwrap();
        let one_null = with_column(b, wire::LABELS, Arc::new(nulled));
        let incoming = write_arrow(&ipc_of(&[one_null]), &limits).unwrap();
        assert_eq!(
            labelled(&incoming),
            all - 1,
            "the null row took its children's labels"
        );

        // The stacks' second location entry made null.
        let stacks = b.column_by_name(wire::STACKTRACE).unwrap();
        let stacks = stacks.as_any().downcast_ref::<ListViewArray>().unwrap();
        let entries = stacks.values().as_dictionary::<UInt32Type>();
        let mut keys: Vec<Option<u32>> = entries.keys().iter().collect();
        keys[1] = None;
        let entries = DictionaryArray::<UInt32Type>::try_new(
            UInt32Array::from(keys),
            entries.values().clone(),
        )
        .unwrap();
        let (field, offsets, sizes, _, nulls) = stacks.clone().into_parts();
        let nulled = ListViewArray::new(field, offsets, sizes, Arc::new(entries), nulls);
        let b = with_column(b, wire::STACKTRACE, Arc::new(nulled));
        let e = write_arrow(&ipc_of(&[b]), &limits).unwrap_err();
        assert!(e.to_string().contains("a null location"), "{e}");
    }

    /// A location's lines are frames of its stacks: more than a stack may hold is refused
    /// before they are made, and those within are charged; a timestamp in any unit is read
    /// as nanoseconds, not a panic.
    #[test]
    fn a_locations_lines_are_bounded_and_timestamps_of_any_unit_read() {
        let limits = Limits::default();
        let lines = |n: usize| {
            let (ipc, _, _) = crate::testing::parca_agent_record_of("00112233445566778899", n);
            write_arrow(&ipc, &limits)
        };
        assert!(!lines(64).unwrap().is_empty());
        let Err(e) = lines(limits.max_stack_depth + 1) else {
            panic!("a location of more lines than a stack may hold, converted");
        };
        assert!(e.to_string().contains("lines of a location"), "{e}");
        let (_, asked) =
            crate::decode::charge::under_budget(usize::MAX, || lines(limits.max_stack_depth));
        assert!(asked >= limits.max_stack_depth * std::mem::size_of::<Line>());
        // The agent's nanosecond timestamps, sent in milliseconds instead.
        let batches = agent_batches();
        let b = &batches[0];
        let ms = arrow::compute::cast(
            b.column_by_name(wire::TIMESTAMP).unwrap(),
            &DataType::Timestamp(arrow::datatypes::TimeUnit::Millisecond, None),
        )
        .unwrap();
        let in_ms = with_column(b, wire::TIMESTAMP, ms);
        let times = |batches: &[RecordBatch]| -> Vec<i64> {
            write_arrow(&ipc_of(batches), &limits)
                .unwrap()
                .iter()
                .map(|p| p.profile.time_nanos())
                .collect()
        };
        assert_eq!(times(&[in_ms]), times(&batches[..1]));
    }

    /// A mapping's strings are bounded as a frame's are, and functions are counted as they
    /// are made: each mapping and function is keyed by its strings' places in the string
    /// table, every string kept once (keyed by copies, one 64 MiB file name under 64 build
    /// ids kept 4 GiB of keys, uncharged).
    #[test]
    fn mappings_and_functions_are_bounded_as_they_are_made() {
        let limits = Limits::default();
        let long = "0".repeat(crate::convert::trie::MAX_FRAME_BYTES + 1);
        let (ipc, _, _) = crate::testing::parca_agent_record(&long);
        let e = write_arrow(&ipc, &limits).err().unwrap().to_string();
        assert!(e.contains("mapping's file name or build id"), "{e}");
        let (ipc, _, _) = crate::testing::parca_agent_record("00112233445566778899");
        let profiles = write_arrow(&ipc, &limits).unwrap();
        // Two functions in the record: refused while converting, not at validation after.
        let one = Limits {
            max_functions: 1,
            ..limits
        };
        let e = write_arrow(&ipc, &one).err().unwrap().to_string();
        assert!(e.contains("functions exceeds the limit of 1"), "{e}");
        // Keyed by index, still one mapping per file and build id, and one function per
        // name, file and start line.
        for p in &profiles {
            let p = p.profile.flat();
            let mappings: std::collections::HashSet<(&str, &str)> = p
                .mapping
                .iter()
                .map(|m| (p.string(m.filename), p.string(m.build_id)))
                .collect();
            assert!(!mappings.is_empty());
            assert_eq!(mappings.len(), p.mapping.len());
            let functions: std::collections::HashSet<(&str, &str, i64)> = p
                .function
                .iter()
                .map(|f| (p.string(f.name), p.string(f.filename), f.start_line))
                .collect();
            assert_eq!(functions.len(), p.function.len());
        }
    }
}
