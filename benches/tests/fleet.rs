//! The six queries of shared/bench on its tiny fleet, through `frostdb-bench`'s ingest (every
//! load path: the Parquet rows through the Arrow samples API, profiles rebuilt from them,
//! and the pprof files) and query,
//! checked against the generator's reference checksums (computed with numpy, independently
//! of any engine). `scripts/test.sh` generates the fleet and points
//! `FROSTDB_BENCH_DATA` at it; in CI a missing fleet is a failure.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::util::display::array_value_to_string;
use frostdb_benches::external;
use frostdb_core::testing::free_port;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sha2::{Digest, Sha256};

fn fleet() -> Option<PathBuf> {
    let dir = std::env::var("FROSTDB_BENCH_DATA").ok().map(PathBuf::from);
    match dir {
        Some(d) if d.join("expected.json").exists() => Some(d),
        _ => {
            assert!(
                std::env::var("CI").is_err(),
                "CI must run the fleet cross-check: scripts/test.sh generates it"
            );
            eprintln!(
                "SKIPPED: FROSTDB_BENCH_DATA does not point at a generated shared/bench fleet"
            );
            None
        }
    }
}

/// shared/bench's checksum: rows rendered `a|b|c`, sorted, joined by newlines, SHA-256, 16 hex.
fn checksum(batches: &[RecordBatch]) -> (usize, String) {
    let mut rows: Vec<String> = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let values: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, i).unwrap())
                .collect();
            rows.push(values.join("|"));
        }
    }
    rows.sort();
    let digest = Sha256::digest(rows.join("\n").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    (rows.len(), hex[..16].to_owned())
}

/// Loads the fleet with `ingest` (extra arguments: `--pprof` for the pprof files), runs the
/// six queries and compares each result with the reference checksums.
fn load_and_query(data: &std::path::Path, extra: &[&str]) {
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let s = |p: &std::path::Path| p.display().to_string();
    let args = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let (data_dir, store_dir) = (s(data), s(store.path()));
    let mut ingest = vec!["ingest", "--data", &data_dir, "--store", &store_dir];
    ingest.extend_from_slice(extra);
    if extra.contains(&"--pprof") {
        external::ingest_pprof(&args(&ingest)).unwrap();
    } else {
        external::ingest(&args(&ingest)).unwrap();
    }
    external::query(&args(&[
        "query",
        "--data",
        &data_dir,
        "--store",
        &store_dir,
        "--queries",
        &s(&data.join("queries.json")),
        "--runs",
        "1",
        "--out",
        &s(out.path()),
    ]))
    .unwrap();
    assert_matches_reference(data, out.path(), &format!("{extra:?}"));
}

/// Compares the six results in `out` with the fleet's reference checksums.
fn assert_matches_reference(data: &std::path::Path, out: &std::path::Path, how: &str) {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("expected.json")).unwrap())
            .unwrap();
    for q in ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6"] {
        let file = std::fs::File::open(out.join(format!("{q}.parquet"))).unwrap();
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let (rows, sha) = checksum(&batches);
        assert_eq!(
            rows as u64,
            expected[q]["rows"].as_u64().unwrap(),
            "{q} rows ({how})"
        );
        assert_eq!(
            sha,
            expected[q]["sha"].as_str().unwrap(),
            "{q} checksum ({how})"
        );
    }
}

#[test]
fn the_six_queries_match_the_reference_checksums_loaded_from_parquet_rows() {
    let Some(data) = fleet() else { return };
    // Through the Arrow samples API, in calls of a few thousand rows from two threads.
    load_and_query(&data, &["--threads", "2", "--batch-rows", "7000"]);
}

#[test]
fn the_six_queries_match_the_reference_checksums_loaded_as_profiles_rebuilt_from_rows() {
    let Some(data) = fleet() else { return };
    load_and_query(&data, &["--per-profile", "--threads", "8"]);
}

#[test]
fn the_six_queries_match_the_reference_checksums_loaded_from_pprof_files() {
    let Some(data) = fleet() else { return };
    load_and_query(&data, &["--pprof", "--threads", "8"]);
}

