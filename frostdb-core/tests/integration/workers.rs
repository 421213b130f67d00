//! Databases sharing one worker pool: threads stay bounded by the pool whatever the number
//! of databases, and every database still compacts, persists and expires.
//!
//! `FROSTDB_DATABASES=2000 cargo nextest run -p frostdb-core -E 'test(/^workers::/)' --no-capture`
//! reports threads and RSS for 2,000 databases (CI opens 200).

use crate::common;

use common::*;
use frostdb_core::{Db, DbOptions, ScanRequest, TableOptions, WorkerPool};

/// Threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Threads of this process whose name starts with `prefix`.
fn named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

fn databases() -> usize {
    std::env::var("FROSTDB_DATABASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

// Both scenarios count this process's threads, so they run one after the other in one
// test: as two, a test harness running them at once (plain `cargo test`) would count the
// other's threads.
#[test]
fn worker_pools_bound_threads_and_stop_with_their_databases() {
    a_database_without_a_pool_has_its_own_and_stops_it_when_dropped();
    many_databases_on_one_pool_keep_threads_bounded_and_all_work();
}

fn many_databases_on_one_pool_keep_threads_bounded_and_all_work() {
    let n = databases();
    let dir = tempfile::tempdir().unwrap();
    let pool = WorkerPool::new(1).unwrap();
    let (threads_before, rss_before) = (threads(), rss());
    let options = || {
        DbOptions::default()
            .workers(pool.clone())
            .retention_interval(std::time::Duration::from_millis(50))
    };
    let started = std::time::Instant::now();
    let mut dbs = Vec::new();
    for i in 0..n {
        let db = Db::open(dir.path().join(format!("db-{i}")), options()).unwrap();
        let table = db
            .table(
                "samples",
                samples_schema(),
                TableOptions::default().granule_rows(16),
            )
            .unwrap();
        for t in 0..4 {
            table
                .insert(&batch(vec![
                    ("name", str_n("cpu", 8)),
                    ("timestamp", ints(&[t; 8])),
                    ("value", ints(&[i as i64; 8])),
                ]))
                .unwrap();
        }
        dbs.push((db, table));
    }
    let opened = started.elapsed();
    let (threads_after, rss_after) = (threads(), rss());
    println!(
        "{n} databases on one pool: {} threads before, {} after (pool: {}), RSS {:.1} MiB -> {:.1} MiB \
         ({:.1} KiB per database), opened in {:.2} s",
        threads_before,
        threads_after,
        pool.threads(),
        rss_before as f64 / (1 << 20) as f64,
        rss_after as f64 / (1 << 20) as f64,
        (rss_after.saturating_sub(rss_before)) as f64 / 1024.0 / n as f64,
        opened.as_secs_f64(),
    );
    // The pool's threads were started by `new`, its I/O runtime by the first database.
    assert!(
        threads_after <= threads_before + WorkerPool::IO_THREADS,
        "{threads_before} threads before, {threads_after} after opening {n} databases"
    );
    assert_eq!(named("frostdb-compact") + named("frostdb-persist"), 2);
    assert!(named("frostdb-io") <= WorkerPool::IO_THREADS);

    // Every database works: its rows, persisted by the shared threads on flush, read back.
    for (i, (db, table)) in dbs.iter().enumerate().step_by(n.div_ceil(10)) {
        db.flush().unwrap();
        assert_eq!(table.stats().blocks, 1);
        let rows = count(&table.scan(&ScanRequest::new()).unwrap());
        assert_eq!(rows, 32, "database {i}");
    }
    // Dropping them releases each directory: it reopens with its rows.
    drop(dbs);
    let db = Db::open(dir.path().join("db-0"), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    assert_eq!(count(&table.scan(&ScanRequest::new()).unwrap()), 32);
}

fn a_database_without_a_pool_has_its_own_and_stops_it_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let workers = || named("frostdb-compact") + named("frostdb-persist");
    let before = workers();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    assert_eq!(
        workers() - before,
        2,
        "a compaction and a persistence thread"
    );
    assert!(named("frostdb-io") >= 1, "and an I/O runtime");
    drop(db);
    assert_eq!(workers(), before, "its threads are joined on drop");
}
