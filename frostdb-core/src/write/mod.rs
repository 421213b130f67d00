//! The write path's first half: checking an inserted batch against the schema and bringing it
//! into the engine's normal form, before any lock is taken.
//!
//! Normal form: columns in canonical order (static columns in definition order, concrete
//! dynamic columns in label order), each with its storage type (dictionary-encoded byte
//! columns as `Dictionary(Int32, _)`).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, new_null_array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Schema as ArrowSchema};
use arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};
use crate::options::TableOptions;
use crate::schema::types::accepts;
use crate::schema::{ColumnName, Schema};

/// A batch in normal form, with the resolved names of its columns.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) columns: Vec<ColumnName>,
    pub(crate) batch: RecordBatch,
}

/// Checks `batch` against `schema` and `options` and normalises it. An empty batch gives
/// `None`: it is accepted and changes nothing.
pub(crate) fn prepare(
    schema: &Schema,
    options: &TableOptions,
    batch: &RecordBatch,
) -> Result<Option<Prepared>> {
    let table = || schema.name().to_owned();
    let rows = batch.num_rows();
    if rows == 0 {
        return Ok(None);
    }
    if rows > options.max_batch_rows {
        return Err(Error::BatchTooLarge {
            table: table(),
            what: "rows",
            got: rows,
            limit: options.max_batch_rows,
        });
    }
    let bytes = batch.get_array_memory_size();
    if bytes > options.max_batch_bytes {
        return Err(Error::BatchTooLarge {
            table: table(),
            what: "bytes",
            got: bytes,
            limit: options.max_batch_bytes,
        });
    }
    normalise(schema, batch, true).map(Some)
}

