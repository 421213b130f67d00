//! Columns found by name in constant time.
//!
//! Arrow's `Schema::index_of` and `RecordBatch::column_by_name` compare the name with one
//! field after another. Looking up each of a table's columns that way costs the square of
//! their number, and a table whose dynamic family has seen thousands of labels (one hostile
//! push of 10,000 label names) then spent minutes persisting, replaying and planning scans.
//! Code that looks up many columns of one schema indexes its fields once instead.

use std::collections::HashMap;

use arrow::array::ArrayRef;
use arrow::datatypes::Schema;
use arrow::record_batch::RecordBatch;

/// The positions of an Arrow schema's fields, by name.
#[derive(Debug, Default)]
pub(crate) struct FieldIndex<'a>(HashMap<&'a str, usize>);

impl<'a> FieldIndex<'a> {
    /// Indexes `schema`'s fields.
    pub(crate) fn new(schema: &'a Schema) -> Self {
        Self(
            schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name().as_str(), i))
                .collect(),
        )
    }

    /// The position of the field called `name`.
    pub(crate) fn get(&self, name: &str) -> Option<usize> {
        self.0.get(name).copied()
    }

    /// Whether a field is called `name`.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// A batch's columns by name: [`RecordBatch::column_by_name`] for many names.
#[derive(Debug)]
pub(crate) struct Columns<'a> {
    batch: &'a RecordBatch,
    index: FieldIndex<'a>,
}

impl<'a> Columns<'a> {
    /// Indexes `batch`'s columns.
    pub(crate) fn new(batch: &'a RecordBatch) -> Self {
        Self {
            batch,
            index: FieldIndex::new(batch.schema_ref()),
        }
    }

    /// The column called `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&'a ArrayRef> {
        self.index.get(name).map(|i| self.batch.column(i))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field};

    use super::*;

    #[test]
    fn finds_what_arrow_finds() {
        let schema = Arc::new(Schema::new(
            (0..50)
                .map(|i| Field::new(format!("labels.l{i}"), DataType::Int64, false))
                .collect::<Vec<_>>(),
        ));
        let batch = RecordBatch::try_new(
            schema.clone(),
            (0..50)
                .map(|i| Arc::new(Int64Array::from(vec![i])) as ArrayRef)
                .collect(),
        )
        .unwrap();
        let index = FieldIndex::new(&schema);
        let columns = Columns::new(&batch);
        for name in ["labels.l0", "labels.l17", "labels.l49", "labels.l50", "l17"] {
            assert_eq!(index.get(name), schema.index_of(name).ok(), "{name}");
            assert_eq!(
                index.contains(name),
                schema.index_of(name).is_ok(),
                "{name}"
            );
            assert_eq!(
                columns.get(name).map(Arc::as_ptr),
                batch.column_by_name(name).map(Arc::as_ptr),
                "{name}"
            );
        }
    }
}
