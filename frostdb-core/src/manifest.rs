//! The manifest: the one file that says which tables exist and which persisted blocks each
//! has. Replaced atomically (write a temporary file, fsync, rename, fsync the directory) and
//! mirrored to the object store, so a database can be reopened from its bucket alone.
//!
//! Format: JSON, `{"format": 2, "version": N, "tables": {name: {schema, options,
//! persisted_tx, next_block_id, blocks: [BlockMeta]}}}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fs::FileSystem;
use crate::io::Io;
use crate::options::TableOptions;
use crate::predicate::ColumnStats;
use crate::schema::Schema;

/// 2: one WAL for the database (`wal/<tx>.wal`, multi-table records); 1 had one per table.
const FORMAT: u32 = 2;
pub(crate) const FILE_NAME: &str = "manifest.json";

/// A persisted block: one sorted Parquet object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BlockMeta {
    /// Block id, unique within its table.
    pub id: u64,
    /// Object path in the store.
    pub path: String,
    /// Object size in bytes.
    pub size: u64,
    /// Rows.
    pub rows: u64,
    /// Parquet row groups.
    pub row_groups: u32,
    /// Lowest transaction the block holds.
    pub min_tx: u64,
    /// Highest transaction the block holds.
    pub max_tx: u64,
    /// Exact statistics of every column the block has, by name (the time range and the sort
    /// key's range among them).
    pub columns: BTreeMap<String, ColumnStats>,
}

impl BlockMeta {
    /// Statistics of `column`, all-null when the block lacks it.
    pub fn stats_of(&self, column: &str) -> ColumnStats {
        self.columns
            .get(column)
            .cloned()
            .unwrap_or_else(|| ColumnStats::all_null(self.rows as usize))
    }
}

/// Part of a persisted block: its row groups `row_groups` (all of them when `None`), as a
/// query spread over processes hands one out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockSlice {
    /// The block.
    pub block: BlockMeta,
    /// Its row groups to read, `start..end`; all when `None`.
    pub row_groups: Option<std::ops::Range<u32>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TableEntry {
    pub(crate) schema: Schema,
    pub(crate) options: TableOptions,
    /// Every transaction up to this one is in `blocks`.
    pub(crate) persisted_tx: u64,
    pub(crate) next_block_id: u64,
    pub(crate) blocks: Vec<BlockMeta>,
    /// Creation order among the database's tables (1, 2, ...; 0 in manifests written
    /// before it was recorded): readers of a shared bucket follow tables in this order.
    #[serde(default)]
    pub(crate) seq: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    format: u32,
    version: u64,
    /// The epoch of the lease of the writer that last took the database over (shared
    /// databases; 0 otherwise): a writer with a lower one has been fenced off.
    #[serde(default)]
    pub(crate) epoch: u64,
    pub(crate) tables: BTreeMap<String, TableEntry>,
}

impl Manifest {
    /// Table `name`'s entry; a table the database has is always in its manifest.
    pub(crate) fn table(&self, name: &str) -> Result<&TableEntry> {
        self.tables
            .get(name)
            .ok_or_else(|| Error::Internal(format!("table {name:?} is not in the manifest")))
    }
}

impl Default for Manifest {
    fn default() -> Self {
        Self {
            format: FORMAT,
            version: 0,
            epoch: 0,
            tables: BTreeMap::new(),
        }
    }
}

/// Where the manifest is kept.
enum Home {
    /// `dir/manifest.json`, replaced atomically, mirrored to the object store.
    Local {
        fs: Arc<dyn FileSystem>,
        dir: PathBuf,
        mirror: Option<(Arc<dyn ObjectStore>, ObjectPath, Io)>,
        read_only: bool,
    },
    /// `<prefix>/manifest.json` in a bucket shared with other processes, replaced only by
    /// a put conditional on the version this process last saw: a writer that another one
    /// took over from fails its next update instead of overwriting the other's.
    Bucket {
        store: Arc<dyn ObjectStore>,
        path: ObjectPath,
        io: Io,
        /// The object's version (e-tag) as last read or written; `None` when there is none.
        seen: Mutex<Option<UpdateVersion>>,
        read_only: bool,
    },
}

/// Where the manifest lives and its current content.
pub(crate) struct ManifestFile {
    home: Home,
    current: Mutex<Manifest>,
    /// How mirroring the manifest to the object store has gone (a local manifest only).
    mirror: Mutex<MirrorHealth>,
    /// Why the bucket's copy may differ from `current` (a put that failed may have landed:
    /// a timeout, or a retry that found its own write): no update is made from here on.
    unsure: Mutex<Option<String>>,
}

