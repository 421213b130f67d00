//! The tables profiles are stored in: one row per (sample, sample type) in `samples`, and
//! the symbols those rows point to. These are the only definitions of the profile layout:
//! the store, the server, the CLI and the benchmarks all use them.
//!
//! | table | columns |
//! |---|---|
//! | `samples` | `name`, `sample_type`, `sample_unit`, `period_type`, `period_unit`, `labels.*`, `stacktrace_id`, `timestamp` (ms), `duration` (ns), `period`, `value` |
//! | `spans` | the columns of `samples`; rows of samples labelled with a span or trace id ([`SPAN_LABELS`]) |
//! | `totals` | the series columns of `samples`, `timestamp`, `duration`, `period`, `value`: per profile, type and label set, the sum of its samples (what range queries read) |
//! | `rollups_1h`, `rollups_1d` | the columns of `samples`; per series, stack and hour (day), the summed value (`frostdb_pprof::rollup`) |
//! | `rollup_buckets` | `level`, `timestamp`: the hours and days rolled up |
//! | `series_keys` | `key`, `timestamp` (the start of a day): per series (profile name and labels) and day with samples, its key; what the series limit counts (`frostdb_pprof::limits`) |
//! | `fingerprints` | `fingerprint` (16 bytes), `timestamp`: per stored profile, its content fingerprint, by which a profile stored again is recognised (`frostdb_pprof::ProfileStore::ingest`) |
//! | `stacktraces` | `stacktrace_id`, `location_ids` (u32 location indices of the stack's partition, leaf first, little-endian, concatenated) |
//! | `locations` | `location_id`, `mapping_id` (null: none), `address`, `lines` (per line a u32 function index and an i64 line, innermost first), `is_folded` |
//! | `functions` | `function_id`, `name`, `system_name`, `filename`, `start_line` |
//! | `mappings` | `mapping_id`, `memory_start`, `memory_limit`, `file_offset`, `filename`, `build_id`, `flags` |
//!
//! Symbol ids are u64: a symbol partition in the high 32 bits, the symbol's index within it
//! in the low 32 (see [`crate::ids`]). Within a partition every stack, location, function
//! and mapping is stored once; a partition closes past a size or an age, and is deleted when
//! no retained sample refers to it.
//!
//! Span and trace ids are not series labels: a profiler labelling each request's samples
//! with its span (as `pyroscope-otel` does) would otherwise make a series per request. The
//! `samples` rows leave them out (samples differing only by span add up); the same samples
//! are also written, with their span labels, to `spans`, which a merge whose selector
//! matches on a span label reads (`frostdb_pprof::ProfileStore::merge`), as Pyroscope's span
//! profiles do. Label names and values (the `samples` table) do not list them.

use arrow::datatypes::DataType;
use frostdb_core::{ColumnDef, Compression, Encoding, Schema, SortingColumn};

/// The columns of the series tables (samples, spans, totals, rollups, the series index):
/// the only place their names are spelled. A test fails if one appears as a string literal
/// outside this module.
pub mod column {
    /// The profile's name (`process_cpu`, `memory`): the first part of its profile type.
    pub const NAME: &str = "name";
    /// What a sample measures (`cpu`, `alloc_space`).
    pub const SAMPLE_TYPE: &str = "sample_type";
    /// The unit of a sample's value (`nanoseconds`, `bytes`).
    pub const SAMPLE_UNIT: &str = "sample_unit";
    /// What the sampling period counts.
    pub const PERIOD_TYPE: &str = "period_type";
    /// The unit of the period.
    pub const PERIOD_UNIT: &str = "period_unit";
    /// The dynamic column of labels: one column `labels.<name>` per label name.
    pub const LABELS: &str = "labels";
    /// A sample's stack, as a symbol id ([`crate::ids`]).
    pub const STACKTRACE_ID: &str = "stacktrace_id";
    /// Milliseconds since the Unix epoch.
    pub const TIMESTAMP: &str = "timestamp";
    /// The profile's duration, in nanoseconds.
    pub const DURATION: &str = "duration";
    /// The sampling period, in the period's unit.
    pub const PERIOD: &str = "period";
    /// A sample's value, in the sample unit.
    pub const VALUE: &str = "value";
    /// Of a profile totals row, which profile it is of, apart from the others of its time
    /// (a hash of its name and request labels, without pprof sample labels: the profile's
    /// totals rows of each sample label set share it). Null in rows stored before it.
    pub const PROFILE_KEY: &str = "profile_key";

