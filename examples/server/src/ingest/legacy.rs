//! Pyroscope's legacy `POST /ingest` (and `/pyroscope/ingest`): the query string names the
//! application and its labels (`name=app.cpu{env=prod}`), the time (`from`, `until`), the
//! body's `format`, `sampleRate`, `spyName`, `units` and `aggregationType`. Bodies: pprof
//! (raw or gzip), the multipart form with `profile` / `prev_profile` / `sample_type_config`,
//! folded stacks (the default) and lines. Trie, tree, JFR and speedscope bodies get 415.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::HeaderMap;
use frostdb_pprof::ValidProfile;
use frostdb_pprof::convert::folded::{self, Units};

use super::{Incoming, body_bytes, content_type, store};
use crate::edge::RequestMemory;
use crate::error::{ApiError, ApiResult};
use crate::{Shared, TenantId};

/// `POST /ingest`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: RequestMemory,
    Query(params): Query<HashMap<String, String>>,
    request: Request,
) -> ApiResult<Json<serde_json::Value>> {
    let meta = Meta::parse(&params, crate::time::now_ms())?;
    let headers = request.headers().clone();
    let kind = content_type(&headers);
    let format = params.get("format").map(|f| f.to_ascii_lowercase());
    let limits = state.tenants.pprof_limits();
    let mut incoming = match (format.as_deref(), kind.as_str()) {
        (Some(f @ ("trie" | "tree" | "jfr" | "speedscope")), _) => {
            return Err(ApiError::unsupported(format!(
                "format={f} is not supported; send pprof, folded or lines"
            )));
        }
        (None, k @ ("binary/octet-stream+trie" | "binary/octet-stream+tree")) => {
            return Err(ApiError::unsupported(format!(
                "Content-Type {k} is not supported; send pprof, folded or lines"
            )));
        }
        (None | Some("pprof"), "multipart/form-data") => {
            let form = Multipart::from_request(request, &state)
                .await
                .map_err(|e| ApiError::bad_request(format!("multipart form: {e}")))?;
            from_form(&state, &meta, form, &limits).await?
        }
        (Some("pprof"), _) => {
            let body = body(&state, &headers, request, &memory).await?;
            let profile = frostdb_pprof::decode(&body, &limits)
                .map_err(|e| ApiError::from(e).context("pprof body"))?;
            meta.pprof(profile, None)
        }
        (None | Some("folded") | Some("groups") | Some("lines"), _) => {
            let body = body(&state, &headers, request, &memory).await?;
            let text = std::str::from_utf8(&body)
                .map_err(|e| ApiError::bad_request(format!("the folded body is not UTF-8: {e}")))?;
            let lines = format.as_deref() == Some("lines");
            let units = meta.folded_units()?;
            let profile = folded::to_profile(text, lines, &units.1, limits.max_samples)
                .map_err(|e| ApiError::from(e).context("folded body"))?;
            let profile = frostdb_pprof::validate(profile, &limits)
                .map_err(|e| ApiError::from(e).context("folded body"))?;
            meta.incoming(units.0, profile, None)
        }
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "unknown format {other:?} (pprof, folded, lines)"
            )));
        }
    };
    // The profile's own time, unless it has none or it decodes to 1970 (old clients sent
    // microseconds): then the request's `from`, as Pyroscope does.
    const YEAR_MS: i64 = 365 * 24 * 3_600_000;
    let own_ms = incoming.profile.time_nanos() / 1_000_000;
    incoming.timestamp_ms = (own_ms < YEAR_MS).then_some(meta.from_ms);
    let mut series: Vec<(String, String)> = incoming
        .labels
        .iter()
        .filter(|(k, v)| !v.is_empty() && !k.starts_with("__"))
        .map(|(k, v)| (frostdb_pprof::sanitize_label(k), v.clone()))
        .collect();
    series.sort();
    let summary = store(&state, &tenant, incoming).await?;
    // What was stored, so that a client (or a person with curl) sees it landed, and where.
    let labels: serde_json::Map<String, serde_json::Value> =
        series.into_iter().map(|(k, v)| (k, v.into())).collect();
    Ok(Json(serde_json::json!({
        "profiles": usize::from(!summary.duplicate),
        "duplicates": usize::from(summary.duplicate),
        "samples": summary.rows,
        "profile_types": summary.profile_types,
        "series_labels": labels,
        "timestamp_ms": summary.timestamp_ms,
    })))
}

