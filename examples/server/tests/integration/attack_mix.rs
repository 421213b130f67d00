//! The attack mix: the worst requests of the other hostile tests (a poison-pill stack,
//! decompression and decode bombs, a deep stack shared by every sample, a bomb of query
//! matchers, cross joins and `repeat('x', 1e9)` in SQL, a spray of tenants, a flood of idle
//! connections), sent concurrently and repeatedly beside ordinary pushes and flame-graph
//! queries, at a server running in a memory cgroup of its budget plus a margin. It must
//! neither be killed nor stop answering: every request gets an HTTP answer (stored, or
//! refused with the limit named), and the cgroup records no OOM kill.
//!
//! `FROSTDB_ATTACK_SECONDS` sets how long the mix runs (default 20 s; the documented long
//! run is 600).

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Server, enc, shared_stack, testdata};
use frostdb_pprof::convert::push::proto as push;
use frostdb_pprof::proto as pprof;
use prost::Message;

/// The server's memory budget, and the cgroup's limit: the budget and a margin for what
/// the budget does not count (the code, thread stacks, the allocator's slack, page cache).
const BUDGET: u64 = 768 << 20;
const CGROUP_LIMIT: u64 = BUDGET + (768 << 20);

/// A memory cgroup of this test's own, removed when dropped.
struct Cgroup {
    path: PathBuf,
    v2: bool,
}

