//! The `frostdb` command line, run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn shared() -> PathBuf {
    if let Ok(dir) = std::env::var("FROSTDB_SHARED") {
        return PathBuf::from(dir);
    }
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
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
    assert!(text(&empty).contains("nothing matches"));

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
