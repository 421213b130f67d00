//! Pulling profiles: one loop per target and profile, every interval, from a Go program's
//! `/debug/pprof/*`. Each profile is labelled with `job`, `instance` and the configured
//! labels; cumulative types (allocations, contentions, delay) are stored as deltas between
//! consecutive scrapes. A target that is down keeps being retried; its last error is shown
//! by `GET /api/v1/targets`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::task::JoinHandle;

use super::Shared;
use super::config::ScrapeConfig;
use super::error::ApiResult;
use super::ingest::{Incoming, store_one};

/// The state of one scraped profile of one target.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetStatus {
    /// The tenant the job stores into: only it sees the target.
    #[serde(skip)]
    pub tenant: String,
    /// Job name.
    pub job: String,
    /// `host:port`.
    pub instance: String,
    /// Profile (`cpu`, `heap`, ...).
    pub profile: String,
    /// The URL scraped.
    pub url: String,
    /// `up` after a successful scrape, `down` after a failed one, `unknown` before the first.
    pub health: &'static str,
    /// Unix ms of the last scrape's start.
    pub last_scrape_ms: Option<i64>,
    /// How long it took.
    pub last_duration_ms: Option<u64>,
    /// The last error, if the last scrape failed.
    pub last_error: Option<String>,
    /// Successful scrapes.
    pub scrapes: u64,
    /// Failed scrapes.
    pub failures: u64,
    /// Samples stored by the last scrape.
    pub last_samples: usize,
}

/// Every scrape loop's state, for the targets endpoint.
#[derive(Debug, Default)]
pub struct Targets(Mutex<BTreeMap<String, TargetStatus>>);

impl Targets {
    fn update(&self, key: &str, f: impl FnOnce(&mut TargetStatus)) {
        if let Some(s) = self.0.lock().get_mut(key) {
            f(s);
        }
    }

    /// A copy of the state of every target of `tenant`.
    pub fn snapshot(&self, tenant: &str) -> Vec<TargetStatus> {
        self.0
            .lock()
            .values()
            .filter(|t| t.tenant == tenant)
            .cloned()
            .collect()
    }
}

/// The targets route.
pub fn routes() -> Router<Shared> {
    Router::new().route("/api/v1/targets", get(targets))
}

/// The scrape targets of the request's tenant (the jobs storing into it): another tenant's
/// URLs, labels and errors are not its business.
async fn targets(
    State(state): State<Shared>,
    super::TenantId(tenant): super::TenantId,
) -> ApiResult<Json<Vec<TargetStatus>>> {
    Ok(Json(state.targets.snapshot(&tenant)))
}

/// The profile name a Go endpoint's profile is stored under.
pub fn profile_name(profile: &str) -> &str {
    match profile {
        "cpu" => "process_cpu",
        "heap" => "memory",
        "goroutine" => "goroutines",
        other => other,
    }
}

fn path(profile: &str, interval: Duration) -> String {
    match profile {
        // A CPU profile covers the interval (less a second, so scrapes do not overlap).
        "cpu" => format!(
            "/debug/pprof/profile?seconds={}",
            interval.as_secs().saturating_sub(1).clamp(1, 60)
        ),
        other => format!("/debug/pprof/{other}"),
    }
}

/// One scrape loop: a target's profile.
struct Loop {
    /// The target's address (its `instance` label).
    instance: String,
    profile: String,
    url: String,
    /// `url` with any password redacted: what is logged.
    shown: String,
    /// Its key in the targets' statuses.
    key: String,
    /// Where in each interval it scrapes.
    offset: Duration,
}

/// Loops spread their scrapes over at most this much of their interval: a long interval's
/// first scrape still comes soon after start.
const MAX_SPREAD: Duration = Duration::from_secs(15);

/// Where in `interval` (within its first [`MAX_SPREAD`]) the loop `key` scrapes: a hash of
/// its key, so a loop keeps its place across restarts and loops spread evenly.
fn spread(key: &str, interval: Duration) -> Duration {
    use std::hash::Hasher;
    // Fixed keys: the same place in every run.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hasher.write(key.as_bytes());
    let nanos = interval.min(MAX_SPREAD).as_nanos().max(1);
    Duration::from_nanos((u128::from(hasher.finish()) % nanos) as u64)
}

/// Starts every configured scrape loop.
pub fn start(state: Shared) -> Vec<JoinHandle<()>> {
    let mut handles = Vec::new();
    // One client for every loop: one pool of connections per target, and the client's
    // set-up (its root certificates) made once, not once per loop on the async threads.
    // Redirects are followed only within the target (its scheme, host and port), a few
    // at most: a target that names another host would have the server fetch it (cloud
    // metadata, the server's own routes) and report its answer in the target's status.
    let within_target = reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous().first().map(reqwest::Url::origin);
        if attempt.previous().len() > 4 {
            attempt.error("more than 4 redirects")
        } else if first.is_some_and(|o| o != attempt.url().origin()) {
            let to = attempt.url().origin().ascii_serialization();
            attempt.error(format!("a redirect to another host ({to}) is not followed"))
        } else {
            attempt.follow()
        }
    });
    let client = match reqwest::Client::builder().redirect(within_target).build() {
        Ok(c) => c,
        Err(e) => {
            if !state.config.scrape.is_empty() {
                tracing::error!(error = %e, "scraping off: no HTTP client");
            }
            return handles;
        }
    };
    for config in &state.config.scrape {
        for target in &config.targets {
            for profile in &config.profiles {
                let url = format!(
                    "{}://{}{}",
                    config.scheme,
                    target,
                    path(profile, config.interval)
                );
                // A password in the target (`user:password@host:port`) is shown, logged and
                // stored nowhere: the instance label is the address alone.
                let instance = frostdb_core::without_userinfo(target).into_owned();
                let shown = frostdb_core::redacted_url(&url).into_owned();
                // Keyed by the whole target: two that differ only in credentials are two.
                let key = format!("{}/{}/{}", config.job, target, profile);
                state.targets.0.lock().insert(
                    key.clone(),
                    TargetStatus {
                        tenant: config.tenant.clone(),
                        job: config.job.clone(),
                        instance: instance.clone(),
                        profile: profile.clone(),
                        url: shown.clone(),
                        health: "unknown",
                        ..TargetStatus::default()
                    },
                );
                tracing::info!(job = %config.job, url = %shown, interval = ?config.interval, "scraping");
                // Each loop's scrapes at an offset of its own within the interval (as
                // Prometheus spreads them): thousands of loops do not all fire at once.
                let offset = spread(&key, config.interval);
                handles.push(tokio::spawn(run(
                    state.clone(),
                    config.clone(),
                    client.clone(),
                    Loop {
                        instance,
                        profile: profile.clone(),
                        url,
                        shown,
                        key,
                        offset,
                    },
                )));
            }
        }
    }
    handles
}

