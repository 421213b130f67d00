//! Debug info files by build id, kept in the database's object store beside its blocks
//! (`<prefix>/debuginfo/<build id>/debuginfo`, with its upload's state in `…/metadata`):
//! what Parca Agent uploads through Parca's `DebuginfoService`, for the symbolizer to read.
//!
//! An upload is asked for ([`DebugInfoStore::should_initiate`]), begun
//! ([`DebugInfoStore::initiate`], which hands out an upload id), streamed
//! ([`DebugInfoStore::upload`], straight to the object store in parts: a file is never held
//! whole in memory) and marked finished ([`DebugInfoStore::finish`]), as Parca's server
//! does it (parca-dev/parca `pkg/debuginfo/store.go`; the decisions and the reason the agent
//! matches are its, the code is our own). Stricter than Parca: a build id is hex (it names
//! an object path), an upload may not pass the size it announced, and a finished ELF file
//! whose GNU build id note names another build id is refused and deleted.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use frostdb_core::Upload;
use futures::{Stream, StreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

/// The messages of `parca.debuginfo.v1alpha1` (`proto/parca/debuginfo.proto`).
#[allow(missing_docs, clippy::all, rust_2018_idioms)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/parca.debuginfo.v1alpha1.rs"));
}

/// The reason Parca Agent waits on (and retries after): matched by the agent as it is.
pub const REASON_IN_PROGRESS: &str =
    "A previous upload is still in-progress and not stale yet (only stale uploads can be retried).";
/// First sight of a build id.
pub const REASON_FIRST_TIME: &str = "First time we see this Build ID, and it does not exist in debuginfod, therefore please upload!";
/// An upload finished before.
pub const REASON_EXISTS: &str =
    "Debuginfo already exists and is not marked as invalid, therefore no new upload is needed.";
/// A stale upload may be retried.
pub const REASON_STALE: &str =
    "A previous upload was started but not finished and is now stale, so it can be retried.";
/// Forced.
pub const REASON_FORCED: &str = "The upload is forced.";

/// What went wrong, as the gRPC status it answers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad request (`InvalidArgument`).
    #[error("{0}")]
    Invalid(String),
    /// Nothing to upload (`AlreadyExists`).
    #[error("{0}")]
    Exists(String),
    /// Not now (`FailedPrecondition`).
    #[error("{0}")]
    Precondition(String),
    /// No such upload (`NotFound`).
    #[error("{0}")]
    NotFound(String),
    /// The store's files would pass its quota (`ResourceExhausted`).
    #[error("{0}")]
    Quota(String),
    /// The object store failed.
    #[error("debug info store: {0}")]
    Store(#[from] object_store::Error),
}

type Result<T> = std::result::Result<T, Error>;

/// State of a build id's upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Begun, not finished.
    Uploading,
    /// Finished: the file is there.
    Uploaded,
}

/// A build id's upload, as `…/metadata` keeps it (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Metadata {
    /// Where the upload is.
    pub state: State,
    /// The id [`DebugInfoStore::initiate`] handed out.
    pub upload_id: String,
    /// The file's hash, as the agent sent it.
    pub hash: String,
    /// Bytes announced, then (once uploaded) received.
    pub size: u64,
    /// When it began and finished (ms since the epoch).
    pub started_at_ms: i64,
    /// When it finished.
    pub finished_at_ms: Option<i64>,
}

/// Debug info files by build id in an object store.
#[derive(Debug, Clone)]
pub struct DebugInfoStore {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    max_size: u64,
    max_upload_duration: Duration,
    /// Most bytes its files (kept, and being uploaded as announced) may take together.
    max_total: u64,
}

