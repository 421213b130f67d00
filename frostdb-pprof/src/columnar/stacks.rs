//! Step 2: each row's stack resolved, the call's distinct stacks found and interned once
//! each.

use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, ListArray, RecordBatch};
use arrow::buffer::BooleanBuffer;

use super::{FRAMES, frame_lists, ids, invalid};
use crate::decode::Limits;
use crate::error::{Error, Result};
use crate::normalize::{content_key, function_key, location_line, location_start, put_str};
use crate::schema::column::STACKTRACE_ID;
use crate::symbols::{FunctionRow, StackKey, Writer};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

const NONE: u32 = u32::MAX;

/// The stacks of a call's rows: per row, which of the call's distinct stacks it has, and
/// those stacks' frames.
pub(crate) struct Stacks {
    /// Per row, its stack: an index into `distinct`.
    pub(crate) of_row: Vec<u32>,
    /// The distinct stacks, as rows of `frames`.
    distinct: Vec<u32>,
    /// Where the frames are: the samples' own, or a stacks batch's.
    frames: Frames,
}

/// The frame lists of a call's stacks.
enum Frames {
    /// The samples' own (`samples.frames`).
    Inline(ListArray),
    /// A stacks batch's, whose rows keep their keys from call to call.
    Table(Arc<StackTable>),
}

impl Frames {
    fn lists(&self) -> &ListArray {
        match self {
            Frames::Inline(lists) => lists,
            Frames::Table(table) => &table.frames,
        }
    }
}

/// A stacks batch checked and indexed once, its stacks' content keys computed the first
/// time a call uses them and kept: what [`crate::ArrowStacks`] holds.
pub(crate) struct StackTable {
    frames: ListArray,
    /// Row of each stack id.
    row_of: HashMap<u64, u32>,
    /// Per row, its stack's content key, once a call has needed it.
    keys: Vec<OnceLock<StackKey>>,
    /// The limits it was checked under.
    pub(crate) limits: Limits,
}

impl StackTable {
    /// Checks `stacks` (a `stacktrace_id` and a `frames` column, ids distinct) under
    /// `limits`, and indexes it.
    pub(crate) fn new(stacks: &RecordBatch, limits: &Limits) -> Result<Self> {
        // Indexed whole before any is looked up: as many as a call may have samples.
        if stacks.num_rows() > limits.max_samples {
            return Err(Error::TooLarge {
                what: "the stacks of an Arrow stacks batch",
                limit: limits.max_samples,
            });
        }
        let mut stack_ids = None;
        let mut frames = None;
        for (field, column) in stacks.schema().fields().iter().zip(stacks.columns()) {
            let at = format!("stacks.{}", field.name());
            let slot = match field.name().as_str() {
                STACKTRACE_ID => &mut stack_ids,
                FRAMES => &mut frames,
                _ => {
                    return Err(invalid(
                        at,
                        format!(
                            "is not a column of stacks (they are {STACKTRACE_ID} and {FRAMES})"
                        ),
                    ));
                }
            };
            if slot.replace(column.clone()).is_some() {
                return Err(invalid(at, "the column is given twice"));
            }
        }
        let missing = |name: &str| invalid(format!("stacks.{name}"), "the column is missing");
        let stack_ids = ids(
            &stack_ids.ok_or_else(|| missing(STACKTRACE_ID))?,
            &format!("stacks.{STACKTRACE_ID}"),
        )?;
        let frames = frame_lists(
            &frames.ok_or_else(|| missing(FRAMES))?,
            &format!("stacks.{FRAMES}"),
            limits,
        )?;
        let mut row_of: HashMap<u64, u32> = HashMap::default();
        row_of.reserve(stack_ids.len());
        for (row, &id) in stack_ids.values().iter().enumerate() {
            if let Some(first) = row_of.insert(id, row as u32) {
                return Err(invalid(
                    format!("stacks.{STACKTRACE_ID}"),
                    format!("stack {id} is given twice (rows {first} and {row})"),
                ));
            }
        }
        let keys = (0..stack_ids.len()).map(|_| OnceLock::new()).collect();
        Ok(Self {
            frames,
            row_of,
            keys,
            limits: *limits,
        })
    }
}

