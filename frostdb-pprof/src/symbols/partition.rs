//! A symbol partition: the stacks, locations, functions, mappings and strings written during
//! one stretch of ingest, each stored once and numbered densely from 0 within the partition.
//!
//! The current partition takes new symbols: its indexes (hash tables of indices, hashed and
//! compared against the stored rows, so nothing is kept twice) answer "do I have this one
//! already?" for the writer. Stacks are indexed by a 128-bit content key instead (see
//! `Prepared::stack_keys`), so a profile whose stacks the partition has finds each with one
//! probe and never looks up its frames; locations are also indexed by their content key, so
//! a new stack's known frames are found without interning their functions and strings. Rows
//! live in append-only vectors whose elements never move, so readers resolve indices without
//! any lock while the writer appends. A closed partition has no indexes; one loaded from the
//! symbol tables is built the same way.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};

/// A function, its strings as indices into the partition's strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FunctionRow {
    pub(crate) name: u32,
    pub(crate) system_name: u32,
    pub(crate) filename: u32,
    pub(crate) start_line: i64,
}

/// A mapping, its strings as indices into the partition's strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MappingRow {
    pub(crate) memory_start: u64,
    pub(crate) memory_limit: u64,
    pub(crate) file_offset: u64,
    pub(crate) filename: u32,
    pub(crate) build_id: u32,
    /// has_functions, has_filenames, has_line_numbers, has_inline_frames (bits 0..3).
    pub(crate) flags: u8,
}

/// One line of a location: a function index and a line number.
pub(crate) type LineRow = (u32, i64);

/// A location: `mapping` is the mapping's index plus one (0: none).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LocationRow {
    pub(crate) mapping: u32,
    pub(crate) address: u64,
    pub(crate) is_folded: bool,
    /// Innermost (inlined) first.
    pub(crate) lines: Box<[LineRow]>,
}

/// How many rows of each kind a partition holds: also the position of the next new row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) strings: usize,
    pub(crate) mappings: usize,
    pub(crate) functions: usize,
    pub(crate) locations: usize,
    pub(crate) stacks: usize,
}

type Hasher = foldhash::fast::FixedState;

/// A stack's content key: a 128-bit hash of everything its frames hold (see
/// [`crate::normalize`]), equal for equal stacks whichever profile sends them.
pub(crate) type StackKey = u128;

/// Bytes of an entry of the stack index.
const STACK_SLOT: usize = std::mem::size_of::<(StackKey, u32)>();

/// The writer's side of the current partition.
pub(crate) struct Indexes {
    hasher: Hasher,
    strings: HashTable<u32>,
    mappings: HashTable<u32>,
    functions: HashTable<u32>,
    locations: HashTable<u32>,
    /// Stacks by content key, so that a known stack is found with one probe, without
    /// interning its frames' strings, functions and locations first.
    stacks: HashTable<(StackKey, u32)>,
    /// Locations by content key, the same way: a new stack's frames that the partition has
    /// are found without interning their functions and strings.
    location_keys: HashTable<(StackKey, u32)>,
}

impl Default for Indexes {
    fn default() -> Self {
        Self {
            hasher: Hasher::with_seed(0x5eed_f00d),
            strings: HashTable::new(),
            mappings: HashTable::new(),
            functions: HashTable::new(),
            locations: HashTable::new(),
            stacks: HashTable::new(),
            location_keys: HashTable::new(),
        }
    }
}

