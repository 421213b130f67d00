//! The sampler for real: BPF loaded into this kernel, sampling a C program that spins in
//! known functions. Needs root (CI runs as root); elsewhere each test prints why it skips.

use std::process::Command;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use frostdb_core::{Db, DbOptions};
use frostdb_ebpf_ingest::{
    Config, DEFAULT_UNWIND_TABLE_BYTES, Error, Interval, ProcessProfile, Sampler, Sink, Stats,
    StoreSink, Target, UserEnd, check_permitted,
};
use frostdb_pprof::report::top::TopTable;
use frostdb_pprof::{ProfileStore, StoreOptions, proto};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

mod chain;
mod spin;

use chain::{C_CHAIN, LATE_CHAIN, RUST_CHAIN, Running, has_chain};
use spin::{Spin, build_spin};

/// Whether this process may load BPF programs; prints why not when it may not.
fn permitted() -> bool {
    match check_permitted() {
        Ok(()) => true,
        Err(e) => {
            // CI runs as root: there the test must run, so not being able to is a failure.
            assert!(
                std::env::var("CI").is_err(),
                "BPF is not permitted under CI=true: {e}"
            );
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

/// Function names of a sample, leaf first, split into (kernel, user).
fn frames(p: &proto::Profile, s: &proto::Sample) -> (Vec<String>, Vec<String>) {
    let (mut kernel, mut user) = (Vec::new(), Vec::new());
    for id in &s.location_id {
        let loc = &p.location[*id as usize - 1];
        let mapping = &p.mapping[loc.mapping_id as usize - 1];
        let in_kernel = p.string_table[mapping.filename as usize] == "[kernel.kallsyms]";
        let names: Vec<String> = if loc.line.is_empty() {
            vec![format!("{:#x}", loc.address)]
        } else {
            loc.line
                .iter()
                .map(|l| {
                    let f = &p.function[l.function_id as usize - 1];
                    p.string_table[f.name as usize].clone()
                })
                .collect()
        };
        if in_kernel { &mut kernel } else { &mut user }.extend(names);
    }
    (kernel, user)
}

#[test]
fn a_spinning_program_is_seen_in_its_functions_with_kernel_frames_beneath() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spin = Spin::start(&build_spin(dir.path()), "mixed");
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = Arc::new(ProfileStore::open(db, StoreOptions::default()).unwrap());
    // Tee: every interval is stored through the pprof normalizer and kept for inspection.
    let (tx, rx) = mpsc::channel::<Interval>();
    let mut stored = StoreSink::new(store.clone()).label("node", "test");
    let sink = move |interval: Interval| {
        stored.write(interval.clone())?;
        tx.send(interval).map_err(|e| e.to_string().into())
    };
    let config = Config::default()
        .frequency_hz(99)
        .interval(Duration::from_millis(500))
        .target(Target::Pids(vec![spin.pid()]));
    let sampler = Sampler::start(config, sink).expect("the sampler starts as root");
    let mut profiles: Vec<ProcessProfile> = Vec::new();
    let mut samples = 0;
    for interval in rx.iter().take(40) {
        samples += interval.samples;
        profiles.extend(interval.profiles);
        if samples >= 200 {
            break;
        }
    }
    let stats = sampler.stop().unwrap();
    profiles.extend(rx.try_iter().flat_map(|i| i.profiles));
    assert!(samples >= 200, "only {samples} samples in 40 intervals");
    assert_eq!(stats.sink_errors, 0);

    // Only the target was sampled, labelled as what it is.
    assert!(profiles.iter().all(|p| p.pid == spin.pid()));
    let p0 = &profiles[0];
    assert_eq!(p0.info.comm, "spin");
    assert!(p0.info.exe.ends_with("/spin"), "{}", p0.info.exe);
    let labels = p0.labels();
    assert!(labels.contains(&("pid".into(), spin.pid().to_string())));

    let (mut total, mut outer, mut leaf_user, mut with_kernel, mut kernel_named) = (0, 0, 0, 0, 0);
    let mut kernel_example = Vec::new();
    for p in &profiles {
        for s in &p.profile.sample {
            let n = s.value[0] as u64;
            assert_eq!(
                s.value[1],
                s.value[0] * p.profile.period,
                "cpu = samples x period"
            );
            let (kernel, user) = frames(&p.profile, s);
            total += n;
            if user.iter().any(|f| f == "frostdb_spin_outer") {
                outer += n;
            }
            if user.first().map(String::as_str) == Some("frostdb_spin_user") {
                leaf_user += n;
            }
            if !kernel.is_empty() {
                with_kernel += n;
                if kernel.iter().all(|f| !f.starts_with("0x")) {
                    kernel_named += n;
                }
                if kernel_example.is_empty() && user.iter().any(|f| f == "frostdb_spin_outer") {
                    kernel_example = kernel.clone();
                }
            }
        }
    }
    eprintln!(
        "{total} samples: {outer} under frostdb_spin_outer, {leaf_user} in frostdb_spin_user, \
         {with_kernel} with kernel frames ({kernel_named} all named), e.g. {kernel_example:?}"
    );
    // The last, partial interval arrives after the loop: at least what the loop counted.
    assert!(total >= samples, "{total} < {samples}");
    assert!(
        outer * 10 >= total * 9,
        "frostdb_spin_outer in {outer} of {total}"
    );
    assert!(
        leaf_user * 10 >= total * 3,
        "frostdb_spin_user is the leaf of {leaf_user} of {total}"
    );
    assert!(
        with_kernel * 20 >= total,
        "kernel frames in only {with_kernel} of {total}"
    );
    assert!(
        kernel_named * 10 >= with_kernel * 9,
        "kernel frames unsymbolized"
    );
    assert!(
        !kernel_example.is_empty(),
        "no kernel stack beneath the program's frames"
    );

    // The store has them too, as profile type ebpf_cpu with the process's labels.
    let selector = Selector::parse(&format!(
        "ebpf_cpu:samples:count:cpu:nanoseconds{{comm=\"spin\",pid=\"{}\",node=\"test\"}}",
        spin.pid()
    ))
    .unwrap();
    let merged = store.merge(&selector, TimeRange::ALL).unwrap();
    assert_eq!(merged.total() as u64, total);
    let top = TopTable::build(&merged).render();
    assert!(top.contains("frostdb_spin_user"), "{top}");
}

#[test]
fn every_sample_is_counted_once_across_buffer_swaps() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let binary = build_spin(dir.path());
    let spins = [Spin::start(&binary, "user"), Spin::start(&binary, "user")];
    let frequency = 199;
    let (tx, rx) = mpsc::channel::<Interval>();
    // Short intervals: many swaps while both CPUs are busy.
    let config = Config::default()
        .frequency_hz(frequency)
        .interval(Duration::from_millis(200))
        .target(Target::Pids(spins.iter().map(Spin::pid).collect()));
    let sampler = Sampler::start(config, tx).unwrap();
    let started = std::time::Instant::now();
    let cpu_before: Vec<f64> = spins.iter().map(Spin::cpu_seconds).collect();
    let mut intervals: Vec<Interval> = rx.iter().take(15).collect();
    let stats = sampler.stop().unwrap();
    let cpu: Vec<f64> = spins
        .iter()
        .zip(&cpu_before)
        .map(|(s, b)| s.cpu_seconds() - b)
        .collect();
    let wall = started.elapsed().as_secs_f64();
    intervals.extend(rx.try_iter());

    // Exact: what the kernel recorded per buffer is what was read, nothing was dropped,
    // and every read sample is in exactly one process profile.
    assert_eq!(
        stats.unaccounted, 0,
        "a sample was lost or counted twice at a swap"
    );
    assert_eq!(stats.dropped, 0);
    // Every sample's stacks were found, and every read entry was cleared.
    assert_eq!((stats.missing_stacks, stats.stale_entries), (0, 0));
    // Both programs always have a user stack, and the stack maps never filled.
    assert_eq!(
        (stats.kernel.no_user_stack, stats.kernel.stacks_full),
        (0, 0)
    );
    assert_eq!(stats.intervals as usize, intervals.len());
    let read: u64 = intervals.iter().map(|i| i.samples).sum();
    assert_eq!(read, stats.samples);
    let in_profiles: u64 = intervals
        .iter()
        .flat_map(|i| &i.profiles)
        .map(|p| p.samples)
        .sum();
    assert_eq!(in_profiles, read);

    // Approximate: samples = frequency x CPU seconds, per process, within 10% (the CPU
    // times are read a few milliseconds off the sampling window, at 10 ms resolution).
    for (spin, cpu) in spins.iter().zip(&cpu) {
        let got: u64 = intervals
            .iter()
            .flat_map(|i| &i.profiles)
            .filter(|p| p.pid == spin.pid())
            .map(|p| p.samples)
            .sum();
        let expected = cpu * frequency as f64;
        eprintln!(
            "pid {}: {got} samples, {cpu:.2} CPU s x {frequency} Hz = {expected:.0} expected \
             ({:.3}); wall {wall:.2} s x {frequency} Hz = {:.0}",
            spin.pid(),
            got as f64 / expected,
            wall * frequency as f64
        );
        assert!(
            (got as f64 - expected).abs() <= expected * 0.10,
            "pid {}: {got} samples for {expected:.0} expected",
            spin.pid()
        );
    }
}

/// A sink that panics loses its interval, not the sampler: the next interval comes, and
/// the sampler's health says what was lost (it said nothing until stopped, long after).
#[test]
fn a_panicking_sink_loses_its_interval_and_sampling_goes_on() {
    if !permitted() {
        return;
    }
    let (tx, rx) = mpsc::channel::<Interval>();
    let mut first = true;
    let sink = move |interval: Interval| -> Result<(), frostdb_ebpf_ingest::SinkError> {
        if std::mem::take(&mut first) {
            panic!("a sink bug");
        }
        tx.send(interval).map_err(|e| e.to_string().into())
    };
    let config = Config::default()
        .frequency_hz(99)
        .interval(Duration::from_millis(100))
        .target(Target::Pids(vec![std::process::id()]));
    let sampler = Sampler::start(config, sink).expect("the sampler starts as root");
    let health = sampler.health();
    rx.recv_timeout(Duration::from_secs(60))
        .expect("an interval after the one whose sink panicked");
    let now = health.get();
    assert!(now.running, "{now:?}");
    assert_eq!(now.failed_intervals, 1, "{now:?}");
    assert!(
        now.last_error.as_deref().unwrap().contains("a sink bug"),
        "{now:?}"
    );
    let stats = sampler.stop().unwrap();
    assert_eq!(stats.sink_errors, 1);
    assert!(!health.get().running);
}

#[test]
fn a_bad_configuration_is_an_error_not_a_panic() {
    let sink = |_: Interval| Ok(());
    let err = Sampler::start(Config::default().frequency_hz(0), sink).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    if check_permitted().is_ok() {
        let err = Sampler::start(
            Config::default().target(Target::Cgroup("/nonexistent/cgroup".into())),
            sink,
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/cgroup"), "{err}");
    }
}

#[test]
fn without_privileges_starting_is_a_clear_error_not_a_panic() {
    let root = check_permitted().is_ok();
    if std::env::var_os("FROSTDB_EBPF_UNPRIVILEGED").is_some() || !root {
        // An unprivileged process: the sampler says what is missing.
        let err = Sampler::start(Config::default(), |_: Interval| Ok(())).unwrap_err();
        assert!(matches!(err, Error::NotPermitted(_)), "{err}");
        assert!(err.to_string().contains("CAP_BPF"), "{err}");
        return;
    }
    // As root: run this very test again as nobody, with no capabilities.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_privileges_starting_is_a_clear_error_not_a_panic",
            "--nocapture",
        ])
        .env("FROSTDB_EBPF_UNPRIVILEGED", "1")
        .output()
        .expect("setpriv (util-linux) runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Samples `pid` at 499 Hz in 250 ms intervals with `unwind_table_bytes` of unwind tables.
fn sample(pid: u32, unwind_table_bytes: u64) -> (Sampler, mpsc::Receiver<Interval>) {
    sample_all(vec![pid], unwind_table_bytes)
}

/// [`sample`] for several processes.
fn sample_all(pids: Vec<u32>, unwind_table_bytes: u64) -> (Sampler, mpsc::Receiver<Interval>) {
    let (tx, rx) = mpsc::channel::<Interval>();
    let config = Config::default()
        .frequency_hz(499)
        .interval(Duration::from_millis(250))
        .target(Target::Pids(pids))
        .unwind_table_bytes(unwind_table_bytes);
    let sampler = Sampler::start(config, tx).expect("the sampler starts as root");
    (sampler, rx)
}

/// The bytes of unwind tables `pid` takes alone.
fn table_bytes_of(pid: u32) -> u64 {
    let (sampler, rx) = sample(pid, DEFAULT_UNWIND_TABLE_BYTES);
    let tables = rx.recv().unwrap().tables;
    sampler.stop().unwrap();
    assert_eq!(tables.processes, 1, "{tables:?}");
    tables.bytes
}

/// Intervals from `rx` until they hold `min` samples (at most 80 intervals).
fn collect(rx: &mpsc::Receiver<Interval>, min: u64) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut samples = 0;
    for interval in rx.iter().take(80) {
        samples += interval.samples;
        out.push(interval);
        if samples >= min {
            break;
        }
    }
    assert!(samples >= min, "only {samples} samples in 80 intervals");
    out
}

/// The user frames of every sample (leaf first, with its count), and whether it had kernel
/// frames.
fn user_stacks(intervals: &[Interval]) -> Vec<(Vec<String>, bool, u64)> {
    intervals
        .iter()
        .flat_map(|i| &i.profiles)
        .flat_map(|p| {
            p.profile.sample.iter().map(|s| {
                let (kernel, user) = frames(&p.profile, s);
                (user, !kernel.is_empty(), s.value[0] as u64)
            })
        })
        .collect()
}

/// A stack is whole when it holds `chain` and goes on to `_start`, the outermost frame.
fn whole(user: &[String], chain: &[&str]) -> bool {
    has_chain(user, chain) && user.last().is_some_and(|f| f == "_start")
}

/// (samples whose user stack is whole, samples, the most frequent stack that is not).
fn count_whole(intervals: &[Interval], chain: &[&str]) -> (u64, u64, Vec<String>) {
    let (mut ok, mut total) = (0, 0);
    let mut broken: std::collections::HashMap<Vec<String>, u64> = Default::default();
    for (user, _, n) in user_stacks(intervals) {
        total += n;
        if whole(&user, chain) {
            ok += n;
        } else {
            *broken.entry(user).or_default() += n;
        }
    }
    let worst = broken
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(s, _)| s)
        .unwrap_or_default();
    (ok, total, worst)
}

