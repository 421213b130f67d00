//! Fault-injecting layers for the model test: a file system that keeps a live and a durable
//! image of every file (as redb's crash tests do) and an object store that fails on command.
//!
//! [`FaultFs`]: a write changes the live image; `sync_data` copies a file's live bytes to its
//! durable image; a directory's entries (created, renamed, removed files) become durable at
//! `sync_dir`. [`FaultFs::crash`] returns the file system a restarted machine sees, built
//! from the durable images only, optionally with a torn prefix of each file's unsynced
//! appends; the crashed instance fails every later call, so the dying database cannot touch
//! the new image. Faults: a full disk (writes fail with `StorageFull` after writing part of
//! their bytes) and failing fsyncs.
//!
//! [`FaultStore`]: an `InMemory` store whose next operations fail (`fail_next`), or whose
//! next writes take effect but report a timeout (`time_out_next`): the caller cannot tell
//! whether they happened.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use frostdb_core::Error;
use frostdb_core::fs::{FileSystem, WritableFile};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use parking_lot::Mutex;

#[derive(Default, Debug)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
}

type Node = Arc<Mutex<Inode>>;

#[derive(Default)]
struct State {
    /// Directory entries as the running system sees them.
    live: BTreeMap<PathBuf, Node>,
    /// Directory entries as they are on disk (what a crash keeps).
    durable: BTreeMap<PathBuf, Node>,
    dirs: HashSet<PathBuf>,
    locked: HashSet<PathBuf>,
}

/// What a [`FaultFs`] injects.
#[derive(Default)]
struct Faults {
    /// Writes fail with `StorageFull` (after writing half their bytes).
    full: AtomicBool,
    /// The next this many fsyncs fail with EIO.
    failing_syncs: AtomicUsize,
    /// Cuts (`set_len`) still to fail.
    failing_cuts: AtomicUsize,
    /// When not 0: the disk fills at this many writes from now (the writes before it, a
    /// new WAL segment's header, succeed).
    full_in: AtomicUsize,
    /// Set once crashed: every call fails.
    dead: AtomicBool,
}

/// A file system with live and durable images (see the module docs).
#[derive(Clone, Default)]
pub(crate) struct FaultFs {
    state: Arc<Mutex<State>>,
    faults: Arc<Faults>,
}

impl fmt::Debug for FaultFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FaultFs")
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected: {what}"))
}

impl Faults {
    fn alive(&self) -> io::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(eio("the machine crashed"));
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.alive()?;
        let failed = self
            .failing_syncs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            return Err(eio("fsync failed"));
        }
        Ok(())
    }
}

impl FaultFs {
    /// Sets whether the disk is full.
    pub(crate) fn set_full(&self, full: bool) {
        self.faults.full.store(full, Ordering::SeqCst);
    }

    /// Makes the next `n` fsyncs (of files or directories) fail.
    pub(crate) fn fail_syncs(&self, n: usize) {
        self.faults.failing_syncs.store(n, Ordering::SeqCst);
    }

    /// The next `n` cuts of a file being written (`set_len`) fail.
    pub(crate) fn fail_cuts(&self, n: usize) {
        self.faults.failing_cuts.store(n, Ordering::SeqCst);
    }

    /// The disk fills at the `n`th write from now (0: not by this).
    pub(crate) fn full_in(&self, n: usize) {
        self.faults.full_in.store(n, Ordering::SeqCst);
    }

    /// The file system after a crash of this one: durable entries with their durable bytes,
    /// and with `torn`, each file keeps `keep(unsynced_len)` bytes of what was appended past
    /// its durable image (a write reaching the disk in part). This instance dies.
    pub(crate) fn crash(&self, torn: Option<&dyn Fn(usize) -> usize>) -> FaultFs {
        self.faults.dead.store(true, Ordering::SeqCst);
        let state = self.state.lock();
        let mut next = State {
            dirs: state.dirs.clone(),
            ..State::default()
        };
        for (path, node) in &state.durable {
            let inode = node.lock();
            let mut bytes = inode.durable.clone();
            if let Some(keep) = torn
                && inode.live.len() > bytes.len()
                && inode.live.starts_with(&bytes)
            {
                let extra = &inode.live[bytes.len()..];
                bytes.extend_from_slice(&extra[..keep(extra.len()).min(extra.len())]);
            }
            let node = Arc::new(Mutex::new(Inode {
                live: bytes.clone(),
                durable: bytes,
            }));
            next.live.insert(path.clone(), node.clone());
            next.durable.insert(path.clone(), node);
        }
        FaultFs {
            state: Arc::new(Mutex::new(next)),
            faults: Arc::new(Faults::default()),
        }
    }

