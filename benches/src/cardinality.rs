//! `frostdb-bench labels` and `frostdb-bench series`: what many label names and many series
//! cost a profile store when it opens and when it answers label names and series.
//!
//! ```text
//! frostdb-bench labels --store DIR --names N [--wal]
//!     one profile whose series has N distinct label names (as an attacker's push, or a
//!     store written before the label limits), persisted (--wal: left in the WAL, as after a
//!     crash); then, with --reopen, opens DIR and prints the open time and the times of label
//!     names and series, checking their answers
//! frostdb-bench series --store DIR --series N
//!     N series (a profile each, one label), persisted; with --reopen, the open time of a
//!     store with a series limit (which counts the stored series) and without one
//! ```

use std::time::Instant;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{IngestOptions, LabelLimits, ProfileStore, StoreOptions, testing, validate};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

use crate::external::BoxError;
use crate::scale::{number, rss_mib};

const STRICT: frostdb_pprof::ReadOptions = frostdb_pprof::ReadOptions::STRICT;

const START_MS: i64 = 1_700_000_000_000;

fn store_dir(args: &[String]) -> Result<&String, BoxError> {
    args.iter()
        .position(|a| a == "--store")
        .and_then(|i| args.get(i + 1))
        .ok_or_else(|| "missing --store".into())
}

/// Options that admit anything: the store as one written before the limits would hold it.
fn unlimited() -> StoreOptions {
    StoreOptions::default()
        .max_series(usize::MAX)
        .label_limits(LabelLimits::unlimited())
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1e3
}

/// `labels --store DIR --names N [--wal] [--reopen]`.
pub fn labels(args: &[String]) -> Result<(), BoxError> {
    let dir = store_dir(args)?;
    let names = number(args, "--names", 10_000)?;
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds")?;
    if args.iter().any(|a| a == "--reopen") {
        let started = Instant::now();
        let store = ProfileStore::open(Db::open(dir, DbOptions::default())?, unlimited())?;
        let open_ms = ms(started);
        let started = Instant::now();
        let label_names = store.label_names(None, TimeRange::ALL, STRICT)?.value;
        let label_names_ms = ms(started);
        let started = Instant::now();
        let series = store.series(&selector, TimeRange::ALL, None, STRICT)?.value;
        let series_ms = ms(started);
        let started = Instant::now();
        let values = store
            .label_values("l00042", None, TimeRange::ALL, STRICT)?
            .value;
        let label_values_ms = ms(started);
        // The answers, not only their times: every name, one series with all of them.
        if label_names.len() != names || series.len() != 1 || series[0].labels.len() != names {
            return Err(format!(
                "{} label names and {} series ({} labels) for {names} names stored",
                label_names.len(),
                series.len(),
                series.first().map_or(0, |s| s.labels.len())
            )
            .into());
        }
        let (rss, peak) = rss_mib();
        println!(
            "{}",
            serde_json::json!({
                "names": names, "open_ms": open_ms, "label_names_ms": label_names_ms,
                "series_ms": series_ms, "label_values_ms": label_values_ms,
                "values": values.len(), "rss_mib": rss, "peak_rss_mib": peak,
            })
        );
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    let store = ProfileStore::open(Db::open(dir, DbOptions::default())?, unlimited())?;
    let profile = validate(testing::profile(0, 100, 5), store.limits())?;
    let labels: Vec<(String, String)> = (0..names)
        .map(|i| (format!("l{i:05}"), format!("v{i}")))
        .collect();
    let options = IngestOptions::default()
        .name("cpu")
        .labels(labels)
        .delta(false)
        .timestamp_ms(START_MS);
    let started = Instant::now();
    store.ingest_profile(&profile, &options)?;
    let ingest_ms = ms(started);
    let started = Instant::now();
    if !args.iter().any(|a| a == "--wal") {
        store.db().flush()?;
    }
    println!(
        "{}",
        serde_json::json!({"names": names, "ingest_ms": ingest_ms, "flush_ms": ms(started)})
    );
    Ok(())
}

/// `series --store DIR --series N [--reopen]`.
pub fn series(args: &[String]) -> Result<(), BoxError> {
    let dir = store_dir(args)?;
    let n = number(args, "--series", 100_000)?;
    if args.iter().any(|a| a == "--reopen") {
        let mut row = serde_json::Map::new();
        row.insert("series".into(), n.into());
        for (what, max_series) in [("open_unlimited_ms", usize::MAX), ("open_limited_ms", n)] {
            let started = Instant::now();
            let store = ProfileStore::open(
                Db::open(dir, DbOptions::default())?,
                StoreOptions::default().max_series(max_series),
            )?;
            row.insert(what.into(), ms(started).into());
            if max_series != usize::MAX && store.series_count() != n {
                return Err(format!("{} series counted, {n} stored", store.series_count()).into());
            }
        }
        row.insert("peak_rss_mib".into(), rss_mib().1.into());
        println!("{}", serde_json::Value::Object(row));
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    let store = ProfileStore::open(Db::open(dir, DbOptions::default())?, unlimited())?;
    let profile = validate(testing::profile(0, 10, 3), store.limits())?;
    let started = Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..16)
            .map(|_| {
                s.spawn(|| -> Result<(), BoxError> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let options = IngestOptions::default()
                            .name("cpu")
                            .labels(vec![("pod".into(), format!("pod-{i}"))])
                            .delta(false)
                            .timestamp_ms(START_MS + (i as i64 % 360) * 10_000);
                        store.ingest_profile(&profile, &options)?;
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
    println!("{}", serde_json::json!({"series": n, "ingest_s": ingest_s}));
    Ok(())
}