/// At least 95% of the samples of `intervals` carry `chain` whole.
fn assert_whole(what: &str, intervals: &[Interval], chain: &[&str]) {
    let (ok, total, worst) = count_whole(intervals, chain);
    eprintln!("{what}: {ok} of {total} samples whole; most frequent broken stack: {worst:?}");
    assert!(
        ok * 100 >= total * 95,
        "{what}: only {ok} of {total} samples carry {chain:?} whole; e.g. {worst:?}"
    );
}

/// Every user stack the sampler walked of a listed process was walked with tables.
fn assert_unwound_with_tables(stats: &Stats) {
    let walks = stats.kernel.user_walks;
    eprintln!("user walks: {walks:?}; tables: {:?}", stats.tables);
    assert_eq!(walks.frame_pointers, 0, "{walks:?}");
    assert!(walks.unwound_total() > 0, "{walks:?}");
}

/// Walked by frame pointer only, as the sampler did before it had tables, fewer than half
/// of `pid`'s samples carry `chain` whole: the program really has no frame pointers, so
/// the tests with tables prove something.
fn assert_frame_pointers_break(pid: u32, chain: &[&str]) {
    let (sampler, rx) = sample(pid, 0);
    let intervals = collect(&rx, 200);
    sampler.stop().unwrap();
    let (ok, total, worst) = count_whole(&intervals, chain);
    eprintln!("frame pointers only: {ok} of {total} samples whole; e.g. {worst:?}");
    assert!(
        ok * 2 < total,
        "{ok} of {total} samples whole by frame pointer: the program keeps them after all"
    );
}

