//! The protobuf wire format, read in place: what the flat decoder ([`super::flat`]) parses
//! pprof with, without allocating per message.

use crate::error::{Error, Result};

/// One field's value as it is on the wire.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

fn malformed(what: impl std::fmt::Display) -> Error {
    Error::Protobuf(what.to_string())
}

/// A varint at the start of `buf`: its value and the bytes it took.
#[inline]
fn varint(buf: &[u8]) -> Result<(u64, usize)> {
    // Most varints of a profile (ids, indices, field keys) take one or two bytes.
    match buf {
        [b0, ..] if *b0 < 0x80 => return Ok((u64::from(*b0), 1)),
        [b0, b1, ..] if *b1 < 0x80 => {
            return Ok((u64::from(b0 & 0x7f) | (u64::from(*b1) << 7), 2));
        }
        _ => {}
    }
    varint_slow(buf)
}

#[inline(never)]
fn varint_slow(buf: &[u8]) -> Result<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                return Err(malformed("a varint overflows 64 bits"));
            }
            return Ok((value, i + 1));
        }
    }
    Err(malformed(if buf.len() < 10 {
        "buffer ends inside a varint"
    } else {
        "a varint is longer than 10 bytes"
    }))
}

/// Calls `field(number, value)` for every field of the message in `buf`, in order.
#[inline]
pub(super) fn fields<'a>(
    mut buf: &'a [u8],
    mut field: impl FnMut(u32, Value<'a>) -> Result<()>,
) -> Result<()> {
    while !buf.is_empty() {
        let (number, value, rest) = next(buf)?;
        buf = rest;
        field(number, value)?;
    }
    Ok(())
}

/// Reads a message whose fields numbered by the bits of `varints` are scalar varints:
/// each such field's value goes to `out[number]` (the last one wins, as protobuf says),
/// every other field to `other(number, value)`. A one-byte key of such a field (numbers
/// below 16, the messages pprof has most of) is read without going through [`Value`].
#[inline]
pub(super) fn scalars<'a, const N: usize>(
    mut buf: &'a [u8],
    varints: u32,
    out: &mut [u64; N],
    mut other: impl FnMut(u32, Value<'a>) -> Result<()>,
) -> Result<()> {
    debug_assert!(N <= 32 && (varints >> N) == 0 && varints & 1 == 0);
    while let [key, rest @ ..] = buf {
        let number = usize::from(key >> 3);
        if *key < 0x80 && key & 7 == 0 && varints & (1 << number) != 0 {
            let (v, n) = varint(rest)?;
            out[number] = v;
            buf = &rest[n..];
            continue;
        }
        let (number, value, rest) = next(buf)?;
        buf = rest;
        match (number < 32 && varints & (1 << number) != 0, value) {
            (true, Value::Varint(v)) => out[number as usize] = v,
            (true, value) => return Err(wrong(number, value)),
            (false, value) => other(number, value)?,
        }
    }
    Ok(())
}

/// The first field of `buf`: its number, its value and the bytes after it.
#[inline(always)]
fn next(mut buf: &[u8]) -> Result<(u32, Value<'_>, &[u8])> {
    let (key, n) = varint(buf)?;
    buf = &buf[n..];
    let number = u32::try_from(key >> 3)
        .ok()
        .filter(|&n| n > 0 && n < (1 << 29))
        .ok_or_else(|| malformed(format!("invalid field number {}", key >> 3)))?;
    let take = |buf: &[u8], len: usize| -> Result<usize> {
        if buf.len() < len {
            return Err(malformed(format!(
                "field {number} needs {len} bytes, {} are left",
                buf.len()
            )));
        }
        Ok(len)
    };
    let (value, len) = match key & 7 {
        0 => {
            let (v, n) = varint(buf)?;
            (Value::Varint(v), n)
        }
        1 => (Value::Fixed64, take(buf, 8)?),
        2 => {
            let (len, n) = varint(buf)?;
            buf = &buf[n..];
            let len = usize::try_from(len).map_err(|_| malformed("length overflows"))?;
            let len = take(buf, len)?;
            (Value::Bytes(&buf[..len]), len)
        }
        5 => (Value::Fixed32, take(buf, 4)?),
        wire => {
            return Err(malformed(format!(
                "field {number} has wire type {wire}, which pprof does not use"
            )));
        }
    };
    Ok((number, value, &buf[len..]))
}