    /// The five columns of a profile type, in its order
    /// (`name:sample_type:sample_unit:period_type:period_unit`).
    pub const PROFILE_TYPE: [&str; 5] = [NAME, SAMPLE_TYPE, SAMPLE_UNIT, PERIOD_TYPE, PERIOD_UNIT];

    /// The prefix of a label's column.
    pub const LABEL_PREFIX: &str = "labels.";

    /// The column of label `name`: `labels.<name>`.
    pub fn label_column(name: &str) -> String {
        format!("{LABEL_PREFIX}{name}")
    }

    /// The label a column holds (`labels.pod` holds `pod`), if it is a label column.
    pub fn label_of(column: &str) -> Option<&str> {
        column.strip_prefix(LABEL_PREFIX)
    }
}

use column::*;

/// Table of samples.
pub const SAMPLES: &str = "samples";
/// Table of samples by span (see the module docs).
pub const SPANS: &str = "spans";
/// The series index: one row per series, profile type and hour with samples.
pub const SERIES: &str = "series";
/// The series index's time granularity: rows are per hour.
pub const SERIES_BUCKET_MS: i64 = 3_600_000;

/// Profile totals: per profile, sample type and label set, the sum of its samples' values,
/// which series over time (range queries) read instead of every sample row, as Pyroscope's
/// per-profile `TotalValue` does.
pub const TOTALS: &str = "totals";
/// Hourly rollups: per series and hour, the summed value per stack (the samples' columns,
/// `timestamp` the start of the hour). See `frostdb_pprof::rollup`.
pub const ROLLUPS_HOURLY: &str = "rollups_1h";
/// Daily rollups: per series and day (UTC), the summed value per stack.
pub const ROLLUPS_DAILY: &str = "rollups_1d";
/// Which hours and days the rollups hold: a row per `(level, timestamp)` rolled up, committed
/// with that bucket's rollup rows.
pub const ROLLUP_BUCKETS: &str = "rollup_buckets";

/// The series keys: a row per series (a profile name and label set, as
/// `frostdb_pprof::StoreOptions::max_series` counts them) and day with
/// samples, `key` a hash of the series; a store limited in series counts what it holds from
/// them when opened, reading one column (`frostdb_pprof::limits`).
pub const SERIES_KEYS: &str = "series_keys";
/// The series keys' time granularity: rows are per day (UTC).
pub const SERIES_KEYS_BUCKET_MS: i64 = 24 * 3_600_000;

/// The profiles' content fingerprints: a row per stored profile, its fingerprint (a 128-bit
/// hash of its series, timestamp and samples) and timestamp, committed with its samples. A
/// store reads those of the recent profiles when it opens, to store a profile pushed again
/// once (`frostdb_pprof::ProfileStore::ingest`). Stores written before it have none: their
/// profiles are not recognised.
pub const FINGERPRINTS: &str = "fingerprints";

/// Whether a samples column is one of the series index's (the profile type, labels and
/// timestamp), not one of a sample's own.
pub fn is_series_column(name: &str) -> bool {
    ![STACKTRACE_ID, DURATION, PERIOD, VALUE].contains(&name)
}
/// Sample labels that identify a span or trace rather than a series.
pub const SPAN_LABELS: [&str; 2] = ["span_id", "trace_id"];
/// Table of stacks.
pub const STACKTRACES: &str = "stacktraces";
/// Table of locations.
pub const LOCATIONS: &str = "locations";
/// Table of functions.
pub const FUNCTIONS: &str = "functions";
/// Table of mappings.
pub const MAPPINGS: &str = "mappings";
/// Table of the names a symbolizer found for locations stored as addresses.
pub const SYMBOL_NAMES: &str = "symbol_names";

const ID: DataType = DataType::UInt64;

fn dict(name: &str) -> ColumnDef {
    ColumnDef::new(name, DataType::Utf8).encoding(Encoding::RleDictionary)
}

fn schema(
    name: &str,
    build: impl FnOnce(frostdb_core::SchemaBuilder) -> frostdb_core::SchemaBuilder,
) -> Schema {
    build(Schema::builder(name))
        .build()
        .expect("the profile schemas are valid")
}