impl Cgroup {
    /// A cgroup limited to `limit` bytes (v2, else v1), or why none can be made here.
    fn new(limit: u64) -> Result<Self, String> {
        let name = format!("frostdb-attack-{}", std::process::id());
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        let (path, limit_file) = if v2 {
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
            (PathBuf::from("/sys/fs/cgroup").join(&name), "memory.max")
        } else {
            (
                PathBuf::from("/sys/fs/cgroup/memory").join(&name),
                "memory.limit_in_bytes",
            )
        };
        std::fs::create_dir(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        let cgroup = Self { path, v2 };
        std::fs::write(cgroup.path.join(limit_file), limit.to_string())
            .map_err(|e| format!("setting {limit_file}: {e}"))?;
        if !v2 {
            // Without swap accounting this file is absent; with it, no swapping either.
            let _ = std::fs::write(
                cgroup.path.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
        }
        Ok(cgroup)
    }

    /// The file a process joins the cgroup by writing its pid to.
    fn procs(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path.join(file)).unwrap_or_default()
    }

    /// Processes the kernel killed in the cgroup for want of memory.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        self.read(file)
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The cgroup's peak memory, bytes.
    fn peak(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(file).trim().parse().unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// `count` copies of `unit` after `head`, gzipped as many members (one compressed
/// megabyte again and again: cheap to make, tiny to send).
fn gzip_repeated(head: &[u8], unit: &[u8], count: usize) -> Vec<u8> {
    let per_chunk = (1 << 20) / unit.len();
    let chunk = gzip(&unit.repeat(per_chunk));
    let mut body = gzip(head);
    for _ in 0..count / per_chunk {
        body.extend_from_slice(&chunk);
    }
    body.extend(gzip(&unit.repeat(count % per_chunk)));
    body
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A pprof of one sample whose stack has `locations` locations of `lines` inlined lines.
fn deep_profile(locations: u64, lines: u64) -> pprof::Profile {
    pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        sample: vec![pprof::Sample {
            location_id: (1..=locations).collect(),
            value: vec![1_000_000],
            label: Vec::new(),
        }],
        location: (1..=locations)
            .map(|id| pprof::Location {
                id,
                line: (0..lines)
                    .map(|l| pprof::Line {
                        function_id: 1 + (id + l) % 16,
                        line: l as i64,
                        column: 0,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        function: (1..=16)
            .map(|id| pprof::Function {
                id,
                name: 3 + id as i64 - 1,
                ..Default::default()
            })
            .collect(),
        string_table: ["", "cpu", "nanoseconds"]
            .into_iter()
            .map(String::from)
            .chain((0..16).map(|i| format!("f{i}")))
            .collect(),
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        time_nanos: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64,
        ..Default::default()
    }
}

fn push_request(name: &str, service: &str, raw: Vec<u8>) -> Vec<u8> {
    push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels: vec![
                push::LabelPair {
                    name: "__name__".into(),
                    value: name.into(),
                },
                push::LabelPair {
                    name: "service_name".into(),
                    value: service.into(),
                },
            ],
            samples: vec![push::RawSample {
                raw_profile: raw,
                id: String::new(),
            }],
        }],
    }
    .encode_to_vec()
}

/// One request of the mix: method, path, headers, body; queries go to [`QUERIED`], which
/// has data, everything else to a tenant of the spray.
#[derive(Clone)]
struct Attack {
    name: &'static str,
    method: reqwest::Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

/// The tenant the mix's queries read: stored to before the mix starts.
const QUERIED: &str = "queried";

impl Attack {
    fn queries(&self) -> bool {
        self.path.starts_with("/api/v1/sql") || self.path.starts_with("/api/v1/query")
    }
}

fn attacks() -> Vec<Attack> {
    let post = |name, path: &str, headers: Vec<(&'static str, &str)>, body: Vec<u8>| Attack {
        name,
        method: reqwest::Method::POST,
        path: path.to_owned(),
        headers: headers
            .into_iter()
            .map(|(k, v)| (k, v.to_owned()))
            .collect(),
        body,
    };
    let get = |name, path: String| Attack {
        name,
        method: reqwest::Method::GET,
        path,
        headers: Vec::new(),
        body: Vec::new(),
    };
    let proto = vec![("content-type", "application/proto")];
    let gz_proto = vec![
        ("content-type", "application/proto"),
        ("content-encoding", "gzip"),
    ];
    // 20 M empty label pairs in one series (2 bytes each on the wire, 48 decoded).
    let n = 20_000_000;
    let mut series_head = Vec::new();
    varint((1 << 3) | 2, &mut series_head);
    varint(2 * n as u64, &mut series_head);
    let label_bomb = gzip_repeated(&series_head, &[0x0a, 0x00], n);
    // 20 M empty matchers (field 1) in a query request.
    let matcher_bomb = gzip_repeated(&[], &[0x0a, 0x00], n);
    // 100,000 samples of one 4,096-deep stack, as OTLP.
    let shared = shared_stack(4096, 100_000).encode_to_vec();
    let cpu = testdata("pprof/pyroscope__go-cpu.pb.gz");
    let heap = testdata("pprof/goapp__go119-heap.pb.gz");
    let doubling = (1..=40).fold(
        "WITH c0 AS (SELECT repeat('x', 64) AS s)".to_owned(),
        |q, i| q + &format!(", c{i} AS (SELECT s || s AS s FROM c{})", i - 1),
    ) + " SELECT length(s) FROM c40";
    let chain = (1..=3_000).fold("WITH c0 AS (SELECT 1 AS s)".to_owned(), |q, i| {
        q + &format!(", c{i} AS (SELECT s + 1 AS s FROM c{})", i - 1)
    }) + " SELECT s FROM c3000";
    let cross = "SELECT count(*) FROM generate_series(1, 1000000) a CROSS JOIN generate_series(1, 1000000) b";
    let flame = format!(
        "/api/v1/query?format=flamegraph&selector={}",
        enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}")
    );
    vec![
        post(
            "poison pill (4,096 locations of two inlined lines)",
            "/push.v1.PusherService/Push",
            proto.clone(),
            push_request(
                "process_cpu",
                "poison",
                gzip(&deep_profile(4096, 2).encode_to_vec()),
            ),
        ),
        post(
            "a deep stack within the limit",
            "/push.v1.PusherService/Push",
            proto.clone(),
            push_request(
                "process_cpu",
                "deep",
                gzip(&deep_profile(2000, 2).encode_to_vec()),
            ),
        ),
        post(
            "20 M empty labels",
            "/push.v1.PusherService/Push",
            gz_proto.clone(),
            label_bomb,
        ),
        post(
            "20 M empty matchers",
            "/querier.v1.QuerierService/LabelNames",
            gz_proto,
            matcher_bomb,
        ),
        post(
            "a 4,096-deep stack in 100,000 samples",
            "/v1development/profiles",
            vec![("content-type", "application/x-protobuf")],
            shared,
        ),
        get("a cross join", format!("/api/v1/sql?q={}", enc(cross))),
        get(
            "repeat('x', 1e9)",
            format!("/api/v1/sql?q={}", enc("SELECT repeat('x', 1000000000)")),
        ),
        post(
            "`||` doubling in 40 CTEs",
            "/api/v1/sql",
            vec![],
            doubling.into_bytes(),
        ),
        post(
            "3,000 chained CTEs",
            "/api/v1/sql",
            vec![],
            chain.into_bytes(),
        ),
        post(
            "a real CPU profile",
            "/push.v1.PusherService/Push",
            proto.clone(),
            push_request("process_cpu", "api", cpu),
        ),
        post(
            "a real heap profile",
            "/push.v1.PusherService/Push",
            proto,
            push_request("memory", "api", heap),
        ),
        get("a flame graph", flame),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attack_mix_neither_kills_nor_silences_the_server() {
    let cgroup = match Cgroup::new(CGROUP_LIMIT) {
        Ok(c) => c,
        Err(why) => {
            assert!(
                std::env::var("CI").is_err() || unsafe_to_require_cgroups(),
                "CI runs as root and must be able to make a memory cgroup: {why}"
            );
            eprintln!("SKIPPED: no memory cgroup can be made here ({why})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[limits]\nmemory = {BUDGET}\nmax_query_memory_bytes = 268435456\nrequest_timeout_secs = 10\nmax_tenants = 200\nmax_connections = 400\nmax_connections_per_address = 400\nheader_read_timeout_secs = 2\n"
    );
    let join = format!("echo $$ > {}", cgroup.procs().display());
    let mut s = Server::start_after(&dir.path().join("d"), Some(&config), Some(&join));
    let seconds: u64 = std::env::var("FROSTDB_ATTACK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let cpu = testdata("pprof/pyroscope__go-cpu.pb.gz");
    let stored = reqwest::Client::new()
        .post(format!("{}/push.v1.PusherService/Push", s.url))
        .header("X-Scope-OrgID", QUERIED)
        .header("content-type", "application/proto")
        .body(push_request("process_cpu", "api", cpu))
        .send()
        .await
        .unwrap();
    assert_eq!(stored.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let attacks = Arc::new(attacks());
    let answers: Arc<Mutex<BTreeMap<(&'static str, u16), u64>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    // Pooled connections are dropped after 1 s idle, under the server's 2 s header-read
    // timeout: a client reusing a keep-alive connection just as the server closes it for
    // silence gets a send error that no server can prevent (the HTTP/1.1 keep-alive race;
    // a clean-clone run saw it once on a cross join, at 30.8 s). Clients keep their idle
    // timeout under the server's, as this one now does.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_idle_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for worker in 0..12usize {
        let (attacks, answers, failures, client, url) = (
            attacks.clone(),
            answers.clone(),
            failures.clone(),
            client.clone(),
            s.url.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut round = 0usize;
            while Instant::now() < deadline {
                let a = &attacks[(worker + round) % attacks.len()];
                round += 1;
                // A spray of tenants: every few requests a new one.
                let tenant = if a.queries() {
                    QUERIED.to_owned()
                } else {
                    format!("t{}", (worker * 1000 + round) % 300)
                };
                let mut req = client
                    .request(a.method.clone(), format!("{url}{}", a.path))
                    .header("X-Scope-OrgID", tenant)
                    .body(a.body.clone());
                for (k, v) in &a.headers {
                    req = req.header(*k, v.as_str());
                }
                match req.send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let _ = r.bytes().await;
                        *answers.lock().unwrap().entry((a.name, status)).or_default() += 1;
                    }
                    Err(e) => failures.lock().unwrap().push(format!("{}: {e}", a.name)),
                }
            }
        }));
    }
    // And a flood of idle connections, renewed as the server closes them.
    let addr = s.url.trim_start_matches("http://").to_owned();
    let flood = tokio::spawn(async move {
        let mut held = Vec::new();
        while Instant::now() < deadline {
            for _ in 0..200 {
                if let Ok(c) = tokio::net::TcpStream::connect(&addr).await {
                    held.push(c);
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            held.truncate(400);
        }
    });
    for t in tasks {
        t.await.unwrap();
    }
    flood.await.unwrap();
    let answers = answers.lock().unwrap().clone();
    let failures = failures.lock().unwrap().clone();
    let peak_rss = s.status("VmHWM") << 10;
    eprintln!(
        "attack mix for {seconds} s: server peak RSS {} MiB, cgroup peak {} MiB (budget {} MiB, cgroup limit {} MiB)",
        peak_rss >> 20,
        cgroup.peak() >> 20,
        BUDGET >> 20,
        CGROUP_LIMIT >> 20
    );
    for ((name, status), n) in &answers {
        eprintln!("  {n:>6} × {status} {name}");
    }
    assert!(s.running(), "the server died");
    assert_eq!(cgroup.oom_kills(), 0, "the kernel killed for memory");
    assert!(failures.is_empty(), "requests got no answer: {failures:?}");
    // Attacks are refused, ordinary work is done.
    for (name, expected) in [
        ("poison pill (4,096 locations of two inlined lines)", 413),
        ("20 M empty labels", 413),
        ("20 M empty matchers", 413),
        ("a 4,096-deep stack in 100,000 samples", 413),
        ("a cross join", 408),
        ("repeat('x', 1e9)", 413),
        ("`||` doubling in 40 CTEs", 413),
        ("3,000 chained CTEs", 400),
    ] {
        let other: Vec<_> = answers
            .iter()
            // Busy (503), or for a query, timed out queued behind the cross joins (408).
            .filter(|((n, status), _)| *n == name && ![expected, 503, 408].contains(status))
            .collect();
        assert!(other.is_empty(), "{name}: {other:?}");
    }
    for name in [
        "a real CPU profile",
        "a flame graph",
        "a deep stack within the limit",
    ] {
        assert!(
            answers.get(&(name, 200)).copied().unwrap_or(0) > 0,
            "{name} never succeeded: {answers:?}"
        );
    }
    // It still answers, and stops on SIGTERM.
    let (status, _) = common::get(&format!("{}/healthz", s.url), None).await;
    assert_eq!(status, 200);
    assert_eq!(s.terminate_within(Duration::from_secs(60)), Some(true));
}

/// Whether this CI may lack cgroups after all: set `FROSTDB_NO_CGROUPS=1` where the runner
/// is known to give none (the test then says it skipped).
fn unsafe_to_require_cgroups() -> bool {
    std::env::var("FROSTDB_NO_CGROUPS").is_ok_and(|v| v == "1")
}