/// A symbol partition.
pub struct Partition {
    id: u32,
    strings: boxcar::Vec<Box<str>>,
    mappings: boxcar::Vec<MappingRow>,
    functions: boxcar::Vec<FunctionRow>,
    locations: boxcar::Vec<LocationRow>,
    stacks: boxcar::Vec<Box<[u32]>>,
    /// Approximate heap bytes held.
    bytes: AtomicUsize,
    /// `Some` while the partition takes new symbols: shared by profiles that only look up
    /// symbols it has, exclusive to one that adds symbols. std's lock, which sleeps after a
    /// short spin: parking_lot's yields the CPU while it spins, and with many clients on
    /// few cores a writer waiting out readers yielded again and again.
    writer: RwLock<Option<Indexes>>,
    /// Whether the partition takes new symbols, shared by every profile on its way into a
    /// group of the partition ([`Partition::pin`]) and taken alone to close it. Apart from
    /// `writer`, so that a profile joining its group (under the pipeline's lock, which may
    /// be contended) holds only this and not the indexes: an interning writer waits for
    /// lookups alone, not for profiles queueing at the pipeline, and lookups meanwhile
    /// wait for it alone. Taken before `writer` by every holder of both.
    open: RwLock<bool>,
    /// Names found by a symbolizer for locations stored without them
    /// ([`crate::symbolize`]), and where each location's are: kept beside the rows, which
    /// the group commit writes and never changes.
    /// A location named again (better debug info came) gets a new entry; the old one
    /// stays, unread, while the partition lives (readers may hold it).
    named: boxcar::Vec<Box<[NamedLine]>>,
    named_at: parking_lot::RwLock<std::collections::HashMap<u32, usize>>,
    /// Locations stored without lines in a mapping: whether a symbolizer has anything to
    /// look for here (most partitions: no, and a query skips the walk).
    unnamed: AtomicUsize,
    /// Locations whose debug file was found and had no symbol for them (code between
    /// functions, a stripped binary's own functions): not asked again by every query.
    unnamable: parking_lot::RwLock<std::collections::HashSet<u32>>,
    /// How many locations the background resolver has looked at
    /// ([`crate::symbolize`]): the ones after it are new to it.
    pub(crate) resolver_cursor: AtomicUsize,
}

/// A line a symbolizer found for a location stored as an address (innermost first in a
/// location's list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedLine {
    /// The function, demangled.
    pub function: Box<str>,
    /// Its source file ("" when unknown).
    pub file: Box<str>,
    /// The line (0 when unknown).
    pub line: i64,
    /// An id for the function, equal for equal names and files, apart from every id of
    /// stored symbols (the top bit set): made once, read by every report.
    function_id: u64,
}

impl NamedLine {
    /// A line of `function` in `file`.
    pub fn new(function: impl Into<Box<str>>, file: impl Into<Box<str>>, line: i64) -> Self {
        let (function, file) = (function.into(), file.into());
        let mut buf = Vec::with_capacity(function.len() + file.len() + 16);
        crate::normalize::put_str(&mut buf, &function);
        crate::normalize::put_str(&mut buf, &file);
        let function_id = (crate::normalize::content_key(&buf) as u64) | (1 << 63);
        Self {
            function,
            file,
            line,
            function_id,
        }
    }

    pub(crate) fn function_id(&self) -> u64 {
        self.function_id
    }
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("id", &self.id)
            .field("counts", &self.counts())
            .field("bytes", &self.bytes())
            .finish_non_exhaustive()
    }
}

/// Whether a symbolizer's lines know their source files (DWARF), not only names.
fn knows_files(lines: &[NamedLine]) -> bool {
    lines.iter().any(|l| !l.file.is_empty())
}

/// Bytes a row of each kind costs beyond its own heap data (vector slot, index slot).
const SLOT: usize = 24;

fn index_of(i: usize) -> Result<u32> {
    u32::try_from(i).map_err(|_| Error::TooLarge {
        what: "symbols in one partition",
        limit: u32::MAX as usize,
    })
}

impl Partition {
    /// An empty partition taking new symbols.
    pub(crate) fn new(id: u32) -> Self {
        Self {
            id,
            strings: boxcar::Vec::new(),
            mappings: boxcar::Vec::new(),
            functions: boxcar::Vec::new(),
            locations: boxcar::Vec::new(),
            stacks: boxcar::Vec::new(),
            bytes: AtomicUsize::new(0),
            writer: RwLock::new(Some(Indexes::default())),
            open: RwLock::new(true),
            named: boxcar::Vec::new(),
            named_at: parking_lot::RwLock::new(std::collections::HashMap::new()),
            unnamed: AtomicUsize::new(0),
            unnamable: parking_lot::RwLock::new(std::collections::HashSet::new()),
            resolver_cursor: AtomicUsize::new(0),
        }
    }

    /// An empty partition that takes no new symbols (for loading a stored one).
    pub(crate) fn closed(id: u32) -> Self {
        Self {
            writer: RwLock::new(None),
            open: RwLock::new(false),
            ..Self::new(id)
        }
    }