/// The samples table: sorted by profile type, series (labels in [`LABELS_FIRST`] order, then
/// by name), time, stack, so a series over a time range is a contiguous slice, a pod's or a
/// service's series are neighbours, and timestamps compress to runs. `stacktrace_id` is the
/// stack's symbol id.
pub fn samples() -> Schema {
    sample_schema(SAMPLES, LabelOrder::Hierarchy)
}

/// The spans table: the samples table's columns, sorted the same way (a span's labels are
/// `labels.span_id` and `labels.trace_id`).
pub fn spans() -> Schema {
    sample_schema(SPANS, LabelOrder::Hierarchy)
}

/// The labels that lead the series part of the sort key, outermost first: a service's,
/// namespace's, job's or pod's series are then adjacent, and a selector naming one reads a
/// contiguous run of rows (in name order, `container` would lead, and one pod's rows would
/// lie in as many places as it has containers). Other labels follow by name.
pub const LABELS_FIRST: [&str; 6] = [
    "service_name",
    "namespace",
    "job",
    "pod",
    "instance",
    "container",
];

/// How a series table sorts its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelOrder {
    /// [`LABELS_FIRST`], then by name: tables made now.
    Hierarchy,
    /// By name: tables made before [`LABELS_FIRST`], opened as they were made.
    Names,
}

/// The columns that name a series of a profile type (profile type, labels), then `rest`,
/// sorted by them and then by `order`.
fn series_schema(
    name: &str,
    labels: LabelOrder,
    rest: impl FnOnce(frostdb_core::SchemaBuilder) -> frostdb_core::SchemaBuilder,
    order: &[&str],
) -> Schema {
    schema(name, |b| {
        let mut b = rest(
            b.column(dict(NAME).compression(LABEL_CODEC))
                .column(dict(SAMPLE_TYPE).compression(LABEL_CODEC))
                .column(dict(SAMPLE_UNIT).compression(LABEL_CODEC))
                .column(dict(PERIOD_TYPE).compression(LABEL_CODEC))
                .column(dict(PERIOD_UNIT).compression(LABEL_CODEC))
                .column(
                    ColumnDef::dynamic(LABELS, DataType::Utf8)
                        .encoding(Encoding::RleDictionary)
                        .compression(LABEL_CODEC),
                ),
        );
        for column in PROFILE_TYPE {
            b = b.sort_by(SortingColumn::asc(column));
        }
        b = b.sort_by(match labels {
            LabelOrder::Hierarchy => SortingColumn::asc(LABELS).labels_first(LABELS_FIRST),
            LabelOrder::Names => SortingColumn::asc(LABELS),
        });
        for column in order {
            b = b.sort_by(SortingColumn::asc(*column));
        }
        b
    })
}

/// Compression of the profile type and label columns: none. Their dictionary-coded pages
/// are runs of a few keys, which zstd makes larger, and each compressed column a query reads
/// costs it a zstd context per row group (about a tenth of a small merge's time).
const LABEL_CODEC: Compression = Compression::Uncompressed;

fn sample_schema(name: &str, labels: LabelOrder) -> Schema {
    series_schema(
        name,
        labels,
        |b| {
            // Stack ids and values are most of a block's bytes and stay zstd; timestamps
            // (delta-coded runs) read faster as LZ4 for 4% more bytes per sample.
            b.column(ColumnDef::new(STACKTRACE_ID, ID).encoding(Encoding::RleDictionary))
                .column(
                    ColumnDef::new(TIMESTAMP, DataType::Int64)
                        .encoding(Encoding::DeltaBinaryPacked)
                        .compression(Compression::Lz4Raw),
                )
                .column(
                    ColumnDef::new(DURATION, DataType::Int64)
                        .encoding(Encoding::RleDictionary)
                        .compression(LABEL_CODEC),
                )
                .column(
                    ColumnDef::new(PERIOD, DataType::Int64)
                        .encoding(Encoding::RleDictionary)
                        .compression(LABEL_CODEC),
                )
                .column(ColumnDef::new(VALUE, DataType::Int64).encoding(Encoding::RleDictionary))
        },
        &[TIMESTAMP, STACKTRACE_ID],
    )
}

/// The totals table ([`TOTALS`]): the series columns, `timestamp`, `duration`, `period`,
/// `value`, the sum of the values of a profile's samples of one type and label set, and
/// [`PROFILE_KEY`], which profile of its time the row is of.
pub fn totals() -> Schema {
    totals_schema(LabelOrder::Hierarchy, true)
}

