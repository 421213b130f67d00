//! Addresses to function names, in user space.
//!
//! User addresses go through blazesym in two steps: normalization (the process's
//! `/proc/<pid>/maps` turns an address into a file offset in a module with a build id) and
//! symbolization of that file offset in the module's ELF symbols and DWARF. Results are
//! cached by (build id, file offset), so a library every process maps (libc) is symbolized
//! once, not once per process, and a steady workload costs only cache lookups. Kernel
//! addresses are symbolized from /proc/kallsyms and cached by address.
//!
//! What cannot be symbolized is kept, not dropped: the location keeps its module (path,
//! build id) and file offset, so it can be symbolized later where the debug info is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::normalize::{Normalizer, UserMeta};
use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer as Blazesym};
use blazesym::{MaybeDefault, Pid};

use crate::procfs::ProcessInfo;

/// Past this many cached addresses the caches start again (bounded memory).
const CACHE_LIMIT: usize = 1 << 20;

/// blazesym's readers keep every file they open (a descriptor, and a file's parsed debug
/// info) for as long as they live: they are made again once they are this old, or once
/// this process holds this many more descriptors than when they were made (a local user
/// touching the files its process maps made one more each interval, until the server
/// could accept no connection).
const READERS_MAX_AGE: Duration = Duration::from_secs(3600);
const READERS_MAX_NEW_FDS: usize = 1024;

/// A file a location's address belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Module {
    /// Path as the process maps it, or `[kernel.kallsyms]`, or `[unknown]`.
    pub(crate) path: String,
    /// GNU build id, hex; empty when unknown.
    pub(crate) build_id: String,
}

impl Module {
    /// Where addresses outside any file go.
    fn unknown() -> Self {
        Module {
            path: "[unknown]".into(),
            build_id: String::new(),
        }
    }
}

/// One frame of a symbolized address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Line {
    pub(crate) function: Arc<str>,
    pub(crate) file: Arc<str>,
    pub(crate) line: u32,
}

/// An address resolved as far as possible.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub(crate) module: Arc<Module>,
    /// File offset in `module` for user code; the address itself for kernel and unknown.
    pub(crate) address: u64,
    /// Innermost (inlined) first; empty when the address could not be symbolized.
    pub(crate) lines: Arc<[Line]>,
}

impl Resolved {
    /// A frame standing for a stack that could not be read, so its samples still count.
    pub(crate) fn placeholder(name: &str) -> Self {
        Resolved {
            module: Arc::new(Module::unknown()),
            address: 0,
            lines: Arc::from([Line {
                function: Arc::from(name),
                file: Arc::from(""),
                line: 0,
            }]),
        }
    }
}

/// What symbolization cost and found, summed over the sampler's life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SymbolizeStats {
    /// Addresses looked up (unique per process per interval).
    pub addresses: u64,
    /// Of those, answered from the caches.
    pub cache_hits: u64,
    /// Addresses left without a function name.
    pub unsymbolized: u64,
    /// Time spent, including reading /proc/<pid>/maps and ELF files.
    pub elapsed: Duration,
    /// Times blazesym's readers were made again, closing the files they kept.
    pub readers_renewed: u64,
}

pub(crate) struct Symbolizer {
    normalizer: Normalizer,
    blazesym: Blazesym,
    /// When the two were made, and this process's descriptors then.
    readers_made: (Instant, usize),
    /// This kernel's vDSO image (from this process's memory, the same in every process),
    /// in a memory file blazesym reads at its `/proc/self/fd` path, and the image's first
    /// virtual address; `None` until needed, `Some(None)` if it could not be had.
    vdso: Option<Option<(std::os::fd::OwnedFd, PathBuf, u64)>>,
    user: HashMap<(Arc<Module>, u64), Arc<[Line]>>,
    kernel: HashMap<u64, Arc<[Line]>>,
    modules: HashMap<Module, Arc<Module>>,
    /// Per file (as its path names it now), whether blazesym may read it
    /// ([`frostdb_pprof::symbolize::check_elf_file`]): any local user's process may map a
    /// file made to exhaust or abort its reader.
    readable: HashMap<FileStamp, bool>,
    /// Build ids of other mount namespaces' files ([`build_id_of`]), per file.
    build_ids: HashMap<FileStamp, String>,
    kernel_module: Arc<Module>,
    unknown: Arc<Module>,
    pub(crate) stats: SymbolizeStats,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("user_cached", &self.user.len())
            .field("kernel_cached", &self.kernel.len())
            .finish_non_exhaustive()
    }
}

