//! Tenants: each `X-Scope-OrgID` gets its own database, so no query can ever read another
//! tenant's rows, and its own series limit. A tenant's database is a directory under the
//! data directory, or (a cluster: [`Storage::Bucket`]) a prefix of a bucket shared with
//! other nodes: written by the one writer holding its lease, followed by readers.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use axum::http::StatusCode;
use frostdb_core::{Bucket, Db, DbOptions, SharedOptions};
use frostdb_pprof::{ProfileStore, StoreOptions};
use frostdb_profile::distributed::{Cluster, StackSource};
use object_store::ObjectStore;
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::config::{Limits, Role};
use super::error::{ApiError, ApiResult};

/// Where tenants' databases are.
#[derive(Debug, Clone)]
pub enum Storage {
    /// `<dir>/<id>/`, each a database directory (the default: `data/tenants/`).
    Local(PathBuf),
    /// `<prefix>/tenants/<id>/` of a bucket shared with other nodes.
    Bucket(Arc<SharedBucket>),
}

/// A bucket of tenants shared with other nodes, and this node's part in it.
#[derive(Debug)]
pub struct SharedBucket {
    /// The bucket.
    pub bucket: Bucket,
    /// Its object store.
    pub store: Arc<dyn ObjectStore>,
    /// Writer or reader.
    pub role: Role,
    /// A writer's lease settings and name.
    pub shared: SharedOptions,
}

impl Tenant {
    /// What the tenant holds in memory: its tables' active and rotated blocks, its symbol
    /// partitions, and the previous values of its cumulative series.
    pub fn memory_bytes(&self) -> usize {
        self.table_bytes()
            + self.store.symbol_memory_bytes()
            + self.store.baseline_memory_bytes()
            + self.store.recorder().map_or(0, |r| r.stack_cache_bytes())
    }

    /// Bytes the tenant stores: its persisted blocks (in the data directory or the
    /// bucket) and its WAL, as of at most [`STORED_BYTES_AGE`] ago (summing them walks
    /// every block of every table and asks the file system for each WAL segment's size, too
    /// much for every push). Blocking when the figure is older: call it off the async
    /// threads ([`Tenant::check_stored`] does).
    pub fn stored_bytes(&self) -> u64 {
        if let Some(bytes) = self.recent_stored_bytes() {
            return bytes;
        }
        // Summed without the cache's lock held: a push of the tenant meanwhile reads the
        // previous figure or sums again, never waits for this one.
        let tables = self.store.db().tables();
        let stats: Vec<_> = tables.iter().map(|t| t.stats()).collect();
        // The WAL is the database's, shared by its tables: once.
        let wal = stats.iter().map(|s| s.wal_bytes).max().unwrap_or(0);
        let bytes = wal + stats.iter().map(|s| s.block_bytes).sum::<u64>();
        *self.stored.lock() = Some((std::time::Instant::now(), bytes));
        bytes
    }

    /// [`Tenant::stored_bytes`] when summed less than [`STORED_BYTES_AGE`] ago.
    fn recent_stored_bytes(&self) -> Option<u64> {
        match *self.stored.lock() {
            Some((at, bytes)) if at.elapsed() < STORED_BYTES_AGE => Some(bytes),
            _ => None,
        }
    }

    /// Refuses a write while the tenant stores `quota` bytes or more
    /// (`limits.max_stored_bytes_per_tenant`, or its own `max_stored_bytes`): 429 naming
    /// the quota, what is stored, and what frees it. Summing what is stored, when its
    /// figure is older than [`STORED_BYTES_AGE`], runs on a blocking thread: a request's
    /// async thread never waits on the file system for it.
    pub async fn check_stored(self: &Arc<Self>, quota: u64, own: bool) -> Result<(), ApiError> {
        let stored = match self.recent_stored_bytes() {
            Some(bytes) => bytes,
            None => {
                let tenant = self.clone();
                tokio::task::spawn_blocking(move || tenant.stored_bytes())
                    .await
                    .map_err(|e| {
                        ApiError::internal(format!("summing the bytes stored failed: {e}"))
                    })?
            }
        };
        if stored < quota {
            return Ok(());
        }
        let setting = if own {
            format!("tenants.{}.max_stored_bytes", self.id)
        } else {
            "limits.max_stored_bytes_per_tenant".to_owned()
        };
        Err(ApiError::limited(format!(
            "tenant {:?} stores {stored} bytes, at its quota of {quota} ({setting}): nothing \
             more is stored until its retention frees space or the quota is raised",
            self.id
        )))
    }

    /// What its tables hold in memory: the rows persisting writes out.
    fn table_bytes(&self) -> usize {
        self.store
            .db()
            .tables()
            .iter()
            .map(|t| t.stats().memory_bytes)
            .sum()
    }
}

impl SharedBucket {
    fn prefix(&self, id: &str) -> Result<String, ApiError> {
        self.bucket
            .database(&format!("tenants/{id}"))
            .map_err(ApiError::from)
    }
}

/// A tenant's store and accounting.
#[derive(Debug)]
pub struct Tenant {
    /// The tenant id.
    pub id: String,
    /// Its profiles; the store holds the tenant to its series limit, counting every label
    /// a series has (request and pprof sample labels alike).
    pub store: ProfileStore,
    /// Where its store's baselines go when it closes: none for a tenant in a shared
    /// bucket, which another node may write meanwhile (values this one kept would then be
    /// stale, and deltas from them count again what that node stored).
    parked: Option<Arc<Parked>>,
    /// [`Tenant::stored_bytes`], and when it was summed.
    stored: parking_lot::Mutex<Option<(std::time::Instant, u64)>>,
}

/// How old [`Tenant::stored_bytes`] may be: a tenant at its quota may store about this
/// long's pushes past it.
const STORED_BYTES_AGE: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for Tenant {
    /// Parks the store's baselines (the previous values of its cumulative series, kept only
    /// in memory) for the store that opens the tenant next: without them, each series'
    /// next profile would be a baseline again, storing nothing while its push is answered
    /// 200.
    ///
    /// Its recording rules' stack cache (up to about 70 MB, kept with the rules for the
    /// server's life) is forgotten: closed tenants hold none.
    fn drop(&mut self) {
        if let Some(parked) = &self.parked {
            parked.park(&self.id, self.store.take_baselines());
        }
        if let Some(recorder) = self.store.recorder() {
            recorder.forget_stacks();
        }
    }
}

/// Most bytes of baselines kept for closed tenants, all together: past it the oldest
/// parked are dropped (and said so in the log).
const MAX_PARKED_BASELINE_BYTES: usize = 256 << 20;

/// Most bytes of baselines kept for one closed tenant: a tenant parking more keeps none
/// (said in the log), rather than pushing every other tenant's out. An eighth of the whole:
/// a million (stack, labels) slots of its cumulative series.
const MAX_PARKED_BASELINE_BYTES_A_TENANT: usize = MAX_PARKED_BASELINE_BYTES / 8;

/// The baselines of closed tenants, until they open again.
#[derive(Debug)]
struct Parked {
    /// By tenant, oldest parked first, and their bytes.
    baselines: Mutex<(
        std::collections::VecDeque<(String, frostdb_pprof::Baselines)>,
        usize,
    )>,
    /// Most bytes parked, all together and for one tenant.
    max_bytes: usize,
    max_tenant_bytes: usize,
}

impl Default for Parked {
    fn default() -> Self {
        Self::with_limits(
            MAX_PARKED_BASELINE_BYTES,
            MAX_PARKED_BASELINE_BYTES_A_TENANT,
        )
    }
}