/// The call's distinct stacks as the current symbol partition holds them.
pub(crate) struct InternedStacks {
    /// The partition.
    pub(crate) partition: u32,
    /// Per distinct stack, its index in the partition.
    pub(crate) index: Vec<u32>,
}

impl Stacks {
    /// Stacks given by id (`samples.stacktrace_id`) into a stacks batch.
    pub(crate) fn by_id(ids_column: &ArrayRef, table: &Arc<StackTable>) -> Result<Self> {
        let row_of = &table.row_of;
        let sample_ids = ids(ids_column, &format!("samples.{STACKTRACE_ID}"))?;
        // Each stacks row's distinct stack, numbered as rows first use them.
        let mut distinct_of: Vec<u32> = vec![NONE; table.keys.len()];
        let mut distinct: Vec<u32> = Vec::new();
        let mut of_row = Vec::with_capacity(sample_ids.len());
        // Rows of one profile share few stacks in runs: the previous row's is tried first.
        let mut previous: Option<(u64, u32)> = None;
        for (row, &id) in sample_ids.values().iter().enumerate() {
            let d = match previous {
                Some((p, d)) if p == id => d,
                _ => {
                    let Some(&s) = row_of.get(&id) else {
                        return Err(invalid(
                            format!("samples.{STACKTRACE_ID}"),
                            format!("row {row}: stack {id} is not in the stacks batch"),
                        ));
                    };
                    let d = &mut distinct_of[s as usize];
                    if *d == NONE {
                        *d = distinct.len() as u32;
                        distinct.push(s);
                    }
                    *d
                }
            };
            previous = Some((id, d));
            of_row.push(d);
        }
        Ok(Self {
            of_row,
            distinct,
            frames: Frames::Table(table.clone()),
        })
    }

    /// Stacks given inline (`samples.frames`): rows with the same frames share a stack.
    pub(crate) fn inline(column: &ArrayRef, limits: &Limits) -> Result<Self> {
        let frames = frame_lists(column, &format!("samples.{FRAMES}"), limits)?;
        let names = frames.values().as_string::<i32>();
        let offsets = frames.value_offsets();
        let mut by_content: HashMap<u128, u32> = HashMap::default();
        let mut distinct: Vec<u32> = Vec::new();
        let mut of_row = Vec::with_capacity(frames.len());
        let mut buf: Vec<u8> = Vec::new();
        for row in 0..frames.len() {
            buf.clear();
            for i in offsets[row] as usize..offsets[row + 1] as usize {
                put_str(&mut buf, names.value(i));
            }
            let key = content_key(&buf);
            let d = *by_content.entry(key).or_insert_with(|| {
                distinct.push(row as u32);
                (distinct.len() - 1) as u32
            });
            of_row.push(d);
        }
        Ok(Self {
            of_row,
            distinct,
            frames: Frames::Inline(frames),
        })
    }

    /// Distinct stacks.
    pub(crate) fn len(&self) -> usize {
        self.distinct.len()
    }

    /// The stacks of the rows `keep` keeps; stacks no kept row has are dropped.
    pub(crate) fn filter(self, keep: &BooleanBuffer) -> Self {
        let mut renumbered = vec![NONE; self.distinct.len()];
        let mut distinct = Vec::new();
        let mut of_row = Vec::with_capacity(keep.count_set_bits());
        for (&d, kept) in self.of_row.iter().zip(keep.iter()) {
            if !kept {
                continue;
            }
            let n = &mut renumbered[d as usize];
            if *n == NONE {
                *n = distinct.len() as u32;
                distinct.push(self.distinct[d as usize]);
            }
            of_row.push(*n);
        }
        Self {
            of_row,
            distinct,
            frames: self.frames,
        }
    }

    /// The frames of distinct stack `d`, leaf first.
    fn frames_of(&self, d: usize) -> impl Iterator<Item = &str> {
        let names = self.frames.lists().values().as_string::<i32>();
        let offsets = self.frames.lists().value_offsets();
        let row = self.distinct[d] as usize;
        (offsets[row] as usize..offsets[row + 1] as usize).map(move |i| names.value(i))
    }