impl Symbolizer {
    pub(crate) fn new() -> Self {
        let (normalizer, blazesym) = readers();
        Self {
            normalizer,
            blazesym,
            readers_made: (Instant::now(), open_fds()),
            vdso: None,
            user: HashMap::new(),
            kernel: HashMap::new(),
            modules: HashMap::new(),
            readable: HashMap::new(),
            build_ids: HashMap::new(),
            kernel_module: Arc::new(Module {
                path: "[kernel.kallsyms]".into(),
                build_id: kernel_build_id().unwrap_or_default(),
            }),
            unknown: Arc::new(Module::unknown()),
            stats: SymbolizeStats::default(),
        }
    }

    /// Whether blazesym may read `open` (the file `path` names in process `pid`), whose
    /// stamp is `stamp`: checked once per file, the verdicts kept in `verdicts`.
    fn readable(
        verdicts: &mut HashMap<FileStamp, bool>,
        pid: u32,
        path: &std::path::Path,
        open: &std::path::Path,
        stamp: FileStamp,
    ) -> bool {
        *verdicts.entry(stamp).or_insert_with(|| {
            frostdb_pprof::symbolize::check_elf_file(open)
                .inspect_err(|reason| {
                    tracing::warn!(pid, module = %path.display(), %reason, "a file not symbolized");
                })
                .is_ok()
        })
    }