/// An upload being received: dropped unfinished, its parts written so far are aborted and
/// the upload is forgotten (on the runtime it was received on, as both are async). An
/// object store keeps the parts of a multipart upload never completed nor aborted (S3
/// bills them until a lifecycle rule deletes them): a client that began uploads of a
/// gigabyte and left each midway grew the bucket by what it sent, counted by no quota.
/// (The file's [`Upload`] aborts itself when dropped, also midway through its `finish`;
/// held here, it is aborted before the upload is forgotten.)
struct Unfinished {
    upload: Option<(DebugInfoStore, String, String)>,
    file: Option<Upload>,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let (upload, file) = (self.upload.take(), self.file.take());
        if upload.is_none() && file.is_none() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Some(file) = file {
                    file.abort().await;
                }
                if let Some((store, build_id, upload_id)) = upload {
                    store.forget(&build_id, &upload_id).await;
                    tracing::info!(build_id, "an upload dropped unfinished is forgotten");
                }
            });
        }
    }
}

/// The lock an upload's quota check holds until the upload is recorded, one per store
/// ([`DebugInfoStore::scope`]) while anything holds it.
fn quota_lock(scope: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: KeyedLocks = KeyedLocks::new();
    LOCKS.of(scope)
}

/// An async lock per key (a tenant, a store's scope), made on first use and forgotten once
/// nobody holds it: work on one key waits only for work on the same key.
#[derive(Debug, Default)]
pub struct KeyedLocks(
    parking_lot::Mutex<
        Option<std::collections::HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>,
    >,
);

impl KeyedLocks {
    /// No locks yet.
    pub const fn new() -> Self {
        Self(parking_lot::Mutex::new(None))
    }

    /// The lock of `key`.
    pub fn of(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.0.lock();
        let locks = locks.get_or_insert_with(Default::default);
        locks.retain(|_, lock| lock.strong_count() > 0);
        if let Some(lock) = locks.get(key).and_then(std::sync::Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(key.to_owned(), Arc::downgrade(&lock));
        lock
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The first bytes of every ELF file.
const ELF_MAGIC: &[u8] = b"\x7fELF";

fn not_elf() -> Error {
    Error::Invalid(
        "the upload is not an ELF file (it does not begin with \\x7fELF): only ELF debug \
         files and binaries are symbolized"
            .into(),
    )
}

/// A build id fit to name an object: hex (a GNU build id, a file hash), 4 to 128 digits.
pub fn check_build_id(build_id: &str) -> Result<()> {
    if !(4..=128).contains(&build_id.len()) || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Invalid(format!(
            "build id {:?} is not 4 to 128 hex digits",
            build_id.chars().take(140).collect::<String>()
        )));
    }
    Ok(())
}

impl DebugInfoStore {
    /// Files under `prefix/debuginfo/` in `store`, each at most `max_size` bytes; an upload
    /// not finished within `max_upload_duration` (and 2 minutes more) may be begun again.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        max_size: u64,
        max_upload_duration: Duration,
    ) -> Self {
        Self {
            store,
            prefix: prefix.clone().join("debuginfo"),
            max_size,
            max_upload_duration,
            max_total: u64::MAX,
        }
    }

    /// At most `bytes` of files kept and being uploaded together: an upload that would pass
    /// it is refused before it begins ([`Error::Quota`]).
    pub fn with_quota(mut self, bytes: u64) -> Self {
        self.max_total = bytes;
        self
    }

    /// Bytes of the files kept, and of the uploads in progress (not stale) as announced,
    /// but `build_id`'s own (an upload replacing it).
    async fn used(&self, build_id: &str) -> Result<u64> {
        let mut kept = std::collections::HashMap::<String, u64>::new();
        let mut uploading = Vec::new();
        let mut objects = self.store.list(Some(&self.prefix));
        while let Some(object) = objects.next().await {
            let object = object?;
            let mut parts = object
                .location
                .prefix_match(&self.prefix)
                .into_iter()
                .flatten();
            let (Some(build), Some(name)) = (parts.next(), parts.next()) else {
                continue;
            };
            let build = build.as_ref().to_owned();
            if build == build_id {
                continue;
            }
            match name.as_ref() {
                "debuginfo" => {
                    kept.insert(build, object.size);
                }
                "metadata" => uploading.push(build),
                _ => {}
            }
        }
        let mut used: u64 = kept.values().sum();
        for build in uploading.iter().filter(|b| !kept.contains_key(*b)) {
            if let Some(m) = self.metadata(build).await?
                && m.state == State::Uploading
                && now_ms() <= self.stale_after(&m)
            {
                used = used.saturating_add(m.size);
            }
        }
        Ok(used)
    }

