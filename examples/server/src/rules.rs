//! Recording rules per tenant: profiles counted into Prometheus series as they are stored
//! ([`frostdb_pprof::rules`]), served on `/metrics`.
//!
//! A tenant's rules are those of its `[tenants.<id>]` config and those set through the API
//! (`GET /api/v1/rules`, `PUT` and `DELETE /api/v1/rules/{name}`), the latter kept in
//! `DATA/rules/<tenant>.json`, replaced whole (written, synced, renamed) on each change, as
//! settings are. Each tenant's [`Recorder`] lives as long as the server, not the tenant's
//! store: a tenant closed while idle and opened again keeps counting where it was.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::routing::get;
use axum::{Json, Router};
use frostdb_pprof::rules::{Recorder, RecordingRule, RuleLimits};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::Shared;
use crate::error::{ApiError, ApiResult};

/// What the server adds to a rule's checks: its series carry a `tenant` label of their own.
fn check_here(rules: &[RecordingRule]) -> Result<(), String> {
    if let Some(r) = rules
        .iter()
        .find(|r| r.keep_labels.iter().any(|l| l == "tenant"))
    {
        return Err(format!(
            "recording rule {:?}: keep_labels cannot name \"tenant\", the label /metrics \
             gives every series its tenant by",
            r.name
        ));
    }
    // The server's own metrics are frostdb_*: a rule of the same name would describe a
    // family twice, and Prometheus would refuse the whole scrape.
    if let Some(r) = rules.iter().find(|r| r.name.starts_with("frostdb_")) {
        return Err(format!(
            "recording rule {:?}: names starting with frostdb_ are the server's own metrics",
            r.name
        ));
    }
    Ok(())
}

/// Every tenant's rules and recorders.
#[derive(Debug)]
pub struct Rules {
    dir: PathBuf,
    limits: RuleLimits,
    /// From the config, by tenant.
    configured: BTreeMap<String, Vec<RecordingRule>>,
    /// The recorders made so far (a tenant's on its store's first open, or its first rule).
    recorders: Mutex<HashMap<String, Arc<Recorder>>>,
    /// Per tenant, held across each read-modify-write of its file (one tenant's writes
    /// never wait for another's).
    locks: frostdb_pprof::debuginfo::KeyedLocks,
    /// What remote write did (`[remote_write]`).
    pub remote_write: crate::remote_write::RemoteWriteStats,
}

impl Rules {
    /// Rules kept under `data/rules/`, the config's `configured` checked now (a bad rule in
    /// the config stops the server from starting, naming it).
    pub fn new(
        data: &Path,
        configured: BTreeMap<String, Vec<RecordingRule>>,
        limits: RuleLimits,
    ) -> Result<Self, String> {
        let check = Recorder::new(limits);
        for (tenant, rules) in &configured {
            check
                .check(rules)
                .map_err(|e| e.to_string())
                .and_then(|()| check_here(rules))
                .map_err(|e| format!("[tenants.{tenant}] recording_rules: {e}"))?;
        }
        Ok(Self {
            dir: data.join("rules"),
            limits,
            configured,
            recorders: Mutex::new(HashMap::new()),
            locks: frostdb_pprof::debuginfo::KeyedLocks::new(),
            remote_write: Default::default(),
        })
    }

    fn file(&self, tenant: &str) -> PathBuf {
        self.dir.join(format!("{tenant}.json"))
    }

