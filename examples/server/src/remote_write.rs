//! Prometheus remote write of the recording rules' series (`[remote_write]`): every
//! `interval`, each tenant's series at their current values, timestamped now, as a
//! snappy-compressed protobuf `WriteRequest` (remote write 1.0) of its own, sent with
//! `X-Scope-OrgID: <tenant>` (as Mimir and Cortex take a tenant's writes; a single-tenant
//! Prometheus ignores it, and every series carries a `tenant` label too). A receiver that
//! refuses one tenant's batch (its series limit, say) refuses nothing of another's.
//!
//! Sampling runs apart from sending: a receiver that takes its whole `timeout` to answer
//! one tenant delays neither the next interval nor another tenant (up to eight tenants'
//! batches are in flight at once); an interval the sampler itself could not keep up with
//! is counted (`frostdb_remote_write_intervals_missed_total`), never skipped silently.
//!
//! Each interval's batches wait in a bounded queue and are sent in order: a batch the
//! receiver acknowledges (2xx) is never sent again; one it refuses (4xx, which retrying
//! cannot mend) is dropped, logged; one that fails (5xx, no answer) is sent again after a
//! backoff that doubles up to 30 s. When the queue is full the oldest interval is dropped
//! (counted): the newer carries the counters' later values, which is what `rate()` needs.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;

use crate::Shared;

/// `[remote_write]` in the TOML.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteWriteConfig {
    /// The receiver, `http://prometheus:9090/api/v1/write`.
    pub url: String,
    /// How often the series are sent.
    #[serde(default = "default_interval", with = "crate::config::duration")]
    pub interval: Duration,
    /// Longest a send may take.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    pub timeout: Duration,
    /// Most batches waiting to be sent; past it the oldest is dropped.
    #[serde(default = "default_queue")]
    pub max_queued: usize,
}

