//! Symbols: stacks, locations, functions and mappings, stored in partitions.
//!
//! A partition holds the symbols first seen during one stretch of ingest (until it reaches
//! [`SymbolOptions::partition_bytes`] or [`SymbolOptions::partition_age`]), each once, numbered
//! densely from 0. A symbol's id is `partition << 32 | index`: samples refer to stacks by it,
//! so a merge sums values into one dense array per partition instead of hashing keys, and a
//! partition nothing retained refers to any more is deleted whole (symbols expire with their
//! samples, as Pyroscope's symdb partitions do).
//!
//! Memory stays bounded: the current partition (which the writer indexes) is at most
//! `partition_bytes`; older partitions are read from the symbol tables when a merge needs
//! them, into a cache of at most [`SymbolOptions::cache_bytes`]. Opening reads no symbols.

mod partition;
mod tables;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use partition::LocationRow;
pub(crate) use partition::{Counts, FunctionRow, LineRow, MappingRow, StackKey, Writer};
pub use partition::{NamedLine, Partition};
pub(crate) use tables::SymbolTables;

pub use frostdb_profile::ids::{StackId, split_id, symbol_id};

/// How symbols are partitioned and cached.
///
/// # Defaults
/// | option | default | meaning |
/// |---|---|---|
/// | `partition_bytes` | 64 MiB | the current partition closes past this much memory |
/// | `partition_age` | 1 h | ... or after this long: symbols expire a partition at a time |
/// | `cache_bytes` | 256 MiB | closed partitions kept in memory for merges, least recently used evicted |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolOptions {
    /// Memory past which the current partition closes.
    pub partition_bytes: usize,
    /// Age past which the current partition closes.
    pub partition_age: Duration,
    /// Memory for closed partitions read back for merges.
    pub cache_bytes: usize,
}

impl Default for SymbolOptions {
    fn default() -> Self {
        Self {
            partition_bytes: 64 << 20,
            partition_age: Duration::from_secs(3600),
            cache_bytes: 256 << 20,
        }
    }
}

/// Closed partitions in memory, most recently used first.
#[derive(Default)]
struct Cache {
    entries: VecDeque<Arc<Partition>>,
    bytes: usize,
}

impl Cache {
    fn get(&mut self, id: u32) -> Option<Arc<Partition>> {
        let i = self.entries.iter().position(|p| p.id() == id)?;
        let p = self.entries.remove(i)?;
        self.entries.push_front(p.clone());
        Some(p)
    }

    fn insert(&mut self, p: Arc<Partition>, limit: usize) {
        if self.entries.iter().any(|e| e.id() == p.id()) {
            return;
        }
        self.bytes += p.bytes();
        self.entries.push_front(p);
        while self.bytes > limit && self.entries.len() > 1 {
            if let Some(old) = self.entries.pop_back() {
                self.bytes -= old.bytes();
            }
        }
    }
}

/// The symbols of a store: the current partition, a cache of closed ones, the tables.
pub(crate) struct SymbolStore {
    tables: SymbolTables,
    options: SymbolOptions,
    current: RwLock<(Arc<Partition>, Instant)>,
    cache: Mutex<Cache>,
    /// Every closed partition some result still holds, evicted from the cache or not: a
    /// merge needing one finds it here rather than reading a second copy from the tables.
    live: Mutex<HashMap<u32, Weak<Partition>>>,
    /// One load from the tables at a time (two merges needing the same partition read it once).
    loading: Mutex<()>,
}

