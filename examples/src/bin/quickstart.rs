//! Embedding frostdb-rs as a profile store: generates a small fleet's CPU profiles (pprof,
//! as Go's runtime/pprof writes them), stores them through [`ProfileStore`] from several
//! threads, persists, reopens the database and answers a profiler's first questions: which
//! pods burned the most CPU in the last minute, and where, as a top table and a flame graph.
//!
//! Run: `cargo run --release -p frostdb-examples --bin quickstart [DIR]` (default DIR:
//! `target/quickstart-db`, emptied first).

use std::time::Instant;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};
use frostdb_pprof::report::{top::TopTable, tree};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

const PODS: usize = 50;
const STEPS: usize = 30;
const START_MS: i64 = 1_700_000_000_000;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// SplitMix64: deterministic and enough for a demo.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// An index in `0..n` skewed towards 0, as stack popularity is.
    fn skewed(&mut self, n: usize) -> usize {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((u * u * u) * n as f64) as usize
    }
}

const FUNCTIONS: [&str; 16] = [
    "runtime.main",
    "main.main",
    "net/http.(*conn).serve",
    "net/http.HandlerFunc.ServeHTTP",
    "github.com/acme/shop/api.(*Server).Checkout",
    "github.com/acme/shop/cart.(*Cart).Total",
    "github.com/acme/shop/store.(*Cache).Get",
    "encoding/json.Marshal",
    "compress/flate.(*compressor).deflate",
    "crypto/sha256.block",
    "runtime.mallocgc",
    "runtime.memmove",
    "sync.(*Mutex).lockSlow",
    "syscall.Syscall",
    "runtime.gcBgMarkWorker",
    "runtime.scanobject",
];

