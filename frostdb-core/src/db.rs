//! The database: tables, their WALs, the manifest, the object store for persisted blocks,
//! recovery on open, and the background workers that compact, persist and expire.
//!
//! On-disk layout of `Db::open(dir)`:
//! - `dir/manifest.json`: tables and their persisted blocks (see `manifest`)
//! - `dir/wal/<first tx>.wal`: WAL segments, one log for every table (see `wal::record`)
//! - `dir/blocks/<table>/<block id>.parquet`: persisted blocks, unless another object
//!   store is given ([`Db::open_with_store`])

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use parking_lot::RwLock;

use crate::commit::{CommitLog, Transaction};
use crate::error::{Error, Result};
use crate::manifest::{ManifestFile, TableEntry};
use crate::options::{DbOptions, TableOptions};
use crate::schema::{Schema, validate_static_name};
use crate::storage::Storage;
use crate::table::{Durable, Table, TableConfig, WorkerMessage, Workers};
use crate::wal::{self, Wal};
use crate::workers::WorkerPool;

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
                "tables",
                &self.inner.tables.read().keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What an on-disk database has.
struct Disk {
    dir: PathBuf,
    storage: Arc<Storage>,
    manifest: Arc<ManifestFile>,
}

struct DbInner {
    options: DbOptions,
    log: Arc<CommitLog>,
    tables: RwLock<HashMap<String, Table>>,
    workers: Workers,
    /// Keeps the pool running while the database lives (its only holder, unless shared).
    _pool: WorkerPool,
    disk: Option<Disk>,
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
        let store =
            LocalFileSystem::new_with_prefix(&blocks).map_err(|source| Error::ObjectStore {
                context: format!("opening {}", blocks.display()),
                source,
            })?;
        let store = Arc::new(store);
        Self::open_in(dir, store.clone(), "", Some(store), options)
    }

    /// Opens (or creates) the database with its WAL and manifest in `dir` and its persisted
    /// blocks in `store` under `prefix` (any `object_store`: local files, memory, S3, ...).
    /// The manifest is mirrored to the store, so an empty `dir` reopens what the store has
    /// persisted.
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
        fs.create_dir_all(&dir)
            .map_err(io_err(format!("creating {}", dir.display())))?;
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
                dir,
                storage,
                manifest,
            }),
            Some(lock),
        )?;
        db.recover()?;
        Ok(db)
    }

    fn start(
        options: DbOptions,
        pool: WorkerPool,
        disk: Option<Disk>,
        lock: Option<Box<dyn Send + Sync>>,
    ) -> Result<Self> {
        let workers = pool.assign(
            options.background_compaction,
            disk.is_some(),
            options.retention_interval,
        );
        let persistence = workers.persistence.clone();
        let log = CommitLog::new(
            disk.is_some(),
            options.max_wal_bytes,
            persistence.clone(),
            lock,
        );
        Ok(Self {
            inner: Arc::new(DbInner {
                options,
                log,
                tables: RwLock::new(HashMap::new()),
                workers,
                _pool: pool,
                disk,
            }),
        })
    }

    /// Opens every table of the manifest, then replays the WAL into them: each write of a
    /// record goes to its table unless that table has persisted it already. Replay persists
    /// blocks as they fill, so its memory stays within a block per table whatever the WAL's
    /// length.
    fn recover(&self) -> Result<()> {
        let Some(disk) = &self.inner.disk else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let mut persisted: HashMap<String, u64> = HashMap::new();
        for (name, entry) in disk.manifest.snapshot().tables {
            persisted.insert(name.clone(), entry.persisted_tx);
            let table = self.table_from_entry(&name, entry)?;
            self.inner.tables.write().insert(name, table);
        }
        let dir = Self::wal_dir(disk);
        let tables = self.inner.tables.read().clone();
        let log = &self.inner.log;
        let mut applied = 0usize;
        let fs = self.inner.options.file_system.clone();
        let (replayed, kept) = wal::replay(&*fs, &dir, 0, |tx, payload, (segment, offset)| {
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
                    table.inner.apply_replayed(tx, batch)?;
                    applied += 1;
                }
            }
            log.replayed(tx);
            Ok(())
        })?;
        let newest_persisted = persisted.values().copied().max().unwrap_or(0);
        let next_tx = log
            .next_tx()
            .max(replayed.last_tx + 1)
            .max(replayed.newest_segment)
            .max(newest_persisted + 1);
        let wal = Wal::open(
            fs,
            &dir,
            self.inner.options.durability,
            self.inner.options.wal_segment_bytes,
            kept,
            next_tx,
        )?;
        log.attach(wal, next_tx);
        log.truncate()?;
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

    fn wal_dir(disk: &Disk) -> PathBuf {
        disk.dir.join("wal")
    }

    /// Builds a table from its manifest entry (its blocks); the WAL is replayed afterwards.
    fn table_from_entry(&self, name: &str, entry: TableEntry) -> Result<Table> {
        let disk = self.inner.disk.as_ref().ok_or(Error::Closed)?;
        // Objects the manifest does not list: written before a crash kept them out of it,
        // or retired before their deletion ran. Nothing reads them; they only take space.
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
                let entry = TableEntry {
                    schema,
                    options,
                    persisted_tx: 0,
                    next_block_id: 1,
                    blocks: Vec::new(),
                };
                disk.manifest.update(|m| {
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

    /// Persists the active data of every table (rotating the active blocks) and waits for
    /// it: on return, nothing depends on the WAL. For a clean shutdown; nothing is lost
    /// without it either.
    pub fn flush(&self) -> Result<()> {
        for table in self.tables() {
            table.persist()?;
        }
        Ok(())
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

/// Work an embedder runs alongside the database's own retention, on its maintenance thread
/// (e.g. deleting what no retained row refers to any more).
pub trait Maintenance: Send + Sync {
    /// Runs one pass; `now_ms` is the time retention used.
    fn run(&self, now_ms: i64);
}