fn default_interval() -> Duration {
    Duration::from_secs(15)
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_queue() -> usize {
    100
}

/// What the sender did, for `/metrics`.
#[derive(Debug, Default)]
pub struct RemoteWriteStats {
    /// Batches the receiver acknowledged.
    pub sent: AtomicU64,
    /// Sends that failed (retried).
    pub failed: AtomicU64,
    /// Batches dropped: refused by the receiver, or the oldest of a full queue.
    pub dropped: AtomicU64,
    /// Batches waiting.
    pub queued: AtomicU64,
    /// Intervals not sampled: sampling the series took longer than an interval.
    pub missed: AtomicU64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    timeseries: Vec<TimeSeries>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<Sample>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Label {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Sample {
    #[prost(double, tag = "1")]
    value: f64,
    #[prost(int64, tag = "2")]
    timestamp: i64,
}

/// Each tenant's series now, as a compressed `WriteRequest` per tenant (none for a tenant
/// without series).
fn batch(state: &Shared, now_ms: i64) -> Vec<(String, Vec<u8>)> {
    let mut batches = Vec::new();
    for (tenant, recorder) in state.rules.recorders() {
        let mut timeseries = Vec::new();
        for s in recorder.series() {
            let mut labels: Vec<Label> = [("__name__", s.rule.as_str()), ("tenant", &tenant)]
                .into_iter()
                .chain(s.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .map(|(name, value)| Label {
                    name: name.to_owned(),
                    value: value.to_owned(),
                })
                .collect();
            // Remote write wants the labels sorted by name.
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            timeseries.push(TimeSeries {
                labels,
                samples: vec![Sample {
                    value: s.value as f64,
                    timestamp: now_ms,
                }],
            });
        }
        if timeseries.is_empty() {
            continue;
        }
        let encoded = prost::Message::encode_to_vec(&WriteRequest { timeseries });
        if let Ok(body) = snap::raw::Encoder::new().compress_vec(&encoded) {
            batches.push((tenant, body));
        }
    }
    batches
}

/// How a send ended.
enum Sent {
    Acknowledged,
    Refused(String),
    Failed(String),
}

async fn send(client: &reqwest::Client, url: &str, tenant: &str, body: &[u8]) -> Sent {
    let answer = client
        .post(url)
        .header("X-Scope-OrgID", tenant)
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(body.to_vec())
        .send()
        .await;
    match answer {
        Ok(r) if r.status().is_success() => Sent::Acknowledged,
        Ok(mut r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
            // The receiver's reason, its first 4 KiB: an answer of any size is not held.
            let status = r.status();
            let mut why = Vec::new();
            while why.len() < 4096
                && let Ok(Some(chunk)) = r.chunk().await
            {
                why.extend_from_slice(&chunk[..chunk.len().min(4096 - why.len())]);
            }
            Sent::Refused(format!("{status}: {}", String::from_utf8_lossy(&why)))
        }
        Ok(r) => Sent::Failed(r.status().to_string()),
        Err(e) => Sent::Failed(e.to_string()),
    }
}

/// Sends the series as `config` says, until the server stops.
pub async fn run(state: Shared, config: RemoteWriteConfig) {
    // Redirects are not followed: each would carry every tenant's batch and its tenant
    // header to wherever the receiver pointed (a 3xx is a failure, retried).
    let client = match reqwest::Client::builder()
        .timeout(config.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "remote write off: no HTTP client");
            return;
        }
    };
    tracing::info!(url = %frostdb_core::redacted_url(&config.url), interval = ?config.interval, "remote write of the recording rules");
    // A queue for each tenant, its intervals' batches oldest first, with a backoff of its
    // own: a receiver refusing one tenant for now (429, 5xx) holds back that tenant's
    // batches, not everyone's. Sampling and sending run side by side: a send that takes
    // its whole timeout (a silent receiver) delays neither the next interval's sample nor
    // another tenant's sends.
    let queues = Queues::default();
    tokio::join!(
        sample(&state, &config, &queues),
        deliver(&state, &client, &config, &queues)
    );
}

/// The tenants' queues, shared by the sampler and the senders, and the senders' wake-up.
#[derive(Default)]
struct Queues {
    tenants: parking_lot::Mutex<BTreeMap<String, TenantQueue>>,
    wake: tokio::sync::Notify,
}

/// Every `interval`, each tenant's series into its queue (an interval the sampler could
/// not keep up with is counted as missed, never silently skipped).
async fn sample(state: &Shared, config: &RemoteWriteConfig, queues: &Queues) {
    let stats = &state.rules.remote_write;
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last: Option<tokio::time::Instant> = None;
    loop {
        let at = tick.tick().await;
        if let Some(last) = last {
            let intervals = (at - last).as_nanos() / config.interval.as_nanos().max(1);
            let missed = intervals.saturating_sub(1) as u64;
            if missed > 0 {
                stats.missed.fetch_add(missed, Ordering::Relaxed);
                tracing::warn!(missed, interval = ?config.interval, "remote write missed intervals: sampling the series took longer than an interval");
            }
        }
        last = Some(at);
        // Copied, encoded and compressed off the async threads.
        let batches = {
            let (state, now) = (state.clone(), crate::time::now_ms());
            match tokio::task::spawn_blocking(move || batch(&state, now)).await {
                Ok(batches) => batches,
                Err(e) => {
                    // Counted and said: a receiver sees a gap, and this is why.
                    stats.missed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %e, "remote write: sampling the series failed; the interval is missed");
                    Vec::new()
                }
            }
        };
        {
            let mut tenants = queues.tenants.lock();
            for (tenant, body) in batches {
                tenants.entry(tenant).or_default().batches.push_back(body);
            }
            let dropped = trim(
                &mut tenants,
                config.max_queued,
                MAX_QUEUED_BYTES,
                MAX_ALL_QUEUED_BYTES,
            );
            if dropped > 0 {
                stats.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
                tracing::warn!(
                    dropped,
                    max_queued = config.max_queued,
                    max_bytes = MAX_QUEUED_BYTES,
                    max_all_bytes = MAX_ALL_QUEUED_BYTES,
                    "remote write queues full: their oldest batches dropped"
                );
            }
            stats.queued.store(queued(&tenants), Ordering::Relaxed);
        }
        queues.wake.notify_one();
    }
}

/// Tenants whose batches are being sent at once, at most: each waits on the receiver (up
/// to `timeout` a batch), so one slow tenant holds one of these, not the others.
const MAX_SENDING: usize = 8;

/// Sends each tenant's queued batches when its backoff allows, up to [`MAX_SENDING`]
/// tenants at once, those waiting longest first.
async fn deliver(
    state: &Shared,
    client: &reqwest::Client,
    config: &RemoteWriteConfig,
    queues: &Queues,
) {
    use futures::StreamExt;
    let mut sending = futures::stream::FuturesUnordered::new();
    loop {
        let now = tokio::time::Instant::now();
        let next = {
            let mut tenants = queues.tenants.lock();
            tenants.retain(|_, q| !q.batches.is_empty() || q.backoff != FIRST_BACKOFF || q.sending);
            let mut due: Vec<(tokio::time::Instant, &String)> = Vec::new();
            let mut next = None;
            for (tenant, queue) in tenants.iter() {
                if queue.sending || queue.batches.is_empty() {
                    continue;
                }
                if queue.next_send <= now {
                    due.push((queue.next_send, tenant));
                } else {
                    next = Some(next.map_or(queue.next_send, |n: tokio::time::Instant| {
                        n.min(queue.next_send)
                    }));
                }
            }
            due.sort();
            let free = MAX_SENDING.saturating_sub(sending.len());
            if due.len() > free {
                // Due already: tried again as soon as a sender is free.
                next = Some(now);
            }
            let starting: Vec<String> =
                due.into_iter().take(free).map(|(_, t)| t.clone()).collect();
            for tenant in starting {
                if let Some(queue) = tenants.get_mut(&tenant) {
                    queue.sending = true;
                }
                sending.push(drain(state, client, config, queues, tenant));
            }
            next
        };
        tokio::select! {
            () = queues.wake.notified() => {}
            Some(()) = sending.next(), if !sending.is_empty() => {}
            () = tokio::time::sleep_until(next.unwrap_or(now)), if next.is_some() && sending.len() < MAX_SENDING => {}
        }
    }
}

/// Sends `tenant`'s queued batches in order until its queue is empty or a send fails
/// (then its backoff starts).
async fn drain(
    state: &Shared,
    client: &reqwest::Client,
    config: &RemoteWriteConfig,
    queues: &Queues,
    tenant: String,
) {
    let stats = &state.rules.remote_write;
    loop {
        // Taken out while it is sent: the sampler's trimming never drops a batch in flight.
        let body = {
            let mut tenants = queues.tenants.lock();
            let Some(queue) = tenants.get_mut(&tenant) else {
                return;
            };
            let Some(body) = queue.batches.pop_front() else {
                queue.sending = false;
                return;
            };
            body
        };
        let sent = send(client, &config.url, &tenant, &body).await;
        let mut tenants = queues.tenants.lock();
        let queue = tenants.entry(tenant.clone()).or_default();
        match sent {
            Sent::Acknowledged => {
                stats.sent.fetch_add(1, Ordering::Relaxed);
                queue.backoff = FIRST_BACKOFF;
            }
            Sent::Refused(why) => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(url = %frostdb_core::redacted_url(&config.url), %tenant, %why, "remote write refused a tenant's batch: dropped");
            }
            Sent::Failed(why) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(url = %frostdb_core::redacted_url(&config.url), %tenant, %why, retry_in = ?queue.backoff, "remote write failed");
                queue.batches.push_front(body);
                queue.next_send = tokio::time::Instant::now() + queue.backoff;
                queue.backoff = (queue.backoff * 2).min(Duration::from_secs(30));
                queue.sending = false;
                stats.queued.store(queued(&tenants), Ordering::Relaxed);
                return;
            }
        }
        stats.queued.store(queued(&tenants), Ordering::Relaxed);
    }
}

