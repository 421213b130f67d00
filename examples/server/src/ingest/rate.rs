//! Each tenant's ingest rate (`limits.ingest_rate_per_tenant`, or the tenant's own
//! `[tenants.<id>] ingest_rate`): the bytes its clients push (request bodies as sent) drain
//! a bucket of `limits.ingest_burst_per_tenant` (or `ingest_burst`) bytes that refills at
//! the rate. A push the bucket cannot take now is refused before it is decoded,
//! 429 with `Retry-After` saying when it fits; one larger than the whole bucket, 413. The
//! server's own ingest (scrapes, the eBPF sampler) is not held to it.
//!
//! Without it, one tenant within its series limit could push as fast as the ingest lane
//! lets it (all its slots but one), and fill the disk every tenant shares.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{ApiError, ApiResult};

/// The buckets of every tenant that pushed lately, and each tenant's limit.
#[derive(Debug)]
pub struct IngestRates {
    /// Every tenant's (`limits.ingest_rate_per_tenant`), unless it has its own.
    default: Option<Limit>,
    /// Tenants' own (`[tenants.<id>] ingest_rate`).
    tenants: HashMap<String, Limit>,
    buckets: Mutex<Buckets>,
    /// Per tenant refused, the pushes and their bytes, for `/metrics` (at most the tenants
    /// that exist: a push is held to the rate once its tenant is taken).
    refused: Mutex<std::collections::BTreeMap<String, Refusals>>,
}

/// What a tenant's ingest rate refused since the server started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Pushes refused.
    pub pushes: u64,
    /// Their bytes, as sent.
    pub bytes: u64,
}

/// A rate and the bucket it refills.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Limit {
    /// Bytes a second.
    rate: f64,
    /// Bytes a bucket holds full.
    burst: f64,
    /// Whether it is the tenant's own, for the refusal to name the setting to change.
    own: bool,
}

impl Limit {
    fn new(rate: u64, burst: u64, own: bool) -> Self {
        Self {
            rate: rate.max(1) as f64,
            burst: burst.max(1) as f64,
            own,
        }
    }
}

#[derive(Debug)]
struct Buckets {
    by_tenant: HashMap<String, Bucket>,
    /// Past this many buckets, those refilled whole (a tenant's that stopped pushing) are
    /// forgotten: a full bucket is what a tenant without one gets.
    prune_at: usize,
}