    /// The rules set through the API for `tenant` (none: empty).
    fn stored(&self, tenant: &str) -> ApiResult<Vec<RecordingRule>> {
        let path = self.file(tenant);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::internal(format!("{}: not a list of rules: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(ApiError::internal(format!("{}: {e}", path.display()))),
        }
    }

    /// Replaces `tenant`'s API rules with `rules`, whole (a crash leaves the old or new).
    fn write(&self, tenant: &str, rules: &[RecordingRule]) -> ApiResult<()> {
        let fail = |e: std::io::Error| ApiError::internal(format!("storing rules: {e}"));
        std::fs::create_dir_all(&self.dir).map_err(fail)?;
        let path = self.file(tenant);
        let temporary = path.with_extension("json.tmp");
        let bytes =
            serde_json::to_vec_pretty(rules).map_err(|e| ApiError::internal(e.to_string()))?;
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&temporary).map_err(fail)?;
            f.write_all(&bytes).map_err(fail)?;
            f.sync_all().map_err(fail)?;
        }
        std::fs::rename(&temporary, &path).map_err(fail)?;
        if let Ok(dir) = std::fs::File::open(&self.dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    /// Every rule of `tenant`: the config's, then the API's.
    fn all(&self, tenant: &str) -> ApiResult<Vec<RecordingRule>> {
        let mut rules = self.configured.get(tenant).cloned().unwrap_or_default();
        rules.extend(self.stored(tenant)?);
        Ok(rules)
    }

    /// `tenant`'s recorder, made with its rules on first use (blocking: reads its file).
    ///
    /// Stored rules that no longer go with the rest (the config came to name a rule as one
    /// of them is named, or `max_recording_rules` was lowered below what the tenant holds)
    /// are left out, each named in the log, and the tenant opens with the others: before,
    /// its store could not be opened, every write and query of it failing. They stay in
    /// its file, listed by `GET /api/v1/rules`, to be deleted or renamed.
    pub fn recorder(&self, tenant: &str) -> ApiResult<Arc<Recorder>> {
        if let Some(r) = self.recorders.lock().get(tenant) {
            return Ok(r.clone());
        }
        let recorder = Recorder::new(self.limits);
        let mut rules = self.all(tenant)?;
        if let Err(error) = recorder.check(&rules) {
            let stored = rules.split_off(self.configured.get(tenant).map_or(0, Vec::len));
            for rule in stored {
                let name = rule.name.clone();
                rules.push(rule);
                if let Err(e) = recorder.check(&rules) {
                    rules.pop();
                    tracing::warn!(%tenant, rule = %name, error = %e, "a stored recording rule is left out");
                }
            }
            tracing::warn!(%tenant, %error, kept = rules.len(), "the stored recording rules do not go together: the tenant opens with those that do");
        }
        recorder
            .set_rules(&rules)
            .map_err(|e| ApiError::internal(format!("the stored rules of {tenant:?}: {e}")))?;
        Ok(self
            .recorders
            .lock()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(recorder))
            .clone())
    }

    /// What every recorder's series hold (kept for the server's life, tenants closed or
    /// not).
    pub fn series_bytes(&self) -> usize {
        self.recorders
            .lock()
            .values()
            .map(|r| r.series_bytes())
            .sum()
    }