    /// The partition's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Approximate heap bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            strings: self.strings.count(),
            mappings: self.mappings.count(),
            functions: self.functions.count(),
            locations: self.locations.count(),
            stacks: self.stacks.count(),
        }
    }

    /// Stops taking new symbols, dropping the indexes, once every profile pinning the
    /// partition has joined its group.
    pub(crate) fn close(&self) {
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        *open = false;
        if let Some(indexes) = self.write_lock().take() {
            let slots = indexes.strings.len()
                + indexes.mappings.len()
                + indexes.functions.len()
                + indexes.locations.len();
            let bytes = slots * 8 + indexes.stacks.len() * STACK_SLOT;
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Keeps the partition open (taking new symbols) while held: a profile holds it from
    /// before it interns its symbols until it has joined a group of the partition, so the
    /// partition closes only after the profile's group has its cut. `None` when closed.
    pub(crate) fn pin(&self) -> Option<RwLockReadGuard<'_, bool>> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        (*open).then_some(open)
    }

    /// The writer's side, exclusively: adds what it does not find. `None` when the
    /// partition is closed.
    pub(crate) fn writer(&self) -> Option<Writer<'_>> {
        let guard = self.write_lock();
        guard.is_some().then_some(Writer {
            partition: self,
            indexes: Guard::Exclusive(guard),
        })
    }

    /// The writer's lock, exclusively. A holder that panicked poisons nothing, as with
    /// parking_lot's lock.
    fn write_lock(&self) -> RwLockWriteGuard<'_, Option<Indexes>> {
        self.writer.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer's side, shared with other lookups: finds symbols, adds none (each lookup
    /// answers `None` for a symbol the partition lacks). `None` when the partition is
    /// closed. Holding it keeps the partition open, as a writer does.
    pub(crate) fn lookup(&self) -> Option<Writer<'_>> {
        let guard = self.writer.read().unwrap_or_else(PoisonError::into_inner);
        guard.is_some().then_some(Writer {
            partition: self,
            indexes: Guard::Shared(guard),
        })
    }

    pub(crate) fn string(&self, i: u32) -> &str {
        self.strings.get(i as usize).map_or("", |s| s)
    }

    pub(crate) fn mapping(&self, i: u32) -> Option<&MappingRow> {
        self.mappings.get(i as usize)
    }

    pub(crate) fn function(&self, i: u32) -> Option<&FunctionRow> {
        self.functions.get(i as usize)
    }

    pub(crate) fn location(&self, i: u32) -> Option<&LocationRow> {
        self.locations.get(i as usize)
    }

    /// The lines a symbolizer found for location `i`, if it was stored without any and
    /// named since.
    pub(crate) fn named(&self, i: u32) -> Option<&[NamedLine]> {
        let at = *self.named_at.read().get(&i)?;
        self.named.get(at).map(|lines| &**lines)
    }

    /// Names location `i`, stored without lines, with `lines` (innermost first): every
    /// report of the partition shows them from now on. A location that has lines keeps
    /// them; one named already is named again only when `lines` are better, that is they
    /// know source files and the old ones did not (a symbol table's names, then DWARF).
    /// Returns whether the location's names changed.
    pub fn name_location(&self, i: u32, lines: Vec<NamedLine>) -> bool {
        if lines.is_empty() || self.location(i).is_none_or(|l| !l.lines.is_empty()) {
            return false;
        }
        let mut at = self.named_at.write();
        if let Some(&old) = at.get(&i) {
            let better = self
                .named
                .get(old)
                .is_some_and(|old| !knows_files(old) && knows_files(&lines));
            if !better {
                return false;
            }
        }
        let bytes: usize = lines
            .iter()
            .map(|l| l.function.len() + l.file.len() + 48)
            .sum();
        let index = self.named.push(lines.into_boxed_slice());
        at.insert(i, index);
        self.bytes.fetch_add(bytes + SLOT, Ordering::Relaxed);
        true
    }

    /// Whether location `i` was named from a symbol table only (no source files): better
    /// debug info would name it again.
    pub(crate) fn named_from_symbols_only(&self, i: u32) -> bool {
        self.named(i).is_some_and(|lines| !knows_files(lines))
    }

    /// Remembers that location `i`'s debug file has no symbol for it.
    pub(crate) fn mark_unnamable(&self, i: u32) {
        if self.unnamable.write().insert(i) {
            self.bytes.fetch_add(SLOT, Ordering::Relaxed);
        }
    }

    /// Whether location `i`'s debug file was found to have no symbol for it.
    pub(crate) fn unnamable(&self, i: u32) -> bool {
        self.unnamable.read().contains(&i)
    }

    /// How many locations were named (each once, however often named again).
    fn named_count(&self) -> usize {
        self.named_at.read().len()
    }

    pub(crate) fn stack(&self, i: u32) -> Option<&[u32]> {
        self.stacks.get(i as usize).map(|s| &**s)
    }

    fn grow(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    // Appends used while loading a stored partition (no indexes): rows must come in index
    // order, which the caller checks.

    pub(crate) fn push_string(&self, s: &str) -> u32 {
        self.grow(s.len() + SLOT);
        self.strings.push(s.into()) as u32
    }

    pub(crate) fn push_mapping(&self, m: MappingRow) {
        self.grow(std::mem::size_of::<MappingRow>() + SLOT);
        self.mappings.push(m);
    }

    pub(crate) fn push_function(&self, f: FunctionRow) {
        self.grow(std::mem::size_of::<FunctionRow>() + SLOT);
        self.functions.push(f);
    }

    pub(crate) fn push_location(&self, l: LocationRow) {
        self.grow(std::mem::size_of::<LocationRow>() + l.lines.len() * 16 + SLOT);
        if l.lines.is_empty() && l.mapping != 0 {
            self.unnamed.fetch_add(1, Ordering::Relaxed);
        }
        self.locations.push(l);
    }

    /// Locations stored without lines in a mapping and not named since: 0 when a
    /// symbolizer has nothing to look for in the partition.
    pub(crate) fn unnamed_locations(&self) -> usize {
        self.unnamed
            .load(Ordering::Relaxed)
            .saturating_sub(self.named_count())
    }

    pub(crate) fn push_stack(&self, s: Box<[u32]>) {
        self.grow(s.len() * 4 + SLOT);
        self.stacks.push(s);
    }
}

