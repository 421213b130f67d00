//! Dictionary arrays, the in-memory form of low-cardinality byte columns (labels, profile
//! types): encoding inserted columns, gathering rows of many dictionaries into one during
//! merges, and compacting a dictionary to the values its keys use.
//!
//! Profile data repeats one value down a column (every sample of a profile has the same
//! labels; sorted granules hold long runs), so the encoder checks the previous value before
//! hashing, which makes encoding such columns nearly free.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBufferBuilder, DictionaryArray, GenericByteArray,
    GenericByteBuilder, Int32Array,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{BinaryType, ByteArrayType, DataType, Int32Type, Utf8Type};
use arrow::error::ArrowError;

use crate::error::Result;

/// Builds a `Dictionary(Int32, T)` array one value at a time, each distinct value stored once.
struct Encoder<T: ByteArrayType<Offset = i32>> {
    index: HashMap<Vec<u8>, i32>,
    values: GenericByteBuilder<T>,
    keys: Vec<i32>,
    /// Which keys are valid: made at the first null (most columns have none).
    valid: Option<BooleanBufferBuilder>,
    previous: Option<i32>,
}

impl<T: ByteArrayType<Offset = i32>> Encoder<T> {
    fn with_capacity(rows: usize) -> Self {
        Self {
            index: HashMap::new(),
            values: GenericByteBuilder::with_capacity(4, 64),
            keys: Vec::with_capacity(rows),
            valid: None,
            previous: None,
        }
    }

    fn stored(&self, key: i32) -> &[u8] {
        let offsets = self.values.offsets_slice();
        let k = key as usize;
        &self.values.values_slice()[offsets[k] as usize..offsets[k + 1] as usize]
    }

    fn push_null(&mut self) {
        let valid = self.valid.get_or_insert_with(|| {
            let mut valid = BooleanBufferBuilder::new(self.keys.capacity());
            valid.append_n(self.keys.len(), true);
            valid
        });
        valid.append(false);
        self.keys.push(0);
    }

    /// Pushes a key already assigned to a value again.
    #[inline]
    fn repeat(&mut self, key: i32) {
        self.keys.push(key);
        if let Some(valid) = &mut self.valid {
            valid.append(true);
        }
    }

    fn push(&mut self, value: &T::Native) -> Result<i32> {
        let bytes: &[u8] = value.as_ref();
        if let Some(key) = self.previous
            && self.stored(key) == bytes
        {
            self.repeat(key);
            return Ok(key);
        }
        let key = match self.index.get(bytes) {
            Some(&key) => key,
            None => {
                let key = i32::try_from(self.index.len())
                    .map_err(|_| ArrowError::DictionaryKeyOverflowError)?;
                self.values.append_value(value);
                self.index.insert(bytes.to_vec(), key);
                key
            }
        };
        self.previous = Some(key);
        self.repeat(key);
        Ok(key)
    }

    fn finish(mut self) -> Result<DictionaryArray<Int32Type>> {
        let nulls = self
            .valid
            .take()
            .map(|mut valid| NullBuffer::new(valid.finish()));
        let keys = Int32Array::new(self.keys.into(), nulls);
        Ok(DictionaryArray::try_new(
            keys,
            Arc::new(self.values.finish()),
        )?)
    }
}

/// Encodes a plain `Utf8` or `Binary` array as `Dictionary(Int32, _)`; `None` for any other
/// input type (the caller falls back to Arrow's cast).
pub(crate) fn encode(array: &ArrayRef) -> Result<Option<ArrayRef>> {
    fn run<T: ByteArrayType<Offset = i32>>(a: &GenericByteArray<T>) -> Result<ArrayRef> {
        let mut encoder = Encoder::<T>::with_capacity(a.len());
        let mut previous: Option<(&[u8], i32)> = None;
        for v in a.iter() {
            let Some(v) = v else {
                encoder.push_null();
                continue;
            };
            let bytes: &[u8] = v.as_ref();
            match previous {
                Some((p, key)) if p == bytes => encoder.repeat(key),
                _ => previous = Some((bytes, encoder.push(v)?)),
            }
        }
        Ok(Arc::new(encoder.finish()?))
    }
    Ok(match array.data_type() {
        DataType::Utf8 => Some(run(array.as_string::<i32>())?),
        DataType::Binary => Some(run(array.as_binary::<i32>())?),
        _ => None,
    })
}