/// A CPU profile of one pod at one time: samples/count and cpu/nanoseconds, one mapping,
/// one location per function, stacks drawn from a fixed call tree.
fn cpu_profile(rng: &mut Rng, load: usize) -> Profile {
    let mut strings: Vec<String> = vec![String::new()];
    let mut string = |s: &str| {
        strings.push(s.to_owned());
        strings.len() as i64 - 1
    };
    let sample_type = vec![
        ValueType {
            r#type: string("samples"),
            unit: string("count"),
        },
        ValueType {
            r#type: string("cpu"),
            unit: string("nanoseconds"),
        },
    ];
    let filename = string("/usr/local/bin/shop");
    let function: Vec<Function> = FUNCTIONS
        .iter()
        .enumerate()
        .map(|(i, name)| Function {
            id: i as u64 + 1,
            name: string(name),
            system_name: 0,
            filename: 0,
            start_line: 0,
        })
        .collect();
    let period_type = Some(ValueType {
        r#type: sample_type[1].r#type,
        unit: sample_type[1].unit,
    });
    let location: Vec<Location> = (0..FUNCTIONS.len())
        .map(|i| Location {
            id: i as u64 + 1,
            mapping_id: 1,
            address: 0x40_0000 + 0x100 * i as u64,
            line: vec![Line {
                function_id: i as u64 + 1,
                line: 10 + i as i64,
                column: 0,
            }],
            is_folded: false,
        })
        .collect();
    // Stacks: a root path then a few of the 16 functions, leaf first as pprof has them.
    let mut sample = Vec::new();
    for _ in 0..load {
        let depth = 2 + rng.skewed(6);
        let mut stack: Vec<u64> = vec![1, 2, 3, 4];
        for d in 0..depth {
            stack.push(5 + ((rng.skewed(11) + d) % 11) as u64);
        }
        stack.reverse();
        let ticks = 1 + rng.skewed(20) as i64;
        sample.push(Sample {
            location_id: stack,
            value: vec![ticks, ticks * 10_000_000],
            label: Vec::new(),
        });
    }
    Profile {
        sample_type,
        sample,
        mapping: vec![Mapping {
            id: 1,
            memory_start: 0x40_0000,
            memory_limit: 0x80_0000,
            filename,
            has_functions: true,
            ..Mapping::default()
        }],
        location,
        function,
        string_table: strings,
        duration_nanos: 10_000_000_000,
        period_type,
        period: 10_000_000,
        ..Profile::default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/quickstart-db".to_owned());
    let _ = std::fs::remove_dir_all(&dir);
    // Every ingest returns once it is durable (concurrent ingests share fsyncs).
    let store = ProfileStore::open(
        Db::open(&dir, DbOptions::default())?,
        StoreOptions::default(),
    )?;

    let started = Instant::now();
    let rows = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<(), String> {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let (store, rows) = (&store, &rows);
                s.spawn(move || -> Result<(), String> {
                    let mut rng = Rng(w as u64);
                    for pod in (w..PODS).step_by(8) {
                        for step in 0..STEPS {
                            let load = 50 + pod * 7;
                            let profile = frostdb_pprof::validate(
                                cpu_profile(&mut rng, load),
                                store.limits(),
                            )
                            .map_err(|e| e.to_string())?;
                            let options = IngestOptions::default()
                                .name("process_cpu")
                                .labels(vec![
                                    ("namespace".into(), "shop".into()),
                                    ("pod".into(), format!("shop-{pod:02}")),
                                ])
                                .delta(false)
                                .timestamp_ms(START_MS + step as i64 * 10_000);
                            let summary = store
                                .ingest_profile(&profile, &options)
                                .map_err(|e| e.to_string())?;
                            rows.fetch_add(summary.rows, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| "an ingest thread panicked")?)
    })?;
    let secs = started.elapsed().as_secs_f64();
    let rows = rows.into_inner();
    println!(
        "stored {} profiles of {PODS} pods, {rows} sample rows in {secs:.2} s ({:.0} profiles/s)",
        PODS * STEPS,
        (PODS * STEPS) as f64 / secs
    );
    let started = Instant::now();
    store.db().flush()?;
    let stats = store.samples().stats();
    println!(
        "persisted in {:.2} s: {:.2} bytes per sample row on disk",
        started.elapsed().as_secs_f64(),
        stats.block_bytes as f64 / stats.rows as f64
    );
    drop(store);

    let started = Instant::now();
    let store = ProfileStore::open(
        Db::open(&dir, DbOptions::default())?,
        StoreOptions::default(),
    )?;
    println!(
        "reopened {dir} in {:.0} ms: {} sample rows",
        started.elapsed().as_secs_f64() * 1e3,
        store.samples().stats().rows
    );

    // CPU per pod over the last minute.
    let end = START_MS + STEPS as i64 * 10_000;
    let minute = TimeRange {
        start_ms: end - 60_000,
        end_ms: end,
    };
    let started = Instant::now();
    let series = store
        .range(
            &Selector::parse(&format!("{CPU}{{namespace=\"shop\"}}"))?,
            minute,
            60_000,
            Some(&["pod".to_owned()]),
            frostdb_pprof::ReadOptions::STRICT,
        )?
        .value;
    let mut top: Vec<(String, i64)> = series
        .iter()
        .map(|s| {
            let pod = s.labels.first().map_or("", |(_, v)| v.as_str()).to_owned();
            (pod, s.points.iter().map(|(_, v)| v).sum())
        })
        .collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!(
        "\ntop pods by CPU in the last minute ({:.1} ms):",
        started.elapsed().as_secs_f64() * 1e3
    );
    for (pod, nanos) in top.iter().take(5) {
        println!("  {pod:<12} {:>8.2} s", *nanos as f64 / 1e9);
    }

    // Where the busiest pod spent it: pprof's top table and the flame graph's widest paths.
    let (pod, _) = top.first().ok_or("no CPU samples")?;
    let started = Instant::now();
    let merged = store.merge(
        &Selector::parse(&format!("{CPU}{{pod=\"{pod}\"}}"))?,
        minute,
    )?;
    println!(
        "\n{pod}, last minute: {} stacks merged from {} rows in {:.1} ms\n",
        merged.samples.len(),
        merged.rows,
        started.elapsed().as_secs_f64() * 1e3
    );
    let table = TopTable::build(&merged);
    for line in table.render().lines().take(12) {
        println!("{line}");
    }
    let mut folded: Vec<(i64, String)> = tree::folded(&merged)
        .lines()
        .filter_map(|l| {
            let (stack, v) = l.rsplit_once(' ')?;
            Some((v.parse().ok()?, stack.to_owned()))
        })
        .collect();
    folded.sort_by(|a, b| b.cmp(a));
    println!("\nwidest stacks (folded, root first):");
    for (v, stack) in folded.iter().take(5) {
        println!("  {:>6.2} s  {stack}", *v as f64 / 1e9);
    }
    Ok(())
}