    /// The content keys of the distinct stacks, as a pprof profile holding the same
    /// function names has them (see `normalize::keys`): a frame is a function (name and
    /// system name, no file, line 0) at a location of no mapping and address. A stacks
    /// batch keeps its stacks' keys for the next call ([`StackTable`]).
    pub(crate) fn keys(&self) -> StackKeys {
        let mut locations: HashMap<&str, StackKey> = HashMap::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut stack: Vec<u8> = Vec::new();
        let mut key_of = |d: usize| {
            stack.clear();
            for name in self.frames_of(d) {
                let key = *locations
                    .entry(name)
                    .or_insert_with(|| location_key(&mut buf, name));
                stack.extend_from_slice(&key.to_le_bytes());
            }
            content_key(&stack)
        };
        let stacks = match &self.frames {
            Frames::Table(table) => (0..self.distinct.len())
                .map(|d| *table.keys[self.distinct[d] as usize].get_or_init(|| key_of(d)))
                .collect(),
            Frames::Inline(_) => (0..self.distinct.len()).map(key_of).collect(),
        };
        StackKeys { stacks }
    }

    /// Interns every distinct stack into the writer's partition, filling `found` (an index
    /// per distinct stack, `u32::MAX` where not yet known): `false` when the writer only
    /// looks up and some are missing (call again with an exclusive writer: only those are
    /// looked up again).
    pub(crate) fn intern(
        &self,
        keys: &StackKeys,
        writer: &mut Writer<'_>,
        found: &mut Vec<u32>,
    ) -> Result<bool> {
        if found.len() != self.distinct.len() {
            *found = vec![NONE; self.distinct.len()];
        }
        let mut locations: HashMap<&str, u32> = HashMap::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut stack: Vec<u32> = Vec::new();
        let mut missing = false;
        'stacks: for (d, slot) in found.iter_mut().enumerate() {
            if *slot != NONE {
                continue;
            }
            if let Some(i) = writer.find_stack(keys.stacks[d]) {
                *slot = i;
                continue;
            }
            stack.clear();
            for name in self.frames_of(d) {
                let location = match locations.get(name) {
                    Some(&l) => l,
                    None => {
                        let key = location_key(&mut buf, name);
                        let l = match writer.find_location(key) {
                            Some(l) => l,
                            None => {
                                let Some(l) = add_location(writer, key, name)? else {
                                    missing = true;
                                    continue 'stacks;
                                };
                                l
                            }
                        };
                        locations.insert(name, l);
                        l
                    }
                };
                stack.push(location);
            }
            match writer.stack(keys.stacks[d], &stack)? {
                Some(i) => *slot = i,
                None => missing = true,
            }
        }
        Ok(!missing)
    }
}

/// The location of a frame named `name`, with content key `key`; `None` when the writer
/// may not add what it lacks.
fn add_location(writer: &mut Writer<'_>, key: StackKey, name: &str) -> Result<Option<u32>> {
    let (Some(name), Some(file)) = (writer.string(name)?, writer.string("")?) else {
        return Ok(None);
    };
    let function = FunctionRow {
        name,
        system_name: name,
        filename: file,
        start_line: 0,
    };
    let Some(function) = writer.function(function)? else {
        return Ok(None);
    };
    writer.location(key, 0, 0, false, &[(function, 0)])
}

/// The content keys of a call's distinct stacks.
pub(crate) struct StackKeys {
    stacks: Vec<StackKey>,
}

/// The content key of the location of a frame named `name` (`buf`: scratch): a function
/// of that name and system name, no file, at line 0 of a location of no mapping and address.
fn location_key(buf: &mut Vec<u8>, name: &str) -> StackKey {
    let function = function_key(buf, name, name, "", 0);
    location_start(buf, 0, 0, false);
    location_line(buf, function, 0);
    content_key(buf)
}

impl InternedStacks {
    /// The symbol id of each row's stack.
    pub(crate) fn ids_of(&self, stacks: &Stacks) -> Vec<u64> {
        let ids: Vec<u64> = self
            .index
            .iter()
            .map(|&i| frostdb_profile::ids::symbol_id(self.partition, i))
            .collect();
        stacks.of_row.iter().map(|&d| ids[d as usize]).collect()
    }
}

/// An error for a stack the writer should have added.
pub(crate) fn not_added() -> Error {
    Error::Corrupt("an exclusive symbol writer added nothing".into())
}
