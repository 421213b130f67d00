//! Symbols in their tables: new rows of the current partition as Arrow batches (written in
//! the same transaction as the samples that use them), and a stored partition read back.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Int64Array, RecordBatch, StringArray,
    UInt8Array, UInt64Array,
};
use arrow::datatypes::{Field, Int64Type, Schema as ArrowSchema, UInt8Type, UInt64Type};
use frostdb_core::{Scalar, ScanRequest, Table, col};

use super::partition::{Counts, FunctionRow, LocationRow, MappingRow, NamedLine, Partition};
use super::{expect_index, split_id, symbol_id};
use crate::error::{Error, Result};
use crate::schema::column::STACKTRACE_ID;

/// The four symbol tables, and the names a symbolizer found since.
#[derive(Debug, Clone)]
pub(crate) struct SymbolTables {
    pub(crate) stacktraces: Table,
    pub(crate) locations: Table,
    pub(crate) functions: Table,
    pub(crate) mappings: Table,
    /// `None` in a reader whose writer never named a location.
    pub(crate) names: Option<Table>,
}

/// Most bytes a symbol column of one group holds: far under what an Arrow string column
/// can (2 GiB, past which arrow panics), and above what any profile the decoders take
/// makes.
const MAX_COLUMN_BYTES: usize = 1 << 30;

/// `values` as a string column, or an error past [`MAX_COLUMN_BYTES`] (an interned string
/// is copied once per row naming it).
fn strings<'a>(values: impl Iterator<Item = &'a str> + Clone) -> Result<ArrayRef> {
    let bytes = values
        .clone()
        .fold(0usize, |n, v| n.saturating_add(v.len()));
    if bytes > MAX_COLUMN_BYTES {
        return Err(Error::TooLarge {
            what: "symbol strings of one group, as stored",
            limit: MAX_COLUMN_BYTES,
        });
    }
    Ok(Arc::new(StringArray::from_iter_values(values)))
}

fn batch(columns: Vec<(&str, ArrayRef, bool)>) -> Result<RecordBatch> {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a, nullable)| Field::new(*n, a.data_type().clone(), *nullable))
        .collect();
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns.into_iter().map(|(_, a, _)| a).collect(),
    )?)
}

fn ids(partition: u32, range: std::ops::Range<usize>) -> ArrayRef {
    Arc::new(UInt64Array::from_iter_values(
        range.map(|i| symbol_id(partition, i as u32)),
    ))
}

/// Packs a location's lines: per line the function index (u32 LE) and the line (i64 LE).
pub(crate) fn pack_lines(lines: &[(u32, i64)], out: &mut Vec<u8>) {
    for (f, line) in lines {
        out.extend_from_slice(&f.to_le_bytes());
        out.extend_from_slice(&line.to_le_bytes());
    }
}

/// Packs a named location's lines: per line the function's length (u32 LE) and bytes, the
/// file's, and the line (i64 LE).
fn pack_named(lines: &[NamedLine], out: &mut Vec<u8>) {
    for l in lines {
        for text in [&*l.function, &*l.file] {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(&l.line.to_le_bytes());
    }
}

/// The lines [`pack_named`] packed; `None` when `raw` is not such a list.
fn unpack_named(mut raw: &[u8]) -> Option<Vec<NamedLine>> {
    fn take<'r>(raw: &mut &'r [u8], n: usize) -> Option<&'r [u8]> {
        let (head, rest) = raw.split_at_checked(n)?;
        *raw = rest;
        Some(head)
    }
    fn text(raw: &mut &[u8]) -> Option<String> {
        let len = u32::from_le_bytes(take(raw, 4)?.try_into().ok()?) as usize;
        String::from_utf8(take(raw, len)?.to_vec()).ok()
    }
    let mut lines = Vec::new();
    while !raw.is_empty() {
        let function = text(&mut raw)?;
        let file = text(&mut raw)?;
        let line = i64::from_le_bytes(take(&mut raw, 8)?.try_into().ok()?);
        lines.push(NamedLine::new(function, file, line));
    }
    (!lines.is_empty()).then_some(lines)
}

