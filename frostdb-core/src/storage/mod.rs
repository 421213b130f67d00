//! Persisted blocks: a rotated block written as one sorted Parquet object, streamed row group
//! by row group from bounded slices of its granules, and read back with pruning by block,
//! row group and page statistics.
//!
//! Block layout: `<prefix>/<table>/<block id:020>.parquet`; rows in the table's sort order;
//! one row group per `row_group_rows` rows; pages of at most `granule_rows` rows with page
//! statistics (column index), so a selective predicate reads a few pages; dictionary encoding
//! for dictionary-hinted columns, delta encodings and codecs as the schema hints.

mod keys;
mod pages;
mod read;
mod thrift;
mod upload;
mod write;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;

use crate::io::Io;
use crate::manifest::BlockMeta;

pub(crate) use read::BlockPlan;
pub use upload::Upload;
pub(crate) use write::properties;

/// The object store holding a database's blocks.
pub(crate) struct Storage {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    io: Io,
    /// `store` when it is a local directory: blocks are then read from their files on the
    /// scanning thread, not fetched through the I/O runtime.
    local: Option<Arc<object_store::local::LocalFileSystem>>,
    /// Parquet footers (with page indexes) of blocks read lately, by object path, at most
    /// [`FOOTER_CACHE_BYTES`] of them.
    metadata: Mutex<Lru<read::Footer>>,
    /// Objects of retired blocks no version or scan holds any more, to be deleted by a
    /// [`Storage::reap`] once `grace` has passed since.
    doomed: Mutex<Vec<(String, std::time::Instant)>>,
    /// The writer's lease epoch in a shared bucket, in the names of its blocks (0 elsewhere):
    /// a writer that another took over from can never overwrite the other's blocks.
    epoch: u64,
    /// How long a retired block's object outlives the last holder in this process: other
    /// processes reading the bucket (shared databases) may still be scanning it.
    grace: std::time::Duration,
}

/// A persisted block as versions, snapshots and scans hold it. Retiring it (retention, a
/// caller's deletion) takes it out of the manifest and the current version at once, but its
/// object is deleted only when the last holder lets go: a snapshot taken before keeps
/// reading it (reference counting, as fjall's lsm-tree deletes a segment on its last `Arc`
/// drop). Dropping only queues the object for [`Storage::reap`], so no I/O happens in
/// `drop`, whatever thread it runs on; a queued object a crash leaves behind is an orphan,
/// removed at the next open.
#[derive(Debug)]
pub(crate) struct Block {
    meta: BlockMeta,
    retired: OnceLock<Arc<Storage>>,
    /// Only these row groups are read (a slice of the block another process chose).
    row_groups: Option<std::ops::Range<u32>>,
}

impl Block {
    pub(crate) fn new(meta: BlockMeta) -> Self {
        Self {
            meta,
            retired: OnceLock::new(),
            row_groups: None,
        }
    }

    /// The row groups `row_groups` of block `meta` (all of them when `None`).
    pub(crate) fn slice(meta: BlockMeta, row_groups: Option<std::ops::Range<u32>>) -> Self {
        Self {
            meta,
            retired: OnceLock::new(),
            row_groups,
        }
    }

    /// The row groups scans read, when not all.
    pub(crate) fn row_groups(&self) -> Option<&std::ops::Range<u32>> {
        self.row_groups.as_ref()
    }

    /// Whether scans read row group `i`.
    pub(crate) fn reads_row_group(&self, i: usize) -> bool {
        self.row_groups
            .as_ref()
            .is_none_or(|r| r.contains(&(i as u32)))
    }

    pub(crate) fn meta(&self) -> &BlockMeta {
        &self.meta
    }

    /// Marks the block's object for deletion once nothing holds the block.
    pub(crate) fn retire(&self, storage: &Arc<Storage>) {
        let _ = self.retired.set(storage.clone());
    }
}

impl std::ops::Deref for Block {
    type Target = BlockMeta;

