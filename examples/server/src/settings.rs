//! Per-tenant settings, as Pyroscope's `settings.v1.SettingsService` keeps them: named
//! string values (Grafana's Profiles Drilldown stores its plugin settings as one JSON value)
//! with the time they were last modified. One file per tenant under `DATA/settings/`,
//! replaced whole (written, synced, renamed) on each change, so a crash leaves the old or
//! the new settings, never a torn file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use frostdb_pprof::api::settings::v1::Setting;

use super::error::{ApiError, ApiResult};

/// The settings of every tenant.
#[derive(Debug)]
pub struct Settings {
    dir: PathBuf,
    /// Per tenant, held across each read-modify-write, so concurrent writes do not lose
    /// one another (and one tenant's writes never wait for another's). Reads take none:
    /// a file is replaced whole, by a rename.
    locks: frostdb_pprof::debuginfo::KeyedLocks,
    /// Most settings a tenant may keep.
    max_settings: usize,
    /// Most bytes (names and values) a tenant's settings may hold.
    max_bytes: usize,
    /// Settings files read at once, all tenants together ([`MAX_READS`]).
    reads: tokio::sync::Semaphore,
    /// Per tenant, its reads waiting or running ([`MAX_TENANT_READS`]).
    queued: parking_lot::Mutex<std::collections::HashMap<String, usize>>,
    /// Files being read, and the most read at once so far.
    reading: std::sync::atomic::AtomicUsize,
    most_reads: std::sync::atomic::AtomicUsize,
}

/// Settings files read and parsed at once. A file holds up to `max_settings_bytes` of
/// names and values, several times that as JSON (a control character is six bytes): each
/// `Get` read and parsed the whole file, uncharged, and hundreds in flight held gigabytes
/// and every blocking thread. A read takes milliseconds; the rest wait their turn.
const MAX_READS: usize = 4;

/// Reads of one tenant's settings waiting or running at once: past them a read is refused
/// (429), so that one tenant asking thousands at once does not queue every other tenant's
/// behind its own (the reads are taken in turn, all tenants together).
const MAX_TENANT_READS: usize = 8;

/// How far ahead of this server's clock a setting's `modifiedAt` may be (clock skew): a
/// time further ahead would win over every later update.
pub const MAX_CLOCK_SKEW_MS: i64 = 3_600_000;