/// Gathers rows `(array, row)` of several `Dictionary(Int32, Utf8 | Binary)` arrays into one
/// dictionary array holding only the values the rows use. `None` for other array types.
pub(crate) fn gather(
    arrays: &[&dyn Array],
    indices: &[(usize, usize)],
) -> Result<Option<ArrayRef>> {
    fn run<T: ByteArrayType<Offset = i32>>(
        arrays: &[&DictionaryArray<Int32Type>],
        indices: &[(usize, usize)],
    ) -> Result<ArrayRef> {
        let values: Vec<&GenericByteArray<T>> =
            arrays.iter().map(|d| d.values().as_bytes::<T>()).collect();
        let mut encoder = Encoder::<T>::with_capacity(indices.len());
        // The output key of each input dictionary's values, once seen (-1 before): a row
        // costs an index, not a hash of its value. Input dictionaries are compacted, so
        // this is at most the input's size.
        let mut seen: Vec<Vec<i32>> = values.iter().map(|v| vec![-1; v.len()]).collect();
        // Rows come in runs of one input (a merge's output takes runs of each): each run's
        // keys are read from its input's slices, its null checks made only if it has nulls.
        for run in indices.chunk_by(|x, y| x.0 == y.0) {
            let a = run[0].0;
            let (keys, values, seen) = (arrays[a].keys(), values[a], &mut seen[a]);
            let nullable = keys.null_count() > 0 || values.null_count() > 0;
            let sources = keys.values();
            for &(_, row) in run {
                let source = sources[row] as usize;
                if nullable && (keys.is_null(row) || values.is_null(source)) {
                    encoder.push_null();
                    continue;
                }
                match seen[source] {
                    -1 => seen[source] = encoder.push(values.value(source))?,
                    key => encoder.repeat(key),
                }
            }
        }
        Ok(Arc::new(encoder.finish()?))
    }
    let Some(first) = arrays.first() else {
        return Ok(None);
    };
    let value_type = match first.data_type() {
        DataType::Dictionary(key, value) if **key == DataType::Int32 => value.as_ref().clone(),
        _ => return Ok(None),
    };
    let dicts: Vec<&DictionaryArray<Int32Type>> = arrays
        .iter()
        .map(|a| a.as_dictionary::<Int32Type>())
        .collect();
    Ok(match value_type {
        DataType::Utf8 => Some(run::<Utf8Type>(&dicts, indices)?),
        DataType::Binary => Some(run::<BinaryType>(&dicts, indices)?),
        _ => None,
    })
}

/// Drops dictionary values no key references and merges duplicates, so a dictionary costs
/// only what its rows use and its min/max are exact.
pub(crate) fn compact(array: &ArrayRef) -> Result<ArrayRef> {
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
    let indices: Vec<(usize, usize)> = (0..dict.len()).map(|i| (0, i)).collect();
    Ok(gather(&[array.as_ref()], &indices)?.unwrap_or_else(|| array.clone()))
}

#[cfg(test)]
mod tests {
    use arrow::array::StringArray;

    use super::*;
    use crate::scalar::Scalar;

    fn same_values(a: &dyn Array, b: &dyn Array) {
        assert_eq!(a.len(), b.len());
        for i in 0..a.len() {
            assert_eq!(
                Scalar::from_array(a, i),
                Scalar::from_array(b, i),
                "row {i}"
            );
        }
    }

    #[test]
    fn encodes_runs_repeats_and_nulls() {
        let input: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some("a"),
            None,
            Some("b"),
            Some("a"),
            None,
            Some(""),
        ]));
        let encoded = encode(&input).unwrap().unwrap();
        assert_eq!(encoded.as_dictionary::<Int32Type>().values().len(), 3);
        same_values(encoded.as_ref(), input.as_ref());
        let empty: ArrayRef = Arc::new(StringArray::from(vec![None::<&str>, None]));
        assert_eq!(encode(&empty).unwrap().unwrap().null_count(), 2);
    }

    #[test]
    fn gathers_across_dictionaries() {
        let a = encode(&(Arc::new(StringArray::from(vec!["x", "y"])) as ArrayRef))
            .unwrap()
            .unwrap();
        let b =
            encode(&(Arc::new(StringArray::from(vec![Some("y"), None, Some("z")])) as ArrayRef))
                .unwrap()
                .unwrap();
        let indices = [(1, 0), (0, 1), (1, 1), (0, 0), (1, 2), (1, 2)];
        let out = gather(&[a.as_ref(), b.as_ref()], &indices)
            .unwrap()
            .unwrap();
        let want = StringArray::from(vec![
            Some("y"),
            Some("y"),
            None,
            Some("x"),
            Some("z"),
            Some("z"),
        ]);
        same_values(out.as_ref(), &want);
        assert_eq!(
            out.as_dictionary::<Int32Type>().values().len(),
            3,
            "y stored once"
        );
        // A null among a dictionary's values is a null row, in a run of its input.
        let c: ArrayRef = Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![0, 1, 0]),
                Arc::new(StringArray::from(vec![Some("v"), None])),
            )
            .unwrap(),
        );
        let out = gather(&[a.as_ref(), c.as_ref()], &[(0, 0), (1, 0), (1, 1), (1, 2)])
            .unwrap()
            .unwrap();
        let want = StringArray::from(vec![Some("x"), Some("v"), None, Some("v")]);
        same_values(out.as_ref(), &want);
        assert_eq!(out.null_count(), 1);
    }

    #[test]
    fn compacts_unused_and_duplicate_values() {
        let values = StringArray::from(vec!["zz", "b", "a", "b", "unused"]);
        let keys = Int32Array::from(vec![Some(1), None, Some(3), Some(2)]);
        let dict: ArrayRef = Arc::new(DictionaryArray::try_new(keys, Arc::new(values)).unwrap());
        let compacted = compact(&dict).unwrap();
        assert_eq!(compacted.as_dictionary::<Int32Type>().values().len(), 2);
        same_values(compacted.as_ref(), dict.as_ref());
    }
}