/// A `frostdb-bench` process with the test bucket's credentials.
fn bench(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_frostdb-bench"));
    command
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("FROSTDB_LOG", "warn");
    command
}

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until something listens on `port` (another process: nothing to wait on but it).
fn wait_listening(port: u16, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "the worker exited");
        assert!(Instant::now() < deadline, "no worker on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 16's processes: one writer loads the tiny fleet's pprof files into a bucket on
/// moto's S3 server, two read-only workers serve merges, one coordinator answers the six
/// queries spreading every merge's persisted blocks over the workers: the reference
/// checksums, as one process answers. Then a worker is killed while the coordinator runs:
/// its queries fail naming the workers, or (when done before) are right; never wrong.
#[test]
fn the_six_queries_match_the_reference_checksums_spread_over_two_worker_processes() {
    let Some(data) = fleet() else { return };
    let Some(s3) = frostdb_core::testing::S3Server::start("the six queries over workers") else {
        return;
    };
    let bucket = s3.bucket("fleet", "tiny");
    let (url, endpoint) = (bucket.url.clone(), s3.endpoint());
    let at = ["--bucket", &url, "--endpoint", &endpoint, "--allow-http"];
    let data_dir = data.display().to_string();
    let mut ingest = vec!["ingest", "--pprof", "--data", &data_dir, "--threads", "8"];
    ingest.extend(at);
    let loaded = bench(&ingest).output().unwrap();
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    let mut workers = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..2 {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["worker", "--listen", &listen];
        args.extend(at);
        let mut child = bench(&args).stderr(Stdio::null()).spawn().unwrap();
        wait_listening(port, &mut child);
        workers.push(Running(child));
        urls.push(format!("http://{listen}"));
    }
    let workers_arg = urls.join(",");
    let out = tempfile::tempdir().unwrap();
    let (queries, out_dir) = (
        data.join("queries.json").display().to_string(),
        out.path().display().to_string(),
    );
    // The six queries against the database `place` names.
    let query_at = |runs: &str, place: &[&str]| {
        let mut args = vec![
            "query",
            "--data",
            &data_dir,
            "--queries",
            &queries,
            "--runs",
            runs,
            "--out",
            &out_dir,
        ];
        args.extend(place);
        bench(&args)
    };
    let spread: Vec<&str> = ["--workers", workers_arg.as_str()]
        .into_iter()
        .chain(at)
        .collect();
    let query = |runs: &str| query_at(runs, &spread);
    // A prefix nothing was written to: the reader refuses, rather than answer with nothing.
    let empty = s3.bucket("fleet", "nothing").url;
    let refused = query_at(
        "1",
        &["--bucket", &empty, "--endpoint", &endpoint, "--allow-http"],
    )
    .output()
    .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no database here"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let answered = query("1").output().unwrap();
    let stderr = String::from_utf8_lossy(&answered.stderr).into_owned();
    assert!(answered.status.success(), "{stderr}");
    assert_matches_reference(&data, out.path(), "spread over two workers");
    let moved: u64 = stderr
        .lines()
        .find_map(|l| {
            l.split(": ")
                .nth(1)?
                .strip_suffix(" bytes moved between processes")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bytes moved reported: {stderr}"));
    assert!(moved > 0, "{stderr}");

    // A worker killed while the coordinator queries.
    for f in std::fs::read_dir(out.path()).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    let mut coordinator = query("200").stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = std::io::BufReader::new(coordinator.stderr.take().unwrap());
    let mut line = String::new();
    // Once it has opened the store and begun its queries:
    while !line.contains("opened in") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0);
    }
    drop(workers.pop());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = coordinator.wait().unwrap();
    if status.success() {
        eprintln!("the queries were done before the worker went");
        assert_matches_reference(&data, out.path(), "a worker killed after the queries");
    } else {
        eprintln!("the coordinator failed when the worker went: {rest}");
        assert!(
            rest.contains("failed (no partial answer is given)") && rest.contains(&urls[1]),
            "{rest}"
        );
    }
}

/// `frostdb-bench compare` (the regression comparison's cost) on the tiny fleet: one job's
/// first ten minutes against its next ten, every profile and row of each side read.
#[test]
fn the_version_comparison_reads_every_profile_of_both_sides() {
    let Some(data) = fleet() else { return };
    let store = tempfile::tempdir().unwrap();
    let args = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let (data_dir, store_dir) = (
        data.display().to_string(),
        store.path().display().to_string(),
    );
    external::ingest(&args(&[
        "ingest", "--data", &data_dir, "--store", &store_dir,
    ]))
    .unwrap();
    let m = frostdb_benches::versions::compare(&args(&[
        "compare",
        "--store",
        &store_dir,
        "--minutes",
        "10",
        "--runs",
        "2",
    ]))
    .unwrap();
    // A profile per series every 10 s: 60 per series in each ten minutes.
    assert!(m.series > 0, "{m:?}");
    assert_eq!(m.profiles, (60 * m.series, 60 * m.series), "{m:?}");
    assert!(m.functions > 0 && m.runs_ms.len() == 2, "{m:?}");
    // Every row a merge of the same selection reads.
    let db = frostdb_core::Db::open(store.path(), Default::default()).unwrap();
    let store = frostdb_pprof::ProfileStore::open(db, Default::default()).unwrap();
    let selector =
        frostdb_pprof::Selector::parse(&format!("{}{{job=\"{}\"}}", external::CPU, m.job)).unwrap();
    for (range, rows) in [(m.before, m.rows.0), (m.after, m.rows.1)] {
        let range = frostdb_pprof::TimeRange {
            start_ms: range.0,
            end_ms: range.1,
        };
        assert_eq!(
            store.merge_raw(&selector, range).unwrap().rows,
            rows,
            "{m:?}"
        );
    }
}