impl Settings {
    /// Settings kept under `data/settings/`, at most `max_settings` of at most `max_bytes`
    /// in all per tenant.
    pub fn new(data: &Path, max_settings: usize, max_bytes: usize) -> Self {
        Self {
            dir: data.join("settings"),
            locks: frostdb_pprof::debuginfo::KeyedLocks::new(),
            max_settings,
            max_bytes,
            reads: tokio::sync::Semaphore::new(MAX_READS),
            queued: Default::default(),
            reading: std::sync::atomic::AtomicUsize::new(0),
            most_reads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The most settings files read at once so far (at most [`MAX_READS`]).
    pub fn most_reads_at_once(&self) -> usize {
        self.most_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn file(&self, tenant: &str) -> PathBuf {
        self.dir.join(format!("{tenant}.json"))
    }

    /// Tenant `tenant`'s settings, in name order (none yet: empty).
    pub async fn get(&self, tenant: &str) -> ApiResult<Vec<Setting>> {
        let _queued = self.queue(tenant)?;
        Ok(self.read(tenant).await?.into_values().collect())
    }

    /// Stores `setting` for `tenant` (its time is now when it gives none). A stored setting
    /// modified later than `setting` wins: the answer is 409 (`already_exists`), as
    /// Pyroscope answers, and nothing changes.
    pub async fn set(&self, tenant: &str, mut setting: Setting) -> ApiResult<Setting> {
        if setting.name.is_empty() {
            return Err(ApiError::bad_request("the setting has no name"));
        }
        let now = crate::time::now_ms();
        if setting.modified_at <= 0 {
            setting.modified_at = now;
        }
        if setting.modified_at > now + MAX_CLOCK_SKEW_MS {
            return Err(ApiError::bad_request(format!(
                "setting {:?}: modifiedAt {} ms is more than an hour after this server's clock ({now} ms)",
                crate::cut_for_log(&setting.name),
                setting.modified_at
            )));
        }
        let lock = self.locks.of(tenant);
        let _held = lock.lock().await;
        let mut all = self.read(tenant).await?;
        let bytes = |all: &BTreeMap<String, Setting>| -> usize {
            all.values().map(|s| s.name.len() + s.value.len()).sum()
        };
        let replaced = all
            .get(&setting.name)
            .map_or(0, |s| s.name.len() + s.value.len());
        let after = bytes(&all) - replaced + setting.name.len() + setting.value.len();
        if after > self.max_bytes {
            return Err(ApiError::too_large(format!(
                "setting {:?} would make the tenant's settings {after} bytes, over the limit of {} (limits.max_settings_bytes)",
                crate::cut_for_log(&setting.name),
                self.max_bytes
            )));
        }
        if !all.contains_key(&setting.name) && all.len() >= self.max_settings {
            return Err(ApiError::limited(format!(
                "the tenant holds its limit of {} settings (limits.max_settings); setting {:?} is new",
                self.max_settings,
                crate::cut_for_log(&setting.name)
            )));
        }
        if let Some(stored) = all.get(&setting.name)
            && stored.modified_at > setting.modified_at
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "setting {:?} was modified at {} ms, after this update's {} ms",
                    crate::cut_for_log(&setting.name),
                    stored.modified_at,
                    setting.modified_at
                ),
            ));
        }
        all.insert(setting.name.clone(), setting.clone());
        self.write(tenant, &all).await?;
        tracing::info!(tenant, name = ?crate::cut_for_log(&setting.name), "setting stored");
        Ok(setting)
    }

    /// Deletes `tenant`'s setting `name` (absent: nothing to do).
    pub async fn delete(&self, tenant: &str, name: &str) -> ApiResult<()> {
        let lock = self.locks.of(tenant);
        let _held = lock.lock().await;
        let mut all = self.read(tenant).await?;
        if all.remove(name).is_some() {
            self.write(tenant, &all).await?;
            tracing::info!(tenant, name = ?crate::cut_for_log(name), "setting deleted");
        }
        Ok(())
    }

    /// The tenant's settings file read, on a blocking thread (a file read and a parse of up
    /// to `max_settings_bytes`, not on the threads that accept requests). A `Get` is counted
    /// in its tenant's share first ([`Settings::queue`]); a write's read is not (writes of a
    /// tenant take turns under its lock: one at a time, and never refused for its `Get`s).
    async fn read(&self, tenant: &str) -> ApiResult<BTreeMap<String, Setting>> {
        let path = self.file(tenant);
        let _turn = self
            .reads
            .acquire()
            .await
            .map_err(|_| ApiError::internal("the settings reads are closed"))?;
        use std::sync::atomic::Ordering::Relaxed;
        let reading = self.reading.fetch_add(1, Relaxed) + 1;
        self.most_reads.fetch_max(reading, Relaxed);
        let read = tokio::task::spawn_blocking(move || read_file(&path)).await;
        self.reading.fetch_sub(1, Relaxed);
        read.map_err(|e| ApiError::job_failed("reading settings", e))?
    }

    /// A read of `tenant`'s settings counted, until the guard is dropped: refused past
    /// [`MAX_TENANT_READS`].
    fn queue(&self, tenant: &str) -> ApiResult<impl Drop + '_> {
        struct Queued<'a>(&'a Settings, String);
        impl Drop for Queued<'_> {
            fn drop(&mut self) {
                let mut queued = self.0.queued.lock();
                if let Some(n) = queued.get_mut(&self.1) {
                    *n -= 1;
                    if *n == 0 {
                        queued.remove(&self.1);
                    }
                }
            }
        }
        let mut queued = self.queued.lock();
        let n = queued.entry(tenant.to_owned()).or_default();
        if *n >= MAX_TENANT_READS {
            return Err(ApiError::limited(format!(
                "{MAX_TENANT_READS} reads of the tenant's settings are waiting already; \
                 retry when they are answered"
            )));
        }
        *n += 1;
        Ok(Queued(self, tenant.to_owned()))
    }

    /// The reads of `tenant`'s settings waiting or running (for tests).
    #[cfg(test)]
    fn queued(&self, tenant: &str) -> usize {
        self.queued.lock().get(tenant).copied().unwrap_or(0)
    }

    /// `all` written as the tenant's settings file and synced, on a blocking thread.
    async fn write(&self, tenant: &str, all: &BTreeMap<String, Setting>) -> ApiResult<()> {
        let (dir, path) = (self.dir.clone(), self.file(tenant));
        let list: Vec<Setting> = all.values().cloned().collect();
        tokio::task::spawn_blocking(move || write_file(&dir, &path, &list))
            .await
            .map_err(|e| ApiError::job_failed("storing settings", e))?
    }
}

