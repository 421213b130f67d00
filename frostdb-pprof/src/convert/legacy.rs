//! Pyroscope's legacy `/ingest`: the query string names the application and its labels
//! (`name=app.cpu{env=prod}`), the time (`from`, `until`), the body's `format`,
//! `sampleRate`, `spyName`, `units` and `aggregationType`; [`Params`] reads it. A pprof body
//! (with its `prev_profile`, if the multipart form has one) is named by the application's
//! suffix or its sample types ([`Params::pprof`]); folded stacks and lines, and Pyroscope's
//! trie and tree bodies, become a pprof of the units the query string gives
//! ([`Params::folded`], [`Params::trie`]); a speedscope file a pprof per profile in it
//! ([`Params::speedscope`]).

use std::collections::HashMap;

use super::Incoming;
use super::folded::{self, Units};
use crate::{Error, Limits, Result, ValidProfile};

/// The highest `sampleRate`: a sample stands for `1e9 / sampleRate` ns, at least one.
pub const MAX_SAMPLE_RATE: i64 = 1_000_000_000;

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

/// An [`Error::Convert`] of the query string.
fn invalid(at: &str, reason: impl Into<String>) -> Error {
    Error::Convert {
        format: "/ingest query",
        at: at.to_owned(),
        reason: reason.into(),
    }
}

/// The query string of a legacy `/ingest` request, checked.
#[derive(Debug, Clone)]
pub struct Params {
    /// The suffix after the service name (`cpu`, `alloc_objects`, ...), when present.
    pub kind: Option<String>,
    /// The series labels: the name's, `service_name` and `pyroscope_spy`.
    pub labels: Vec<(String, String)>,
    /// `from`, or the time the request arrived.
    pub from_ms: i64,
    /// Samples per second of a folded CPU body.
    pub sample_rate: i64,
    /// The values' units of a folded body (`samples`, `objects`, `bytes`, ...).
    pub units: String,
}

