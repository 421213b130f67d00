//! JFR recordings as profiles: one the JDK writes here (`-XX:StartFlightRecording` on
//! `tests/jfr/Main.java`, a program with a hot, an allocating and a contended method), whose
//! totals we check against the JDK's own reader (`jfr print --json`), and async-profiler's,
//! from grafana/jfr-parser's test data (`testdata/jfr/`), which must make the profiles
//! Pyroscope makes of them (its golden files), labels included.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use frostdb_pprof::Limits;
use frostdb_pprof::convert::jfr::{self, Recording};
use frostdb_pprof::proto::Profile;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/jfr")
}

fn gunzip(path: &Path) -> Vec<u8> {
    frostdb_pprof::inflate(&std::fs::read(path).unwrap(), 64 << 20)
        .unwrap()
        .into_owned()
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(testdata().join(name)).unwrap()
}

fn string(p: &Profile, i: i64) -> &str {
    &p.string_table[i as usize]
}

/// A location's `function:line`.
fn frames(p: &Profile) -> HashMap<u64, (String, i64)> {
    let functions: HashMap<u64, &str> = p
        .function
        .iter()
        .map(|f| (f.id, string(p, f.name)))
        .collect();
    p.location
        .iter()
        .map(|l| {
            let line = &l.line[0];
            (l.id, (functions[&line.function_id].to_owned(), line.line))
        })
        .collect()
}

/// The profile's stacks as Pyroscope's collapsed goldens write them: root first,
/// `function:line` joined by `;`, the values summed per stack, stacks of zeros left out.
fn collapsed(p: &Profile) -> BTreeMap<String, Vec<i64>> {
    let frames = frames(p);
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for s in &p.sample {
        let key: Vec<String> = s
            .location_id
            .iter()
            .rev()
            .map(|id| format!("{}:{}", frames[id].0, frames[id].1))
            .collect();
        let v = out
            .entry(key.join(";"))
            .or_insert_with(|| vec![0; s.value.len()]);
        for (a, b) in v.iter_mut().zip(&s.value) {
            *a += b;
        }
    }
    out.retain(|_, v| v.iter().any(|&x| x != 0));
    out
}

/// A golden collapsed file: `stack [v1 v2]` lines.
fn golden(name: &str) -> BTreeMap<String, Vec<i64>> {
    let text = String::from_utf8(gunzip(&testdata().join(name))).unwrap();
    text.lines()
        .map(|line| {
            let (stack, values) = line.rsplit_once(" [").unwrap();
            let values = values
                .trim_end_matches(']')
                .split(' ')
                .map(|v| v.parse().unwrap())
                .collect();
            (stack.to_owned(), values)
        })
        .collect()
}