    /// Every recorder made, by tenant.
    pub fn recorders(&self) -> Vec<(String, Arc<Recorder>)> {
        let mut out: Vec<_> = self
            .recorders
            .lock()
            .iter()
            .map(|(t, r)| (t.clone(), r.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Sets (adds or replaces) API rule `rule` of `tenant`: checked with every other rule
    /// of the tenant first (limits, names, selectors), refused whole.
    async fn put(self: &Arc<Self>, tenant: &str, rule: RecordingRule) -> ApiResult<()> {
        let lock = self.locks.of(tenant);
        let _held = lock.lock().await;
        // Compiling the rules and syncing their file take a blocking thread, not one of
        // the threads that accept requests.
        let (this, tenant) = (self.clone(), tenant.to_owned());
        tokio::task::spawn_blocking(move || this.put_held(&tenant, rule))
            .await
            .map_err(|e| ApiError::job_failed("setting a recording rule", e))?
    }

    /// [`Rules::put`], its lock held.
    fn put_held(&self, tenant: &str, rule: RecordingRule) -> ApiResult<()> {
        if self
            .configured
            .get(tenant)
            .is_some_and(|rules| rules.iter().any(|r| r.name == rule.name))
        {
            return Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                format!(
                    "recording rule {:?} is set in the server's config ([tenants.{tenant}]); \
                     change it there",
                    rule.name
                ),
            ));
        }
        let mut stored = self.stored(tenant)?;
        match stored.iter_mut().find(|r| r.name == rule.name) {
            Some(old) => *old = rule,
            None => stored.push(rule),
        }
        let mut all = self.configured.get(tenant).cloned().unwrap_or_default();
        all.extend(stored.iter().cloned());
        let recorder = self.recorder(tenant)?;
        recorder
            .check(&all)
            .map_err(|e| e.to_string())
            .and_then(|()| check_here(&all))
            .map_err(ApiError::bad_request)?;
        self.write(tenant, &stored)?;
        recorder
            .set_rules(&all)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Deletes API rule `name` of `tenant` (404 when it has none of that name).
    async fn delete(self: &Arc<Self>, tenant: &str, name: &str) -> ApiResult<()> {
        let lock = self.locks.of(tenant);
        let _held = lock.lock().await;
        let (this, tenant, name) = (self.clone(), tenant.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || this.delete_held(&tenant, &name))
            .await
            .map_err(|e| ApiError::job_failed("deleting a recording rule", e))?
    }

    /// [`Rules::delete`], its lock held.
    fn delete_held(&self, tenant: &str, name: &str) -> ApiResult<()> {
        let mut stored = self.stored(tenant)?;
        let before = stored.len();
        stored.retain(|r| r.name != name);
        if stored.len() == before {
            return Err(ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                format!("tenant {tenant:?} has no recording rule {name:?} set through the API"),
            ));
        }
        self.write(tenant, &stored)?;
        let mut all = self.configured.get(tenant).cloned().unwrap_or_default();
        all.extend(stored);
        self.recorder(tenant)?
            .set_rules(&all)
            .map_err(|e| ApiError::internal(e.to_string()))
    }
}

/// `/api/v1/rules` and `/api/v1/rules/{name}`.
pub fn routes() -> Router<Shared> {
    Router::new().route("/api/v1/rules", get(list)).route(
        "/api/v1/rules/{name}",
        axum::routing::put(put).delete(delete),
    )
}

/// The tenant's rules, each with where it is set, its series and what it dropped: read (a
/// closed tenant's from its file, up to `max_rules` of 64 KiB) and written as JSON on a
/// blocking thread, not one of the threads that accept requests.
async fn list(
    State(state): State<Shared>,
    crate::TenantId(tenant): crate::TenantId,
) -> ApiResult<axum::response::Response> {
    let body = tokio::task::spawn_blocking(move || listed(&state, &tenant))
        .await
        .map_err(|e| ApiError::job_failed("listing recording rules", e))??;
    Ok(crate::query::json_response(body))
}

/// [`list`]'s answer.
fn listed(state: &Shared, tenant: &str) -> ApiResult<Vec<u8>> {
    let rules = &state.rules;
    let configured = rules.configured.get(tenant).cloned().unwrap_or_default();
    let recorded = rules.recorders.lock().get(tenant).map(|r| r.status());
    let all = match &recorded {
        Some(status) => status.iter().map(|s| s.rule.clone()).collect(),
        None => rules.all(tenant)?,
    };
    let out: Vec<Value> = all
        .into_iter()
        .map(|rule| {
            let status = recorded
                .as_ref()
                .and_then(|s| s.iter().find(|s| s.rule.name == rule.name));
            json!({
                "source": if configured.iter().any(|c| c.name == rule.name) { "config" } else { "api" },
                "series": status.map_or(0, |s| s.series),
                "dropped": status.map_or(0, |s| s.dropped),
                "rule": rule,
            })
        })
        .collect();
    crate::query::json_bytes(&json!({
        "rules": out,
        "max_rules": rules.limits.max_rules,
        "max_series": rules.limits.max_series,
    }))
}

/// Most bytes of a recording rule set over the API.
const MAX_RULE_BYTES: usize = 64 << 10;

async fn put(
    State(state): State<Shared>,
    crate::TenantId(tenant): crate::TenantId,
    UrlPath(name): UrlPath<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<Value>> {
    // Refused on its size before it is parsed: a rule of 16 labels kept is a few hundred
    // bytes, and a JSON array of empty strings makes 24 bytes of every 3.
    if body.len() > MAX_RULE_BYTES {
        return Err(ApiError::too_large(format!(
            "the recording rule has {} bytes, over the limit of {MAX_RULE_BYTES}",
            body.len()
        )));
    }
    let rule: RecordingRule = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("not a recording rule: {e}")))?;
    if rule.name != name {
        return Err(ApiError::bad_request(format!(
            "the rule is named {:?}, the path {name:?}",
            rule.name
        )));
    }
    // The tenant is created (within limits.max_tenants) and its store counts from now on.
    let _tenant = state.tenants.for_write(&tenant).await?;
    state.rules.put(&tenant, rule.clone()).await?;
    tracing::info!(%tenant, rule = %rule.name, "recording rule set");
    Ok(Json(json!({ "rule": rule })))
}

