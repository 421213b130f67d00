//! `--ebpf`: the host's processes, sampled by `frostdb-ebpf-ingest`, stored like any other
//! profile (type `ebpf_cpu`, labels `pid`, `comm`, `exe`, `cgroup`, `container_id`, `node`;
//! past the tenant's series limit, without `pid` and `comm`).

use frostdb_ebpf_ingest::{Config, Interval, Sampler, Target};

use super::Shared;
use super::config::EbpfConfig;
use super::error::ApiResult;
use super::ingest::{Incoming, store_one};
use frostdb_pprof::IngestSummary;

/// The sampler's configuration from the server's.
pub fn sampler_config(c: &EbpfConfig) -> Config {
    let target = if let Some(cgroup) = &c.cgroup {
        Target::Cgroup(cgroup.clone())
    } else if !c.pids.is_empty() {
        Target::Pids(c.pids.clone())
    } else {
        Target::All
    };
    Config::default()
        .frequency_hz(c.frequency_hz)
        .interval(c.interval)
        .target(target)
        .unwind_table_bytes(c.unwind_table_mib.saturating_mul(1 << 20))
}

/// Starts sampling; each interval's profiles are stored in the configured tenant from the
/// sampler's own thread (admitted against the series limit like pushed ones).
pub fn start(state: Shared, c: &EbpfConfig) -> Result<Sampler, String> {
    let runtime = tokio::runtime::Handle::current();
    let tenant = c.tenant.clone();
    let node = hostname();
    let sink = move |interval: Interval| -> Result<(), frostdb_ebpf_ingest::SinkError> {
        let (mut rows, mut failed) = (0, Vec::new());
        let processes = interval.profiles.len();
        for p in interval.profiles {
            let mut labels = p.labels();
            labels.push(("node".into(), node.clone()));
            let profile = match frostdb_pprof::validate(p.profile, &state.tenants.pprof_limits()) {
                Ok(profile) => profile,
                Err(e) => {
                    failed.push(format!("pid {} ({}): {e}", p.pid, p.info.comm));
                    continue;
                }
            };
            let incoming = |labels: Vec<(String, String)>, profile| Incoming {
                profile,
                previous: None,
                name: frostdb_ebpf_ingest::PROFILE_NAME.into(),
                labels,
                delta: false,
                timestamp_ms: Some(interval.start_ms),
                at: String::new(),
            };
            let store = |labels, profile| {
                let incoming = incoming(labels, profile);
                runtime.block_on(store_one(&state, &tenant, None, move || Ok(incoming)))
            };
            match store_process(store, labels, profile) {
                Ok(summary) => rows += summary.rows,
                Err(e) => failed.push(format!("pid {} ({}): {e}", p.pid, p.info.comm)),
            }
        }
        tracing::info!(
            processes,
            samples = interval.samples,
            rows,
            symbolize_ms = format!("{:.1}", interval.symbolize.as_secs_f64() * 1e3),
            unwind_tables_ms = format!("{:.1}", interval.tables_refresh.as_secs_f64() * 1e3),
            unwind_table_files = interval.tables.files,
            unwind_table_kib = interval.tables.bytes >> 10,
            "eBPF interval stored"
        );
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; ").into())
        }
    };
    let sampler = Sampler::start(sampler_config(c), sink)
        .map_err(|e| format!("cannot start the eBPF sampler (--ebpf): {e}"))?;
    tracing::info!(
        frequency_hz = c.frequency_hz,
        interval_ms = c.interval.as_millis() as u64,
        tenant = %c.tenant,
        "eBPF sampler running"
    );
    Ok(sampler)
}

/// Stores a process's profile with `store` under its `labels`. A process's own series is
/// its pid and name: processes come and go (and set their names), and past the tenant's
/// series limit a new one was refused for good, every later process unprofiled. Refused
/// for the series limit, it is stored in the series of its executable, cgroup and node
/// instead, without `pid` and `comm`.
fn store_process<P: Clone>(
    store: impl Fn(Vec<(String, String)>, P) -> ApiResult<IngestSummary>,
    labels: Vec<(String, String)>,
    profile: P,
) -> Result<IngestSummary, String> {
    match store(labels.clone(), profile.clone()) {
        Err(e) if e.status == axum::http::StatusCode::TOO_MANY_REQUESTS => {
            let mut labels = labels;
            labels.retain(|(k, _)| k != "pid" && k != "comm");
            store(labels, profile)
                .map_err(|again| format!("{e}; and without pid and comm: {again}"))
        }
        stored => stored.map_err(|e| e.to_string()),
    }
}

/// This host's name, for the `node` label.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;

    /// A process refused for the series limit is stored in its executable's series,
    /// without pid and name; one refused for anything else is not stored again.
    #[test]
    fn a_process_past_the_series_limit_is_stored_in_its_executables_series() {
        let labels = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let process = labels(&[
            ("pid", "42"),
            ("comm", "x"),
            ("exe", "/bin/x"),
            ("node", "n"),
        ]);
        let tried = std::cell::RefCell::new(Vec::new());
        let store = |labels: Vec<(String, String)>, ()| {
            tried.borrow_mut().push(labels.clone());
            if labels.iter().any(|(k, _)| k == "pid") {
                Err(ApiError::new(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    "the limit of 10 series is reached",
                ))
            } else {
                Ok(IngestSummary::default())
            }
        };
        store_process(store, process.clone(), ()).unwrap();
        assert_eq!(
            tried.borrow().clone(),
            [process.clone(), labels(&[("exe", "/bin/x"), ("node", "n")])]
        );
        let tried = std::cell::Cell::new(0);
        let refuse = |_, ()| -> ApiResult<IngestSummary> {
            tried.set(tried.get() + 1);
            Err(ApiError::bad_request("a bad profile"))
        };
        assert!(
            store_process(refuse, process, ())
                .unwrap_err()
                .contains("a bad profile")
        );
        assert_eq!(tried.get(), 1);
    }
}