    fn deref(&self) -> &BlockMeta {
        &self.meta
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(storage) = self.retired.get() {
            storage.doomed.lock().push((
                std::mem::take(&mut self.meta.path),
                std::time::Instant::now(),
            ));
        }
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Most bytes of decoded footers a database keeps: a footer may be 64 MiB (a block of
/// many row groups and columns, or a hostile one), and a tenant of thousands of blocks
/// would otherwise keep every one it ever read for as long as the block lives.
pub(crate) const FOOTER_CACHE_BYTES: usize = 128 << 20;

/// Values by key, at most `budget` bytes of them (each as its inserter sizes it), the least
/// recently used dropped first. A value larger than the whole budget is not kept.
pub(crate) struct Lru<V> {
    entries: HashMap<String, (V, usize, u64)>,
    bytes: usize,
    budget: usize,
    clock: u64,
}

impl<V: Clone> Lru<V> {
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: HashMap::new(),
            bytes: 0,
            budget,
            clock: 0,
        }
    }

    pub(crate) fn get(&mut self, key: &str) -> Option<V> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(v, _, used)| {
            *used = clock;
            v.clone()
        })
    }

    pub(crate) fn insert(&mut self, key: String, value: V, bytes: usize) {
        self.remove(&key);
        if bytes > self.budget {
            return;
        }
        while self.bytes + bytes > self.budget {
            // Few entries (a budget's worth of footers): a scan beats keeping an order.
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.remove(&oldest);
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.insert(key, (value, bytes, self.clock));
    }

    pub(crate) fn remove(&mut self, key: &str) {
        if let Some((_, bytes, _)) = self.entries.remove(key) {
            self.bytes -= bytes;
        }
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Storage {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, prefix: ObjectPath, io: Io) -> Self {
        Self {
            store,
            prefix,
            io,
            local: None,
            metadata: Mutex::new(Lru::new(FOOTER_CACHE_BYTES)),
            doomed: Mutex::new(Vec::new()),
            epoch: 0,
            grace: std::time::Duration::ZERO,
        }
    }

    /// Names new blocks with the writer's lease `epoch`, and keeps retired blocks' objects
    /// for `grace` (shared databases).
    pub(crate) fn shared(mut self, epoch: u64, grace: std::time::Duration) -> Self {
        self.epoch = epoch;
        self.grace = grace;
        self
    }

    /// Marks `store` as the local directory `local` (the same store), so blocks are read
    /// from their files directly.
    pub(crate) fn with_local(
        mut self,
        local: Option<Arc<object_store::local::LocalFileSystem>>,
    ) -> Self {
        self.local = local;
        self
    }

    /// Deletes the objects of retired blocks nothing holds any more (for the grace period);
    /// returns how many. One that fails stays queued for the next call.
    pub(crate) fn reap(&self) -> usize {
        let now = std::time::Instant::now();
        let due: Vec<(String, std::time::Instant)> = {
            let mut doomed = self.doomed.lock();
            let (due, wait) = doomed
                .drain(..)
                .partition(|(_, since)| now.duration_since(*since) >= self.grace);
            *doomed = wait;
            due
        };
        let mut deleted = 0;
        for (path, since) in due {
            match self.delete(&path) {
                Ok(()) => deleted += 1,
                Err(error) => {
                    tracing::warn!(%error, "deleting a retired block failed; retried later");
                    self.doomed.lock().push((path, since));
                }
            }
        }
        deleted
    }

    /// Objects of retired blocks waiting for [`Storage::reap`].
    pub(crate) fn doomed(&self) -> usize {
        self.doomed.lock().len()
    }

    /// Deletes the objects under `table`'s prefix that `keep` does not list: blocks written
    /// before a crash kept them out of the manifest, or retired before their deletion ran.
    /// Runs at open, before anything can read or write the table's blocks. In a shared
    /// bucket only objects older than the grace period go: a block the previous writer
    /// retired may still be read by other processes.
    pub(crate) fn delete_orphans(
        &self,
        table: &str,
        keep: &std::collections::HashSet<&str>,
    ) -> crate::Result<Vec<String>> {
        let (store, prefix) = (self.store.clone(), self.prefix.clone().join(table));
        let listed = self.io.run(async move {
            use futures::TryStreamExt;
            store
                .list(Some(&prefix))
                .map_ok(|m| (m.location.to_string(), m.last_modified.timestamp_millis()))
                .try_collect::<Vec<_>>()
                .await
        })?;
        let listed = listed.map_err(|source| crate::Error::ObjectStore {
            context: format!("listing the blocks of table {table:?}"),
            source,
        })?;
        let old_enough =
            |modified_ms: &i64| crate::now_ms() - modified_ms >= self.grace.as_millis() as i64;
        let orphans: Vec<String> = listed
            .into_iter()
            .filter(|(p, modified)| {
                p.ends_with(".parquet") && !keep.contains(p.as_str()) && old_enough(modified)
            })
            .map(|(p, _)| p)
            .collect();
        for path in &orphans {
            self.delete(path)?;
        }
        self.delete_staging(&self.prefix.clone().join(table))?;
        Ok(orphans)
    }

    /// Deletes what uploads cut off by a crash left in a local directory: the local store
    /// writes a block as `<block>.parquet#<n>` and renames it once whole, and does not list
    /// such files, so nothing else would ever delete them. Only those older than the grace
    /// period: one may be an upload in progress.
    fn delete_staging(&self, dir: &ObjectPath) -> crate::Result<()> {
        let Some(local) = &self.local else {
            return Ok(());
        };
        let io = |source: std::io::Error, what: &std::path::Path| crate::Error::Io {
            context: format!("deleting cut-off uploads in {}", what.display()),
            source,
        };
        let Ok(dir) = local.path_to_filesystem(dir) else {
            return Ok(());
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(e, &dir)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io(e, &dir))?;
            let staging = entry.file_name().to_string_lossy().contains(".parquet#");
            let old_enough = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= self.grace);
            if staging && old_enough {
                std::fs::remove_file(entry.path()).map_err(|e| io(e, &entry.path()))?;
            }
        }
        Ok(())
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(crate) fn prefix(&self) -> &ObjectPath {
        &self.prefix
    }

    pub(crate) fn io(&self) -> &Io {
        &self.io
    }

    /// Forgets what was cached of a block this process no longer reads (a reader following
    /// a bucket whose writer merged or expired it).
    pub(crate) fn forget(&self, path: &str) {
        self.metadata.lock().remove(path);
    }

    /// Where block `id` of `table` lives (with the writer's epoch in a shared bucket).
    pub(crate) fn block_path(&self, table: &str, id: u64) -> ObjectPath {
        let name = match self.epoch {
            0 => format!("{id:020}.parquet"),
            // A name of its own for each write: a writer whose manifest update landed unseen
            // may give a later block the same id, and must not overwrite the block the
            // bucket's manifest names.
            epoch => format!("{id:020}-{epoch}-{:016x}.parquet", write_nonce()),
        };
        self.prefix.clone().join(table).join(name)
    }

    /// Deletes a block's object (a missing one is fine: deletion is idempotent).
    pub(crate) fn delete(&self, path: &str) -> crate::Result<()> {
        self.metadata.lock().remove(path);
        let (store, location) = (self.store.clone(), ObjectPath::from(path));
        let shown = path.to_owned();
        match self.io.run(async move {
            use object_store::ObjectStoreExt;
            store.delete(&location).await
        })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(crate::Error::ObjectStore {
                context: format!("deleting block {shown}"),
                source,
            }),
        }
    }
}

/// A number unlikely to repeat: a fresh random hash of a counter.
pub(crate) fn write_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::Lru;

    /// Footers are kept within their budget, the least recently read dropped first, and one
    /// larger than the whole budget not kept at all.
    #[test]
    fn an_lru_keeps_within_its_budget_dropping_the_least_recently_used() {
        let mut lru = Lru::new(100);
        lru.insert("a".into(), 1, 40);
        lru.insert("b".into(), 2, 40);
        assert_eq!(lru.get("a"), Some(1));
        lru.insert("c".into(), 3, 40);
        assert_eq!(
            (lru.get("a"), lru.get("b"), lru.get("c")),
            (Some(1), None, Some(3))
        );
        assert_eq!(lru.bytes(), 80);
        lru.insert("huge".into(), 4, 101);
        assert_eq!(lru.get("huge"), None);
        assert_eq!(lru.bytes(), 80);
        // Inserted again at another size: counted once, at its new size.
        lru.insert("a".into(), 5, 60);
        assert_eq!(lru.get("a"), Some(5));
        assert!(lru.bytes() <= 100, "{}", lru.bytes());
        lru.remove("a");
        lru.remove("c");
        assert_eq!(lru.bytes(), 0);
    }
}
