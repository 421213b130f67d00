//! Unwind tables into the BPF program's maps: the rows of every file a sampled process maps
//! executable, once per file (by build id, so processes mapping the same library share its
//! rows), and per process the mappings that lead an address to its file's rows.
//!
//! The sampler thread calls [`TableLoader::refresh`] after each drain with the processes
//! it saw: a process whose mappings changed (exec, dlopen) is loaded again, so new code is
//! unwound from the next interval; a process that exited is dropped, and a file no process
//! uses any more gives its rows back. Until a process is loaded, and for files without
//! tables, the program walks frame pointers.
//!
//! Rows live in one array of 4 KiB chunks (256 rows), sized at load from
//! [`Config::unwind_table_bytes`](crate::Config); a file's rows are consecutive from a chunk
//! boundary. Freed chunks are reused only after a grace period (the next drain's, or one
//! waited for), when no program can still read them. An idle process keeps its tables:
//! building them again costs far more than the memory (a lightly loaded daemon sampled once
//! a minute would otherwise be compiled once a minute). When a new file does not fit, the
//! processes sampled longest ago are dropped to make room.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use object::Object;

use super::table::{UnwindRow, compile_file};
use super::walk::{Segment, load_bias, segments_of};
use crate::error::{Error, Result};
use crate::procfs::{ExecutableMapping, executable_mappings};
use crate::symbolize::FileStamp;

/// Rows per element of the rows array (`ROWS_PER_CHUNK` in sampler.bpf.c).
pub(crate) const ROWS_PER_CHUNK: usize = 256;
/// Bytes of one element of the rows array.
pub(crate) const CHUNK_BYTES: usize = ROWS_PER_CHUNK * UnwindRow::ENCODED_BYTES;
/// Mappings kept per process (`MAX_MAPPINGS` in sampler.bpf.c); addresses in later ones end
/// the walk as unmapped.
const MAX_MAPPINGS: usize = 256;

/// `struct chunk_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Chunk([u8; CHUNK_BYTES]);

/// `struct mapping_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct MappingValue {
    start: u64,
    end: u64,
    bias: u64,
    first_row: u32,
    rows: u32,
}

/// `struct process_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProcessValue {
    count: u32,
    /// Nanoseconds per clock tick, the unit of `started`.
    tick_ns: u32,
    /// When the process started, in clock ticks after boot: the program walks with these
    /// tables only the process that started then, not a later one given its pid.
    started: u64,
    mappings: [MappingValue; MAX_MAPPINGS],
}

// SAFETY: `repr(C)` structs of plain integers with no implicit padding (a byte array;
// 3×8+2×4 = 32 bytes; 4+4+8+256×32 bytes), so every bit pattern is a valid value.
#[allow(unsafe_code)]
unsafe impl aya::Pod for Chunk {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for ProcessValue {}

/// What the loaded tables take, and what loading them cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Processes whose user stacks the program unwinds with tables now.
    pub processes: usize,
    /// Distinct files whose rows are loaded now.
    pub files: usize,
    /// Rows loaded now.
    pub rows: u64,
    /// Bytes of the rows array in use now (whole chunks).
    pub bytes: u64,
    /// Bytes the rows array has ([`Config::unwind_table_bytes`](crate::Config)).
    pub capacity_bytes: u64,
    /// Files compiled and loaded since the start.
    pub files_loaded: u64,
    /// Files dropped since the start: no process maps them any more.
    pub files_dropped: u64,
    /// Files whose tables could not be built (unreadable, not ELF, bad CFI): their code is
    /// walked by frame pointer.
    pub files_failed: u64,
    /// Files not loaded because the rows array was full even after dropping every process
    /// not sampled this interval: walked by frame pointer.
    pub files_not_loaded_full: u64,
    /// Files whose table is larger than the whole rows array: walked by frame pointer
    /// (not compiled again while a process maps them, nor after, if they have a build
    /// id).
    pub files_too_large: u64,
    /// Processes dropped to make room for new files.
    pub processes_evicted: u64,
    /// Processes not given tables because the program's map of processes was full even
    /// after dropping one not sampled this interval: walked by frame pointer.
    pub processes_not_loaded: u64,
    /// Times every table was loaded again because the free space was in pieces.
    pub compactions: u64,
    /// Time spent reading files, compiling and loading tables, since the start.
    pub build_time: Duration,
}