    /// Resolves the user addresses of one process (`addresses` unique).
    pub(crate) fn user(
        &mut self,
        pid: u32,
        info: &ProcessInfo,
        addresses: &[u64],
    ) -> Vec<Resolved> {
        let started = Instant::now();
        self.trim();
        self.stats.addresses += addresses.len() as u64;
        let unknown = |s: &Self, a: u64| Resolved {
            module: s.unknown.clone(),
            address: a,
            lines: Arc::from([]),
        };
        let normalized = match self
            .normalizer
            .normalize_user_addrs(Pid::from(pid), addresses)
        {
            Ok(n) => n,
            Err(e) => {
                // The process exited before its interval ended: its maps are gone.
                tracing::debug!(pid, "cannot normalize addresses: {e}");
                self.stats.unsymbolized += addresses.len() as u64;
                self.stats.elapsed += started.elapsed();
                return addresses.iter().map(|&a| unknown(self, a)).collect();
            }
        };
        // Module per meta entry, the path to open it at, and its stamp where one was taken;
        // None for addresses outside any file.
        type Meta = (Arc<Module>, PathBuf, Option<FileStamp>);
        let mut metas: Vec<Option<Meta>> = Vec::new();
        for meta in &normalized.meta {
            let UserMeta::Elf(elf) = meta else {
                metas.push(None);
                continue;
            };
            let open = if info.same_mount_ns {
                elf.path.clone()
            } else {
                PathBuf::from(format!("/proc/{pid}/root"))
                    .join(elf.path.strip_prefix("/").unwrap_or(&elf.path))
            };
            // blazesym reads the build id at the path in this process's mount namespace:
            // another container's file is the one its process sees. Its build id names it
            // to the server's symbolizer even where it cannot be read here. (In this
            // namespace the file is stamped only when one of its addresses is a miss.)
            let (build_id, stamp) = match info.same_mount_ns {
                true => (elf.build_id.as_deref().map(hex).unwrap_or_default(), None),
                false => {
                    let stamp = FileStamp::of(&open);
                    let build_id = stamp.map_or_else(String::new, |stamp| {
                        self.build_ids
                            .entry(stamp)
                            .or_insert_with(|| build_id_of(&open).unwrap_or_default())
                            .clone()
                    });
                    (build_id, stamp)
                }
            };
            let module = Module {
                path: elf.path.to_string_lossy().into_owned(),
                build_id,
            };
            metas.push(Some((intern(&mut self.modules, module), open, stamp)));
        }
        let mut out: Vec<Option<Resolved>> = vec![None; addresses.len()];
        // Addresses in no file: the vDSO, JIT code.
        let mut outside: Vec<usize> = Vec::new();
        // Misses, grouped by the file to open.
        let mut misses: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        for (i, &(offset, meta)) in normalized.outputs.iter().enumerate() {
            match &metas[meta] {
                Some((module, _, _)) => match self.user.get(&(module.clone(), offset)) {
                    Some(lines) => {
                        self.stats.cache_hits += 1;
                        out[i] = Some(Resolved {
                            module: module.clone(),
                            address: offset,
                            lines: lines.clone(),
                        });
                    }
                    None => misses.entry(meta).or_default().push((i, offset)),
                },
                None => outside.push(i),
            }
        }
        for (meta, wanted) in misses {
            let (module, open, stamp) = metas[meta].clone().expect("misses only for ELF metas");
            // Checked per file as it is now, not per path: a path whose file was replaced
            // since (an upgrade, or a container's user swapping a checked file for one made
            // to exhaust its reader) is checked again. blazesym re-reads a file whose
            // metadata changed the same way. A file gone is read by nobody.
            let stamp = match info.same_mount_ns {
                true => FileStamp::of(&open),
                false => stamp,
            };
            let readable = stamp.is_some_and(|stamp| {
                let path = std::path::Path::new(&module.path);
                Self::readable(&mut self.readable, pid, path, &open, stamp)
            });
            let offsets: Vec<u64> = wanted.iter().map(|&(_, o)| o).collect();
            let results = match readable {
                true => self
                    .blazesym
                    .symbolize(&Source::Elf(Elf::new(open)), Input::FileOffset(&offsets))
                    .unwrap_or_else(|e| {
                        tracing::debug!(pid, module = %module.path, "cannot symbolize: {e}");
                        Vec::new()
                    }),
                false => Vec::new(),
            };
            for (k, &(i, offset)) in wanted.iter().enumerate() {
                let lines = match results.get(k) {
                    Some(Symbolized::Sym(sym)) => lines_of(sym),
                    _ => Arc::from([]),
                };
                self.user.insert((module.clone(), offset), lines.clone());
                out[i] = Some(Resolved {
                    module: module.clone(),
                    address: offset,
                    lines,
                });
            }
        }
        if !outside.is_empty() {
            // The vDSO's, from this kernel's image. Nothing else outside files is read: a
            // JIT's perf map is a file its process may make a FIFO (an open of it waits
            // for ever), and blazesym's reader of a process's memory reads its maps again
            // and parses whatever file is mapped by then, checked by nothing.
            let vdso = crate::procfs::executable_mappings(pid)
                .ok()
                .and_then(|maps| maps.into_iter().find(|m| m.path == crate::procfs::VDSO));
            if let (Some(m), Some((_, image, base))) = (vdso, self.vdso_image()) {
                let (image, base) = (image.clone(), *base);
                let inside: Vec<usize> = outside
                    .iter()
                    .copied()
                    .filter(|&i| (m.start..m.end).contains(&addresses[i]))
                    .collect();
                let offsets: Vec<u64> = inside
                    .iter()
                    .map(|&i| addresses[i] - m.start + base)
                    .collect();
                let results = self
                    .blazesym
                    .symbolize(&Source::Elf(Elf::new(image)), Input::VirtOffset(&offsets))
                    .unwrap_or_else(|e| {
                        tracing::debug!(pid, "cannot symbolize the vDSO: {e}");
                        Vec::new()
                    });
                let module = intern(
                    &mut self.modules,
                    Module {
                        path: crate::procfs::VDSO.into(),
                        build_id: String::new(),
                    },
                );
                for (k, &i) in inside.iter().enumerate() {
                    if let Some(Symbolized::Sym(sym)) = results.get(k) {
                        out[i] = Some(Resolved {
                            module: module.clone(),
                            address: addresses[i],
                            lines: lines_of(sym),
                        });
                    }
                }
            }
        }
        let out: Vec<Resolved> = out
            .into_iter()
            .zip(addresses)
            .map(|(r, &a)| r.unwrap_or_else(|| unknown(self, a)))
            .collect();
        self.stats.unsymbolized += out.iter().filter(|r| r.lines.is_empty()).count() as u64;
        self.stats.elapsed += started.elapsed();
        out
    }

