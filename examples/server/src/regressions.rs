//! Regressions found across deploys: every `[regressions] interval`, for each open tenant,
//! each service's versions (by the first of `version_labels` it carries) are listed from
//! the profile totals, and the newest version with `min_profiles` profiles is compared with
//! the one before it that has as many ([`frostdb_pprof::regress::compare`]: per function,
//! its self and total share, tested over the profiles). The old version's last `window`
//! and the new one's first are read, so a comparison costs the same however long a version
//! ran. A pair is compared again while the new version's window fills (when its profiles
//! grew by a quarter), so early results sharpen.
//!
//! Results are kept in memory, the last five per service and profile type, at most
//! [`MAX_TENANT_BYTES`] a tenant and [`MAX_ALL_BYTES`] in all (past them, older comparisons
//! go before any service's latest; a restart finds them again on its first pass, from the
//! stored profiles), served by
//! `GET /api/v1/regressions?service=`, listed on the web page, and counted on `/metrics`
//! (`frostdb_regressions`, one series per service and profile type, for alerting).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::Query;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use frostdb_pprof::regress::{CompareError, Regression, compare};
use frostdb_pprof::{ProfileStore, ReadOptions, Selector, TimeRange};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::Shared;
use crate::config::RegressionsConfig;
use crate::error::{ApiError, ApiResult};

/// Comparisons kept per service and profile type.
const KEPT: usize = 5;
/// Services and profile types kept per tenant; past it, new ones are not kept (logged).
const MAX_KEYS: usize = 1_000;
/// Bytes of a function name kept (a profile's names are the client's).
const MAX_NAME: usize = 512;

/// One version of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Version {
    /// The version label's value.
    pub version: String,
    /// The range read (ms).
    pub from_ms: i64,
    /// See `from_ms`.
    pub to_ms: i64,
    /// Its profiles in that range.
    pub profiles: usize,
    /// The sum of their values.
    pub total: i64,
}

/// A comparison of a service's version with the one before.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// The service (the `service_label`'s value).
    pub service: String,
    /// The profile type compared.
    pub profile_type: String,
    /// The label the versions are told by.
    pub version_label: String,
    /// The version before.
    pub before: Version,
    /// The new version.
    pub after: Version,
    /// When it was compared (ms).
    pub compared_at_ms: i64,
    /// Functions seen on either side.
    pub functions: usize,
    /// Functions whose share rose by the threshold (tested).
    pub tested: usize,
    /// The regressions, the largest rise first.
    pub regressions: Vec<Regression>,
}

/// Bytes of findings a tenant keeps: past them, its oldest go (a tenant of a thousand
/// services, each with five findings of long function names, held about 185 MB).
const MAX_TENANT_BYTES: usize = 4 << 20;
/// Bytes of findings all tenants keep together: past them, the oldest of the tenant
/// keeping most go.
const MAX_ALL_BYTES: usize = 64 << 20;

impl Finding {
    /// About what it holds: its strings (with the copies of its service and type its key
    /// holds) and its structs.
    fn bytes(&self) -> usize {
        let names: usize = self.regressions.iter().map(|r| r.function.len()).sum();
        std::mem::size_of::<Self>()
            + 2 * (self.service.len() + self.profile_type.len())
            + self.version_label.len()
            + self.before.version.len()
            + self.after.version.len()
            + self.regressions.len() * std::mem::size_of::<Regression>()
            + names
    }
}

/// What one tenant found.
#[derive(Debug, Default)]
struct Found {
    /// By (service, profile type), oldest first.
    findings: BTreeMap<(String, String), Vec<Finding>>,
    /// What they hold ([`Finding::bytes`]).
    bytes: usize,
    /// By (service, profile type) hashed, what was compared last, kept when its finding is
    /// forgotten (a few bytes a key): a pair compared is not compared again every pass
    /// for want of its finding.
    compared: HashMap<u64, Compared>,
}

/// What a service's last comparison compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Compared {
    /// Its two versions, hashed.
    versions: u64,
    /// Where the new version's range ended, and its profiles.
    to_ms: i64,
    profiles: usize,
}

