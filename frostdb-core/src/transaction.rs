//! Transactions: writes to several tables of one database committed as one WAL record
//! through the commit log (`commit`), durable and visible all together or not at all.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;

use crate::commit::Entry;
use crate::error::{Error, Result};
use crate::table::{Log, Table, TableInner};

/// A write spanning several tables of one database: one WAL record, durable and visible all
/// together or not at all.
///
/// Each [`Transaction::insert`] checks its batch at once (a batch that does not fit its
/// table's schema is an error there, and the transaction can still be committed without it);
/// nothing is written before [`Transaction::commit`]. Dropping a transaction without
/// committing it writes nothing.
///
/// ```
/// use std::sync::Arc;
/// use arrow::array::{Int64Array, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
/// use arrow::record_batch::RecordBatch;
/// use frostdb_core::{ColumnDef, Db, DbOptions, Schema, TableOptions};
///
/// let db = Db::open_in_memory(DbOptions::default())?;
/// let schema = |name: &str| Schema::builder(name)
///     .column(ColumnDef::new("id", DataType::Int64))
///     .column(ColumnDef::new("text", DataType::Utf8))
///     .build();
/// let names = db.table("names", schema("names")?, TableOptions::default())?;
/// let uses = db.table("uses", schema("uses")?, TableOptions::default())?;
/// let batch = |id: i64, text: &str| RecordBatch::try_new(
///     Arc::new(ArrowSchema::new(vec![
///         Field::new("id", DataType::Int64, false),
///         Field::new("text", DataType::Utf8, false),
///     ])),
///     vec![Arc::new(Int64Array::from(vec![id])), Arc::new(StringArray::from(vec![text]))],
/// );
/// let mut tx = db.transaction();
/// tx.insert(&names, &batch(1, "main")?)?;
/// tx.insert(&uses, &batch(1, "called from main")?)?;
/// tx.commit()?;
/// assert_eq!((names.stats().rows, uses.stats().rows), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a transaction writes nothing until it is committed"]
pub struct Transaction {
    log: Arc<Log>,
    entries: Vec<Entry<TableInner>>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field(
                "tables",
                &self
                    .entries
                    .iter()
                    .map(|e| e.table.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Transaction {
    pub(crate) fn new(log: Arc<Log>) -> Self {
        Self {
            log,
            entries: Vec::new(),
        }
    }

    /// Adds `batch` to the rows this transaction inserts into `table`, which must belong to
    /// the transaction's database. Writes are published table by table in the order they
    /// were added, so add what others refer to first.
    pub fn insert(&mut self, table: &Table, batch: &RecordBatch) -> Result<&mut Self> {
        if !Arc::ptr_eq(table.inner.log(), &self.log) {
            return Err(Error::InvalidOption {
                option: "table",
                reason: format!(
                    "table {:?} belongs to another database than this transaction",
                    table.name()
                ),
            });
        }
        if let Some(entry) = table.inner.entry(batch)? {
            self.entries.push(entry);
        }
        Ok(self)
    }

    /// Whether nothing has been added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes the transaction: returns its id once it is durable (on an on-disk database,
    /// its WAL record is fsynced) and visible to every later snapshot. An empty transaction
    /// writes nothing and returns the latest transaction id.
    pub fn commit(self) -> Result<u64> {
        self.submit()?.wait()
    }

    /// The first half of [`Transaction::commit`]: appends the transaction to the WAL, which
    /// fixes its place in the order of transactions, without waiting for it to be durable.
    /// Nothing of it is visible until [`Submitted::wait`] returns. A caller that must order
    /// its writes (the same symbols first written by one transaction and referred to by
    /// the next) submits under its own lock and waits outside it, so that concurrent
    /// committers still share fsyncs.
    pub fn submit(self) -> Result<Submitted> {
        let tables: Vec<Arc<TableInner>> = self.entries.iter().map(|e| e.table.clone()).collect();
        let appended = self.log.append(self.entries)?;
        Ok(Submitted {
            log: self.log,
            appended,
            tables,
            notified: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

/// A transaction in the WAL, not yet known durable (see [`Transaction::submit`]).
#[must_use = "a submitted transaction is acknowledged only by `wait`"]
pub struct Submitted {
    log: Arc<Log>,
    appended: Option<(u64, u64)>,
    tables: Vec<Arc<TableInner>>,
    /// Whether the tables were told of the commit (once).
    notified: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitted")
            .field("tx", &self.appended.map(|a| a.0))
            .finish()
    }
}

impl Submitted {
    /// Waits until the transaction is durable and visible; returns its id. Several threads
    /// may wait for one transaction (a group commit shares it): each returns once it is.
    pub fn wait(&self) -> Result<u64> {
        let tx = match self.appended {
            Some((tx, position)) => self.log.finish(tx, position)?,
            None => return self.log.commit(Vec::new()),
        };
        if !self
            .notified
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            for t in &self.tables {
                t.committed(tx);
            }
        }
        Ok(tx)
    }
}
