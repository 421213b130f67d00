//! The `frostdb` command line, run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shared() -> PathBuf {
    if let Ok(dir) = std::env::var("FROSTDB_SHARED") {
        return PathBuf::from(dir);
    }
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    if beside.exists() {
        beside
    } else {
        PathBuf::from("/work/shared")
    }
}

fn frostdb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frostdb"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn ingest_types_query_and_sql() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let inputs = dir.path().join("in");
    std::fs::create_dir(&inputs).unwrap();
    for f in ["goapp__go119-cpu-2s.pb.gz", "pyroscope__go-cpu.pb.gz"] {
        std::fs::copy(shared().join("testdata/pprof").join(f), inputs.join(f)).unwrap();
    }
    std::fs::write(inputs.join("broken.pb.gz"), [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();

    let out = frostdb(&[
        "ingest",
        "--data",
        s(&data),
        "--name",
        "process_cpu",
        "--label",
        "job=goapp",
        s(&inputs),
    ]);
    let t = text(&out);
    assert!(!out.status.success(), "a rejected file fails the run:\n{t}");
    assert!(t.contains("stored 2 of 3 files"), "{t}");
    assert!(
        t.contains("broken.pb.gz: bad gzip"),
        "names the file and why:\n{t}"
    );
    assert!(
        t.contains("process_cpu:cpu:nanoseconds:cpu:nanoseconds"),
        "{t}"
    );

    let out = frostdb(&["types", "--data", s(&data)]);
    assert!(out.status.success(), "{}", text(&out));
    let types = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        types.lines().collect::<Vec<_>>(),
        [
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "process_cpu:samples:count:cpu:nanoseconds"
        ]
    );

    let selector = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{job=\"goapp\"}";
    let out = frostdb(&["query", "--data", s(&data), selector, "--format", "top"]);
    let top = text(&out);
    assert!(out.status.success(), "{top}");
    assert!(
        top.contains("flat  flat%   sum%        cum   cum%"),
        "{top}"
    );
    assert!(top.contains("crypto/sha256.block"), "{top}");

    let folded = frostdb(&["query", "--data", s(&data), selector, "--format", "folded"]);
    assert!(String::from_utf8_lossy(&folded.stdout).contains("main.main;"));

    let pb = dir.path().join("merged.pb.gz");
    let out = frostdb(&[
        "query",
        "--data",
        s(&data),
        selector,
        "--from",
        "0",
        "--to",
        "now+1h",
        "--format",
        "pprof",
        "-o",
        s(&pb),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(std::fs::read(&pb).unwrap().starts_with(&[0x1f, 0x8b]));

    let svg = frostdb(&[
        "query",
        "--data",
        s(&data),
        selector,
        "--format",
        "flamegraph-svg",
    ]);
    assert!(String::from_utf8_lossy(&svg.stdout).starts_with("<svg"));
    let json = frostdb(&["query", "--data", s(&data), selector, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["root"]["name"], "total");

    // A window before anything was profiled is empty, and says so.
    let empty = frostdb(&[
        "query",
        "--data",
        s(&data),
        selector,
        "--to",
        "1000",
        "--format",
        "folded",
    ]);
    assert!(empty.stdout.is_empty());
    assert!(!empty.status.success(), "an empty answer is an error");
    assert!(
        text(&empty).contains("nothing matches") && text(&empty).contains("stored profiles span"),
        "{}",
        text(&empty)
    );

    let bad = frostdb(&["query", "--data", s(&data), "process_cpu{job=}"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("column"), "{}", text(&bad));
    let bad_time = frostdb(&["query", "--data", s(&data), selector, "--from", "yesterday"]);
    assert!(text(&bad_time).contains("yesterday"), "{}", text(&bad_time));

    let out = frostdb(&[
        "sql",
        "--data",
        s(&data),
        "SELECT \"labels.job\", count(*) AS n FROM samples GROUP BY 1",
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("goapp"), "{t}");
}

#[test]
fn a_database_another_process_holds_is_refused_not_written_behind_its_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let profile = shared().join("testdata/pprof/goapp__go119-cpu-2s.pb.gz");
    let ingest = || frostdb(&["ingest", "--data", s(&data), "--name", "cpu", s(&profile)]);
    assert!(ingest().status.success());

    // This test process holds the database, as a running server holds its tenants'.
    let holder = frostdb_core::Db::open(&data, frostdb_core::DbOptions::default()).unwrap();
    let pid = format!("process {}", std::process::id());
    for out in [ingest(), frostdb(&["types", "--data", s(&data)])] {
        let t = text(&out);
        assert!(!out.status.success(), "refused:\n{t}");
        assert!(
            t.contains("in use by") && t.contains(&pid),
            "names the holder:\n{t}"
        );
        assert!(!t.contains("stored 1 of 1"), "no success reported:\n{t}");
    }
    drop(holder);
    let out = frostdb(&["types", "--data", s(&data)]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn read_commands_find_a_server_tenant_and_never_create_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let server_data = dir.path().join("server");
    let profile = shared().join("testdata/pprof/goapp__go119-cpu-2s.pb.gz");
    // The layout `frostdb serve` writes: a database per tenant under tenants/.
    for tenant in ["anonymous", "team-a"] {
        let db = server_data.join("tenants").join(tenant);
        let out = frostdb(&["ingest", "--data", s(&db), "--name", tenant, s(&profile)]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let types = |args: &[&str]| {
        let mut all = vec!["types", "--data", s(&server_data)];
        all.extend_from_slice(args);
        frostdb(&all)
    };
    // Without --tenant: the default tenant's; with it, that tenant's.
    let out = types(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("anonymous:"), "{}", text(&out));
    let out = types(&["--tenant", "team-a"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("team-a:") && !text(&out).contains("anonymous:"));
    let out = frostdb(&[
        "sql",
        "--data",
        s(&server_data),
        "--tenant",
        "team-a",
        "SELECT count(*) AS n FROM samples",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    // A tenant that is not there names those that are; nothing is created.
    let out = types(&["--tenant", "nobody"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("\"nobody\"") && t.contains("anonymous, team-a"),
        "{t}"
    );
    assert!(!server_data.join("tenants/nobody").exists());
    // A path with no database at all is an error, and stays empty.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for args in [
        vec!["types", "--data", s(&empty)],
        vec![
            "query",
            "--data",
            s(&empty),
            "cpu:samples:count:cpu:nanoseconds{}",
        ],
        vec!["sql", "--data", s(&empty), "SELECT 1"],
    ] {
        let out = frostdb(&args);
        let t = text(&out);
        assert!(!out.status.success(), "{args:?}: {t}");
        assert!(t.contains("no database in"), "{args:?}: {t}");
    }
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "nothing created"
    );
}

/// Every file under `dir`: its path, bytes and modification time.
fn files_of(dir: &Path) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let modified = std::fs::metadata(&p).unwrap().modified().unwrap();
                out.push((p.clone(), std::fs::read(&p).unwrap(), modified));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn ingest_writes_where_the_server_reads_and_reads_change_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = dir.path().join("server");
    std::fs::create_dir_all(server.join("tenants")).unwrap();
    let cpu = shared().join("testdata/pprof/goapp__go119-cpu-2s.pb.gz");
    // A server's data directory: the default tenant's database, or --tenant's.
    let out = frostdb(&["ingest", "--data", s(&server), s(&cpu)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(server.join("tenants/anonymous/manifest.json").exists());
    assert!(!server.join("manifest.json").exists() && !server.join("wal").exists());
    let out = frostdb(&[
        "ingest",
        "--data",
        s(&server),
        "--tenant",
        "team-a",
        s(&cpu),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(server.join("tenants/team-a/manifest.json").exists());
    let out = frostdb(&["types", "--data", s(&server), "--tenant", "team-a"]);
    assert!(
        text(&out).contains("process_cpu:cpu:nanoseconds"),
        "named as Pyroscope names a CPU profile: {}",
        text(&out)
    );

    // Read commands open read-only: not one byte or time of any file changes.
    let before = files_of(&server);
    for args in [
        vec!["types", "--data", s(&server)],
        vec![
            "query",
            "--data",
            s(&server),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        ],
        vec!["sql", "--data", s(&server), "SELECT count(*) FROM samples"],
    ] {
        let out = frostdb(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    }
    assert!(before == files_of(&server), "a read command changed a file");

    // SQL refuses what the server refuses, with its message.
    for q in [
        "DROP TABLE samples",
        "INSERT INTO samples SELECT * FROM samples",
        "SET x = 1",
    ] {
        let out = frostdb(&["sql", "--data", s(&server), q]);
        assert!(!out.status.success(), "{q}: {}", text(&out));
        assert!(text(&out).contains("not supported"), "{q}: {}", text(&out));
    }
    assert!(
        before == files_of(&server),
        "a refused statement changed a file"
    );

    // A missing input creates nothing; nor does a directory of other files.
    let fresh = dir.path().join("fresh");
    let out = frostdb(&[
        "ingest",
        "--data",
        s(&fresh),
        s(&dir.path().join("nope.pb.gz")),
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("nope.pb.gz"), "{}", text(&out));
    assert!(!fresh.exists(), "no database for a failed ingest");
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "x").unwrap();
    let out = frostdb(&["ingest", "--data", s(&other), s(&cpu)]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("holds files but no database"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1);
}

#[test]
fn no_silent_empty_answers_and_no_unselectable_names() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let pprof = shared().join("testdata/pprof");
    let cpu = pprof.join("goapp__go119-cpu-2s.pb.gz");
    let heap = pprof.join("goapp__go119-heap.pb.gz");
    let out = frostdb(&[
        "ingest",
        "--data",
        s(&data),
        "--label",
        "job=api",
        s(&cpu),
        s(&heap),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let query = |selector: &str, extra: &[&str]| {
        let mut args = vec!["query", "--data", s(&data), selector];
        args.extend_from_slice(extra);
        frostdb(&args)
    };
    let fails_with = |out: Output, wanted: &[&str]| {
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(out.stdout.is_empty(), "{t}");
        for w in wanted {
            assert!(t.contains(w), "{w:?} missing from:\n{t}");
        }
    };
    // A type never stored: the stored ones, and the nearest.
    fails_with(
        query("process_cpu:cpu:nanoseconds:cpu:nanosecond", &[]),
        &[
            "no profile type process_cpu:cpu:nanoseconds:cpu:nanosecond is stored",
            "did you mean \"process_cpu:cpu:nanoseconds:cpu:nanoseconds\"",
            "memory:inuse_space:bytes:space:bytes",
        ],
    );
    // A label name, or a value, never stored.
    fails_with(
        query(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{jbo=\"api\"}",
            &[],
        ),
        &[
            "has a label \"jbo\"",
            "did you mean \"job\"",
            "its labels: job",
        ],
    );
    fails_with(
        query(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{job=\"apii\"}",
            &[],
        ),
        &["has job=\"apii\"", "its values: api"],
    );
    // A reversed range.
    fails_with(
        query(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            &["--from", "now", "--to", "now-1h"],
        ),
        &["the range is empty"],
    );
    // A selector that matches, in a range with nothing: where the data is.
    fails_with(
        query(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            &["--from", "now-1m"],
        ),
        &["nothing matches", "stored profiles span 2026-11-22"],
    );
    // Names no selector could address are refused at ingest; nothing is stored.
    for name in ["", "my app", "a:b", "x{y"] {
        let out = frostdb(&["ingest", "--data", s(&data), "--name", name, s(&cpu)]);
        assert!(!out.status.success(), "{name:?}: {}", text(&out));
        assert!(
            text(&out).contains("cannot be part of a profile type"),
            "{}",
            text(&out)
        );
    }
    let types = frostdb(&["types", "--data", s(&data)]);
    assert_eq!(
        String::from_utf8_lossy(&types.stdout).lines().count(),
        6,
        "{}",
        text(&types)
    );

    // A file stored twice is stored once: the second says so, the totals do not double.
    let count = || {
        let out = frostdb(&[
            "sql",
            "--data",
            s(&data),
            "SELECT sum(value) AS v FROM samples",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = count();
    let out = frostdb(&["ingest", "--data", s(&data), "--label", "job=api", s(&cpu)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("1 already stored"), "{}", text(&out));
    assert_eq!(count(), before);
    // The same file under another series is another profile.
    let out = frostdb(&["ingest", "--data", s(&data), "--label", "job=db", s(&cpu)]);
    assert!(text(&out).contains("stored 1 of 1 files"), "{}", text(&out));
    assert_ne!(count(), before);
}

#[test]
fn serve_help_lists_every_config_section() {
    let out = frostdb(&["serve", "--help"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for section in [
        "retention",
        "rollup_retention",
        "[tenants.<id>]",
        "[limits]",
        "[[scrape]]",
        "[ebpf]",
        "[storage]",
        "[cluster]",
        "[symbolizer]",
        "frostdb.example.toml",
        "--tenant",
    ] {
        assert!(
            t.contains(section),
            "{section} missing from serve --help:\n{t}"
        );
    }
}