impl Parked {
    fn with_limits(max_bytes: usize, max_tenant_bytes: usize) -> Self {
        Self {
            baselines: Mutex::default(),
            max_bytes,
            max_tenant_bytes,
        }
    }

    fn park(&self, tenant: &str, baselines: frostdb_pprof::Baselines) {
        if baselines.is_empty() {
            return;
        }
        if baselines.memory_bytes() > self.max_tenant_bytes {
            tracing::warn!(
                %tenant,
                bytes = baselines.memory_bytes(),
                limit = self.max_tenant_bytes,
                "the baselines of a closing tenant are more than one tenant may park, and are \
                 dropped: the next profile of each of its cumulative series is a baseline \
                 again, storing nothing"
            );
            return;
        }
        let mut parked = self.baselines.lock();
        let (queue, bytes) = &mut *parked;
        *bytes += baselines.memory_bytes();
        queue.push_back((tenant.to_owned(), baselines));
        while *bytes > self.max_bytes {
            let Some((dropped, b)) = queue.pop_front() else {
                break;
            };
            *bytes = bytes.saturating_sub(b.memory_bytes());
            tracing::warn!(
                tenant = %dropped,
                bytes = b.memory_bytes(),
                limit = self.max_bytes,
                "the baselines of a closed tenant dropped: the next profile of each of its \
                 cumulative series is a baseline again, storing nothing"
            );
        }
    }

    /// The baselines parked for `tenant`, taken.
    fn take(&self, tenant: &str) -> Option<frostdb_pprof::Baselines> {
        let mut parked = self.baselines.lock();
        let (queue, bytes) = &mut *parked;
        let at = queue.iter().position(|(t, _)| t == tenant)?;
        let (_, baselines) = queue.remove(at)?;
        *bytes = bytes.saturating_sub(baselines.memory_bytes());
        Some(baselines)
    }

    /// Bytes parked.
    fn bytes(&self) -> usize {
        self.baselines.lock().1
    }
}

/// Attaches `symbolizer` to `tenant`'s store and runs its background resolver while the
/// tenant is open: a pass whenever ingest stored frames as addresses or debug info was
/// uploaded ([`frostdb_pprof::ProfileStore::name_pending`]). The task holds the tenant only
/// during a pass, so an idle tenant can be closed; closing it wakes the task to end.
fn start_naming(tenant: &Arc<Tenant>, symbolizer: Arc<frostdb_pprof::symbolize::Symbolizer>) {
    let uploads = crate::ingest::parca::debuginfo_store(&tenant.store);
    if !tenant.store.attach_symbolizer(symbolizer, uploads) {
        return;
    }
    let wake = tenant.store.naming_wake();
    let weak = Arc::downgrade(tenant);
    tokio::spawn(async move {
        loop {
            wake.notified().await;
            let Some(tenant) = weak.upgrade() else {
                return;
            };
            if let Err(error) = tenant.store.name_pending().await {
                tracing::warn!(tenant = %tenant.id, %error, "naming frames in the background failed");
            }
        }
    });
}

/// The tenant an `X-Scope-OrgID` value (HTTP header or gRPC metadata) names: the default
/// tenant when there is none or it is empty (Pyroscope's web page probes with an empty one),
/// else the trimmed value, validated.
pub fn tenant_from_header(value: Option<&str>) -> Result<String, String> {
    let id = value.unwrap_or("").trim();
    if id.is_empty() {
        return Ok(super::config::DEFAULT_TENANT.to_owned());
    }
    validate_tenant(id)?;
    Ok(id.to_owned())
}

/// Checks a tenant id: 1 to 150 characters of `[A-Za-z0-9_.-]`, not `.` or `..` (it names
/// a directory).
pub fn validate_tenant(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 150 {
        return Err(format!("tenant id {id:?} must have 1 to 150 characters"));
    }
    if id == "." || id == ".." {
        return Err(format!("tenant id {id:?} is not allowed"));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "tenant id {id:?} has {c:?}; allowed are letters, digits, '_', '.' and '-'"
        ));
    }
    Ok(())
}

/// Whether the file system of `dir` folds case (`Acme` and `acme` name one file), as macOS,
/// Windows and casefolded ext4 do: a file is made and looked up in the other case.
pub fn folds_case(dir: &std::path::Path) -> std::io::Result<bool> {
    let pid = std::process::id();
    let probe = dir.join(format!(".Case-Probe-{pid}"));
    std::fs::write(&probe, b"")?;
    let folds = dir.join(format!(".cASE-pROBE-{pid}")).exists();
    std::fs::remove_file(&probe)?;
    Ok(folds)
}

/// Refuses a tenant id with an upper case letter when the data directory folds case
/// (`folds`): there `Acme` and `acme` would be two tenants sharing one database, settings
/// file, rules file and debug-file store, each reading and writing the other's.
pub fn check_case(id: &str, folds: bool) -> Result<(), String> {
    if folds && id.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "tenant id {id:?} has upper case letters, and the data directory's file system does not tell case apart ({:?} would name the same files): use lower case",
            id.to_ascii_lowercase()
        ));
    }
    Ok(())
}

/// How long tenants keep their samples: a default and per-tenant settings (`None`: for ever).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// Every tenant's, unless it has its own.
    pub default: Option<std::time::Duration>,
    /// Tenants with their own.
    pub tenants: std::collections::BTreeMap<String, std::time::Duration>,
    /// How long every tenant keeps its hourly and daily rollups (`None`: as long as its
    /// samples).
    pub rollups: Option<std::time::Duration>,
}

impl Retention {
    /// The retention of tenant `id`.
    pub fn of(&self, id: &str) -> Option<std::time::Duration> {
        self.tenants.get(id).copied().or(self.default)
    }
}

/// The tenants, opened on first use; at most [`Tenants::max_open`] open at once (the least
/// recently used idle one is closed to open another), at most `limits.max_tenants` in all.
#[derive(Debug)]
pub struct Tenants {
    storage: Storage,
    limits: Limits,
    retention: Retention,
    /// The threads every tenant's database shares (compaction, persistence, I/O): a
    /// server's threads do not grow with its tenants.
    workers: frostdb_core::WorkerPool,
    /// The workers this node's merges read persisted blocks on, if any.
    cluster: OnceLock<Arc<Cluster>>,
    /// The tenants open, or being opened.
    tenants: Mutex<HashMap<String, Entry>>,
    /// Every tenant known to exist (listed once, then kept): what `max_tenants` counts.
    known: tokio::sync::OnceCell<Mutex<HashSet<String>>>,
    /// Of the known, those admitted as new whose state is not yet said to exist, with the
    /// admissions of them outstanding: the last to end without it forgets the id. Taken
    /// only with `known` held.
    admitting: Mutex<HashMap<String, usize>>,
    max_open: usize,
    /// Ticks of use, for choosing the least recently used tenant.
    clock: AtomicU64,
    /// The budget the tenants' queries reserve from (`None`: only their own limit).
    budget: Option<frostdb_core::MemoryBudget>,
    /// Where the tenants' SQL operators spill past their memory limit, one bound for all.
    spill: frostdb_query::Spill,
    /// Names for the tenants' frames stored as addresses (`[symbolizer]`), shared: one
    /// cache and one pool of workers for every tenant.
    symbolizer: Option<Arc<frostdb_pprof::symbolize::Symbolizer>>,
    /// The recording rules each tenant's store counts its profiles into.
    rules: Option<Arc<crate::rules::Rules>>,
    /// The baselines of tenants closed, for when they open again.
    parked: Arc<Parked>,
    /// Tenants closed whose instance may still be finishing (a query over its session, its
    /// background work): opened again only once that instance is gone, whose lock would
    /// refuse the new one.
    closing: Mutex<HashMap<String, frostdb_core::Closed>>,
    /// How long opening a tenant waits for that, in ms ([`CLOSING_WAIT`]).
    closing_wait: AtomicU64,
    /// Tenants a writer reads for the merge tasks it serves as a worker without holding
    /// them: followers of the bucket, never its writer ([`Tenants::for_task`]), the most
    /// recently used last.
    followers: Mutex<Vec<(String, frostdb_core::Db)>>,
}

