//! Engine benchmarks on profile-shaped rows: insert throughput, full and filtered scans,
//! compaction, and memory per row held in L0 and in compacted levels.
//!
//! Run: `cargo bench -p frostdb-benches --bench engine`.

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use frostdb_benches::{Fleet, samples_schema};
use frostdb_core::{Db, DbOptions, ScanRequest, Table, TableOptions, col};

const SERIES: usize = 150;
const STACKS: usize = 30_000;
const SAMPLES: usize = 1_500;

fn batches(steps: usize) -> Vec<arrow::array::RecordBatch> {
    Fleet::new(20_240_603, SERIES, STACKS)
        .profiles(1_700_000_000_000, steps, SAMPLES)
        .collect()
}

fn rows(batches: &[arrow::array::RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

fn table(background: bool, options: TableOptions) -> (Db, Table) {
    let db = Db::open_in_memory(DbOptions::default().background_compaction(background))
        .expect("in-memory db");
    let table = db
        .table("samples", samples_schema(), options)
        .expect("table");
    (db, table)
}

fn filled(steps: usize, compact: bool) -> (Db, Table) {
    let (db, t) = table(false, TableOptions::default());
    for b in batches(steps) {
        t.insert(&b).expect("insert");
    }
    if compact {
        t.compact_fully().expect("compact");
    }
    (db, t)
}

fn insert(c: &mut Criterion) {
    let input = batches(2);
    let mut group = c.benchmark_group("insert");
    group.sample_size(10);
    group.throughput(Throughput::Elements(rows(&input) as u64));
    group.bench_function("profiles_no_compaction", |b| {
        b.iter_batched(
            || table(false, TableOptions::default().l0_max_parts(usize::MAX / 2)),
            |(_db, t)| {
                for batch in &input {
                    t.insert(batch).expect("insert");
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("profiles_background_compaction", |b| {
        b.iter_batched(
            || table(true, TableOptions::default()),
            |(_db, t)| {
                for batch in &input {
                    t.insert(batch).expect("insert");
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("scan");
    group.sample_size(10);
    for (label, compact) in [("l0", false), ("compacted", true)] {
        let (_db, t) = filled(4, compact);
        let n = t.stats().rows;
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("full_{label}"), |b| {
            b.iter(|| {
                // Touch every row: count rows and sum the values.
                let (mut got, mut total) = (0usize, 0i64);
                for batch in t.snapshot().scan(&ScanRequest::new()).expect("scan") {
                    let batch = batch.expect("batch");
                    got += batch.num_rows();
                    let value = batch.column_by_name("value").expect("value column");
                    total += arrow::compute::sum(value.as_primitive::<Int64Type>()).unwrap_or(0);
                }
                assert_eq!(got, n);
                total
            })
        });
        let pod = Fleet::new(0, SERIES, 1).series[42].pod.clone();
        group.bench_function(format!("one_pod_{label}"), |b| {
            b.iter(|| {
                let request = ScanRequest::new()
                    .filter(
                        col("name")
                            .eq("cpu")
                            .and(col("labels.pod").eq(pod.as_str())),
                    )
                    .project(["stacktrace_id", "value"]);
                t.snapshot()
                    .scan(&request)
                    .expect("scan")
                    .map(|b| b.expect("batch").num_rows())
                    .sum::<usize>()
            })
        });
    }
    group.finish();
}

fn compaction(c: &mut Criterion) {
    let input = batches(4);
    let mut group = c.benchmark_group("compaction");
    group.sample_size(10);
    group.throughput(Throughput::Elements(rows(&input) as u64));
    group.bench_function("l0_to_one_run", |b| {
        b.iter_batched(
            || {
                let (db, t) = table(false, TableOptions::default());
                for batch in &input {
                    t.insert(batch).expect("insert");
                }
                (db, t)
            },
            |(_db, t)| t.compact_fully().expect("compact"),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

/// Memory per row in L0 and after compaction, next to the input's plain Arrow size.
fn memory_report() {
    let input = batches(4);
    let n = rows(&input);
    let plain: usize = input.iter().map(|b| b.get_array_memory_size()).sum();
    let (_db, t) = table(false, TableOptions::default().l0_max_parts(usize::MAX / 2));
    for b in &input {
        t.insert(b).expect("insert");
    }
    let l0 = t.stats().levels[0].bytes;
    t.compact_fully().expect("compact");
    let stats = t.stats();
    let compacted: usize = stats.levels.iter().map(|l| l.bytes).sum();
    eprintln!(
        "memory per row over {n} rows: input (plain Arrow) {:.1} B, L0 {:.1} B, compacted {:.1} B ({} granules)",
        plain as f64 / n as f64,
        l0 as f64 / n as f64,
        compacted as f64 / n as f64,
        stats.levels.iter().map(|l| l.chunks).sum::<usize>(),
    );
}

criterion_group!(benches, insert, scan, compaction);

fn main() {
    memory_report();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