    /// When an upload begun as `m` is stale: another may begin.
    fn stale_after(&self, m: &Metadata) -> i64 {
        m.started_at_ms + self.max_upload_duration.as_millis() as i64 + 120_000
    }

    /// What tells this store's files apart from another's (a tenant's from another
    /// tenant's): a hash of its object store and prefix, 16 hex digits.
    pub fn scope(&self) -> String {
        let named = format!("{}/{}", self.store, self.prefix);
        format!(
            "{:016x}",
            twox_hash::XxHash3_128::oneshot(named.as_bytes()) as u64
        )
    }

    /// Where `build_id`'s `name` is kept: under the build id in lower case, as the
    /// symbolizer looks it up (a Parca agent may send it in upper case; kept as sent, it
    /// was accepted and never used).
    fn path(&self, build_id: &str, name: &str) -> ObjectPath {
        self.prefix
            .clone()
            .join(build_id.to_ascii_lowercase())
            .join(name)
    }

    /// The upload state of `build_id`, if any.
    pub async fn metadata(&self, build_id: &str) -> Result<Option<Metadata>> {
        check_build_id(build_id)?;
        match self.store.get(&self.path(build_id, "metadata")).await {
            Ok(r) => {
                let bytes = r.bytes().await?;
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| Error::Invalid(format!("metadata of {build_id}: {e}")))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn put_metadata(&self, build_id: &str, m: &Metadata) -> Result<()> {
        let json = serde_json::to_vec(m).map_err(|e| Error::Invalid(e.to_string()))?;
        self.store
            .put(&self.path(build_id, "metadata"), PutPayload::from(json))
            .await?;
        Ok(())
    }

    /// Whether the agent should upload `build_id`'s file, and why.
    pub async fn should_initiate(
        &self,
        build_id: &str,
        force: bool,
    ) -> Result<(bool, &'static str)> {
        let Some(m) = self.metadata(build_id).await? else {
            return Ok((true, REASON_FIRST_TIME));
        };
        Ok(match m.state {
            State::Uploading if force => (true, REASON_FORCED),
            State::Uploading => {
                if now_ms() > self.stale_after(&m) {
                    (true, REASON_STALE)
                } else {
                    (false, REASON_IN_PROGRESS)
                }
            }
            State::Uploaded if force => (true, REASON_FORCED),
            State::Uploaded => (false, REASON_EXISTS),
        })
    }

    /// Begins an upload of `size` bytes: its upload id.
    pub async fn initiate(
        &self,
        build_id: &str,
        size: i64,
        hash: &str,
        force: bool,
    ) -> Result<String> {
        if hash.is_empty() {
            return Err(Error::Invalid("the upload has no hash".into()));
        }
        let size = u64::try_from(size)
            .ok()
            .filter(|s| *s > 0)
            .ok_or_else(|| Error::Invalid(format!("size {size} is not positive")))?;
        if size > self.max_size {
            return Err(Error::Invalid(format!(
                "a debug info file of {size} bytes is over the limit of {} bytes",
                self.max_size
            )));
        }
        let (should, reason) = self.should_initiate(build_id, force).await?;
        if !should {
            return Err(if reason == REASON_EXISTS {
                Error::Exists(reason.into())
            } else {
                Error::Precondition(reason.into())
            });
        }
        // The check and the upload it lets begin, one at a time per store in this process:
        // two uploads checked together would each fit, and both begin.
        let _checking = quota_lock(&self.scope()).lock_owned().await;
        if self.max_total != u64::MAX {
            let used = self.used(build_id).await?;
            if used.saturating_add(size) > self.max_total {
                return Err(Error::Quota(format!(
                    "the debug files kept and being uploaded take {used} bytes: {size} more \
                     would pass the limit of {} bytes",
                    self.max_total
                )));
            }
        }
        let upload_id = random_id();
        self.put_metadata(
            build_id,
            &Metadata {
                state: State::Uploading,
                upload_id: upload_id.clone(),
                hash: hash.to_owned(),
                size,
                started_at_ms: now_ms(),
                finished_at_ms: None,
            },
        )
        .await?;
        tracing::info!(build_id, size, "debug info upload begun");
        Ok(upload_id)
    }

    /// Streams the file of an upload begun with `upload_id` to the object store, in parts;
    /// the bytes received. More bytes than announced is an error, and nothing is kept.
    pub async fn upload<S>(&self, build_id: &str, upload_id: &str, mut chunks: S) -> Result<u64>
    where
        S: Stream<Item = Result<Bytes>> + Unpin,
    {
        let m = self.uploading(build_id, upload_id).await?;
        // An upload dropped before it ends (its request cut by a deadline, its client
        // gone) is forgotten too: left, it answered "in progress" to every retry and held
        // its size of the quota until stale.
        let mut unfinished = Unfinished {
            upload: Some((self.clone(), build_id.into(), upload_id.into())),
            file: None,
        };
        let file = unfinished.file.insert(Upload::new(
            self.store.clone(),
            self.path(build_id, "debuginfo"),
        ));
        let mut size = 0u64;
        // The first bytes, until they show whether this is an ELF file: nothing else is
        // symbolized, so nothing else is kept (a tenant's store is not a place for any
        // bytes at all).
        let mut magic = Vec::with_capacity(ELF_MAGIC.len());
        let failed = loop {
            match chunks.next().await {
                None if magic.len() < ELF_MAGIC.len() => break Some(not_elf()),
                None => break None,
                Some(Err(e)) => break Some(e),
                Some(Ok(chunk)) => {
                    if magic.len() < ELF_MAGIC.len() {
                        let take = chunk.len().min(ELF_MAGIC.len() - magic.len());
                        magic.extend_from_slice(&chunk[..take]);
                        if !ELF_MAGIC.starts_with(&magic) {
                            break Some(not_elf());
                        }
                    }
                    size += chunk.len() as u64;
                    if size > m.size {
                        break Some(Error::Invalid(format!(
                            "the upload sent more than the {} bytes it announced",
                            m.size
                        )));
                    }
                    if let Err(e) = file.write(chunk).await {
                        break Some(e.into());
                    }
                }
            }
        };
        let file = unfinished.file.take().expect("put there above");
        if let Some(e) = failed {
            file.abort().await;
            self.forget(build_id, upload_id).await;
            unfinished.upload = None;
            return Err(e);
        }
        // A failure aborts the file's parts; the upload is forgotten (by `unfinished`).
        file.finish().await?;
        unfinished.upload = None;
        Ok(size)
    }

    /// Gives up the upload `upload_id` of `build_id` (it failed, or was refused), if it is
    /// still the one begun last: the next may begin at once, not once it is stale.
    async fn forget(&self, build_id: &str, upload_id: &str) {
        if self.metadata(build_id).await.is_ok_and(|m| {
            m.is_some_and(|m| m.upload_id == upload_id && m.state == State::Uploading)
        }) {
            let _ = self.store.delete(&self.path(build_id, "metadata")).await;
        }
    }

    async fn uploading(&self, build_id: &str, upload_id: &str) -> Result<Metadata> {
        let m = self
            .metadata(build_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no upload of {build_id} was begun")))?;
        if m.upload_id != upload_id {
            return Err(Error::Invalid(format!(
                "upload id {upload_id:?} is not the upload of {build_id} begun last"
            )));
        }
        if m.state != State::Uploading {
            return Err(Error::Precondition(format!(
                "the upload of {build_id} is finished"
            )));
        }
        Ok(m)
    }

    /// Marks an upload finished: its file is kept if it is what it says. An ELF file whose
    /// GNU build id is not `build_id` is refused and deleted.
    pub async fn finish(&self, build_id: &str, upload_id: &str) -> Result<()> {
        let mut m = self.uploading(build_id, upload_id).await?;
        let path = self.path(build_id, "debuginfo");
        let head = self
            .store
            .head(&path)
            .await
            .map_err(|_| Error::Precondition(format!("no file was uploaded for {build_id}")))?;
        if let Some(found) = self.elf_build_id(&path, head.size).await?
            && !found.eq_ignore_ascii_case(build_id)
        {
            let _ = self.store.delete(&path).await;
            self.forget(build_id, upload_id).await;
            return Err(Error::Invalid(format!(
                "the uploaded file's GNU build id is {found}, not {build_id}"
            )));
        }
        m.state = State::Uploaded;
        m.size = head.size;
        m.finished_at_ms = Some(now_ms());
        self.put_metadata(build_id, &m).await?;
        tracing::info!(build_id, size = head.size, "debug info uploaded");
        Ok(())
    }

    /// The file of `build_id`, if uploaded.
    pub async fn get(&self, build_id: &str) -> Result<Option<Bytes>> {
        match self.metadata(build_id).await? {
            Some(m) if m.state == State::Uploaded => Ok(Some(
                self.store
                    .get(&self.path(build_id, "debuginfo"))
                    .await?
                    .bytes()
                    .await?,
            )),
            _ => Ok(None),
        }
    }

    /// Streams the file of `build_id`, if uploaded, to `to` (never held whole): whether
    /// there was one.
    pub async fn download_to(&self, build_id: &str, to: &std::path::Path) -> Result<bool> {
        use std::io::Write;
        match self.metadata(build_id).await? {
            Some(m) if m.state == State::Uploaded => {}
            _ => return Ok(false),
        }
        let mut stream = self
            .store
            .get(&self.path(build_id, "debuginfo"))
            .await?
            .into_stream();
        let local = |e: std::io::Error| Error::Precondition(format!("{}: {e}", to.display()));
        let mut file = std::fs::File::create(to).map_err(local)?;
        while let Some(chunk) = stream.next().await {
            file.write_all(&chunk?).map_err(local)?;
        }
        file.sync_all().map_err(local)?;
        Ok(true)
    }

    /// The GNU build id of an ELF file in the store (its note segments, read by range), or
    /// `None` when it is not ELF or has none.
    async fn elf_build_id(&self, path: &ObjectPath, size: u64) -> Result<Option<String>> {
        let range = |start: u64, len: u64| start..(start + len).min(size);
        if size < 64 {
            return Ok(None);
        }
        let header = self.store.get_range(path, range(0, 64)).await?;
        let Some(elf) = Elf::header(&header) else {
            return Ok(None);
        };
        let table_len = u64::from(elf.phnum) * u64::from(elf.phentsize);
        if elf.phentsize < 56 && elf.class64 || table_len > 64 << 10 || elf.phoff >= size {
            return Ok(None);
        }
        let table = self
            .store
            .get_range(path, range(elf.phoff, table_len))
            .await?;
        for entry in table.chunks_exact(usize::from(elf.phentsize)) {
            let Some((offset, len)) = elf.note_segment(entry) else {
                continue;
            };
            if offset >= size || len > 1 << 20 {
                continue;
            }
            let notes = self.store.get_range(path, range(offset, len)).await?;
            if let Some(id) = elf.gnu_build_id(&notes) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }
}

/// A loadable segment of an ELF file: where its bytes are in the file, and at which
/// virtual address they are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoadSegment {
    pub(crate) offset: u64,
    pub(crate) vaddr: u64,
    pub(crate) filesz: u64,
}

/// The `PT_LOAD` segments of the ELF file at `path` (empty when it is not ELF). A separate
/// debug file (`objcopy --only-keep-debug`) keeps them with no bytes in the file.
pub(crate) fn load_segments(path: &std::path::Path) -> std::io::Result<Vec<LoadSegment>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    let mut header = [0u8; 64];
    if size < 64 {
        return Ok(Vec::new());
    }
    file.read_exact_at(&mut header, 0)?;
    let Some(elf) = Elf::header(&header) else {
        return Ok(Vec::new());
    };
    let table_len = u64::from(elf.phnum) * u64::from(elf.phentsize);
    if elf.phentsize < 56 && elf.class64
        || table_len > 64 << 10
        || elf
            .phoff
            .checked_add(table_len)
            .is_none_or(|end| end > size)
    {
        return Ok(Vec::new());
    }
    let mut table = vec![0u8; table_len as usize];
    file.read_exact_at(&mut table, elf.phoff)?;
    Ok(table
        .chunks_exact(usize::from(elf.phentsize))
        .filter(|p| elf.u32(p) == 1)
        .map(|p| {
            if elf.class64 {
                LoadSegment {
                    offset: elf.u64(&p[8..]),
                    vaddr: elf.u64(&p[16..]),
                    filesz: elf.u64(&p[32..]),
                }
            } else {
                LoadSegment {
                    offset: u64::from(elf.u32(&p[4..])),
                    vaddr: u64::from(elf.u32(&p[8..])),
                    filesz: u64::from(elf.u32(&p[16..])),
                }
            }
        })
        .collect())
}

/// What an ELF header says of where its program headers are.
struct Elf {
    class64: bool,
    little: bool,
    phoff: u64,
    phentsize: u16,
    phnum: u16,
}

impl Elf {
    fn u16(&self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        if self.little {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }
    }

    fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.little {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    }

    fn u64(&self, b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        if self.little {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    }

    fn header(h: &[u8]) -> Option<Self> {
        if h.len() < 64 || &h[..4] != b"\x7fELF" {
            return None;
        }
        let class64 = h[4] == 2;
        let mut e = Self {
            class64,
            little: h[5] == 1,
            phoff: 0,
            phentsize: 0,
            phnum: 0,
        };
        if class64 {
            e.phoff = e.u64(&h[32..]);
            e.phentsize = e.u16(&h[54..]);
            e.phnum = e.u16(&h[56..]);
        } else {
            e.phoff = u64::from(e.u32(&h[28..]));
            e.phentsize = e.u16(&h[42..]);
            e.phnum = e.u16(&h[44..]);
        }
        (e.phentsize >= 32).then_some(e)
    }

    /// A `PT_NOTE` program header's file offset and size.
    fn note_segment(&self, p: &[u8]) -> Option<(u64, u64)> {
        if self.u32(p) != 4 {
            return None;
        }
        Some(if self.class64 {
            (self.u64(&p[8..]), self.u64(&p[32..]))
        } else {
            (u64::from(self.u32(&p[4..])), u64::from(self.u32(&p[16..])))
        })
    }

    /// The `NT_GNU_BUILD_ID` note's id, in hex.
    fn gnu_build_id(&self, mut notes: &[u8]) -> Option<String> {
        let pad = |n: usize| n.div_ceil(4) * 4;
        while notes.len() >= 12 {
            let name_len = self.u32(notes) as usize;
            let desc_len = self.u32(&notes[4..]) as usize;
            let kind = self.u32(&notes[8..]);
            let name_end = 12usize.checked_add(pad(name_len))?;
            let desc_end = name_end.checked_add(pad(desc_len))?;
            if desc_end > notes.len() {
                return None;
            }
            if kind == 3 && &notes[12..12 + name_len] == b"GNU\0" {
                let desc = &notes[name_end..name_end + desc_len];
                return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
            }
            notes = &notes[desc_end..];
        }
        None
    }
}

/// 128 random bits in hex, for an upload id.
fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    let mut parts = [0u64; 2];
    for (i, part) in parts.iter_mut().enumerate() {
        let mut h = state.build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_usize(i);
        *part = h.finish();
    }
    format!("{:016x}{:016x}", parts[0], parts[1])
}
