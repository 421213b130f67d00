//! Builds a profile-shaped table in an on-disk database, ingests a fleet's worth of
//! profiles, persists them as Parquet, reopens the database and answers a profiler's first
//! question: which pods burned the most CPU in the last minute, and on which stacks.
//!
//! Run: `cargo run --release -p frostdb-examples --bin quickstart [DIR]` (default DIR:
//! `target/quickstart-db`, emptied first).

use std::collections::HashMap;
use std::time::Instant;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use arrow::util::pretty::pretty_format_batches;
use frostdb_benches::{Fleet, profile_schema};
use frostdb_core::{Db, DbOptions, Durability, ScanRequest, TableOptions, col};

const SERIES: usize = 150;
const STEPS: usize = 30;
const START_MS: i64 = 1_700_000_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/quickstart-db".to_owned());
    let _ = std::fs::remove_dir_all(&dir);
    // Every insert is fsynced before it returns (the default, `Durability::Sync`).
    let options = || DbOptions::default().durability(Durability::Sync);
    let db = Db::open(&dir, options())?;
    let samples = db.table("samples", profile_schema(), TableOptions::default())?;

    let started = Instant::now();
    let mut fleet = Fleet::new(42, SERIES, 30_000);
    let (mut profiles, mut rows) = (0, 0);
    for (i, profile) in fleet.profiles(START_MS, STEPS, 1_500).enumerate() {
        rows += profile.num_rows();
        profiles += 1;
        samples.insert(&profile)?;
        if (i + 1) % 1_000 == 0 {
            eprintln!("  ingested {} profiles, {rows} samples", i + 1);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "ingested {profiles} profiles of {SERIES} series, {rows} samples in {secs:.2} s ({:.0} samples/s)",
        rows as f64 / secs
    );
    let started = Instant::now();
    db.flush()?;
    let stats = samples.stats();
    println!(
        "persisted {} blocks in {:.2} s: {:.1} MB of Parquet, {:.2} bytes per sample on disk",
        stats.blocks,
        started.elapsed().as_secs_f64(),
        stats.block_bytes as f64 / 1e6,
        stats.block_bytes as f64 / stats.rows as f64
    );
    drop(samples);
    drop(db);

    let started = Instant::now();
    let db = Db::open(&dir, options())?;
    let samples = db.get_table("samples").ok_or("the table is gone")?;
    println!(
        "reopened {dir} in {:.0} ms: {} samples",
        started.elapsed().as_secs_f64() * 1e3,
        samples.stats().rows
    );

    // CPU per pod over the last minute.
    let end = START_MS + STEPS as i64 * 10_000;
    let window = col("name")
        .eq("cpu")
        .and(col("timestamp").gt_eq(end - 60_000))
        .and(col("timestamp").lt(end));
    let started = Instant::now();
    let snapshot = samples.snapshot();
    let scan = snapshot.scan(
        &ScanRequest::new()
            .filter(window.clone())
            .project(["labels.pod", "value"]),
    )?;
    let metrics = scan.metrics();
    let mut per_pod: HashMap<String, i64> = HashMap::new();
    for batch in scan {
        let batch = batch?;
        let pods = batch
            .column(0)
            .as_dictionary::<arrow::datatypes::Int32Type>();
        let names = pods.values().as_string::<i32>();
        let values = batch.column(1).as_primitive::<Int64Type>();
        for (key, value) in pods.keys().iter().zip(values.values()) {
            if let Some(key) = key {
                *per_pod
                    .entry(names.value(key as usize).to_owned())
                    .or_default() += value;
            }
        }
    }
    let mut top: Vec<(String, i64)> = per_pod.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!(
        "\ntop pods by CPU in the last minute ({:.1} ms; {} of {} row groups pruned, {} rows read):",
        started.elapsed().as_secs_f64() * 1e3,
        metrics.row_groups_pruned,
        metrics.row_groups,
        metrics.rows_read
    );
    for (pod, nanos) in top.iter().take(5) {
        println!("  {pod:<32} {:>8.2} s", *nanos as f64 / 1e9);
    }

    // The first rows of the busiest pod, in the table's sort order.
    let (pod, _) = top.first().ok_or("no CPU samples")?;
    let rows: Vec<RecordBatch> = samples.scan(
        &ScanRequest::new()
            .filter(window.and(col("labels.pod").eq(pod.as_str())))
            .project([
                "labels.pod",
                "labels.container",
                "stacktrace_id",
                "timestamp",
                "value",
            ])
            .sorted(true)
            .limit(5),
    )?;
    println!("\nfirst samples of {pod} in sort order:");
    println!("{}", pretty_format_batches(&rows)?);
    Ok(())
}
