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

/// The exact statistics of the union of parts (the chunks a block is written from, the
/// blocks a merge joins), `rows` rows in all: each part is its rows and its columns'
/// statistics, and a column a part lacks is null in that part's rows. By column name.
pub(crate) fn union<'a, K: AsRef<str>>(
    parts: impl IntoIterator<Item = (usize, impl IntoIterator<Item = (K, &'a ColumnStats)>)>,
    rows: usize,
) -> std::collections::BTreeMap<String, ColumnStats> {
    // Per column: its statistics so far, and the rows of the parts that have it.
    let mut union: std::collections::BTreeMap<String, (ColumnStats, usize)> = Default::default();
    for (part_rows, columns) in parts {
        for (name, s) in columns {
            match union.get_mut(name.as_ref()) {
                Some((acc, present)) => {
                    acc.merge(s);
                    *present += part_rows;
                }
                None => {
                    union.insert(name.as_ref().to_owned(), (s.clone(), part_rows));
                }
            }
        }
    }
    union
        .into_iter()
        .map(|(name, (mut s, present))| {
            s.null_count += rows.saturating_sub(present);
            (name, s)
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_union_widens_bounds_and_counts_a_missing_column_as_nulls() {
        let int = |min: i64, max: i64, nulls: usize| ColumnStats {
            min: Some(Scalar::Int(min)),
            max: Some(Scalar::Int(max)),
            null_count: nulls,
        };
        let (a, b, c) = (int(5, 9, 1), int(-3, 7, 0), int(100, 100, 2));
        // Part one (10 rows) has x and y, part two (4 rows) only x.
        let union = union([(10, vec![("x", &a), ("y", &c)]), (4, vec![("x", &b)])], 14);
        assert_eq!(union["x"], int(-3, 9, 1));
        assert_eq!(
            union["y"],
            int(100, 100, 2 + 4),
            "y is null in part two's rows"
        );
        assert_eq!(union.len(), 2);
    }
}