impl std::fmt::Debug for SymbolStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymbolStore")
            .field("current", &self.current.read().0)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SymbolStore {
    /// Symbols in `tables`; the current partition is a new one, after every stored one.
    pub(crate) fn open(tables: SymbolTables, options: SymbolOptions, newest: u32) -> Self {
        let id = newest.saturating_add(1);
        tracing::debug!(partition = id, "symbol partition started");
        Self {
            tables,
            options,
            current: RwLock::new((Arc::new(Partition::new(id)), Instant::now())),
            cache: Mutex::new(Cache::default()),
            live: Mutex::new(HashMap::new()),
            loading: Mutex::new(()),
        }
    }

    /// Symbols in `tables` for reading only (a follower of a shared bucket): every
    /// partition is read from the tables; none takes new symbols.
    pub(crate) fn open_reader(tables: SymbolTables, options: SymbolOptions) -> Self {
        Self {
            tables,
            options,
            // No stored partition has this id (ids count up from 1).
            current: RwLock::new((Arc::new(Partition::new(u32::MAX)), Instant::now())),
            cache: Mutex::new(Cache::default()),
            live: Mutex::new(HashMap::new()),
            loading: Mutex::new(()),
        }
    }

    /// Drops partition `id` from the cache, to be read again (a reader's copy of a partition
    /// its writer has added to since).
    pub(crate) fn forget(&self, id: u32) {
        self.live.lock().remove(&id);
        let mut cache = self.cache.lock();
        if let Some(at) = cache.entries.iter().position(|p| p.id() == id)
            && let Some(p) = cache.entries.remove(at)
        {
            cache.bytes -= p.bytes();
        }
    }

    pub(crate) fn tables(&self) -> &SymbolTables {
        &self.tables
    }

    /// The partition taking new symbols, after closing it if it is full or old.
    pub(crate) fn current(&self) -> Arc<Partition> {
        let (p, since) = {
            let c = self.current.read();
            (c.0.clone(), c.1)
        };
        if p.bytes() >= self.options.partition_bytes
            || since.elapsed() >= self.options.partition_age
        {
            self.rotate(p.id());
            return self.current.read().0.clone();
        }
        p
    }

    /// Closes partition `id` if it is still the current one, and starts the next.
    pub(crate) fn rotate(&self, id: u32) {
        let old = {
            let mut c = self.current.write();
            if c.0.id() != id {
                return;
            }
            let next = Arc::new(Partition::new(id.saturating_add(1)));
            std::mem::replace(&mut *c, (next, Instant::now())).0
        };
        // Waits for a writer still interning into it.
        old.close();
        tracing::info!(
            partition = id,
            bytes = old.bytes(),
            stacks = old.counts().stacks,
            "symbol partition closed"
        );
        self.cache.lock().insert(old, self.options.cache_bytes);
    }

    /// Partition `id`: the current one, a cached one, or one read from the tables.
    pub(crate) fn partition(&self, id: u32) -> Result<Arc<Partition>> {
        {
            let c = self.current.read();
            if c.0.id() == id {
                return Ok(c.0.clone());
            }
        }
        let held = || {
            let p = self.live.lock().get(&id).and_then(Weak::upgrade)?;
            // Evicted while a result held it: in use again, so cached again.
            self.cache
                .lock()
                .insert(p.clone(), self.options.cache_bytes);
            Some(p)
        };
        if let Some(p) = self.cache.lock().get(id).or_else(held) {
            return Ok(p);
        }
        let _one_at_a_time = self.loading.lock();
        if let Some(p) = self.cache.lock().get(id).or_else(held) {
            return Ok(p);
        }
        let started = Instant::now();
        let p = Arc::new(self.tables.load(id)?);
        {
            let mut live = self.live.lock();
            live.retain(|_, p| p.strong_count() > 0);
            live.insert(id, Arc::downgrade(&p));
        }
        tracing::debug!(
            partition = id,
            bytes = p.bytes(),
            stacks = p.counts().stacks,
            seconds = started.elapsed().as_secs_f64(),
            "symbol partition read"
        );
        self.cache
            .lock()
            .insert(p.clone(), self.options.cache_bytes);
        Ok(p)
    }

    /// The symbols of the partitions `ids`, each closed one reserved from `pool` as it is
    /// taken, for as long as the result holds it: a merge over a long range holds every
    /// partition its stacks are in (one an hour at least), evicted from the cache or not,
    /// and one that would hold more than the query memory limit is refused before it
    /// reads the rest, naming the limit. (A cached partition is counted in the store's
    /// memory as well: at most [`SymbolOptions::cache_bytes`] counted twice.)
    pub(crate) fn view(
        &self,
        ids: impl IntoIterator<Item = u32>,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<Symbols> {
        let mut partitions = BTreeMap::new();
        let held = MemoryConsumer::new("the symbols of the merged stacks").register(pool);
        let current = self.current.read().0.id();
        for id in ids {
            if partitions.contains_key(&id) {
                continue;
            }
            let p = self.partition(id)?;
            if id != current {
                held.try_grow(p.bytes()).map_err(|e| {
                    Error::from(e).at(format!(
                        "the symbols of {} partitions (a shorter range reads fewer)",
                        partitions.len() + 1
                    ))
                })?;
            }
            partitions.insert(id, p);
        }
        Ok(Symbols {
            partitions,
            _held: Some(Arc::new(held)),
        })
    }

    /// Bytes of symbols held in memory: the current partition and the cache.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.current.read().0.bytes() + self.cache.lock().bytes
    }

    /// The partitions in memory: the current one and the cached ones.
    pub(crate) fn loaded(&self) -> Vec<Arc<Partition>> {
        let mut out = vec![self.current.read().0.clone()];
        out.extend(self.cache.lock().entries.iter().cloned());
        out
    }

    /// Drops cached partitions below `id` (their tables' rows were deleted).
    pub(crate) fn forget_below(&self, id: u32) {
        self.live.lock().retain(|&p, _| p >= id);
        let mut cache = self.cache.lock();
        let mut kept = VecDeque::new();
        let mut bytes = 0;
        for p in cache.entries.drain(..) {
            if p.id() >= id {
                bytes += p.bytes();
                kept.push_back(p);
            }
        }
        cache.entries = kept;
        cache.bytes = bytes;
    }
}