/// A tenant [`Tenants::admit`] made room for. A new tenant's room is given back when this
/// is dropped before [`Admitted::exists`] says its state was made.
#[derive(Debug)]
#[must_use = "a new tenant is forgotten unless its state is said to exist"]
pub struct Admitted<'a> {
    tenants: &'a Tenants,
    /// The id, when it was new.
    new: Option<String>,
}

impl Admitted<'_> {
    /// The tenant's state (its database, its settings) exists: it stays counted, whatever
    /// the other admissions of it outstanding do.
    pub fn exists(mut self) {
        if let Some(id) = self.new.take()
            && let Some(known) = self.tenants.known.get()
        {
            let _known = known.lock();
            self.tenants.admitting.lock().remove(&id);
        }
    }
}

impl Drop for Admitted<'_> {
    /// Forgets a new id whose state was not made, when no other admission of it is
    /// outstanding (a request admitted while this one was, whose state may yet be made),
    /// unless the tenant came to exist anyway: an entry open (another request's, or this
    /// one's left by a cancelled open) or its database directory made (what `existing`
    /// counts at the next start).
    fn drop(&mut self) {
        let Some(id) = self.new.take() else {
            return;
        };
        let tenants = self.tenants;
        let Some(known) = tenants.known.get() else {
            return;
        };
        let mut known = known.lock();
        {
            let mut admitting = tenants.admitting.lock();
            match admitting.get_mut(&id) {
                // Said to exist by another admission.
                None => return,
                Some(n) if *n > 1 => {
                    *n -= 1;
                    return;
                }
                Some(_) => {
                    admitting.remove(&id);
                }
            }
        }
        if tenants.tenants.lock().contains_key(&id) {
            return;
        }
        if let Storage::Local(root) = &tenants.storage
            && root.join(&id).is_dir()
        {
            return;
        }
        known.remove(&id);
    }
}

/// Followers a writer keeps open for the tasks it serves ([`Tenants::for_task`]).
const MAX_FOLLOWERS: usize = 16;

/// The 503 of a tenant whose previous instance, closed by this server, is still held.
fn still_closing(id: &str) -> ApiError {
    ApiError::busy(
        format!(
            "tenant {id:?} is still closing (a query or background work holds its previous instance); retry shortly"
        ),
        1,
    )
}

/// How long opening a tenant waits for its previous instance, closed by this server, to
/// finish what holds it (a query, a compaction, a rollup pass) before answering 503.
const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An open (or opening) tenant and when it was last used.
#[derive(Debug)]
struct Entry {
    cell: Arc<OnceCell<Arc<Tenant>>>,
    used: AtomicU64,
}

impl Entry {
    /// Whether nothing but the map holds the tenant: no request, no opening in progress. An
    /// entry left unopened by a request that went away (its open dropped midway) is idle:
    /// kept, it held an open tenant's place for good.
    fn idle(&self) -> bool {
        Arc::strong_count(&self.cell) == 1
            && self.cell.get().is_none_or(|t| Arc::strong_count(t) == 1)
    }
}

impl Tenants {
    /// Tenants under `data/tenants/`, each keeping its samples as long as `retention` says,
    /// their databases' background work on `workers`.
    pub fn new(
        data: PathBuf,
        limits: Limits,
        retention: Retention,
        workers: frostdb_core::WorkerPool,
    ) -> Self {
        Self::with_storage(
            Storage::Local(data.join("tenants")),
            limits,
            retention,
            workers,
        )
    }

    /// Tenants in `storage`.
    pub fn with_storage(
        storage: Storage,
        limits: Limits,
        retention: Retention,
        workers: frostdb_core::WorkerPool,
    ) -> Self {
        Self {
            max_open: limits.max_open_tenants.unwrap_or(limits.max_tenants).max(1),
            storage,
            limits,
            retention,
            workers,
            cluster: OnceLock::new(),
            tenants: Mutex::new(HashMap::new()),
            known: tokio::sync::OnceCell::new(),
            admitting: Mutex::new(HashMap::new()),
            closing: Mutex::new(HashMap::new()),
            closing_wait: AtomicU64::new(CLOSING_WAIT.as_millis() as u64),
            clock: AtomicU64::new(0),
            budget: None,
            spill: frostdb_query::Spill::none(),
            symbolizer: None,
            rules: None,
            parked: Arc::default(),
            followers: Mutex::new(Vec::new()),
        }
    }

    /// The same tenants, their queries reserving from `budget` too.
    pub fn budget(mut self, budget: frostdb_core::MemoryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The same tenants, their SQL spilling to `spill` past their memory limit.
    pub fn spill(mut self, spill: frostdb_query::Spill) -> Self {
        self.spill = spill;
        self
    }

    /// The same tenants, each counting its profiles into its recording rules in `rules`.
    pub fn rules(mut self, rules: Arc<crate::rules::Rules>) -> Self {
        self.rules = Some(rules);
        self
    }

    /// The same tenants, their frames stored as addresses named by `symbolizer`: by their
    /// queries, and in the background by a resolver per open tenant.
    pub fn symbolizer(
        mut self,
        symbolizer: Option<Arc<frostdb_pprof::symbolize::Symbolizer>>,
    ) -> Self {
        self.symbolizer = symbolizer;
        self
    }

    /// The same tenants with at most `n` open at once.
    pub fn max_open(mut self, n: usize) -> Self {
        self.max_open = n.max(1);
        self
    }

    /// How long opening a tenant waits for its previous instance to close (tests).
    #[cfg(test)]
    fn set_closing_wait(&self, wait: std::time::Duration) {
        self.closing_wait
            .store(wait.as_millis() as u64, Ordering::Relaxed);
    }

    /// Tenants open at once, at most.
    pub fn open_limit(&self) -> usize {
        self.max_open
    }

    /// Makes room for tenant `id` to exist: a known tenant always has it, a new one while
    /// fewer than `max_tenants` exist (429 beyond). Every route that creates a tenant's
    /// state (a database, settings) asks first.
    ///
    /// A new tenant stays counted once its state exists ([`Admitted::exists`]): a request
    /// refused after it was admitted (a bad setting, an open that failed) leaves no tenant
    /// behind, and counts against nothing.
    pub async fn admit(&self, id: &str) -> ApiResult<Admitted<'_>> {
        validate_tenant(id).map_err(ApiError::bad_request)?;
        let known = self
            .known
            .get_or_try_init(|| async {
                Ok::<_, ApiError>(Mutex::new(self.existing().await?.into_iter().collect()))
            })
            .await?;
        let mut known = known.lock();
        let admitted = |new: Option<&str>| Admitted {
            tenants: self,
            new: new.map(str::to_owned),
        };
        if known.contains(id) {
            // Admitted as new by a request still outstanding: this one counts too, so
            // that the other failing does not forget an id this one's state is made for.
            if let Some(n) = self.admitting.lock().get_mut(id) {
                *n += 1;
                return Ok(admitted(Some(id)));
            }
            return Ok(admitted(None));
        }
        if known.len() >= self.limits.max_tenants {
            return Err(ApiError::limited(format!(
                "the server holds its limit of {} tenants (limits.max_tenants); tenant {id:?} is new",
                self.limits.max_tenants
            )));
        }
        known.insert(id.to_owned());
        self.admitting.lock().insert(id.to_owned(), 1);
        Ok(admitted(Some(id)))
    }

