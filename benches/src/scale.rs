//! `frostdb-bench symbols`: memory and open time of a profile store as its distinct stacks
//! grow (symbols must stay bounded by the cache, and nothing may load at open).
//!
//! ```text
//! frostdb-bench symbols --store DIR --stacks N [--per-profile 5000]
//!     stores N distinct stacks (synthetic CPU profiles of --per-profile new stacks each, one
//!     per 10 s), flushes, and prints RSS; then, with --reopen, only opens DIR, merges the
//!     last minute and the whole range, and prints open time and RSS after each
//! ```

use std::time::Instant;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions, testing, validate};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

use crate::external::BoxError;

const START_MS: i64 = 1_700_000_000_000;

/// This process's resident and peak resident memory, MiB (`/proc/self/status`).
pub fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

pub(crate) fn number(args: &[String], name: &str, default: usize) -> Result<usize, BoxError> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.replace('_', "").parse().ok())
            .ok_or_else(|| format!("{name} needs a number").into()),
    }
}

/// `symbols --store DIR --stacks N [--per-profile P] [--reopen]`.
pub fn symbols(args: &[String]) -> Result<(), BoxError> {
    let dir = args
        .iter()
        .position(|a| a == "--store")
        .and_then(|i| args.get(i + 1))
        .ok_or("missing --store")?;
    let stacks = number(args, "--stacks", 1_000_000)?;
    let per = number(args, "--per-profile", 5_000)?.max(1);
    let profiles = stacks.div_ceil(per);
    let cpu =
        |labels: &str| Selector::parse(&format!("cpu:cpu:nanoseconds:cpu:nanoseconds{{{labels}}}"));
    if args.iter().any(|a| a == "--reopen") {
        let started = Instant::now();
        let store = ProfileStore::open(
            Db::open(dir, DbOptions::default())?,
            StoreOptions::default(),
        )?;
        let open_ms = started.elapsed().as_secs_f64() * 1e3;
        let (rss_open, _) = rss_mib();
        let end = START_MS + profiles as i64 * 10_000;
        let started = Instant::now();
        let recent = store.merge(
            &cpu("")?,
            TimeRange {
                start_ms: end - 60_000,
                end_ms: end,
            },
        )?;
        let recent_ms = started.elapsed().as_secs_f64() * 1e3;
        let (rss_recent, _) = rss_mib();
        let started = Instant::now();
        let all = store.merge(&cpu("")?, TimeRange::ALL)?;
        let all_ms = started.elapsed().as_secs_f64() * 1e3;
        if all.total() != testing::total(0, profiles * per) {
            return Err(format!("merged total {} is not the stored one", all.total()).into());
        }
        let stacks_merged = all.samples.len();
        drop((recent, all));
        let (rss_after, peak) = rss_mib();
        println!(
            "{}",
            serde_json::json!({
                "stacks": profiles * per, "open_ms": open_ms, "rss_open_mib": rss_open,
                "merge_last_minute_ms": recent_ms, "rss_after_recent_merge_mib": rss_recent,
                "merge_all_ms": all_ms, "stacks_merged": stacks_merged,
                "rss_after_full_merge_mib": rss_after, "peak_rss_mib": peak,
                "symbol_cache_mib": store.symbol_memory_bytes() as f64 / (1 << 20) as f64,
            })
        );
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    let store = ProfileStore::open(
        Db::open(dir, DbOptions::default())?,
        StoreOptions::default(),
    )?;
    let started = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = 16;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), BoxError> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= profiles {
                            return Ok(());
                        }
                        let profile =
                            validate(testing::profile((i * per) as u64, per, 5), store.limits())?;
                        let options = IngestOptions::default()
                            .name("cpu")
                            .labels(vec![("pod".into(), format!("pod-{}", i % 20))])
                            .delta(false)
                            .timestamp_ms(START_MS + i as i64 * 10_000);
                        store.ingest_profile(&profile, &options)?;
                        if (i + 1).is_multiple_of((profiles / 10).max(1)) {
                            let (rss, _) = rss_mib();
                            eprintln!(
                                "  {} stacks stored, RSS {rss:.0} MiB, symbols in memory {:.0} MiB",
                                (i + 1) * per,
                                store.symbol_memory_bytes() as f64 / (1 << 20) as f64
                            );
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| BoxError::from("a thread panicked"))?)
    })?;
    let ingest_s = started.elapsed().as_secs_f64();
    store.db().flush()?;
    let (rss, peak) = rss_mib();
    let bytes = |t: &str| store.db().get_table(t).map_or(0, |t| t.stats().block_bytes);
    let symbol_bytes: u64 = ["stacktraces", "locations", "functions", "mappings"]
        .iter()
        .map(|t| bytes(t))
        .sum();
    println!(
        "{}",
        serde_json::json!({
            "stacks": profiles * per, "ingest_s": ingest_s,
            "stacks_per_s": (profiles * per) as f64 / ingest_s,
            "rss_mib": rss, "peak_rss_mib": peak,
            "symbol_memory_mib": store.symbol_memory_bytes() as f64 / (1 << 20) as f64,
            "symbol_bytes_per_stack": symbol_bytes as f64 / (profiles * per) as f64,
        })
    );
    Ok(())
}
