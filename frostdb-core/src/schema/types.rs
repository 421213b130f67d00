//! The column types the engine stores, their stable names, and how input types map onto them.

use arrow::datatypes::DataType;

use crate::error::{Error, Result};

/// Whether `t` is a logical type a column may have.
pub(crate) fn is_supported(t: &DataType) -> bool {
    use DataType::*;
    matches!(
        t,
        Boolean
            | Int8
            | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Float32
            | Float64
            | Utf8
            | Binary
            | FixedSizeBinary(_)
    )
}

/// Whether `t` is a variable-length byte type (strings or binary).
pub(crate) fn is_bytes(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::Binary)
}

/// Whether `t` is an integer type.
pub(crate) fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// Whether a batch column of type `got` can be stored in a column of logical type `logical`
/// without changing any value (only its representation).
pub(crate) fn accepts(logical: &DataType, got: &DataType) -> bool {
    use DataType::*;
    match got {
        Dictionary(key, value) => key.is_dictionary_key_type() && accepts(logical, value),
        _ => match logical {
            Utf8 => matches!(got, Utf8 | LargeUtf8 | Utf8View),
            Binary => matches!(got, Binary | LargeBinary | BinaryView),
            other => other == got,
        },
    }
}

/// The stable textual name of a supported type, as written into serialised schemas.
pub(crate) fn type_name(t: &DataType) -> String {
    use DataType::*;
    match t {
        Boolean => "boolean".into(),
        Int8 => "int8".into(),
        Int16 => "int16".into(),
        Int32 => "int32".into(),
        Int64 => "int64".into(),
        UInt8 => "uint8".into(),
        UInt16 => "uint16".into(),
        UInt32 => "uint32".into(),
        UInt64 => "uint64".into(),
        Float32 => "float32".into(),
        Float64 => "float64".into(),
        Utf8 => "utf8".into(),
        Binary => "binary".into(),
        FixedSizeBinary(n) => format!("fixed_size_binary({n})"),
        other => format!("unsupported({other})"),
    }
}

/// Parses a name written by [`type_name`].
pub(crate) fn parse_type_name(s: &str) -> Result<DataType> {
    use DataType::*;
    let t = match s {
        "boolean" => Boolean,
        "int8" => Int8,
        "int16" => Int16,
        "int32" => Int32,
        "int64" => Int64,
        "uint8" => UInt8,
        "uint16" => UInt16,
        "uint32" => UInt32,
        "uint64" => UInt64,
        "float32" => Float32,
        "float64" => Float64,
        "utf8" => Utf8,
        "binary" => Binary,
        _ => {
            let width = s
                .strip_prefix("fixed_size_binary(")
                .and_then(|rest| rest.strip_suffix(')'))
                .and_then(|n| n.parse::<i32>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| Error::InvalidSchema(format!("unknown column type {s:?}")))?;
            FixedSizeBinary(width)
        }
    };
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in [
            DataType::Boolean,
            DataType::Int64,
            DataType::UInt64,
            DataType::Float64,
            DataType::Utf8,
            DataType::Binary,
            DataType::FixedSizeBinary(16),
        ] {
            assert_eq!(parse_type_name(&type_name(&t)).unwrap(), t);
        }
        assert!(parse_type_name("fixed_size_binary(0)").is_err());
        assert!(parse_type_name("decimal").is_err());
    }

    #[test]
    fn accepts_representations_not_conversions() {
        let dict = DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8View));
        assert!(accepts(&DataType::Utf8, &dict));
        assert!(accepts(&DataType::Utf8, &DataType::LargeUtf8));
        assert!(!accepts(&DataType::Utf8, &DataType::Binary));
        assert!(!accepts(&DataType::Int64, &DataType::Int32));
        assert!(!accepts(&DataType::Int64, &DataType::Utf8));
        assert!(accepts(
            &DataType::FixedSizeBinary(16),
            &DataType::FixedSizeBinary(16)
        ));
        assert!(!accepts(
            &DataType::FixedSizeBinary(16),
            &DataType::FixedSizeBinary(8)
        ));
    }
}
