//! Tenants: each `X-Scope-OrgID` gets its own database directory, so no query can ever
//! read another tenant's rows, and its own series limit.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{ProfileStore, StoreOptions};
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::config::Limits;
use super::error::{ApiError, ApiResult};

/// A tenant's store and accounting.
#[derive(Debug)]
pub struct Tenant {
    /// The tenant id.
    pub id: String,
    /// Its profiles.
    /// Its profiles; the store holds the tenant to its series limit, counting every label
    /// a series has (request and pprof sample labels alike).
    pub store: ProfileStore,
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

/// The tenants, opened on first use.
#[derive(Debug)]
pub struct Tenants {
    root: PathBuf,
    limits: Limits,
    retention: Retention,
    /// The threads every tenant's database shares (compaction, persistence, I/O): a
    /// server's threads do not grow with its tenants.
    workers: frostdb_core::WorkerPool,
    tenants: Mutex<HashMap<String, Arc<OnceCell<Arc<Tenant>>>>>,
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
        Self {
            root: data.join("tenants"),
            limits,
            retention,
            workers,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// The pprof decoding limits of every tenant's store (from the server's limits), known
    /// without opening a tenant.
    pub fn pprof_limits(&self) -> frostdb_pprof::Limits {
        frostdb_pprof::Limits {
            max_decompressed_bytes: self.limits.max_decompressed_bytes,
            ..frostdb_pprof::Limits::default()
        }
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// The ids of the tenants that have data on disk.
    pub fn on_disk(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.root)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|id| validate_tenant(id).is_ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// The tenant for writing: opened, and created when new.
    pub async fn for_write(&self, id: &str) -> ApiResult<Arc<Tenant>> {
        self.open(id, true)
            .await
            .map(|t| t.expect("created when absent"))
    }

    /// The tenant for reading: `None` when it has never stored anything.
    pub async fn for_read(&self, id: &str) -> ApiResult<Option<Arc<Tenant>>> {
        self.open(id, false).await
    }

    /// The tenants open now.
    pub fn open_now(&self) -> Vec<Arc<Tenant>> {
        self.tenants
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .collect()
    }

    async fn open(&self, id: &str, create: bool) -> ApiResult<Option<Arc<Tenant>>> {
        validate_tenant(id).map_err(ApiError::bad_request)?;
        let dir = self.dir(id);
        let cell = {
            let mut tenants = self.tenants.lock();
            match tenants.get(id) {
                Some(cell) => cell.clone(),
                None => {
                    if !create && !dir.exists() {
                        return Ok(None);
                    }
                    if tenants.len() >= self.limits.max_tenants {
                        return Err(ApiError::limited(format!(
                            "the server holds its limit of {} tenants",
                            self.limits.max_tenants
                        )));
                    }
                    let cell = Arc::new(OnceCell::new());
                    tenants.insert(id.to_owned(), cell.clone());
                    cell
                }
            }
        };
        let tenant = cell
            .get_or_try_init(|| async {
                let id = id.to_owned();
                let max_series = self.limits.max_series_per_tenant;
                let query_memory = Some(self.limits.max_query_memory_bytes);
                let limits = self.pprof_limits();
                let retention = self.retention.of(&id);
                let rollup_retention = self.retention.rollups;
                let db_options = DbOptions::default().workers(self.workers.clone());
                tokio::task::spawn_blocking(move || -> ApiResult<Arc<Tenant>> {
                    std::fs::create_dir_all(&dir).map_err(|e| {
                        ApiError::internal(format!("cannot create {}: {e}", dir.display()))
                    })?;
                    // Held by another process (unavailable, 503: the client may retry),
                    // damaged (500), ...: the kind of the engine's error says which.
                    let db = Db::open(&dir, db_options).map_err(|e| {
                        ApiError::from(e).context(format_args!(
                            "cannot open the database of tenant {id:?} in {}",
                            dir.display()
                        ))
                    })?;
                    let options = StoreOptions {
                        limits,
                        retention,
                        max_series,
                        query_memory,
                        rollups: frostdb_pprof::RollupOptions {
                            hourly_retention: rollup_retention,
                            daily_retention: rollup_retention,
                            ..frostdb_pprof::RollupOptions::default()
                        },
                        ..StoreOptions::default()
                    };
                    let store = ProfileStore::open(db, options)?;
                    let kept = retention.map_or("for ever".to_owned(), |d| {
                        format!("{} days", d.as_secs_f64() / 86_400.0)
                    });
                    tracing::info!(tenant = %id, dir = %dir.display(), retention = %kept, "opened tenant");
                    Ok(Arc::new(Tenant { id, store }))
                })
                .await
                .map_err(|e| ApiError::internal(format!("opening a tenant failed: {e}")))?
            })
            .await?;
        Ok(Some(tenant.clone()))
    }

    /// Flushes every open tenant (on shutdown).
    pub fn flush_all(&self) {
        for tenant in self.open_now() {
            if let Err(e) = tenant.store.db().flush() {
                tracing::error!(tenant = %tenant.id, "flush failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ..Limits::default()
        };
        let pool = frostdb_core::WorkerPool::new(1).unwrap();
        let tenants = Tenants::new(dir.path().to_owned(), limits, Retention::default(), pool);
        assert!(tenants.for_read("t").await.unwrap().is_none());
        assert!(tenants.on_disk().is_empty(), "a read creates nothing");
        let t = tenants.for_write("t").await.unwrap();
        // The store counts series (pprof sample labels included; see frostdb-pprof's tests).
        assert_eq!(t.store.options().max_series, 2);
        assert_eq!(tenants.on_disk(), vec!["t".to_owned()]);
        assert!(tenants.for_read("t").await.unwrap().is_some());
    }
}