fn types(p: &Profile) -> String {
    p.sample_type
        .iter()
        .map(|t| format!("{}__{}", string(p, t.r#type), string(p, t.unit)))
        .collect::<Vec<_>>()
        .join("+")
}

fn profile<'r>(r: &'r Recording, name: &str, types_: &str) -> &'r Profile {
    let found = r
        .profiles
        .iter()
        .find(|c| c.profile_name == name && types(&c.profile) == types_);
    &found
        .unwrap_or_else(|| {
            let have: Vec<String> = r
                .profiles
                .iter()
                .map(|c| format!("{} {}", c.profile_name, types(&c.profile)))
                .collect();
            panic!("no {name} {types_} profile; have {have:?}")
        })
        .profile
}

/// The ticks per second of a recording's first chunk (its header's bytes 56..64).
fn ticks_per_second(jfr: &[u8]) -> i64 {
    i64::from_be_bytes(jfr[56..64].try_into().unwrap())
}

#[test]
fn async_profiler_recordings_make_the_profiles_pyroscope_makes() {
    let limits = Limits::default();
    // (recording, labels part, [(profile name, sample types, golden file prefix)])
    type Case<'a> = (&'a str, Option<&'a str>, &'a [(&'a str, &'a str, &'a str)]);
    let cases: &[Case<'_>] = &[
        (
            "example.jfr.gz",
            None,
            &[
                (
                    "memory",
                    "alloc_in_new_tlab_objects__count+alloc_in_new_tlab_bytes__bytes",
                    "example_0",
                ),
                (
                    "memory",
                    "alloc_outside_tlab_objects__count+alloc_outside_tlab_bytes__bytes",
                    "example_1",
                ),
                (
                    "mutex",
                    "contentions__count+delay__nanoseconds",
                    "example_2",
                ),
                ("process_cpu", "cpu__nanoseconds", "example_3"),
            ],
        ),
        (
            "wall.jfr.gz",
            None,
            &[
                ("process_cpu", "cpu__nanoseconds", "wall_0"),
                ("wall", "wall__nanoseconds", "wall_1"),
            ],
        ),
        (
            "new_spancontext.jfr.gz",
            Some("new_spancontext.labels.gz"),
            &[("process_cpu", "cpu__nanoseconds", "new_spancontext_0")],
        ),
        (
            "dump1.jfr.gz",
            Some("dump1.labels.pb.gz"),
            &[("process_cpu", "cpu__nanoseconds", "dump1_0")],
        ),
    ];
    for &(file, labels, profiles) in cases {
        let body = read(file);
        let labels = labels.map(read);
        let recording = jfr::convert(&body, labels.as_deref(), 100, &limits)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            recording.profiles.len(),
            profiles.len(),
            "{file}: one profile per golden"
        );
        let tps = ticks_per_second(&gunzip(&testdata().join(file)));
        for &(name, types_, golden_prefix) in profiles {
            let ours = collapsed(profile(&recording, name, types_));
            let theirs = golden(&format!(
                "{golden_prefix}_{name}_{types_}_expected_collapsed.txt.gz"
            ));
            assert_eq!(
                ours.keys().collect::<Vec<_>>(),
                theirs.keys().collect::<Vec<_>>(),
                "{file} {name} {types_}: the same stacks"
            );
            for (stack, want) in &theirs {
                let got = &ours[stack];
                if name == "mutex" {
                    // Pyroscope stores the delay in ticks; we convert each event's to
                    // nanoseconds (rounding down, so up to a nanosecond an event apart).
                    assert_eq!(got[0], want[0], "{file} {stack}: contentions");
                    let ns = (i128::from(want[1]) * 1_000_000_000 / i128::from(tps)) as i64;
                    assert!(
                        (ns - got[1]).abs() <= got[0],
                        "{file} {stack}: delay {} ns, Pyroscope's {} ticks are {ns} ns",
                        got[1],
                        want[1]
                    );
                } else {
                    assert_eq!(got, want, "{file} {name} {stack}");
                }
            }
        }
    }
}

/// Per label set (`k:[v]` sorted, joined by a space), the total of the first value: of our
/// profile, and of a golden `Profile.String()` dump (its `profile_id` is our `span_id`).
fn totals_by_labels(p: &Profile) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in &p.sample {
        let mut labels: Vec<String> = s
            .label
            .iter()
            .map(|l| format!("{}:[{}]", string(p, l.key), string(p, l.str)))
            .collect();
        labels.sort();
        *out.entry(labels.join(" ")).or_insert(0) += s.value[0];
    }
    out
}

fn golden_totals_by_labels(name: &str) -> BTreeMap<String, i64> {
    let text = String::from_utf8(gunzip(&testdata().join(name))).unwrap();
    let mut out = BTreeMap::new();
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .skip(2)
        .take_while(|l| !l.starts_with("Locations"))
        .peekable();
    while let Some(line) = lines.next() {
        let Some((value, _)) = line.trim().split_once(':') else {
            continue;
        };
        let value: i64 = value.parse().unwrap();
        let mut labels = String::new();
        if let Some(next) = lines.peek()
            && next.starts_with("                ")
        {
            let mut parts: Vec<String> = next
                .split_whitespace()
                .map(|l| l.replace("profile_id:", "span_id:"))
                .collect();
            parts.sort();
            labels = parts.join(" ");
            lines.next();
        }
        *out.entry(labels).or_insert(0) += value;
    }
    out
}

#[test]
fn context_ids_and_spans_become_sample_labels() {
    let limits = Limits::default();
    for (file, labels, golden) in [
        (
            "new_spancontext.jfr.gz",
            "new_spancontext.labels.gz",
            "new_spancontext_0_process_cpu_cpu__nanoseconds_expected.txt.gz",
        ),
        (
            "dump1.jfr.gz",
            "dump1.labels.pb.gz",
            "dump1_0_process_cpu_cpu__nanoseconds_expected.txt.gz",
        ),
    ] {
        let recording = jfr::convert(&read(file), Some(&read(labels)), 100, &limits).unwrap();
        let cpu = profile(&recording, "process_cpu", "cpu__nanoseconds");
        let ours = totals_by_labels(cpu);
        let theirs = golden_totals_by_labels(golden);
        assert!(
            theirs.len() > 1,
            "{golden}: the golden has labelled samples"
        );
        assert_eq!(ours, theirs, "{file}: totals per label set");
        // Without the labels part, the same totals in one set.
        let bare = jfr::convert(&read(file), None, 100, &limits).unwrap();
        let bare = totals_by_labels(profile(&bare, "process_cpu", "cpu__nanoseconds"));
        let total: i64 = theirs.values().sum();
        let spans: i64 = bare.values().sum();
        assert_eq!(spans, total, "{file}: the same total without labels");
    }
}

#[test]
fn cut_and_corrupted_recordings_are_errors_naming_the_byte_never_panics() {
    let limits = Limits::default();
    let jfr = gunzip(&testdata().join("example.jfr.gz"));
    // Cut short: the chunk header says more bytes than there are.
    for cut in [1, 10, 67, 68, 1000, jfr.len() / 2, jfr.len() - 1] {
        let e = jfr::convert(&jfr[..cut], None, 100, &limits).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("byte "), "cut at {cut}: {text}");
        assert_eq!(e.kind(), frostdb_core::ErrorKind::InvalidInput, "{text}");
    }
    // Cut short with the header's size made to match: the events and pools end early.
    for cut in [jfr.len() / 3, jfr.len() / 2, jfr.len() - 7] {
        let mut short = jfr[..cut].to_vec();
        short[8..16].copy_from_slice(&(cut as i64).to_be_bytes());
        if let Err(e) = jfr::convert(&short, None, 100, &limits) {
            assert!(e.to_string().contains("byte "), "{e}");
        }
    }
    // Bytes flipped anywhere: `fuzz_corpus.rs` replays the fuzz target on the recordings.
    // A labels part that is not protobuf.
    let e = jfr::convert(&jfr, Some(b"\xff\xff\xff"), 100, &limits).unwrap_err();
    assert!(e.to_string().contains("LabelsSnapshot"), "{e}");
    // Over the decompressed-size limit.
    let small = Limits {
        max_decompressed_bytes: 10_000,
        ..Limits::default()
    };
    let e = jfr::convert(&read("example.jfr.gz"), None, 100, &small).unwrap_err();
    assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded, "{e}");
}