/// A file's identity: its build id, or where it is when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileId {
    BuildId(Vec<u8>),
    Inode(String, u64),
}

#[derive(Debug)]
struct LoadedFile {
    /// First chunk and chunks; 0 chunks when the file has no table.
    first_chunk: u32,
    chunks: u32,
    rows: u32,
    segments: Vec<Segment>,
    /// Processes mapping it.
    refs: u32,
}

#[derive(Debug)]
struct LoadedProcess {
    /// When it started (`/proc/<pid>/stat`): another value is another process on a reused
    /// pid.
    started: u64,
    /// Hash of its executable mappings when loaded.
    signature: u64,
    files: Vec<FileId>,
    /// Whether it has an entry in the processes map (kernel threads map nothing).
    in_map: bool,
    /// Whether every file it maps was loaded: one that did not fit is tried again the next
    /// time the process is sampled.
    complete: bool,
    last_seen: u64,
}

/// Free chunks: ranges (start, length), sorted and merged; `pending` ones become free at
/// the next [`TableLoader::refresh`], after a grace period.
#[derive(Debug, Default)]
struct Chunks {
    free: Vec<(u32, u32)>,
    pending: Vec<(u32, u32)>,
    /// All there are.
    total: u32,
}

impl Chunks {
    fn new(total: u32) -> Self {
        Self {
            free: if total > 0 { vec![(0, total)] } else { vec![] },
            pending: vec![],
            total,
        }
    }

    /// First fit.
    fn alloc(&mut self, n: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, len)| len >= n)?;
        let (start, len) = self.free[i];
        if len == n {
            self.free.remove(i);
        } else {
            self.free[i] = (start + n, len - n);
        }
        Some(start)
    }

    fn release(&mut self, start: u32, n: u32) {
        if n > 0 {
            self.pending.push((start, n));
        }
    }

    fn settle(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.free.append(&mut self.pending);
        self.free.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.free.len());
        for &(start, len) in &self.free {
            match merged.last_mut() {
                Some((s, l)) if *s + *l == start => *l += len,
                _ => merged.push((start, len)),
            }
        }
        self.free = merged;
    }
}

/// Builds remembered as too large for the table space ([`TableLoader::never_fit`]).
const NEVER_FIT_KEPT: usize = 256;

/// Keeps the BPF maps' unwind tables in step with the sampled processes.
pub(crate) struct TableLoader {
    rows: Array<MapData, Chunk>,
    processes: BpfHashMap<MapData, u32, ProcessValue>,
    chunks: Chunks,
    files: HashMap<FileId, LoadedFile>,
    /// (device, inode) → identity, for files loaded now, with the file's stamp when it was
    /// read: a library is read once, not once per process, and a later file given the same
    /// inode number (once the first was deleted) is not taken for it.
    inodes: HashMap<(String, u64), (FileId, FileStamp)>,
    pids: HashMap<u32, LoadedProcess>,
    /// Builds (by build id) whose table is larger than the whole space, remembered after no
    /// process maps them, newest last, at most [`NEVER_FIT_KEPT`]: a program started again
    /// and again (a test suite's servers, a cron job) had its table compiled again at
    /// each start, to be thrown away (16 s of CPU for a debug build of the server, during
    /// which no interval was stored).
    never_fit: std::collections::VecDeque<FileId>,
    interval: u64,
    /// Set when a file did not fit.
    full: bool,
    /// Set when a file did not fit although the free chunks add up to what it needs.
    fragmented: bool,
    /// Set once this refresh has warned of a process the map of processes did not take.
    warned_map_full: bool,
    stats: TableStats,
}

