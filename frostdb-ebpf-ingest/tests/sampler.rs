//! The sampler for real: BPF loaded into this kernel, sampling a C program that spins in
//! known functions. Needs root (CI runs as root); elsewhere each test prints why it skips.

use std::process::Command;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use frostdb_core::{Db, DbOptions};
use frostdb_ebpf_ingest::{
    Config, Error, Interval, ProcessProfile, Sampler, Sink, StoreSink, Target, check_permitted,
};
use frostdb_pprof::report::top::TopTable;
use frostdb_pprof::{ProfileStore, StoreOptions, proto};
use frostdb_query::Selector;
use frostdb_query::profile::TimeRange;

mod spin;

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
    let config = Config {
        frequency_hz: 99,
        interval: Duration::from_millis(500),
        target: Target::Pids(vec![spin.pid()]),
    };
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
    let config = Config {
        frequency_hz: frequency,
        interval: Duration::from_millis(200),
        target: Target::Pids(spins.iter().map(Spin::pid).collect()),
    };
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

#[test]
fn a_bad_configuration_is_an_error_not_a_panic() {
    let sink = |_: Interval| Ok(());
    let err = Sampler::start(
        Config {
            frequency_hz: 0,
            ..Config::default()
        },
        sink,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    if check_permitted().is_ok() {
        let err = Sampler::start(
            Config {
                target: Target::Cgroup("/nonexistent/cgroup".into()),
                ..Config::default()
            },
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
