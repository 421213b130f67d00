//! Single values: predicate literals and granule statistics.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, FixedSizeBinaryArray, Float32Array,
    Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, StringArray, UInt8Array,
    UInt16Array, UInt32Array, UInt64Array,
};
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};

/// A single value. Integers are widened to `Int`/`UInt`, floats to `Float`; fixed-size binary
/// values are `Binary`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "ScalarRepr", from = "ScalarRepr")]
#[non_exhaustive]
pub enum Scalar {
    /// SQL NULL.
    Null,
    /// A boolean.
    Boolean(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A string.
    Utf8(String),
    /// Bytes.
    Binary(Vec<u8>),
}

impl Scalar {
    /// Compares two values of the same kind (floats by IEEE total order); `None` across kinds
    /// or with `Null`.
    pub fn partial_cmp_same(&self, other: &Self) -> Option<Ordering> {
        use Scalar::*;
        match (self, other) {
            (Boolean(a), Boolean(b)) => Some(a.cmp(b)),
            (Int(a), Int(b)) => Some(a.cmp(b)),
            (UInt(a), UInt(b)) => Some(a.cmp(b)),
            (Float(a), Float(b)) => Some(a.total_cmp(b)),
            (Utf8(a), Utf8(b)) => Some(a.cmp(b)),
            (Binary(a), Binary(b)) => Some(a.cmp(b)),
            _ => None,
        }
    }

    /// This value converted to the kind that values of `data_type` (a logical type, or a
    /// dictionary of one) have, when that is lossless.
    pub(crate) fn coerce_to(&self, data_type: &DataType) -> Result<Scalar, String> {
        use DataType as T;
        let value_type = match data_type {
            T::Dictionary(_, v) => v.as_ref(),
            other => other,
        };
        let out_of_range = || format!("{self:?} is out of range for {value_type}");
        let result = match (self, value_type) {
            (Scalar::Null, _) => {
                return Err("comparison with NULL is never true; test IS NULL instead".into());
            }
            (Scalar::Boolean(b), T::Boolean) => Scalar::Boolean(*b),
            (Scalar::Int(v), t) if t.is_signed_integer() => {
                check_signed_range(*v, t).ok_or_else(out_of_range)?;
                Scalar::Int(*v)
            }
            (Scalar::UInt(v), t) if t.is_signed_integer() => {
                let v = i64::try_from(*v).map_err(|_| out_of_range())?;
                check_signed_range(v, t).ok_or_else(out_of_range)?;
                Scalar::Int(v)
            }
            (Scalar::Int(v), t) if t.is_unsigned_integer() => {
                let v = u64::try_from(*v).map_err(|_| out_of_range())?;
                check_unsigned_range(v, t).ok_or_else(out_of_range)?;
                Scalar::UInt(v)
            }
            (Scalar::UInt(v), t) if t.is_unsigned_integer() => {
                check_unsigned_range(*v, t).ok_or_else(out_of_range)?;
                Scalar::UInt(*v)
            }
            (Scalar::Float(v), T::Float32 | T::Float64) => Scalar::Float(*v),
            (Scalar::Int(v), T::Float32 | T::Float64) => Scalar::Float(*v as f64),
            (Scalar::UInt(v), T::Float32 | T::Float64) => Scalar::Float(*v as f64),
            (Scalar::Utf8(s), T::Utf8) => Scalar::Utf8(s.clone()),
            (Scalar::Binary(b), T::Binary) => Scalar::Binary(b.clone()),
            (Scalar::Utf8(s), T::Binary) => Scalar::Binary(s.as_bytes().to_vec()),
            (Scalar::Binary(b), T::FixedSizeBinary(n)) => {
                if b.len() != *n as usize {
                    return Err(format!("{} bytes given for a {value_type}", b.len()));
                }
                Scalar::Binary(b.clone())
            }
            _ => return Err(format!("{self:?} cannot be compared with {value_type}")),
        };
        Ok(result)
    }

