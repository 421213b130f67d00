//! A chunk: an immutable Arrow batch with exact per-column statistics. L0 parts and granules
//! are chunks.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, DictionaryArray, GenericByteArray, GenericByteBuilder, Int32Array,
};
use arrow::compute;
use arrow::datatypes::{
    ByteArrayType, DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::record_batch::RecordBatch;

use crate::error::Result;
use crate::scalar::Scalar;

/// Exact statistics of one column of a chunk.
#[derive(Debug, Clone, PartialEq)]
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

/// Drops dictionary values no key references and merges duplicate values, so a dictionary
/// costs only what its chunk uses and its min/max are exact.
pub(crate) fn compact_dictionary(array: &ArrayRef) -> Result<ArrayRef> {
    let Some(dict) = array.as_dictionary_opt::<Int32Type>() else {
        return Ok(array.clone());
    };
    let values = dict.values();
    let mut used = vec![false; values.len()];
    let mut unused = values.len();
    for (i, key) in dict.keys().values().iter().enumerate() {
        if !dict.keys().is_valid(i) {
            continue;
        }
        if let Some(slot) = usize::try_from(*key).ok().and_then(|k| used.get_mut(k)) {
            unused -= usize::from(!*slot);
            *slot = true;
        }
    }
    if unused == 0 && values.null_count() == 0 {
        return Ok(array.clone());
    }
    let rebuilt = match values.data_type() {
        DataType::Utf8 => rebuild(dict.keys(), values.as_string::<i32>())?,
        DataType::Binary => rebuild(dict.keys(), values.as_binary::<i32>())?,
        _ => return Ok(array.clone()),
    };
    Ok(Arc::new(rebuilt))
}

fn rebuild<T: ByteArrayType<Offset = i32>>(
    keys: &Int32Array,
    values: &GenericByteArray<T>,
) -> Result<DictionaryArray<Int32Type>> {
    let mut remap: Vec<Option<i32>> = vec![None; values.len()];
    let mut seen: HashMap<&[u8], i32> = HashMap::new();
    let mut builder = GenericByteBuilder::<T>::new();
    let mut new_keys = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        let key = keys
            .is_valid(i)
            .then(|| keys.value(i))
            .and_then(|k| usize::try_from(k).ok())
            .filter(|&k| k < values.len() && values.is_valid(k));
        let Some(k) = key else {
            new_keys.push(None);
            continue;
        };
        let id = match remap[k] {
            Some(id) => id,
            None => {
                let value = values.value(k);
                let bytes: &[u8] = value.as_ref();
                let next = i32::try_from(seen.len()).expect("fewer values than keys");
                let id = *seen.entry(bytes).or_insert_with(|| {
                    builder.append_value(value);
                    next
                });
                remap[k] = Some(id);
                id
            }
        };
        new_keys.push(Some(id));
    }
    Ok(DictionaryArray::try_new(
        Int32Array::from(new_keys),
        Arc::new(builder.finish()),
    )?)
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
        let columns = batch
            .columns()
            .iter()
            .map(compact_dictionary)
            .collect::<Result<Vec<_>>>()?;
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

    /// Bytes of Arrow memory held.
    pub(crate) fn memory_size(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    #[test]
    fn dictionary_is_compacted_and_stats_exact() {
        let values = StringArray::from(vec!["zz", "b", "a", "b", "unused"]);
        let keys = Int32Array::from(vec![Some(1), None, Some(3), Some(2)]);
        let dict: ArrayRef = Arc::new(DictionaryArray::try_new(keys, Arc::new(values)).unwrap());
        let compacted = compact_dictionary(&dict).unwrap();
        let d = compacted.as_dictionary::<Int32Type>();
        assert_eq!(
            d.values().len(),
            2,
            "unused and duplicate values are dropped"
        );
        let stats = ColumnStats::compute(compacted.as_ref());
        assert_eq!(stats.min, Some(Scalar::from("a")));
        assert_eq!(stats.max, Some(Scalar::from("b")));
        assert_eq!(stats.null_count, 1);
        for (i, want) in [Some("b"), None, Some("b"), Some("a")].iter().enumerate() {
            let got = Scalar::from_array(compacted.as_ref(), i);
            assert_eq!(got, want.map(Scalar::from).unwrap_or(Scalar::Null));
        }
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