async fn delete(
    State(state): State<Shared>,
    crate::TenantId(tenant): crate::TenantId,
    UrlPath(name): UrlPath<String>,
) -> ApiResult<Json<Value>> {
    state.rules.delete(&tenant, &name).await?;
    tracing::info!(%tenant, rule = %name, "recording rule deleted");
    Ok(Json(json!({ "deleted": name })))
}

/// The series of every tenant's rules (`only`: of that tenant's), in the exposition format,
/// for `/metrics`, and (to the server's token) what remote write did.
///
/// `charge` holds what is being written and the series copied for it past
/// [`UNCHARGED_EXPOSITION`], grown as they are: past the budget, the exposition stops with
/// the budget's refusal. Below it nothing is charged, so that a usual `/metrics` answers
/// when the budget is full, as the route's request is not charged either: memory is most
/// worth watching then.
pub fn exposition(
    rules: &Rules,
    only: Option<&str>,
    out: &mut String,
    charge: &mut frostdb_core::Reservation,
) -> Result<(), frostdb_core::OverBudget> {
    const WHAT: &str = "the recording rules' series of /metrics";
    let held = exposition_held;
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    let rw = &rules.remote_write;
    let server_wide = if only.is_none() { 5 } else { 0 };
    for (name, kind, help, value) in [
        (
            "frostdb_remote_write_batches_sent_total",
            "counter",
            "Batches the receiver acknowledged.",
            rw.sent.load(Relaxed),
        ),
        (
            "frostdb_remote_write_failures_total",
            "counter",
            "Sends that failed and were retried.",
            rw.failed.load(Relaxed),
        ),
        (
            "frostdb_remote_write_batches_dropped_total",
            "counter",
            "Batches refused by the receiver, or the oldest of a full queue.",
            rw.dropped.load(Relaxed),
        ),
        (
            "frostdb_remote_write_batches_queued",
            "gauge",
            "Batches waiting to be sent.",
            rw.queued.load(Relaxed),
        ),
        (
            "frostdb_remote_write_intervals_missed_total",
            "counter",
            "Intervals not sampled: sampling the series took longer than an interval.",
            rw.missed.load(Relaxed),
        ),
    ]
    .into_iter()
    .take(server_wide)
    {
        crate::health::single(out, name, kind, help, value);
    }
    let mut by_name: BTreeMap<String, Vec<(String, frostdb_pprof::rules::RuleSeries)>> =
        BTreeMap::new();
    let mut copied = 0;
    for (tenant, recorder) in rules.recorders() {
        if only.is_some_and(|id| id != tenant) {
            continue;
        }
        let series = recorder.series();
        copied += series.iter().map(series_bytes).sum::<usize>();
        charge.try_resize(held(copied, out), WHAT)?;
        for series in series {
            by_name
                .entry(series.rule.clone())
                .or_default()
                .push((tenant.clone(), series));
        }
    }
    for (name, series) in by_name {
        let _ = writeln!(
            out,
            "# HELP {name} Recording rule {name}: the sum of the values of the profiles it \
             selects.\n# TYPE {name} counter"
        );
        for (tenant, s) in series {
            let _ = write!(out, "{name}{{tenant=\"{}\"", crate::health::escape(&tenant));
            for (k, v) in &s.labels {
                let _ = write!(out, ",{k}=\"{}\"", crate::health::escape(v));
            }
            let _ = writeln!(out, "}} {}", s.value);
            charge.try_resize(held(copied, out), WHAT)?;
        }
    }
    Ok(())
}

/// Bytes of `/metrics`' recording-rule series (copies and text) not charged: thousands of
/// usual series.
pub const UNCHARGED_EXPOSITION: usize = 4 << 20;

/// What an exposition holds past [`UNCHARGED_EXPOSITION`]: the series (or labels) `copied`
/// for it, and its text `out`.
pub fn exposition_held(copied: usize, out: &String) -> usize {
    (copied + out.capacity()).saturating_sub(UNCHARGED_EXPOSITION)
}