impl TableLoader {
    /// Takes the program's `unwind_rows` (of `chunks` elements) and `unwind_processes`.
    pub(crate) fn new(
        rows: Array<MapData, Chunk>,
        processes: BpfHashMap<MapData, u32, ProcessValue>,
        chunks: u32,
    ) -> Self {
        Self {
            rows,
            processes,
            chunks: Chunks::new(chunks),
            files: HashMap::new(),
            inodes: HashMap::new(),
            pids: HashMap::new(),
            never_fit: std::collections::VecDeque::new(),
            interval: 0,
            full: false,
            fragmented: false,
            warned_map_full: false,
            stats: TableStats {
                capacity_bytes: u64::from(chunks) * CHUNK_BYTES as u64,
                ..TableStats::default()
            },
        }
    }

    /// What is loaded now, and the totals.
    pub(crate) fn stats(&self) -> TableStats {
        TableStats {
            processes: self.pids.values().filter(|p| p.in_map).count(),
            files: self.files.values().filter(|f| f.chunks > 0).count(),
            rows: self.files.values().map(|f| u64::from(f.rows)).sum(),
            bytes: self
                .files
                .values()
                .map(|f| u64::from(f.chunks) * CHUNK_BYTES as u64)
                .sum(),
            ..self.stats
        }
    }

    /// Drops the processes that exited, and loads, in order, the tables of `pids` (those
    /// sampled) whose mappings are new or changed. Call it after a drain (a grace period):
    /// chunks freed by the call before are reused from here on.
    pub(crate) fn refresh(&mut self, pids: &[u32]) {
        self.chunks.settle();
        self.interval += 1;
        let started = Instant::now();
        let exited: Vec<u32> = self
            .pids
            .keys()
            .copied()
            .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        for pid in exited {
            self.forget(pid);
        }
        for &pid in pids {
            self.pids
                .entry(pid)
                .and_modify(|p| p.last_seen = self.interval);
        }
        self.fragmented = false;
        self.warned_map_full = false;
        for &pid in pids {
            if let Err(e) = self.load(pid) {
                // Gone between its sample and now, most likely.
                tracing::debug!(pid, "unwind tables not loaded: {e}");
                self.forget(pid);
            }
        }
        if self.fragmented {
            self.compact(pids);
        }
        self.stats.build_time += started.elapsed();
    }

    /// Chunks for a new file: free ones, or else those of the processes sampled longest
    /// ago (not this interval's), dropped one by one, after a grace period.
    fn alloc(&mut self, chunks: u32) -> Option<u32> {
        if let Some(first) = self.chunks.alloc(chunks) {
            return Some(first);
        }
        let mut idle: Vec<(u64, u32)> = self
            .pids
            .iter()
            .filter(|(_, p)| p.last_seen < self.interval)
            .map(|(pid, p)| (p.last_seen, *pid))
            .collect();
        idle.sort_unstable();
        let free = |c: &Chunks| -> u32 { c.free.iter().chain(&c.pending).map(|r| r.1).sum() };
        let mut evicted = 0;
        for (_, pid) in idle {
            self.forget(pid);
            evicted += 1;
            if free(&self.chunks) >= chunks {
                // Enough in all; whether in one range shows once they are settled.
                crate::probe::wait_for_programs();
                self.chunks.settle();
                if let Some(first) = self.chunks.alloc(chunks) {
                    self.stats.processes_evicted += evicted;
                    return Some(first);
                }
            }
        }
        self.stats.processes_evicted += evicted;
        crate::probe::wait_for_programs();
        self.chunks.settle();
        let first = self.chunks.alloc(chunks);
        if first.is_none() && free(&self.chunks) >= chunks {
            // Room in all, but in pieces: start over once this refresh is done.
            self.fragmented = true;
        }
        first
    }

    /// Drops every table and loads `pids` again into one free range: what a file needs
    /// is contiguous, and after files come and go the free space can be in pieces too small
    /// for a new one although their sum is not.
    fn compact(&mut self, pids: &[u32]) {
        let all: Vec<u32> = self.pids.keys().copied().collect();
        for pid in all {
            self.forget(pid);
        }
        crate::probe::wait_for_programs();
        self.chunks.settle();
        self.stats.compactions += 1;
        tracing::info!(
            processes = pids.len(),
            "unwind tables fragmented: loading this interval's processes again"
        );
        for &pid in pids {
            if let Err(e) = self.load(pid) {
                tracing::debug!(pid, "unwind tables not loaded: {e}");
                self.forget(pid);
            }
        }
    }

