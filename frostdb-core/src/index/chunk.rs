//! A chunk: an immutable Arrow batch with exact per-column statistics. L0 parts and granules
//! are chunks.

use arrow::array::Array;
use arrow::record_batch::RecordBatch;

use crate::error::Result;
use crate::predicate::ColumnStats;

/// An immutable batch with exact statistics for every column.
#[derive(Debug)]
pub(crate) struct Chunk {
    batch: RecordBatch,
    stats: Vec<ColumnStats>,
    bytes: usize,
}

impl Chunk {
    /// Wraps `batch`, compacting its dictionaries and computing statistics.
    pub(crate) fn new(batch: RecordBatch) -> Result<Self> {
        let mut columns = batch
            .columns()
            .iter()
            .map(crate::dictionary::compact)
            .collect::<Result<Vec<_>>>()?;
        // Builders over-allocate; a chunk lives long, so give the spare capacity back (shared
        // buffers are left alone).
        for c in &mut columns {
            c.shrink_to_fit();
        }
        let batch = RecordBatch::try_new(batch.schema(), columns)?;
        let stats = batch
            .columns()
            .iter()
            .map(|c| ColumnStats::compute(c.as_ref()))
            .collect();
        let bytes = batch.get_array_memory_size();
        Ok(Self {
            batch,
            stats,
            bytes,
        })
    }

    pub(crate) fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    pub(crate) fn rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Statistics of the column called `name`, or all-null statistics when the chunk lacks it.
    pub(crate) fn stats_of(&self, name: &str) -> ColumnStats {
        match self.batch.schema_ref().index_of(name) {
            Ok(i) => self.stats[i].clone(),
            Err(_) => ColumnStats::all_null(self.rows()),
        }
    }

    /// Statistics of column `i` of the batch.
    pub(crate) fn column_stats(&self, i: usize) -> &ColumnStats {
        &self.stats[i]
    }

    /// Bytes of Arrow memory held.
    pub(crate) fn memory_size(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, DictionaryArray, Int32Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use crate::scalar::Scalar;

    use super::*;

    #[test]
    fn dictionary_stats_cover_used_values_only() {
        let values = StringArray::from(vec!["zz", "b", "a", "b", "unused"]);
        let keys = Int32Array::from(vec![Some(1), None, Some(3), Some(2)]);
        let dict: ArrayRef = Arc::new(DictionaryArray::try_new(keys, Arc::new(values)).unwrap());
        let schema = Arc::new(Schema::new(vec![Field::new(
            "d",
            dict.data_type().clone(),
            true,
        )]));
        let chunk = Chunk::new(RecordBatch::try_new(schema, vec![dict]).unwrap()).unwrap();
        let stats = chunk.stats_of("d");
        assert_eq!(stats.min, Some(Scalar::from("a")));
        assert_eq!(
            stats.max,
            Some(Scalar::from("b")),
            "not the unused \"zz\" or \"unused\""
        );
        assert_eq!(stats.null_count, 1);
    }

    #[test]
    fn chunk_stats_cover_every_column() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(3), None, Some(-2)])),
                Arc::new(arrow::array::Float64Array::from(vec![None, None, None])),
            ],
        )
        .unwrap();
        let chunk = Chunk::new(batch).unwrap();
        assert_eq!(chunk.stats_of("v").min, Some(Scalar::Int(-2)));
        assert_eq!(chunk.stats_of("v").max, Some(Scalar::Int(3)));
        assert_eq!(chunk.stats_of("f"), ColumnStats::all_null(3));
        assert_eq!(chunk.stats_of("absent"), ColumnStats::all_null(3));
    }
}