async fn run(state: Shared, config: ScrapeConfig, client: reqwest::Client, l: Loop) {
    let Loop {
        instance,
        profile,
        url,
        shown,
        key,
        offset,
    } = l;
    let timeout = config.interval + Duration::from_secs(if profile == "cpu" { 70 } else { 10 });
    let mut labels: Vec<(String, String)> = config
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.push(("job".into(), config.job.clone()));
    labels.push(("instance".into(), instance));
    if !config.labels.contains_key("service_name") {
        labels.push(("service_name".into(), config.job.clone()));
    }
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, config.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        let started = Instant::now();
        let started_ms = crate::time::now_ms();
        // A panic scraping (a bug, or an answer no check foresaw) marks the target down
        // and the loop goes on: it ended the loop, the target shown up for ever.
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(scrape_once(
            &state,
            &config,
            client.get(&url).timeout(timeout),
            &profile,
            &labels,
            started_ms,
        )))
        .await
        .unwrap_or_else(|panic| {
            Err(format!(
                "the scrape panicked: {}",
                frostdb_core::panic_message(&*panic)
            ))
        });
        let elapsed = started.elapsed().as_millis() as u64;
        state.targets.update(&key, |s| {
            s.last_scrape_ms = Some(started_ms);
            s.last_duration_ms = Some(elapsed);
            match &result {
                Ok(samples) => {
                    s.health = "up";
                    s.last_error = None;
                    s.scrapes += 1;
                    s.last_samples = *samples;
                }
                Err(e) => {
                    s.health = "down";
                    s.last_error = Some(e.clone());
                    s.failures += 1;
                }
            }
        });
        match result {
            Ok(samples) => tracing::debug!(url = %shown, samples, elapsed_ms = elapsed, "scraped"),
            Err(e) => tracing::warn!(url = %shown, "scrape failed: {e}"),
        }
    }
}

async fn scrape_once(
    state: &Shared,
    config: &ScrapeConfig,
    request: reqwest::RequestBuilder,
    profile: &str,
    labels: &[(String, String)],
    started_ms: i64,
) -> Result<usize, String> {
    let mut response = request.send().await.map_err(|e| {
        // With its causes: reqwest's own message leaves out why (a refused redirect's).
        let mut text = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        text
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    let limit = state.config.limits.max_body_bytes;
    // A target's answer is held of the memory budget as a request's body is, and what
    // decoding it makes is charged before it is made: a target answering a bomb is
    // refused for the budget, as a push of one is.
    let memory =
        crate::edge::RequestMemory::new(&crate::edge::tenant_share(&state.budget, &config.tenant));
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
    {
        if body.len() + chunk.len() > limit {
            return Err(format!("the profile is larger than {limit} bytes"));
        }
        memory
            .try_grow(chunk.len(), "a scraped profile")
            .map_err(|e| e.to_string())?;
        body.extend_from_slice(&chunk);
    }
    let limits = state.tenants.pprof_limits();
    let (name, labels) = (profile_name(profile).to_owned(), labels.to_vec());
    let summary = store_one(state, &config.tenant, Some(memory), move || {
        let decoded = frostdb_pprof::decode(&body, &limits)
            .map_err(|e| crate::error::ApiError::from(e).context("pprof"))?;
        Ok(Incoming {
            profile: decoded,
            previous: None,
            name,
            labels,
            delta: true,
            timestamp_ms: Some(started_ms),
            at: String::new(),
        })
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(summary.rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loops scrape at places of their own, spread over their interval (at most its first
    /// 15 s), the same place each run: every loop ticked at the same instant, so thousands
    /// of targets' bodies reached the ingest lane together.
    #[test]
    fn loops_scrape_at_places_spread_over_their_interval() {
        let interval = Duration::from_secs(10);
        let places: Vec<Duration> = (0..300)
            .map(|i| spread(&format!("job/127.0.0.{i}:6060/heap"), interval))
            .collect();
        assert!(places.iter().all(|p| *p < interval));
        let (first, last) = (places.iter().min().unwrap(), places.iter().max().unwrap());
        assert!(*last - *first > interval / 2, "{first:?}..{last:?}");
        let tenths: std::collections::BTreeSet<u128> =
            places.iter().map(|p| p.as_millis() / 1000).collect();
        assert_eq!(tenths.len(), 10, "every tenth of the interval has loops");
        assert_eq!(places[7], spread("job/127.0.0.7:6060/heap", interval));
        let hour = Duration::from_secs(3600);
        assert!((0..100).all(|i| spread(&format!("k{i}"), hour) < MAX_SPREAD));
    }
}