/// A hash of `parts` (a key or a pair of versions).
fn hash_of(parts: &[&str]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

impl Found {
    /// Whether a finding other than the last of `keep`'s key may be forgotten.
    fn forgettable(&self, keep: Option<&(String, String)>) -> bool {
        self.findings
            .iter()
            .any(|(k, list)| list.len() > usize::from(keep == Some(k)))
    }

    /// Forgets the oldest finding (the earliest compared) but the last of `keep`'s key,
    /// returning its bytes; `None` when there is none. An earlier comparison of a key goes
    /// before any key's latest (which `/metrics` counts).
    fn forget_oldest(&mut self, keep: Option<&(String, String)>) -> Option<usize> {
        let oldest = |history: bool| {
            self.findings
                .iter()
                .filter(|(k, list)| match history {
                    true => list.len() > 1,
                    false => list.len() == 1 && keep != Some(*k),
                })
                .min_by_key(|(_, list)| list[0].compared_at_ms)
                .map(|(k, _)| k.clone())
        };
        let key = oldest(true).or_else(|| oldest(false))?;
        let list = self.findings.get_mut(&key)?;
        let bytes = list.remove(0).bytes();
        if list.is_empty() {
            self.findings.remove(&key);
        }
        self.bytes -= bytes;
        Some(bytes)
    }
}

/// The findings of every tenant, and their bytes.
#[derive(Debug, Default)]
struct Kept {
    tenants: HashMap<String, Found>,
    /// What they hold together.
    bytes: usize,
}

/// Every tenant's findings, at most [`MAX_TENANT_BYTES`] a tenant and [`MAX_ALL_BYTES`] in
/// all.
#[derive(Debug, Default)]
pub struct Regressions {
    kept: Mutex<Kept>,
    /// Comparisons made since the server started.
    pub comparisons: AtomicU64,
    /// Comparisons that failed (a read error), logged.
    pub failures: AtomicU64,
}

/// The labels of a key's latest finding, as `/metrics` counts it.
struct Latest {
    tenant: String,
    service: String,
    profile_type: String,
    before: String,
    after: String,
    regressions: usize,
}

impl Latest {
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.tenant.len()
            + self.service.len()
            + self.profile_type.len()
            + self.before.len()
            + self.after.len()
    }
}

/// A version as the profile totals list it.
#[derive(Debug, Clone)]
struct Seen {
    version: String,
    first_ms: i64,
    last_ms: i64,
    profiles: u64,
}

/// The step versions are listed at.
const STEP_MS: i64 = 60_000;

impl Regressions {
    /// Findings of `tenant`, newest first, of `service` (all when `None`).
    pub fn of(&self, tenant: &str, service: Option<&str>) -> Vec<Finding> {
        let kept = self.kept.lock();
        let Some(found) = kept.tenants.get(tenant) else {
            return Vec::new();
        };
        let mut out: Vec<Finding> = found
            .findings
            .iter()
            .filter(|((s, _), _)| service.is_none_or(|want| want == s))
            .flat_map(|(_, f)| f.iter().cloned())
            .collect();
        out.sort_by(|a, b| {
            b.after
                .from_ms
                .cmp(&a.after.from_ms)
                .then_with(|| b.compared_at_ms.cmp(&a.compared_at_ms))
        });
        out
    }

    /// What `tenant`'s findings hold ([`Finding::bytes`]).
    fn bytes_of(&self, tenant: &str) -> usize {
        self.kept.lock().tenants.get(tenant).map_or(0, |f| f.bytes)
    }

