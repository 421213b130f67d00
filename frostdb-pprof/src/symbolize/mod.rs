//! Frames without function names resolved from debug info, by build id.
//!
//! A location a profile stored as an address (an eBPF profiler's frame, a stripped
//! binary's, Parca Agent's native frames) keeps its mapping's build id, path and file
//! offset. [`Symbolizer`] finds the debug file of a build id, in order, in its on-disk
//! cache, among the files uploaded to the tenant ([`crate::debuginfo::DebugInfoStore`]:
//! Parca's `DebuginfoService` and the server's upload API), then on the debuginfod servers
//! it is given (or `DEBUGINFOD_URLS`), and resolves the file offsets in it with blazesym:
//! function names demangled, file and line, inlined calls as frames of their own. A build
//! id nobody has is remembered as a miss for [`SymbolizerOptions::miss_ttl`], so a profile
//! full of them costs one round of asking, not one per query.
//!
//! Bounded: the cache holds at most [`SymbolizerOptions::cache_bytes`] (least recently used
//! files deleted), a fetched file at most [`SymbolizerOptions::max_file_bytes`], a fetch
//! takes at most [`SymbolizerOptions::fetch_timeout`], and [`Symbolizer::symbolize_profile`]
//! stops asking once its budget is spent, leaving what it did not reach as addresses.

mod cache;
mod debuginfod;
mod dwarf_check;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use cache::CacheStats;

/// Whether blazesym may read the ELF file at `path` (and the file its debug link names
/// beside it): its section headers, DWARF nesting, work and line tables are checked first,
/// as every debug file this symbolizer reads is. An error says why not. For a reader of
/// files it did not make (a sampler reading the files other processes map).
pub fn check_elf_file(path: &Path) -> Result<(), String> {
    dwarf_check::check(path)
}

/// Whether `object`'s parse of an ELF file may read `data`: section headers that would make
/// it copy many times the file's bytes are refused, before it is parsed.
pub fn check_elf_headers<'d>(data: impl object::ReadRef<'d>) -> Result<(), String> {
    dwarf_check::sections_fit(data)
}
pub use debuginfod::urls_from_env;

use crate::debuginfo::DebugInfoStore;
use crate::proto::{Function, Line, Profile};

/// Why a debug file could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the cache could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// A file over a limit.
    #[error("{0}")]
    TooLarge(String),
    /// A debuginfod server did not answer as it should.
    #[error("{0}")]
    Fetch(String),
    /// The uploaded files could not be read.
    #[error("uploaded debug info: {0}")]
    Store(#[from] crate::debuginfo::Error),
}

impl Error {
    fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// The symbolizer's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a [`Symbolizer`] finds debug files.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SymbolizerOptions {
    /// The directory of the on-disk cache of debug files.
    pub cache_dir: PathBuf,
    /// Most bytes the cache holds (default 4 GiB); the least recently used files go first.
    pub cache_bytes: u64,
    /// debuginfod servers asked, in order, after the uploaded files (default:
    /// `DEBUGINFOD_URLS`, space-separated).
    pub debuginfod_urls: Vec<String>,
    /// Longest a fetch of one file may take (default 30 s).
    pub fetch_timeout: Duration,
    /// Largest debug file fetched (default 1 GB, Parca's upload limit).
    pub max_file_bytes: u64,
    /// How long a build id nobody had is not asked for again (default 5 minutes).
    pub miss_ttl: Duration,
    /// Most debug files read at once, by queries and the background resolver together
    /// (default 2): each holds what blazesym parses of one file.
    pub workers: usize,
    /// A process-wide budget each file read reserves its size from first (what blazesym
    /// parses of a file stays below it: measured about a third); a file the budget cannot
    /// take now is left for later, its frames addresses meanwhile. A store with a budget of
    /// its own (a server's tenant, whose store holds its share of this budget) is charged
    /// the files read for it there instead ([`crate::StoreOptions::memory_budget`]).
    pub memory_budget: Option<frostdb_core::MemoryBudget>,
}

impl SymbolizerOptions {
    /// The defaults, the cache in `cache_dir`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            cache_dir: cache_dir.into(),
            cache_bytes: 4 << 30,
            debuginfod_urls: urls_from_env(),
            fetch_timeout: Duration::from_secs(30),
            max_file_bytes: 1_000_000_000,
            miss_ttl: Duration::from_secs(300),
            workers: 2,
            memory_budget: None,
        }
    }
}

/// Where a debug file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The on-disk cache.
    Cache,
    /// The files uploaded to the tenant.
    Upload,
    /// A debuginfod server.
    Debuginfod,
}

/// What a symbolizer did, since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolizerStats {
    /// The cache's own.
    pub cache: CacheStats,
    /// Files taken from the tenant's uploads.
    pub from_uploads: u64,
    /// Files fetched from debuginfod servers.
    pub from_debuginfod: u64,
    /// Build ids nobody had (each counted once per [`SymbolizerOptions::miss_ttl`]).
    pub not_found: u64,
    /// Asks answered by a remembered miss.
    pub remembered_misses: u64,
    /// Fetches that failed (timeouts, errors, files over the limit, wrong build ids).
    pub failed_fetches: u64,
    /// Locations given names.
    pub resolved: u64,
    /// Debug files walked by the DWARF check before a first read (once per file as it is:
    /// the verdict is kept).
    pub files_checked: u64,
    /// Debug files read for names (each read parses the file).
    pub files_read: u64,
}