#[test]
fn a_c_chain_without_frame_pointers_is_sampled_whole_through_its_library() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (program, _) = chain::build_chain(dir.path());
    let running = Running::start(&program, &["spin"]);
    let pid = running.pid();

    assert_frame_pointers_break(pid, &C_CHAIN);

    // With tables, loaded before the first sample.
    let (sampler, rx) = sample(pid, DEFAULT_UNWIND_TABLE_BYTES);
    let intervals = collect(&rx, 400);
    assert_whole("C chain", &intervals, &C_CHAIN);
    let loaded = intervals.last().unwrap().tables;
    // chain, libchain.so, libc and the dynamic loader, at least.
    assert!(loaded.processes == 1 && loaded.files >= 4, "{loaded:?}");
    assert_eq!(loaded.bytes % 4096, 0);
    assert!(loaded.bytes >= loaded.rows * 16, "{loaded:?}");

    // The process exits: its tables go at the next refresh.
    running.stop();
    let after = rx
        .iter()
        .take(20)
        .find(|i| i.tables.processes == 0)
        .expect("the tables of the exited process were dropped within 20 intervals");
    assert_eq!(
        (after.tables.files, after.tables.rows, after.tables.bytes),
        (0, 0, 0)
    );
    assert!(after.tables.files_dropped >= 4, "{:?}", after.tables);
    let stats = sampler.stop().unwrap();
    assert_unwound_with_tables(&stats);
}

