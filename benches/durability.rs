//! Durability benchmarks, each measured in a fresh process so that memory figures belong to
//! one measurement:
//!
//! - persistence memory: fill a block of 64 MiB, 256 MiB and 1 GiB of profile-shaped rows,
//!   then persist it; report the peak resident memory *above* the steady state before
//!   persisting (it must stay flat as the block grows 16x), and the persistence throughput;
//! - recovery: a WAL of 1 million rows, replayed on open.
//!
//! Run: `cargo bench -p frostdb-benches --bench durability` (sizes in MiB can be given as
//! `-- 64 256 1024`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use frostdb_benches::{Fleet, samples_schema};
use frostdb_core::{Db, DbOptions, TableOptions};

const CHILD: &str = "FROSTDB_BENCH_CHILD";

/// Counts live heap bytes and their peak, so the working set of persistence can be told
/// apart from what the C allocator keeps in its per-thread arenas (which RSS includes).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

#[allow(unsafe_code)]
// SAFETY: every method forwards to the system allocator with the caller's arguments, so its
// contract is the caller's; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grow = new_size - layout.size();
                let live = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A line of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak resident set (VmHWM) to the current one.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn persist_child(mib: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Db::open(
        dir.path(),
        DbOptions::default().background_compaction(false),
    )
    .expect("open");
    let options = TableOptions::default().block_size(usize::MAX / 2);
    let table = db
        .table("samples", samples_schema(), options)
        .expect("table");
    let mut fleet = Fleet::new(7, 600, 120_000);
    let target = mib << 20;
    let mut step = 0;
    let started = Instant::now();
    while table.stats().levels.iter().map(|l| l.bytes).sum::<usize>() < target {
        for batch in fleet.profiles(1_700_000_000_000 + step * 10_000, 1, 1_500) {
            table.insert(&batch).expect("insert");
        }
        step += 1;
        if step % 8 == 0 {
            table.compact().expect("compact");
        }
    }
    table.compact_fully().expect("compact");
    let stats = table.stats();
    let rows = stats.rows;
    let bytes: usize = stats.levels.iter().map(|l| l.bytes).sum();
    let fill_s = started.elapsed().as_secs_f64();

    let steady = status_kib("VmRSS:");
    let heap_steady = LIVE.load(Ordering::Relaxed);
    reset_peak();
    PEAK.store(heap_steady, Ordering::Relaxed);
    let started = Instant::now();
    let blocks = table.persist().expect("persist");
    let secs = started.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:");
    let heap_peak = PEAK.load(Ordering::Relaxed);
    let size: u64 = blocks.iter().map(|b| b.size).sum();
    println!(
        "RESULT block_mib={mib} rows={rows} arrow_bytes={bytes} fill_s={fill_s:.1} steady_rss_mib={:.1} peak_rss_mib={:.1} rss_above_steady_mib={:.1} heap_above_steady_mib={:.1} persist_s={secs:.2} parquet_mib={:.1} parquet_mib_per_s={:.1} rows_per_s={:.0} bytes_per_row={:.2}",
        steady as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(steady) as f64 / 1024.0,
        heap_peak.saturating_sub(heap_steady) as f64 / (1 << 20) as f64,
        size as f64 / (1 << 20) as f64,
        size as f64 / (1 << 20) as f64 / secs,
        rows as f64 / secs,
        size as f64 / rows as f64,
    );
}

fn recovery_child(rows_wanted: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = TableOptions::default().block_size(usize::MAX / 2);
    let mut rows = 0;
    let mut records = 0;
    {
        let db = Db::open(
            dir.path(),
            DbOptions::default().background_compaction(false),
        )
        .expect("open");
        let table = db
            .table("samples", samples_schema(), options.clone())
            .expect("table");
        let mut fleet = Fleet::new(11, 150, 30_000);
        let mut step = 0;
        while rows < rows_wanted {
            for batch in fleet.profiles(1_700_000_000_000 + step * 10_000, 1, 1_500) {
                rows += batch.num_rows();
                records += 1;
                table.insert(&batch).expect("insert");
            }
            step += 1;
        }
    }
    let wal_bytes: u64 = std::fs::read_dir(dir.path().join("wal"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let started = Instant::now();
    let db = Db::open(
        dir.path(),
        DbOptions::default().background_compaction(false),
    )
    .expect("reopen");
    let secs = started.elapsed().as_secs_f64();
    let recovered = db.get_table("samples").expect("table").stats().rows;
    assert_eq!(recovered, rows);
    println!(
        "RESULT recovery rows={rows} records={records} wal_mib={:.1} open_s={secs:.2} rows_per_s={:.0} peak_rss_mib={:.1}",
        wal_bytes as f64 / (1 << 20) as f64,
        rows as f64 / secs,
        status_kib("VmHWM:") as f64 / 1024.0
    );
}

fn run_child(args: &[&str]) {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .env(CHILD, args.join(" "))
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines().filter(|l| l.starts_with("RESULT")) {
        println!("{line}");
    }
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        panic!("child {args:?} failed");
    }
}

fn main() {
    if let Ok(task) = std::env::var(CHILD) {
        let parts: Vec<&str> = task.split_whitespace().collect();
        match parts.as_slice() {
            ["persist", mib] => persist_child(mib.parse().expect("MiB")),
            ["recovery", rows] => recovery_child(rows.parse().expect("rows")),
            other => panic!("unknown task {other:?}"),
        }
        return;
    }
    let sizes: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.parse::<usize>().is_ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec!["64".to_owned(), "256".to_owned(), "1024".to_owned()]
    } else {
        sizes
    };
    for mib in &sizes {
        run_child(&["persist", mib]);
    }
    run_child(&["recovery", "1000000"]);
}