/// The totals table as made before [`PROFILE_KEY`] (its rows cannot tell apart the
/// profiles of one time in a group of series; see `native::range`).
pub fn totals_without_profile_keys() -> Schema {
    totals_schema(LabelOrder::Hierarchy, false)
}

fn totals_schema(labels: LabelOrder, keyed: bool) -> Schema {
    series_schema(
        TOTALS,
        labels,
        |b| {
            let b = b
                .column(
                    ColumnDef::new(TIMESTAMP, DataType::Int64)
                        .encoding(Encoding::DeltaBinaryPacked),
                )
                .column(ColumnDef::new(DURATION, DataType::Int64).encoding(Encoding::RleDictionary))
                .column(ColumnDef::new(PERIOD, DataType::Int64).encoding(Encoding::RleDictionary))
                .column(ColumnDef::new(VALUE, DataType::Int64));
            if !keyed {
                return b;
            }
            // A series' rows share it (its request labels do not change): runs of one value.
            b.column(
                ColumnDef::new(PROFILE_KEY, DataType::UInt64)
                    .nullable(true)
                    .encoding(Encoding::RleDictionary),
            )
        },
        &[TIMESTAMP],
    )
}

/// A rollup table ([`ROLLUPS_HOURLY`], [`ROLLUPS_DAILY`]): the samples table's columns and
/// order; a row sums a stack's values of one series over a bucket, `timestamp` its start.
pub fn rollups(name: &str) -> Schema {
    sample_schema(name, LabelOrder::Hierarchy)
}

/// The buckets the rollups hold ([`ROLLUP_BUCKETS`]): `level` (`1h`, `1d`) and `timestamp`.
pub fn rollup_buckets() -> Schema {
    schema(ROLLUP_BUCKETS, |b| {
        b.column(dict("level"))
            .column(ColumnDef::new(TIMESTAMP, DataType::Int64))
            .sort_by(SortingColumn::asc("level"))
            .sort_by(SortingColumn::asc(TIMESTAMP))
    })
}

/// The series index: the samples table's profile type and label columns, and `timestamp`,
/// the start of an hour in which the series has samples of that type. Label names and
/// values are answered from it without reading a sample row.
pub fn series() -> Schema {
    series_index_schema(LabelOrder::Hierarchy)
}

fn series_index_schema(labels: LabelOrder) -> Schema {
    series_schema(
        SERIES,
        labels,
        |b| {
            b.column(
                ColumnDef::new(TIMESTAMP, DataType::Int64).encoding(Encoding::DeltaBinaryPacked),
            )
        },
        &[TIMESTAMP],
    )
}

/// The series keys ([`SERIES_KEYS`]): `key` (u64) and `timestamp`, the start of a day.
pub fn series_keys() -> Schema {
    schema(SERIES_KEYS, |b| {
        b.column(ColumnDef::new("key", DataType::UInt64))
            .column(ColumnDef::new(TIMESTAMP, DataType::Int64).encoding(Encoding::RleDictionary))
            .sort_by(SortingColumn::asc("key"))
            .sort_by(SortingColumn::asc(TIMESTAMP))
    })
}

/// The fingerprints ([`FINGERPRINTS`]): `fingerprint` (16 bytes, little-endian) and
/// `timestamp` (ms), sorted by time, so that reading the recent ones skips older blocks.
pub fn fingerprints() -> Schema {
    schema(FINGERPRINTS, |b| {
        // Hashes do not compress.
        b.column(
            ColumnDef::new("fingerprint", DataType::FixedSizeBinary(16))
                .compression(Compression::Uncompressed),
        )
        .column(ColumnDef::new(TIMESTAMP, DataType::Int64).encoding(Encoding::DeltaBinaryPacked))
        .sort_by(SortingColumn::asc(TIMESTAMP))
        .sort_by(SortingColumn::asc("fingerprint"))
    })
}

/// The schema of series table `name` (samples, spans, totals, rollups, the series index)
/// with its labels sorted `labels`; `None` for other tables.
pub fn series_table(name: &str, labels: LabelOrder) -> Option<Schema> {
    match name {
        SAMPLES | SPANS | ROLLUPS_HOURLY | ROLLUPS_DAILY => Some(sample_schema(name, labels)),
        TOTALS => Some(totals_schema(labels, true)),
        SERIES => Some(series_index_schema(labels)),
        _ => None,
    }
}

