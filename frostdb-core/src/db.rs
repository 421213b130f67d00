//! The database: tables, their WALs, the manifest, the object store for persisted blocks,
//! recovery on open, and the background workers that compact, persist and expire.
//!
//! On-disk layout of `Db::open(dir)`:
//! - `dir/manifest.json`: tables and their persisted blocks (see `manifest`)
//! - `dir/wal/<first tx>.wal`: WAL segments, one log for every table (see `wal::record`)
//! - `dir/blocks/<table>/<block id>.parquet`: persisted blocks, unless another object
//!   store is given ([`Db::open_with_store`])
//! - `dir/LOCK`: locked by the one writer (exclusively, holding its pid) or by readers
//!   ([`Db::open_read_only`], shared)
//!
//! A database shared through a bucket ([`Db::open_shared`] writes it, [`Db::open_reader`]
//! follows it) has everything under its prefix: `lease.json` (the writer's lease),
//! `manifest.json`, `wal/<seq>.wal` (one object per sync) and `<table>/<id>-<epoch>.parquet`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use parking_lot::RwLock;

use crate::commit::CommitLog;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::manifest::{ManifestFile, TableEntry};
use crate::options::{DbOptions, SharedOptions, TableOptions};
use crate::schema::{Schema, validate_static_name};
use crate::storage::Storage;
use crate::table::{Durable, Log, Table, TableConfig};
use crate::transaction::Transaction;
use crate::wal::{self, FileWal, Wal};
use crate::workers::{Maintenance, WorkerMessage, WorkerPool, Workers};