/// One frame of a resolved address: innermost (inlined) first in a location's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The function, demangled.
    pub function: String,
    /// Its source file, if the debug info says.
    pub file: String,
    /// Its line, 0 if unknown.
    pub line: i64,
}

/// What [`Symbolizer::symbolize_profile`] did to one profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileSymbolized {
    /// Locations without a function name, whose mapping has a build id.
    pub unsymbolized: usize,
    /// Of those, given names.
    pub resolved: usize,
    /// Build ids whose debug files were not found.
    pub missing: Vec<String>,
    /// Build ids whose debug files need more memory to read than the whole memory budget
    /// charged holds (the symbolizer's, or the asking store's): never read (not even
    /// later), their frames stay addresses.
    pub too_large: Vec<String>,
    /// Whether the budget ran out before every build id was asked.
    pub out_of_budget: bool,
    /// The locations named (partition, location), for [`Symbolizer::symbolize_merged`].
    pub named: Vec<(u32, u32)>,
}

/// Resolves addresses by build id from uploaded files and debuginfod, through a bounded
/// on-disk cache. Shared by a server's tenants (the cache is by build id, and a build id
/// names the same file for everybody; which uploads are asked is the caller's tenant's).
pub struct Symbolizer {
    options: SymbolizerOptions,
    cache: cache::Cache,
    http: reqwest::Client,
    misses: Mutex<HashMap<String, Instant>>,
    /// One permit per debug file being read ([`SymbolizerOptions::workers`]).
    workers: Arc<tokio::sync::Semaphore>,
    from_uploads: AtomicU64,
    from_debuginfod: AtomicU64,
    not_found: AtomicU64,
    remembered_misses: AtomicU64,
    failed_fetches: AtomicU64,
    resolved: AtomicU64,
    files_checked: AtomicU64,
    files_read: AtomicU64,
    /// [`dwarf_check::check`]'s verdict on each file read, by its path, size and time of
    /// change: a file is walked once, not on every pass that names one more address of it.
    verdicts: Mutex<HashMap<PathBuf, (FileIdentity, Verdict)>>,
    /// When each file (as it is now) was last read for a store's background resolver
    /// (the store's [`Reread::by`]): at most once every [`BACKGROUND_REREAD`], so the pass
    /// after each push of one new address does not parse a gigabyte again.
    background_reads: Mutex<HashMap<(u64, PathBuf, FileIdentity), Instant>>,
}

/// A file as it is now: its size and time of change (a file written again is another).
type FileIdentity = (u64, Option<std::time::SystemTime>);

/// What [`dwarf_check::check`] said of a file.
type Verdict = Result<(), String>;

/// The identity of the file at `path`, if it can be read.
fn identity_of(path: &Path) -> Option<FileIdentity> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()))
}

/// Most verdicts [`Symbolizer::verdicts`] keeps (all are forgotten past it).
const MAX_VERDICTS: usize = 4096;

/// How often a store's background resolver may read one debug file: what arrives
/// meanwhile is named by the pass after, or by the queries that reach it.
pub const BACKGROUND_REREAD: Duration = Duration::from_secs(30);

/// Who reads a file, and how long it waits to read the same file again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reread {
    /// The reader (a store), told apart from the others sharing the symbolizer.
    pub(crate) by: u64,
    pub(crate) every: Duration,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// The files debuginfod serves of a build id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Debuginfo,
    Executable,
}

impl Kind {
    /// Its name in debuginfod's URLs.
    fn path(self) -> &'static str {
        match self {
            Kind::Debuginfo => "debuginfo",
            Kind::Executable => "executable",
        }
    }

    /// Its key in the cache and among the misses.
    fn key(self, build_id: &str) -> String {
        match self {
            Kind::Debuginfo => build_id.to_owned(),
            Kind::Executable => format!("{build_id}.executable"),
        }
    }
}

/// Most build ids remembered as misses; past it the oldest are forgotten.
const MAX_MISSES: usize = 65_536;