/// Opens series table `name` (see [`series_table`]), creating it with its labels in
/// hierarchy order; a table made before that order keeps sorting its labels by name, as its
/// rows are, and a totals table made before [`PROFILE_KEY`] stays without it (see
/// [`has_profile_keys`]).
pub fn open_series_table(
    db: &frostdb_core::Db,
    name: &str,
    options: frostdb_core::TableOptions,
) -> frostdb_core::Result<frostdb_core::Table> {
    let in_order = |labels| series_table(name, labels).expect("a series table");
    // What it is made as now first, then as it may have been made before.
    let mut made = vec![in_order(LabelOrder::Hierarchy), in_order(LabelOrder::Names)];
    if name == TOTALS {
        made.extend([
            totals_schema(LabelOrder::Hierarchy, false),
            totals_schema(LabelOrder::Names, false),
        ]);
    }
    let schema = match db.get_table(name) {
        Some(existing) => made
            .iter()
            .find(|s| existing.schema().same_rows_as(s))
            .cloned()
            .unwrap_or_else(|| made.swap_remove(0)),
        None => made.swap_remove(0),
    };
    db.table(name, schema, options)
}

/// Whether a totals table's rows may hold [`PROFILE_KEY`] (one made before it cannot).
pub fn has_profile_keys(table: &frostdb_core::Table) -> bool {
    table
        .schema()
        .columns()
        .iter()
        .any(|c| c.name() == PROFILE_KEY)
}

/// The stacks table.
pub fn stacktraces() -> Schema {
    schema(STACKTRACES, |b| {
        b.column(ColumnDef::new(STACKTRACE_ID, ID).encoding(Encoding::DeltaBinaryPacked))
            .column(ColumnDef::new("location_ids", DataType::Binary))
            .sort_by(SortingColumn::asc(STACKTRACE_ID))
    })
}

/// The locations table.
pub fn locations() -> Schema {
    schema(LOCATIONS, |b| {
        b.column(ColumnDef::new("location_id", ID).encoding(Encoding::DeltaBinaryPacked))
            .column(ColumnDef::new("mapping_id", ID).nullable(true))
            .column(ColumnDef::new("address", DataType::UInt64))
            .column(ColumnDef::new("lines", DataType::Binary))
            .column(ColumnDef::new("is_folded", DataType::Boolean))
            .sort_by(SortingColumn::asc("location_id"))
    })
}

/// The functions table.
pub fn functions() -> Schema {
    schema(FUNCTIONS, |b| {
        b.column(ColumnDef::new("function_id", ID).encoding(Encoding::DeltaBinaryPacked))
            .column(ColumnDef::new("name", DataType::Utf8))
            .column(ColumnDef::new("system_name", DataType::Utf8))
            .column(dict("filename"))
            .column(ColumnDef::new("start_line", DataType::Int64))
            .sort_by(SortingColumn::asc("function_id"))
    })
}

/// The mappings table.
pub fn mappings() -> Schema {
    schema(MAPPINGS, |b| {
        b.column(ColumnDef::new("mapping_id", ID).encoding(Encoding::DeltaBinaryPacked))
            .column(ColumnDef::new("memory_start", DataType::UInt64))
            .column(ColumnDef::new("memory_limit", DataType::UInt64))
            .column(ColumnDef::new("file_offset", DataType::UInt64))
            .column(dict("filename"))
            .column(dict("build_id"))
            .column(ColumnDef::new("flags", DataType::UInt8))
            .sort_by(SortingColumn::asc("mapping_id"))
    })
}

/// The names a symbolizer found for locations stored without lines (see
/// `frostdb_pprof::symbolize`): per location, its lines innermost first, packed (per line
/// the function's and the file's lengths and bytes, then the line). A location named again
/// from better debug info has a later row; the one knowing source files wins on reading.
pub fn symbol_names() -> Schema {
    schema(SYMBOL_NAMES, |b| {
        b.column(ColumnDef::new("location_id", ID).encoding(Encoding::DeltaBinaryPacked))
            .column(ColumnDef::new("lines", DataType::Binary))
            .sort_by(SortingColumn::asc("location_id"))
    })
}