/// Samples the C chain running in `mode`, with tables, for 400 samples: the intervals and
/// the sampler's totals.
fn sample_chain(mode: &str) -> (Vec<Interval>, Stats) {
    let dir = tempfile::tempdir().unwrap();
    let (program, _) = chain::build_chain(dir.path());
    let running = Running::start(&program, &[mode]);
    let (sampler, rx) = sample(running.pid(), DEFAULT_UNWIND_TABLE_BYTES);
    let intervals = collect(&rx, 400);
    (intervals, sampler.stop().unwrap())
}

/// Samples whose innermost user frame passes `leaf`, and all samples; prints the leaves.
fn leaf_share(intervals: &[Interval], leaf: impl Fn(&str) -> bool) -> (u64, u64) {
    let mut leaves: std::collections::BTreeMap<String, u64> = Default::default();
    for (u, _, n) in user_stacks(intervals) {
        *leaves
            .entry(u.first().cloned().unwrap_or_default())
            .or_default() += n;
    }
    eprintln!("leaves: {leaves:?}");
    let matching = leaves.iter().filter(|(f, _)| leaf(f)).map(|(_, n)| n).sum();
    (matching, leaves.values().sum())
}

#[test]
fn a_stack_through_a_signal_handler_is_sampled_whole() {
    if !permitted() {
        return;
    }
    let (intervals, stats) = sample_chain("signal-spin");
    // The handler at the leaf, the interrupted chain beneath the signal frame.
    let (handler, total) = leaf_share(&intervals, |f| f == "on_signal_spin");
    assert!(
        handler * 100 >= total * 95,
        "on_signal_spin leads {handler} of {total}"
    );
    assert_whole("through the signal frame", &intervals, &C_CHAIN);
    assert_unwound_with_tables(&stats);
}