impl Symbolizer {
    /// A symbolizer with its cache in `options.cache_dir` (created; files a crash left
    /// half written are deleted).
    pub fn new(options: SymbolizerOptions) -> Result<Self> {
        let cache = cache::Cache::open(&options.cache_dir, options.cache_bytes)?;
        let http = reqwest::Client::builder()
            .connect_timeout(options.fetch_timeout)
            .build()
            .map_err(|e| Error::Fetch(format!("an HTTP client: {e}")))?;
        Ok(Self {
            cache,
            http,
            misses: Mutex::new(HashMap::new()),
            workers: Arc::new(tokio::sync::Semaphore::new(options.workers.max(1))),
            options,
            from_uploads: AtomicU64::new(0),
            from_debuginfod: AtomicU64::new(0),
            not_found: AtomicU64::new(0),
            remembered_misses: AtomicU64::new(0),
            failed_fetches: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            files_checked: AtomicU64::new(0),
            files_read: AtomicU64::new(0),
            verdicts: Mutex::new(HashMap::new()),
            background_reads: Mutex::new(HashMap::new()),
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> SymbolizerStats {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SymbolizerStats {
            cache: self.cache.stats(),
            from_uploads: n(&self.from_uploads),
            from_debuginfod: n(&self.from_debuginfod),
            not_found: n(&self.not_found),
            remembered_misses: n(&self.remembered_misses),
            failed_fetches: n(&self.failed_fetches),
            resolved: n(&self.resolved),
            files_checked: n(&self.files_checked),
            files_read: n(&self.files_read),
        }
    }

    /// The debug file of `build_id`: from the cache, the tenant's `uploads`, then the
    /// debuginfod servers; `None` when nobody has it (remembered for a while).
    pub async fn debug_file(
        &self,
        build_id: &str,
        uploads: Option<&DebugInfoStore>,
    ) -> Result<Option<(PathBuf, Origin)>> {
        self.file(build_id, Kind::Debuginfo, uploads).await
    }

    /// The file of `kind` of `build_id` (see [`Symbolizer::debug_file`]); uploads hold
    /// debug info only.
    async fn file(
        &self,
        build_id: &str,
        kind: Kind,
        uploads: Option<&DebugInfoStore>,
    ) -> Result<Option<(PathBuf, Origin)>> {
        let build_id = build_id.to_ascii_lowercase();
        if crate::debuginfo::check_build_id(&build_id).is_err() {
            return Ok(None);
        }
        // The tenant's uploads first, cached and missed apart from every other tenant's: a
        // file one tenant uploaded never names another tenant's frames (a build id is a
        // note anybody can write), and one tenant's miss never hides another's upload.
        if let (Some(uploads), Kind::Debuginfo) = (uploads, kind) {
            let key = format!("u{}-{build_id}", uploads.scope());
            if let Some(path) = self.cache.get(&key) {
                return Ok(Some((path, Origin::Cache)));
            }
            if !self.remembered_miss(&key) {
                let to = self.cache.temporary(&key);
                if uploads.download_to(&build_id, &to).await? {
                    match self.cache.add(&key, to) {
                        Ok(path) => {
                            self.from_uploads.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(build_id, "debug info from the uploads");
                            return Ok(Some((path, Origin::Upload)));
                        }
                        // Larger than the whole cache: remembered as a miss, not taken
                        // again by every query (an operator raises cache_bytes).
                        Err(e) => {
                            self.failed_fetches.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(build_id, error = %e, "uploaded debug info not usable");
                        }
                    }
                }
                self.remember_miss(&key);
            }
        }
        // Then what any tenant may have: debuginfod's files.
        let key = kind.key(&build_id);
        if let Some(path) = self.cache.get(&key) {
            return Ok(Some((path, Origin::Cache)));
        }
        if self.remembered_miss(&key) {
            self.remembered_misses.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        // A file the cache cannot hold is refused while it streams in.
        let max_bytes = self.options.max_file_bytes.min(self.options.cache_bytes);
        for server in &self.options.debuginfod_urls {
            let to = self.cache.temporary(&key);
            let fetched = debuginfod::fetch(
                &self.http,
                server,
                &build_id,
                kind.path(),
                &to,
                max_bytes,
                self.options.fetch_timeout,
            )
            .await
            .and_then(|found| match found {
                false => Ok(false),
                true => check_file_build_id(&to, &build_id).map(|()| true),
            });
            let fetched = match fetched {
                Ok(true) => self.cache.add(&key, to).map(Some),
                Ok(false) => Ok(None),
                Err(e) => Err(e),
            };
            match fetched {
                Ok(Some(path)) => {
                    self.from_debuginfod.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        build_id,
                        server = %frostdb_core::redacted_url(server),
                        kind = kind.path(),
                        "fetched from debuginfod"
                    );
                    return Ok(Some((path, Origin::Debuginfod)));
                }
                Ok(None) => {}
                Err(e) => {
                    self.failed_fetches.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(build_id, server = %frostdb_core::redacted_url(server), error = %e, "debuginfod fetch failed");
                }
            }
        }
        self.remember_miss(&key);
        self.not_found.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// `locations` (`(position, file offset)`) placed at the addresses `build_id`'s ELF
    /// file loads them at: by the debug file's own segments where it holds the code (an
    /// unstripped binary), else by the executable's (a separate debug file keeps its
    /// segments' addresses but not their bytes), which debuginfod serves beside it. Those
    /// neither places are left out.
    async fn place<K: Copy>(
        &self,
        build_id: &str,
        debug: &Path,
        locations: &[(K, u64)],
    ) -> Vec<(K, u64)> {
        let place = |segments: &[crate::debuginfo::LoadSegment], offset: u64| {
            // Checked: the segments are the file's word, and a file may say anything.
            segments
                .iter()
                .find(|s| offset >= s.offset && offset - s.offset < s.filesz)
                .and_then(|s| (offset - s.offset).checked_add(s.vaddr))
        };
        let own = crate::debuginfo::load_segments(debug).unwrap_or_default();
        let mut placed = Vec::with_capacity(locations.len());
        let mut left = Vec::new();
        for &(at, offset) in locations {
            match place(&own, offset) {
                Some(address) => placed.push((at, address)),
                None => left.push((at, offset)),
            }
        }
        if left.is_empty() {
            return placed;
        }
        let executable = match self.file(build_id, Kind::Executable, None).await {
            Ok(Some((exe, _))) => crate::debuginfo::load_segments(&exe).unwrap_or_default(),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(build_id, error = %e, "no executable to place file offsets");
                Vec::new()
            }
        };
        placed.extend(
            left.into_iter()
                .filter_map(|(at, offset)| Some((at, place(&executable, offset)?))),
        );
        placed
    }

    /// Debug info was just uploaded for `build_id` to `uploads`: forgets that those
    /// uploads lacked it, and the file cached from them (it may have been replaced), so the
    /// next ask takes the new one.
    pub fn forget(&self, build_id: &str, uploads: &DebugInfoStore) {
        let key = format!("u{}-{}", uploads.scope(), build_id.to_ascii_lowercase());
        self.cache.remove(&key);
        self.misses.lock().remove(&key);
    }

    fn remembered_miss(&self, build_id: &str) -> bool {
        let mut misses = self.misses.lock();
        match misses.get(build_id) {
            Some(at) if at.elapsed() < self.options.miss_ttl => true,
            Some(_) => {
                misses.remove(build_id);
                false
            }
            None => false,
        }
    }

    fn remember_miss(&self, build_id: &str) {
        let mut misses = self.misses.lock();
        if misses.len() >= MAX_MISSES {
            let ttl = self.options.miss_ttl;
            misses.retain(|_, at| at.elapsed() < ttl);
            if misses.len() >= MAX_MISSES {
                // The older half goes, not all: a flood of new build ids (one tenant's
                // uploads named, say) forgets the oldest misses, and the rest stay.
                let mut times: Vec<Instant> = misses.values().copied().collect();
                let middle = times.len() / 2;
                let (_, &mut cut, _) = times.select_nth_unstable(middle);
                misses.retain(|_, at| *at > cut);
            }
        }
        misses.insert(build_id.to_owned(), Instant::now());
    }

    /// The frames of each of `offsets` (virtual addresses as the ELF file at `path` lays
    /// them out) in its symbols and DWARF, innermost first; empty for an address it has
    /// no symbol for.
    pub fn resolve(&self, path: &Path, offsets: &[u64]) -> Vec<Vec<Frame>> {
        self.resolve_read(path, offsets, &mut |_| true)
            .unwrap_or_else(|| vec![Vec::new(); offsets.len()])
    }

    /// [`Symbolizer::resolve`], or `None` when the file could not be read at all (gone
    /// from the cache since it was found, say): that says nothing of its addresses, which
    /// are asked again later rather than taken for having no symbol. Each address's frames
    /// are `charge`d ([`frames_bytes`]) as they are made: once one is refused, the frames
    /// stop there, and the addresses from it on are left out (the answer is shorter than
    /// `offsets`): one symbol's name is copied for every address in it, so an upload of one
    /// long name made gigabytes from a small profile.
    fn resolve_read(
        &self,
        path: &Path,
        offsets: &[u64],
        charge: &mut dyn FnMut(usize) -> bool,
    ) -> Option<Vec<Vec<Frame>>> {
        use blazesym::symbolize::source::{Elf, Source};
        use blazesym::symbolize::{Input, Symbolized};
        let identity = identity_of(path)?;
        let known = self
            .verdicts
            .lock()
            .get(path)
            .filter(|(seen, _)| *seen == identity)
            .map(|(_, verdict)| verdict.clone());
        let verdict = match known {
            Some(verdict) => verdict,
            None => {
                self.files_checked.fetch_add(1, Ordering::Relaxed);
                let verdict = dwarf_check::check(path);
                let mut verdicts = self.verdicts.lock();
                if verdicts.len() >= MAX_VERDICTS {
                    verdicts.clear();
                }
                verdicts.insert(path.to_path_buf(), (identity, verdict.clone()));
                verdict
            }
        };
        if let Err(reason) = verdict {
            tracing::warn!(path = %path.display(), %reason, "a debug file not read");
            return Some(vec![Vec::new(); offsets.len()]);
        }
        self.files_read.fetch_add(1, Ordering::Relaxed);
        // One per call (blazesym's symbolizer is neither Send nor Sync): what it parses of
        // the file is let go with it, so memory is bounded by one file at a time.
        let blazesym = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            // Demangled by `demangle`, which bounds what it writes.
            .enable_demangling(false)
            .build();
        let found = match blazesym.symbolize(
            &Source::Elf(Elf::new(path.to_path_buf())),
            Input::VirtOffset(offsets),
        ) {
            Ok(found) => found,
            Err(e) if e.kind() == blazesym::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::debug!(path = %path.display(), "cannot symbolize: {e}");
                Vec::new()
            }
        };
        let mut out = Vec::with_capacity(offsets.len());
        for i in 0..offsets.len() {
            let frames = match found.get(i) {
                Some(Symbolized::Sym(sym)) => frames_of(sym),
                _ => Vec::new(),
            };
            if !charge(frames_bytes(&frames)) {
                break;
            }
            out.push(frames);
        }
        Some(out)
    }

    /// Gives the locations of `profile` that have no lines, and whose mapping has a build
    /// id, the functions and lines their debug files say (inlined calls as lines of their
    /// own, innermost first, as pprof orders them). Build ids are asked one after another
    /// until `budget` is spent; what is not reached stays an address.
    pub async fn symbolize_profile(
        self: &Arc<Self>,
        profile: &mut Profile,
        uploads: Option<&DebugInfoStore>,
        budget: Duration,
    ) -> ProfileSymbolized {
        let deadline = tokio::time::Instant::now() + budget;
        let mut summary = ProfileSymbolized::default();
        let mappings: HashMap<u64, usize> = profile
            .mapping
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id, i))
            .collect();
        // Per build id, the unsymbolized locations (by position) and their file offsets.
        let mut wanted: Wants<usize> = Wants::default();
        for (i, location) in profile.location.iter().enumerate() {
            if !location.line.is_empty() {
                continue;
            }
            let Some(&m) = mappings.get(&location.mapping_id) else {
                continue;
            };
            let mapping = &profile.mapping[m];
            let build_id = profile
                .string_table
                .get(mapping.build_id as usize)
                .map_or("", String::as_str);
            if build_id.is_empty() {
                continue;
            }
            summary.unsymbolized += 1;
            want(
                &mut wanted,
                build_id,
                i,
                location.address,
                (mapping.memory_start, mapping.file_offset),
            );
        }
        let mut strings: HashMap<String, i64> = profile
            .string_table
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), i as i64))
            .collect();
        let mut functions: HashMap<(i64, i64), u64> = HashMap::new();
        let mut next_function = profile.function.iter().map(|f| f.id).max().unwrap_or(0) + 1;
        for (at, frames) in self
            .frames_of(
                wanted.into_list(),
                uploads,
                deadline,
                None,
                None,
                &mut summary,
            )
            .await
        {
            if frames.is_empty() {
                continue;
            }
            let mut lines = Vec::with_capacity(frames.len());
            for frame in frames {
                let mut string = |s: String| -> i64 {
                    let next = profile.string_table.len() as i64;
                    *strings.entry(s).or_insert_with_key(|s| {
                        profile.string_table.push(s.clone());
                        next
                    })
                };
                let (name, file) = (string(frame.function), string(frame.file));
                let id = *functions.entry((name, file)).or_insert_with(|| {
                    let id = next_function;
                    next_function += 1;
                    profile.function.push(Function {
                        id,
                        name,
                        system_name: name,
                        filename: file,
                        start_line: 0,
                    });
                    id
                });
                lines.push(Line {
                    function_id: id,
                    line: frame.line,
                    column: 0,
                });
            }
            profile.location[at].line = lines;
            summary.resolved += 1;
        }
        self.resolved
            .fetch_add(summary.resolved as u64, Ordering::Relaxed);
        summary
    }

    /// The frames of `wanted` (per build id, `(key, file offset)`), build id after build
    /// id until `deadline`: empty for an offset its file has no symbol for; the keys whose
    /// file was not found, or could not be read, are left out. With `reread`, a file read
    /// less than that long ago is not read again: its keys are left out, and the work is
    /// said to be cut short. What was missing or cut short by the deadline is noted in
    /// `summary`. Each file read reserves its size from `memory` when given (the asking
    /// store's budget), else from [`SymbolizerOptions::memory_budget`].
    async fn frames_of<K: Copy>(
        self: &Arc<Self>,
        wanted: Vec<Wanted<K>>,
        uploads: Option<&DebugInfoStore>,
        deadline: tokio::time::Instant,
        reread: Option<Reread>,
        memory: Option<&frostdb_core::MemoryBudget>,
        summary: &mut ProfileSymbolized,
    ) -> Vec<(K, Vec<Frame>)> {
        let memory = memory.or(self.options.memory_budget.as_ref());
        let mut out = Vec::new();
        // The frames' reservations, held until they are handed over.
        let mut held: Vec<frostdb_core::Reservation> = Vec::new();
        for (build_id, locations) in wanted {
            // Finding the files (the debug file, else the executable's symbol table; and
            // the executable to place offsets by) is what may wait on the network: all of
            // it within the deadline.
            let found = tokio::time::timeout_at(deadline, async {
                let found = match self.debug_file(&build_id, uploads).await? {
                    Some(found) => Some(found),
                    None => self.file(&build_id, Kind::Executable, None).await?,
                };
                Ok::<_, Error>(match found {
                    Some((path, _)) => {
                        // By position in `locations`: those not placed are named by nothing.
                        let indexed: Vec<(usize, u64)> =
                            locations.iter().map(|&(_, o)| o).enumerate().collect();
                        let placed = self.place(&build_id, &path, &indexed).await;
                        Some((path, placed))
                    }
                    None => None,
                })
            })
            .await;
            let (path, placed) = match found {
                Err(_) => {
                    summary.out_of_budget = true;
                    break;
                }
                Ok(Ok(Some(found))) => found,
                Ok(Ok(None)) => {
                    summary.missing.push(build_id);
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(build_id, error = %e, "no debug file");
                    summary.missing.push(build_id);
                    continue;
                }
            };
            // The file as it is now: one uploaded again (better debug info) is another.
            let identity = (
                reread.map_or(0, |r| r.by),
                path.clone(),
                identity_of(&path).unwrap_or_default(),
            );
            if let Some(Reread { every, .. }) = reread {
                let mut reads = self.background_reads.lock();
                reads.retain(|_, at| at.elapsed() < every);
                if reads.contains_key(&identity) {
                    summary.out_of_budget = true;
                    continue;
                }
            }
            // Reading DWARF is CPU work and memory: off the async threads, at most
            // `workers` files at once across queries and the background.
            let Ok(Ok(permit)) =
                tokio::time::timeout_at(deadline, self.workers.clone().acquire_owned()).await
            else {
                summary.out_of_budget = true;
                break;
            };
            let reserved = match memory {
                Some(budget) => {
                    // Its headers are read from disk: off the async threads too.
                    let at = path.clone();
                    let bytes = tokio::task::spawn_blocking(move || dwarf_check::read_bytes(&at))
                        .await
                        .unwrap_or(u64::MAX);
                    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
                    match budget.try_reserve(bytes, "reading a debug file") {
                        Ok(reserved) => Some(reserved),
                        Err(e) if e.never_fits() => {
                            // It would wait for memory that never comes, and hold up the
                            // build ids after it, pass after pass: like a missing file.
                            tracing::warn!(
                                build_id,
                                path = %path.display(),
                                bytes,
                                limit = budget.limit(),
                                "a debug file needs more memory to read than the whole budget \
                                 it is charged to (limits.memory, or the asking tenant's share \
                                 of it): it is not read, its frames stay addresses"
                            );
                            summary.too_large.push(build_id);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(build_id, error = %e, "debug file left for later");
                            summary.out_of_budget = true;
                            break;
                        }
                    }
                }
                None => None,
            };
            if reread.is_some() {
                self.background_reads
                    .lock()
                    .insert(identity, Instant::now());
            }
            let addresses: Vec<u64> = placed.iter().map(|&(_, a)| a).collect();
            let this = self.clone();
            let frames = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                // The frames made are charged beside the file, and held with them until
                // this returns.
                let mut reserved = reserved;
                let frames = this.resolve_read(&path, &addresses, &mut |bytes| {
                    reserved
                        .as_mut()
                        .is_none_or(|r| r.try_grow(bytes, "the frames a debug file names").is_ok())
                });
                (frames, reserved)
            })
            .await
            .ok()
            .and_then(|(frames, reserved)| {
                held.extend(reserved);
                frames
            });
            let Some(frames) = frames else {
                // Gone since it was found (another tenant's file pushed it out of the
                // cache, say): nothing is known of these addresses; asked again later.
                summary.missing.push(build_id);
                continue;
            };
            if frames.len() < placed.len() {
                // The budget took no more of its frames: the rest are asked again later.
                tracing::warn!(
                    build_id,
                    named = frames.len(),
                    left = placed.len() - frames.len(),
                    "the frames a debug file names for these addresses do not fit the memory \
                     budget; the rest stay addresses for now"
                );
                summary.out_of_budget = true;
            }
            // Those placed nowhere or named by nothing: empty, for the caller to remember;
            // those not reached, left out.
            let mut by_position: Vec<Option<Vec<Frame>>> = vec![Some(Vec::new()); locations.len()];
            let mut frames = frames.into_iter();
            for (i, _) in placed {
                by_position[i] = frames.next();
            }
            out.extend(
                locations
                    .iter()
                    .map(|&(key, _)| key)
                    .zip(by_position)
                    .filter_map(|(key, frames)| Some((key, frames?))),
            );
        }
        drop(held);
        out
    }

    /// Names the locations of `merged`'s stacks stored without lines, whose mapping has a
    /// build id, in their symbol partitions ([`crate::symbols::Partition::name_location`]):
    /// every report of them shows the names from then on, this one's and later queries'
    /// (while the partition stays loaded), which do not resolve them again. Build ids are
    /// asked one after another until `budget` is spent; what is not reached stays an
    /// address. [`ProfileSymbolized::named`] lists the locations named, for the caller to
    /// store ([`crate::ProfileStore::name_merged`] does). The files read are charged to
    /// `memory` when given (the asking store's budget), else to
    /// [`SymbolizerOptions::memory_budget`].
    pub async fn symbolize_merged(
        self: &Arc<Self>,
        merged: &crate::Merged,
        uploads: Option<&DebugInfoStore>,
        budget: Duration,
        memory: Option<&frostdb_core::MemoryBudget>,
    ) -> ProfileSymbolized {
        let deadline = tokio::time::Instant::now() + budget;
        let mut summary = ProfileSymbolized::default();
        // Most profiles are symbolized whole: nothing to walk.
        if merged
            .symbols
            .partitions()
            .all(|p| p.unnamed_locations() == 0)
        {
            return summary;
        }
        let mut seen: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
        let mut wanted: Wants<(u32, u32)> = Wants::default();
        for &(stack, _) in &merged.samples {
            let Some((p, locations)) = merged.symbols.locations(stack) else {
                continue;
            };
            for &l in locations {
                if seen.insert((p.id(), l)) && want_location(&mut wanted, p, l, None) {
                    summary.unsymbolized += 1;
                }
            }
        }
        self.name_wanted(
            wanted.into_list(),
            |id| merged.symbols.partition(id),
            uploads,
            deadline,
            None,
            memory,
            &mut summary,
        )
        .await;
        summary
    }

    /// Names `wanted` (per build id, `(partition, location)` and file offset) in the
    /// partitions `partition` finds, until `deadline` (each file read at most once every
    /// `reread`, when given, and charged to `memory`, as [`Symbolizer::symbolize_merged`]
    /// says); what changed goes to `summary.named`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn name_wanted<'p>(
        self: &Arc<Self>,
        wanted: Vec<Wanted<(u32, u32)>>,
        partition: impl Fn(u32) -> Option<&'p crate::symbols::Partition>,
        uploads: Option<&DebugInfoStore>,
        deadline: tokio::time::Instant,
        reread: Option<Reread>,
        memory: Option<&frostdb_core::MemoryBudget>,
        summary: &mut ProfileSymbolized,
    ) {
        for ((id, l), frames) in self
            .frames_of(wanted, uploads, deadline, reread, memory, summary)
            .await
        {
            let Some(p) = partition(id) else {
                continue;
            };
            if frames.is_empty() {
                // Its debug file has no symbol there: not asked again until better debug
                // info comes (`again`).
                p.mark_unnamable(l);
                continue;
            }
            let lines = frames
                .into_iter()
                .map(|f| crate::symbols::NamedLine::new(f.function, f.file, f.line))
                .collect();
            if p.name_location(l, lines) {
                summary.resolved += 1;
                summary.named.push((id, l));
            }
        }
        self.resolved
            .fetch_add(summary.resolved as u64, Ordering::Relaxed);
    }
}

