//! Stacks, locations, functions and mappings, deduplicated by content hash: in memory for
//! resolving merged stacks into frames, and in their tables for durability.

use imbl::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, FixedSizeBinaryArray, Int64Array,
    RecordBatch, StringArray, UInt8Array, UInt64Array,
};
use arrow::datatypes::{Field, Schema as ArrowSchema, UInt8Type, UInt64Type};
use frostdb_core::{ScanRequest, Table};

use crate::error::{Error, Result};

/// A 16-byte content id.
pub type Id = [u8; 16];

/// The id of `parts`: the first 16 bytes of their BLAKE3 hash (each part length-prefixed,
/// so different splits never collide).
pub(crate) fn hash_id(kind: u8, parts: &[&[u8]]) -> Id {
    let mut h = blake3::Hasher::new();
    h.update(&[kind]);
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    id
}

/// A function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Function name.
    pub name: String,
    /// System (mangled) name.
    pub system_name: String,
    /// Source file.
    pub filename: String,
    /// First line of the function.
    pub start_line: i64,
}

/// A mapping: an executable or library mapped into a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Start address.
    pub memory_start: u64,
    /// End address.
    pub memory_limit: u64,
    /// Offset in the file.
    pub file_offset: u64,
    /// Path of the file.
    pub filename: String,
    /// Build id (hex), for symbolizing later.
    pub build_id: String,
    /// has_functions, has_filenames, has_line_numbers, has_inline_frames (bits 0..3).
    pub flags: u8,
}

/// A location: an address, and the frames (innermost first) it stands for once symbolized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The mapping the address belongs to.
    pub mapping: Option<Id>,
    /// The address (kept for symbolizing later when there are no lines).
    pub address: u64,
    /// `(function, line)`, innermost (inlined) first.
    pub lines: Vec<(Id, i64)>,
    /// Whether the frames were folded.
    pub is_folded: bool,
}

/// All symbols, by id. The maps are persistent (structurally shared): a clone is O(1), and
/// extending a clone copies only the paths it changes.
#[derive(Debug, Default, Clone)]
pub struct Symbols {
    /// Stacks: location ids, leaf first.
    pub stacks: HashMap<Id, Arc<[Id]>>,
    /// Locations.
    pub locations: HashMap<Id, Location>,
    /// Functions.
    pub functions: HashMap<Id, Function>,
    /// Mappings.
    pub mappings: HashMap<Id, Mapping>,
}

/// Symbols not yet stored, collected while a profile is normalized.
#[derive(Debug, Default)]
pub(crate) struct NewSymbols {
    pub(crate) stacks: Vec<(Id, Arc<[Id]>)>,
    pub(crate) locations: Vec<(Id, Location)>,
    pub(crate) functions: Vec<(Id, Function)>,
    pub(crate) mappings: Vec<(Id, Mapping)>,
}

impl NewSymbols {
    pub(crate) fn is_empty(&self) -> bool {
        self.stacks.is_empty()
            && self.locations.is_empty()
            && self.functions.is_empty()
            && self.mappings.is_empty()
    }
}