#[test]
fn a_rust_release_binary_is_sampled_whole() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let program = chain::build_rust_chain(dir.path());
    let running = Running::start(&program, &["spin"]);
    assert_frame_pointers_break(running.pid(), &RUST_CHAIN);
    let (sampler, rx) = sample(running.pid(), DEFAULT_UNWIND_TABLE_BYTES);
    let intervals = collect(&rx, 400);
    let stats = sampler.stop().unwrap();
    assert_whole("Rust chain", &intervals, &RUST_CHAIN);
    assert_unwound_with_tables(&stats);
}

#[test]
fn a_library_loaded_while_sampling_is_unwound_from_the_next_interval() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (program, library) = chain::build_late(dir.path());
    let mut running = Running::start(&program, &[library.to_str().unwrap()]);
    let (sampler, rx) = sample(running.pid(), DEFAULT_UNWIND_TABLE_BYTES);

    // Before: spinning in waiting() and polling stdin, in and out of the kernel. Samples
    // taken in the kernel unwind from the user registers saved at kernel entry.
    let before = collect(&rx, 300);
    assert_whole("waiting", &before, &["waiting", "main"]);
    let in_kernel: Vec<_> = user_stacks(&before)
        .into_iter()
        .filter(|(_, kernel, _)| *kernel)
        .collect();
    let kernel_total: u64 = in_kernel.iter().map(|(_, _, n)| n).sum();
    let kernel_whole: u64 = in_kernel
        .iter()
        .filter(|(u, _, _)| whole(u, &["waiting", "main"]))
        .map(|(_, _, n)| n)
        .sum();
    eprintln!("samples in the kernel: {kernel_whole} of {kernel_total} whole");
    assert!(
        kernel_total >= 10,
        "only {kernel_total} samples in the kernel"
    );
    assert!(kernel_whole * 100 >= kernel_total * 95);
    let files_before = before.last().unwrap().tables.files;

    // dlopen: the interval that first sees the library's code loads its table.
    running.tell("load");
    let has_leaf = |i: &Interval| {
        user_stacks(std::slice::from_ref(i))
            .iter()
            .any(|(u, _, _)| u.iter().any(|f| f == "chain_lib_leaf"))
    };
    let first = rx
        .iter()
        .take(40)
        .find(has_leaf)
        .expect("the library's code is sampled within 40 intervals");
    assert!(first.tables.files > files_before, "{:?}", first.tables);
    let after = collect(&rx, 400);
    let stats = sampler.stop().unwrap();
    assert_whole("after dlopen", &after, &LATE_CHAIN);
    assert_unwound_with_tables(&stats);
}