    /// Spreads the merges of tenants opened from now on over `cluster`'s workers.
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        let _ = self.cluster.set(cluster);
    }

    /// Whether this node refuses writes (a reader of a shared bucket).
    pub fn read_only(&self) -> bool {
        matches!(&self.storage, Storage::Bucket(b) if b.role == Role::Reader)
    }

    /// The pprof decoding limits of every tenant's store (from the server's limits), known
    /// without opening a tenant.
    pub fn pprof_limits(&self) -> frostdb_pprof::Limits {
        frostdb_pprof::Limits {
            max_decompressed_bytes: self.limits.max_decompressed_bytes,
            max_samples: self.limits.max_samples_per_profile,
            max_locations: self.limits.max_locations_per_profile,
            ..frostdb_pprof::Limits::default()
        }
    }

    /// The ids of the tenants that have data (on disk, or in the bucket).
    pub async fn existing(&self) -> ApiResult<Vec<String>> {
        let mut ids: Vec<String> = match &self.storage {
            // No directory yet is no tenant yet; one that cannot be read is an error, never
            // "no tenants".
            Storage::Local(root) => match std::fs::read_dir(root) {
                Ok(entries) => entries
                    .map(|e| {
                        e.map_err(|e| {
                            ApiError::internal(format!(
                                "listing tenants in {}: {e}",
                                root.display()
                            ))
                        })
                    })
                    .collect::<ApiResult<Vec<_>>>()?
                    .into_iter()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => {
                    return Err(ApiError::internal(format!(
                        "listing tenants in {}: {e}",
                        root.display()
                    )));
                }
            },
            Storage::Bucket(shared) => {
                let root = object_store::path::Path::from(
                    shared.bucket.database("tenants").map_err(ApiError::from)?,
                );
                let listed = shared
                    .store
                    .list_with_delimiter(Some(&root))
                    .await
                    .map_err(|e| {
                        ApiError::internal(format!("listing tenants under {root}: {e}"))
                    })?;
                listed
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().map(str::to_owned))
                    .collect()
            }
        };
        ids.retain(|id| validate_tenant(id).is_ok());
        ids.sort();
        Ok(ids)
    }

    /// Whether tenant `id` has a database (a directory, or a manifest in the bucket).
    async fn exists(&self, id: &str) -> ApiResult<bool> {
        match &self.storage {
            Storage::Local(root) => Ok(root.join(id).exists()),
            Storage::Bucket(shared) => {
                let manifest =
                    object_store::path::Path::from(format!("{}/manifest.json", shared.prefix(id)?));
                use object_store::ObjectStoreExt;
                match shared.store.head(&manifest).await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(ApiError::internal(format!("reading {manifest}: {e}"))),
                }
            }
        }
    }

    /// The tenant for writing: opened, and created when new. A reader node refuses.
    pub async fn for_write(&self, id: &str) -> ApiResult<Arc<Tenant>> {
        if self.read_only() {
            return Err(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "this node is a reader of a shared bucket ([cluster] role = \"reader\"): it \
                 answers queries only; send profiles to a writer",
            ));
        }
        self.open(id, true)
            .await
            .map(|t| t.expect("created when absent"))
    }

    /// The tenant for reading: `None` when it has never stored anything.
    pub async fn for_read(&self, id: &str) -> ApiResult<Option<Arc<Tenant>>> {
        self.open(id, false).await
    }

    /// The database of tenant `id` for a merge task this node serves as a cluster worker. A
    /// reader (or a local server) opens it as for any read. A writer serves the tenants it
    /// holds from its own store, and reads any other as a follower of the bucket, brought
    /// up to date with its manifest: serving a task never takes a tenant's lease (which
    /// would fence off the writer holding it, or fail every spread merge of its tenants).
    pub async fn for_task(&self, id: &str) -> ApiResult<Option<frostdb_core::Db>> {
        validate_tenant(id).map_err(ApiError::bad_request)?;
        let shared = match &self.storage {
            Storage::Bucket(shared) if shared.role == Role::Writer => shared.clone(),
            _ => return Ok(self.for_read(id).await?.map(|t| t.store.db().clone())),
        };
        let held = self
            .tenants
            .lock()
            .get(id)
            .and_then(|e| e.cell.get().cloned());
        if let Some(tenant) = held {
            return Ok(Some(tenant.store.db().clone()));
        }
        let known = {
            let mut followers = self.followers.lock();
            let at = followers.iter().position(|(f, _)| f == id);
            at.map(|i| {
                let entry = followers.remove(i);
                let db = entry.1.clone();
                followers.push(entry);
                db
            })
        };
        // A follower kept is of a tenant that exists; only a new one is looked for.
        if known.is_none() && !self.exists(id).await? {
            return Ok(None);
        }
        let name = id.to_owned();
        let workers = self.workers.clone();
        let db = tokio::task::spawn_blocking(move || -> ApiResult<frostdb_core::Db> {
            let id = name;
            let context = |e: frostdb_core::Error| {
                ApiError::from(e).context(format_args!("cannot follow tenant {id:?} for a task"))
            };
            match known {
                Some(db) => {
                    db.refresh().map_err(context)?;
                    Ok(db)
                }
                None => {
                    let db = Db::open_reader(
                        shared.store.clone(),
                        &shared.prefix(&id)?,
                        DbOptions::default().workers(workers),
                    )
                    .map_err(context)?;
                    tracing::info!(tenant = %id, "following a tenant this writer does not hold, for merge tasks");
                    Ok(db)
                }
            }
        })
        .await
        .map_err(|e| ApiError::job_failed("following a tenant", e))??;
        self.keep_follower(id, &db);
        Ok(Some(db))
    }

    /// Keeps `db`, a follower of tenant `id` opened by [`Tenants::for_task`], for the next
    /// task (the least recently used one closed past [`MAX_FOLLOWERS`]).
    fn keep_follower(&self, id: &str, db: &frostdb_core::Db) {
        let mut followers = self.followers.lock();
        if !followers.iter().any(|(f, _)| f == id) {
            followers.push((id.to_owned(), db.clone()));
            if followers.len() > MAX_FOLLOWERS {
                followers.remove(0);
            }
        }
    }

    /// How many tenants are open now.
    pub fn open_count(&self) -> usize {
        self.tenants.lock().len()
    }

    /// The tenants open now, held weakly: background work takes one at a time, so that
    /// while it runs every other tenant stays idle (closable to open another).
    fn open_now(&self) -> Vec<std::sync::Weak<Tenant>> {
        self.tenants
            .lock()
            .values()
            .filter_map(|e| e.cell.get().map(Arc::downgrade))
            .collect()
    }

    /// The entry of tenant `id`, made when absent (closing the least recently used idle
    /// tenant when as many as may be are open: 503 when none is idle).
    async fn entry(&self, id: &str) -> ApiResult<Arc<OnceCell<Arc<Tenant>>>> {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let closed = {
            let mut tenants = self.tenants.lock();
            if let Some(e) = tenants.get(id) {
                e.used.store(now, Ordering::Relaxed);
                return Ok(e.cell.clone());
            }
            let mut closed = None;
            if tenants.len() >= self.max_open {
                let victim = tenants
                    .iter()
                    .filter(|(_, e)| e.idle())
                    .min_by_key(|(_, e)| e.used.load(Ordering::Relaxed))
                    .map(|(id, _)| id.clone());
                let Some(victim) = victim else {
                    return Err(ApiError::busy(
                        format!(
                            "the server holds its limit of {} open tenants (limits.max_open_tenants), all in use; retry shortly",
                            self.max_open
                        ),
                        1,
                    ));
                };
                closed = self.remove(&mut tenants, &victim).map(|e| (victim, e));
            }
            let cell = Arc::new(OnceCell::new());
            tenants.insert(
                id.to_owned(),
                Entry {
                    cell: cell.clone(),
                    used: AtomicU64::new(now),
                },
            );
            (cell, closed)
        };
        let (cell, closed) = closed;
        if let Some((victim, entry)) = closed {
            // Closed before this one opens, off the async threads: what it had not
            // persisted is in its WAL, replayed when it opens again.
            tracing::info!(tenant = %victim, opening = %id, "closing the least recently used tenant");
            // The tenant closed is another's: named in the log, not in this request's answer.
            tokio::task::spawn_blocking(move || drop(entry))
                .await
                .map_err(|e| {
                    tracing::error!(tenant = %victim, error = %e, "closing a tenant failed");
                    ApiError::internal(
                        "closing the least recently used tenant failed (see the server's log)",
                    )
                })?;
        }
        Ok(cell)
    }

    async fn open(&self, id: &str, create: bool) -> ApiResult<Option<Arc<Tenant>>> {
        validate_tenant(id).map_err(ApiError::bad_request)?;
        let known = self.tenants.lock().get(id).map(|e| e.cell.clone());
        // A writer whose lease another writer took stops writing: opened again, it waits
        // for that lease (503) or takes it back once it runs out.
        if let Some(stopped) = known
            .as_ref()
            .and_then(|c| c.get())
            .and_then(|t| t.store.db().stopped())
        {
            tracing::warn!(tenant = %id, reason = %stopped, "tenant stopped writing; reopening it");
            self.remove(&mut self.tenants.lock(), id);
            // Not held here while it is opened again (its lock would refuse the new one).
            drop(known);
        }
        let open = self.tenants.lock().contains_key(id);
        let mut admitted = None;
        if !open {
            if !create && !self.exists(id).await? {
                return Ok(None);
            }
            if create {
                admitted = Some(self.admit(id).await?);
            }
        }
        let cell = self.entry(id).await?;
        let opened = cell.get_or_try_init(|| self.open_store(id)).await;
        if opened.is_err() {
            // Not kept: the next request tries again (a lease another writer holds runs out).
            let mut tenants = self.tenants.lock();
            if tenants
                .get(id)
                .is_some_and(|e| Arc::ptr_eq(&e.cell, &cell) && e.cell.get().is_none())
            {
                tenants.remove(id);
            }
        }
        let opened = opened?.clone();
        if let Some(admitted) = admitted {
            admitted.exists();
        }
        Ok(Some(opened))
    }

    /// Takes tenant `id`'s entry out of `tenants` to close it. Its instance (if it opened)
    /// may live on while a query or background work holds it: noted, so that the tenant
    /// opens again only once that instance is gone ([`Tenants::wait_closed`]).
    fn remove(&self, tenants: &mut HashMap<String, Entry>, id: &str) -> Option<Entry> {
        let entry = tenants.remove(id)?;
        // A reader of a bucket takes no lock: its next instance need not wait.
        let reader = matches!(&self.storage, Storage::Bucket(b) if b.role == Role::Reader);
        if let Some(tenant) = entry.cell.get()
            && !reader
        {
            let mut closing = self.closing.lock();
            closing.retain(|_, closed| !closed.is_closed());
            closing.insert(id.to_owned(), tenant.store.db().closed());
        }
        Some(entry)
    }

    /// Waits (off the async threads, at most `closing_wait`) for the instance of tenant
    /// `id` this server closed last to be gone: 503 when it is still finishing. Its
    /// database's lock would refuse the new instance, and with a message naming this very
    /// process and the server's directory.
    async fn wait_closed(&self, id: &str) -> ApiResult<()> {
        let Some(closed) = self.closing.lock().get(id).cloned() else {
            return Ok(());
        };
        if !closed.is_closed() {
            tracing::info!(tenant = %id, "waiting for the tenant's previous instance to close");
            let wait = Duration::from_millis(self.closing_wait.load(Ordering::Relaxed));
            let waited = closed.clone();
            let gone = tokio::task::spawn_blocking(move || waited.wait(wait))
                .await
                .unwrap_or(false);
            if !gone {
                tracing::warn!(tenant = %id, waited = ?wait, "the tenant's previous instance is still in use (a query or background work holds it)");
                return Err(still_closing(id));
            }
        }
        let mut closing = self.closing.lock();
        if closing.get(id).is_some_and(frostdb_core::Closed::is_closed) {
            closing.remove(id);
        }
        Ok(())
    }

    /// Opens tenant `id`'s store (blocking work, on the blocking pool).
    async fn open_store(&self, id: &str) -> ApiResult<Arc<Tenant>> {
        self.wait_closed(id).await?;
        let id = id.to_owned();
        let retention = self.retention.of(&id);
        let options = StoreOptions::default()
            .limits(self.pprof_limits())
            .label_limits(frostdb_pprof::LabelLimits {
                max_label_names_per_series: self.limits.max_label_names_per_series,
                max_label_name_length: self.limits.max_label_name_length,
                max_label_value_length: self.limits.max_label_value_length,
            })
            .retention(retention)
            .max_series(self.limits.max_series_per_tenant)
            .max_label_names(self.limits.max_label_names_per_tenant)
            .query_memory(self.limits.max_query_memory_bytes)
            .memory_budget(
                self.budget
                    .as_ref()
                    .map(|budget| crate::edge::tenant_share(budget, &id)),
            )
            .query_spill(self.spill.clone())
            .rollups(frostdb_pprof::RollupOptions {
                hourly_retention: self.retention.rollups,
                daily_retention: self.retention.rollups,
                ..frostdb_pprof::RollupOptions::default()
            })
            .block_merger(self.cluster.get().map(|cluster| cluster.merger(&id)));
        let db_options = DbOptions::default().workers(self.workers.clone());
        let storage = self.storage.clone();
        let rules = self.rules.clone();
        let parked = matches!(self.storage, Storage::Local(_)).then(|| self.parked.clone());
        let tenant = tokio::task::spawn_blocking(move || -> ApiResult<Arc<Tenant>> {
            let (store, at) = match &storage {
                Storage::Local(root) => {
                    let dir = root.join(&id);
                    std::fs::create_dir_all(&dir).map_err(|e| {
                        ApiError::internal(format!("cannot create {}: {e}", dir.display()))
                    })?;
                    // Held by another process (unavailable, 503: the client may retry),
                    // damaged (500), ...: the kind of the engine's error says which.
                    let db = Db::open(&dir, db_options).map_err(|e| {
                        if let frostdb_core::Error::Locked { holder, .. } = &e {
                            // The server's directory goes to its log, not to clients; so
                            // does this process as the holder (an instance of the tenant
                            // it closed still finishing).
                            tracing::warn!(tenant = %id, error = %e, "a tenant's database is locked");
                            if *holder == format!("process {}", std::process::id()) {
                                return still_closing(&id);
                            }
                            return ApiError::busy(
                                format!("tenant {id:?} is in use by {holder} (a database has one writer at a time); retry once it is released"),
                                1,
                            );
                        }
                        ApiError::from(e).context(format_args!(
                            "cannot open the database of tenant {id:?} in {}",
                            dir.display()
                        ))
                    })?;
                    (ProfileStore::open(db, options)?, dir.display().to_string())
                }
                Storage::Bucket(shared) => {
                    let prefix = shared.prefix(&id)?;
                    let at = format!("{} ({prefix})", shared.bucket.url);
                    let context = |e: frostdb_core::Error| {
                        ApiError::from(e).context(format_args!("cannot open tenant {id:?} at {at}"))
                    };
                    let store = match shared.role {
                        // Another writer's lease: 503, naming it (retry there, or later).
                        Role::Writer => ProfileStore::open(
                            Db::open_shared(
                                shared.store.clone(),
                                &prefix,
                                db_options,
                                shared.shared.clone(),
                            )
                            .map_err(context)?,
                            options,
                        )?,
                        Role::Reader => ProfileStore::open_reader(
                            Db::open_reader(shared.store.clone(), &prefix, db_options)
                                .map_err(context)?,
                            options,
                        )?,
                    };
                    (store, at)
                }
            };
            let kept = retention.map_or("for ever".to_owned(), |d| {
                format!("{} days", d.as_secs_f64() / 86_400.0)
            });
            if let Some(rules) = &rules {
                store.attach_recorder(rules.recorder(&id)?);
            }
            if let Some(baselines) = parked.as_ref().and_then(|p| p.take(&id)) {
                store.restore_baselines(baselines);
            }
            tracing::info!(tenant = %id, at = %at, retention = %kept, "opened tenant");
            Ok(Arc::new(Tenant {
                id,
                store,
                parked,
                stored: parking_lot::Mutex::new(None),
            }))
        })
        .await
        .map_err(|e| ApiError::job_failed("opening a tenant", e))??;
        if let Some(symbolizer) = &self.symbolizer {
            start_naming(&tenant, symbolizer.clone());
        }
        Ok(tenant)
    }

    /// Keeps what the open tenants hold in memory (their tables' blocks and symbol
    /// partitions) within the memory budget, every `every`: reports it to the budget as
    /// standing memory (so requests and queries see what is left), and while it and the
    /// reservations pass 80% of the budget, brings it down to what leaves the reservations
    /// room (never below a quarter of the budget): persists the tenants holding the most
    /// rows (their blocks leave memory), closes idle tenants, least recently used first,
    /// and then persists busy tenants holding less (see [`Tenants::relieve`]).
    pub async fn govern_memory(state: super::Shared, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let state = state.clone();
            let relieved =
                tokio::task::spawn_blocking(move || state.tenants.relieve(&state.budget)).await;
            if let Err(e) = relieved {
                tracing::error!("keeping tenants within the memory budget failed: {e}");
            }
        }
    }

    /// One round of [`Tenants::govern_memory`]. What it can relieve is what tenants hold
    /// (`standing`), not what requests reserve: it brings standing down to what leaves
    /// the reservations room, but never below a quarter of the budget, and persists only a
    /// tenant holding rows worth a block. (Reservations alone over the mark had it persist
    /// every tenant and close every idle one every second, freeing nearly nothing, and
    /// leave a block per table per second that a local database never merges.)
    fn relieve(&self, budget: &frostdb_core::MemoryBudget) {
        let high = budget.limit() / 10 * 8;
        let floor = budget.limit() / 4;
        let target = || high.saturating_sub(budget.reserved()).max(floor);
        // Rows in memory worth persisting as a block.
        let worth_a_block = (budget.limit() / 64).max(1 << 20);
        let mut sized: Vec<(std::sync::Weak<Tenant>, usize)> = self
            .open_now()
            .into_iter()
            .filter_map(|weak| {
                let bytes = weak.upgrade()?.memory_bytes();
                Some((weak, bytes))
            })
            .collect();
        // What the recording rules' series hold stays, tenants open or closed: counted in
        // what the budget sees held, but not in what relieving may bring down (counted
        // there, relieving would close and persist every tenant each round, freeing none of it).
        let recorded = self.rules.as_ref().map_or(0, |r| r.series_bytes());
        let set_standing = |standing: usize| budget.set_standing(standing + recorded);
        let mut standing: usize = sized.iter().map(|(_, b)| b).sum::<usize>() + self.parked.bytes();
        set_standing(standing);
        if standing <= target() {
            return;
        }
        sized.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
        // Persists the tenants holding the most, of those holding at least `rows` bytes of
        // rows, until standing is down to the target.
        let persist = |sized: &mut Vec<(std::sync::Weak<Tenant>, usize)>,
                       standing: &mut usize,
                       rows: usize| {
            for (tenant, bytes) in sized.iter_mut() {
                if *standing <= target() {
                    break;
                }
                let Some(tenant) = tenant.upgrade() else {
                    // Closed meanwhile: what it held is gone.
                    *standing = standing.saturating_sub(std::mem::take(bytes));
                    continue;
                };
                if tenant.table_bytes() < rows.max(1) {
                    continue;
                }
                tracing::info!(
                    tenant = %tenant.id,
                    bytes = *bytes,
                    standing = *standing,
                    limit = budget.limit(),
                    "memory budget pressed: persisting the tenant's blocks"
                );
                if let Err(e) = tenant.store.db().flush() {
                    tracing::warn!(tenant = %tenant.id, "persisting under memory pressure failed: {e}");
                }
                let after = tenant.memory_bytes();
                *standing = standing.saturating_sub(*bytes) + after;
                *bytes = after;
                set_standing(*standing);
            }
        };
        persist(&mut sized, &mut standing, worth_a_block);
        // Still pressed: idle tenants are closed (what they hold besides rows worth a
        // block, symbols and caches, goes with them).
        while standing > target() {
            let Some(closed) = self.close_least_recent() else {
                break;
            };
            standing = standing.saturating_sub(closed.1);
            set_standing(standing);
            tracing::info!(tenant = %closed.0, bytes = closed.1, "memory budget pressed: closed an idle tenant");
        }
        // Still pressed, by many busy tenants each holding less than a block: the largest
        // are persisted all the same.
        persist(&mut sized, &mut standing, 0);
    }

    /// Closes the least recently used idle tenant: its id and the memory it held.
    fn close_least_recent(&self) -> Option<(String, usize)> {
        let entry = {
            let mut tenants = self.tenants.lock();
            let victim = tenants
                .iter()
                .filter(|(_, e)| e.idle())
                .min_by_key(|(_, e)| e.used.load(Ordering::Relaxed))
                .map(|(id, _)| id.clone())?;
            (self.remove(&mut tenants, &victim)?, victim)
        };
        let (entry, victim) = entry;
        let Some(tenant) = entry.cell.get().cloned() else {
            // Left unopened by a request that went away.
            return Some((victim, 0));
        };
        let bytes = tenant.memory_bytes();
        let id = tenant.id.clone();
        drop(tenant);
        drop(entry);
        Some((id, bytes))
    }

    /// The open tenants, by id, held weakly: background work going through them upgrades
    /// one at a time, so that the others stay idle (closable) while it works on one.
    pub fn open_weakly(&self) -> Vec<std::sync::Weak<Tenant>> {
        let mut open: Vec<(String, std::sync::Weak<Tenant>)> = self
            .tenants
            .lock()
            .iter()
            .filter_map(|(id, e)| Some((id.clone(), Arc::downgrade(e.cell.get()?))))
            .collect();
        open.sort_by(|a, b| a.0.cmp(&b.0));
        open.into_iter().map(|(_, t)| t).collect()
    }

    /// The open tenants, by id.
    pub fn open_tenants(&self) -> Vec<Arc<Tenant>> {
        self.open_weakly()
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }

    /// Takes what writers persisted since into every open tenant (a reader node).
    pub fn refresh_all(&self) {
        for tenant in self.open_now().iter().filter_map(std::sync::Weak::upgrade) {
            if let Err(e) = tenant.store.refresh() {
                tracing::warn!(tenant = %tenant.id, "refresh failed: {e}");
            }
        }
    }

    /// Flushes every open tenant (on shutdown).
    pub fn flush_all(&self) {
        for tenant in self.open_now().iter().filter_map(std::sync::Weak::upgrade) {
            if let Err(e) = tenant.store.db().flush() {
                tracing::error!(tenant = %tenant.id, "flush failed: {e}");
            }
        }
    }
}

