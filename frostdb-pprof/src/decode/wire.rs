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
        let (key, n) = varint(buf)?;
        buf = &buf[n..];
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|&n| n > 0 && n < (1 << 29))
            .ok_or_else(|| malformed(format!("invalid field number {}", key >> 3)))?;
        let take = |buf: &mut &'a [u8], len: usize| -> Result<&'a [u8]> {
            if buf.len() < len {
                return Err(malformed(format!(
                    "field {number} needs {len} bytes, {} are left",
                    buf.len()
                )));
            }
            let (head, tail) = buf.split_at(len);
            *buf = tail;
            Ok(head)
        };
        let value = match key & 7 {
            0 => {
                let (v, n) = varint(buf)?;
                buf = &buf[n..];
                Value::Varint(v)
            }
            1 => {
                take(&mut buf, 8)?;
                Value::Fixed64
            }
            2 => {
                let (len, n) = varint(buf)?;
                buf = &buf[n..];
                let len = usize::try_from(len).map_err(|_| malformed("length overflows"))?;
                Value::Bytes(take(&mut buf, len)?)
            }
            5 => {
                take(&mut buf, 4)?;
                Value::Fixed32
            }
            wire => {
                return Err(malformed(format!(
                    "field {number} has wire type {wire}, which pprof does not use"
                )));
            }
        };
        field(number, value)?;
    }
    Ok(())
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
}