    /// A one-element array of `value_type` holding this value (which must already be coerced
    /// to that type's kind).
    pub(crate) fn to_array(&self, value_type: &DataType) -> ArrayRef {
        use DataType as T;
        match (self, value_type) {
            (Scalar::Boolean(b), _) => Arc::new(BooleanArray::from(vec![*b])),
            (Scalar::Int(v), T::Int8) => Arc::new(Int8Array::from(vec![*v as i8])),
            (Scalar::Int(v), T::Int16) => Arc::new(Int16Array::from(vec![*v as i16])),
            (Scalar::Int(v), T::Int32) => Arc::new(Int32Array::from(vec![*v as i32])),
            (Scalar::Int(v), _) => Arc::new(Int64Array::from(vec![*v])),
            (Scalar::UInt(v), T::UInt8) => Arc::new(UInt8Array::from(vec![*v as u8])),
            (Scalar::UInt(v), T::UInt16) => Arc::new(UInt16Array::from(vec![*v as u16])),
            (Scalar::UInt(v), T::UInt32) => Arc::new(UInt32Array::from(vec![*v as u32])),
            (Scalar::UInt(v), _) => Arc::new(UInt64Array::from(vec![*v])),
            (Scalar::Float(v), T::Float32) => Arc::new(Float32Array::from(vec![*v as f32])),
            (Scalar::Float(v), _) => Arc::new(Float64Array::from(vec![*v])),
            (Scalar::Utf8(s), _) => Arc::new(StringArray::from(vec![s.as_str()])),
            (Scalar::Binary(b), T::FixedSizeBinary(_)) => Arc::new(
                FixedSizeBinaryArray::try_from_iter(std::iter::once(b.as_slice()))
                    .expect("one value of a coerced width"),
            ),
            (Scalar::Binary(b), _) => Arc::new(BinaryArray::from_vec(vec![b.as_slice()])),
            (Scalar::Null, t) => arrow::array::new_null_array(t, 1),
        }
    }

    /// The value at `index` of `array` (a supported storage type), `Null` when null.
    pub fn from_array(array: &dyn Array, index: usize) -> Scalar {
        if array.is_null(index) {
            return Scalar::Null;
        }
        use DataType as T;
        match array.data_type() {
            T::Boolean => Scalar::Boolean(array.as_boolean().value(index)),
            T::Int8 => Scalar::Int(array.as_primitive::<Int8Type>().value(index).into()),
            T::Int16 => Scalar::Int(array.as_primitive::<Int16Type>().value(index).into()),
            T::Int32 => Scalar::Int(array.as_primitive::<Int32Type>().value(index).into()),
            T::Int64 => Scalar::Int(array.as_primitive::<Int64Type>().value(index)),
            T::UInt8 => Scalar::UInt(array.as_primitive::<UInt8Type>().value(index).into()),
            T::UInt16 => Scalar::UInt(array.as_primitive::<UInt16Type>().value(index).into()),
            T::UInt32 => Scalar::UInt(array.as_primitive::<UInt32Type>().value(index).into()),
            T::UInt64 => Scalar::UInt(array.as_primitive::<UInt64Type>().value(index)),
            T::Float32 => Scalar::Float(array.as_primitive::<Float32Type>().value(index).into()),
            T::Float64 => Scalar::Float(array.as_primitive::<Float64Type>().value(index)),
            T::Utf8 => Scalar::Utf8(array.as_string::<i32>().value(index).to_owned()),
            T::Binary => Scalar::Binary(array.as_binary::<i32>().value(index).to_vec()),
            T::FixedSizeBinary(_) => {
                Scalar::Binary(array.as_fixed_size_binary().value(index).to_vec())
            }
            T::Dictionary(_, _) => {
                let dict = array.as_any_dictionary();
                let key = match Scalar::from_array(dict.keys(), index) {
                    Scalar::Int(k) => usize::try_from(k).ok(),
                    Scalar::UInt(k) => usize::try_from(k).ok(),
                    _ => None,
                };
                match key.filter(|k| *k < dict.values().len()) {
                    Some(key) => Scalar::from_array(dict.values().as_ref(), key),
                    None => Scalar::Null,
                }
            }
            // Only supported storage types reach here; anything else reads as unknown.
            _ => Scalar::Null,
        }
    }
}

/// The serialised form: floats by their bits (JSON has no NaN), bytes as hex.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum ScalarRepr {
    Null,
    Boolean(bool),
    Int(i64),
    UInt(u64),
    FloatBits(u64),
    Utf8(String),
    Hex(String),
}