    /// Resolves kernel addresses (`addresses` unique) from /proc/kallsyms.
    pub(crate) fn kernel(&mut self, addresses: &[u64]) -> Vec<Resolved> {
        let started = Instant::now();
        self.trim();
        self.stats.addresses += addresses.len() as u64;
        let misses: Vec<u64> = addresses
            .iter()
            .copied()
            .filter(|a| !self.kernel.contains_key(a))
            .collect();
        self.stats.cache_hits += (addresses.len() - misses.len()) as u64;
        if !misses.is_empty() {
            let source = Source::Kernel(Kernel {
                kallsyms: MaybeDefault::Default,
                vmlinux: MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            });
            let results = self
                .blazesym
                .symbolize(&source, Input::AbsAddr(&misses))
                .unwrap_or_else(|e| {
                    tracing::debug!("cannot symbolize kernel addresses: {e}");
                    Vec::new()
                });
            for (k, &a) in misses.iter().enumerate() {
                let lines = match results.get(k) {
                    Some(Symbolized::Sym(sym)) => lines_of(sym),
                    _ => Arc::from([]),
                };
                self.kernel.insert(a, lines);
            }
        }
        let out: Vec<Resolved> = addresses
            .iter()
            .map(|&a| Resolved {
                module: self.kernel_module.clone(),
                address: a,
                lines: self.kernel[&a].clone(),
            })
            .collect();
        self.stats.unsymbolized += out.iter().filter(|r| r.lines.is_empty()).count() as u64;
        self.stats.elapsed += started.elapsed();
        out
    }

    fn trim(&mut self) {
        if self.user.len() + self.kernel.len() > CACHE_LIMIT {
            self.user.clear();
            self.kernel.clear();
            self.modules.clear();
            self.readable.clear();
            self.build_ids.clear();
            self.renew_readers();
        }
    }

    /// Makes blazesym's readers again when they are old or have opened many files: what
    /// they keep is only ever dropped with them. Called once an interval.
    pub(crate) fn end_interval(&mut self) {
        let (made, fds) = self.readers_made;
        if made.elapsed() >= READERS_MAX_AGE || open_fds() > fds + READERS_MAX_NEW_FDS {
            self.renew_readers();
        }
    }

    fn renew_readers(&mut self) {
        (self.normalizer, self.blazesym) = readers();
        self.readers_made = (Instant::now(), open_fds());
        self.stats.readers_renewed += 1;
    }

    /// [`Symbolizer::vdso`], made the first time it is asked for.
    fn vdso_image(&mut self) -> Option<&(std::os::fd::OwnedFd, PathBuf, u64)> {
        self.vdso
            .get_or_insert_with(|| {
                own_vdso()
                    .inspect_err(|e| tracing::warn!("the vDSO is not symbolized: {e}"))
                    .ok()
            })
            .as_ref()
    }
}

/// A normalizer and a symbolizer as this module uses them.
fn readers() -> (Normalizer, Blazesym) {
    (
        Normalizer::builder()
            .enable_build_ids(true)
            .enable_build_id_caching(true)
            .build(),
        Blazesym::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            // Demangled by `frostdb_pprof::symbolize::demangle`, which bounds what it
            // writes (a C++ name of nested templates demangles to gigabytes).
            .enable_demangling(false)
            .build(),
    )
}