/// Whether the JDK is here; in CI it must be.
fn have_java() -> bool {
    let ok = ["java", "javac", "jfr"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have the JDK (apt-get install openjdk-17-jdk-headless)"
        );
        eprintln!("SKIPPED: java, javac or jfr is not installed (openjdk-17-jdk-headless)");
    }
    ok
}

/// `tests/jfr/Main.java` recorded for `millis` with the JDK's profiling settings, every
/// monitor wait and both kinds of allocation recorded.
fn record(dir: &Path, millis: u64) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jfr/Main.java");
    let status = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success(), "javac failed");
    let recording = dir.join("main.jfr");
    let output = Command::new("java")
        .arg(format!(
            "-XX:StartFlightRecording=filename={},settings=profile,\
             jdk.JavaMonitorEnter#threshold=0ms,jdk.ThreadPark#threshold=0ms,\
             jdk.ObjectAllocationInNewTLAB#enabled=true,jdk.ObjectAllocationOutsideTLAB#enabled=true",
            recording.display()
        ))
        .arg("-cp")
        .arg(dir)
        .arg("Main")
        .arg(millis.to_string())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "java failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    recording
}

/// What the JDK's reader says a recording holds, per event type: its events (with a stack
/// or without: those are kept under one `[no stack trace]` frame) and the sums of their
/// `allocationSize`, `tlabSize`, `weight` and `duration` (nanoseconds).
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    events: i64,
    allocation_size: i64,
    tlab_size: i64,
    weight: i64,
    duration_ns: i64,
}

