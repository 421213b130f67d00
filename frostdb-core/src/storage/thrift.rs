//! A check of Thrift compact-protocol structs (Parquet's footer and page headers) before
//! Parquet decodes them: Parquet sizes some vectors by a list's declared count before it
//! reads an element (a 30-byte footer declaring 2³¹ row groups asks for about 200 GB), and
//! trusts a page header's sizes when it allocates the page. The walk is iterative (a stack
//! of at most [`MAX_DEPTH`] frames, never recursion over the input), takes time linear in
//! the bytes, and allocates nothing but that stack.
//!
//! Wire format: <https://github.com/apache/thrift/blob/master/doc/specs/thrift-compact-protocol.md>.

/// Containers nested deeper than this are refused (Parquet's own skipping stops at 64).
pub(crate) const MAX_DEPTH: usize = 64;

/// What was wrong with the bytes, for an error naming the object.
pub(crate) type Malformed = String;

/// The type a struct's field must be sent as. Parquet reads a field by its id alone, not
/// by the type it was sent as: a known field sent as another type would be read from bytes
/// this check took for something else (a page size from a string's length, a list header
/// from what followed a boolean). So a known field of another type is refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    Bool,
    I16,
    I32,
    I64,
    Binary,
    /// A struct, checked against its spec when one is given.
    Struct(Option<&'static Spec>),
    /// A list of elements of one wire type (1 for booleans), and their spec when structs.
    List(u8, Option<&'static Spec>),
    /// A list as [`Ty::List`] of at most this many elements: one Parquet sizes a vector by,
    /// of elements that may take a byte each.
    ListAtMost(u8, Option<&'static Spec>, u64),
    /// An i32 that Parquet sizes a vector by (a schema element's children): at least 0 and
    /// at most the bytes left, as each of its elements takes one at least.
    Count,
    /// An i32 count of values Parquet decodes into a vector it reserves first (a dictionary
    /// page's): reported to the caller, who knows how many bytes a value takes at least.
    Values,
}

/// An integer field reported by [`check_struct`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// A field of the outermost struct, by id.
    Top(i16),
    /// A count of values ([`Ty::Values`]), wherever it is.
    Values,
}

/// The fields of a struct Parquet reads: id and type. Fields not named are skipped by
/// Parquet as by this check, whatever their type.
#[derive(Debug)]
pub(crate) struct Spec(pub(crate) &'static [(i16, Ty)]);

impl Spec {
    fn field(&self, id: i16) -> Option<Ty> {
        self.0.iter().find(|(i, _)| *i == id).map(|&(_, t)| t)
    }
}

/// Wire types: 1 and 2 booleans, 3 i8, 4 i16, 5 i32, 6 i64, 7 double, 8 binary, 9 list,
/// 10 set, 11 map, 12 struct.
fn sent_as(ty: Ty, wire: u8) -> bool {
    match ty {
        Ty::Bool => wire == 1 || wire == 2,
        Ty::I16 => wire == 4,
        Ty::I32 | Ty::Count | Ty::Values => wire == 5,
        Ty::I64 => wire == 6,
        Ty::Binary => wire == 8,
        Ty::Struct(_) => wire == 12,
        Ty::List(..) | Ty::ListAtMost(..) => wire == 9,
    }
}

const STATISTICS: Spec = Spec(&[
    (1, Ty::Binary),
    (2, Ty::Binary),
    (3, Ty::I64),
    (4, Ty::I64),
    (5, Ty::Binary),
    (6, Ty::Binary),
    (7, Ty::Bool),
    (8, Ty::Bool),
]);

const DATA_PAGE_HEADER: Spec = Spec(&[
    (1, Ty::I32),
    (2, Ty::I32),
    (3, Ty::I32),
    (4, Ty::I32),
    (5, Ty::Struct(Some(&STATISTICS))),
]);

const DICTIONARY_PAGE_HEADER: Spec = Spec(&[(1, Ty::Values), (2, Ty::I32), (3, Ty::Bool)]);

const DATA_PAGE_HEADER_V2: Spec = Spec(&[
    (1, Ty::I32),
    (2, Ty::I32),
    (3, Ty::I32),
    (4, Ty::I32),
    (5, Ty::I32),
    (6, Ty::I32),
    (7, Ty::Bool),
    (8, Ty::Struct(Some(&STATISTICS))),
]);

/// Parquet's `PageHeader`: 2 is the uncompressed size, 3 the compressed size.
pub(crate) const PAGE_HEADER: Spec = Spec(&[
    (1, Ty::I32),
    (2, Ty::I32),
    (3, Ty::I32),
    (4, Ty::I32),
    (5, Ty::Struct(Some(&DATA_PAGE_HEADER))),
    (6, Ty::Struct(None)),
    (7, Ty::Struct(Some(&DICTIONARY_PAGE_HEADER))),
    (8, Ty::Struct(Some(&DATA_PAGE_HEADER_V2))),
]);

const COLUMN_META_DATA: Spec = Spec(&[
    (1, Ty::I32),
    (2, Ty::List(5, None)),
    (3, Ty::List(8, None)),
    (4, Ty::I32),
    (5, Ty::I64),
    (6, Ty::I64),
    (7, Ty::I64),
    (8, Ty::List(12, None)),
    (9, Ty::I64),
    (10, Ty::I64),
    (11, Ty::I64),
    (12, Ty::Struct(Some(&STATISTICS))),
    (13, Ty::List(12, None)),
    (14, Ty::I64),
    (15, Ty::I32),
    (16, Ty::Struct(None)),
    (17, Ty::Struct(None)),
]);

const COLUMN_CHUNK: Spec = Spec(&[
    (1, Ty::Binary),
    (2, Ty::I64),
    (3, Ty::Struct(Some(&COLUMN_META_DATA))),
    (4, Ty::I64),
    (5, Ty::I32),
    (6, Ty::I64),
    (7, Ty::I32),
    (8, Ty::Struct(None)),
    (9, Ty::Binary),
]);

const ROW_GROUP: Spec = Spec(&[
    (1, Ty::List(12, Some(&COLUMN_CHUNK))),
    (2, Ty::I64),
    (3, Ty::I64),
    (4, Ty::List(12, None)),
    (5, Ty::I64),
    (6, Ty::I64),
    (7, Ty::I16),
]);

/// Parquet's `SchemaElement`: 5 is the number of children, which Parquet reserves a vector
/// of before it reads one.
const SCHEMA_ELEMENT: Spec = Spec(&[
    (1, Ty::I32),
    (2, Ty::I32),
    (3, Ty::I32),
    (4, Ty::Binary),
    (5, Ty::Count),
    (6, Ty::I32),
    (7, Ty::I32),
    (8, Ty::I32),
    (9, Ty::I32),
    (10, Ty::Struct(None)),
]);

/// Most elements of a footer's schema: a table's columns and the root. A table has a few
/// static columns and one per label name, far fewer; each element builds a type, a path
/// and a column descriptor of a few hundred bytes.
pub(crate) const MAX_SCHEMA_ELEMENTS: u64 = 1 << 16;

/// Most row groups of a block: Parquet's own limit (a row group's ordinal is an i16).
pub(crate) const MAX_ROW_GROUPS: u64 = i16::MAX as u64;

/// Parquet's `FileMetaData`, a file's footer.
pub(crate) const FILE_META_DATA: Spec = Spec(&[
    (1, Ty::I32),
    (
        2,
        Ty::ListAtMost(12, Some(&SCHEMA_ELEMENT), MAX_SCHEMA_ELEMENTS),
    ),
    (3, Ty::I64),
    (4, Ty::ListAtMost(12, Some(&ROW_GROUP), MAX_ROW_GROUPS)),
    (5, Ty::List(12, None)),
    (6, Ty::Binary),
    (7, Ty::List(12, None)),
    (8, Ty::Struct(None)),
    (9, Ty::Binary),
]);

const PAGE_LOCATION: Spec = Spec(&[(1, Ty::I64), (2, Ty::I32), (3, Ty::I64)]);

/// Parquet's `OffsetIndex` of a column chunk.
pub(crate) const OFFSET_INDEX: Spec = Spec(&[
    (1, Ty::List(12, Some(&PAGE_LOCATION))),
    (2, Ty::List(6, None)),
]);

/// Parquet's `ColumnIndex` of a column chunk.
pub(crate) const COLUMN_INDEX: Spec = Spec(&[
    (1, Ty::List(1, None)),
    (2, Ty::List(8, None)),
    (3, Ty::List(8, None)),
    (4, Ty::I32),
    (5, Ty::List(6, None)),
    (6, Ty::List(6, None)),
    (7, Ty::List(6, None)),
]);

/// Most levels of a footer's schema tree: Parquet builds its types by recursing once a
/// level (a schema of 65,000 levels, in a footer of half a megabyte, overflowed the
/// reading thread's stack, aborting the process). A table's schema has a few.
pub(crate) const MAX_SCHEMA_DEPTH: usize = 64;

/// The schema tree as its elements pass (a preorder list, each element saying how many
/// children follow it): how many children each open level still has to come.
#[derive(Default)]
struct SchemaDepth {
    open: Vec<u64>,
    /// The children of the element being read (none for a leaf, which says none).
    children: u64,
}

impl SchemaDepth {
    /// A schema element ended: it is a child of the open level, and opens one of its own
    /// when it has children.
    fn element_ends(&mut self) -> Result<(), String> {
        if let Some(left) = self.open.last_mut() {
            *left = left.saturating_sub(1);
        }
        let children = std::mem::take(&mut self.children);
        if children > 0 {
            self.open.push(children);
            if self.open.len() > MAX_SCHEMA_DEPTH {
                return Err(format!("a schema deeper than {MAX_SCHEMA_DEPTH} levels"));
            }
        }
        while self.open.last() == Some(&0) {
            self.open.pop();
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Frame {
    /// Reading a struct's fields (checked against `spec`, when known); `top` when it is
    /// the outermost struct.
    Struct {
        top: bool,
        spec: Option<&'static Spec>,
    },
    /// `left` elements of type `ty` still to read (a list or set), of `spec` when structs.
    List {
        ty: u8,
        left: u64,
        spec: Option<&'static Spec>,
    },
    /// `left` entries still to read; `key` when the next value is an entry's key.
    Map {
        key_ty: u8,
        value_ty: u8,
        left: u64,
        key: bool,
    },
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.at) as u64
    }

    fn byte(&mut self) -> Result<u8, Malformed> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| format!("ends inside a value at byte {}", self.at))?;
        self.at += 1;
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> Result<(), Malformed> {
        if n > self.remaining() {
            return Err(format!(
                "declares {n} bytes at byte {}, past its end ({} bytes left)",
                self.at,
                self.remaining()
            ));
        }
        self.at += n as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("a varint longer than 10 bytes at byte {}", self.at))
    }

    fn zigzag(&mut self) -> Result<i64, Malformed> {
        let v = self.varint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }
}

/// Checks one compact-protocol struct of `spec` at the start of `bytes`: every field
/// `spec` (and the specs of the structs it holds) names is sent as its type, every
/// container's declared count and every string's length fit in the bytes left (each element
/// takes at least one byte), containers nest at most [`MAX_DEPTH`] deep, and every type is
/// known. Calls `report(Field::Top(id), value)` for each integer field of the outermost
/// struct, and `report(Field::Values, value)` for each count of values.
/// Returns how many bytes the struct took.
pub(crate) fn check_struct(
    bytes: &[u8],
    spec: &'static Spec,
    mut report: impl FnMut(Field, i64),
) -> Result<usize, Malformed> {
    let mut c = Cursor { bytes, at: 0 };
    let mut schema = SchemaDepth::default();
    let mut stack = vec![Frame::Struct {
        top: true,
        spec: Some(spec),
    }];
    // The id of the previous field of each open struct (ids are sent as deltas).
    let mut last_ids: Vec<i16> = vec![0];
    while let Some(frame) = stack.last_mut() {
        // The type of the next value to read, whether it is a top-level field's (and
        // which), and what it must be (a known field's, or a list's elements').
        let (ty, top_id, expected) = match frame {
            Frame::Struct { top, spec } => {
                let (top, spec) = (*top, *spec);
                let header = c.byte()?;
                if header == 0 {
                    if spec.is_some_and(|s| s.field(5).is_some_and(|t| matches!(t, Ty::Count))) {
                        schema
                            .element_ends()
                            .map_err(|e| format!("{e} at byte {}", c.at))?;
                    }
                    stack.pop();
                    last_ids.pop();
                    continue;
                }
                let last = last_ids.last_mut().expect("a struct's id slot");
                let delta = header >> 4;
                let id = if delta == 0 {
                    i16::try_from(c.zigzag()?)
                        .map_err(|_| format!("a field id out of range at byte {}", c.at))?
                } else {
                    last.wrapping_add(i16::from(delta))
                };
                *last = id;
                let wire = header & 0x0f;
                let expected = spec.and_then(|s| s.field(id));
                if let Some(t) = expected
                    && !sent_as(t, wire)
                {
                    return Err(format!(
                        "field {id} at byte {} is sent as type {wire}, not as {t:?}",
                        c.at
                    ));
                }
                (wire, top.then_some(id), expected)
            }
            Frame::List { ty, left, spec } => {
                if *left == 0 {
                    stack.pop();
                    continue;
                }
                *left -= 1;
                // A list of booleans holds one byte per element.
                let expected = (*ty == 12).then_some(Ty::Struct(*spec));
                (if *ty == 2 { 1 } else { *ty }, None, expected)
            }
            Frame::Map {
                key_ty,
                value_ty,
                left,
                key,
            } => {
                if *left == 0 {
                    stack.pop();
                    continue;
                }
                let ty = if *key { *key_ty } else { *value_ty };
                if !*key {
                    *left -= 1;
                }
                *key = !*key;
                (if ty == 2 { 1 } else { ty }, None, None)
            }
        };
        let in_container = top_id.is_none() && !matches!(stack.last(), Some(Frame::Struct { .. }));
        match ty {
            // Booleans: in a field the value is the type itself; in a container, a byte.
            1 | 2 => {
                if in_container {
                    c.byte()?;
                }
            }
            3 => {
                let v = c.byte()? as i8;
                if let Some(id) = top_id {
                    report(Field::Top(id), i64::from(v));
                }
            }
            4..=6 => {
                let v = c.zigzag()?;
                if matches!(expected, Some(Ty::Count)) {
                    match u64::try_from(v) {
                        Ok(n) if n <= c.remaining() => schema.children = n,
                        _ => {
                            return Err(format!(
                                "a count of {v} at byte {}, with {} bytes left",
                                c.at,
                                c.remaining()
                            ));
                        }
                    }
                }
                if matches!(expected, Some(Ty::Values)) {
                    report(Field::Values, v);
                }
                if let Some(id) = top_id {
                    report(Field::Top(id), v);
                }
            }
            7 => c.skip(8)?,
            8 => {
                let n = c.varint()?;
                c.skip(n)?;
            }
            9 | 10 => {
                let header = c.byte()?;
                let short = u64::from(header >> 4);
                let left = if short == 15 { c.varint()? } else { short };
                let elem = header & 0x0f;
                if left > c.remaining() {
                    return Err(format!(
                        "a list of {left} elements at byte {}, with {} bytes left",
                        c.at,
                        c.remaining()
                    ));
                }
                if !(1..=12).contains(&elem) && left > 0 {
                    return Err(format!("a list of unknown type {elem} at byte {}", c.at));
                }
                let (expected, most) = match expected {
                    Some(Ty::ListAtMost(want, spec, most)) => (Some(Ty::List(want, spec)), most),
                    other => (other, u64::MAX),
                };
                if left > most {
                    return Err(format!(
                        "a list of {left} elements at byte {}, more than the {most} it may hold",
                        c.at
                    ));
                }
                let spec = match expected {
                    Some(Ty::List(want, spec)) => {
                        let bools = want == 1 && (elem == 1 || elem == 2);
                        if left > 0 && elem != want && !bools {
                            return Err(format!(
                                "a list of type {elem} at byte {}, not of {want}",
                                c.at
                            ));
                        }
                        spec
                    }
                    _ => None,
                };
                push(
                    &mut stack,
                    Frame::List {
                        ty: elem,
                        left,
                        spec,
                    },
                )?;
            }
            11 => {
                let left = c.varint()?;
                let (key_ty, value_ty) = if left == 0 {
                    (0, 0)
                } else {
                    let types = c.byte()?;
                    (types >> 4, types & 0x0f)
                };
                if left.saturating_mul(2) > c.remaining() {
                    return Err(format!(
                        "a map of {left} entries at byte {}, with {} bytes left",
                        c.at,
                        c.remaining()
                    ));
                }
                if left > 0 && !((1..=12).contains(&key_ty) && (1..=12).contains(&value_ty)) {
                    return Err(format!("a map of unknown types at byte {}", c.at));
                }
                push(
                    &mut stack,
                    Frame::Map {
                        key_ty,
                        value_ty,
                        left,
                        key: true,
                    },
                )?;
            }
            12 => {
                let spec = match expected {
                    Some(Ty::Struct(spec)) => spec,
                    _ => None,
                };
                push(&mut stack, Frame::Struct { top: false, spec })?;
                last_ids.push(0);
            }
            other => return Err(format!("unknown type {other} at byte {}", c.at)),
        }
    }
    Ok(c.at)
}

fn push(stack: &mut Vec<Frame>, frame: Frame) -> Result<(), Malformed> {
    if stack.len() >= MAX_DEPTH {
        return Err(format!("nests deeper than {MAX_DEPTH}"));
    }
    stack.push(frame);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A struct of no known fields: only the wire format is checked.
    const ANY: Spec = Spec(&[]);

    /// A field header: its id delta from the previous field, and its type.
    fn field(delta: u8, ty: u8) -> u8 {
        (delta << 4) | ty
    }

    #[test]
    fn well_formed_structs_pass_and_report_top_level_integers() {
        // { 1: i32 -3, 2: binary "ab", 3: list<i32> [1, 2], 4: struct { 1: true }, 5: map<i32,
        // bool> {7: false}, 7: double, 8: list<bool> [true, false] } and a trailing byte.
        let bytes = [
            field(1, 5),
            0x05, // zigzag(-3)
            field(1, 8),
            2,
            b'a',
            b'b',
            field(1, 9),
            0x25, // two i32s
            0x02,
            0x04,
            field(1, 12),
            field(1, 1),
            0,
            field(1, 11),
            1,
            0x51, // i32 keys, bool values (type 1)
            0x0e,
            0x02,
            field(2, 7),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            field(1, 9),
            0x21,
            1,
            2,
            0,
            0xff,
        ];
        let mut seen = Vec::new();
        let used = check_struct(&bytes, &ANY, |id, v| seen.push((id, v))).unwrap();
        assert_eq!(used, bytes.len() - 1);
        assert_eq!(seen, vec![(Field::Top(1), -3)]);
    }

    #[test]
    fn a_list_declaring_more_elements_than_bytes_left_is_refused() {
        // The row-group bomb: field 4, a list of structs of 2³¹−1 elements, then nothing.
        let mut bytes = vec![field(4, 9), 0xfc];
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]);
        let err = check_struct(&bytes, &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("2147483647 elements"), "{err}");
        // A string past the end, and a map, likewise.
        let err = check_struct(&[field(1, 8), 0x80, 0x80, 0x04], &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("65536 bytes"), "{err}");
        let err = check_struct(&[field(1, 11), 100, 0x55, 0], &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("map of 100 entries"), "{err}");
    }

    /// Counts Parquet sizes vectors by that are not a list's: a schema element's children
    /// (a 12-byte footer declaring 2^31-1 children asked for 16 GiB before one was read),
    /// and lists of more schema elements or row groups than a block may have, each of
    /// which takes a byte of the footer at least.
    #[test]
    fn counts_parquet_reserves_by_are_bounded() {
        let footer = [
            0x29, 0x1c, 0x48, 0x00, 0x15, 0xfe, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x00,
        ];
        let err = check_struct(&footer, &FILE_META_DATA, |_, _| {}).unwrap_err();
        assert!(err.contains("a count of 2147483647"), "{err}");
        let negative = [0x29, 0x1c, 0x48, 0x00, 0x15, 0x01, 0x00, 0x00];
        let err = check_struct(&negative, &FILE_META_DATA, |_, _| {}).unwrap_err();
        assert!(err.contains("a count of -1"), "{err}");
        // One child declared, one element after it: as many as bytes allow.
        let fits = [
            0x29, 0x2c, 0x48, 0x00, 0x15, 0x02, 0x00, 0x48, 0x00, 0x00, 0x00,
        ];
        assert_eq!(
            check_struct(&fits, &FILE_META_DATA, |_, _| {}),
            Ok(fits.len())
        );
        // Lists of empty structs, a byte each: one more than a block may hold is refused.
        for (field_id, most) in [(2u8, MAX_SCHEMA_ELEMENTS), (4, MAX_ROW_GROUPS)] {
            let list = |n: u64| {
                let mut bytes = vec![field(field_id, 9), 0xfc];
                let mut v = n;
                while v >= 0x80 {
                    bytes.push((v as u8) | 0x80);
                    v >>= 7;
                }
                bytes.push(v as u8);
                bytes.extend(std::iter::repeat_n(0u8, n as usize));
                bytes.push(0);
                bytes
            };
            let err = check_struct(&list(most + 1), &FILE_META_DATA, |_, _| {}).unwrap_err();
            assert!(err.contains(&format!("more than the {most}")), "{err}");
            let at_most = list(most);
            assert_eq!(
                check_struct(&at_most, &FILE_META_DATA, |_, _| {}),
                Ok(at_most.len()),
                "field {field_id}"
            );
        }
    }

    /// Parquet reads a field by its id whatever type it was sent as: a known field sent as
    /// another type is refused, or Parquet would read other bytes than those checked.
    #[test]
    fn known_fields_sent_as_another_type_are_refused() {
        // A page header whose field 2 comes again as a 7-byte string: Parquet would read
        // the string's length as the size, then its bytes as a field 2 of 2^31-1.
        let page = [
            0x15, 0x00, 0x15, 0xc8, 0x01, 0x15, 0x80, 0x80, 0x08, 0x2c, 0x15, 0x02, 0x15, 0x00,
            0x15, 0x06, 0x15, 0x06, 0x00, 0x08, 0x04, 0x07, 0x05, 0x04, 0xfe, 0xff, 0xff, 0xff,
            0x0f, 0x00,
        ];
        assert!(check_struct(&page, &ANY, |_, _| {}).is_ok(), "well formed");
        let err = check_struct(&page, &PAGE_HEADER, |_, _| {}).unwrap_err();
        assert!(err.contains("field 2") && err.contains("type 8"), "{err}");
        // A footer whose row groups (4) come as a boolean: Parquet would read a list
        // header of 2 billion row groups from the bytes after it.
        let mut footer = vec![0x15, 0x02, 0x19, 0x0c, 0x16, 0x00, 0x11, 0xfc];
        footer.extend_from_slice(&[0xf1, 0xf1, 0xf1, 0xf1, 0x07, 0x00]);
        let err = check_struct(&footer, &FILE_META_DATA, |_, _| {}).unwrap_err();
        assert!(err.contains("field 4") && err.contains("type 1"), "{err}");
        // Nested: a row group's columns as a list of strings.
        let footer = [0x49, 0x1c, 0x19, 0x18, 0x00, 0x00];
        let err = check_struct(&footer, &FILE_META_DATA, |_, _| {}).unwrap_err();
        assert!(err.contains("a list of type 8"), "{err}");
    }

    /// A footer of `version 1` and the schema elements `children` (each named "a", saying
    /// its children when it has any).
    fn footer_of_schema(children: &[u32]) -> Vec<u8> {
        let mut out = vec![0x15, 0x02, 0x19, 0xfc];
        let mut n = children.len() as u64;
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        for &c in children {
            out.extend_from_slice(&[0x48, 0x01, b'a']);
            if c > 0 {
                assert!(c < 64);
                out.extend_from_slice(&[0x15, (c * 2) as u8]);
            }
            out.push(0x00);
        }
        out.push(0x00);
        out
    }

    #[test]
    fn schemas_deeper_than_the_limit_are_refused() {
        // A chain of 100 groups of one child each: Parquet recurses a level each.
        let mut chain = vec![1; 100];
        chain.push(0);
        let err = check_struct(&footer_of_schema(&chain), &FILE_META_DATA, |_, _| {}).unwrap_err();
        assert!(err.contains("a schema deeper than 64 levels"), "{err}");
        // At the limit, and wide: both pass.
        let mut chain = vec![1; MAX_SCHEMA_DEPTH];
        chain.push(0);
        check_struct(&footer_of_schema(&chain), &FILE_META_DATA, |_, _| {}).unwrap();
        let mut wide = vec![40];
        wide.extend(std::iter::repeat_n(0, 40));
        check_struct(&footer_of_schema(&wide), &FILE_META_DATA, |_, _| {}).unwrap();
        // Groups side by side, each a level below the root: two levels.
        let mut groups = vec![3];
        for _ in 0..3 {
            groups.extend([2, 0, 0]);
        }
        check_struct(&footer_of_schema(&groups), &FILE_META_DATA, |_, _| {}).unwrap();
    }

    #[test]
    fn deep_nesting_truncation_and_unknown_types_are_refused() {
        // 100,000 nested structs: refused at the depth limit, without recursion.
        let bytes = vec![field(1, 12); 100_000];
        let err = check_struct(&bytes, &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("deeper than 64"), "{err}");
        // Ends inside the struct.
        let err = check_struct(&[field(1, 5), 0x80], &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("ends inside"), "{err}");
        let err = check_struct(&[field(1, 5), 2], &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("ends inside"), "{err}");
        let err = check_struct(&[field(1, 14), 0], &ANY, |_, _| {}).unwrap_err();
        assert!(err.contains("unknown type 14"), "{err}");
    }

    #[test]
    fn parquets_own_footers_and_page_headers_pass() {
        use std::sync::Arc;

        use arrow::array::{Int64Array, StringArray};
        use arrow::record_batch::RecordBatch;
        use parquet::arrow::ArrowWriter;

        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from_iter_values(0..10_000)) as _),
            (
                "b",
                Arc::new(StringArray::from_iter_values(
                    (0..10_000).map(|i| format!("v{}", i % 97)),
                )) as _,
            ),
        ])
        .unwrap();
        let mut file = Vec::new();
        let mut w = ArrowWriter::try_new(&mut file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let n = file.len();
        let len = u32::from_le_bytes(file[n - 8..n - 4].try_into().unwrap()) as usize;
        let footer = &file[n - 8 - len..n - 8];
        assert_eq!(
            check_struct(footer, &FILE_META_DATA, |_, _| {}).unwrap(),
            len
        );
        // The first page header, right after the magic: its sizes are fields 2 and 3.
        let mut sizes = Vec::new();
        check_struct(&file[4..], &PAGE_HEADER, |id, v| sizes.push((id, v))).unwrap();
        let uncompressed = sizes.iter().find(|(id, _)| *id == Field::Top(2)).unwrap().1;
        assert!(uncompressed > 0, "{sizes:?}");
    }
}