/// A database: named tables sharing background workers and, on disk, a manifest, WALs and
/// an object store of persisted blocks.
///
/// Cheap to clone; the workers stop when the last clone is dropped. `Send + Sync`.
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
/// use arrow::record_batch::RecordBatch;
/// use frostdb_core::{ColumnDef, Db, DbOptions, Encoding, Schema, ScanRequest, SortingColumn,
///     TableOptions, col};
///
/// let dir = tempfile::tempdir()?;
/// let schema = Schema::builder("samples")
///     .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
///     .column(ColumnDef::new("value", DataType::Int64))
///     .sort_by(SortingColumn::asc("labels"))
///     .build()?;
/// let batch = RecordBatch::try_new(
///     Arc::new(ArrowSchema::new(vec![
///         Field::new("labels.pod", DataType::Utf8, true),
///         Field::new("value", DataType::Int64, false),
///     ])),
///     vec![
///         Arc::new(StringArray::from(vec!["a", "b"])),
///         Arc::new(Int64Array::from(vec![1, 2])),
///     ],
/// )?;
/// {
///     let db = Db::open(dir.path(), DbOptions::default())?;
///     let table = db.table("samples", schema.clone(), TableOptions::default())?;
///     table.insert(&batch)?; // durable in the WAL when this returns
/// }
/// // Reopening replays the WAL.
/// let db = Db::open(dir.path(), DbOptions::default())?;
/// let table = db.table("samples", schema, TableOptions::default())?;
/// let rows: usize = table
///     .scan(&ScanRequest::new().filter(col("labels.pod").eq("b")))?
///     .iter()
///     .map(|b| b.num_rows())
///     .sum();
/// assert_eq!(rows, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Db {
    inner: Arc<DbInner>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("dir", &self.inner.disk.as_ref().map(|d| &d.dir))
            .field(
                "manifest",
                &self.inner.disk.as_ref().map(|d| d.manifest.location()),
            )
            .field(
                "tables",
                &self.inner.tables.read().keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What an on-disk database has.
struct Disk {
    /// The directory of the WAL, the manifest and the lock; `None` for a database shared
    /// through a bucket, which keeps them there.
    dir: Option<PathBuf>,
    storage: Arc<Storage>,
    manifest: Arc<ManifestFile>,
    /// How a shared database is written (`None`: not shared, or read-only).
    shared: Option<SharedOptions>,
    read_only: bool,
}

struct DbInner {
    options: DbOptions,
    log: Arc<Log>,
    tables: RwLock<HashMap<String, Table>>,
    workers: Workers,
    /// Keeps the pool running while the database lives (its only holder, unless shared).
    _pool: WorkerPool,
    disk: Option<Disk>,
    /// The database's own periodic tasks (cuts of a shared database), which the workers
    /// hold weakly.
    tasks: parking_lot::Mutex<Vec<Arc<dyn Maintenance>>>,
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

impl Db {
    /// Opens a database that keeps everything in memory: no WAL, no persistence.
    pub fn open_in_memory(options: DbOptions) -> Result<Self> {
        let pool = Self::pool(&options)?;
        Self::start(options, pool, None, None)
    }

    /// The pool the options name, or a database's own.
    fn pool(options: &DbOptions) -> Result<WorkerPool> {
        match &options.workers {
            Some(pool) => Ok(pool.clone()),
            None => WorkerPool::new(1),
        }
    }

    /// Opens (or creates) the database in directory `dir`, with persisted blocks under
    /// `dir/blocks`. Recovers every table: persisted blocks from the manifest, then the WAL
    /// after the last persisted transaction.
    pub fn open(dir: impl AsRef<Path>, options: DbOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let blocks = dir.join("blocks");
        std::fs::create_dir_all(&blocks)
            .map_err(io_err(format!("creating {}", blocks.display())))?;
        let store = Self::local_blocks(&blocks)?;
        Self::open_in(dir, store.clone(), "", Some(store), options)
    }

    /// The object store of a database directory's persisted blocks, `dir/blocks`.
    fn local_blocks(blocks: &Path) -> Result<Arc<LocalFileSystem>> {
        let store =
            LocalFileSystem::new_with_prefix(blocks).map_err(|source| Error::ObjectStore {
                context: format!("opening {}", blocks.display()),
                source,
            })?;
        Ok(Arc::new(store))
    }

    /// Opens (or creates) the database with its WAL and manifest in `dir` and its persisted
    /// blocks in `store` under `prefix` (any `object_store`: local files, memory, S3, ...).
    /// The manifest is mirrored to the store, so an empty `dir` reopens what the store has
    /// persisted.
    ///
    /// The WAL is cut once a block is in `store`: the store's puts must be durable when they
    /// return, as S3's, GCS's and Azure's are. object_store's `LocalFileSystem` does not sync
    /// what it writes (a power cut could lose a block whose rows the WAL no longer holds):
    /// for a local directory use [`Db::open`], which syncs each block before naming it.
    pub fn open_with_store(
        dir: impl AsRef<Path>,
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        options: DbOptions,
    ) -> Result<Self> {
        Self::open_in(dir, store, prefix, None, options)
    }

    /// [`Self::open_with_store`]; `local` is `store` itself when it is the local directory
    /// [`Self::open`] made, so that blocks are read from their files directly.
    fn open_in(
        dir: impl AsRef<Path>,
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        local: Option<Arc<LocalFileSystem>>,
        options: DbOptions,
    ) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fs = options.file_system.clone();
        let made = matches!(fs.list(&dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        fs.create_dir_all(&dir)
            .map_err(io_err(format!("creating {}", dir.display())))?;
        // The directory's own entry, made here, is durable before anything written in it
        // is acknowledged (the manifest's and blocks' syncs cover only the entries inside it).
        if let Some(parent) = dir.parent().filter(|_| made) {
            let parent = match parent.as_os_str().is_empty() {
                true => Path::new("."),
                false => parent,
            };
            fs.sync_dir(parent)
                .map_err(io_err(format!("syncing {}", parent.display())))?;
        }
        // Before reading anything: another owner may be writing it.
        let lock = fs.lock(&dir)?;
        let pool = Self::pool(&options)?;
        let io = pool.io()?;
        let prefix = ObjectPath::from(prefix);
        let manifest = Arc::new(ManifestFile::open(
            fs,
            &dir,
            Some((store.clone(), prefix.clone(), io.clone())),
        )?);
        let storage = Arc::new(Storage::new(store, prefix, io).with_local(local));
        tracing::info!(dir = %dir.display(), store = %storage.store(), prefix = %storage.prefix(), "opening database");
        let db = Self::start(
            options,
            pool,
            Some(Disk {
                dir: Some(dir),
                storage,
                manifest,
                shared: None,
                read_only: false,
            }),
            Some(lock),
        )?;
        db.recover()?;
        Ok(db)
    }

    /// Opens the database at `prefix` of a bucket shared with other processes, as its one
    /// writer: everything is in the bucket (lease, manifest, WAL, blocks), nothing on local
    /// disk, so any process can take over. Takes the writer's lease (
    /// [`Error::LeaseHeld`] while another writer's runs), fences the previous writer off
    /// (see `lease`), replays the WAL objects it left, and from then on persists every
    /// table's new data in one cut every `flush_interval`, merging small blocks as they
    /// pile up. A write is acknowledged once its WAL object is in the bucket.
    ///
    /// The store must support conditional puts (S3 and its kin, or memory; not local files).
    pub fn open_shared(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        options: DbOptions,
        shared: SharedOptions,
    ) -> Result<Self> {
        shared.validate()?;
        let pool = Self::pool(&options)?;
        let io = pool.io()?;
        let prefix = ObjectPath::from(prefix);
        check_conditional_puts(&store, &prefix, &io)?;
        let lease = Lease::acquire(
            store.clone(),
            &prefix,
            io.clone(),
            &shared.holder,
            shared.lease_ttl,
        )?;
        let manifest = Self::stamp_manifest(&store, &prefix, &io, &lease)?;
        let storage = Arc::new(
            Storage::new(store, prefix.clone(), io).shared(lease.epoch(), shared.retire_grace),
        );
        tracing::info!(store = %storage.store(), prefix = %prefix, holder = lease.holder(), epoch = lease.epoch(), "opening shared database as its writer");
        let (every, merge_blocks) = (shared.flush_interval, shared.merge_blocks);
        let db = Self::start(
            options,
            pool,
            Some(Disk {
                dir: None,
                storage,
                manifest: Arc::new(manifest),
                shared: Some(shared),
                read_only: false,
            }),
            Some(Box::new(LeaseGuard(lease.clone()))),
        )?;
        db.recover()?;
        let (alive, log) = (Arc::downgrade(&db.inner.log), Arc::downgrade(&db.inner.log));
        lease.keep(
            move || alive.strong_count() > 0,
            move |error| {
                if let Some(log) = log.upgrade() {
                    log.poison(error.to_string());
                }
            },
        );
        let cutter: Arc<dyn Maintenance> = Arc::new(Cutter {
            log: Arc::downgrade(&db.inner.log),
            merge_blocks,
        });
        db.run_every(cutter, every);
        Ok(db)
    }

    /// The bucket's manifest, stamped with the lease's epoch by a conditional put: from
    /// then on the previous writer's manifest updates fail. A writer that updated it
    /// meanwhile (before it noticed anything) makes this read it again.
    fn stamp_manifest(
        store: &Arc<dyn ObjectStore>,
        prefix: &ObjectPath,
        io: &crate::io::Io,
        lease: &Lease,
    ) -> Result<ManifestFile> {
        for _ in 0..10 {
            let manifest = ManifestFile::open_bucket(store.clone(), prefix, io.clone(), false)?;
            if manifest.snapshot().epoch > lease.epoch() {
                return Err(lease.fenced("a newer writer stamped the manifest"));
            }
            match manifest.update(|m| {
                m.epoch = lease.epoch();
                Ok(())
            }) {
                Ok(()) => return Ok(manifest),
                Err(Error::Fenced { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(lease.fenced("the manifest keeps changing under the previous writer"))
    }

    /// Opens the database in directory `dir` (as [`Db::open`] made it) read-only, changing no
    /// file: for commands that only read. Every table is recovered into memory: persisted
    /// blocks from the manifest, then the WAL after them (a torn tail is skipped and left as
    /// it is). Nothing is persisted, compacted in the background or expired, and writes fail
    /// with [`Error::ReadOnly`]; the database does not follow later writes (reopen it).
    ///
    /// Shares the directory's lock with other readers: fails with [`Error::Locked`] while a
    /// writer has it open, and a writer cannot open it while this database lives. Fails
    /// with [`Error::Io`] (`NotFound`) when `dir` holds no database.
    pub fn open_read_only(dir: impl AsRef<Path>, options: DbOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fs = options.file_system.clone();
        Self::check_database(&*fs, &dir)?;
        // Before reading anything: a writer may be changing it.
        let lock = fs.lock_shared(&dir)?;
        let pool = Self::pool(&options)?;
        let io = pool.io()?;
        let blocks = dir.join("blocks");
        let (store, local): (Arc<dyn ObjectStore>, _) = if blocks.is_dir() {
            let store = Self::local_blocks(&blocks)?;
            (store.clone(), Some(store))
        } else {
            // Nothing was ever persisted (and the manifest lists no block).
            (Arc::new(object_store::memory::InMemory::new()), None)
        };
        let prefix = ObjectPath::from("");
        let manifest =
            ManifestFile::open(fs, &dir, Some((store.clone(), prefix.clone(), io.clone())))?
                .read_only();
        let storage = Arc::new(Storage::new(store, prefix, io).with_local(local));
        tracing::info!(dir = %dir.display(), "opening database read-only");
        let db = Self::start(
            options,
            pool,
            Some(Disk {
                dir: Some(dir),
                storage,
                manifest: Arc::new(manifest),
                shared: None,
                read_only: true,
            }),
            lock,
        )?;
        db.recover()?;
        Ok(db)
    }

    /// Fails unless `dir` holds a database: a manifest, or a WAL (a database whose tables
    /// were never created has only that).
    fn check_database(fs: &dyn crate::fs::FileSystem, dir: &Path) -> Result<()> {
        let names = fs
            .list(dir)
            .map_err(io_err(format!("opening database {}", dir.display())))?;
        if names.iter().any(|n| n == crate::manifest::FILE_NAME)
            || fs.list(&dir.join("wal")).is_ok()
        {
            return Ok(());
        }
        Err(Error::Io {
            context: format!(
                "opening database {} read-only: no database there (neither {} nor wal/)",
                dir.display(),
                crate::manifest::FILE_NAME
            ),
            source: std::io::ErrorKind::NotFound.into(),
        })
    }

    /// Opens the database at `prefix` of a shared bucket read-only: a follower of what its
    /// writer persisted (at most the writer's `flush_interval` behind, once
    /// [`Db::refresh`] runs). Nothing is written, locally or to the bucket; writes fail with
    /// [`Error::ReadOnly`]. A prefix without a database opens empty (with no tables).
    pub fn open_reader(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        options: DbOptions,
    ) -> Result<Self> {
        let pool = Self::pool(&options)?;
        let io = pool.io()?;
        let prefix = ObjectPath::from(prefix);
        let manifest = ManifestFile::open_bucket(store.clone(), &prefix, io.clone(), true)?;
        let storage = Arc::new(Storage::new(store, prefix.clone(), io));
        let db = Self::start(
            options,
            pool,
            Some(Disk {
                dir: None,
                storage,
                manifest: Arc::new(manifest),
                shared: None,
                read_only: true,
            }),
            None,
        )?;
        for (name, entry) in db.manifest_tables()? {
            let table = db.table_from_entry(&name, entry)?;
            db.inner.tables.write().insert(name, table);
        }
        Ok(db)
    }

    /// Reads the bucket's manifest again (a read-only follower of a bucket; a directory opened
    /// read-only is read once, and this returns `false`): tables get the blocks its
    /// writer persisted since, and new tables appear. Tables are changed in the order the
    /// writer created them, so that one read after another (samples after the symbols they
    /// use) never sees the later one's new rows without the earlier one's. Returns whether
    /// anything changed. Blocks no longer listed are dropped, never deleted (the writer
    /// deletes them after its grace period).
    pub fn refresh(&self) -> Result<bool> {
        let disk = self.inner.disk.as_ref().ok_or(Error::Closed)?;
        if !disk.read_only {
            return Ok(false);
        }
        let Some(manifest) = disk.manifest.refresh()? else {
            return Ok(false);
        };
        let mut entries: Vec<(String, TableEntry)> = manifest.tables.into_iter().collect();
        entries.sort_by_key(|(name, entry)| (entry.seq, name.clone()));
        // In creation order, stopping at a table that cannot be followed (a block naming a
        // column this build cannot resolve): the tables after it may hold rows that use its
        // (symbols before samples). The manifest is then read again at the next refresh,
        // which fails again rather than finding it read and answering on old blocks.
        for (name, entry) in entries {
            let existing = self.inner.tables.read().get(&name).cloned();
            let followed = match existing {
                Some(table) => table.inner.follow(entry),
                None => self.table_from_entry(&name, entry).map(|table| {
                    self.inner.tables.write().insert(name.clone(), table);
                }),
            };
            if let Err(e) = followed {
                tracing::warn!(table = %name, error = %e, "a table of the bucket's manifest could not be followed");
                disk.manifest.unsee();
                return Err(e);
            }
        }
        Ok(true)
    }

    /// The manifest's tables in the order they were created.
    fn manifest_tables(&self) -> Result<Vec<(String, TableEntry)>> {
        let disk = self.inner.disk.as_ref().ok_or(Error::Closed)?;
        let mut entries: Vec<(String, TableEntry)> =
            disk.manifest.snapshot().tables.into_iter().collect();
        entries.sort_by_key(|(name, entry)| (entry.seq, name.clone()));
        Ok(entries)
    }

    /// Runs `task` on the persistence thread every `every`, for as long as the database
    /// lives.
    fn run_every(&self, task: Arc<dyn Maintenance>, every: std::time::Duration) {
        if let Some(worker) = &self.inner.workers.persistence {
            let _ = worker.send(WorkerMessage::Maintenance(Arc::downgrade(&task), every));
        }
        self.inner.tasks.lock().push(task);
    }

    fn start(
        options: DbOptions,
        pool: WorkerPool,
        disk: Option<Disk>,
        lock: Option<Box<dyn Send + Sync>>,
    ) -> Result<Self> {
        // Where a read-only database is, for its refusals.
        let read_only = disk.as_ref().filter(|d| d.read_only).map(|d| match &d.dir {
            Some(dir) => dir.display().to_string(),
            None => d.storage.prefix().to_string(),
        });
        let writes = disk.is_some() && read_only.is_none();
        let workers = pool.assign(
            options.background_compaction && read_only.is_none(),
            writes,
            options.retention_interval,
        );
        let persistence = workers.persistence.clone();
        let log = CommitLog::new(
            writes,
            options.max_wal_bytes,
            persistence.clone(),
            lock,
            read_only,
        );
        Ok(Self {
            inner: Arc::new(DbInner {
                options,
                log,
                tables: RwLock::new(HashMap::new()),
                workers,
                _pool: pool,
                disk,
                tasks: parking_lot::Mutex::new(Vec::new()),
            }),
        })
    }

    /// Opens every table of the manifest, then replays the WAL into them: each write of a
    /// record goes to its table unless that table has persisted it already. Replay persists
    /// blocks as they fill, so its memory stays within a block per table whatever the WAL's
    /// length. A shared database's WAL is its objects in the bucket, after which this
    /// writer creates the next one (the fence: see `wal::objects`). A read-only database
    /// replays into memory only, and opens no WAL to write.
    fn recover(&self) -> Result<()> {
        let Some(disk) = &self.inner.disk else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let mut persisted: HashMap<String, u64> = HashMap::new();
        for (name, entry) in self.manifest_tables()? {
            persisted.insert(name.clone(), entry.persisted_tx);
            let table = self.table_from_entry(&name, entry)?;
            self.inner.tables.write().insert(name, table);
        }
        let tables = self.inner.tables.read().clone();
        let log = &self.inner.log;
        let mut applied = 0usize;
        let mut apply = |tx: u64, payload: Vec<u8>, (segment, offset): (&str, u64)| {
            let corrupt = |reason: String| Error::WalCorrupt {
                segment: segment.to_owned(),
                offset,
                reason: format!("transaction {tx}: {reason}"),
            };
            let entries = wal::record::decode_entries(&payload).map_err(corrupt)?;
            for (name, batch) in entries {
                let table = tables.get(&name).ok_or_else(|| {
                    corrupt(format!(
                        "it writes to table {name:?}, which the manifest does not have"
                    ))
                })?;
                if tx > persisted.get(&name).copied().unwrap_or(0) {
                    let prepared = table
                        .inner
                        .replayable(&batch)
                        .map_err(|e| corrupt(format!("table {name:?}: {e}")))?;
                    if let Some(prepared) = prepared {
                        table.inner.apply_replayed(tx, prepared)?;
                        applied += 1;
                    }
                }
            }
            log.replayed(tx);
            Ok(())
        };
        let newest_persisted = persisted.values().copied().max().unwrap_or(0);
        let (replayed, wal) = match &disk.dir {
            Some(dir) if disk.read_only => {
                let fs = self.inner.options.file_system.clone();
                let replayed = wal::replay_read_only(&*fs, &dir.join("wal"), &mut apply)?;
                (replayed, None)
            }
            Some(dir) => {
                let dir = dir.join("wal");
                let fs = self.inner.options.file_system.clone();
                let (replayed, kept) = wal::replay(&*fs, &dir, 0, &mut apply)?;
                let next_tx = log
                    .next_tx()
                    .max(replayed.last_tx + 1)
                    .max(replayed.newest_segment)
                    .max(newest_persisted + 1);
                let wal = FileWal::open(
                    fs,
                    &dir,
                    self.inner.options.durability,
                    self.inner.options.wal_segment_bytes,
                    kept,
                    next_tx,
                )?;
                (replayed, Some(Wal::Files(wal)))
            }
            None => {
                let (store, io) = (disk.storage.store().clone(), disk.storage.io().clone());
                let dir = disk.storage.prefix().clone().join("wal");
                let mut replayed = wal::Replayed::default();
                let mut kept = Vec::new();
                let mut from = 0;
                let mut fence = None;
                // Whatever the previous writer put meanwhile is read before the fence holds.
                for _ in 0..100 {
                    let (read, next) =
                        wal::objects::replay(&store, &dir, &io, from, &mut replayed, &mut apply)?;
                    kept.extend(read);
                    if wal::objects::fence(&store, &dir, &io, next)? {
                        fence = Some(next);
                        break;
                    }
                    from = next;
                }
                let fence = fence.ok_or_else(|| Error::Fenced {
                    prefix: disk.storage.prefix().to_string(),
                    reason: "another writer keeps writing the WAL".into(),
                })?;
                let wal = wal::objects::ObjectWal::open(
                    store,
                    dir,
                    io,
                    self.inner.options.durability,
                    kept,
                    fence,
                );
                (replayed, Some(Wal::Objects(wal)))
            }
        };
        let next_tx = log
            .next_tx()
            .max(replayed.last_tx + 1)
            .max(replayed.newest_segment)
            .max(newest_persisted + 1);
        if let Some(wal) = wal {
            log.attach(wal, next_tx);
            // What replay froze and kept to persist together ([`TableInner::apply_replayed`]).
            for table in tables.values() {
                table.inner.persist_frozen()?;
            }
            log.truncate()?;
        }
        for table in tables.values() {
            table.inner.watch();
            let stats = table.stats();
            tracing::info!(table = %table.name(), rows = stats.rows, blocks = stats.blocks, "table recovered");
        }
        if replayed.records > 0 {
            tracing::info!(
                records = replayed.records,
                writes = applied,
                last_tx = replayed.last_tx,
                seconds = started.elapsed().as_secs_f64(),
                "WAL replayed"
            );
        }
        Ok(())
    }

    /// Builds a table from its manifest entry (its blocks); the WAL is replayed afterwards.
    fn table_from_entry(&self, name: &str, entry: TableEntry) -> Result<Table> {
        let disk = self.inner.disk.as_ref().ok_or(Error::Closed)?;
        // Objects the manifest does not list: written before a crash kept them out of it,
        // or retired before their deletion ran. Nothing reads them; they only take space.
        // (A reader deletes nothing.)
        if !disk.read_only {
            let keep: std::collections::HashSet<&str> =
                entry.blocks.iter().map(|b| b.path.as_str()).collect();
            let orphans = disk.storage.delete_orphans(name, &keep)?;
            if !orphans.is_empty() {
                tracing::info!(
                    table = name,
                    orphans = orphans.len(),
                    "deleted orphaned block objects"
                );
            }
        }
        Table::new(TableConfig {
            name: name.to_owned(),
            schema: entry.schema,
            options: entry.options,
            listener: self.inner.options.listener.clone(),
            workers: self.inner.workers.clone(),
            log: self.inner.log.clone(),
            durable: Some(Durable {
                storage: disk.storage.clone(),
                manifest: disk.manifest.clone(),
                shared: disk.shared.is_some(),
            }),
            blocks: entry.blocks,
            persisted_tx: entry.persisted_tx,
        })
    }

    /// Starts a transaction: writes to several tables of this database that become durable
    /// and visible together (see [`Transaction`]).
    pub fn transaction(&self) -> Transaction {
        Transaction::new(self.inner.log.clone())
    }

    /// Opens the table `name`, creating it with `schema` and `options` if it does not exist
    /// (on disk, the creation is durable before this returns). An existing table must have
    /// the same schema (compression hints aside: [`Schema::same_rows_as`]); its stored
    /// schema and options are kept.
    pub fn table(&self, name: &str, schema: Schema, options: TableOptions) -> Result<Table> {
        validate_static_name(name)?;
        options.validate()?;
        if options.ttl.is_some() {
            crate::table::check_time_column(&schema, &options.time_column)?;
        }
        let mut tables = self.inner.tables.write();
        if let Some(table) = tables.get(name) {
            if !table.schema().same_rows_as(&schema) {
                return Err(Error::SchemaMismatch {
                    table: name.to_owned(),
                });
            }
            return Ok(table.clone());
        }
        self.inner
            .log
            .refuse(|| format!("creating table {name:?}"))?;
        let table = match &self.inner.disk {
            None => Table::new(TableConfig {
                name: name.to_owned(),
                schema,
                options,
                listener: self.inner.options.listener.clone(),
                workers: self.inner.workers.clone(),
                log: self.inner.log.clone(),
                durable: None,
                blocks: Vec::new(),
                persisted_tx: 0,
            })?,
            Some(disk) => {
                let mut entry = TableEntry {
                    schema,
                    options,
                    persisted_tx: 0,
                    next_block_id: 1,
                    blocks: Vec::new(),
                    seq: 0,
                };
                disk.manifest.update(|m| {
                    entry.seq = m.tables.values().map(|t| t.seq + 1).max().unwrap_or(1);
                    m.tables.insert(name.to_owned(), entry.clone());
                    Ok(())
                })?;
                let table = self.table_from_entry(name, entry)?;
                table.inner.watch();
                table
            }
        };
        tables.insert(name.to_owned(), table.clone());
        tracing::info!(table = name, "table created");
        Ok(table)
    }

    /// The table `name`, if it exists.
    pub fn get_table(&self, name: &str) -> Option<Table> {
        self.inner.tables.read().get(name).cloned()
    }

    /// All tables, in name order.
    pub fn tables(&self) -> Vec<Table> {
        let mut tables: Vec<Table> = self.inner.tables.read().values().cloned().collect();
        tables.sort_by(|a, b| a.name().cmp(b.name()));
        tables
    }

    /// The object store of the database's persisted blocks and the prefix it keeps them
    /// under (`None` for a database in memory): where an embedder keeps its own objects
    /// beside them, under a name no table has (the server's uploaded debug info).
    pub fn object_store(
        &self,
    ) -> Option<(Arc<dyn object_store::ObjectStore>, object_store::path::Path)> {
        let disk = self.inner.disk.as_ref()?;
        Some((disk.storage.store().clone(), disk.storage.prefix().clone()))
    }

    /// Persists the active data of every table (rotating the active blocks) and waits for
    /// it: on return, nothing depends on the WAL. For a clean shutdown; nothing is lost
    /// without it either. A shared database persists every table in one cut; a read-only
    /// one writes nothing (what it replayed from the WAL stays there).
    pub fn flush(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        if self.inner.disk.as_ref().is_some_and(|d| d.shared.is_some()) {
            return crate::table::cut(&self.inner.log).map(|_| ());
        }
        for table in self.tables() {
            table.persist()?;
        }
        Ok(())
    }

    /// Merges small persisted blocks of every table until none are left to merge (a shared
    /// database; its cuts do this in the background after each one). Returns the merges.
    pub fn merge_blocks(&self) -> Result<usize> {
        let Some(fanout) = self
            .inner
            .disk
            .as_ref()
            .and_then(|d| d.shared.as_ref())
            .map(|s| s.merge_blocks)
            .filter(|&f| f >= 2)
        else {
            return Ok(0);
        };
        let mut merges = 0;
        for table in self.inner.log.tables() {
            while table.merge_blocks(fanout)?.is_some() {
                merges += 1;
            }
        }
        Ok(merges)
    }

    /// When this instance of the database is wholly closed: every handle to it (its tables,
    /// sessions and scans over them, its background work) dropped and its directory lock
    /// released. Opening the directory again before then fails with [`Error::Locked`], even
    /// in this process: wait on this first.
    pub fn closed(&self) -> crate::Closed {
        self.inner.log.closed()
    }

    /// Why the database stopped accepting writes, if it has: a failed fsync or WAL upload,
    /// or (a shared database) its lease taken by another writer. Reopen it to write again.
    pub fn stopped(&self) -> Option<String> {
        self.inner.log.wal().and_then(Wal::poisoned)
    }

    /// How mirroring the manifest to the object store has gone: failures since open, and
    /// why the mirror is behind while it is (see [`crate::MirrorHealth`]). `None` for a
    /// database whose manifest is not mirrored (in memory, or one shared through a bucket,
    /// whose manifest is the bucket's).
    pub fn mirror_health(&self) -> Option<crate::MirrorHealth> {
        self.inner.disk.as_ref()?.manifest.mirror_health()
    }

    /// Whether the database is read-only: a follower of a bucket ([`Db::open_reader`]) or a
    /// directory opened to read ([`Db::open_read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.inner.disk.as_ref().is_some_and(|d| d.read_only)
    }

    /// What the write-ahead log did since open (none for an in-memory database).
    pub fn wal_stats(&self) -> Option<crate::wal::WalStats> {
        self.inner.log.wal().map(|w| w.stats())
    }

    /// Registers `task` to run on the database's maintenance thread after each retention
    /// pass (every `retention_interval`), for as long as the task is alive (the database
    /// holds it weakly). On-disk databases only: an in-memory one has no retention.
    pub fn add_maintenance(&self, task: std::sync::Weak<dyn Maintenance>) {
        if let Some(worker) = &self.inner.workers.persistence {
            let _ = worker.send(WorkerMessage::Maintenance(
                task,
                self.inner.workers.retention_interval,
            ));
        }
    }
}

/// Holds a shared database's lease while the database lives; gives it up when the database
/// closes, so the next writer need not wait for it to run out.
struct LeaseGuard(Arc<Lease>);

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Err(error) = self.0.release() {
            tracing::warn!(%error, "giving the lease up failed; it runs out by itself");
        }
    }
}

/// The periodic cut of a shared database: every table's new data persisted at once, then
/// small blocks merged.
struct Cutter {
    log: std::sync::Weak<Log>,
    /// Blocks merged into one (0: never).
    merge_blocks: usize,
}

/// Merges a table makes after a cut, at most: the rest wait for the next cut.
const MERGES_PER_CUT: usize = 4;

impl Maintenance for Cutter {
    fn run(&self, _now_ms: i64) {
        let Some(log) = self.log.upgrade() else {
            return;
        };
        if log.wal().and_then(Wal::poisoned).is_some() {
            return;
        }
        // A manifest this writer can no longer update (another writer's, or one whose last
        // update may have landed unseen): it stops, and acknowledges nothing more it could
        // not persist; opened again, it reads the manifest as it is.
        let fenced = |error: &Error| {
            if matches!(error, Error::Fenced { .. }) {
                log.poison(error.to_string());
            }
        };
        if let Err(error) = crate::table::cut(&log) {
            tracing::warn!(%error, "persisting a cut failed; the next one retries it");
            for table in log.tables() {
                table.listener().on_persist_error(table.name(), &error);
            }
            fenced(&error);
            return;
        }
        if self.merge_blocks < 2 {
            return;
        }
        for table in log.tables() {
            for _ in 0..MERGES_PER_CUT {
                match table.merge_blocks(self.merge_blocks) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(table = table.name(), %error, "merging blocks failed; retried after the next cut");
                        fenced(&error);
                        break;
                    }
                }
            }
        }
    }
}

/// Checks that `store` honours conditional puts, on an object of its own under `prefix`:
/// a create of an object there is refused, and an update naming a version it is not.
/// Leases, manifests and WAL objects are fenced by them alone: a store that ignored them
/// (some S3-compatible servers do) let two writers overwrite each other's acknowledged
/// writes without an error.
fn check_conditional_puts(
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjectPath,
    io: &crate::io::Io,
) -> Result<()> {
    use object_store::{ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
    let path = prefix.clone().join(format!(
        "conditional-put-check-{}",
        crate::storage::write_nonce()
    ));
    let (s, p) = (store.clone(), path.clone());
    let answers = io.run(async move {
        let put = |mode: PutMode| s.put_opts(&p, "1".into(), PutOptions::from(mode));
        let first = put(PutMode::Create).await;
        let again = put(PutMode::Create).await;
        let stale = put(PutMode::Update(UpdateVersion {
            e_tag: Some("\"not-its-version\"".into()),
            version: Some("not-its-version".into()),
        }))
        .await;
        let _ = s.delete(&p).await;
        (first, again, stale)
    })?;
    let unsupported = |what: &str| Error::InvalidOption {
        option: "store",
        reason: format!(
            "{} does not honour conditional puts ({what}), which a shared database's \
             writers are fenced by",
            store
        ),
    };
    match answers {
        (Err(error), ..) => Err(Error::ObjectStore {
            context: format!("checking conditional puts at {path}"),
            source: error,
        }),
        (Ok(_), Ok(_), _) => Err(unsupported("a create of an object that exists succeeded")),
        (Ok(_), _, Ok(_)) => Err(unsupported(
            "an update naming a version the object is not succeeded",
        )),
        _ => Ok(()),
    }
}