    /// Keeps `finding`: it replaces the last of its service and type when that compared the
    /// same two versions. Past [`MAX_TENANT_BYTES`] the tenant's oldest findings go, past
    /// [`MAX_ALL_BYTES`] those of the tenant keeping most (earlier comparisons before any
    /// key's latest); a finding is not kept only when it is over a tenant's bytes alone, or
    /// its key is new past [`MAX_KEYS`].
    fn keep(&self, tenant: &str, finding: Finding) {
        let size = finding.bytes();
        let key = (finding.service.clone(), finding.profile_type.clone());
        let hashed = hash_of(&[&key.0, &key.1]);
        let mut kept = self.kept.lock();
        let Kept {
            tenants,
            bytes: all,
        } = &mut *kept;
        let found = tenants.entry(tenant.to_owned()).or_default();
        if !found.compared.contains_key(&hashed) && found.compared.len() >= MAX_KEYS {
            tracing::warn!(%tenant, service = %key.0, "regressions: {MAX_KEYS} services and types kept; not keeping more");
            return;
        }
        found.compared.insert(
            hashed,
            Compared {
                versions: hash_of(&[&finding.before.version, &finding.after.version]),
                to_ms: finding.after.to_ms,
                profiles: finding.after.profiles,
            },
        );
        if size > MAX_TENANT_BYTES {
            tracing::warn!(%tenant, service = %key.0, bytes = size, "regressions: a finding over {MAX_TENANT_BYTES} bytes; not kept");
            return;
        }
        let list = found.findings.entry(key.clone()).or_default();
        let mut gone = 0;
        match list.last_mut() {
            Some(last)
                if last.before.version == finding.before.version
                    && last.after.version == finding.after.version =>
            {
                gone += std::mem::replace(last, finding).bytes();
            }
            _ => list.push(finding),
        }
        if list.len() > KEPT {
            gone += list.remove(0).bytes();
        }
        found.bytes = found.bytes + size - gone;
        *all = *all + size - gone;
        let mut forgotten = 0;
        while found.bytes > MAX_TENANT_BYTES
            && let Some(bytes) = found.forget_oldest(Some(&key))
        {
            *all -= bytes;
            forgotten += 1;
        }
        while *all > MAX_ALL_BYTES {
            let keep = |id: &String| (id == tenant).then_some(&key);
            let Some(id) = tenants
                .iter()
                .filter(|(id, f)| f.forgettable(keep(id)))
                .max_by_key(|(_, f)| f.bytes)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            let Some(bytes) = tenants
                .get_mut(&id)
                .and_then(|most| most.forget_oldest(keep(&id)))
            else {
                break;
            };
            *all -= bytes;
            forgotten += 1;
        }
        if forgotten > 0 {
            tracing::info!(%tenant, forgotten, "regressions: the oldest findings forgotten, over the bytes kept");
        }
    }

    /// What `tenant`'s `service` and `profile_type` compared last, its finding kept or not.
    fn compared(&self, tenant: &str, service: &str, profile_type: &str) -> Option<Compared> {
        self.kept
            .lock()
            .tenants
            .get(tenant)?
            .compared
            .get(&hash_of(&[service, profile_type]))
            .copied()
    }

    /// The last comparison of `tenant`'s `service` and `profile_type` kept.
    #[cfg(test)]
    fn last(&self, tenant: &str, service: &str, profile_type: &str) -> Option<Finding> {
        self.kept
            .lock()
            .tenants
            .get(tenant)?
            .findings
            .get(&(service.to_owned(), profile_type.to_owned()))?
            .last()
            .cloned()
    }

    /// The labels of the latest comparison per tenant (`only`: of that tenant), service and
    /// profile type, sorted; `charge` called with the bytes copied as they grow.
    fn latest<E>(
        &self,
        only: Option<&str>,
        mut charge: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<Vec<Latest>, E> {
        let kept = self.kept.lock();
        let mut out = Vec::new();
        let mut copied = 0;
        for (tenant, found) in &kept.tenants {
            if only.is_some_and(|id| id != tenant) {
                continue;
            }
            for f in found.findings.values().filter_map(|list| list.last()) {
                let latest = Latest {
                    tenant: tenant.clone(),
                    service: f.service.clone(),
                    profile_type: f.profile_type.clone(),
                    before: f.before.version.clone(),
                    after: f.after.version.clone(),
                    regressions: f.regressions.len(),
                };
                copied += latest.bytes();
                charge(copied)?;
                out.push(latest);
            }
        }
        drop(kept);
        out.sort_by(|a, b| {
            (&a.tenant, &a.service, &a.profile_type).cmp(&(&b.tenant, &b.service, &b.profile_type))
        });
        Ok(out)
    }
}

/// Starts the comparisons' loop (`None` when `[regressions]` is off).
pub fn start(state: Shared) -> Option<tokio::task::JoinHandle<()>> {
    let config = state.config.regressions.clone();
    if !config.enabled {
        return None;
    }
    tracing::info!(
        every = ?config.interval,
        service_label = %config.service_label,
        version_labels = ?config.version_labels,
        "regressions: comparing each service's newest version with the one before"
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // One tenant held at a time: the others stay closable while its pass runs.
            for tenant in state.tenants.open_weakly() {
                let Some(tenant) = tenant.upgrade() else {
                    continue; // closed meanwhile
                };
                let (state, config) = (state.clone(), config.clone());
                let id = tenant.id.clone();
                let done = tokio::task::spawn_blocking(move || {
                    pass(
                        &state.regressions,
                        &tenant.id,
                        &tenant.store,
                        &config,
                        crate::time::now_ms(),
                    )
                })
                .await;
                if let Err(error) = done {
                    tracing::warn!(tenant = %id, %error, "regressions: a pass failed");
                }
            }
        }
    }))
}