/// Adds location `l` of `p` to `wanted` when it is stored as an address (no lines) in a
/// mapping with a build id, and: with `again` `None`, not named yet; with `again` a build
/// id, of that build id and not named from DWARF yet (its debug info just came). Returns
/// whether it was added.
/// Runs `f`, blocking work met in async code (reading symbol partitions in, walking them),
/// without holding up the thread: on a worker of a multi-thread runtime, that worker's
/// other tasks move to another thread meanwhile ([`tokio::task::block_in_place`]).
/// Elsewhere (a plain thread, a current-thread runtime) it runs as it is.
pub fn off_the_async_thread<T>(f: impl FnOnce() -> T) -> T {
    let on_worker = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_worker {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

pub(crate) fn want_location(
    wanted: &mut Wants<(u32, u32)>,
    p: &crate::symbols::Partition,
    l: u32,
    again: Option<&std::collections::HashSet<String>>,
) -> bool {
    let Some(location) = p.location(l) else {
        return false;
    };
    if !location.lines.is_empty() {
        return false;
    }
    let Some(m) = location.mapping.checked_sub(1).and_then(|i| p.mapping(i)) else {
        return false;
    };
    let build_id = p.string(m.build_id);
    let asked = match again {
        None => p.named(l).is_none() && !p.unnamable(l),
        Some(again) => {
            let queued = match build_id.bytes().any(|b| b.is_ascii_uppercase()) {
                true => again.contains(&build_id.to_ascii_lowercase()),
                false => again.contains(build_id),
            };
            queued && (p.named(l).is_none() || p.named_from_symbols_only(l))
        }
    };
    if build_id.is_empty() || !asked {
        return false;
    }
    want(
        wanted,
        build_id,
        (p.id(), l),
        location.address,
        (m.memory_start, m.file_offset),
    );
    true
}

/// A build id, and the file offsets in it to name, each with its caller's key.
pub(crate) type Wanted<K> = (String, Vec<(K, u64)>);

/// Locations to name, gathered per build id in the order the build ids come; a build id
/// is found by key, so a profile of many mappings costs a lookup a location, not a scan of
/// the build ids gathered so far.
pub(crate) struct Wants<K> {
    list: Vec<Wanted<K>>,
    by_id: HashMap<String, usize>,
}

impl<K> Default for Wants<K> {
    fn default() -> Self {
        Self {
            list: Vec::new(),
            by_id: HashMap::new(),
        }
    }
}

impl<K> Wants<K> {
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn into_list(self) -> Vec<Wanted<K>> {
        self.list
    }
}

/// Adds the location `key` at `address`, in a mapping of `build_id` loaded at
/// `(memory start, file offset)`, to `wanted` under its build id, as a file offset.
fn want<K>(wanted: &mut Wants<K>, build_id: &str, key: K, address: u64, mapped: (u64, u64)) {
    let offset = address.saturating_sub(mapped.0).saturating_add(mapped.1);
    match wanted.by_id.get(build_id) {
        Some(&i) => wanted.list[i].1.push((key, offset)),
        None => {
            wanted.by_id.insert(build_id.to_owned(), wanted.list.len());
            wanted.list.push((build_id.to_owned(), vec![(key, offset)]));
        }
    }
}

/// The frames blazesym found, innermost first (it lists inlined calls outermost first),
/// their names demangled and, as their files, cut to [`MAX_NAME_BYTES`].
fn frames_of(sym: &blazesym::symbolize::Sym<'_>) -> Vec<Frame> {
    let frame = |name: &str, code: Option<&blazesym::symbolize::CodeInfo<'_>>| Frame {
        function: demangle(name),
        file: code.map_or_else(String::new, |c| {
            cut(&c.to_path().to_string_lossy(), MAX_NAME_BYTES).to_owned()
        }),
        line: code.and_then(|c| c.line).map_or(0, i64::from),
    };
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| frame(&f.name, f.code_info.as_ref()))
        .collect();
    frames.push(frame(&sym.name, sym.code_info.as_deref()));
    frames
}

