//! The other formats profiles arrive in, converted to pprof: [`folded`] stacks (and
//! "lines"), OpenTelemetry profiles ([`otlp`]) and Grafana Pyroscope's push requests
//! ([`push`], pprof samples under series labels). A conversion that fails says where with
//! [`Error::Convert`](crate::Error::Convert) (the line or the field path) or, over a limit,
//! [`Error::TooLarge`](crate::Error::TooLarge); a profile within a request that fails the
//! pprof checks is [`Error::At`](crate::Error::At), naming it and keeping the check's kind.

pub mod folded;
pub mod otlp;
pub mod push;

use crate::ValidProfile;

/// The profile name Pyroscope gives a pprof by its sample types (`process_cpu`, `memory`,
/// `goroutines`, `mutex`, `block`, `wall`, else its last sample type): the first part of the
/// profile types it is stored as, when its sender does not name it.
pub fn profile_name(p: &ValidProfile) -> String {
    let types: Vec<&str> = p
        .sample_types()
        .iter()
        .map(|t| p.string(t.r#type))
        .collect();
    // Pyroscope's rules (`metricName` of its pprof ingestion): a `wall` type makes the whole
    // profile `wall` (Node's wall profile with CPU time is `wall:cpu:…` too); else the first
    // type that names a kind.
    if types.contains(&"wall") {
        return "wall".to_owned();
    }
    for t in &types {
        let name = if t.contains("cpu") {
            "process_cpu"
        } else if t.contains("alloc_") || t.contains("inuse_") || *t == "space" || *t == "objects" {
            "memory"
        } else if t.contains("mutex_") || *t == "contentions" || *t == "delay" {
            "mutex"
        } else if t.contains("block_") {
            "block"
        } else if t.starts_with("goroutine") {
            "goroutines"
        } else {
            continue;
        };
        return name.to_owned();
    }
    let period = p.period_type().map(|t| p.string(t.r#type)).unwrap_or("");
    match period {
        "cpu" => "process_cpu".to_owned(),
        _ => types.last().copied().unwrap_or("unknown").to_owned(),
    }
}