/// How mirroring a database's manifest to its object store has gone ([`crate::Db::mirror_health`]).
/// While the mirror is behind, a database reopened from the object store alone (its
/// directory lost) misses the blocks persisted since the last good mirror; the next
/// manifest change that mirrors brings it up to date.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MirrorHealth {
    /// Mirrors that failed since the database opened.
    pub failures: u64,
    /// Why the last mirror failed, while the object store's copy is behind the local one.
    pub behind: Option<String>,
}

impl std::fmt::Debug for ManifestFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManifestFile")
            .field("at", &self.location())
            .finish_non_exhaustive()
    }
}

pub(crate) fn parse(bytes: &[u8], path: &str) -> Result<Manifest> {
    let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| Error::Manifest {
        path: path.to_owned(),
        reason: format!("not a valid manifest: {e}"),
    })?;
    if manifest.format != FORMAT {
        let hint = if manifest.format < FORMAT {
            " (a database written by an older build: open it with that build, run a flush, and \
             export what you need; this build does not convert it)"
        } else {
            " (a database written by a newer build)"
        };
        return Err(Error::Manifest {
            path: path.to_owned(),
            reason: format!(
                "format {} is not {FORMAT}, the one this build reads{hint}",
                manifest.format
            ),
        });
    }
    Ok(manifest)
}

/// The manifest object at `path` and its version, if there is one. With `unless` (a version
/// seen before), `Ok(None)` also when the object has not changed since.
fn read_object(
    store: &Arc<dyn ObjectStore>,
    path: &ObjectPath,
    io: &Io,
    unless: Option<&UpdateVersion>,
) -> Result<Option<(Manifest, UpdateVersion)>> {
    let (s, p) = (store.clone(), path.clone());
    let options = GetOptions {
        if_none_match: unless.and_then(|v| v.e_tag.clone()),
        ..GetOptions::default()
    };
    let got = io.run(async move {
        let got = s.get_opts(&p, options).await?;
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        crate::io::bytes_within(got, "manifest", crate::io::MAX_MANIFEST_BYTES)
            .await
            .map(|b| (b, version))
    })?;
    match got {
        Ok((bytes, version)) => {
            let manifest = parse(&bytes, path.as_ref())?;
            // Every block it names is the database's own: a manifest copied from another
            // prefix (or written by anyone who can write this one) named that prefix's
            // blocks, which this database then read, merged and deleted.
            let prefix = path.as_ref().strip_suffix(FILE_NAME).unwrap_or("");
            let foreign = manifest
                .tables
                .values()
                .flat_map(|t| &t.blocks)
                .find(|b| !b.path.starts_with(prefix) || b.path.split('/').any(|p| p == ".."));
            if let Some(block) = foreign {
                return Err(Error::Manifest {
                    path: path.to_string(),
                    reason: format!(
                        "block {} is not under the database's prefix {prefix}",
                        block.path
                    ),
                });
            }
            Ok(Some((manifest, version)))
        }
        Err(object_store::Error::NotFound { .. } | object_store::Error::NotModified { .. }) => {
            Ok(None)
        }
        Err(source) => Err(Error::ObjectStore {
            context: format!("reading manifest {path}"),
            source,
        }),
    }
}

impl ManifestFile {
    /// Loads the manifest of the database in `dir`: the local file, or else the object
    /// store's mirror under `prefix`, or else an empty one.
    pub(crate) fn open(
        fs: Arc<dyn FileSystem>,
        dir: &Path,
        mirror: Option<(Arc<dyn ObjectStore>, ObjectPath, Io)>,
    ) -> Result<Self> {
        let local = dir.join(FILE_NAME);
        let manifest = match fs.read(&local) {
            Ok(bytes) => parse(&bytes, &local.display().to_string())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &mirror {
                Some((store, prefix, io)) => {
                    let path = prefix.clone().join(FILE_NAME);
                    match read_object(store, &path, io, None)? {
                        Some((manifest, _)) => {
                            tracing::info!(object = %path, "manifest read from the object store");
                            manifest
                        }
                        None => Manifest::default(),
                    }
                }
                None => Manifest::default(),
            },
            Err(source) => {
                return Err(Error::Io {
                    context: format!("reading manifest {}", local.display()),
                    source,
                });
            }
        };
        Ok(Self {
            home: Home::Local {
                fs,
                dir: dir.to_path_buf(),
                mirror,
                read_only: false,
            },
            current: Mutex::new(manifest),
            mirror: Mutex::default(),
            unsure: Mutex::default(),
        })
    }