/// The descriptors this process has open (0 if they cannot be listed).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// This process's vDSO image in a memory file, its path and its first virtual address.
fn own_vdso() -> Result<(std::os::fd::OwnedFd, PathBuf, u64), String> {
    use object::{Object, ObjectSegment};
    let me = std::process::id();
    let mapping = crate::procfs::executable_mappings(me)
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|m| m.path == crate::procfs::VDSO)
        .ok_or("this process maps no vDSO")?;
    let image = crate::procfs::read_vdso(me, &mapping).map_err(|e| e.to_string())?;
    let base = object::File::parse(&*image)
        .map_err(|e| format!("the vDSO image: {e}"))?
        .segments()
        .map(|s| s.address())
        .min()
        .unwrap_or(0);
    let fd = rustix::fs::memfd_create("frostdb-vdso", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| format!("memfd_create: {e}"))?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, &image).map_err(|e| format!("the vDSO image: {e}"))?;
    let fd = std::os::fd::OwnedFd::from(file);
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ));
    Ok((fd, path, base))
}

fn intern(modules: &mut HashMap<Module, Arc<Module>>, module: Module) -> Arc<Module> {
    modules
        .entry(module)
        .or_insert_with_key(|m| Arc::new(m.clone()))
        .clone()
}

/// The frames blazesym found, innermost first (blazesym lists inlined calls outermost first).
fn lines_of(sym: &Sym<'_>) -> Arc<[Line]> {
    let file = |ci: Option<&blazesym::symbolize::CodeInfo<'_>>| -> (Arc<str>, u32) {
        match ci {
            Some(ci) => (
                Arc::from(ci.to_path().to_string_lossy().as_ref()),
                ci.line.unwrap_or(0),
            ),
            None => (Arc::from(""), 0),
        }
    };
    let mut lines = Vec::with_capacity(1 + sym.inlined.len());
    for inlined in sym.inlined.iter().rev() {
        let (f, l) = file(inlined.code_info.as_ref());
        lines.push(Line {
            function: Arc::from(frostdb_pprof::symbolize::demangle(&inlined.name)),
            file: f,
            line: l,
        });
    }
    let (f, l) = file(sym.code_info.as_deref());
    lines.push(Line {
        function: Arc::from(frostdb_pprof::symbolize::demangle(&sym.name)),
        file: f,
        line: l,
    });
    lines.into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The running kernel's GNU build id, from the ELF notes in /sys/kernel/notes.
fn kernel_build_id() -> Option<String> {
    let notes = std::fs::read("/sys/kernel/notes").ok()?;
    let mut at = 0;
    let word = |i: usize| -> Option<usize> {
        Some(u32::from_ne_bytes(notes.get(i..i + 4)?.try_into().ok()?) as usize)
    };
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at)?, word(at + 4)?, word(at + 8)?);
        let name_at = at + 12;
        let desc_at = name_at + namesz.next_multiple_of(4);
        if kind == 3 && notes.get(name_at..name_at + namesz)? == b"GNU\0" {
            return Some(hex(notes.get(desc_at..desc_at + descsz)?));
        }
        at = desc_at + descsz.next_multiple_of(4);
    }
    None
}

/// The GNU build id (hex) of the ELF file at `path`, read as the unwinder reads its files:
/// only the headers and notes, once the section headers are checked
/// ([`frostdb_pprof::symbolize::check_elf_headers`]).
fn build_id_of(path: &std::path::Path) -> Option<String> {
    use object::Object;
    let cache = object::ReadCache::new(std::fs::File::open(path).ok()?);
    frostdb_pprof::symbolize::check_elf_headers(&cache).ok()?;
    let elf = object::File::parse(&cache).ok()?;
    Some(hex(elf.build_id().ok()??))
}