    fn load(&mut self, pid: u32) -> Result<()> {
        let started = crate::procfs::start_time(pid)?;
        let mappings = executable_mappings(pid)?;
        let signature = signature(&mappings);
        // The program drops a process's entry when it exec()s; then it is loaded
        // again even if its mappings look the same.
        if self.pids.get(&pid).is_some_and(|p| {
            p.complete
                && p.started == started
                && p.signature == signature
                && (!p.in_map || self.processes.get(&pid, 0).is_ok())
        }) {
            return Ok(());
        }
        self.full = false;
        let mut value = ProcessValue {
            count: 0,
            tick_ns: crate::procfs::tick_ns(),
            started,
            mappings: [MappingValue::default(); MAX_MAPPINGS],
        };
        let mut files: Vec<FileId> = Vec::new();
        if mappings.len() > MAX_MAPPINGS {
            tracing::warn!(
                pid,
                mappings = mappings.len(),
                "more executable mappings than the unwinder keeps ({MAX_MAPPINGS}): frames in the rest end their stacks"
            );
        }
        for m in mappings.iter().take(MAX_MAPPINGS) {
            let Some(id) = self.file(pid, m) else {
                continue;
            };
            // Held from here, so that making room for a later file cannot drop it.
            if !files.contains(&id) {
                if let Some(f) = self.files.get_mut(&id) {
                    f.refs += 1;
                }
                files.push(id.clone());
            }
            let file = &self.files[&id];
            let Some(bias) = load_bias(&file.segments, m) else {
                continue;
            };
            value.mappings[value.count as usize] = MappingValue {
                start: m.start,
                end: m.end,
                bias,
                first_row: file.first_chunk * ROWS_PER_CHUNK as u32,
                rows: file.rows,
            };
            value.count += 1;
        }
        let in_map = value.count > 0;
        if in_map {
            let mut inserted = self.processes.insert(pid, value, 0);
            if inserted.is_err() {
                // The map of processes may be full: room is made by dropping the process
                // sampled longest ago (not this interval), as rows are made room for.
                let idle = self
                    .pids
                    .iter()
                    .filter(|(other, p)| **other != pid && p.in_map && p.last_seen < self.interval)
                    .min_by_key(|(_, p)| p.last_seen)
                    .map(|(&other, _)| other);
                if let Some(idle) = idle {
                    self.forget(idle);
                    self.stats.processes_evicted += 1;
                    inserted = self.processes.insert(pid, value, 0);
                }
            }
            if let Err(e) = inserted {
                self.release(files);
                self.stats.processes_not_loaded += 1;
                if !std::mem::replace(&mut self.warned_map_full, true) {
                    tracing::warn!(
                        pid,
                        "the unwinder's map of processes took no more: this interval's processes left out are walked by frame pointer (counted in processes_not_loaded): {e}"
                    );
                }
                return Err(Error::bpf(format!("loading the mappings of pid {pid}"), e));
            }
        } else {
            let _ = self.processes.remove(&pid);
        }
        let old = self.pids.insert(
            pid,
            LoadedProcess {
                started,
                signature,
                files,
                in_map,
                complete: !self.full,
                last_seen: self.interval,
            },
        );
        if let Some(old) = old {
            self.release(old.files);
        }
        Ok(())
    }

