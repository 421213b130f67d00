//! The proto3 JSON scan: one pass over the text, a fixed array of frames for the objects
//! open at the current byte, no allocation (but for an error's message).
//!
//! The syntax must be JSON: decoding would stop at a syntax error only after materialising
//! what came before it, so the scan refuses it first. A value of the wrong type for its
//! field (a number where a list belongs) is skipped uncounted: decoding refuses it where it
//! stands, having materialised only what the scan counted before it. Unknown keys are
//! skipped, as decoding skips them.

use super::{Field, Kind, MAX_DEPTH, MAX_FIELDS, RequestLimits, Scanned, Shape, Tally, Via};
use crate::{Error, Result};

/// Where an object is in its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// After `{`: a key or `}`.
    Start,
    /// After a member: `,` or `}`.
    Next,
    /// After `[` of repeated field `i`: a value or `]`.
    ArrayStart(usize),
    /// After an element of repeated field `i`: `,` or `]`.
    ArrayNext(usize),
}

/// An object being read as a message of `shape`.
#[derive(Debug, Clone, Copy)]
struct Frame {
    shape: &'static Shape,
    via: Option<Via>,
    state: State,
    counts: [u32; MAX_FIELDS],
}

/// Deepest nesting of values of unknown fields a scan skips (as `serde_json`'s recursion
/// limit, which decoding would hit).
const MAX_SKIP_DEPTH: u32 = 128;

/// Why the text is not JSON, and where.
#[derive(Debug)]
struct Syntax {
    at: usize,
    what: &'static str,
}

fn syntax(at: usize, what: &'static str) -> Syntax {
    Syntax { at, what }
}

/// The scan of a whole message of `shape` in `text`.
pub(super) fn scan(
    format: &'static str,
    shape: &'static Shape,
    text: &[u8],
    limits: &RequestLimits,
) -> Result<Scanned> {
    let mut tally = Tally::new(shape, text.len(), limits)?;
    let mut frames = [Frame {
        shape,
        via: None,
        state: State::Start,
        counts: [0; MAX_FIELDS],
    }; MAX_DEPTH];
    let mut depth = 0;
    let malformed = |frames: &[Frame], e: Syntax| Error::Convert {
        format,
        at: super::path(frames.iter().filter_map(|f| f.via), None),
        reason: format!("not {} JSON: {} at byte {}", shape.name, e.what, e.at),
    };
    let mut pos = ws(text, 0);
    if text.get(pos) != Some(&b'{') {
        return Err(malformed(&frames[..0], syntax(pos, "expected an object")));
    }
    pos += 1;
    depth += 1;
    loop {
        pos = ws(text, pos);
        let top = depth - 1;
        let c = text.get(pos).copied();
        match frames[top].state {
            State::Start | State::Next => {
                if c == Some(b'}') {
                    pos += 1;
                    depth -= 1;
                    if depth == 0 {
                        pos = ws(text, pos);
                        if pos != text.len() {
                            return Err(malformed(
                                &frames[..0],
                                syntax(pos, "text after the object"),
                            ));
                        }
                        return Ok(Scanned {
                            decoded_bytes: tally.decoded,
                        });
                    }
                    continue;
                }
                if frames[top].state == State::Next {
                    if c != Some(b',') {
                        return Err(malformed(&frames[..depth], syntax(pos, "expected , or }")));
                    }
                    pos = ws(text, pos + 1);
                }
                frames[top].state = State::Next;
                let (raw, end) = key(text, pos).map_err(|e| malformed(&frames[..depth], e))?;
                let mut buf = [0; MAX_KEY];
                let key = if raw.contains(&b'\\') {
                    unescape(raw, &mut buf)
                } else {
                    Some(raw)
                };
                pos = ws(text, end);
                if text.get(pos) != Some(&b':') {
                    return Err(malformed(&frames[..depth], syntax(pos, "expected :")));
                }
                pos = ws(text, pos + 1);
                let shape = frames[top].shape;
                let Some(i) = key.and_then(|k| shape.fields.iter().position(|f| f.matches(k)))
                else {
                    pos = skip(text, pos).map_err(|e| malformed(&frames[..depth], e))?;
                    continue;
                };
                let field = &shape.fields[i];
                match text.get(pos) {
                    Some(b'[') if field.repeated => {
                        frames[top].state = State::ArrayStart(i);
                        pos += 1;
                    }
                    Some(b'{') if !field.repeated => {
                        if let Kind::Message(nested) = field.kind {
                            tally.depth(depth + 1)?;
                            frames[depth] = Frame {
                                shape: nested,
                                via: Some(Via { field, index: None }),
                                state: State::Start,
                                counts: [0; MAX_FIELDS],
                            };
                            depth += 1;
                            pos += 1;
                        } else {
                            pos = skip(text, pos).map_err(|e| malformed(&frames[..depth], e))?;
                        }
                    }
                    _ => {
                        let end = skip(text, pos).map_err(|e| malformed(&frames[..depth], e))?;
                        if !field.repeated {
                            tally.decoded(scalar_bytes(field, &text[pos..end]))?;
                        }
                        pos = end;
                    }
                }
            }
            State::ArrayStart(i) | State::ArrayNext(i) => {
                if c == Some(b']') {
                    frames[top].state = State::Next;
                    pos += 1;
                    continue;
                }
                if matches!(frames[top].state, State::ArrayNext(_)) {
                    if c != Some(b',') {
                        return Err(malformed(&frames[..depth], syntax(pos, "expected , or ]")));
                    }
                    pos = ws(text, pos + 1);
                }
                frames[top].state = State::ArrayNext(i);
                let field = &frames[top].shape.fields[i];
                let counts = &mut frames[top].counts;
                let index = counts[i];
                counts[i] = index.saturating_add(1);
                tally.count(field, counts[i] as usize, 1)?;
                tally.decoded(field.element_size())?;
                match (field.kind, text.get(pos)) {
                    (Kind::Message(nested), Some(b'{')) => {
                        tally.depth(depth + 1)?;
                        frames[depth] = Frame {
                            shape: nested,
                            via: Some(Via {
                                field,
                                index: Some(index),
                            }),
                            state: State::Start,
                            counts: [0; MAX_FIELDS],
                        };
                        depth += 1;
                        pos += 1;
                    }
                    _ => {
                        let end = skip(text, pos).map_err(|e| malformed(&frames[..depth], e))?;
                        tally.decoded(scalar_bytes(field, &text[pos..end]))?;
                        pos = end;
                    }
                }
            }
        }
    }
}