/// Which file a path names now: its device, inode, size, and modification and change
/// times (a file's owner may set its modification time back after rewriting it in place;
/// not its change time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct FileStamp {
    device: u64,
    inode: u64,
    size: u64,
    modified_ns: i128,
    changed_ns: i128,
}

impl FileStamp {
    /// The stamp of the regular file at `path`; `None` for anything else: gone, or a FIFO
    /// or device (opening a FIFO waits for a writer, for ever), or with a `.dwp` beside it
    /// that is not a regular file (blazesym opens it unasked).
    fn of(path: &std::path::Path) -> Option<Self> {
        let mut dwp = path.as_os_str().to_owned();
        dwp.push(".dwp");
        let dwp_odd = std::fs::metadata(&dwp).is_ok_and(|d| !d.is_file());
        if dwp_odd {
            return None;
        }
        Self::of_metadata(&std::fs::metadata(path).ok()?)
    }

    /// The stamp of an open file, if it is a regular file.
    pub(crate) fn of_file(file: &std::fs::File) -> Option<Self> {
        Self::of_metadata(&file.metadata().ok()?)
    }

    fn of_metadata(m: &std::fs::Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        if !m.is_file() {
            return None;
        }
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(Self {
            device: m.dev(),
            inode: m.ino(),
            size: m.size(),
            modified_ns: ns(m.mtime(), m.mtime_nsec()),
            changed_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }

    /// The file's inode.
    pub(crate) fn inode(&self) -> u64 {
        self.inode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_with_a_known_name() -> u64 {
        std::hint::black_box(7)
    }

    /// A path's file replaced (renamed over, as package managers and deploys do) is another
    /// file to check: the verdict on the first is not the second's.
    #[test]
    fn a_file_replaced_at_its_path_is_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"first").unwrap();
        let first = FileStamp::of(&path).unwrap();
        assert_eq!(FileStamp::of(&path), Some(first));
        let next = dir.path().join("lib.so.new");
        std::fs::write(&next, b"first").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_ne!(FileStamp::of(&path), Some(first));
        // Rewritten in place at its size, its modification time set back: only its change
        // time tells, once the file system's clock (coarse: a few ms) has moved on.
        let stamp = FileStamp::of(&path).unwrap();
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        let rewritten = (0..2000).any(|_| {
            std::fs::write(&path, b"other").unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(modified).unwrap();
            let again = FileStamp::of(&path).unwrap();
            assert_eq!(
                (again.inode, again.size, again.modified_ns),
                (stamp.inode, stamp.size, stamp.modified_ns)
            );
            again != stamp || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                false
            }
        });
        assert!(rewritten, "a file rewritten in place has the stamp it had");
        // Not a regular file, or a `.dwp` beside it that is not: nothing to read.
        let dwp = dir.path().join("lib.so.dwp");
        std::fs::create_dir(&dwp).unwrap();
        assert_eq!(FileStamp::of(&path), None);
        std::fs::remove_dir(&dwp).unwrap();
        assert_eq!(FileStamp::of(dir.path()), None);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(FileStamp::of(&path), None);
    }