enum Guard<'a> {
    Shared(RwLockReadGuard<'a, Option<Indexes>>),
    Exclusive(RwLockWriteGuard<'a, Option<Indexes>>),
}

/// The writer of the current partition: interns symbols, appending the new ones when it
/// holds the indexes exclusively ([`Partition::writer`]), only finding them when it shares
/// them ([`Partition::lookup`]). Each method answers `None` for a symbol it may not add.
pub(crate) struct Writer<'a> {
    partition: &'a Partition,
    indexes: Guard<'a>,
}

impl Writer<'_> {
    /// The id of the partition this writer writes.
    pub(crate) fn partition_id(&self) -> u32 {
        self.partition.id()
    }

    fn indexes(&self) -> &Indexes {
        let indexes = match &self.indexes {
            Guard::Shared(g) => g.as_ref(),
            Guard::Exclusive(g) => g.as_ref(),
        };
        indexes.expect("a writer exists only for an open partition")
    }

    /// The indexes, when this writer may add to them.
    fn exclusive(&mut self) -> Option<&mut Indexes> {
        match &mut self.indexes {
            Guard::Shared(_) => None,
            Guard::Exclusive(g) => g.as_mut(),
        }
    }

    /// The index of the row hashing to `hash` that `eq` accepts in table `t`; else, when
    /// this writer may add, the index `push` gives the new row (`next`, the table's row
    /// count), indexed with `rehash` hashing stored rows as the table grows.
    fn find_or_add(
        &mut self,
        t: Table,
        hash: u64,
        eq: impl Fn(u32) -> bool,
        next: usize,
        push: impl FnOnce(),
        rehash: impl Fn(u32) -> u64,
    ) -> Result<Option<u32>> {
        if let Some(&i) = self.indexes().table(t).find(hash, |&i| eq(i)) {
            return Ok(Some(i));
        }
        let Some(ix) = self.exclusive() else {
            return Ok(None);
        };
        let i = index_of(next)?;
        push();
        ix.table_mut(t).insert_unique(hash, i, |&j| rehash(j));
        self.partition.grow(8);
        Ok(Some(i))
    }

    /// The index of `s`, added if new.
    pub(crate) fn string(&mut self, s: &str) -> Result<Option<u32>> {
        let p = self.partition;
        let hasher = self.indexes().hasher.clone();
        self.find_or_add(
            Table::Strings,
            hasher.hash_one(s),
            |i| p.string(i) == s,
            p.strings.count(),
            || {
                p.push_string(s);
            },
            |j| hasher.hash_one(p.string(j)),
        )
    }

    pub(crate) fn mapping(&mut self, m: MappingRow) -> Result<Option<u32>> {
        let p = self.partition;
        let hasher = self.indexes().hasher.clone();
        self.find_or_add(
            Table::Mappings,
            hasher.hash_one(m),
            |i| p.mapping(i) == Some(&m),
            p.mappings.count(),
            || p.push_mapping(m),
            |j| p.mapping(j).map_or(0, |r| hasher.hash_one(r)),
        )
    }

    pub(crate) fn function(&mut self, f: FunctionRow) -> Result<Option<u32>> {
        let p = self.partition;
        let hasher = self.indexes().hasher.clone();
        self.find_or_add(
            Table::Functions,
            hasher.hash_one(f),
            |i| p.function(i) == Some(&f),
            p.functions.count(),
            || p.push_function(f),
            |j| p.function(j).map_or(0, |r| hasher.hash_one(r)),
        )
    }

    /// The index of the location whose content key is `key`, if the partition has it
    /// indexed by key (see [`Writer::location`]).
    pub(crate) fn find_location(&self, key: StackKey) -> Option<u32> {
        keyed(&self.indexes().location_keys, key)
    }

    /// The index of the location `(mapping, address, is_folded, lines)`, added if new;
    /// with an exclusive writer it is also indexed by its content key `key`.
    pub(crate) fn location(
        &mut self,
        key: StackKey,
        mapping: u32,
        address: u64,
        is_folded: bool,
        lines: &[LineRow],
    ) -> Result<Option<u32>> {
        let p = self.partition;
        let hasher = self.indexes().hasher.clone();
        let found = self.find_or_add(
            Table::Locations,
            hasher.hash_one((mapping, address, is_folded, lines)),
            |i| {
                p.location(i).is_some_and(|l| {
                    l.mapping == mapping
                        && l.address == address
                        && l.is_folded == is_folded
                        && *l.lines == *lines
                })
            },
            p.locations.count(),
            || {
                p.push_location(LocationRow {
                    mapping,
                    address,
                    is_folded,
                    lines: lines.into(),
                })
            },
            |j| {
                p.location(j).map_or(0, |l| {
                    hasher.hash_one((l.mapping, l.address, l.is_folded, &*l.lines))
                })
            },
        )?;
        if let (Some(i), Some(ix)) = (found, self.exclusive())
            && keyed(&ix.location_keys, key).is_none()
        {
            add_keyed(p, &mut ix.location_keys, key, i);
        }
        Ok(found)
    }

    /// The index of the stack whose content key is `key`, if the partition has it.
    pub(crate) fn find_stack(&self, key: StackKey) -> Option<u32> {
        keyed(&self.indexes().stacks, key)
    }

    /// The index of the stack with content key `key`, of locations `locations` (leaf
    /// first), added if new.
    pub(crate) fn stack(&mut self, key: StackKey, locations: &[u32]) -> Result<Option<u32>> {
        if let Some(i) = self.find_stack(key) {
            return Ok(Some(i));
        }
        let p = self.partition;
        let Some(ix) = self.exclusive() else {
            return Ok(None);
        };
        let i = index_of(p.stacks.count())?;
        p.push_stack(locations.into());
        add_keyed(p, &mut ix.stacks, key, i);
        Ok(Some(i))
    }
}

