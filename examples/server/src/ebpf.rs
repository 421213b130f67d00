//! `--ebpf`: the host's processes, sampled by `frostdb-ebpf-ingest`, stored like any other
//! profile (type `ebpf_cpu`, labels `pid`, `comm`, `exe`, `cgroup`, `container_id`, `node`).

use frostdb_ebpf_ingest::{Config, Interval, Sampler, Target};

use super::Shared;
use super::config::EbpfConfig;
use super::ingest::{Incoming, store_one};

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
            let incoming = Incoming {
                profile,
                previous: None,
                name: frostdb_ebpf_ingest::PROFILE_NAME.into(),
                labels,
                delta: false,
                timestamp_ms: Some(interval.start_ms),
                at: String::new(),
            };
            match runtime.block_on(store_one(&state, &tenant, None, move || Ok(incoming))) {
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

/// This host's name, for the `node` label.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}