impl From<Scalar> for ScalarRepr {
    fn from(s: Scalar) -> Self {
        match s {
            Scalar::Null => ScalarRepr::Null,
            Scalar::Boolean(b) => ScalarRepr::Boolean(b),
            Scalar::Int(v) => ScalarRepr::Int(v),
            Scalar::UInt(v) => ScalarRepr::UInt(v),
            Scalar::Float(v) => ScalarRepr::FloatBits(v.to_bits()),
            Scalar::Utf8(v) => ScalarRepr::Utf8(v),
            Scalar::Binary(v) => ScalarRepr::Hex(v.iter().map(|b| format!("{b:02x}")).collect()),
        }
    }
}

impl From<ScalarRepr> for Scalar {
    fn from(r: ScalarRepr) -> Self {
        match r {
            ScalarRepr::Null => Scalar::Null,
            ScalarRepr::Boolean(b) => Scalar::Boolean(b),
            ScalarRepr::Int(v) => Scalar::Int(v),
            ScalarRepr::UInt(v) => Scalar::UInt(v),
            ScalarRepr::FloatBits(v) => Scalar::Float(f64::from_bits(v)),
            ScalarRepr::Utf8(v) => Scalar::Utf8(v),
            // Written by us; a malformed digit pair reads as 0 rather than failing the open.
            ScalarRepr::Hex(v) => Scalar::Binary(
                v.as_bytes()
                    .chunks(2)
                    .map(|pair| {
                        std::str::from_utf8(pair)
                            .ok()
                            .and_then(|p| u8::from_str_radix(p, 16).ok())
                            .unwrap_or(0)
                    })
                    .collect(),
            ),
        }
    }
}

fn check_signed_range(v: i64, t: &DataType) -> Option<()> {
    let ok = match t {
        DataType::Int8 => i8::try_from(v).is_ok(),
        DataType::Int16 => i16::try_from(v).is_ok(),
        DataType::Int32 => i32::try_from(v).is_ok(),
        _ => true,
    };
    ok.then_some(())
}

fn check_unsigned_range(v: u64, t: &DataType) -> Option<()> {
    let ok = match t {
        DataType::UInt8 => u8::try_from(v).is_ok(),
        DataType::UInt16 => u16::try_from(v).is_ok(),
        DataType::UInt32 => u32::try_from(v).is_ok(),
        _ => true,
    };
    ok.then_some(())
}

impl From<&str> for Scalar {
    fn from(v: &str) -> Self {
        Scalar::Utf8(v.to_owned())
    }
}

impl From<String> for Scalar {
    fn from(v: String) -> Self {
        Scalar::Utf8(v)
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Boolean(v)
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}

impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(v.into())
    }
}

impl From<u64> for Scalar {
    fn from(v: u64) -> Self {
        Scalar::UInt(v)
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}

impl From<Vec<u8>> for Scalar {
    fn from(v: Vec<u8>) -> Self {
        Scalar::Binary(v)
    }
}

impl From<&[u8]> for Scalar {
    fn from(v: &[u8]) -> Self {
        Scalar::Binary(v.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coercion_is_lossless_or_an_error() {
        assert_eq!(
            Scalar::Int(5).coerce_to(&DataType::UInt64).unwrap(),
            Scalar::UInt(5)
        );
        assert!(Scalar::Int(-1).coerce_to(&DataType::UInt64).is_err());
        assert!(Scalar::UInt(u64::MAX).coerce_to(&DataType::Int64).is_err());
        assert!(Scalar::Int(300).coerce_to(&DataType::Int8).is_err());
        assert!(
            Scalar::Utf8("a".into())
                .coerce_to(&DataType::Int64)
                .is_err()
        );
        assert!(Scalar::Null.coerce_to(&DataType::Int64).is_err());
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        assert_eq!(
            Scalar::from("x").coerce_to(&dict).unwrap(),
            Scalar::Utf8("x".into())
        );
        assert!(
            Scalar::Binary(vec![1, 2])
                .coerce_to(&DataType::FixedSizeBinary(3))
                .is_err()
        );
    }

    #[test]
    fn array_round_trip() {
        for (s, t) in [
            (Scalar::Int(-3), DataType::Int16),
            (Scalar::UInt(7), DataType::UInt32),
            (Scalar::Float(1.5), DataType::Float64),
            (Scalar::from("hi"), DataType::Utf8),
            (Scalar::Binary(vec![1, 2]), DataType::FixedSizeBinary(2)),
            (Scalar::Boolean(true), DataType::Boolean),
        ] {
            let a = s.to_array(&t);
            assert_eq!(a.data_type(), &t);
            assert_eq!(Scalar::from_array(a.as_ref(), 0), s);
        }
    }
}