/// One look at `store`: each service's newest version compared with the one before, where
/// there is something new to compare. Returns the comparisons made.
pub fn pass(
    found: &Regressions,
    tenant: &str,
    store: &ProfileStore,
    config: &RegressionsConfig,
    now_ms: i64,
) -> usize {
    let lookback = i64::try_from(config.lookback.as_millis()).unwrap_or(i64::MAX);
    let range = TimeRange {
        start_ms: now_ms.saturating_sub(lookback),
        end_ms: now_ms.saturating_add(STEP_MS),
    };
    let types = match store.profile_types(range, ReadOptions::STRICT) {
        Ok(read) => read.value,
        Err(error) => {
            tracing::warn!(%tenant, %error, "regressions: listing profile types failed");
            return 0;
        }
    };
    // Only the version labels the tenant has (from the series index, no sample read): a
    // tenant without any costs no scan of its profile totals.
    let names = match store.label_names(None, range, ReadOptions::STRICT) {
        Ok(read) => read.value,
        Err(error) => {
            tracing::warn!(%tenant, %error, "regressions: listing label names failed");
            return 0;
        }
    };
    if !names.contains(&config.service_label) {
        return 0;
    }
    let labels: Vec<&String> = config
        .version_labels
        .iter()
        .filter(|l| names.contains(l))
        .collect();
    if labels.is_empty() {
        return 0;
    }
    let mut made = 0;
    for profile_type in types {
        let pt = profile_type.to_string();
        let versions = match versions(store, &pt, config, &labels, range) {
            Ok(v) => v,
            Err(error) => {
                tracing::warn!(%tenant, %error, "regressions: listing versions failed");
                continue;
            }
        };
        for ((service, label), mut seen) in versions {
            seen.retain(|v| v.profiles >= config.min_profiles as u64);
            // Versions first seen in the same minute: ordered by their first profile's
            // exact time (read from the totals of that minute), not by name.
            let minutes: Vec<i64> = seen.iter().map(|v| v.first_ms).collect();
            for v in &mut seen {
                if minutes.iter().filter(|m| **m == v.first_ms).count() < 2 {
                    continue;
                }
                let minute = TimeRange {
                    start_ms: v.first_ms,
                    end_ms: v.first_ms.saturating_add(STEP_MS),
                };
                let first =
                    version_selector(&pt, config, &service, &label, &v.version).and_then(|s| {
                        store
                            .timestamps(&s, minute, ReadOptions::STRICT)
                            .map_err(|e| e.to_string())
                    });
                match first {
                    Ok(times) => v.first_ms = times.value.first().copied().unwrap_or(v.first_ms),
                    Err(error) => {
                        tracing::warn!(%tenant, %service, %error, "regressions: a version's first time");
                    }
                }
            }
            seen.sort_by(|a, b| (a.first_ms, &a.version).cmp(&(b.first_ms, &b.version)));
            let [.., before, after] = &seen[..] else {
                continue;
            };
            let window = i64::try_from(config.window.as_millis()).unwrap_or(i64::MAX);
            let after_to = after.last_ms.min(after.first_ms.saturating_add(window));
            if let Some(last) = found.compared(tenant, &service, &pt)
                && last.versions == hash_of(&[&before.version, &after.version])
                && (last.to_ms >= after_to
                    || (after.profiles as usize) < last.profiles + last.profiles / 4)
            {
                // Compared, and the new version's window has not grown by a quarter since.
                continue;
            }
            let before_range = TimeRange {
                start_ms: before.first_ms.max(before.last_ms.saturating_sub(window)),
                end_ms: before.last_ms,
            };
            let after_range = TimeRange {
                start_ms: after.first_ms,
                end_ms: after_to,
            };
            let read = |v: &str, r: TimeRange| -> Result<frostdb_pprof::Profiles, String> {
                let s = version_selector(&pt, config, &service, &label, v)?;
                store
                    .profiles(&s, r, ReadOptions::STRICT)
                    .map_err(|e| e.to_string())
            };
            let started = std::time::Instant::now();
            let compared = read(&before.version, before_range).and_then(|b| {
                let a = read(&after.version, after_range)?;
                Ok(compare(&b, &a, &config.compare_options()))
            });
            let mut comparison = match compared {
                Ok(Ok(c)) => c,
                // Profiles without a positive total do not count: not enough yet.
                Ok(Err(CompareError::TooFewProfiles { .. })) => continue,
                Ok(Err(error)) => {
                    tracing::warn!(%tenant, %service, %error, "regressions: comparison refused");
                    continue;
                }
                Err(error) => {
                    found.failures.fetch_add(1, Relaxed);
                    tracing::warn!(%tenant, %service, %error, "regressions: reading the versions failed");
                    continue;
                }
            };
            for r in &mut comparison.regressions {
                if r.function.len() > MAX_NAME {
                    let mut end = MAX_NAME;
                    while !r.function.is_char_boundary(end) {
                        end -= 1;
                    }
                    r.function.truncate(end);
                    r.function.push('…');
                }
            }
            found.comparisons.fetch_add(1, Relaxed);
            made += 1;
            tracing::info!(
                %tenant,
                %service,
                profile_type = %pt,
                before = %before.version,
                after = %after.version,
                profiles = ?(comparison.before.profiles, comparison.after.profiles),
                regressions = comparison.regressions.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "regressions: compared versions"
            );
            found.keep(
                tenant,
                Finding {
                    service,
                    profile_type: pt.clone(),
                    version_label: label,
                    before: Version {
                        version: before.version.clone(),
                        from_ms: before_range.start_ms,
                        to_ms: before_range.end_ms,
                        profiles: comparison.before.profiles,
                        total: comparison.before.total,
                    },
                    after: Version {
                        version: after.version.clone(),
                        from_ms: after_range.start_ms,
                        to_ms: after_range.end_ms,
                        profiles: comparison.after.profiles,
                        total: comparison.after.total,
                    },
                    compared_at_ms: now_ms,
                    functions: comparison.functions,
                    tested: comparison.tested,
                    regressions: comparison.regressions,
                },
            );
        }
    }
    made
}