    /// The loaded file `m` maps, loading it if new; `None` when it cannot be read.
    fn file(&mut self, pid: u32, m: &ExecutableMapping) -> Option<FileId> {
        let inode = (m.device.clone(), m.inode);
        if m.path == crate::procfs::VDSO {
            // The kernel's image, the same in every process of this kernel: read from this
            // process (a process may put other bytes where its maps said its vDSO was
            // between the two reads, and they would serve every process).
            if let Some((id, _)) = self.inodes.get(&inode)
                && self.files.contains_key(id)
            {
                return Some(id.clone());
            }
            let own = crate::procfs::executable_mappings(std::process::id())
                .ok()?
                .into_iter()
                .find(|own| own.path == crate::procfs::VDSO)?;
            let bytes = crate::procfs::read_vdso(std::process::id(), &own).ok()?;
            let elf = object::File::parse(&*bytes).ok()?;
            return self.add(&elf, m, inode, FileStamp::default());
        }
        // The mapping's own map_files link first: the very file mapped, even when its path
        // now names another (a library upgraded under a running process) or none. Through
        // the process's root where that link cannot be opened (it needs CAP_SYS_ADMIN),
        // if the path still names the mapped file. Either is taken only if it is the
        // inode the maps line names: the mapping may have been replaced since that line
        // was read.
        // Read on demand: only the headers, notes and .eh_frame, not the whole file (a
        // server binary with debug info is a gigabyte).
        let file = std::fs::File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            .ok()
            .and_then(|f| stamp_of(&f, m).map(|stamp| (f, stamp)))
            .or_else(|| {
                let f = mapped_at_path(pid, m)?;
                stamp_of(&f, m).map(|stamp| (f, stamp))
            });
        let (file, stamp) = file?;
        if let Some((id, known)) = self.inodes.get(&inode)
            && *known == stamp
            && self.files.contains_key(id)
        {
            return Some(id.clone());
        }
        let cache = object::ReadCache::new(file);
        // Any local user's process may map a file made to make the parse copy gigabytes.
        if let Err(reason) = frostdb_pprof::symbolize::check_elf_headers(&cache) {
            self.stats.files_failed += 1;
            tracing::debug!(path = m.path, %reason, "an ELF file not read: no unwind table");
            return None;
        }
        let Ok(elf) = object::File::parse(&cache) else {
            self.stats.files_failed += 1;
            tracing::debug!(path = m.path, "not an ELF file: no unwind table");
            return None;
        };
        self.add(&elf, m, inode, stamp)
    }

    /// Compiles and loads the table of `elf`, which `m` maps, unless a file of the same
    /// build is loaded already.
    fn add<'d, R: object::ReadRef<'d>>(
        &mut self,
        elf: &object::File<'d, R>,
        m: &ExecutableMapping,
        inode: (String, u64),
        stamp: FileStamp,
    ) -> Option<FileId> {
        let id = match elf.build_id() {
            Ok(Some(b)) if !b.is_empty() => FileId::BuildId(b.to_vec()),
            _ => FileId::Inode(m.device.clone(), m.inode),
        };
        self.inodes.insert(inode, (id.clone(), stamp));
        if self.files.contains_key(&id) {
            return Some(id); // the same build at another path (another container)
        }
        let segments = segments_of(elf);
        if self.never_fit.contains(&id) {
            self.files.insert(id.clone(), empty(segments));
            return Some(id);
        }
        let table = match compile_file(elf) {
            Ok(t) => t,
            Err(e) => {
                self.stats.files_failed += 1;
                tracing::debug!(path = m.path, "no unwind table: {e}");
                self.files.insert(id.clone(), empty(segments));
                return Some(id);
            }
        };
        let rows = table.rows();
        let chunks = rows.len().div_ceil(ROWS_PER_CHUNK) as u32;
        if chunks == 0 {
            // Nothing to load: no room to make.
            self.files.insert(id.clone(), empty(segments));
            return Some(id);
        }
        if chunks > self.chunks.total {
            // It never fits: dropping other processes' tables cannot help, and compiling it
            // again each time it is sampled would cost as much every interval.
            self.stats.files_too_large += 1;
            if matches!(id, FileId::BuildId(_)) {
                if self.never_fit.len() == NEVER_FIT_KEPT {
                    self.never_fit.pop_front();
                }
                self.never_fit.push_back(id.clone());
            }
            tracing::warn!(
                path = m.path,
                rows = rows.len(),
                "an unwind table larger than the whole table space: this file's frames are walked by frame pointer (raise unwind_table_bytes)"
            );
            self.files.insert(id.clone(), empty(segments));
            return Some(id);
        }
        let Some(first_chunk) = self.alloc(chunks) else {
            self.stats.files_not_loaded_full += 1;
            self.full = true;
            tracing::warn!(
                path = m.path,
                rows = rows.len(),
                "the unwind table space is full: this file's frames are walked by frame pointer until room is made (raise unwind_table_bytes)"
            );
            return None;
        };
        for (i, part) in rows.chunks(ROWS_PER_CHUNK).enumerate() {
            let mut chunk = Chunk([0; CHUNK_BYTES]);
            for (j, row) in part.iter().enumerate() {
                chunk.0[j * UnwindRow::ENCODED_BYTES..][..UnwindRow::ENCODED_BYTES]
                    .copy_from_slice(&row.encode());
            }
            if let Err(e) = self.rows.set(first_chunk + i as u32, chunk, 0) {
                tracing::warn!(path = m.path, "loading unwind rows failed: {e}");
                self.chunks.release(first_chunk, chunks);
                self.stats.files_failed += 1;
                self.files.insert(id.clone(), empty(segments));
                return Some(id);
            }
        }
        self.stats.files_loaded += 1;
        tracing::debug!(
            path = m.path,
            rows = rows.len(),
            bytes = u64::from(chunks) * CHUNK_BYTES as u64,
            "unwind table loaded"
        );
        self.files.insert(
            id.clone(),
            LoadedFile {
                first_chunk,
                chunks,
                rows: rows.len() as u32,
                segments,
                refs: 0,
            },
        );
        Some(id)
    }