#[test]
fn when_tables_do_not_fit_the_process_sampled_longest_ago_makes_room() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (c_program, _) = chain::build_chain(dir.path());
    let rust_program = chain::build_rust_chain(dir.path());
    // The C chain sleeps (never sampled after it is loaded); the Rust one spins.
    let sleeping = Running::start(&c_program, &["sleep"]);
    let spinning = Running::start(&rust_program, &["spin"]);
    // Room for either set of files, not both: each has files the other does not map.
    let (c_bytes, rust_bytes) = (
        table_bytes_of(sleeping.pid()),
        table_bytes_of(spinning.pid()),
    );
    let room = c_bytes.max(rust_bytes);
    // Listed processes load in order: the C chain fills the room first, so the Rust binary's
    // files do not fit until the idle C chain is dropped, the next time Rust is sampled.
    let (sampler, rx) = sample_all(vec![sleeping.pid(), spinning.pid()], room);
    let first = rx.recv().unwrap();
    assert!(
        first.tables.files_not_loaded_full >= 1,
        "{:?}",
        first.tables
    );
    let made_room = rx
        .iter()
        .take(20)
        .find(|i| i.tables.processes_evicted >= 1)
        .expect("the idle process was dropped within 20 intervals");
    assert_eq!(made_room.tables.processes, 1, "{:?}", made_room.tables);
    // The samples taken while the tables were being loaded are in the next interval.
    rx.recv().unwrap();
    let intervals = collect(&rx, 400);
    let stats = sampler.stop().unwrap();
    let t = intervals.last().unwrap().tables;
    eprintln!("{c_bytes} + {rust_bytes} bytes of tables in {room}: {t:?}");
    assert!(t.processes_evicted >= 1, "{t:?}");
    assert_eq!(t.processes, 1, "{t:?}");
    assert!(t.bytes <= room, "{t:?}");
    assert_whole("Rust chain after making room", &intervals, &RUST_CHAIN);
    assert!(stats.kernel.user_walks.unwound_total() > 0);
}