    fn node(&self, path: &Path) -> io::Result<Node> {
        self.faults.alive()?;
        self.state
            .lock()
            .live
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }
}

struct FaultFile {
    node: Node,
    faults: Arc<Faults>,
}

impl WritableFile for FaultFile {
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        self.faults.alive()?;
        let mut inode = self.node.lock();
        let filled = self
            .faults
            .full_in
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            == Ok(1);
        if filled {
            self.faults.full.store(true, Ordering::SeqCst);
        }
        if self.faults.full.load(Ordering::SeqCst) {
            inode.live.extend_from_slice(&buf[..buf.len() / 2]);
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected: no space left on device",
            ));
        }
        inode.live.extend_from_slice(buf);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.faults.sync()?;
        let mut inode = self.node.lock();
        inode.durable = inode.live.clone();
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.faults.alive()?;
        let failed = self
            .faults
            .failing_cuts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            return Err(eio("ftruncate failed"));
        }
        self.node.lock().live.resize(len as usize, 0);
        Ok(())
    }
}

impl FileSystem for FaultFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.faults.alive()?;
        let mut state = self.state.lock();
        for d in dir.ancestors() {
            state.dirs.insert(d.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.faults.alive()?;
        let state = self.state.lock();
        if !state.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                dir.display().to_string(),
            ));
        }
        Ok(state
            .live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        Ok(self.node(path)?.lock().live.clone())
    }

    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn Read + Send>, u64)> {
        let bytes = self.read(path)?;
        let len = bytes.len() as u64;
        Ok((Box::new(io::Cursor::new(bytes)), len))
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn WritableFile>> {
        self.faults.alive()?;
        let mut state = self.state.lock();
        if !path.parent().is_some_and(|d| state.dirs.contains(d)) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                path.display().to_string(),
            ));
        }
        // Truncating an existing file empties the same inode; creating makes a new one.
        let node = match state.live.get(path) {
            Some(node) => {
                node.lock().live.clear();
                node.clone()
            }
            None => {
                let node = Node::default();
                state.live.insert(path.to_path_buf(), node.clone());
                node
            }
        };
        Ok(Box::new(FaultFile {
            node,
            faults: self.faults.clone(),
        }))
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let node = self.node(path)?;
        self.faults.sync()?;
        let mut inode = node.lock();
        inode.durable = inode.live.clone();
        Ok(())
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let node = self.node(path)?;
        self.faults.sync()?;
        let mut inode = node.lock();
        inode.live.resize(len as usize, 0);
        inode.durable = inode.live.clone();
        Ok(())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(self.node(path)?.lock().live.len() as u64)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.faults.alive()?;
        let mut state = self.state.lock();
        let node = state
            .live
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.display().to_string()))?;
        state.live.insert(to.to_path_buf(), node);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.faults.alive()?;
        self.state
            .lock()
            .live
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path.display().to_string()))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.faults.sync()?;
        let mut state = self.state.lock();
        let state = &mut *state;
        state.durable.retain(|p, _| p.parent() != Some(dir));
        for (p, node) in &state.live {
            if p.parent() == Some(dir) {
                state.durable.insert(p.clone(), node.clone());
            }
        }
        Ok(())
    }

    fn lock(&self, dir: &Path) -> frostdb_core::Result<Box<dyn Send + Sync>> {
        struct Guard(Arc<Mutex<State>>, PathBuf);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.lock().locked.remove(&self.1);
            }
        }
        if !self.state.lock().locked.insert(dir.to_path_buf()) {
            return Err(Error::Locked {
                dir: dir.to_path_buf(),
                holder: "this process".into(),
            });
        }
        Ok(Box::new(Guard(self.state.clone(), dir.to_path_buf())))
    }
}

/// An in-memory object store that fails on command (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct FaultStore {
    inner: InMemory,
    /// The next this many operations fail without effect.
    failing: AtomicUsize,
    /// The next this many writes (puts, deletes) take effect, then report a timeout.
    timing_out: AtomicUsize,
    /// The next put to a path ending so takes effect, then reports a timeout.
    timing_out_at: parking_lot::Mutex<Option<String>>,
    /// Puts ignore their conditions (as some S3-compatible servers do).
    unconditional: std::sync::atomic::AtomicBool,
    /// The next this many parts of multipart uploads fail.
    failing_parts: AtomicUsize,
    /// Multipart uploads begun and neither completed nor aborted: S3 keeps their parts.
    open_uploads: AtomicUsize,
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FaultStore")
    }
}

fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultStore",
        source: format!("injected: {what}").into(),
    }
}

impl FaultStore {
    /// Makes the next `n` operations fail.
    pub(crate) fn fail_next(&self, n: usize) {
        self.failing.store(n, Ordering::SeqCst);
    }

    /// Makes the next `n` parts of multipart uploads fail.
    #[allow(dead_code)] // not every test binary uses it
    pub(crate) fn fail_next_parts(&self, n: usize) {
        self.failing_parts.store(n, Ordering::SeqCst);
    }

    /// Multipart uploads begun and neither completed nor aborted.
    #[allow(dead_code)] // not every test binary uses it
    pub(crate) fn open_uploads(&self) -> usize {
        self.open_uploads.load(Ordering::SeqCst)
    }

    /// Makes the next `n` writes take effect but report a timeout.
    pub(crate) fn time_out_next(&self, n: usize) {
        self.timing_out.store(n, Ordering::SeqCst);
    }

    /// Makes the next put to a path ending in `suffix` take effect but report a timeout.
    #[allow(dead_code)] // not every test binary uses it
    pub(crate) fn time_out_next_put_to(&self, suffix: &str) {
        *self.timing_out_at.lock() = Some(suffix.to_owned());
    }

    /// Makes every put ignore its condition (`If-None-Match`, `If-Match`).
    #[allow(dead_code)] // not every test binary uses it
    pub(crate) fn ignore_conditions(&self) {
        self.unconditional.store(true, Ordering::SeqCst);
    }

    /// Whether operations are set to fail.
    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::SeqCst) > 0
    }

    /// Clears every armed fault.
    pub(crate) fn heal(&self) {
        self.fail_next(0);
        self.time_out_next(0);
        self.failing_parts.store(0, Ordering::SeqCst);
    }

    fn check(&self, op: &str) -> object_store::Result<()> {
        if take(&self.failing) {
            return Err(injected(&format!("{op} failed")));
        }
        Ok(())
    }

    fn after_write<T>(&self, op: &str, result: object_store::Result<T>) -> object_store::Result<T> {
        let value = result?;
        if take(&self.timing_out) {
            return Err(injected(&format!("{op} timed out (it happened)")));
        }
        Ok(value)
    }
}

#[derive(Debug)]
struct FaultUpload {
    inner: Box<dyn MultipartUpload>,
    store: Arc<FaultStore>,
}

#[async_trait]
impl MultipartUpload for FaultUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        if take(&self.store.failing_parts) {
            return Box::pin(async { Err(injected("a part's upload failed")) });
        }
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.store.check("complete")?;
        let result = self.inner.complete().await;
        if result.is_ok() {
            self.store.open_uploads.fetch_sub(1, Ordering::SeqCst);
        }
        self.store.after_write("complete", result)
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.store.open_uploads.fetch_sub(1, Ordering::SeqCst);
        self.inner.abort().await
    }
}

/// An `Arc<FaultStore>` as an object store (multipart uploads need the shared counters).
#[derive(Debug, Clone)]
pub(crate) struct Faulty(pub(crate) Arc<FaultStore>);

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.0.check("put")?;
        let mut opts = opts;
        if self.0.unconditional.load(Ordering::SeqCst) {
            opts.mode = object_store::PutMode::Overwrite;
        }
        let result = self.0.inner.put_opts(location, payload, opts).await;
        let mut at = self.0.timing_out_at.lock();
        if result.is_ok()
            && at
                .as_deref()
                .is_some_and(|suffix| location.as_ref().ends_with(suffix))
        {
            *at = None;
            return Err(injected("put timed out (it happened)"));
        }
        drop(at);
        self.0.after_write("put", result)
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.check("multipart upload")?;
        let inner = self.0.inner.put_multipart_opts(location, opts).await?;
        self.0.open_uploads.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(FaultUpload {
            inner,
            store: self.0.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.0.check("get")?;
        self.0.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        let store = self.0.clone();
        locations
            .then(move |location| {
                let store = store.clone();
                async move {
                    let location = location?;
                    store.check("delete")?;
                    let deleted = store
                        .inner
                        .delete_stream(futures::stream::iter([Ok(location)]).boxed())
                        .next()
                        .await
                        .expect("one result per location");
                    store.after_write("delete", deleted)
                }
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Err(e) = self.0.check("list") {
            return futures::stream::iter([Err(e)]).boxed();
        }
        self.0.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.0.check("list")?;
        self.0.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.0.check("copy")?;
        let result = self.0.inner.copy_opts(from, to, options).await;
        self.0.after_write("copy", result)
    }
}