/// The varint of a scalar field.
#[inline]
pub(super) fn scalar(number: u32, value: Value<'_>) -> Result<u64> {
    match value {
        Value::Varint(v) => Ok(v),
        other => Err(wrong(number, other)),
    }
}

/// The bytes of a length-delimited field.
#[inline]
pub(super) fn bytes<'a>(number: u32, value: Value<'a>) -> Result<&'a [u8]> {
    match value {
        Value::Bytes(b) => Ok(b),
        other => Err(wrong(number, other)),
    }
}

/// Appends the values of a repeated varint field: one value, or a packed run of them.
#[inline]
pub(super) fn repeated<T>(
    number: u32,
    value: Value<'_>,
    out: &mut Vec<T>,
    convert: impl Fn(u64) -> T,
) -> Result<()> {
    match value {
        Value::Varint(v) => out.push(convert(v)),
        Value::Bytes(mut packed) => {
            while !packed.is_empty() {
                let (v, n) = varint(packed)?;
                packed = &packed[n..];
                out.push(convert(v));
            }
        }
        other => return Err(wrong(number, other)),
    }
    Ok(())
}

fn wrong(number: u32, value: Value<'_>) -> Error {
    let wire = match value {
        Value::Varint(_) => "a varint",
        Value::Fixed64 => "a fixed 64-bit value",
        Value::Bytes(_) => "length-delimited bytes",
        Value::Fixed32 => "a fixed 32-bit value",
    };
    malformed(format!(
        "field {number} is {wire}, which its type cannot be"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_decode_and_overflows_fail() {
        assert_eq!(varint(&[0x05]).unwrap(), (5, 1));
        assert_eq!(varint(&[0x96, 0x01]).unwrap(), (150, 2));
        assert_eq!(varint(&[0x80, 0x80, 0x01]).unwrap(), (1 << 14, 3));
        assert_eq!(
            varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).unwrap(),
            (u64::MAX, 10)
        );
        assert!(varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]).is_err());
        assert!(varint(&[0x80, 0x80]).is_err());
        assert!(varint(&[0x80; 11]).is_err());
    }

    #[test]
    fn scalar_fields_read_as_the_general_reader_reads_them() {
        let read = |buf: &[u8]| {
            let mut v = [0u64; 4];
            let mut others = Vec::new();
            scalars(buf, 0b1010, &mut v, |n, value| {
                others.push((n, matches!(value, Value::Bytes(_))));
                Ok(())
            })
            .map(|()| (v, others))
        };
        // Field 1 varint 5, field 2 bytes "ab", field 3 varint 300, field 1 again (wins).
        let (v, others) = read(&[0x08, 5, 0x12, 2, b'a', b'b', 0x18, 0xac, 0x02, 0x08, 7]).unwrap();
        assert_eq!(v, [0, 7, 0, 300]);
        assert_eq!(others, [(2, true)]);
        // A key written in two bytes (legal, if unusual) is still field 3.
        assert_eq!(read(&[0x98, 0x00, 9]).unwrap().0, [0, 0, 0, 9]);
        // A varint field sent as bytes is refused, naming the field.
        let err = read(&[0x1a, 1, 0]).unwrap_err().to_string();
        assert!(err.contains("field 3"), "{err}");
        // Field number 0 and a cut varint are refused.
        assert!(read(&[0x00, 1]).is_err());
        assert!(read(&[0x08, 0x80]).is_err());
    }
}