impl SymbolTables {
    /// The names partition `p` holds for `locations`, as rows of the names table (`None`
    /// when it holds none of them).
    pub(crate) fn names_batch(
        &self,
        p: &Partition,
        locations: &[u32],
    ) -> Result<Option<RecordBatch>> {
        let mut ids = Vec::with_capacity(locations.len());
        let mut lines = arrow::array::BinaryBuilder::new();
        let mut packed = Vec::new();
        for &l in locations {
            let Some(named) = p.named(l) else {
                continue;
            };
            packed.clear();
            pack_named(named, &mut packed);
            ids.push(symbol_id(p.id(), l));
            lines.append_value(&packed);
        }
        if ids.is_empty() {
            return Ok(None);
        }
        Ok(Some(batch(vec![
            ("location_id", Arc::new(UInt64Array::from(ids)), false),
            ("lines", Arc::new(lines.finish()), false),
        ])?))
    }

    /// Names the locations of `p` with what the names table holds for them (a row that
    /// cannot be read is skipped, with a warning: the location stays an address, to be
    /// resolved again).
    fn load_names(&self, p: &Partition) -> Result<()> {
        let Some(names) = &self.names else {
            return Ok(());
        };
        let id = p.id();
        let request = ScanRequest::new().filter(
            col("location_id")
                .gt_eq(symbol_id(id, 0))
                .and(col("location_id").lt(symbol_id(id.saturating_add(1), 0))),
        );
        for b in names.scan(&request)? {
            let (Some(ids), Some(lines)) =
                (b.column_by_name("location_id"), b.column_by_name("lines"))
            else {
                return Err(Error::Corrupt(
                    "the symbol names table lacks a column".into(),
                ));
            };
            let (ids, lines) = (ids.as_primitive::<UInt64Type>(), lines.as_binary::<i32>());
            for i in 0..b.num_rows() {
                let (partition, l) = split_id(ids.value(i));
                match unpack_named(lines.value(i)) {
                    Some(named) if partition == id => {
                        p.name_location(l, named);
                    }
                    _ => tracing::warn!(
                        partition = id,
                        location = l,
                        "a stored symbol name cannot be read; the location stays an address"
                    ),
                }
            }
        }
        Ok(())
    }