/// The tenants as the source of the tables a merge task reads (this node as a worker of
/// other nodes' merges, or running a small one itself).
#[derive(Debug)]
pub struct TenantTables {
    tenants: Weak<super::AppState>,
    runtime: tokio::runtime::Handle,
}

impl TenantTables {
    /// The tables of `state`'s tenants; tasks open tenants on `runtime`.
    pub fn new(state: &Arc<super::AppState>, runtime: tokio::runtime::Handle) -> Self {
        Self {
            tenants: Arc::downgrade(state),
            runtime,
        }
    }
}

impl StackSource for TenantTables {
    fn table(&self, tenant: &str, table: &str) -> frostdb_query::Result<frostdb_core::Table> {
        let state = self
            .tenants
            .upgrade()
            .ok_or_else(|| frostdb_query::Error::Cluster("the server is shutting down".into()))?;
        // Called on a blocking thread of a merge task.
        let db = self
            .runtime
            .block_on(state.tenants.for_task(tenant))
            .map_err(|e| frostdb_query::Error::Cluster(format!("tenant {tenant:?}: {e}")))?
            .ok_or_else(|| {
                frostdb_query::Error::Cluster(format!(
                    "tenant {tenant:?} has no database in this node's storage"
                ))
            })?;
        db.get_table(table).ok_or_else(|| {
            frostdb_query::Error::Cluster(format!("tenant {tenant:?} has no table {table:?}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The baselines of a store that took one cumulative profile of `stacks` stacks.
    fn baselines(stacks: usize) -> frostdb_pprof::Baselines {
        let db = Db::open_in_memory(DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        let mut p = frostdb_pprof::testing::profile(0, stacks, 3);
        for s in &mut p.string_table {
            if s == "cpu" {
                *s = "alloc_objects".into();
            }
        }
        let bytes = prost::Message::encode_to_vec(&p);
        let options = frostdb_pprof::IngestOptions::default()
            .name("memory")
            .delta(true);
        store.ingest(&bytes, &options).unwrap();
        let b = store.take_baselines();
        assert!(!b.is_empty());
        b
    }

    #[test]
    fn one_tenant_parking_more_than_its_share_pushes_out_nobody() {
        let (small, large) = (baselines(10), baselines(2_000));
        let (s, l) = (small.memory_bytes(), large.memory_bytes());
        assert!(l > 2 * s, "{s} {l}");
        // Room for all, a tenant's share between the two sizes.
        let parked = Parked::with_limits(4 * l, (s + l) / 2);
        parked.park("a", baselines(10));
        parked.park("b", baselines(10));
        parked.park("big", large);
        assert_eq!(parked.bytes(), 2 * s, "the large set is not parked");
        assert!(parked.take("big").is_none());
        assert!(parked.take("a").is_some() && parked.take("b").is_some());
        // Within its share, the oldest make room as before.
        let parked = Parked::with_limits(2 * s, s);
        parked.park("a", baselines(10));
        parked.park("b", baselines(10));
        parked.park("c", small);
        assert!(parked.take("a").is_none());
        assert!(parked.take("b").is_some() && parked.take("c").is_some());
    }

    #[test]
    fn upper_case_ids_are_refused_where_the_data_directory_folds_case() {
        // This machine's file systems tell case apart (as CI's do): the probe says so, and
        // leaves nothing behind.
        let dir = tempfile::tempdir().unwrap();
        assert!(!folds_case(dir.path()).unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // Where it folds, only lower case ids pass; elsewhere, any.
        assert!(check_case("acme-1.prod", true).is_ok());
        let e = check_case("Acme", true).unwrap_err();
        assert!(e.contains("\"acme\" would name the same files"), "{e}");
        assert!(check_case("Acme", false).is_ok());
    }

    #[test]
    fn tenant_ids_name_safe_directories() {
        assert!(validate_tenant("team-a_1.prod").is_ok());
        for bad in ["", ".", "..", "a/b", "a\\b", "ä", &"x".repeat(151)] {
            assert!(validate_tenant(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_tenant_is_created_on_write_with_the_series_limit() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_series_per_tenant: 2,
            max_samples_per_profile: 100,
            max_label_names_per_series: 7,
            ..Limits::default()
        };
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let tenants = Tenants::new(dir.path().to_owned(), limits, Retention::default(), pool);
        assert!(tenants.for_read("t").await.unwrap().is_none());
        assert!(
            tenants.existing().await.unwrap().is_empty(),
            "a read creates nothing"
        );
        let t = tenants.for_write("t").await.unwrap();
        // The store counts series (pprof sample labels included; see frostdb-pprof's tests).
        assert_eq!(t.store.options().max_series, 2);
        assert_eq!(t.store.options().limits.max_samples, 100);
        assert_eq!(t.store.options().label_limits.max_label_names_per_series, 7);
        assert_eq!(tenants.existing().await.unwrap(), vec!["t".to_owned()]);
        assert!(tenants.for_read("t").await.unwrap().is_some());
    }

    /// Reservations alone over the budget's mark are nothing persisting or closing tenants
    /// relieves: the governor leaves tenants be (it persisted every one, a block per table
    /// a second, and closed every idle one). Tenants holding much are relieved.
    #[tokio::test]
    async fn the_memory_governor_relieves_what_tenants_hold_not_what_requests_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let budget = frostdb_core::MemoryBudget::new(16 << 20);
        let tenants = Tenants::new(
            dir.path().to_owned(),
            Limits::default(),
            Retention::default(),
            pool,
        )
        .budget(budget.clone());
        let push = |t: &Tenant, i: i64, stacks: usize| {
            let p = frostdb_pprof::testing::profile(0, stacks, 3);
            let options = frostdb_pprof::IngestOptions::default()
                .name("process_cpu")
                .timestamp_ms(Some(1_700_000_000_000 + i));
            t.store
                .ingest(&prost::Message::encode_to_vec(&p), &options)
                .unwrap();
        };
        let blocks =
            |t: &Tenant| -> usize { t.store.db().tables().iter().map(|t| t.stats().blocks).sum() };
        let t = tenants.for_write("t").await.unwrap();
        push(&t, 0, 10);
        let reserved = budget.try_reserve(15 << 20, "queries").unwrap();
        for i in 1..=3 {
            push(&t, i, 10);
            tenants.relieve(&budget);
        }
        assert_eq!(blocks(&t), 0, "a tenant holding little was persisted");
        drop(t);
        tenants.relieve(&budget);
        assert_eq!(
            tenants.open_count(),
            1,
            "an idle tenant holding little was closed"
        );
        drop(reserved);
        // A tenant holding most of the budget is persisted.
        let t = tenants.for_write("t").await.unwrap();
        let mut i = 10;
        while t.memory_bytes() < 14 << 20 {
            push(&t, i, 2_000);
            i += 1;
        }
        tenants.relieve(&budget);
        assert!(
            blocks(&t) > 0,
            "a tenant holding most of the budget was not persisted"
        );
    }

    /// A request that goes away while its tenant opens leaves no entry holding an open
    /// tenant's place (it held one for good: with one place, every other tenant got 503).
    #[tokio::test]
    async fn an_open_left_by_its_request_holds_no_place() {
        let dir = tempfile::tempdir().unwrap();
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let tenants = Tenants::new(
            dir.path().to_owned(),
            Limits::default(),
            Retention::default(),
            pool,
        )
        .max_open(1);
        {
            let mut opening = std::pin::pin!(tenants.for_write("a"));
            loop {
                assert!(
                    futures::poll!(&mut opening).is_pending(),
                    "opened before it could be left"
                );
                let midway = tenants
                    .tenants
                    .lock()
                    .get("a")
                    .is_some_and(|e| e.cell.get().is_none() && Arc::strong_count(&e.cell) > 1);
                if midway {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        let b = tenants.for_write("b").await;
        assert!(b.is_ok(), "{:?}", b.err().map(|e| e.to_string()));
    }

    /// A tenant closed while a query's session still holds its database is opened again
    /// once that session goes: until then the open waits, then answers 503 "still
    /// closing". It met its own database's lock: a 503 "in use by process <our pid>"
    /// naming the server's directory, for as long as the query ran.
    #[tokio::test]
    async fn a_tenant_closed_while_a_query_holds_it_opens_again_once_it_goes() {
        let dir = tempfile::tempdir().unwrap();
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let tenants = Tenants::new(
            dir.path().to_owned(),
            Limits::default(),
            Retention::default(),
            pool,
        )
        .max_open(1);
        tenants.set_closing_wait(std::time::Duration::from_millis(50));
        let a = tenants.for_write("a").await.unwrap();
        let session = a.store.session().unwrap();
        drop(a);
        tenants.for_write("b").await.unwrap(); // closes "a", idle but for the session
        let refused = tenants.for_write("a").await.unwrap_err();
        let message = refused.to_string();
        assert_eq!(refused.status.as_u16(), 503, "{message}");
        assert!(message.contains("still closing"), "{message}");
        assert!(
            !message.contains("process") && !message.contains(&*dir.path().to_string_lossy()),
            "names neither the server's pid nor its directory: {message}"
        );
        // An open already waiting when the session goes is told at once (a wait far past
        // any stall of a loaded machine).
        tenants.set_closing_wait(std::time::Duration::from_secs(600));
        let mut waiting = std::pin::pin!(tenants.wait_closed("a"));
        assert!(
            futures::poll!(&mut waiting).is_pending(),
            "waits while held"
        );
        drop(session);
        waiting.await.unwrap();
        let a = tenants.for_write("a").await;
        assert!(a.is_ok(), "{:?}", a.err().map(|e| e.to_string()));
    }

    /// A tenant's recording rules' stack cache counts in what it holds, and is given back
    /// when it closes (kept with the rules for the server's life, it held up to 70 MB a
    /// tenant that nothing counted or freed).
    #[tokio::test]
    async fn a_closed_tenant_holds_no_stack_cache_of_its_rules() {
        let dir = tempfile::tempdir().unwrap();
        let rule = frostdb_pprof::rules::RecordingRule {
            name: "main_total".into(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            selector: String::new(),
            function: Some("main".into()),
            leaf_only: false,
            keep_labels: vec![],
        };
        let rules = Arc::new(
            crate::rules::Rules::new(
                dir.path(),
                std::collections::BTreeMap::from([("a".to_owned(), vec![rule])]),
                frostdb_pprof::rules::RuleLimits::default(),
            )
            .unwrap(),
        );
        let tenants = Tenants::new(
            dir.path().to_owned(),
            Limits::default(),
            Retention::default(),
            frostdb_core::WorkerPool::new(1).unwrap(),
        )
        .max_open(1)
        .rules(rules.clone());
        let a = tenants.for_write("a").await.unwrap();
        let before = a.memory_bytes();
        let profile = frostdb_pprof::testing::profile(0, 1_000, 3);
        let options = frostdb_pprof::IngestOptions::default()
            .name("process_cpu")
            .timestamp_ms(crate::time::now_ms());
        a.store
            .ingest(&prost::Message::encode_to_vec(&profile), &options)
            .unwrap();
        let recorder = rules.recorder("a").unwrap();
        let cache = recorder.stack_cache_bytes();
        assert!(cache > 0, "the rule's stack cache is filled");
        assert!(a.memory_bytes() >= before + cache, "and counted");
        drop(a);
        tenants.for_write("b").await.unwrap(); // closes "a"
        assert_eq!(recorder.stack_cache(), (0, 0), "given back");
        assert!(recorder.series_bytes() > 0, "its series stay");
        assert!(rules.series_bytes() >= recorder.series_bytes());
    }

    /// A new tenant refused after it was admitted (its open failed, a setting was bad)
    /// leaves its room under `max_tenants`: counted, refused requests for new ids used up
    /// the limit until a restart, though no tenant existed.
    #[tokio::test]
    async fn a_tenant_refused_after_its_admission_uses_none_of_max_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let limits = Limits {
            max_tenants: 2,
            ..Limits::default()
        };
        let tenants = Tenants::new(dir.path().to_owned(), limits, Retention::default(), pool);
        // Tenants whose database cannot be made: a file where each directory goes.
        let root = dir.path().join("tenants");
        std::fs::create_dir_all(&root).unwrap();
        for id in ["x0", "x1", "x2"] {
            std::fs::write(root.join(id), b"").unwrap();
            let failed = tenants.for_write(id).await.unwrap_err();
            assert_eq!(failed.status.as_u16(), 500, "{failed}");
        }
        // A setting refused after its admission (the admission dropped unconfirmed).
        drop(tenants.admit("s0").await.unwrap());
        tenants.for_write("a").await.unwrap();
        tenants.admit("s1").await.unwrap().exists();
        let over = tenants.for_write("b").await.unwrap_err();
        assert_eq!(over.status.as_u16(), 429, "a and s1 exist: {over}");
        assert!(over.to_string().contains("limits.max_tenants"), "{over}");
    }

    /// Two requests of a new tenant admitted at once (two settings written): the one that
    /// fails does not forget the id the other's state is made for, and the limit holds.
    #[tokio::test]
    async fn a_failed_admission_does_not_forget_a_tenant_another_made() {
        let dir = tempfile::tempdir().unwrap();
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let limits = Limits {
            max_tenants: 1,
            ..Limits::default()
        };
        let tenants = Tenants::new(dir.path().to_owned(), limits, Retention::default(), pool);
        let failing = tenants.admit("x").await.unwrap();
        let making = tenants.admit("x").await.unwrap();
        making.exists();
        drop(failing);
        let over = tenants.admit("y").await.unwrap_err();
        assert_eq!(over.status.as_u16(), 429, "x exists: {over}");
        // Both failing: the id is forgotten once the last of them ends.
        let tenants = Tenants::new(
            dir.path().join("other"),
            Limits {
                max_tenants: 1,
                ..Limits::default()
            },
            Retention::default(),
            frostdb_core::WorkerPool::new(1).unwrap(),
        );
        let (a, b) = (
            tenants.admit("x").await.unwrap(),
            tenants.admit("x").await.unwrap(),
        );
        drop(a);
        assert!(
            tenants.admit("y").await.is_err(),
            "x is still being admitted"
        );
        drop(b);
        drop(tenants.admit("y").await.unwrap());
    }

    #[tokio::test]
    async fn a_tenants_directory_that_cannot_be_listed_is_an_error_not_no_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let missing = Tenants::new(
            dir.path().join("none"),
            Limits::default(),
            Retention::default(),
            pool.clone(),
        );
        assert!(missing.existing().await.unwrap().is_empty(), "not made yet");
        // A file where the directory should be: listing it fails (as a directory it may
        // not read would, for a user other than root).
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let unreadable = Tenants::new(file, Limits::default(), Retention::default(), pool);
        let error = unreadable.existing().await.unwrap_err();
        assert!(
            format!("{error:?}").contains("listing tenants"),
            "{error:?}"
        );
    }
}