fn jdk_sums(recording: &Path) -> HashMap<String, Sums> {
    let out = Command::new("jfr")
        .args([
            "print",
            "--json",
            "--events",
            "jdk.ExecutionSample,jdk.ObjectAllocationInNewTLAB,jdk.ObjectAllocationOutsideTLAB,jdk.ObjectAllocationSample,jdk.JavaMonitorEnter",
        ])
        .arg(recording)
        .output()
        .unwrap();
    assert!(out.status.success(), "jfr print failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut sums: HashMap<String, Sums> = HashMap::new();
    let mut current: Option<(String, Sums)> = None;
    let mut flush = |current: &mut Option<(String, Sums)>| {
        if let Some((kind, s)) = current.take() {
            let t = sums.entry(kind).or_default();
            t.events += 1;
            t.allocation_size += s.allocation_size;
            t.tlab_size += s.tlab_size;
            t.weight += s.weight;
            t.duration_ns += s.duration_ns;
        }
    };
    let number = |line: &str| -> i64 {
        let v = line.split_once(':').unwrap().1;
        v.trim().trim_end_matches(',').trim().parse().unwrap()
    };
    for line in text.lines().map(str::trim) {
        if let Some(kind) = line.strip_prefix("\"type\": \"jdk.") {
            flush(&mut current);
            let kind = format!("jdk.{}", kind.trim_end_matches(['"', ',', ' ']));
            current = Some((kind, Sums::default()));
            continue;
        }
        let Some((_, s)) = current.as_mut() else {
            continue;
        };
        if line.starts_with("\"allocationSize\":") {
            s.allocation_size = number(line);
        } else if line.starts_with("\"tlabSize\":") {
            s.tlab_size = number(line);
        } else if line.starts_with("\"weight\":") {
            s.weight = number(line);
        } else if let Some(d) = line.strip_prefix("\"duration\": \"PT") {
            let secs = d.trim_end_matches(['"', ',', ' ']).trim_end_matches('S');
            let (whole, frac) = secs.split_once('.').unwrap_or((secs, ""));
            let frac = format!("{frac:0<9}");
            s.duration_ns =
                whole.parse::<i64>().unwrap() * 1_000_000_000 + frac[..9].parse::<i64>().unwrap();
        }
    }
    flush(&mut current);
    sums
}

/// Per leaf function, the sum of value `i`; the function with the most.
fn top(p: &Profile, i: usize) -> (String, i64) {
    let frames = frames(p);
    let mut flat: HashMap<String, i64> = HashMap::new();
    for s in &p.sample {
        *flat.entry(frames[&s.location_id[0]].0.clone()).or_default() += s.value[i];
    }
    flat.into_iter().max_by_key(|(_, v)| *v).unwrap()
}

fn total(p: &Profile, i: usize) -> i64 {
    p.sample.iter().map(|s| s.value[i]).sum()
}

#[test]
fn a_jdk_recording_has_its_hot_allocating_and_contended_methods_on_top() {
    if !have_java() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recording = record(dir.path(), 3000);
    let bytes = std::fs::read(&recording).unwrap();
    let converted = jfr::convert(&bytes, None, 100, &Limits::default()).unwrap();
    let sums = jdk_sums(&recording);
    let sum = |kind: &str| sums.get(kind).copied().unwrap_or_default();

    let cpu = profile(&converted, "process_cpu", "cpu__nanoseconds");
    assert_eq!(top(cpu, 0).0, "Main.hotMethod", "the hot method leads CPU");
    assert_eq!(
        total(cpu, 0),
        sum("jdk.ExecutionSample").events * 10_000_000,
        "a CPU sample is 10 ms at 100 Hz"
    );

    let outside = profile(
        &converted,
        "memory",
        "alloc_outside_tlab_objects__count+alloc_outside_tlab_bytes__bytes",
    );
    assert_eq!(top(outside, 1).0, "Main.allocatingMethod");
    let s = sum("jdk.ObjectAllocationOutsideTLAB");
    assert_eq!(total(outside, 0), s.events);
    assert_eq!(total(outside, 1), s.allocation_size);
    if let Some(s) = sums.get("jdk.ObjectAllocationInNewTLAB") {
        let inside = profile(
            &converted,
            "memory",
            "alloc_in_new_tlab_objects__count+alloc_in_new_tlab_bytes__bytes",
        );
        assert_eq!(total(inside, 0), s.events);
        assert_eq!(total(inside, 1), s.tlab_size);
    }
    let sampled = profile(
        &converted,
        "memory",
        "alloc_sample_objects__count+alloc_sample_bytes__bytes",
    );
    let s = sum("jdk.ObjectAllocationSample");
    assert_eq!((total(sampled, 0), total(sampled, 1)), (s.events, s.weight));

    let lock = profile(&converted, "mutex", "contentions__count+delay__nanoseconds");
    assert_eq!(top(lock, 1).0, "Main.contendedLock", "the lock leads delay");
    let s = sum("jdk.JavaMonitorEnter");
    assert_eq!(total(lock, 0), s.events);
    // The JDK and we each convert an event's ticks to nanoseconds: a nanosecond apart each.
    assert!(
        (total(lock, 1) - s.duration_ns).abs() <= s.events,
        "delay {} ns, the JDK's {} ns",
        total(lock, 1),
        s.duration_ns
    );
    assert!(
        converted.event.is_none(),
        "JDK recordings have no async-profiler event"
    );
}
