//! Helpers shared by the scenario tests.
#![allow(dead_code)]

pub(crate) mod faults;

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use arrow::util::pretty::pretty_format_batches;
use frostdb_core::{ColumnDef, Encoding, Schema, SortingColumn};

/// A small profile-shaped schema: name, labels.*, timestamp, value.
pub(crate) fn samples_schema() -> Schema {
    Schema::builder("samples")
        .column(ColumnDef::new("name", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::new("timestamp", DataType::Int64).encoding(Encoding::DeltaBinaryPacked))
        .column(ColumnDef::new("value", DataType::Int64).nullable(true))
        .sort_by(SortingColumn::asc("name"))
        .sort_by(SortingColumn::asc("labels"))
        .sort_by(SortingColumn::asc("timestamp"))
        .build()
        .expect("valid schema")
}

/// A batch from named columns; string columns given as `Vec<Option<&str>>`.
pub(crate) fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .expect("valid batch")
}

pub(crate) fn strs(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(values.to_vec()))
}

pub(crate) fn str_n(value: &str, n: usize) -> ArrayRef {
    Arc::new(StringArray::from(vec![value; n]))
}

pub(crate) fn ints(values: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(values.to_vec()))
}

/// Batches rendered as a table, for readable equality assertions.
pub(crate) fn render(batches: &[RecordBatch]) -> String {
    pretty_format_batches(batches)
        .expect("printable")
        .to_string()
}

pub(crate) fn count(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}