fn read_file(path: &Path) -> ApiResult<BTreeMap<String, Setting>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(ApiError::internal(format!("{}: {e}", path.display())));
        }
    };
    let list: Vec<Setting> = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::internal(format!("{} is not a settings file: {e}", path.display()))
    })?;
    Ok(list.into_iter().map(|s| (s.name.clone(), s)).collect())
}

/// `list` as the settings file at `path` in `dir`: a crash leaves the old file or the new.
fn write_file(dir: &Path, path: &Path, list: &[Setting]) -> ApiResult<()> {
    let fail = |e: std::io::Error| ApiError::internal(format!("{}: {e}", path.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let bytes = serde_json::to_vec_pretty(list)
        .map_err(|e| ApiError::internal(format!("settings to JSON: {e}")))?;
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(fail)?;
        f.write_all(&bytes).map_err(fail)?;
        f.sync_all().map_err(fail)?;
    }
    std::fs::rename(&tmp, path).map_err(fail)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(name: &str, value: &str) -> Setting {
        Setting {
            name: name.into(),
            value: value.into(),
            modified_at: 0,
        }
    }

    /// Gets of tenants' largest settings (1 MiB of control characters, over 6 MiB of JSON)
    /// read the files a few at a time, however many are asked at once (each tenant its
    /// share); each answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settings_files_are_read_a_few_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let settings = std::sync::Arc::new(Settings::new(dir.path(), 10, 1 << 20));
        let tenants: Vec<String> = (0..64 / MAX_TENANT_READS)
            .map(|t| format!("t{t}"))
            .collect();
        for tenant in &tenants {
            settings
                .set(tenant, setting("big", &"\u{1}".repeat((1 << 20) - 8)))
                .await
                .unwrap();
        }
        let gets: Vec<_> = (0..64)
            .map(|i| {
                let settings = settings.clone();
                let tenant = tenants[i % tenants.len()].clone();
                tokio::spawn(async move { settings.get(&tenant).await })
            })
            .collect();
        for get in gets {
            assert_eq!(get.await.unwrap().unwrap()[0].value.len(), (1 << 20) - 8);
        }
        let most = settings.most_reads_at_once();
        assert!((1..=MAX_READS).contains(&most), "{most} files read at once");
    }

    /// One tenant asking many reads at once is refused past its share (its own writes are
    /// not), and another tenant's read, asked after them, is admitted.
    #[tokio::test]
    async fn a_tenants_reads_past_its_share_are_refused_and_others_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let settings = std::sync::Arc::new(Settings::new(dir.path(), 10, 1 << 20));
        // Every read waits for its turn.
        let turns = settings.reads.acquire_many(MAX_READS as u32).await.unwrap();
        let gets: Vec<_> = (0..MAX_TENANT_READS)
            .map(|_| {
                let settings = settings.clone();
                tokio::spawn(async move { settings.get("a").await })
            })
            .collect();
        while settings.queued("a") < MAX_TENANT_READS {
            tokio::task::yield_now().await;
        }
        let refused = settings.get("a").await.unwrap_err();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
        let write = {
            let settings = settings.clone();
            tokio::spawn(async move { settings.set("a", setting("x", "1")).await })
        };
        let b = {
            let settings = settings.clone();
            tokio::spawn(async move { settings.get("b").await })
        };
        while settings.queued("b") < 1 {
            tokio::task::yield_now().await;
        }
        drop(turns);
        assert!(b.await.unwrap().unwrap().is_empty());
        write
            .await
            .unwrap()
            .expect("a write is not refused for its tenant's reads");
        for get in gets {
            get.await.unwrap().unwrap();
        }
        assert_eq!(settings.queued("a"), 0, "the count goes with the reads");
    }

    /// One tenant's writes hold only its own lock: while tenant a's is held (a slow write,
    /// or a stream of them), b writes and a's settings are read.
    #[tokio::test]
    async fn a_tenants_writes_never_wait_for_anothers() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::new(dir.path(), 10, 1 << 20);
        settings.set("a", setting("x", "1")).await.unwrap();
        let lock = settings.locks.of("a");
        let _a_writing = lock.lock().await;
        let limit = std::time::Duration::from_secs(30);
        tokio::time::timeout(limit, settings.set("b", setting("y", "2")))
            .await
            .expect("b waited for a's lock")
            .unwrap();
        let read = tokio::time::timeout(limit, settings.get("a"))
            .await
            .expect("reading a waited for its lock")
            .unwrap();
        assert_eq!((read[0].name.as_str(), read[0].value.as_str()), ("x", "1"));
        assert_eq!(settings.get("b").await.unwrap()[0].value, "2");
    }
}
