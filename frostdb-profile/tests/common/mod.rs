//! A small profile table, and the rows it holds, for checking query results by hand.
#![allow(dead_code)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use frostdb_core::{ColumnDef, Encoding, Schema, SortingColumn, Table};

pub(crate) fn samples_schema() -> Schema {
    schema(false)
}

/// [`samples_schema`] with a nullable `period` column after `value`.
pub(crate) fn samples_schema_with_period() -> Schema {
    schema(true)
}

fn schema(period: bool) -> Schema {
    let dict = |n: &str| ColumnDef::new(n, DataType::Utf8).encoding(Encoding::RleDictionary);
    let mut b = Schema::builder("samples")
        .column(dict("name"))
        .column(dict("sample_type"))
        .column(dict("sample_unit"))
        .column(dict("period_type"))
        .column(dict("period_unit"))
        .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::new("stacktrace_id", DataType::UInt64))
        .column(ColumnDef::new("timestamp", DataType::Int64))
        .column(ColumnDef::new("value", DataType::Int64));
    if period {
        b = b.column(ColumnDef::new("period", DataType::Int64).nullable(true));
    }
    b.sort_by(SortingColumn::asc("name"))
        .sort_by(SortingColumn::asc("labels"))
        .sort_by(SortingColumn::asc("timestamp"))
        .sort_by(SortingColumn::asc("stacktrace_id"))
        .build()
        .unwrap()
}

/// One sample, as the test knows it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) job: String,
    pub(crate) pod: String,
    /// Only some series have `env`.
    pub(crate) env: Option<String>,
    pub(crate) stack: u64,
    pub(crate) timestamp: i64,
    pub(crate) value: i64,
}

pub(crate) const START_MS: i64 = 1_700_000_000_000;

/// `series` series (pods `p0`.., jobs `api`/`db` alternating, `env=prod` on every third),
/// a cpu and a memory profile every `step_ms` for `steps` steps, `stacks` samples each.
pub(crate) fn rows(series: usize, steps: usize, step_ms: i64, stacks: u64) -> Vec<Row> {
    let mut out = Vec::new();
    for step in 0..steps {
        for s in 0..series {
            for (name, scale) in [("cpu", 10), ("memory", 1000)] {
                for k in 0..stacks {
                    out.push(Row {
                        name,
                        job: if s % 2 == 0 { "api" } else { "db" }.to_owned(),
                        pod: format!("p{s}"),
                        env: (s % 3 == 0).then(|| "prod".to_owned()),
                        stack: (s as u64 * 7 + k * 13) % 50,
                        timestamp: START_MS + step as i64 * step_ms,
                        value: scale * (1 + ((step + s + k as usize) % 7) as i64),
                    });
                }
            }
        }
    }
    out
}

/// Inserts `rows` one profile (series, type, timestamp) per batch.
pub(crate) fn insert(table: &Table, rows: &[Row]) {
    let mut i = 0;
    while i < rows.len() {
        let first = &rows[i];
        let mut j = i;
        while j < rows.len()
            && rows[j].pod == first.pod
            && rows[j].name == first.name
            && rows[j].timestamp == first.timestamp
        {
            j += 1;
        }
        table.insert(&batch(&rows[i..j])).unwrap();
        i = j;
    }
}

/// Inserts `rows` in batches of `size` rows, several profiles per batch (a bulk load).
pub(crate) fn insert_bulk(table: &Table, rows: &[Row], size: usize) {
    for chunk in rows.chunks(size) {
        let (cpu, memory): (Vec<Row>, Vec<Row>) =
            chunk.iter().cloned().partition(|r| r.name == "cpu");
        for part in [cpu, memory] {
            if !part.is_empty() {
                table.insert(&batch(&part)).unwrap();
            }
        }
    }
}

fn batch(rows: &[Row]) -> RecordBatch {
    let n = rows.len();
    let text = |f: &dyn Fn(&Row) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    };
    let (unit, sample_type, period_type) = match rows[0].name {
        "cpu" => ("nanoseconds", "cpu", "cpu"),
        _ => ("bytes", "alloc_space", "space"),
    };
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("name", text(&|r| r.name.to_owned())),
        (
            "sample_type",
            Arc::new(StringArray::from(vec![sample_type; n])),
        ),
        ("sample_unit", Arc::new(StringArray::from(vec![unit; n]))),
        (
            "period_type",
            Arc::new(StringArray::from(vec![period_type; n])),
        ),
        ("period_unit", Arc::new(StringArray::from(vec![unit; n]))),
        ("labels.job", text(&|r| r.job.clone())),
        ("labels.pod", text(&|r| r.pod.clone())),
        (
            "stacktrace_id",
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.stack))),
        ),
        (
            "timestamp",
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.timestamp),
            )),
        ),
        (
            "value",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.value))),
        ),
    ];
    if rows.iter().any(|r| r.env.is_some()) {
        let env: ArrayRef = Arc::new(StringArray::from_iter(rows.iter().map(|r| r.env.clone())));
        columns.push(("labels.env", env));
    }
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}