    /// How mirroring this manifest has gone; `None` for one without a mirror.
    pub(crate) fn mirror_health(&self) -> Option<MirrorHealth> {
        match &self.home {
            Home::Local {
                mirror: Some(_), ..
            } => Some(self.mirror.lock().clone()),
            _ => None,
        }
    }

    /// This manifest refusing updates (a database opened read-only): it is only read.
    pub(crate) fn read_only(mut self) -> Self {
        match &mut self.home {
            Home::Local { read_only, .. } | Home::Bucket { read_only, .. } => *read_only = true,
        }
        self
    }

    /// Loads the manifest of the database at `prefix` of a shared bucket (an empty one when
    /// there is none yet). A read-only one refuses updates.
    pub(crate) fn open_bucket(
        store: Arc<dyn ObjectStore>,
        prefix: &ObjectPath,
        io: Io,
        read_only: bool,
    ) -> Result<Self> {
        let path = prefix.clone().join(FILE_NAME);
        let (manifest, seen) = match read_object(&store, &path, &io, None)? {
            Some((manifest, version)) => (manifest, Some(version)),
            None => (Manifest::default(), None),
        };
        Ok(Self {
            home: Home::Bucket {
                store,
                path,
                io,
                seen: Mutex::new(seen),
                read_only,
            },
            current: Mutex::new(manifest),
            mirror: Mutex::default(),
            unsure: Mutex::default(),
        })
    }

    /// Where the manifest is, for messages.
    pub(crate) fn location(&self) -> String {
        match &self.home {
            Home::Local { dir, .. } => dir.join(FILE_NAME).display().to_string(),
            Home::Bucket { path, .. } => path.to_string(),
        }
    }

    /// A copy of the current manifest.
    pub(crate) fn snapshot(&self) -> Manifest {
        self.current.lock().clone()
    }

    /// A copy of table `name`'s current entry (see [`Manifest::table`]).
    pub(crate) fn table_entry(&self, name: &str) -> Result<TableEntry> {
        self.current.lock().table(name).cloned()
    }

    /// Reads the bucket's manifest again (shared databases): the new one when it changed
    /// since it was last read, `None` otherwise.
    pub(crate) fn refresh(&self) -> Result<Option<Manifest>> {
        let Home::Bucket {
            store,
            path,
            io,
            seen,
            ..
        } = &self.home
        else {
            return Ok(None);
        };
        let unless = seen.lock().clone();
        let Some((manifest, version)) = read_object(store, path, io, unless.as_ref())? else {
            return Ok(None);
        };
        let mut current = self.current.lock();
        if manifest.version < current.version {
            // An older copy from a store without read-after-write consistency.
            return Ok(None);
        }
        *seen.lock() = Some(version);
        *current = manifest.clone();
        Ok(Some(manifest))
    }

    /// Forgets which version of the bucket's manifest was read last: the next
    /// [`ManifestFile::refresh`] reads it again, whether or not it changed (what it named
    /// could not all be applied).
    pub(crate) fn unsee(&self) {
        if let Home::Bucket { seen, .. } = &self.home {
            *seen.lock() = None;
        }
    }