/// The most bytes of a frame's name or file the symbolizer keeps: a profile's frame's.
pub const MAX_NAME_BYTES: usize = crate::convert::trie::MAX_FRAME_BYTES;

/// `s` cut to at most `most` bytes, at a character's boundary.
fn cut(s: &str, most: usize) -> &str {
    &s[..s.floor_char_boundary(most)]
}

/// A symbol's name demangled (as Rust's, else as C++'s; as it is when neither), in at most
/// [`MAX_NAME_BYTES`]. A demangler writes what a name's back references repeat: a C++
/// function of nested templates, `f(P<P<P<…>>>)`, is 160 bytes mangled and 285 MB
/// demangled at 24 levels (as g++ makes it), 18 GB at 30. The demangling stops once past
/// the limit, and the name is cut there.
pub fn demangle(name: &str) -> String {
    /// A `String` that refuses to grow past [`MAX_NAME_BYTES`], keeping what fits.
    #[derive(Default)]
    struct Capped {
        out: String,
        full: bool,
    }
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = MAX_NAME_BYTES - self.out.len();
            if s.len() > room {
                self.out.push_str(cut(s, room));
                self.full = true;
                return Err(std::fmt::Error);
            }
            self.out.push_str(s);
            Ok(())
        }
    }
    let mut capped = Capped::default();
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // Past the limit, what fitted.
        let _ = std::fmt::Write::write_fmt(&mut capped, format_args!("{rust:#}"));
        return capped.out;
    }
    if let Ok(cpp) = cpp_demangle::Symbol::new(name) {
        let written = cpp.structured_demangle(&mut capped, &Default::default());
        if written.is_ok() || capped.full {
            return capped.out;
        }
    }
    cut(name, MAX_NAME_BYTES).to_owned()
}