fn ids(values: impl Iterator<Item = Id>) -> ArrayRef {
    let values: Vec<Id> = values.collect();
    Arc::new(
        FixedSizeBinaryArray::try_from_iter(values.iter())
            .unwrap_or_else(|_| FixedSizeBinaryArray::new_null(16, 0)),
    )
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

impl NewSymbols {
    /// Rows for the stacktraces table.
    pub(crate) fn stacks_batch(&self) -> Result<RecordBatch> {
        let packed: BinaryArray = self
            .stacks
            .iter()
            .map(|(_, locs)| Some(locs.iter().flatten().copied().collect::<Vec<u8>>()))
            .collect();
        batch(vec![
            (
                "stacktrace_id",
                ids(self.stacks.iter().map(|(id, _)| *id)),
                false,
            ),
            ("location_ids", Arc::new(packed), false),
        ])
    }

    pub(crate) fn locations_batch(&self) -> Result<RecordBatch> {
        let mapping = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
            self.locations.iter().map(|(_, l)| l.mapping),
            16,
        )?;
        let lines: BinaryArray = self
            .locations
            .iter()
            .map(|(_, l)| {
                let mut out = Vec::with_capacity(l.lines.len() * 24);
                for (f, line) in &l.lines {
                    out.extend_from_slice(f);
                    out.extend_from_slice(&line.to_le_bytes());
                }
                Some(out)
            })
            .collect();
        batch(vec![
            (
                "location_id",
                ids(self.locations.iter().map(|(id, _)| *id)),
                false,
            ),
            ("mapping_id", Arc::new(mapping), true),
            (
                "address",
                Arc::new(UInt64Array::from_iter_values(
                    self.locations.iter().map(|(_, l)| l.address),
                )),
                false,
            ),
            ("lines", Arc::new(lines), false),
            (
                "is_folded",
                Arc::new(BooleanArray::from_iter(
                    self.locations.iter().map(|(_, l)| Some(l.is_folded)),
                )),
                false,
            ),
        ])
    }

    pub(crate) fn functions_batch(&self) -> Result<RecordBatch> {
        let f = &self.functions;
        let text = |g: fn(&Function) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(f.iter().map(|(_, x)| g(x))))
        };
        batch(vec![
            ("function_id", ids(f.iter().map(|(id, _)| *id)), false),
            ("name", text(|x| &x.name), false),
            ("system_name", text(|x| &x.system_name), false),
            ("filename", text(|x| &x.filename), false),
            (
                "start_line",
                Arc::new(Int64Array::from_iter_values(
                    f.iter().map(|(_, x)| x.start_line),
                )),
                false,
            ),
        ])
    }

    pub(crate) fn mappings_batch(&self) -> Result<RecordBatch> {
        let m = &self.mappings;
        let num = |g: fn(&Mapping) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(m.iter().map(|(_, x)| g(x))))
        };
        batch(vec![
            ("mapping_id", ids(m.iter().map(|(id, _)| *id)), false),
            ("memory_start", num(|x| x.memory_start), false),
            ("memory_limit", num(|x| x.memory_limit), false),
            ("file_offset", num(|x| x.file_offset), false),
            (
                "filename",
                Arc::new(StringArray::from_iter_values(
                    m.iter().map(|(_, x)| x.filename.as_str()),
                )),
                false,
            ),
            (
                "build_id",
                Arc::new(StringArray::from_iter_values(
                    m.iter().map(|(_, x)| x.build_id.as_str()),
                )),
                false,
            ),
            (
                "flags",
                Arc::new(UInt8Array::from_iter_values(m.iter().map(|(_, x)| x.flags))),
                false,
            ),
        ])
    }
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    b.column_by_name(name)
        .ok_or_else(|| Error::Corrupt(format!("symbol table lacks column {name}")))
}

fn id_at(a: &ArrayRef, i: usize) -> Result<Id> {
    let fsb = a
        .as_fixed_size_binary_opt()
        .ok_or_else(|| Error::Corrupt("an id column is not 16-byte binary".into()))?;
    fsb.value(i)
        .try_into()
        .map_err(|_| Error::Corrupt("an id is not 16 bytes".into()))
}

fn string_at(a: &ArrayRef, i: usize) -> String {
    match frostdb_core::Scalar::from_array(a.as_ref(), i) {
        frostdb_core::Scalar::Utf8(s) => s,
        _ => String::new(),
    }
}

fn chunks16(bytes: &[u8]) -> Result<Vec<Id>> {
    if !bytes.len().is_multiple_of(16) {
        return Err(Error::Corrupt(
            "a packed id list is not a multiple of 16 bytes".into(),
        ));
    }
    Ok(bytes
        .chunks_exact(16)
        .map(|c| c.try_into().expect("16 bytes"))
        .collect())
}

