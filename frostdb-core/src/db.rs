//! The database: a set of tables and the background worker that compacts them.

use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::index::compaction::Mode;
use crate::options::{DbOptions, TableOptions};
use crate::schema::{Schema, validate_static_name};
use crate::table::{Table, WorkerMessage};

/// A database: named tables sharing one background compaction worker.
///
/// Cheap to clone; the worker stops when the last clone is dropped. `Send + Sync`.
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
/// use arrow::record_batch::RecordBatch;
/// use frostdb_core::{ColumnDef, Db, DbOptions, Encoding, Schema, ScanRequest, SortingColumn,
///     TableOptions, col};
///
/// let db = Db::open_in_memory(DbOptions::default())?;
/// let schema = Schema::builder("samples")
///     .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
///     .column(ColumnDef::new("value", DataType::Int64))
///     .sort_by(SortingColumn::asc("labels"))
///     .build()?;
/// let table = db.table("samples", schema, TableOptions::default())?;
///
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
/// let tx = table.insert(&batch)?;
/// let rows: usize = table
///     .scan(&ScanRequest::new().filter(col("labels.pod").eq("b")))?
///     .iter()
///     .map(|b| b.num_rows())
///     .sum();
/// assert_eq!((tx, rows), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Db {
    inner: Arc<DbInner>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field(
                "tables",
                &self.inner.tables.read().keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

struct DbInner {
    options: DbOptions,
    tables: RwLock<HashMap<String, Table>>,
    worker: Option<Worker>,
}

/// The compaction thread and the channel that feeds it.
type Worker = (mpsc::Sender<WorkerMessage>, Mutex<Option<JoinHandle<()>>>);

impl Db {
    /// Opens a database that keeps everything in memory.
    pub fn open_in_memory(options: DbOptions) -> Result<Self> {
        let worker = if options.background_compaction {
            let (tx, rx) = mpsc::channel();
            let handle = std::thread::Builder::new()
                .name("frostdb-compaction".into())
                .spawn(move || compaction_worker(rx))
                .map_err(|e| Error::InvalidOption {
                    option: "background_compaction",
                    reason: format!("cannot start the compaction thread: {e}"),
                })?;
            Some((tx, Mutex::new(Some(handle))))
        } else {
            None
        };
        Ok(Self {
            inner: Arc::new(DbInner {
                options,
                tables: RwLock::new(HashMap::new()),
                worker,
            }),
        })
    }

    /// Opens the table `name`, creating it with `schema` and `options` if it does not exist.
    /// An existing table must have the same schema.
    pub fn table(&self, name: &str, schema: Schema, options: TableOptions) -> Result<Table> {
        validate_static_name(name)?;
        options.validate()?;
        let mut tables = self.inner.tables.write();
        if let Some(table) = tables.get(name) {
            if **table.schema() != schema {
                return Err(Error::SchemaMismatch {
                    table: name.to_owned(),
                });
            }
            return Ok(table.clone());
        }
        let table = Table::new(
            name.to_owned(),
            schema,
            options,
            self.inner.options.listener.clone(),
            self.inner.worker.as_ref().map(|(tx, _)| tx.clone()),
        );
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
}

impl Drop for DbInner {
    fn drop(&mut self) {
        if let Some((tx, handle)) = &self.worker {
            let _ = tx.send(WorkerMessage::Shutdown);
            if let Some(handle) = handle.lock().take() {
                let _ = handle.join();
            }
        }
    }
}

fn compaction_worker(rx: mpsc::Receiver<WorkerMessage>) {
    while let Ok(message) = rx.recv() {
        let table = match message {
            WorkerMessage::Shutdown => return,
            WorkerMessage::Compact(table) => table,
        };
        let Some(table) = table.upgrade() else {
            continue;
        };
        table.clear_queued();
        if let Err(error) = table.compact(Mode::Policy) {
            tracing::warn!(table = table.name(), %error, "background compaction failed");
            table.listener().on_compaction_error(table.name(), &error);
        }
    }
}
