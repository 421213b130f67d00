//! Exact statistics of a column of a chunk, block or row group: what predicates are
//! checked against to skip data.

use arrow::array::{Array, AsArray};
use arrow::compute;
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};

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
