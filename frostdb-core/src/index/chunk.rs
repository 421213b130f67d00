//! A chunk: an immutable Arrow batch with exact per-column statistics. L0 parts and granules
//! are chunks.

use arrow::array::{Array, AsArray};
use arrow::compute;
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;

use crate::error::Result;
use crate::scalar::Scalar;

/// Exact statistics of one column of a chunk.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ColumnStats {
    /// Smallest non-null value; `None` when every value is null.
    pub min: Option<Scalar>,
    /// Largest non-null value; `None` when every value is null.
    pub max: Option<Scalar>,
    /// Number of nulls.
    pub null_count: usize,
}

impl ColumnStats {
    /// Statistics of a column that is absent from a chunk of `rows` rows: all null.
    pub fn all_null(rows: usize) -> Self {
        Self {
            min: None,
            max: None,
            null_count: rows,
        }
    }

    /// Folds the statistics of another chunk of the same column into these.
    pub(crate) fn merge(&mut self, other: &ColumnStats) {
        self.null_count += other.null_count;
        let pick = |a: &mut Option<Scalar>, b: &Option<Scalar>, want: std::cmp::Ordering| {
            if let Some(b) = b
                && a.as_ref()
                    .is_none_or(|a| b.partial_cmp_same(a) == Some(want))
            {
                *a = Some(b.clone());
            }
        };
        pick(&mut self.min, &other.min, std::cmp::Ordering::Less);
        pick(&mut self.max, &other.max, std::cmp::Ordering::Greater);
    }

    /// Computes the statistics of `array`. Dictionary arrays must reference every value of
    /// their dictionary (chunks guarantee it) so that min/max are exact.
    pub(crate) fn compute(array: &dyn Array) -> Self {
        let null_count = array.logical_null_count();
        if null_count == array.len() {
            return Self::all_null(array.len());
        }
        let (min, max) = min_max(array);
        Self {
            min,
            max,
            null_count,
        }
    }
}

macro_rules! primitive_min_max {
    ($array:expr, $ty:ty, $variant:ident) => {{
        let a = $array.as_primitive::<$ty>();
        (
            compute::min(a).map(|v| Scalar::$variant(v.into())),
            compute::max(a).map(|v| Scalar::$variant(v.into())),
        )
    }};
}

fn min_max(array: &dyn Array) -> (Option<Scalar>, Option<Scalar>) {
    use DataType as T;
    match array.data_type() {
        T::Boolean => {
            let a = array.as_boolean();
            (
                compute::min_boolean(a).map(Scalar::Boolean),
                compute::max_boolean(a).map(Scalar::Boolean),
            )
        }
        T::Int8 => primitive_min_max!(array, Int8Type, Int),
        T::Int16 => primitive_min_max!(array, Int16Type, Int),
        T::Int32 => primitive_min_max!(array, Int32Type, Int),
        T::Int64 => primitive_min_max!(array, Int64Type, Int),
        T::UInt8 => primitive_min_max!(array, UInt8Type, UInt),
        T::UInt16 => primitive_min_max!(array, UInt16Type, UInt),
        T::UInt32 => primitive_min_max!(array, UInt32Type, UInt),
        T::UInt64 => primitive_min_max!(array, UInt64Type, UInt),
        T::Float32 => float_min_max(
            array
                .as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from)),
        ),
        T::Float64 => float_min_max(array.as_primitive::<Float64Type>().iter()),
        T::Utf8 => {
            let a = array.as_string::<i32>();
            (
                compute::min_string(a).map(Scalar::from),
                compute::max_string(a).map(Scalar::from),
            )
        }
        T::Binary => {
            let a = array.as_binary::<i32>();
            (
                compute::min_binary(a).map(Scalar::from),
                compute::max_binary(a).map(Scalar::from),
            )
        }
        T::FixedSizeBinary(_) => {
            let a = array.as_fixed_size_binary();
            let min = a.iter().flatten().min().map(Scalar::from);
            let max = a.iter().flatten().max().map(Scalar::from);
            (min, max)
        }
        T::Dictionary(_, _) => min_max(array.as_any_dictionary().values().as_ref()),
        _ => (None, None),
    }
}

// Floats order by IEEE total order, as Arrow's comparison kernels do.
fn float_min_max(values: impl Iterator<Item = Option<f64>>) -> (Option<Scalar>, Option<Scalar>) {
    let mut min: Option<f64> = None;
    let mut max: Option<f64> = None;
    for v in values.flatten() {
        if min.is_none_or(|m| v.total_cmp(&m).is_lt()) {
            min = Some(v);
        }
        if max.is_none_or(|m| v.total_cmp(&m).is_gt()) {
            max = Some(v);
        }
    }
    (min.map(Scalar::Float), max.map(Scalar::Float))
}

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
    use arrow::datatypes::{Field, Schema};

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