impl Symbols {
    /// Reads every symbol table.
    pub(crate) fn load(
        stacks: &Table,
        locations: &Table,
        functions: &Table,
        mappings: &Table,
    ) -> Result<Self> {
        let mut s = Symbols::default();
        for b in stacks.scan(&ScanRequest::new())? {
            let (id, locs) = (column(&b, "stacktrace_id")?, column(&b, "location_ids")?);
            let locs = locs.as_binary::<i32>();
            for i in 0..b.num_rows() {
                s.stacks
                    .insert(id_at(id, i)?, chunks16(locs.value(i))?.into());
            }
        }
        for b in locations.scan(&ScanRequest::new())? {
            let id = column(&b, "location_id")?;
            let mapping = column(&b, "mapping_id")?;
            let address = column(&b, "address")?.as_primitive::<UInt64Type>();
            let lines = column(&b, "lines")?.as_binary::<i32>();
            let folded = column(&b, "is_folded")?.as_boolean();
            for i in 0..b.num_rows() {
                let raw = lines.value(i);
                if !raw.len().is_multiple_of(24) {
                    return Err(Error::Corrupt(
                        "packed lines are not 24-byte entries".into(),
                    ));
                }
                let lines = raw
                    .chunks_exact(24)
                    .map(|c| {
                        let f: Id = c[..16].try_into().expect("16 bytes");
                        let line = i64::from_le_bytes(c[16..].try_into().expect("8 bytes"));
                        (f, line)
                    })
                    .collect();
                let mapping = if mapping.is_null(i) {
                    None
                } else {
                    Some(id_at(mapping, i)?)
                };
                s.locations.insert(
                    id_at(id, i)?,
                    Location {
                        mapping,
                        address: address.value(i),
                        lines,
                        is_folded: folded.value(i),
                    },
                );
            }
        }
        for b in functions.scan(&ScanRequest::new())? {
            let id = column(&b, "function_id")?;
            let (name, system, file) = (
                column(&b, "name")?,
                column(&b, "system_name")?,
                column(&b, "filename")?,
            );
            let start = column(&b, "start_line")?.as_primitive::<arrow::datatypes::Int64Type>();
            for i in 0..b.num_rows() {
                s.functions.insert(
                    id_at(id, i)?,
                    Function {
                        name: string_at(name, i),
                        system_name: string_at(system, i),
                        filename: string_at(file, i),
                        start_line: start.value(i),
                    },
                );
            }
        }
        for b in mappings.scan(&ScanRequest::new())? {
            let id = column(&b, "mapping_id")?;
            let num = |n: &str| -> Result<&arrow::array::UInt64Array> {
                Ok(column(&b, n)?.as_primitive::<UInt64Type>())
            };
            let (start, limit, offset) = (
                num("memory_start")?,
                num("memory_limit")?,
                num("file_offset")?,
            );
            let (file, build) = (column(&b, "filename")?, column(&b, "build_id")?);
            let flags = column(&b, "flags")?.as_primitive::<UInt8Type>();
            for i in 0..b.num_rows() {
                s.mappings.insert(
                    id_at(id, i)?,
                    Mapping {
                        memory_start: start.value(i),
                        memory_limit: limit.value(i),
                        file_offset: offset.value(i),
                        filename: string_at(file, i),
                        build_id: string_at(build, i),
                        flags: flags.value(i),
                    },
                );
            }
        }
        Ok(s)
    }

    /// Adds what `new` holds.
    pub(crate) fn extend(&mut self, new: &NewSymbols) {
        self.stacks.extend(new.stacks.iter().cloned());
        self.locations.extend(new.locations.iter().cloned());
        self.functions.extend(new.functions.iter().cloned());
        self.mappings.extend(new.mappings.iter().cloned());
    }

    /// The frames of a stack, leaf first, inlined frames expanded (innermost first): the
    /// function (if symbolized) and line of each, with the location it came from.
    pub fn frames(&self, stack: &Id) -> Vec<Frame<'_>> {
        let Some(locations) = self.stacks.get(stack) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for lid in locations.iter() {
            let Some(loc) = self.locations.get(lid) else {
                continue;
            };
            let mapping = loc.mapping.as_ref().and_then(|m| self.mappings.get(m));
            if loc.lines.is_empty() {
                out.push(Frame {
                    location: loc,
                    mapping,
                    function: None,
                    line: 0,
                    inlined: false,
                });
            }
            let last = loc.lines.len().saturating_sub(1);
            for (i, (fid, line)) in loc.lines.iter().enumerate() {
                out.push(Frame {
                    location: loc,
                    mapping,
                    function: self.functions.get(fid),
                    line: *line,
                    inlined: i != last,
                });
            }
        }
        out
    }
}

/// One frame of a resolved stack.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// The location.
    pub location: &'a Location,
    /// Its mapping, if any.
    pub mapping: Option<&'a Mapping>,
    /// The function, when symbolized.
    pub function: Option<&'a Function>,
    /// The line.
    pub line: i64,
    /// Whether this frame was inlined into the next (outer) frame of the same location.
    pub inlined: bool,
}

impl Frame<'_> {
    /// The name pprof gives this frame's node at function granularity: the function name;
    /// else `[binary]` after the mapped file; else `<unknown>`.
    pub fn printable_name(&self) -> String {
        if let Some(f) = self.function
            && !f.name.is_empty()
        {
            return f.name.clone();
        }
        match self.mapping {
            Some(m) if !m.filename.is_empty() => {
                let base = m.filename.rsplit('/').next().unwrap_or(&m.filename);
                format!("[{base}]")
            }
            _ => "<unknown>".to_owned(),
        }
    }

    /// The name a flame graph shows: the function name, or the address in its binary
    /// (`0x4a5b3c [app]`) when unsymbolized, so it can be symbolized later.
    pub fn display_name(&self) -> String {
        if let Some(f) = self.function
            && !f.name.is_empty()
        {
            return f.name.clone();
        }
        match self.mapping {
            Some(m) if !m.filename.is_empty() => {
                let base = m.filename.rsplit('/').next().unwrap_or(&m.filename);
                format!("{:#x} [{base}]", self.location.address)
            }
            _ => format!("{:#x}", self.location.address),
        }
    }

    /// The source file, when known.
    pub fn filename(&self) -> &str {
        self.function.map_or("", |f| f.filename.as_str())
    }
}
