//! Persisted blocks: a rotated block written as one sorted Parquet object, streamed row group
//! by row group from bounded slices of its granules, and read back with pruning by block,
//! row group and page statistics.
//!
//! Block layout: `<prefix>/<table>/<block id:020>.parquet`; rows in the table's sort order;
//! one row group per `row_group_rows` rows; pages of at most `granule_rows` rows with page
//! statistics (column index), so a selective predicate reads a few pages; dictionary encoding
//! for dictionary-hinted columns, delta encodings and codecs as the schema hints.

mod read;
mod write;

use std::collections::HashMap;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use crate::io::Io;

pub(crate) use read::BlockPlan;
pub(crate) use write::properties;

/// The object store holding a database's blocks.
pub(crate) struct Storage {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    io: Io,
    /// Parquet footers (with page indexes) of blocks read so far, by object path.
    metadata: Mutex<HashMap<String, ArrowReaderMetadata>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Storage {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, prefix: ObjectPath, io: Io) -> Self {
        Self {
            store,
            prefix,
            io,
            metadata: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(crate) fn prefix(&self) -> &ObjectPath {
        &self.prefix
    }

    /// Where block `id` of `table` lives.
    pub(crate) fn block_path(&self, table: &str, id: u64) -> ObjectPath {
        self.prefix
            .clone()
            .join(table)
            .join(format!("{id:020}.parquet"))
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