impl Params {
    /// Reads the query string; `now_ms` is the time when it has no `from`.
    pub fn parse(params: &HashMap<String, String>, now_ms: i64) -> Result<Self> {
        let name = params
            .get("name")
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| invalid("name", "the query parameter is required"))?;
        let (app, mut labels) = parse_name(name).map_err(|e| invalid("name", e))?;
        let (service, kind) = match app.rsplit_once('.') {
            Some((s, k)) if KINDS.contains(&k) => (s.to_owned(), Some(k.to_owned())),
            _ => (app.clone(), None),
        };
        labels.push(("service_name".into(), service));
        if let Some(spy) = params.get("spyName").filter(|s| !s.is_empty()) {
            labels.push(("pyroscope_spy".into(), spy.clone()));
        }
        let from_ms = match params.get("from").filter(|s| !s.is_empty()) {
            Some(f) => parse_time(f).map_err(|e| invalid("from", e))?,
            None => now_ms,
        };
        if let Some(u) = params.get("until").filter(|s| !s.is_empty()) {
            parse_time(u).map_err(|e| invalid("until", e))?;
        }
        let sample_rate = match params.get("sampleRate").filter(|s| !s.is_empty()) {
            Some(r) => r
                .parse::<i64>()
                .ok()
                .filter(|r| (1..=MAX_SAMPLE_RATE).contains(r))
                .ok_or_else(|| {
                    invalid(
                        "sampleRate",
                        format!(
                            "{r:?} is not a whole number of samples per second from 1 to {MAX_SAMPLE_RATE} (a sample stands for 1 s / sampleRate, at least a nanosecond)"
                        ),
                    )
                })?,
            None => 100,
        };
        match params.get("aggregationType").map(String::as_str) {
            None | Some("") | Some("sum") | Some("average") => {}
            Some(other) => {
                return Err(invalid(
                    "aggregationType",
                    format!("{other:?} (sum or average)"),
                ));
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
    pub fn folded_units(&self) -> Result<(String, Units)> {
        let inuse = self.kind.as_deref().unwrap_or("").starts_with("inuse");
        // (profile name, sample type and unit, period type and unit)
        let (name, sample, period) = match (self.units.as_str(), inuse) {
            ("samples", _) => (
                "process_cpu",
                ("cpu", "nanoseconds"),
                ("cpu", "nanoseconds"),
            ),
            ("objects", true) => ("memory", ("inuse_objects", "count"), ("space", "bytes")),
            ("objects", false) => ("memory", ("alloc_objects", "count"), ("space", "bytes")),
            ("bytes", true) => ("memory", ("inuse_space", "bytes"), ("space", "bytes")),
            ("bytes", false) => ("memory", ("alloc_space", "bytes"), ("space", "bytes")),
            ("goroutines", _) => ("goroutines", ("goroutine", "count"), ("goroutine", "count")),
            ("lock_samples", _) => ("mutex", ("contentions", "count"), ("contentions", "count")),
            ("lock_nanoseconds", _) => {
                ("mutex", ("delay", "nanoseconds"), ("contentions", "count"))
            }
            ("exceptions", _) => (
                "exceptions",
                ("exceptions", "count"),
                ("exceptions", "count"),
            ),
            (other, _) => {
                return Err(invalid(
                    "units",
                    format!(
                        "{other:?} (samples, objects, bytes, goroutines, lock_samples, lock_nanoseconds, exceptions)"
                    ),
                ));
            }
        };
        // Lock units are Go's mutex and block profiles alike: the suffix tells which.
        let name = match (name, self.kind.as_deref()) {
            ("mutex", Some(kind)) if kind.starts_with("block") => "block",
            (name, _) => name,
        };
        // A CPU sample stands for 1 s / sampleRate; other values count as they are.
        let each = match self.units.as_str() {
            "samples" => 1_000_000_000 / self.sample_rate,
            _ => 1,
        };
        let owned = |(a, b): (&str, &str)| (a.to_owned(), b.to_owned());
        Ok((
            name.to_owned(),
            Units {
                sample: owned(sample),
                period: owned(period),
                period_value: each,
                scale: each,
            },
        ))
    }

    /// A folded (or, with `lines`, one stack per line) body as a profile of the units the
    /// query string gives.
    pub fn folded(&self, text: &str, lines: bool, limits: &Limits) -> Result<Incoming> {
        let (name, units) = self.folded_units()?;
        let profile = folded::to_profile(text, lines, &units, limits)?;
        Ok(self.incoming(name, crate::validate(profile, limits)?, None))
    }

    /// A trie body (Pyroscope's transport trie) or, with `tree`, a tree body, as a profile
    /// of the units the query string gives (as folded stacks are).
    pub fn trie(&self, body: &[u8], tree: bool, limits: &Limits) -> Result<Incoming> {
        let (name, units) = self.folded_units()?;
        let profile = if tree {
            super::trie::tree_to_profile(body, &units, limits)?
        } else {
            super::trie::trie_to_profile(body, &units, limits)?
        };
        Ok(self.incoming(name, crate::validate(profile, limits)?, None))
    }

    /// A speedscope file: a profile per name and unit in it, each with the label
    /// `profile_name` (its name in the file) when it has one; a unit of `none` is a sample at
    /// `sampleRate`.
    pub fn speedscope(&self, body: &[u8], limits: &Limits) -> Result<Vec<Incoming>> {
        let converted = super::speedscope::convert(body, self.sample_rate, limits)?;
        let many = converted.len() > 1;
        converted
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let mut incoming = self.incoming(
                    c.profile_name.to_owned(),
                    crate::validate(c.profile, limits)?,
                    None,
                );
                if !c.name.is_empty() {
                    incoming
                        .labels
                        .push(("profile_name".into(), c.name.clone()));
                }
                if many {
                    incoming.at = format!("profiles {:?} ({i})", c.name);
                }
                Ok(incoming)
            })
            .collect()
    }