async fn body(
    state: &Shared,
    headers: &HeaderMap,
    request: Request,
    memory: &RequestMemory,
) -> ApiResult<Bytes> {
    let bytes = Bytes::from_request(request, state)
        .await
        .map_err(|e| ApiError::new(e.status(), format!("request body: {}", e.body_text())))?;
    body_bytes(state, headers, bytes, memory)
}

async fn from_form(
    state: &Shared,
    meta: &Meta,
    mut form: Multipart,
    limits: &frostdb_pprof::Limits,
) -> ApiResult<Incoming> {
    let mut profile = None;
    let mut previous = None;
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| ApiError::bad_request(format!("multipart form: {e}")))?
    {
        let name = field.name().unwrap_or("").to_owned();
        let bytes = field
            .bytes()
            .await
            .map_err(|e| ApiError::bad_request(format!("multipart part {name:?}: {e}")))?;
        match name.as_str() {
            "profile" => {
                profile = Some(
                    frostdb_pprof::decode(&bytes, limits)
                        .map_err(|e| ApiError::from(e).context("multipart part \"profile\""))?,
                )
            }
            "prev_profile" => {
                previous =
                    Some(frostdb_pprof::decode(&bytes, limits).map_err(|e| {
                        ApiError::from(e).context("multipart part \"prev_profile\"")
                    })?)
            }
            "sample_type_config" => {
                // Checked, then not needed: sample types keep their pprof names and units.
                serde_json::from_slice::<HashMap<String, serde_json::Value>>(&bytes).map_err(
                    |e| {
                        ApiError::bad_request(format!(
                            "sample_type_config is not a JSON object: {e}"
                        ))
                    },
                )?;
            }
            other => {
                tracing::debug!(part = other, "ignoring an unknown multipart part");
            }
        }
    }
    let _ = state;
    let profile = profile
        .ok_or_else(|| ApiError::bad_request("the multipart form has no \"profile\" part"))?;
    Ok(meta.pprof(profile, previous))
}

/// The query string, checked.
#[derive(Debug)]
struct Meta {
    /// The suffix after the service name (`cpu`, `alloc_objects`, ...), when present.
    kind: Option<String>,
    labels: Vec<(String, String)>,
    from_ms: i64,
    sample_rate: i64,
    units: String,
}

/// The highest `sampleRate`: a sample stands for `1e9 / sampleRate` ns, at least one.
const MAX_SAMPLE_RATE: i64 = 1_000_000_000;

/// The profile-name suffixes Pyroscope's clients append to the application name.
const KINDS: [&str; 13] = [
    "cpu",
    "itimer",
    "wall",
    "alloc_objects",
    "alloc_space",
    "inuse_objects",
    "inuse_space",
    "goroutines",
    "mutex_count",
    "mutex_duration",
    "block_count",
    "block_duration",
    "exceptions",
];