impl Field {
    /// Whether a JSON key names this field (its JSON or its proto name).
    fn matches(&self, key: &[u8]) -> bool {
        key == self.json.as_bytes() || key == self.name.as_bytes()
    }
}

/// What a scalar value (`raw`, as in the text) of `field` takes decoded: text and bytes
/// take their length (bytes, in base64, also their decoded copy); numbers are counted with
/// their element.
fn scalar_bytes(field: &Field, raw: &[u8]) -> usize {
    match field.kind {
        Kind::String if raw.first() == Some(&b'"') => raw.len(),
        Kind::Bytes if raw.first() == Some(&b'"') => raw.len().saturating_mul(2),
        _ => 0,
    }
}

/// After whitespace from `pos`.
fn ws(text: &[u8], mut pos: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(pos) {
        pos += 1;
    }
    pos
}

/// A key at `pos`: its text as written between the quotes, and where it ends.
fn key(text: &[u8], pos: usize) -> std::result::Result<(&[u8], usize), Syntax> {
    if text.get(pos) != Some(&b'"') {
        return Err(syntax(pos, "expected a key"));
    }
    let end = string_end(text, pos)?;
    Ok((&text[pos + 1..end - 1], end))
}

/// Longest key compared with field names once its escapes are decoded: no field name is
/// longer, so a longer key names none.
const MAX_KEY: usize = 64;