    /// A process in another mount namespace is named by the build id of the file it maps,
    /// not of whatever this process finds at that path: here nothing (the path is an empty
    /// directory out here, a tmpfs holding a copy of `sleep` in there).
    #[test]
    fn another_mount_namespaces_file_is_named_by_its_own_build_id() {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("prog");
        let script = format!(
            "mount -t tmpfs none {d} && cp /usr/bin/sleep {p} && exec {p} 60",
            d = dir.path().display(),
            p = prog.display()
        );
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .spawn()
            .expect("unshare (util-linux)");
        let pid = child.id();
        // Until the child has execed the copy: polled, as nothing else tells.
        let mut mapping = None;
        for _ in 0..3000 {
            if let Some(status) = child.try_wait().unwrap() {
                // Mounting needs CAP_SYS_ADMIN: a container without it cannot run this.
                eprintln!("skipped: a mount namespace of our own cannot be made here ({status})");
                return;
            }
            mapping = crate::procfs::executable_mappings(pid)
                .unwrap_or_default()
                .into_iter()
                .find(|m| std::path::Path::new(&m.path) == prog);
            if mapping.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mapping = mapping.expect("the child maps its copy within 30 s");
        assert!(!prog.exists(), "out here the path names nothing");
        let info = ProcessInfo::read(pid, "");
        let mut s = Symbolizer::new();
        let out = s.user(pid, &info, &[mapping.start]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!info.same_mount_ns);
        let sleep = frostdb_pprof::symbolize::file_build_id(std::path::Path::new("/usr/bin/sleep"))
            .unwrap()
            .expect("Debian's sleep has a build id");
        assert_eq!(out[0].module.path, prog.display().to_string());
        assert_eq!(out[0].module.build_id, sleep);
    }

    /// An address outside any file (here on the heap) is not looked up in its process's
    /// perf map: a FIFO put there made the open wait for a writer for ever, and the
    /// sampler's thread with it.
    #[test]
    fn an_address_outside_files_does_not_open_the_perf_map() {
        let me = std::process::id();
        let fifo = format!("/tmp/perf-{me}.map");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let heap = Box::new([0u8; 64]);
        let address = heap.as_ptr() as u64;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let info = ProcessInfo::read(me, "");
            let out = Symbolizer::new().user(me, &info, &[address]);
            tx.send(out[0].lines.len()).unwrap();
        });
        // A bound on a wait that never ends otherwise, not a sleep: it answers at once.
        let got = rx.recv_timeout(Duration::from_secs(60));
        std::fs::remove_file(&fifo).unwrap();
        assert_eq!(got, Ok(0), "the symbolizer waited on the perf map's FIFO");
    }

    /// Renewing blazesym's readers closes the files they kept open: the only way they are
    /// ever closed. They are renewed once they are old.
    #[test]
    fn renewing_the_readers_closes_the_files_they_kept() {
        let mut s = Symbolizer::new();
        let me = ProcessInfo::read(std::process::id(), "");
        let address = a_function_with_a_known_name as *const () as u64;
        s.user(std::process::id(), &me, &[address]);
        let kept = open_fds();
        s.readers_made.0 = Instant::now()
            .checked_sub(READERS_MAX_AGE)
            .expect("an hour after boot");
        s.end_interval();
        assert_eq!(s.stats.readers_renewed, 1);
        assert!(
            open_fds() < kept,
            "{} descriptors, {kept} before",
            open_fds()
        );
        s.end_interval();
        assert_eq!(s.stats.readers_renewed, 1, "renewed only when due");
    }

    #[test]
    fn symbolizes_this_process() {
        let mut s = Symbolizer::new();
        let me = ProcessInfo::read(std::process::id(), "");
        let address = a_function_with_a_known_name as *const () as u64;
        let unmapped = 8u64; // page zero is never mapped
        let out = s.user(std::process::id(), &me, &[address, unmapped]);
        let names: Vec<&str> = out[0].lines.iter().map(|l| &*l.function).collect();
        assert!(
            names
                .iter()
                .any(|n| n.contains("a_function_with_a_known_name")),
            "{names:?}"
        );
        assert!(
            out[0].module.path.ends_with(
                &*std::env::current_exe()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
            )
        );
        assert!(
            !out[0].module.build_id.is_empty(),
            "rustc links with a build id"
        );
        // Kept, with no name, rather than dropped.
        assert_eq!(
            (out[1].module.path.as_str(), out[1].address),
            ("[unknown]", unmapped)
        );
        assert!(out[1].lines.is_empty());
        // Again: from the cache.
        let hits = s.stats.cache_hits;
        let again = s.user(std::process::id(), &me, &[address]);
        assert_eq!(s.stats.cache_hits, hits + 1);
        assert_eq!(again[0].lines, out[0].lines);
    }
}