impl Meta {
    fn parse(params: &HashMap<String, String>, now_ms: i64) -> ApiResult<Self> {
        let name = params
            .get("name")
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| ApiError::bad_request("the query parameter \"name\" is required"))?;
        let (app, mut labels) = parse_name(name).map_err(ApiError::bad_request)?;
        let (service, kind) = match app.rsplit_once('.') {
            Some((s, k)) if KINDS.contains(&k) => (s.to_owned(), Some(k.to_owned())),
            _ => (app.clone(), None),
        };
        labels.push(("service_name".into(), service.clone()));
        if let Some(spy) = params.get("spyName").filter(|s| !s.is_empty()) {
            labels.push(("pyroscope_spy".into(), spy.clone()));
        }
        let from_ms = match params.get("from").filter(|s| !s.is_empty()) {
            Some(f) => parse_time(f).map_err(|e| ApiError::bad_request(format!("from: {e}")))?,
            None => now_ms,
        };
        if let Some(u) = params.get("until").filter(|s| !s.is_empty()) {
            parse_time(u).map_err(|e| ApiError::bad_request(format!("until: {e}")))?;
        }
        let sample_rate = match params.get("sampleRate").filter(|s| !s.is_empty()) {
            Some(r) => r
                .parse::<i64>()
                .ok()
                .filter(|r| (1..=MAX_SAMPLE_RATE).contains(r))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "sampleRate {r:?} is not a whole number of samples per second from 1 to {MAX_SAMPLE_RATE} (a sample stands for 1 s / sampleRate, at least a nanosecond)"
                    ))
                })?,
            None => 100,
        };
        match params.get("aggregationType").map(String::as_str) {
            None | Some("") | Some("sum") | Some("average") => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "aggregationType {other:?} (sum or average)"
                )));
            }
        }
        Ok(Self {
            kind,
            labels,
            from_ms,
            sample_rate,
            units: params
                .get("units")
                .filter(|u| !u.is_empty())
                .cloned()
                .unwrap_or_else(|| "samples".into()),
        })
    }

    /// The profile name and value units of a folded body.
    fn folded_units(&self) -> ApiResult<(String, Units)> {
        let t = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        let kind = self.kind.as_deref().unwrap_or("");
        let inuse = kind.starts_with("inuse");
        let (name, sample, period, period_value, scale) = match self.units.as_str() {
            "samples" => {
                let ns = 1_000_000_000 / self.sample_rate;
                (
                    "process_cpu",
                    t("cpu", "nanoseconds"),
                    t("cpu", "nanoseconds"),
                    ns,
                    ns,
                )
            }
            "objects" if inuse => (
                "memory",
                t("inuse_objects", "count"),
                t("space", "bytes"),
                1,
                1,
            ),
            "objects" => (
                "memory",
                t("alloc_objects", "count"),
                t("space", "bytes"),
                1,
                1,
            ),
            "bytes" if inuse => (
                "memory",
                t("inuse_space", "bytes"),
                t("space", "bytes"),
                1,
                1,
            ),
            "bytes" => (
                "memory",
                t("alloc_space", "bytes"),
                t("space", "bytes"),
                1,
                1,
            ),
            "goroutines" => (
                "goroutines",
                t("goroutine", "count"),
                t("goroutine", "count"),
                1,
                1,
            ),
            "lock_samples" => (
                "mutex",
                t("contentions", "count"),
                t("contentions", "count"),
                1,
                1,
            ),
            "lock_nanoseconds" => (
                "mutex",
                t("delay", "nanoseconds"),
                t("contentions", "count"),
                1,
                1,
            ),
            "exceptions" => (
                "exceptions",
                t("exceptions", "count"),
                t("exceptions", "count"),
                1,
                1,
            ),
            other => {
                return Err(ApiError::bad_request(format!(
                    "units {other:?} (samples, objects, bytes, goroutines, lock_samples, lock_nanoseconds, exceptions)"
                )));
            }
        };
        Ok((
            name.to_owned(),
            Units {
                sample,
                period,
                period_value,
                scale,
            },
        ))
    }

    /// A pprof body: the profile name from the application's suffix, else from its types.
    fn pprof(&self, profile: ValidProfile, previous: Option<ValidProfile>) -> Incoming {
        let name = match self.kind.as_deref() {
            Some("cpu" | "itimer") => "process_cpu".to_owned(),
            Some(k) if k.starts_with("alloc") || k.starts_with("inuse") => "memory".to_owned(),
            Some(k) if k.starts_with("mutex") => "mutex".to_owned(),
            Some(k) if k.starts_with("block") => "block".to_owned(),
            Some(k) => k.to_owned(),
            None => frostdb_pprof::convert::profile_name(&profile),
        };
        self.incoming(name, profile, previous)
    }

    fn incoming(
        &self,
        name: String,
        profile: ValidProfile,
        previous: Option<ValidProfile>,
    ) -> Incoming {
        Incoming {
            profile,
            previous,
            name,
            labels: self.labels.clone(),
            delta: false,
            timestamp_ms: Some(self.from_ms),
        }
    }
}