/// `raw`, a key as written, with its escapes decoded into `buf` (as decoding reads it, so
/// that `"\u0073eries"` is `series` here too); `None` when it is longer than [`MAX_KEY`]
/// or its escapes are bad (decoding refuses those).
fn unescape<'b>(raw: &[u8], buf: &'b mut [u8; MAX_KEY]) -> Option<&'b [u8]> {
    let mut len = 0;
    let mut put = |bytes: &[u8], len: &mut usize| -> Option<()> {
        buf.get_mut(*len..*len + bytes.len())?
            .copy_from_slice(bytes);
        *len += bytes.len();
        Some(())
    };
    let hex = |at: usize| -> Option<u32> {
        let digits = std::str::from_utf8(raw.get(at..at + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' {
            put(&raw[i..i + 1], &mut len)?;
            i += 1;
            continue;
        }
        let c = match raw.get(i + 1)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = hex(i + 2)?;
                i += 4;
                if (0xd800..0xdc00).contains(&unit) && raw.get(i + 2..i + 4) == Some(b"\\u") {
                    let low = hex(i + 4)?;
                    i += 6;
                    char::from_u32(0x10000 + ((unit - 0xd800) << 10) + (low.checked_sub(0xdc00)?))?
                } else {
                    char::from_u32(unit)?
                }
            }
            _ => return None,
        };
        i += 2;
        put(c.encode_utf8(&mut [0; 4]).as_bytes(), &mut len)?;
    }
    Some(&buf[..len])
}

/// The end (after the closing quote) of the string starting at `pos`.
fn string_end(text: &[u8], pos: usize) -> std::result::Result<usize, Syntax> {
    let mut i = pos + 1;
    loop {
        match memchr::memchr2(b'"', b'\\', text.get(i..).unwrap_or_default()) {
            None => return Err(syntax(pos, "unterminated string")),
            Some(n) if text[i + n] == b'"' => return Ok(i + n + 1),
            // An escape: the next byte is taken whatever it is (`\uXXXX` goes on with hex).
            Some(n) => i += n + 2,
        }
    }
}

/// The end of a number or `true`, `false`, `null` at `pos`.
fn literal_end(text: &[u8], pos: usize) -> std::result::Result<usize, Syntax> {
    for word in [&b"true"[..], b"false", b"null"] {
        if text[pos..].starts_with(word) {
            return Ok(pos + word.len());
        }
    }
    let mut end = pos;
    while let Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') = text.get(end) {
        end += 1;
    }
    if end == pos {
        return Err(syntax(pos, "expected a value"));
    }
    Ok(end)
}

/// The end of the value at `pos`, whatever it holds (nesting up to [`MAX_SKIP_DEPTH`],
/// held in the bits of a word: one per open bracket, set for an object).
fn skip(text: &[u8], mut pos: usize) -> std::result::Result<usize, Syntax> {
    let mut objects: u128 = 0;
    let mut depth: u32 = 0;
    loop {
        // A value.
        pos = ws(text, pos);
        match text.get(pos) {
            Some(c @ (b'{' | b'[')) => {
                if depth == MAX_SKIP_DEPTH {
                    return Err(syntax(pos, "nested too deep"));
                }
                let object = *c == b'{';
                objects = (objects << 1) | u128::from(object);
                depth += 1;
                pos = ws(text, pos + 1);
                let close = if object { b'}' } else { b']' };
                if text.get(pos) == Some(&close) {
                    objects >>= 1;
                    depth -= 1;
                    pos += 1;
                } else {
                    if object {
                        pos = member_key(text, pos)?;
                    }
                    continue;
                }
            }
            Some(b'"') => pos = string_end(text, pos)?,
            Some(_) => pos = literal_end(text, pos)?,
            None => return Err(syntax(pos, "expected a value")),
        }
        // After a value: close what ends here, or go on to the next member or element.
        loop {
            if depth == 0 {
                return Ok(pos);
            }
            pos = ws(text, pos);
            let object = objects & 1 == 1;
            match (text.get(pos), object) {
                (Some(b','), _) => {
                    pos += 1;
                    if object {
                        pos = member_key(text, ws(text, pos))?;
                    }
                    break;
                }
                (Some(b'}'), true) | (Some(b']'), false) => {
                    objects >>= 1;
                    depth -= 1;
                    pos += 1;
                }
                _ => return Err(syntax(pos, "expected , or a closing bracket")),
            }
        }
    }
}

/// After `"key":` at `pos`.
fn member_key(text: &[u8], pos: usize) -> std::result::Result<usize, Syntax> {
    let (_, end) = key(text, pos)?;
    let pos = ws(text, end);
    if text.get(pos) != Some(&b':') {
        return Err(syntax(pos, "expected :"));
    }
    Ok(pos + 1)
}