    /// A JFR recording and the labels part sent with it (see [`super::jfr`]): a profile
    /// per kind of event in it, each with the label `jfr_event` (async-profiler's event)
    /// when the recording names one.
    pub fn jfr(
        &self,
        body: &[u8],
        labels: Option<&[u8]>,
        limits: &Limits,
    ) -> Result<Vec<Incoming>> {
        let recording = super::jfr::convert(body, labels, self.sample_rate, limits)?;
        if recording.profiles.is_empty() {
            return Err(Error::Convert {
                format: "JFR",
                at: "the recording".into(),
                reason: "it holds no events a profile is made of (execution samples, \
                         allocations, monitor waits, parks, live objects)"
                    .into(),
            });
        }
        let many = recording.profiles.len() > 1;
        recording
            .profiles
            .into_iter()
            .map(|c| {
                let types: Vec<String> = c
                    .profile
                    .sample_type
                    .iter()
                    .map(|t| c.profile.string_table[t.r#type as usize].clone())
                    .collect();
                let mut incoming = self.incoming(
                    c.profile_name.to_owned(),
                    crate::validate(c.profile, limits)?,
                    None,
                );
                if let Some(event) = &recording.event {
                    incoming.labels.push(("jfr_event".into(), event.clone()));
                }
                if many {
                    incoming.at = format!("{} ({})", c.profile_name, types.join(", "));
                }
                Ok(incoming)
            })
            .collect()
    }

    /// A pprof body: the profile name from the application's suffix, else from its types.
    pub fn pprof(&self, profile: ValidProfile, previous: Option<ValidProfile>) -> Incoming {
        let name = match self.kind.as_deref() {
            Some("cpu" | "itimer") => "process_cpu".to_owned(),
            Some(k) if k.starts_with("alloc") || k.starts_with("inuse") => "memory".to_owned(),
            Some(k) if k.starts_with("mutex") => "mutex".to_owned(),
            Some(k) if k.starts_with("block") => "block".to_owned(),
            Some(k) => k.to_owned(),
            None => super::profile_name(&profile),
        };
        self.incoming(name, profile, previous)
    }

    /// The profile under the query string's labels, at its own time unless it has none or
    /// it decodes to 1970 (old clients sent microseconds): then at `from`, as Pyroscope does.
    fn incoming(
        &self,
        name: String,
        profile: ValidProfile,
        previous: Option<ValidProfile>,
    ) -> Incoming {
        const YEAR_MS: i64 = 365 * 24 * 3_600_000;
        let own_ms = profile.time_nanos() / 1_000_000;
        Incoming {
            profile,
            previous,
            name,
            labels: self.labels.clone(),
            delta: false,
            timestamp_ms: (own_ms < YEAR_MS).then_some(self.from_ms),
            at: String::new(),
        }
    }
}

/// `app.cpu{env=prod,region=eu}`: the application and its labels.
fn parse_name(name: &str) -> std::result::Result<(String, Vec<(String, String)>), String> {
    let name = name.trim();
    let Some(open) = name.find('{') else {
        return Ok((name.to_owned(), Vec::new()));
    };
    let app = name[..open].trim().to_owned();
    if app.is_empty() {
        return Err(format!("{name:?} has labels but no application name"));
    }
    let inner = name[open + 1..]
        .strip_suffix('}')
        .ok_or_else(|| format!("{name:?}: labels must end with '}}'"))?;
    let mut labels = Vec::new();
    for pair in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{name:?}: label {pair:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        if k.is_empty() {
            return Err(format!("{name:?}: a label has no name"));
        }
        labels.push((k.to_owned(), v.to_owned()));
    }
    Ok((app, labels))
}

/// A time as `/ingest` takes it: by its number of digits, 8 = `YYYYMMDD`, 13 = ms,
/// 16 = µs, 19 = ns, otherwise seconds. Returns milliseconds.
fn parse_time(s: &str) -> std::result::Result<i64, String> {
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
    frostdb_profile::checked_ms(ms, &format!("{s:?}"))
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
        let m = Params::parse(&p, 5).unwrap();
        assert_eq!(m.kind.as_deref(), Some("cpu"));
        assert_eq!(m.from_ms, 5);
        assert!(m.labels.contains(&("region".into(), "eu".into())));
        assert!(m.labels.contains(&("service_name".into(), "shop".into())));
        assert!(m.labels.contains(&("pyroscope_spy".into(), "pyspy".into())));
        for bad in ["{a=b}", "x{a}", "x{a=b", ""] {
            p.insert("name".to_string(), bad.to_string());
            assert!(Params::parse(&p, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cpu_samples_become_nanoseconds() {
        let mut p = HashMap::new();
        p.insert("name".to_string(), "shop".to_string());
        p.insert("sampleRate".to_string(), "100".to_string());
        let (name, units) = Params::parse(&p, 0).unwrap().folded_units().unwrap();
        assert_eq!(name, "process_cpu");
        assert_eq!(units.scale, 10_000_000);
        p.insert("units".to_string(), "furlongs".to_string());
        assert!(Params::parse(&p, 0).unwrap().folded_units().is_err());
        for bad in ["0", "2000000000", "9223372036854775807", "-5"] {
            p.insert("sampleRate".to_string(), bad.to_string());
            let err = Params::parse(&p, 0).unwrap_err();
            assert!(err.to_string().contains("sampleRate"), "{bad}: {err}");
        }
    }
}