/// A file whose table is larger than the whole table space is walked by frame pointer,
/// once and for all while it is mapped: not compiled again every interval, and no other
/// process's tables are dropped for it. Before, each interval read and compiled it again
/// and dropped every process not sampled in it.
#[test]
fn a_table_larger_than_the_whole_space_is_not_built_again_every_interval() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rust_program = chain::build_rust_chain(dir.path());
    let spinning = Running::start(&rust_program, &["spin"]);
    // One chunk of 256 rows: the binary's table and libc's are larger.
    let (sampler, rx) = sample(spinning.pid(), 4096);
    let first = rx
        .iter()
        .take(20)
        .find(|i| i.tables.files_too_large >= 1)
        .expect("a file too large for the space within 20 intervals")
        .tables;
    let later: Vec<_> = rx.iter().take(8).map(|i| i.tables).collect();
    sampler.stop().unwrap();
    let last = later.last().unwrap();
    assert_eq!(last.files_too_large, first.files_too_large, "{later:?}");
    assert_eq!(last.files_not_loaded_full, 0, "{last:?}");
    assert_eq!(last.processes_evicted, 0, "{last:?}");
}

/// A build too large for the table space is remembered after its last process exits: the
/// next process of it is walked by frame pointer without its table being compiled again
/// (for a debug build of the server, 16 s of CPU at each start, during which no interval
/// was stored).
#[test]
fn a_build_too_large_for_the_space_is_not_built_again_for_its_next_process() {
    if !permitted() {
        return;
    }
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let rust_program = chain::build_rust_chain(dir.path());
    let first = Running::start(&rust_program, &["spin"]);
    // The next process of the build: a shell that becomes it when told, once the first is
    // gone (a listed process gets its tables at the start, so it must exist then).
    let mut next = Command::new("sh")
        .arg("-c")
        .arg("read go; exec \"$0\" spin")
        .arg(&rust_program)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let next_pid = next.id();
    let (sampler, rx) = sample_all(vec![first.pid(), next_pid], 4096);
    rx.iter()
        .take(20)
        .find(|i| i.tables.files_too_large >= 1)
        .expect("a file too large for the space within 20 intervals");
    let too_large = rx.recv().unwrap().tables.files_too_large;
    drop(first);
    // Each interval forgets the processes that exited: its build is dropped after this.
    let _ = rx.iter().take(2).count();
    writeln!(next.stdin.as_mut().unwrap(), "go").unwrap();
    let mut line = String::new();
    BufReader::new(next.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    // The shell read its line asleep, unsampled: a sample of it now is of the program.
    rx.iter()
        .take(20)
        .find(|i| i.profiles.iter().any(|p| p.pid == next_pid))
        .expect("the next process was sampled within 20 intervals");
    let later: Vec<_> = rx.iter().take(3).map(|i| i.tables).collect();
    sampler.stop().unwrap();
    let _ = next.kill();
    let _ = next.wait();
    assert_eq!(
        later.last().unwrap().files_too_large,
        too_large,
        "compiled again: {later:?}"
    );
}

#[test]
fn a_program_without_eh_frame_is_walked_by_its_frame_pointers_through_libc() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The frame-pointer spin program with its CFI removed: no table for its own code, so
    // its frames are walked by frame pointer, libc's (__libc_start_call_main) by table.
    let binary = build_spin(dir.path());
    let status = Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .arg(&binary)
        .status()
        .expect("objcopy runs (binutils; scripts/setup.sh installs it)");
    assert!(status.success());
    let spin = Spin::start(&binary, "user");
    let (sampler, rx) = sample(spin.pid(), DEFAULT_UNWIND_TABLE_BYTES);
    let intervals = collect(&rx, 400);
    let stats = sampler.stop().unwrap();
    assert_whole(
        "frame pointers without CFI",
        &intervals,
        &["frostdb_spin_outer", "main"],
    );
    assert_unwound_with_tables(&stats);
}