/// `app.cpu{env=prod,region=eu}`: the application and its labels.
fn parse_name(name: &str) -> Result<(String, Vec<(String, String)>), String> {
    let name = name.trim();
    let Some(open) = name.find('{') else {
        return Ok((name.to_owned(), Vec::new()));
    };
    let app = name[..open].trim().to_owned();
    if app.is_empty() {
        return Err(format!("name {name:?} has labels but no application name"));
    }
    let inner = name[open + 1..]
        .strip_suffix('}')
        .ok_or_else(|| format!("name {name:?}: labels must end with '}}'"))?;
    let mut labels = Vec::new();
    for pair in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("name {name:?}: label {pair:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        if k.is_empty() {
            return Err(format!("name {name:?}: a label has no name"));
        }
        labels.push((k.to_owned(), v.to_owned()));
    }
    Ok((app, labels))
}

/// A time as `/ingest` takes it: by its number of digits, 8 = `YYYYMMDD`, 13 = ms,
/// 16 = µs, 19 = ns, otherwise seconds. Returns milliseconds.
fn parse_time(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a number"));
    }
    let n: i64 = s.parse().map_err(|_| format!("{s:?} is out of range"))?;
    let ms = match s.len() {
        8 => {
            let date = jiff::civil::Date::strptime("%Y%m%d", s)
                .map_err(|e| format!("{s:?} is not YYYYMMDD: {e}"))?;
            date.to_zoned(jiff::tz::TimeZone::UTC)
                .map_err(|e| format!("{s:?}: {e}"))?
                .timestamp()
                .as_millisecond()
        }
        13 => n,
        16 => n / 1_000,
        19 => n / 1_000_000,
        _ => n
            .checked_mul(1_000)
            .ok_or_else(|| format!("{s:?} is out of range"))?,
    };
    crate::time::checked_ms(ms, &format!("{s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_by_digit_count() {
        assert_eq!(parse_time("1763805600").unwrap(), 1_763_805_600_000);
        assert_eq!(parse_time("1763805600123").unwrap(), 1_763_805_600_123);
        assert_eq!(parse_time("1763805600123456").unwrap(), 1_763_805_600_123);
        assert_eq!(
            parse_time("1763805600123456789").unwrap(),
            1_763_805_600_123
        );
        assert_eq!(parse_time("20251122").unwrap(), 1_763_769_600_000);
        assert!(parse_time("-5").is_err());
        assert!(parse_time("20251399").is_err());
    }

    #[test]
    fn names_carry_the_application_and_labels() {
        let mut p = HashMap::new();
        p.insert(
            "name".to_string(),
            "shop.cpu{env=prod, region=\"eu\"}".to_string(),
        );
        p.insert("spyName".to_string(), "pyspy".to_string());
        let m = Meta::parse(&p, 5).unwrap();
        assert_eq!(m.kind.as_deref(), Some("cpu"));
        assert_eq!(m.from_ms, 5);
        assert!(m.labels.contains(&("region".into(), "eu".into())));
        assert!(m.labels.contains(&("service_name".into(), "shop".into())));
        assert!(m.labels.contains(&("pyroscope_spy".into(), "pyspy".into())));
        for bad in ["{a=b}", "x{a}", "x{a=b", ""] {
            p.insert("name".to_string(), bad.to_string());
            assert!(Meta::parse(&p, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cpu_samples_become_nanoseconds() {
        let mut p = HashMap::new();
        p.insert("name".to_string(), "shop".to_string());
        p.insert("sampleRate".to_string(), "100".to_string());
        let (name, units) = Meta::parse(&p, 0).unwrap().folded_units().unwrap();
        assert_eq!(name, "process_cpu");
        assert_eq!(units.scale, 10_000_000);
        p.insert("units".to_string(), "furlongs".to_string());
        assert!(Meta::parse(&p, 0).unwrap().folded_units().is_err());
        for bad in ["0", "2000000000", "9223372036854775807", "-5"] {
            p.insert("sampleRate".to_string(), bad.to_string());
            assert!(Meta::parse(&p, 0).is_err(), "{bad}");
        }
    }
}
