//! The protobuf scan: one pass over the wire format, a fixed array of frames for the
//! messages open at the current byte, no allocation (but for an error's message).

use super::{Field, Kind, MAX_DEPTH, MAX_FIELDS, RequestLimits, Scanned, Shape, Tally, Via};
use crate::{Error, Result};

/// A message being read: its shape, where it ends, how it was entered, and how many of
/// each of its fields it held so far.
#[derive(Debug, Clone, Copy)]
struct Frame {
    shape: &'static Shape,
    end: usize,
    via: Option<Via>,
    counts: [u32; MAX_FIELDS],
}

/// A varint at the start of `buf`: its value and the bytes it took.
pub(super) fn varint(buf: &[u8]) -> std::result::Result<(u64, usize), &'static str> {
    let mut value = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            if i == 9 && b > 1 {
                return Err("a varint overflows 64 bits");
            }
            return Ok((value, i + 1));
        }
    }
    Err(if buf.len() < 10 {
        "the message ends inside a varint"
    } else {
        "a varint is longer than 10 bytes"
    })
}

/// The scan of a whole message of `shape` in `buf`.
pub(super) fn scan(
    format: &'static str,
    shape: &'static Shape,
    buf: &[u8],
    limits: &RequestLimits,
) -> Result<Scanned> {
    let mut tally = Tally::new(shape, buf.len(), limits)?;
    let empty = Frame {
        shape,
        end: buf.len(),
        via: None,
        counts: [0; MAX_FIELDS],
    };
    let mut frames = [empty; MAX_DEPTH];
    let mut depth = 1;
    let mut pos = 0;
    // Errors name the path of the frames open, and the field being read.
    let malformed = |frames: &[Frame], last: Option<Via>, reason: &str| Error::Convert {
        format,
        at: super::path(frames.iter().filter_map(|f| f.via), last),
        reason: format!("not a {} protobuf: {reason}", shape.name),
    };
    loop {
        // Close the messages that end here.
        while pos == frames[depth - 1].end {
            if depth == 1 {
                return Ok(Scanned {
                    decoded_bytes: tally.decoded,
                });
            }
            depth -= 1;
        }
        let frame = frames[depth - 1];
        let open = &frames[..depth];
        let bytes = &buf[pos..frame.end];
        let (key, n) = varint(bytes).map_err(|e| malformed(open, None, e))?;
        let number = key >> 3;
        if number == 0 || number >= 1 << 29 {
            let reason = format!("invalid field number {number}");
            return Err(malformed(open, None, &reason));
        }
        let bytes = &bytes[n..];
        let at = frame.shape.field(number);
        let field = at.map(|i| &frame.shape.fields[i]);
        let via = field.map(|field| Via { field, index: None });
        // The value's extent: `len` bytes of payload after `header` bytes.
        let (wire, header, len) = match key & 7 {
            0 => (
                Wire::Varint,
                0,
                varint(bytes).map_err(|e| malformed(open, via, e))?.1,
            ),
            1 => (Wire::Fixed64, 0, 8),
            2 => {
                let (len, n) = varint(bytes).map_err(|e| malformed(open, via, e))?;
                (Wire::Len, n, usize::try_from(len).unwrap_or(usize::MAX))
            }
            5 => (Wire::Fixed32, 0, 4),
            3 | 4 => {
                let reason = format!("field {number} is a group, which proto3 has not");
                return Err(malformed(open, via, &reason));
            }
            wire => {
                let reason = format!("field {number} has wire type {wire}, which does not exist");
                return Err(malformed(open, via, &reason));
            }
        };
        let left = bytes.len() - header;
        if left < len {
            let reason = format!("field {number} needs {len} bytes, its message has {left} left");
            return Err(malformed(open, via, &reason));
        }
        let payload = &bytes[header..header + len];
        let (start, next) = (pos + n + header, pos + n + header + len);
        let (Some(i), Some(field)) = (at, field) else {
            // Unknown: skipped, as decoding skips it.
            pos = next;
            continue;
        };
        match (field.kind, wire) {
            (Kind::Message(nested), Wire::Len) => {
                let index = if field.repeated {
                    Some(count(&mut frames[depth - 1], i, field, 1, &mut tally)?)
                } else {
                    None
                };
                tally.depth(depth + 1)?;
                frames[depth] = Frame {
                    shape: nested,
                    end: next,
                    via: Some(Via { field, index }),
                    counts: [0; MAX_FIELDS],
                };
                depth += 1;
                // Into the message: its fields are read next.
                pos = start;
                continue;
            }
            (Kind::String | Kind::Bytes, Wire::Len) => {
                if field.repeated {
                    count(&mut frames[depth - 1], i, field, 1, &mut tally)?;
                }
                tally.decoded(len)?;
            }
            (Kind::Varint(_), Wire::Varint)
            | (Kind::Fixed32, Wire::Fixed32)
            | (Kind::Fixed64, Wire::Fixed64) => {
                if field.repeated {
                    count(&mut frames[depth - 1], i, field, 1, &mut tally)?;
                }
            }
            (Kind::Varint(_) | Kind::Fixed32 | Kind::Fixed64, Wire::Len) if field.repeated => {
                let n = packed(field, payload).map_err(|e| malformed(open, via, &e))?;
                count(&mut frames[depth - 1], i, field, n, &mut tally)?;
            }
            (kind, wire) => {
                let reason = format!(
                    "field {number} is {}, which {} cannot be",
                    wire.name(),
                    kind.name()
                );
                return Err(malformed(&frames[..depth], via, &reason));
            }
        }
        pos = next;
    }
}

/// Counts `n` elements of `frame`'s field `i` (repeated); the position of the first.
fn count(
    frame: &mut Frame,
    i: usize,
    field: &Field,
    n: usize,
    tally: &mut Tally<'_>,
) -> Result<u32> {
    let first = frame.counts[i];
    let now = first.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
    frame.counts[i] = now;
    tally.count(field, now as usize, n)?;
    tally.decoded(n.saturating_mul(field.element_size()))?;
    Ok(first)
}

/// How a value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

impl Wire {
    fn name(self) -> &'static str {
        match self {
            Wire::Varint => "a varint",
            Wire::Fixed64 => "a fixed 64-bit value",
            Wire::Len => "length-delimited",
            Wire::Fixed32 => "a fixed 32-bit value",
        }
    }
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Message(_) => "a message",
            Kind::String => "a string",
            Kind::Bytes => "bytes",
            Kind::Varint(_) => "a varint field",
            Kind::Fixed32 => "a fixed 32-bit field",
            Kind::Fixed64 => "a fixed 64-bit field",
        }
    }
}

/// The number of values of a packed repeated scalar `field` in `payload`.
fn packed(field: &Field, payload: &[u8]) -> std::result::Result<usize, String> {
    let size = match field.kind {
        Kind::Fixed32 => 4,
        Kind::Fixed64 => 8,
        // Every varint ends with a byte below 0x80, the last byte among them.
        _ => {
            if payload.last().is_some_and(|b| *b >= 0x80) {
                return Err("a packed field ends inside a varint".into());
            }
            return Ok(payload.iter().filter(|b| **b < 0x80).count());
        }
    };
    if !payload.len().is_multiple_of(size) {
        return Err(format!(
            "a packed field of {size}-byte values is {} bytes long",
            payload.len()
        ));
    }
    Ok(payload.len() / size)
}