    /// The rows `partition` gained between `from` and `to`, per table (mappings, functions,
    /// locations, stacks: the order a reader needs them in).
    pub(crate) fn batches<'t>(
        &'t self,
        p: &Partition,
        from: Counts,
        to: Counts,
    ) -> Result<Vec<(&'t Table, RecordBatch)>> {
        let id = p.id();
        let mut out = Vec::new();
        if to.mappings > from.mappings {
            let rows: Vec<&MappingRow> = (from.mappings..to.mappings)
                .filter_map(|i| p.mapping(i as u32))
                .collect();
            let num = |g: fn(&MappingRow) -> u64| -> ArrayRef {
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|m| g(m))))
            };
            let text = |g: fn(&MappingRow) -> u32| -> Result<ArrayRef> {
                strings(rows.iter().map(|m| p.string(g(m))))
            };
            out.push((
                &self.mappings,
                batch(vec![
                    ("mapping_id", ids(id, from.mappings..to.mappings), false),
                    ("memory_start", num(|m| m.memory_start), false),
                    ("memory_limit", num(|m| m.memory_limit), false),
                    ("file_offset", num(|m| m.file_offset), false),
                    ("filename", text(|m| m.filename)?, false),
                    ("build_id", text(|m| m.build_id)?, false),
                    (
                        "flags",
                        Arc::new(UInt8Array::from_iter_values(rows.iter().map(|m| m.flags))),
                        false,
                    ),
                ])?,
            ));
        }
        if to.functions > from.functions {
            let rows: Vec<&FunctionRow> = (from.functions..to.functions)
                .filter_map(|i| p.function(i as u32))
                .collect();
            let text = |g: fn(&FunctionRow) -> u32| -> Result<ArrayRef> {
                strings(rows.iter().map(|f| p.string(g(f))))
            };
            out.push((
                &self.functions,
                batch(vec![
                    ("function_id", ids(id, from.functions..to.functions), false),
                    ("name", text(|f| f.name)?, false),
                    ("system_name", text(|f| f.system_name)?, false),
                    ("filename", text(|f| f.filename)?, false),
                    (
                        "start_line",
                        Arc::new(Int64Array::from_iter_values(
                            rows.iter().map(|f| f.start_line),
                        )),
                        false,
                    ),
                ])?,
            ));
        }
        if to.locations > from.locations {
            let rows: Vec<&LocationRow> = (from.locations..to.locations)
                .filter_map(|i| p.location(i as u32))
                .collect();
            let mut packed = Vec::new();
            let lines: BinaryArray = rows
                .iter()
                .map(|l| {
                    packed.clear();
                    pack_lines(&l.lines, &mut packed);
                    Some(packed.clone())
                })
                .collect();
            let mappings: UInt64Array = rows
                .iter()
                .map(|l| l.mapping.checked_sub(1).map(|m| symbol_id(id, m)))
                .collect();
            out.push((
                &self.locations,
                batch(vec![
                    ("location_id", ids(id, from.locations..to.locations), false),
                    ("mapping_id", Arc::new(mappings), true),
                    (
                        "address",
                        Arc::new(UInt64Array::from_iter_values(
                            rows.iter().map(|l| l.address),
                        )),
                        false,
                    ),
                    ("lines", Arc::new(lines), false),
                    (
                        "is_folded",
                        Arc::new(BooleanArray::from_iter(
                            rows.iter().map(|l| Some(l.is_folded)),
                        )),
                        false,
                    ),
                ])?,
            ));
        }
        if to.stacks > from.stacks {
            let packed: BinaryArray = (from.stacks..to.stacks)
                .map(|i| {
                    p.stack(i as u32)
                        .map(|s| s.iter().flat_map(|l| l.to_le_bytes()).collect::<Vec<u8>>())
                })
                .collect();
            out.push((
                &self.stacktraces,
                batch(vec![
                    (STACKTRACE_ID, ids(id, from.stacks..to.stacks), false),
                    ("location_ids", Arc::new(packed), false),
                ])?,
            ));
        }
        Ok(out)
    }

    /// The newest partition any symbol table holds (0 when none).
    pub(crate) fn newest_partition(&self) -> u32 {
        [
            (&self.stacktraces, STACKTRACE_ID),
            (&self.locations, "location_id"),
            (&self.functions, "function_id"),
            (&self.mappings, "mapping_id"),
        ]
        .iter()
        .filter_map(|(t, c)| match t.snapshot().column_stats(c)?.max {
            Some(Scalar::UInt(max)) => Some(split_id(max).0),
            _ => None,
        })
        .max()
        .unwrap_or(0)
    }

    /// Reads partition `id` from the tables.
    pub(crate) fn load(&self, id: u32) -> Result<Partition> {
        let p = Partition::closed(id);
        let rows = |table: &Table, column: &str| -> Result<Vec<RecordBatch>> {
            let request = ScanRequest::new()
                .filter(
                    col(column)
                        .gt_eq(symbol_id(id, 0))
                        .and(col(column).lt(symbol_id(id.saturating_add(1), 0))),
                )
                .sorted(true);
            Ok(table.scan(&request)?)
        };
        let column = |b: &RecordBatch, name: &str| -> Result<ArrayRef> {
            b.column_by_name(name)
                .cloned()
                .ok_or_else(|| Error::Corrupt(format!("a symbol table lacks column {name}")))
        };
        let text = |a: &ArrayRef, i: usize| -> String {
            match Scalar::from_array(a.as_ref(), i) {
                Scalar::Utf8(s) => s,
                _ => String::new(),
            }
        };
        // Strings are interned again while loading: equal names share one copy.
        let mut strings: std::collections::HashMap<String, u32> = Default::default();
        let mut intern = |s: String| -> u32 {
            if let Some(&i) = strings.get(&s) {
                return i;
            }
            let i = p.push_string(&s);
            strings.insert(s, i);
            i
        };

        let mut next = 0;
        for b in rows(&self.mappings, "mapping_id")? {
            let mid = column(&b, "mapping_id")?;
            let mid = mid.as_primitive::<UInt64Type>();
            let num = |n: &str| -> Result<ArrayRef> { column(&b, n) };
            let (start, limit, offset) = (
                num("memory_start")?,
                num("memory_limit")?,
                num("file_offset")?,
            );
            let (file, build, flags) = (num("filename")?, num("build_id")?, num("flags")?);
            for i in 0..b.num_rows() {
                expect_index("mappings", mid.value(i), id, next)?;
                next += 1;
                p.push_mapping(MappingRow {
                    memory_start: start.as_primitive::<UInt64Type>().value(i),
                    memory_limit: limit.as_primitive::<UInt64Type>().value(i),
                    file_offset: offset.as_primitive::<UInt64Type>().value(i),
                    filename: intern(text(&file, i)),
                    build_id: intern(text(&build, i)),
                    flags: flags.as_primitive::<UInt8Type>().value(i),
                });
            }
        }
        let mut next = 0;
        for b in rows(&self.functions, "function_id")? {
            let fid = column(&b, "function_id")?;
            let fid = fid.as_primitive::<UInt64Type>();
            let (name, system, file) = (
                column(&b, "name")?,
                column(&b, "system_name")?,
                column(&b, "filename")?,
            );
            let start = column(&b, "start_line")?;
            let start = start.as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                expect_index("functions", fid.value(i), id, next)?;
                next += 1;
                p.push_function(FunctionRow {
                    name: intern(text(&name, i)),
                    system_name: intern(text(&system, i)),
                    filename: intern(text(&file, i)),
                    start_line: start.value(i),
                });
            }
        }
        let functions = next;
        let mut next = 0;
        let mappings = p.counts().mappings;
        for b in rows(&self.locations, "location_id")? {
            let lid = column(&b, "location_id")?;
            let lid = lid.as_primitive::<UInt64Type>();
            let mapping = column(&b, "mapping_id")?;
            let mapping = mapping.as_primitive::<UInt64Type>();
            let address = column(&b, "address")?;
            let address = address.as_primitive::<UInt64Type>();
            let lines = column(&b, "lines")?;
            let lines = lines.as_binary::<i32>();
            let folded = column(&b, "is_folded")?;
            let folded = folded.as_boolean();
            for i in 0..b.num_rows() {
                expect_index("locations", lid.value(i), id, next)?;
                next += 1;
                let raw = lines.value(i);
                if !raw.len().is_multiple_of(12) {
                    return Err(Error::Corrupt(format!(
                        "location {}:{i} has packed lines of {} bytes, not a multiple of 12",
                        id,
                        raw.len()
                    )));
                }
                let mut parsed = Vec::with_capacity(raw.len() / 12);
                for c in raw.chunks_exact(12) {
                    let f = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if f as usize >= functions {
                        return Err(Error::Corrupt(format!(
                            "a location of partition {id} refers to function {f}, which it lacks"
                        )));
                    }
                    let mut line = [0u8; 8];
                    line.copy_from_slice(&c[4..]);
                    parsed.push((f, i64::from_le_bytes(line)));
                }
                let m = if mapping.is_null(i) {
                    0
                } else {
                    let (mp, mi) = split_id(mapping.value(i));
                    if mp != id || mi as usize >= mappings {
                        return Err(Error::Corrupt(format!(
                            "a location of partition {id} refers to mapping {mp}:{mi}, which it lacks"
                        )));
                    }
                    mi + 1
                };
                p.push_location(LocationRow {
                    mapping: m,
                    address: address.value(i),
                    is_folded: folded.value(i),
                    lines: parsed.into(),
                });
            }
        }
        let locations = next;
        let mut next = 0;
        for b in rows(&self.stacktraces, STACKTRACE_ID)? {
            let sid = column(&b, STACKTRACE_ID)?;
            let sid = sid.as_primitive::<UInt64Type>();
            let packed = column(&b, "location_ids")?;
            let packed = packed.as_binary::<i32>();
            for i in 0..b.num_rows() {
                expect_index("stacktraces", sid.value(i), id, next)?;
                next += 1;
                let raw = packed.value(i);
                if !raw.len().is_multiple_of(4) {
                    return Err(Error::Corrupt(format!(
                        "stack {id}:{i} has packed locations of {} bytes, not a multiple of 4",
                        raw.len()
                    )));
                }
                let stack: Box<[u32]> = raw
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                if let Some(bad) = stack.iter().find(|l| **l as usize >= locations) {
                    return Err(Error::Corrupt(format!(
                        "a stack of partition {id} refers to location {bad}, which it lacks"
                    )));
                }
                p.push_stack(stack);
            }
        }
        self.load_names(&p)?;
        Ok(p)
    }
}