/// Batches waiting in all the queues (those being sent not counted).
fn queued(tenants: &BTreeMap<String, TenantQueue>) -> u64 {
    tenants.values().map(|q| q.batches.len()).sum::<usize>() as u64
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Most bytes of batches a tenant's queue holds (besides its newest batch): a receiver
/// down for a while holds `max_queued` intervals of every tenant, and one interval of a
/// tenant at its series limit is megabytes.
const MAX_QUEUED_BYTES: usize = 64 << 20;

/// Most bytes of batches all tenants' queues hold together: past it, the oldest batches of
/// the largest queues are dropped (each tenant bounded alone, a thousand tenants held 64
/// GB for a receiver that was down).
const MAX_ALL_QUEUED_BYTES: usize = 256 << 20;

/// Drops the oldest batches of `queues` until each holds at most `max_queued` batches and
/// `max_bytes` (its newest batch kept), and all of them `max_all_bytes` (the largest queue
/// giving up its oldest first); returns how many were dropped.
fn trim(
    queues: &mut BTreeMap<String, TenantQueue>,
    max_queued: usize,
    max_bytes: usize,
    max_all_bytes: usize,
) -> usize {
    let mut dropped = 0;
    let mut all = 0;
    for queue in queues.values_mut() {
        let mut bytes: usize = queue.batches.iter().map(Vec::len).sum();
        while queue.batches.len() > max_queued.max(1)
            || (queue.batches.len() > 1 && bytes > max_bytes)
        {
            bytes -= queue.batches.pop_front().map_or(0, |b| b.len());
            dropped += 1;
        }
        all += bytes;
    }
    while all > max_all_bytes {
        let Some(largest) = queues
            .values_mut()
            .max_by_key(|q| q.batches.iter().map(Vec::len).sum::<usize>())
        else {
            break;
        };
        let Some(oldest) = largest.batches.pop_front() else {
            break;
        };
        all -= oldest.len();
        dropped += 1;
    }
    dropped
}

/// A tenant's batches waiting to be sent, and when the next may be tried.
struct TenantQueue {
    batches: VecDeque<Vec<u8>>,
    backoff: Duration,
    next_send: tokio::time::Instant,
    /// A sender is draining it.
    sending: bool,
}

impl Default for TenantQueue {
    fn default() -> Self {
        Self {
            batches: VecDeque::new(),
            backoff: FIRST_BACKOFF,
            next_send: tokio::time::Instant::now(),
            sending: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each queue keeps at most its intervals and bytes (its newest batch whatever its
    /// size), and all of them together at most their bound, the largest queue giving up
    /// its oldest batches first.
    #[test]
    fn queued_batches_are_bounded_each_and_all_together() {
        let queue = |sizes: &[usize]| TenantQueue {
            batches: sizes.iter().map(|&n| vec![0u8; n]).collect(),
            ..TenantQueue::default()
        };
        let mut queues = BTreeMap::from([
            ("a".to_owned(), queue(&[10, 10, 10, 10])),
            ("b".to_owned(), queue(&[100])),
            ("c".to_owned(), queue(&[30, 30, 30])),
        ]);
        // Three intervals a tenant, 1,000 bytes a tenant: a loses one.
        assert_eq!(trim(&mut queues, 3, 1_000, 1_000), 1);
        assert_eq!(queues["a"].batches.len(), 3);
        // 50 bytes a tenant: a keeps 30, c its newest 30, b its one batch of 100.
        assert_eq!(trim(&mut queues, 3, 50, 1_000), 2);
        let held = |q: &BTreeMap<String, TenantQueue>| -> Vec<usize> {
            q.values()
                .map(|q| q.batches.iter().map(Vec::len).sum())
                .collect()
        };
        assert_eq!(held(&queues), [30, 100, 30]);
        // 120 bytes in all: the largest, b, gives up its batch.
        assert_eq!(trim(&mut queues, 3, 1_000, 120), 1);
        assert_eq!(held(&queues), [30, 0, 30]);
    }
}