    fn forget(&mut self, pid: u32) {
        if let Some(p) = self.pids.remove(&pid) {
            if p.in_map {
                let _ = self.processes.remove(&pid);
            }
            self.release(p.files);
        }
    }

    fn release(&mut self, files: Vec<FileId>) {
        for id in files {
            if let Some(f) = self.files.get_mut(&id) {
                f.refs = f.refs.saturating_sub(1);
            }
        }
        self.sweep();
    }

    /// Drops the files no process maps.
    fn sweep(&mut self) {
        let unused: Vec<FileId> = self
            .files
            .iter()
            .filter(|(_, f)| f.refs == 0)
            .map(|(id, _)| id.clone())
            .collect();
        for id in unused {
            let f = self.files.remove(&id).expect("listed above");
            if f.chunks > 0 {
                self.chunks.release(f.first_chunk, f.chunks);
                self.stats.files_dropped += 1;
            }
        }
        let files = &self.files;
        self.inodes.retain(|_, (id, _)| files.contains_key(id));
    }
}

/// A file whose code is walked by frame pointer.
fn empty(segments: Vec<Segment>) -> LoadedFile {
    LoadedFile {
        first_chunk: 0,
        chunks: 0,
        rows: 0,
        segments,
        refs: 0,
    }
}

fn signature(mappings: &[ExecutableMapping]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in mappings {
        (m.start, m.end, m.offset, &m.device, m.inode).hash(&mut h);
    }
    h.finish()
}

/// The file at `m`'s path through `pid`'s root, opened without waiting (a FIFO put at the
/// path would wait for a writer for ever); whether it is still the file mapped (the same
/// inode; a file upgraded since is another) is for [`stamp_of`] to say.
fn mapped_at_path(pid: u32, m: &ExecutableMapping) -> Option<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let path = format!("/proc/{pid}/root{}", m.path);
    let fd = rustix::fs::open(
        path.as_str(),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .ok()?;
    Some(std::fs::File::from(fd))
}

/// The stamp of `file` ([`FileStamp`]), if it is a regular file of the inode `m` names.
fn stamp_of(file: &std::fs::File, m: &ExecutableMapping) -> Option<FileStamp> {
    FileStamp::of_file(file).filter(|stamp| stamp.inode() == m.inode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_allocated_first_fit_and_freed_after_the_grace_period() {
        let mut c = Chunks::new(10);
        assert_eq!(c.alloc(4), Some(0));
        assert_eq!(c.alloc(4), Some(4));
        assert_eq!(c.alloc(4), None);
        c.release(0, 4);
        // Not reusable until settled: a program may still read them.
        assert_eq!(c.alloc(3), None);
        c.settle();
        assert_eq!(c.alloc(3), Some(0));
        c.release(0, 3);
        c.release(4, 4);
        c.settle();
        // 0..3, 3..4 (never taken), 4..8 and 8..10 merge into one range.
        assert_eq!(c.free, vec![(0, 10)]);
        assert_eq!(c.alloc(10), Some(0));
        assert!(Chunks::new(0).alloc(1).is_none());
    }
}