/// Resolved symbols: the partitions a result refers to, kept alive as long as it is, and
/// reserved from the query memory pool meanwhile.
#[derive(Debug, Clone, Default)]
pub struct Symbols {
    partitions: BTreeMap<u32, Arc<Partition>>,
    _held: Option<Arc<MemoryReservation>>,
}

impl Symbols {
    /// The partitions the stacks are in.
    pub(crate) fn partitions(&self) -> impl Iterator<Item = &Partition> {
        self.partitions.values().map(|p| &**p)
    }

    /// The partitions the stacks are in, shared.
    pub(crate) fn partition_arcs(&self) -> impl Iterator<Item = Arc<Partition>> + '_ {
        self.partitions.values().cloned()
    }

    pub(crate) fn partition(&self, id: u32) -> Option<&Partition> {
        self.partitions.get(&id).map(|p| &**p)
    }

    /// The frames of a stack, leaf first, inlined frames expanded (innermost first); empty
    /// when the stack is unknown.
    pub fn frames(&self, stack: StackId) -> Vec<Frame<'_>> {
        let mut out = Vec::new();
        self.for_each_frame(stack, |f| out.push(f));
        out
    }

    /// Calls `f` with each frame of `stack`, leaf first, without collecting them.
    pub fn for_each_frame<'a>(&'a self, stack: StackId, mut f: impl FnMut(Frame<'a>)) {
        if let Some((p, locations)) = self.locations(stack) {
            for &l in locations {
                location_frames(p, l, &mut f);
            }
        }
    }

    /// The partition of `stack` and its location indices, leaf first.
    pub(crate) fn locations(&self, stack: StackId) -> Option<(&Partition, &[u32])> {
        let p = self.partition(stack.partition())?;
        Some((p, p.stack(stack.index())?))
    }

    /// About the bytes a report's walk of these symbols holds besides its output: a slot
    /// of 8 bytes for each location of each partition (the flame graph's and the top
    /// table's per-partition arrays).
    pub fn walk_bytes(&self) -> usize {
        self.partitions
            .values()
            .map(|p| p.counts().locations.saturating_mul(8))
            .fold(0, usize::saturating_add)
    }

    /// Whether `stack` is known.
    pub fn has_stack(&self, stack: StackId) -> bool {
        self.partition(stack.partition())
            .is_some_and(|p| p.stack(stack.index()).is_some())
    }

    /// Number of locations of `stack` (0 when unknown).
    pub fn depth(&self, stack: StackId) -> usize {
        self.partition(stack.partition())
            .and_then(|p| p.stack(stack.index()))
            .map_or(0, <[u32]>::len)
    }
}

/// Calls `f` with the frames of location `l` of `p`, innermost (inlined) first; one frame
/// without a function when the location has no lines; none when `l` is not stored.
pub(crate) fn location_frames<'a>(p: &'a Partition, l: u32, f: &mut impl FnMut(Frame<'a>)) {
    let Some(location) = p.location(l) else {
        return;
    };
    let frame = |line: Option<&LineRow>, inlined: bool| Frame {
        partition: p,
        location_index: l,
        location,
        function: line.and_then(|(fi, _)| p.function(*fi).map(|f| (*fi, f))),
        named: None,
        line: line.map_or(0, |(_, n)| *n),
        inlined,
    };
    if location.lines.is_empty() {
        match p.named(l) {
            Some(named) => {
                let last = named.len() - 1;
                for (i, n) in named.iter().enumerate() {
                    f(Frame {
                        named: Some(n),
                        line: n.line,
                        ..frame(None, i != last)
                    });
                }
            }
            None => f(frame(None, false)),
        }
    }
    let last = location.lines.len().saturating_sub(1);
    for (i, line) in location.lines.iter().enumerate() {
        f(frame(Some(line), i != last));
    }
}

/// How many frames [`location_frames`] gives for location `l` of `p`: its lines, at least
/// one; none when `l` is not stored.
pub(crate) fn location_frame_count(p: &Partition, l: u32) -> usize {
    p.location(l)
        .map_or(0, |location| match location.lines.len() {
            0 => p.named(l).map_or(1, <[NamedLine]>::len),
            n => n,
        })
}

/// A mapping: an executable or library mapped into a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping<'a> {
    /// Start address.
    pub memory_start: u64,
    /// End address.
    pub memory_limit: u64,
    /// Offset in the file.
    pub file_offset: u64,
    /// Path of the file.
    pub filename: &'a str,
    /// Build id (hex), for symbolizing later.
    pub build_id: &'a str,
    /// has_functions, has_filenames, has_line_numbers, has_inline_frames (bits 0..3).
    pub flags: u8,
}

