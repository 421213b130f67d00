//! Regressions found across deploys: every `[regressions] interval`, for each open tenant,
//! each service's versions (by the first of `version_labels` it carries) are listed from
//! the profile totals, and the newest version with `min_profiles` profiles is compared with
//! the one before it that has as many ([`frostdb_pprof::regress::compare`]: per function,
//! its self and total share, tested over the profiles). The old version's last `window`
//! and the new one's first are read, so a comparison costs the same however long a version
//! ran. A pair is compared again while the new version's window fills (when its profiles
//! grew by a quarter), so early results sharpen.
//!
//! Results are kept in memory, the last five per service and profile type (a restart finds
//! them again on its first pass, from the stored profiles), served by
//! `GET /api/v1/regressions?service=`, listed on the web page, and counted on `/metrics`
//! (`frostdb_regressions`, one series per service and profile type, for alerting).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use axum::Router;
use axum::extract::{Query, State};
use axum::routing::get;
use frostdb_pprof::regress::{CompareError, Regression, compare};
use frostdb_pprof::{ProfileStore, ReadOptions, Selector, TimeRange};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;

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

/// What one tenant found.
#[derive(Debug, Default)]
struct Found {
    /// By (service, profile type), oldest first.
    findings: BTreeMap<(String, String), Vec<Finding>>,
}

/// Every tenant's findings.
#[derive(Debug, Default)]
pub struct Regressions {
    tenants: Mutex<HashMap<String, Found>>,
    /// Comparisons made since the server started.
    pub comparisons: AtomicU64,
    /// Comparisons that failed (a read error), logged.
    pub failures: AtomicU64,
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
        let tenants = self.tenants.lock();
        let Some(found) = tenants.get(tenant) else {
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

    /// Keeps `finding`: it replaces the last of its service and type when that compared the
    /// same two versions.
    fn keep(&self, tenant: &str, finding: Finding) {
        let mut tenants = self.tenants.lock();
        let found = tenants.entry(tenant.to_owned()).or_default();
        let key = (finding.service.clone(), finding.profile_type.clone());
        if !found.findings.contains_key(&key) && found.findings.len() >= MAX_KEYS {
            tracing::warn!(%tenant, service = %key.0, "regressions: {MAX_KEYS} services and types kept; not keeping more");
            return;
        }
        let list = found.findings.entry(key).or_default();
        match list.last_mut() {
            Some(last)
                if last.before.version == finding.before.version
                    && last.after.version == finding.after.version =>
            {
                *last = finding
            }
            _ => list.push(finding),
        }
        if list.len() > KEPT {
            list.remove(0);
        }
    }

    /// The last comparison of `tenant`'s `service` and `profile_type`.
    fn last(&self, tenant: &str, service: &str, profile_type: &str) -> Option<Finding> {
        self.tenants
            .lock()
            .get(tenant)?
            .findings
            .get(&(service.to_owned(), profile_type.to_owned()))?
            .last()
            .cloned()
    }

    /// The latest comparison per tenant, service and profile type.
    fn latest(&self) -> Vec<(String, Finding)> {
        let tenants = self.tenants.lock();
        let mut out: Vec<(String, Finding)> = tenants
            .iter()
            .flat_map(|(t, found)| {
                found
                    .findings
                    .values()
                    .filter_map(|f| f.last().map(|f| (t.clone(), f.clone())))
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.0, &a.1.service, &a.1.profile_type).cmp(&(&b.0, &b.1.service, &b.1.profile_type))
        });
        out
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
            if let Some(last) = found.last(tenant, &service, &pt)
                && last.before.version == before.version
                && last.after.version == after.version
                && (last.after.to_ms >= after_to
                    || (after.profiles as usize) < last.after.profiles + last.after.profiles / 4)
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
    // Up to a thousand keys' findings: gathered and written in the query lane, not on an
    // async thread.
    let lane = state.clone();
    let body = lane
        .work
        .queries
        .blocking(move |_| {
            let mut comparisons = state.regressions.of(&tenant, params.service.as_deref());
            if let Some(pt) = &params.profile_type {
                comparisons.retain(|f| &f.profile_type == pt);
            }
            crate::query::json_bytes(&json!({
                "enabled": config.enabled,
                "service_label": config.service_label,
                "min_increase": config.min_increase,
                "significance": config.significance,
                "min_profiles": config.min_profiles,
                "comparisons": comparisons,
            }))
        })
        .await?;
    Ok(crate::query::json_response(body))
}

/// `/metrics`: per tenant (`only`: that tenant), service and profile type, the regressions
/// its latest comparison found (alert on `frostdb_regressions > 0`), and (to the server's
/// token) the comparisons made.
pub fn exposition(found: &Regressions, only: Option<&str>, out: &mut String) {
    let mut latest = found.latest();
    latest.retain(|(tenant, _)| only.is_none_or(|id| id == tenant));
    if only.is_some() {
        return exposition_of(latest, out);
    }
    crate::health::single(
        out,
        "frostdb_regression_comparisons_total",
        "counter",
        "Comparisons of a service's version with the one before.",
        found.comparisons.load(Relaxed),
    );
    crate::health::single(
        out,
        "frostdb_regression_comparison_failures_total",
        "counter",
        "Comparisons that could not read their versions.",
        found.failures.load(Relaxed),
    );
    exposition_of(latest, out);
}

/// The `frostdb_regressions` family of `latest`.
fn exposition_of(latest: Vec<(String, Finding)>, out: &mut String) {
    use std::fmt::Write;
    if latest.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP frostdb_regressions Functions whose share rose significantly in the latest \
         comparison of a service's version with the one before.\n# TYPE frostdb_regressions gauge"
    );
    let e = crate::health::escape;
    for (tenant, f) in latest {
        let _ = writeln!(
            out,
            "frostdb_regressions{{tenant=\"{}\",service=\"{}\",profile_type=\"{}\",before=\"{}\",after=\"{}\"}} {}",
            e(&tenant),
            e(&f.service),
            e(&f.profile_type),
            e(&f.before.version),
            e(&f.after.version),
            f.regressions.len()
        );
    }
}