/// The selector of `service`'s `version` (told by `label`) of profile type `pt`.
fn version_selector(
    pt: &str,
    config: &RegressionsConfig,
    service: &str,
    label: &str,
    version: &str,
) -> Result<Selector, String> {
    Selector::parse(&format!(
        "{pt}{{{}=\"{}\",{label}=\"{}\"}}",
        config.service_label,
        escape(service),
        escape(version)
    ))
    .map_err(|e| e.to_string())
}

/// A value in a selector's double quotes.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Per (service, version label) of `profile_type`, its versions seen in `range` (each the
/// first of `labels`, the version labels the tenant has, the service carries), from the
/// profile totals of the profiles that carry it.
fn versions(
    store: &ProfileStore,
    profile_type: &str,
    config: &RegressionsConfig,
    labels: &[&String],
    range: TimeRange,
) -> Result<BTreeMap<(String, String), Vec<Seen>>, String> {
    let mut out: BTreeMap<(String, String), Vec<Seen>> = BTreeMap::new();
    // Each service's version label: the first it was seen with.
    let mut told: HashMap<String, &String> = HashMap::new();
    for &label in labels {
        let with = Selector::parse(&format!(
            "{profile_type}{{{}!=\"\",{label}!=\"\"}}",
            config.service_label
        ))
        .map_err(|e| e.to_string())?;
        let group = [config.service_label.clone(), label.clone()];
        let series = store
            .range(&with, range, STEP_MS, Some(&group), ReadOptions::STRICT)
            .map_err(|e| e.to_string())?
            .value;
        for s in series {
            let value = |name: &str| {
                s.labels
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let (Some(service), Some(version)) = (value(&config.service_label), value(label))
            else {
                continue;
            };
            // A service told by an earlier label keeps it.
            if *told.entry(service.clone()).or_insert(label) != label {
                continue;
            }
            let (Some(first), Some(last)) = (s.points.first(), s.points.last()) else {
                continue;
            };
            out.entry((service, label.clone())).or_default().push(Seen {
                version,
                first_ms: first.0,
                last_ms: last.0.saturating_add(STEP_MS),
                profiles: s.rows.iter().sum(),
            });
        }
    }
    Ok(out)
}

/// `/api/v1/regressions`.
pub fn routes() -> Router<Shared> {
    Router::new().route("/api/v1/regressions", get(list))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    service: Option<String>,
    profile_type: Option<String>,
}

/// The tenant's comparisons, newest first: of one service with `service=`, of one profile
/// type with `profile_type=`.
async fn list(
    State(state): State<Shared>,
    crate::TenantId(tenant): crate::TenantId,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::response::Response> {
    let config = state.config.regressions.clone();
    if params.service.as_ref().is_some_and(|s| s.len() > 4096)
        || params.profile_type.as_ref().is_some_and(|s| s.len() > 4096)
    {
        return Err(ApiError::bad_request(
            "service and profile_type may have at most 4096 bytes",
        ));
    }
    // Up to a tenant's bytes of findings: copied, and written (a control character of a
    // name six bytes of JSON), in the query lane, not on an async thread, and reserved
    // first.
    let lane = state.clone();
    let body = lane
        .work
        .queries
        .blocking(move |_| {
            let held = state.regressions.bytes_of(&tenant);
            let _held = state
                .budget
                .try_reserve(held.saturating_mul(8), "the regressions listed")
                .map_err(ApiError::over_budget)?;
            let mut comparisons = state.regressions.of(&tenant, params.service.as_deref());
            if let Some(pt) = &params.profile_type {
                comparisons.retain(|f| &f.profile_type == pt);
            }
            #[derive(Serialize)]
            struct Listed<'a> {
                enabled: bool,
                service_label: &'a str,
                min_increase: f64,
                significance: f64,
                min_profiles: usize,
                comparisons: Vec<Finding>,
            }
            crate::query::json_bytes(&Listed {
                enabled: config.enabled,
                service_label: &config.service_label,
                min_increase: config.min_increase,
                significance: config.significance,
                min_profiles: config.min_profiles,
                comparisons,
            })
        })
        .await?;
    Ok(crate::query::json_response(body))
}

/// `/metrics`: per tenant (`only`: that tenant), service and profile type, the regressions
/// its latest comparison found (alert on `frostdb_regressions > 0`), and (to the server's
/// token) the comparisons made.
///
/// `charge` holds the labels copied and the text written past
/// [`crate::rules::UNCHARGED_EXPOSITION`], as the rules' part does: past the budget, the
/// exposition stops with the budget's refusal.
pub fn exposition(
    found: &Regressions,
    only: Option<&str>,
    out: &mut String,
    charge: &mut frostdb_core::Reservation,
) -> Result<(), frostdb_core::OverBudget> {
    const WHAT: &str = "the regressions of /metrics";
    let held = crate::rules::exposition_held;
    // The server's own counters, to the server's token only.
    let own = [
        (
            "frostdb_regression_comparisons_total",
            "Comparisons of a service's version with the one before.",
            &found.comparisons,
        ),
        (
            "frostdb_regression_comparison_failures_total",
            "Comparisons that could not read their versions.",
            &found.failures,
        ),
    ];
    if only.is_none() {
        for (name, help, value) in own {
            crate::health::single(out, name, "counter", help, value.load(Relaxed));
        }
    }
    let mut copied = 0;
    let latest = found.latest(only, |bytes| {
        copied = bytes;
        charge.try_resize(held(bytes, out), WHAT)
    })?;
    use std::fmt::Write;
    if latest.is_empty() {
        return Ok(());
    }
    let _ = writeln!(
        out,
        "# HELP frostdb_regressions Functions whose share rose significantly in the latest \
         comparison of a service's version with the one before.\n# TYPE frostdb_regressions gauge"
    );
    let e = crate::health::escape;
    for f in latest {
        copied -= f.bytes();
        let _ = writeln!(
            out,
            "frostdb_regressions{{tenant=\"{}\",service=\"{}\",profile_type=\"{}\",before=\"{}\",after=\"{}\"}} {}",
            e(&f.tenant),
            e(&f.service),
            e(&f.profile_type),
            e(&f.before),
            e(&f.after),
            f.regressions
        );
        charge.try_resize(held(copied, out), WHAT)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finding of `service` with `listed` regressions of names of `name` bytes.
    fn finding(service: &str, after: &str, at_ms: i64, listed: usize, name: usize) -> Finding {
        let version = |v: &str| Version {
            version: v.into(),
            from_ms: at_ms,
            to_ms: at_ms,
            profiles: 20,
            total: 1,
        };
        Finding {
            service: service.into(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            version_label: "version".into(),
            before: version("v0"),
            after: version(after),
            compared_at_ms: at_ms,
            functions: listed,
            tested: listed,
            regressions: (0..listed)
                .map(|i| Regression {
                    function: format!("{i:0>name$}"),
                    self_before: 0.0,
                    self_after: 0.1,
                    total_before: 0.0,
                    total_after: 0.1,
                    p_self: 0.0,
                    p_total: 0.0,
                    kind: "both",
                })
                .collect(),
        }
    }

    fn kept_bytes(found: &Regressions) -> (usize, usize) {
        let kept = found.kept.lock();
        let sum = kept
            .tenants
            .values()
            .flat_map(|f| f.findings.values().flatten())
            .map(Finding::bytes)
            .sum();
        (kept.bytes, sum)
    }

    #[test]
    fn a_tenants_findings_are_bounded_by_bytes_and_the_newest_are_kept() {
        let found = Regressions::default();
        // A thousand services, five versions each, of fifty long names: about 185 MB kept
        // before the bound.
        let mut at = 0;
        for version in 1..=5 {
            for service in 0..1000 {
                at += 1;
                found.keep(
                    "b",
                    finding(&format!("s{service}"), &format!("v{version}"), at, 50, 512),
                );
            }
        }
        let held = found.bytes_of("b");
        assert!(held <= MAX_TENANT_BYTES, "{held} bytes kept");
        assert!(held > MAX_TENANT_BYTES / 2, "{held} bytes kept");
        let (counted, summed) = kept_bytes(&found);
        assert_eq!(counted, summed, "the count is what the findings hold");
        assert_eq!(counted, held);
        // The newest comparison is what is kept, the oldest what went.
        let last = found.last("b", "s999", "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
        assert_eq!(last.map(|f| f.after.version), Some("v5".into()));
        assert!(
            found
                .last("b", "s0", "process_cpu:cpu:nanoseconds:cpu:nanoseconds")
                .is_none_or(|f| f.after.version == "v5")
        );
        // Another tenant's `/metrics` copies nothing of them.
        let mut copied = 0;
        let latest = found
            .latest(Some("a"), |bytes| {
                copied = bytes;
                Ok::<_, ()>(())
            })
            .unwrap();
        assert!(latest.is_empty());
        assert_eq!(copied, 0);
    }

    #[test]
    fn all_tenants_findings_are_bounded_and_each_keeps_its_newest() {
        let found = Regressions::default();
        let tenants = MAX_ALL_BYTES / MAX_TENANT_BYTES + 4;
        let mut at = 0;
        for round in 0..200 {
            for t in 0..tenants {
                at += 1;
                found.keep(
                    &format!("t{t}"),
                    finding(&format!("s{round}"), "v1", at, 50, 512),
                );
            }
        }
        let (counted, summed) = kept_bytes(&found);
        assert_eq!(counted, summed);
        assert!(counted <= MAX_ALL_BYTES, "{counted} bytes kept");
        for t in 0..tenants {
            let newest = found.last(
                &format!("t{t}"),
                "s199",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            );
            assert!(newest.is_some(), "t{t} lost its newest finding");
        }
        // Replacing a finding of the same versions counts once.
        let before = kept_bytes(&found).0;
        found.keep("t0", finding("s199", "v1", at + 1, 50, 512));
        assert_eq!(kept_bytes(&found).0, before);
    }

    #[test]
    fn metrics_charge_the_labels_they_copy() {
        let found = Regressions::default();
        let long = "x".repeat(2048);
        // Four tenants' findings of long labels (each trimmed to its 4 MiB): about 11 MB of
        // labels to the server's token.
        for tenant in 0..4 {
            for service in 0..1000 {
                found.keep(
                    &format!("t{tenant}"),
                    finding(&format!("{long}{service}"), &long, service, 0, 0),
                );
            }
        }
        let budget = frostdb_core::MemoryBudget::new(1 << 20);
        let mut charge = budget.empty();
        let mut out = String::new();
        let refused = exposition(&found, None, &mut out, &mut charge);
        assert!(
            refused.is_err(),
            "{} bytes written past a 1 MiB budget",
            out.len()
        );
        // A tenant of a few, to its own token, within the uncharged part: answered.
        for service in 0..10 {
            found.keep("few", finding(&format!("s{service}"), "v1", service, 0, 0));
        }
        let mut charge = budget.empty();
        let mut out = String::new();
        exposition(&found, Some("few"), &mut out, &mut charge).unwrap();
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("frostdb_regressions{"))
                .count(),
            10
        );
    }
}