impl Buckets {
    fn new() -> Mutex<Self> {
        Mutex::new(Self {
            by_tenant: HashMap::new(),
            prune_at: 64,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    bytes: f64,
    at: Instant,
}

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refused {
    /// It fits once the bucket has refilled this long.
    Wait(Duration),
    /// It is larger than a full bucket: it never fits.
    Never,
}

impl IngestRates {
    /// Every tenant at `rate` bytes a second, in bursts of `burst` bytes.
    pub fn new(rate: u64, burst: u64) -> Self {
        Self {
            default: Some(Limit::new(rate, burst, false)),
            tenants: HashMap::new(),
            buckets: Buckets::new(),
            refused: Default::default(),
        }
    }

    /// The rates `config` sets, if it sets any: `limits.ingest_rate_per_tenant`, and the
    /// tenants' own `ingest_rate`. A burst not given is the larger of a second of its rate
    /// and `max_body_bytes` (so that any body the server takes can pass).
    pub fn of(config: &crate::config::Config) -> Option<Self> {
        let limits = &config.limits;
        let burst = |rate: u64, burst: Option<u64>| {
            burst.unwrap_or_else(|| rate.max(limits.max_body_bytes as u64))
        };
        let default = limits
            .ingest_rate_per_tenant
            .map(|rate| Limit::new(rate, burst(rate, limits.ingest_burst_per_tenant), false));
        let tenants: HashMap<String, Limit> = config
            .tenants
            .iter()
            .filter_map(|(id, t)| {
                let rate = t.ingest_rate?;
                Some((
                    id.clone(),
                    Limit::new(rate, burst(rate, t.ingest_burst), true),
                ))
            })
            .collect();
        (default.is_some() || !tenants.is_empty()).then(|| Self {
            default,
            tenants,
            buckets: Buckets::new(),
            refused: Default::default(),
        })
    }

    fn limit(&self, tenant: &str) -> Option<Limit> {
        self.tenants.get(tenant).copied().or(self.default)
    }

    /// Takes `bytes` from `tenant`'s bucket at `now`, or says when they fit; a tenant
    /// without a rate takes any.
    pub fn take(&self, tenant: &str, bytes: usize, now: Instant) -> Result<(), Refused> {
        match self.limit(tenant) {
            Some(limit) => self.take_under(tenant, limit, bytes, now),
            None => Ok(()),
        }
    }

    /// [`IngestRates::take`] from a bucket refilled under `limit`, the tenant's.
    fn take_under(
        &self,
        tenant: &str,
        limit: Limit,
        bytes: usize,
        now: Instant,
    ) -> Result<(), Refused> {
        let bytes = bytes as f64;
        if bytes > limit.burst {
            return Err(Refused::Never);
        }
        let mut buckets = self.buckets.lock();
        if buckets.by_tenant.len() >= buckets.prune_at {
            buckets.by_tenant.retain(|tenant, b| {
                self.limit(tenant)
                    .is_some_and(|l| refilled(*b, l, now) < l.burst)
            });
            buckets.prune_at = (buckets.by_tenant.len() * 2).max(64);
        }
        // The tenant's name is copied only for its first push, not for every one.
        if !buckets.by_tenant.contains_key(tenant) {
            let full = Bucket {
                bytes: limit.burst,
                at: now,
            };
            buckets.by_tenant.insert(tenant.to_owned(), full);
        }
        let bucket = buckets.by_tenant.get_mut(tenant).expect("inserted above");
        let held = refilled(*bucket, limit, now);
        if held < bytes {
            return Err(Refused::Wait(Duration::from_secs_f64(
                (bytes - held) / limit.rate,
            )));
        }
        *bucket = Bucket {
            bytes: held - bytes,
            at: now.max(bucket.at),
        };
        Ok(())
    }

    /// [`IngestRates::take`] as the server answers it: 429 with `Retry-After` (whole
    /// seconds, at least one), or 413, each naming the limit.
    pub fn admit(&self, tenant: &str, bytes: usize) -> ApiResult<()> {
        let Some(limit) = self.limit(tenant) else {
            return Ok(());
        };
        let refusal = match self.take_under(tenant, limit, bytes, Instant::now()) {
            Ok(()) => return Ok(()),
            Err(refusal) => refusal,
        };
        // A flood is refused push after push: the name is copied only for its first.
        let mut refused = self.refused.lock();
        if !refused.contains_key(tenant) {
            refused.insert(tenant.to_owned(), Refusals::default());
        }
        let counts = refused.get_mut(tenant).expect("inserted above");
        counts.pushes += 1;
        counts.bytes += bytes as u64;
        drop(refused);
        // The settings that hold it, named only for a refusal.
        let (rate, burst) = match limit.own {
            true => (
                format!("tenants.{tenant}.ingest_rate"),
                format!("tenants.{tenant}.ingest_burst"),
            ),
            false => (
                "limits.ingest_rate_per_tenant".to_owned(),
                "limits.ingest_burst_per_tenant".to_owned(),
            ),
        };
        match refusal {
            Refused::Never => Err(ApiError::too_large(format!(
                "a push of {bytes} bytes is more than tenant {tenant:?} may send at once \
                 ({burst}, {} bytes): it can never be taken; send less in each request",
                limit.burst as u64
            ))),
            Refused::Wait(wait) => {
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                Err(ApiError {
                    retry_after: Some(secs),
                    ..ApiError::limited(format!(
                        "tenant {tenant:?} pushes faster than its ingest rate ({rate}, {} \
                         bytes a second, in bursts of up to {burst}, {} bytes): this push of \
                         {bytes} bytes fits in {secs} s",
                        limit.rate as u64, limit.burst as u64
                    ))
                })
            }
        }
    }

    /// Per tenant, what its rate refused since the server started (tenants it refused
    /// nothing are left out), by tenant id.
    pub fn refused(&self) -> Vec<(String, Refusals)> {
        self.refused
            .lock()
            .iter()
            .map(|(id, r)| (id.clone(), *r))
            .collect()
    }

    /// Buckets held (for tests of forgetting).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buckets.lock().by_tenant.len()
    }
}

/// What `bucket` holds at `now`, refilled at `limit`'s rate up to its burst.
fn refilled(bucket: Bucket, limit: Limit, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.bytes + elapsed * limit.rate).min(limit.burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_drains_by_the_bytes_pushed_and_refills_at_the_rate() {
        let rates = IngestRates::new(1_000, 4_000);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // A full bucket takes a burst at once.
        assert_eq!(rates.take("a", 3_000, at(0)), Ok(()));
        assert_eq!(rates.take("a", 1_000, at(0)), Ok(()));
        // Empty: the next 500 bytes fit in half a second, and nothing is taken meanwhile.
        assert_eq!(
            rates.take("a", 500, at(0)),
            Err(Refused::Wait(Duration::from_millis(500)))
        );
        assert_eq!(
            rates.take("a", 500, at(250)),
            Err(Refused::Wait(Duration::from_millis(250)))
        );
        assert_eq!(rates.take("a", 500, at(500)), Ok(()));
        // Another tenant's bucket is its own.
        assert_eq!(rates.take("b", 4_000, at(500)), Ok(()));
        // Refilled, never past the burst.
        assert_eq!(rates.take("a", 4_000, at(60_000)), Ok(()));
        assert_eq!(
            rates.take("a", 1_000, at(60_000)),
            Err(Refused::Wait(Duration::from_secs(1)))
        );
        // More than a full bucket never fits.
        assert_eq!(rates.take("c", 4_001, at(60_000)), Err(Refused::Never));
    }

    #[test]
    fn refusals_name_the_limit_and_when_to_retry() {
        let rates = IngestRates::new(1_000, 4_000);
        rates.admit("a", 4_000).unwrap();
        let later = rates.admit("a", 2_500).unwrap_err();
        assert_eq!(later.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(later.retry_after, Some(3), "2.5 s, rounded up");
        assert!(
            later
                .message
                .contains("limits.ingest_rate_per_tenant, 1000 bytes a second"),
            "{}",
            later.message
        );
        assert_eq!(
            rates.refused(),
            vec![(
                "a".to_owned(),
                Refusals {
                    pushes: 1,
                    bytes: 2_500
                }
            )]
        );
        let never = rates.admit("a", 4_001).unwrap_err();
        assert_eq!(never.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(never.retry_after, None);
        assert!(
            never
                .message
                .contains("limits.ingest_burst_per_tenant, 4000 bytes"),
            "{}",
            never.message
        );
    }

    #[test]
    fn a_tenants_own_rate_is_its_own_and_refusals_name_it() {
        let config: crate::config::Config = toml::from_str(
            "[limits]\ningest_rate_per_tenant = 1000\ningest_burst_per_tenant = 4000\n\
             [tenants.big]\ningest_rate = 100000\ningest_burst = 400000\n\
             [tenants.small]\ningest_rate = 10\n",
        )
        .unwrap();
        let rates = IngestRates::of(&config).unwrap();
        let now = Instant::now();
        assert_eq!(rates.take("big", 400_000, now), Ok(()));
        assert_eq!(rates.take("anyone", 4_001, now), Err(Refused::Never));
        // A burst not given: the larger of a second of the rate and max_body_bytes.
        assert_eq!(rates.take("small", 16 << 20, now), Ok(()));
        let refused = rates.admit("small", 100).unwrap_err();
        assert_eq!(refused.retry_after, Some(10));
        assert!(
            refused
                .message
                .contains("(tenants.small.ingest_rate, 10 bytes a second"),
            "{}",
            refused.message
        );
        let refused = rates.admit("anyone", 4_001).unwrap_err();
        assert!(
            refused
                .message
                .contains("(limits.ingest_burst_per_tenant, 4000 bytes)"),
            "{}",
            refused.message
        );
        // Without a server-wide rate, only the tenants given one are held.
        let config: crate::config::Config =
            toml::from_str("[tenants.small]\ningest_rate = 10\n").unwrap();
        let rates = IngestRates::of(&config).unwrap();
        assert_eq!(rates.take("anyone", 1 << 30, now), Ok(()));
        assert_eq!(rates.take("small", 1 << 30, now), Err(Refused::Never));
        assert!(IngestRates::of(&crate::config::Config::default()).is_none());
    }

    #[test]
    fn tenants_that_stopped_pushing_are_forgotten() {
        let rates = IngestRates::new(1_000, 4_000);
        let t0 = Instant::now();
        for i in 0..1_000 {
            rates.take(&format!("t{i}"), 10, t0).unwrap();
        }
        // Each of those is still draining, and so remembered (a tenant forgotten with its
        // bucket drained would get a full one again).
        assert!(rates.held() >= 1_000 / 2, "{}", rates.held());
        // A second later, all have refilled: the next names find them gone.
        let later = t0 + Duration::from_secs(1);
        for i in 0..64 {
            rates.take(&format!("u{i}"), 10, later).unwrap();
        }
        assert!(rates.held() <= 128, "{}", rates.held());
    }
}