/// The index `key` has in `table` (an index by content key), if any.
fn keyed(table: &HashTable<(StackKey, u32)>, key: StackKey) -> Option<u32> {
    table.find(key as u64, |&(k, _)| k == key).map(|&(_, i)| i)
}

/// Indexes row `i` of `p` by content key `key` in `table`, which lacks it.
fn add_keyed(p: &Partition, table: &mut HashTable<(StackKey, u32)>, key: StackKey, i: u32) {
    table.insert_unique(key as u64, (key, i), |&(k, _)| k as u64);
    p.grow(STACK_SLOT);
}

/// The writer's indexes, one per kind of row.
#[derive(Clone, Copy)]
enum Table {
    Strings,
    Mappings,
    Functions,
    Locations,
}

impl Indexes {
    fn table(&self, t: Table) -> &HashTable<u32> {
        match t {
            Table::Strings => &self.strings,
            Table::Mappings => &self.mappings,
            Table::Functions => &self.functions,
            Table::Locations => &self.locations,
        }
    }

    fn table_mut(&mut self, t: Table) -> &mut HashTable<u32> {
        match t {
            Table::Strings => &mut self.strings,
            Table::Mappings => &mut self.mappings,
            Table::Functions => &mut self.functions,
            Table::Locations => &mut self.locations,
        }
    }
}