/// A function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Function<'a> {
    /// Function name.
    pub name: &'a str,
    /// System (mangled) name.
    pub system_name: &'a str,
    /// Source file.
    pub filename: &'a str,
    /// First line of the function.
    pub start_line: i64,
}

/// One frame of a resolved stack.
#[derive(Clone, Copy)]
pub struct Frame<'a> {
    partition: &'a Partition,
    location_index: u32,
    location: &'a LocationRow,
    function: Option<(u32, &'a FunctionRow)>,
    /// The line a symbolizer found, for a location stored without lines.
    named: Option<&'a NamedLine>,
    line: i64,
    inlined: bool,
}

impl std::fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("name", &self.display_name())
            .field("line", &self.line)
            .field("inlined", &self.inlined)
            .finish()
    }
}

impl<'a> Frame<'a> {
    /// The location's id (partition and index): equal for equal locations of one partition.
    pub fn location_id(&self) -> u64 {
        symbol_id(self.partition.id(), self.location_index)
    }

    /// The function's id, when symbolized.
    pub fn function_id(&self) -> Option<u64> {
        if let Some(named) = self.named {
            return Some(named.function_id());
        }
        self.function
            .map(|(i, _)| symbol_id(self.partition.id(), i))
    }

    /// The address (kept for symbolizing later).
    pub fn address(&self) -> u64 {
        self.location.address
    }

    /// Whether the location's frames were folded.
    pub fn is_folded(&self) -> bool {
        self.location.is_folded
    }

    /// The line.
    pub fn line(&self) -> i64 {
        self.line
    }

    /// Whether this frame was inlined into the next (outer) frame of the same location.
    pub fn inlined(&self) -> bool {
        self.inlined
    }

    /// The mapping's id and the mapping, if any.
    pub fn mapping(&self) -> Option<(u64, Mapping<'a>)> {
        let i = self.location.mapping.checked_sub(1)?;
        let m = self.partition.mapping(i)?;
        let p = self.partition;
        Some((
            symbol_id(p.id(), i),
            Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: p.string(m.filename),
                build_id: p.string(m.build_id),
                flags: m.flags,
            },
        ))
    }

    /// The function, when symbolized.
    pub fn function(&self) -> Option<Function<'a>> {
        if let Some(named) = self.named {
            return Some(Function {
                name: &named.function,
                system_name: &named.function,
                filename: &named.file,
                start_line: 0,
            });
        }
        let p = self.partition;
        self.function.map(|(_, f)| Function {
            name: p.string(f.name),
            system_name: p.string(f.system_name),
            filename: p.string(f.filename),
            start_line: f.start_line,
        })
    }

    /// The function's name, when symbolized with a non-empty one.
    pub(crate) fn function_name(&self) -> Option<&'a str> {
        if let Some(named) = self.named {
            return (!named.function.is_empty()).then_some(&*named.function);
        }
        let (_, f) = self.function?;
        let name = self.partition.string(f.name);
        (!name.is_empty()).then_some(name)
    }

    /// The name pprof gives this frame's node at function granularity: the function name;
    /// else `[binary]` after the mapped file; else `<unknown>`.
    pub fn printable_name(&self) -> Cow<'a, str> {
        if let Some(name) = self.function_name() {
            return Cow::Borrowed(name);
        }
        match self.mapping() {
            Some((_, m)) if !m.filename.is_empty() => {
                let base = m.filename.rsplit('/').next().unwrap_or(m.filename);
                Cow::Owned(format!("[{base}]"))
            }
            _ => Cow::Borrowed("<unknown>"),
        }
    }

    /// The name a flame graph shows: the function name, or the address in its binary
    /// (`0x4a5b3c [app]`) when unsymbolized, so it can be symbolized later.
    pub fn display_name(&self) -> Cow<'a, str> {
        if let Some(name) = self.function_name() {
            return Cow::Borrowed(name);
        }
        Cow::Owned(match self.mapping() {
            Some((_, m)) if !m.filename.is_empty() => {
                let base = m.filename.rsplit('/').next().unwrap_or(m.filename);
                format!("{:#x} [{base}]", self.location.address)
            }
            _ => format!("{:#x}", self.location.address),
        })
    }

    /// The source file, when known.
    pub fn filename(&self) -> &'a str {
        if let Some(named) = self.named {
            return &named.file;
        }
        self.function
            .map_or("", |(_, f)| self.partition.string(f.filename))
    }
}

/// Checks that rows of partition `partition` come in index order without gaps.
pub(crate) fn expect_index(table: &str, id: u64, partition: u32, next: usize) -> Result<()> {
    let (p, i) = split_id(id);
    if p != partition || i as usize != next {
        return Err(Error::Corrupt(format!(
            "symbol partition {partition} of table {table:?}: expected row {next}, found {p}:{i}"
        )));
    }
    Ok(())
}