/// Checks `batch`'s columns against `schema` and brings them into their storage types;
/// `whole`: the batch must hold every column that is not nullable (a batch to store,
/// not one to sort: see [`crate::Table::sort_indices`]).
pub(crate) fn normalise(schema: &Schema, batch: &RecordBatch, whole: bool) -> Result<Prepared> {
    let table = || schema.name().to_owned();
    let rows = batch.num_rows();
    let mut columns: Vec<(ColumnName, ArrayRef)> = Vec::with_capacity(batch.num_columns());
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        let name = ColumnName::resolve(schema, field.name())?;
        let def = &schema.columns()[name.def];
        let logical = def.data_type();
        let array = if array.data_type() == &DataType::Null && def.is_nullable() {
            new_null_array(&def.storage_type(), rows)
        } else if accepts(logical, array.data_type()) {
            let storage = def.storage_type();
            if array.data_type() == &storage {
                array.clone()
            } else if matches!(storage, DataType::Dictionary(_, _))
                && let Some(encoded) = crate::dictionary::encode(array)?
            {
                encoded
            } else {
                cast(array, &storage)?
            }
        } else {
            return Err(Error::TypeMismatch {
                table: table(),
                column: field.name().clone(),
                expected: logical.clone(),
                got: array.data_type().clone(),
            });
        };
        if !def.is_nullable() {
            let nulls = array.logical_null_count();
            if nulls > 0 {
                return Err(Error::NullViolation {
                    table: table(),
                    column: field.name().clone(),
                    problem: format!("holds {nulls} nulls"),
                });
            }
        }
        columns.push((name, array));
    }

    columns.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = columns.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::DuplicateColumn {
            table: table(),
            column: w[0].0.full_name(schema),
        });
    }
    for (def, column) in schema.columns().iter().enumerate() {
        if whole && !column.is_nullable() && !columns.iter().any(|(n, _)| n.def == def) {
            return Err(Error::NullViolation {
                table: table(),
                column: column.name().to_owned(),
                problem: "lacks the column".to_owned(),
            });
        }
    }

    let fields: Vec<_> = columns
        .iter()
        .map(|(n, _)| crate::schema::field_for(schema, n))
        .collect();
    let (names, arrays): (Vec<_>, Vec<_>) = columns.into_iter().unzip();
    let batch = RecordBatch::try_new_with_options(
        Arc::new(ArrowSchema::new(fields)),
        arrays,
        &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows)),
    )?;
    Ok(Prepared {
        columns: names,
        batch,
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{DictionaryArray, Int64Array, StringArray};
    use arrow::datatypes::{Field, Int8Type};

    use super::*;
    use crate::schema::{ColumnDef, Encoding};

    fn schema() -> Schema {
        Schema::builder("t")
            .column(ColumnDef::new("name", DataType::Utf8).encoding(Encoding::RleDictionary))
            .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
            .column(ColumnDef::new("value", DataType::Int64))
            .column(ColumnDef::new("note", DataType::Utf8).nullable(true))
            .build()
            .unwrap()
    }

    fn batch(fields: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let schema = ArrowSchema::new(
            fields
                .iter()
                .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
                .collect::<Vec<_>>(),
        );
        RecordBatch::try_new(
            Arc::new(schema),
            fields.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap()
    }

    fn strings(v: &[&str]) -> ArrayRef {
        Arc::new(StringArray::from(v.to_vec()))
    }

    fn ints(v: &[i64]) -> ArrayRef {
        Arc::new(Int64Array::from(v.to_vec()))
    }

    #[test]
    fn normalises_order_and_types() {
        let dict: ArrayRef = Arc::new(
            DictionaryArray::<Int8Type>::try_new(
                arrow::array::Int8Array::from(vec![0, 0]),
                strings(&["p"]),
            )
            .unwrap(),
        );
        let b = batch(vec![
            ("value", ints(&[1, 2])),
            ("labels.pod", dict),
            ("labels.job", strings(&["a", "b"])),
            ("name", strings(&["cpu", "cpu"])),
        ]);
        let p = prepare(&schema(), &TableOptions::default(), &b)
            .unwrap()
            .unwrap();
        let names: Vec<_> = p
            .batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["name", "labels.job", "labels.pod", "value"]);
        let dict_type = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        assert_eq!(p.batch.column(0).data_type(), &dict_type);
        assert_eq!(p.batch.column(2).data_type(), &dict_type);
    }

    #[test]
    fn rejects_bad_batches_with_typed_errors() {
        let s = schema();
        let o = TableOptions::default();
        let check = |b: RecordBatch, o: &TableOptions| prepare(&s, o, &b).unwrap_err();
        assert!(matches!(
            check(batch(vec![("name", ints(&[1])), ("value", ints(&[1]))]), &o),
            Error::TypeMismatch { .. }
        ));
        assert!(matches!(
            check(batch(vec![("name", strings(&["a"]))]), &o),
            Error::NullViolation { .. }
        ));
        let with_null: ArrayRef = Arc::new(Int64Array::from(vec![None, Some(1)]));
        assert!(matches!(
            check(
                batch(vec![("name", strings(&["a", "b"])), ("value", with_null)]),
                &o
            ),
            Error::NullViolation { .. }
        ));
        assert!(matches!(
            check(
                batch(vec![
                    ("name", strings(&["a"])),
                    ("value", ints(&[1])),
                    ("other", ints(&[1]))
                ]),
                &o
            ),
            Error::UnknownColumn { .. }
        ));
        assert!(matches!(
            check(
                batch(vec![
                    ("name", strings(&["a"])),
                    ("value", ints(&[1])),
                    ("labels.a.b", strings(&["x"]))
                ]),
                &o
            ),
            Error::InvalidColumnName { .. }
        ));
        assert!(matches!(
            check(
                batch(vec![
                    ("name", strings(&["a"])),
                    ("value", ints(&[1])),
                    ("labels", strings(&["x"]))
                ]),
                &o
            ),
            Error::InvalidColumnName { .. }
        ));
        assert!(matches!(
            check(
                batch(vec![
                    ("name", strings(&["a"])),
                    ("value", ints(&[1])),
                    ("value", ints(&[1]))
                ]),
                &o
            ),
            Error::DuplicateColumn { .. }
        ));
        let small = TableOptions::default().max_batch_rows(1);
        assert!(matches!(
            check(
                batch(vec![
                    ("name", strings(&["a", "b"])),
                    ("value", ints(&[1, 2]))
                ]),
                &small
            ),
            Error::BatchTooLarge { what: "rows", .. }
        ));
        let tiny = TableOptions::default().max_batch_bytes(16);
        assert!(matches!(
            check(
                batch(vec![
                    ("name", strings(&["a", "b"])),
                    ("value", ints(&[1, 2]))
                ]),
                &tiny
            ),
            Error::BatchTooLarge { what: "bytes", .. }
        ));
    }

    #[test]
    fn empty_batch_is_a_no_op() {
        let b = batch(vec![("name", strings(&[])), ("value", ints(&[]))]);
        assert!(
            prepare(&schema(), &TableOptions::default(), &b)
                .unwrap()
                .is_none()
        );
    }
}