#[test]
fn a_program_exec_d_while_sampling_is_unwound_from_the_next_interval() {
    if !permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (program, _) = chain::build_chain(dir.path());
    // A shell that becomes the chain when told: the same pid, other mappings.
    let script = "echo ready; read line; exec \"$0\" spin > /dev/null";
    let mut running = Running::start(
        "/bin/sh".as_ref(),
        &["-c", script, program.to_str().unwrap()],
    );
    let (sampler, rx) = sample(running.pid(), DEFAULT_UNWIND_TABLE_BYTES);
    let sh = rx.recv().unwrap().tables;
    running.tell("exec");
    let has_leaf = |i: &Interval| {
        user_stacks(std::slice::from_ref(i))
            .iter()
            .any(|(u, _, _)| u.iter().any(|f| f == "chain_lib_leaf"))
    };
    let first = rx
        .iter()
        .take(40)
        .find(has_leaf)
        .expect("the exec'd program is sampled within 40 intervals");
    // Its interval's refresh saw the new mappings and loaded the chain's files.
    assert!(
        first.tables.files_loaded > sh.files_loaded,
        "{sh:?} then {:?}",
        first.tables
    );
    let after = collect(&rx, 400);
    let stats = sampler.stop().unwrap();
    assert_whole("after exec", &after, &C_CHAIN);
    // The exec dropped the shell's mappings in the kernel at once: until the chain's were
    // loaded its samples were walked by frame pointer, and no table walk ever looked the
    // chain's addresses up in the shell's mappings (they would end outside any file).
    let walks = stats.kernel.user_walks;
    eprintln!("user walks: {walks:?}");
    assert!(walks.frame_pointers > 0, "{walks:?}");
    assert_eq!(walks.unwound[UserEnd::NotMapped as usize], 0, "{walks:?}");
    assert!(walks.complete() > 0, "{walks:?}");
}

#[test]
fn a_stack_through_the_vdso_is_sampled_whole() {
    if !permitted() {
        return;
    }
    // The leaf reads the clock in a loop: most samples land in the vDSO, which is in no
    // file; its table is built from its image in the process's memory.
    let (intervals, stats) = sample_chain("clock");
    let (in_vdso, total) = leaf_share(&intervals, |f| f.contains("clock_gettime"));
    assert!(
        in_vdso * 2 >= total,
        "clock_gettime leads {in_vdso} of {total}"
    );
    assert_whole("through the vDSO", &intervals, &C_CHAIN);
    assert_unwound_with_tables(&stats);
    assert_eq!(
        stats.kernel.user_walks.unwound[UserEnd::NotMapped as usize],
        0
    );
}