/// What a copied series holds: its rule's name and labels, and their headers.
fn series_bytes(s: &frostdb_pprof::rules::RuleSeries) -> usize {
    let labels: usize = s.labels.iter().map(|(k, v)| k.len() + v.len() + 48).sum();
    s.rule.len() + labels + std::mem::size_of::<frostdb_pprof::rules::RuleSeries>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions};

    /// Rules recording `n` series of 1,000-byte values (`service_name` pprof labels of
    /// one profile's samples), kept in `dir`.
    fn recording(dir: &std::path::Path, n: usize) -> Rules {
        let rule = RecordingRule {
            name: "cpu_total".into(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            selector: String::new(),
            function: None,
            leaf_only: false,
            keep_labels: vec!["service_name".into()],
        };
        let configured = BTreeMap::from([("t".to_owned(), vec![rule])]);
        let rules = Rules::new(dir, configured, RuleLimits::default()).unwrap();
        let store = ProfileStore::open(
            frostdb_core::Db::open_in_memory(frostdb_core::DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap();
        store.attach_recorder(rules.recorder("t").unwrap());
        let mut profile = frostdb_pprof::testing::profile(0, n, 3);
        let key = profile.string_table.len() as i64;
        profile.string_table.push("service_name".into());
        for (i, sample) in profile.sample.iter_mut().enumerate() {
            profile.string_table.push(format!("{i:01000}"));
            sample.label = vec![frostdb_pprof::proto::Label {
                key,
                str: profile.string_table.len() as i64 - 1,
                ..Default::default()
            }];
        }
        let options = IngestOptions::default()
            .name("process_cpu")
            .delta(false)
            .timestamp_ms(1_700_000_000_000);
        store
            .ingest(&prost::Message::encode_to_vec(&profile), &options)
            .unwrap();
        rules
    }

    /// A tenant whose stored rules no longer go with its config (one named as a config
    /// rule, or past a lowered `max_recording_rules`) opens with the rules that do, rather
    /// than not at all; its file is left as it was.
    #[test]
    fn stored_rules_that_no_longer_fit_are_left_out_not_the_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let rule = |name: &str| RecordingRule {
            name: name.into(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            selector: String::new(),
            function: None,
            leaf_only: false,
            keep_labels: vec![],
        };
        let configured = BTreeMap::from([("t".to_owned(), vec![rule("cpu_total")])]);
        let limits = RuleLimits {
            max_rules: 2,
            ..RuleLimits::default()
        };
        let rules = Rules::new(dir.path(), configured, limits).unwrap();
        let stored = [rule("cpu_total"), rule("a_total"), rule("b_total")];
        rules.write("t", &stored).unwrap();
        let names: Vec<String> = rules
            .recorder("t")
            .unwrap()
            .status()
            .into_iter()
            .map(|s| s.rule.name)
            .collect();
        assert_eq!(names, ["cpu_total", "a_total"]);
        assert_eq!(rules.stored("t").unwrap().len(), 3, "the file is as it was");
    }

    fn expose(rules: &Rules, budget: usize) -> Result<String, frostdb_core::OverBudget> {
        let budget = frostdb_core::MemoryBudget::new(budget);
        let (mut out, mut charge) = (String::new(), budget.empty());
        exposition(rules, None, &mut out, &mut charge).map(|()| out)
    }

    /// `/metrics`' series of the recording rules are charged as they are copied and
    /// written, past the first 4 MiB: 4,000 series of 1,000-byte values are refused under
    /// a 256 KiB budget (naming what asked) and written whole under 32 MiB; 100 series are
    /// written under a budget of a byte, as a usual `/metrics` answers with the budget full.
    #[test]
    fn the_exposition_of_rule_series_is_charged_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let many = recording(&dir.path().join("many"), 4_000);
        let refused = expose(&many, 256 << 10).unwrap_err();
        assert!(refused.what.contains("recording rules"), "{refused:?}");
        let series = |out: &str| out.lines().filter(|l| l.starts_with("cpu_total{")).count();
        assert_eq!(series(&expose(&many, 32 << 20).unwrap()), 4_000);
        let few = recording(&dir.path().join("few"), 100);
        assert_eq!(series(&expose(&few, 1).unwrap()), 100);
    }
}
