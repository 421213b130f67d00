//! What the sampler costs: CPU seconds per wall second of the sampling process (drains,
//! symbolization, profile building) and of the BPF program (the kernel's own run-time
//! accounting), sampling every process while two programs keep both CPUs busy, at 19 and
//! 99 Hz; and symbolization time per interval.
//!
//! `cargo bench -p frostdb-ebpf-ingest --bench overhead` (root). `FROSTDB_EBPF_BENCH_SECS`
//! sets the seconds per frequency (default 120), `FROSTDB_EBPF_BENCH_HZ` the frequencies
//! (default `19,99`), `FROSTDB_EBPF_BENCH_UNWIND_MIB` the unwind tables' memory (default 32;
//! 0 walks frame pointers only, as the sampler did before it had tables),
//! `FROSTDB_EBPF_BENCH_VERBOSE` prints every interval.
//!
//! The bar (issue 15): sampler + BPF under 0.5% of a core at 19 Hz, table building included,
//! amortized over 10 minutes: the last line of each rate adds the tables' build time / 600 s
//! to the steady-state CPU.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use frostdb_ebpf_ingest::{Config, Interval, Sampler, Target, check_permitted};

#[path = "../tests/spin/mod.rs"]
mod spin;

/// CPU time of this whole process, all threads, exited ones included.
fn cpu_of_self() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Intervals before the steady state.
const WARM_UP: usize = 3;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // cargo bench --list, nextest probing
    }
    if let Err(e) = check_permitted() {
        println!("skipped: {e}");
        return;
    }
    let secs: u64 = std::env::var("FROSTDB_EBPF_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let rates: Vec<u64> = std::env::var("FROSTDB_EBPF_BENCH_HZ")
        .unwrap_or_else(|_| "19,99".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let unwind_mib: u64 = std::env::var("FROSTDB_EBPF_BENCH_UNWIND_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(frostdb_ebpf_ingest::DEFAULT_UNWIND_TABLE_BYTES >> 20);
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .expect("BPF run-time statistics (kernel 5.8+)");
    let dir = tempfile::tempdir().unwrap();
    let binary = spin::build_spin(dir.path());
    let busy = [
        spin::Spin::start(&binary, "mixed"),
        spin::Spin::start(&binary, "mixed"),
    ];
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "sampling all processes, 2 busy programs on {cpus} CPUs, {secs} s per rate, 10 s intervals"
    );
    println!(
        "{:>6} {:>9} {:>14} {:>14} {:>10} {:>14} {:>14}",
        "Hz", "samples", "sampler CPU/s", "BPF CPU/s", "ns/sample", "symb. 1st ms", "steady med ms"
    );
    for hz in rates {
        let (tx, rx) = mpsc::channel::<Interval>();
        let config = Config::default()
            .frequency_hz(hz)
            .target(Target::All)
            .unwind_table_bytes(unwind_mib << 20);
        let cpu0 = cpu_of_self();
        let wall0 = Instant::now();
        let sampler = Sampler::start(config, tx).expect("sampler starts");
        let start_cpu = (cpu_of_self() - cpu0).as_secs_f64();
        let mut intervals: Vec<Interval> = Vec::new();
        // Steady state: after three intervals. The first symbolizes what runs; the next
        // two symbolize the sampler's own work of the one before (its binary's DWARF).
        let (mut cpu1, mut wall1) = (Duration::ZERO, Instant::now());
        for interval in rx.iter().take((secs / 10).max(4) as usize) {
            intervals.push(interval);
            if intervals.len() == WARM_UP {
                (cpu1, wall1) = (cpu_of_self(), Instant::now());
            }
        }
        let steady = (cpu_of_self() - cpu1).as_secs_f64() / wall1.elapsed().as_secs_f64();
        let stats = sampler.stop().unwrap();
        let wall = wall0.elapsed().as_secs_f64();
        let cpu = (cpu_of_self() - cpu0).as_secs_f64();
        let bpf = stats.kernel.bpf_run_time.as_secs_f64();
        let symbolize: Vec<Duration> = intervals.iter().map(|i| i.symbolize).collect();
        println!(
            "{hz:>6} {:>9} {:>13.5}s {:>13.5}s {:>10.0} {:>14.1} {:>14.1}",
            stats.samples,
            cpu / wall,
            bpf / wall,
            bpf * 1e9 / stats.kernel.bpf_runs.max(1) as f64,
            symbolize.first().map_or(0.0, |d| d.as_secs_f64() * 1e3),
            median(symbolize[WARM_UP.min(symbolize.len())..].to_vec()).as_secs_f64() * 1e3,
        );
        if std::env::var_os("FROSTDB_EBPF_BENCH_VERBOSE").is_some() {
            for i in &intervals {
                println!(
                    "       interval: {} samples, {} processes, symbolize {:.1} ms, build {:.1} ms, drain {:.1} ms, {} addresses ({} cached)",
                    i.samples,
                    i.profiles.len(),
                    i.symbolize.as_secs_f64() * 1e3,
                    i.build.as_secs_f64() * 1e3,
                    i.drain.as_secs_f64() * 1e3,
                    i.addresses.0,
                    i.addresses.1
                );
            }
        }
        let mean = |f: fn(&Interval) -> Duration| {
            intervals[WARM_UP..]
                .iter()
                .map(f)
                .sum::<Duration>()
                .as_secs_f64()
                * 1e3
                / (intervals.len() - WARM_UP).max(1) as f64
        };
        println!(
            "       (steady state {steady:.5} CPU s/s after {WARM_UP} intervals; start-up \
             (load, verify, attach) {:.0} ms CPU; per steady interval: drain {:.1} ms wall, \
             build {:.1} ms)",
            start_cpu * 1e3,
            mean(|i| i.drain),
            mean(|i| i.build),
        );
        println!(
            "       ({:.3}% + {:.3}% of {cpus} CPUs; {} BPF runs incl. idle, {} addresses looked up, {:.0}% from cache)",
            100.0 * cpu / wall / cpus as f64,
            100.0 * bpf / wall / cpus as f64,
            stats.kernel.bpf_runs,
            stats.symbolize.addresses,
            100.0 * stats.symbolize.cache_hits as f64 / stats.symbolize.addresses.max(1) as f64,
        );
        let t = stats.tables;
        let walks = stats.kernel.user_walks;
        println!(
            "       unwind tables ({unwind_mib} MiB): {} files loaded ({} failed, {} did not fit), \
             at the end {} processes / {} files / {} rows / {:.1} MiB; built in {:.0} ms \
             in all; user walks: {} by frame pointer, {} with tables ({} whole, ends {:?})",
            t.files_loaded,
            t.files_failed,
            t.files_not_loaded_full,
            t.processes,
            t.files,
            t.rows,
            t.bytes as f64 / (1 << 20) as f64,
            t.build_time.as_secs_f64() * 1e3,
            walks.frame_pointers,
            walks.unwound_total(),
            walks.complete(),
            walks.unwound,
        );
        let amortized = steady + bpf / wall + t.build_time.as_secs_f64() / 600.0;
        println!(
            "       amortized over 10 minutes: steady sampler {:.3}% + BPF {:.3}% + table building \
             {:.3}% = {:.3}% of one core",
            100.0 * steady,
            100.0 * bpf / wall,
            100.0 * t.build_time.as_secs_f64() / 600.0,
            100.0 * amortized,
        );
    }
    drop(busy);
}