    /// Applies `change` to a copy of the manifest and makes the copy durable; the in-memory
    /// manifest changes only once it is.
    pub(crate) fn update<R>(&self, change: impl FnOnce(&mut Manifest) -> Result<R>) -> Result<R> {
        let mut current = self.current.lock();
        let mut next = current.clone();
        let result = change(&mut next)?;
        next.version += 1;
        let bytes = serde_json::to_vec(&next)?;
        match &self.home {
            Home::Local {
                fs,
                dir,
                mirror,
                read_only,
            } => {
                if *read_only {
                    return Err(Error::ReadOnly {
                        database: dir.display().to_string(),
                        what: "changing the manifest".into(),
                    });
                }
                write_local(&**fs, dir, &bytes)?;
                if let Some((store, prefix, io)) = mirror {
                    let (store, path) = (store.clone(), prefix.clone().join(FILE_NAME));
                    let payload = bytes.clone();
                    let shown = path.to_string();
                    let failed = match io.run(async move { store.put(&path, payload.into()).await })
                    {
                        Ok(Ok(_)) => None,
                        Ok(Err(error)) => Some(format!("writing {shown}: {error}")),
                        Err(error) => Some(error.to_string()),
                    };
                    let mut health = self.mirror.lock();
                    if let Some(error) = &failed {
                        health.failures += 1;
                        tracing::warn!(
                            failures = health.failures,
                            "cannot mirror the manifest to the object store (it stays behind until a mirror succeeds): {error}"
                        );
                    } else if health.behind.is_some() {
                        tracing::info!("the manifest is mirrored to the object store again");
                    }
                    health.behind = failed;
                }
            }
            Home::Bucket {
                store,
                path,
                io,
                seen,
                read_only,
            } => {
                if *read_only {
                    return Err(Error::ReadOnly {
                        database: path.to_string(),
                        what: "changing the manifest".into(),
                    });
                }
                if let Some(why) = self.unsure.lock().clone() {
                    return Err(Error::Fenced {
                        prefix: path.to_string(),
                        reason: format!(
                            "an earlier update may have landed ({why}): the database must be \
                             opened again to read the manifest"
                        ),
                    });
                }
                let mode = match seen.lock().clone() {
                    Some(version) => PutMode::Update(version),
                    None => PutMode::Create,
                };
                let (s, p) = (store.clone(), path.clone());
                let put = io
                    .run(async move { s.put_opts(&p, bytes.into(), PutOptions::from(mode)).await });
                // Whatever failed, the put may have landed (a response lost, or a retry
                // that found the object changed by its own first attempt): taken as not
                // made, the next block written reused the id of one the bucket's manifest
                // names. Only opening the database again tells.
                let put = match put {
                    Ok(Ok(result)) => Ok(result),
                    Ok(Err(error)) => Err(error.to_string()),
                    Err(error) => Err(error.to_string()),
                };
                if let Err(error) = &put {
                    *self.unsure.lock() = Some(error.clone());
                }
                match put {
                    Ok(result) => {
                        *seen.lock() = Some(UpdateVersion {
                            e_tag: result.e_tag,
                            version: result.version,
                        });
                    }
                    Err(error) => {
                        return Err(Error::Fenced {
                            prefix: path.to_string(),
                            reason: format!(
                                "writing the manifest failed, and may have landed, or been \
                                 replaced by another writer: {error}"
                            ),
                        });
                    }
                }
            }
        }
        *current = next;
        Ok(result)
    }
}

fn write_local(fs: &dyn FileSystem, dir: &Path, bytes: &[u8]) -> Result<()> {
    let path = dir.join(FILE_NAME);
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let io = |what: &str| {
        let context = format!("{what} {}", path.display());
        move |source| Error::Io { context, source }
    };
    let file = fs.create(&tmp).map_err(io("writing manifest"))?;
    file.write_all(bytes)
        .and_then(|_| file.sync_data())
        .map_err(io("writing manifest"))?;
    drop(file);
    fs.rename(&tmp, &path).map_err(io("replacing manifest"))?;
    fs.sync_dir(dir)
        .map_err(io("syncing the directory of manifest"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;
    use crate::scalar::Scalar;
    use crate::schema::ColumnDef;

    #[test]
    fn updates_are_durable_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let file = ManifestFile::open(Arc::new(crate::fs::OsFs), dir.path(), None).unwrap();
        assert!(file.snapshot().tables.is_empty());
        let schema = Schema::builder("t")
            .column(ColumnDef::new("v", DataType::Float64))
            .build()
            .unwrap();
        file.update(|m| {
            let mut columns = BTreeMap::new();
            columns.insert(
                "v".to_owned(),
                ColumnStats {
                    min: Some(Scalar::Float(f64::NAN)),
                    max: Some(Scalar::Binary(vec![0, 255])),
                    null_count: 1,
                },
            );
            m.tables.insert(
                "t".into(),
                TableEntry {
                    schema,
                    options: TableOptions::default(),
                    persisted_tx: 7,
                    next_block_id: 2,
                    blocks: vec![BlockMeta {
                        id: 1,
                        path: "t/1.parquet".into(),
                        size: 10,
                        rows: 3,
                        row_groups: 1,
                        min_tx: 1,
                        max_tx: 7,
                        columns,
                    }],
                    seq: 1,
                },
            );
            Ok(())
        })
        .unwrap();
        let again = ManifestFile::open(Arc::new(crate::fs::OsFs), dir.path(), None)
            .unwrap()
            .snapshot();
        let table = &again.tables["t"];
        assert_eq!(table.persisted_tx, 7);
        let stats = table.blocks[0].stats_of("v");
        assert!(
            matches!(stats.min, Some(Scalar::Float(f)) if f.is_nan()),
            "NaN survives JSON"
        );
        assert_eq!(stats.max, Some(Scalar::Binary(vec![0, 255])));
        assert_eq!(table.blocks[0].stats_of("absent").null_count, 3);
        assert_eq!(again.version, 1);

        std::fs::write(dir.path().join(FILE_NAME), b"{not json").unwrap();
        let err = ManifestFile::open(Arc::new(crate::fs::OsFs), dir.path(), None).unwrap_err();
        assert!(err.to_string().contains("not a valid manifest"), "{err}");
    }
}