/// What `frames` hold, about: their names and files, and a word or so each besides. A
/// symbol partition keeps each name as a line's (twice: the name and its hash key), and
/// the batch naming them a third time: counted three times.
fn frames_bytes(frames: &[Frame]) -> usize {
    frames
        .iter()
        .map(|f| 3 * (f.function.len() + f.file.len()) + 64)
        .sum()
}

/// The GNU build id of the ELF file at `path` (hex), if it has one.
pub fn file_build_id(path: &Path) -> Result<Option<String>> {
    // blazesym reads the notes as the section headers say: headers it would read otherwise
    // than `object` does, or a compressed note stating a terabyte, are refused first (a
    // debuginfod server's file is read here before anything else checks it).
    let file =
        std::fs::File::open(path).map_err(|e| Error::Fetch(format!("{}: {e}", path.display())))?;
    dwarf_check::sections_fit(&object::ReadCache::new(file))
        .map_err(|e| Error::Fetch(format!("{}: {e}", path.display())))?;
    let found = blazesym::helper::read_elf_build_id(path)
        .map_err(|e| Error::Fetch(format!("{}: not an ELF file: {e}", path.display())))?;
    Ok(found.map(|id| id.iter().map(|b| format!("{b:02x}")).collect()))
}

/// Checks that the ELF file at `path` has GNU build id `build_id` (a file without one is
/// taken: Go binaries and some toolchains name files by another id).
fn check_file_build_id(path: &Path, build_id: &str) -> Result<()> {
    match file_build_id(path)? {
        Some(found) if found != build_id => Err(Error::Fetch(format!(
            "the file served for {build_id} has GNU build id {found}"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the most misses remembered, the older half is forgotten, not every one: the
    /// newest misses still answer without asking again.
    #[test]
    fn past_the_most_misses_the_oldest_half_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let s = Symbolizer::new(SymbolizerOptions::new(dir.path())).unwrap();
        for i in 0..MAX_MISSES {
            s.remember_miss(&format!("old-{i}"));
        }
        s.remember_miss("newest");
        let kept = s.misses.lock().len();
        assert!(
            (MAX_MISSES / 4..=MAX_MISSES / 2 + 1).contains(&kept),
            "{kept} remembered"
        );
        assert!(s.remembered_miss("newest"));
        assert!(s.remembered_miss(&format!("old-{}", MAX_MISSES - 1)));
        assert!(!s.remembered_miss("old-0"), "the oldest is forgotten");
    }

    #[inline(never)]
    fn a_rust_function_to_find(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(31)
    }

    /// Rust names come back demangled (`crate::module::function`, no `_ZN…17h…E`): this
    /// test binary's own function, at the address it runs at, placed in its ELF file.
    #[test]
    fn rust_names_are_demangled() {
        assert_eq!(a_rust_function_to_find(1), 31);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        // Where the file's start is mapped (a PIE's first segment is at address 0).
        let base = maps
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 6 && f[2] == "00000000" && std::path::Path::new(f[5]) == exe)
                    .then(|| u64::from_str_radix(f[0].split('-').next()?, 16).ok())
                    .flatten()
            })
            .expect("the executable's first mapping");
        let at = a_rust_function_to_find as *const () as u64 - base;
        let dir = tempfile::tempdir().unwrap();
        let s = Symbolizer::new(SymbolizerOptions::new(dir.path())).unwrap();
        let frames = s.resolve(&exe, &[at]);
        let name = &frames[0].last().expect("named").function;
        // Its symbol, demangled (`…::a_rust_function_to_find`), or its DWARF name (this
        // build keeps line tables only, whose names have no module path): never mangled.
        assert!(
            name.ends_with("a_rust_function_to_find")
                && !name.starts_with("_ZN")
                && !name.starts_with("_R")
                && !name.contains("17h"),
            "{name}"
        );
    }

    #[tokio::test]
    async fn a_build_id_nobody_has_is_asked_once_then_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = SymbolizerOptions::new(dir.path());
        // A server that refuses connections at once.
        options.debuginfod_urls = vec!["http://127.0.0.1:9".into()];
        let s = Symbolizer::new(options).unwrap();
        assert!(s.debug_file("abcdef01", None).await.unwrap().is_none());
        assert!(s.debug_file("abcdef01", None).await.unwrap().is_none());
        let stats = s.stats();
        assert_eq!(
            (
                stats.not_found,
                stats.remembered_misses,
                stats.failed_fetches
            ),
            (1, 1, 1)
        );
        // Not a build id: never asked.
        assert!(s.debug_file("../../etc", None).await.unwrap().is_none());
        assert_eq!(s.stats().failed_fetches, 1);
    }
}
