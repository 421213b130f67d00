//! `frostdb-loadtest`: pushes a shared/bench fleet's pprof files to a running `frostdb serve`
//! from several concurrent clients (Pyroscope's Push API) while other clients query, then
//! checks that every accepted profile is queryable: the number of stored profiles and each
//! profile type's value total match what was pushed. Bounded by `--max-files` and
//! `--max-seconds`. Prints one JSON line of figures; exits non-zero on any mismatch, any
//! rejected push and any failed query.
//!
//! Past the fleet's last file (`--max-files` larger than the fleet), its files are pushed
//! again as new profiles: each round's copies are moved later by the fleet's time span
//! (their `time_nanos` rewritten before the run), as the same fleet would send them in the
//! next hour.
//!
//! Each querier sends `--query-rate` queries a second (a dashboard's load; the rate and the
//! count are printed), or as many as it can with `--query-rate 0` (a stress test of queries,
//! which then take whatever CPU the pushes leave).
//!
//! ```text
//! frostdb-loadtest --url http://127.0.0.1:7070 --data shared/bench/data/small [--clients 8]
//!     [--queriers 2] [--query-rate 5] [--max-files 20000] [--max-seconds 120] [--tenant load]
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use frostdb_pprof::convert::push::proto as push;
use parking_lot::Mutex;
use prost::Message;

#[derive(Parser)]
#[command(
    name = "frostdb-loadtest",
    about = "Push a fleet's pprof files while querying; verify"
)]
struct Args {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    url: String,
    /// A shared/bench fleet directory with `pprof/index.tsv` (gen_fleet.py --pprof).
    #[arg(long)]
    data: PathBuf,
    /// Concurrent pushing clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Concurrent querying clients.
    #[arg(long, default_value_t = 2)]
    queriers: usize,
    /// Queries a second from each querier; 0 for back to back.
    #[arg(long, default_value_t = 5.0)]
    query_rate: f64,
    /// Push at most this many files.
    #[arg(long, default_value_t = 20_000)]
    max_files: usize,
    /// Stop pushing after this long.
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
    /// Tenant (X-Scope-OrgID).
    #[arg(long, default_value = "loadtest")]
    tenant: String,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Per profile type id: the value total of the pushed files.
type Totals = BTreeMap<String, i64>;

/// One file to push: where it is, its series, its value total per profile type and the
/// push request carrying it (both made before the run, so the load generator spends its CPU
/// on sending, not on reading files and encoding: the small fleet's requests hold about
/// 1 GB).
struct Job {
    path: PathBuf,
    /// How much later than its file's `time_nanos` this copy of it is (replay rounds).
    shift_ms: i64,
    name: String,
    labels: Vec<(String, String)>,
    totals: Vec<(String, i64)>,
    body: axum::body::Bytes,
    /// Bytes of the pprof file in `body`.
    size: usize,
}

/// The Push API request for `job`'s file, `raw`.
fn push_body(job: &Job, raw: Vec<u8>) -> axum::body::Bytes {
    let mut labels = vec![push::LabelPair {
        name: "__name__".into(),
        value: job.name.clone(),
    }];
    labels.extend(job.labels.iter().map(|(k, v)| push::LabelPair {
        name: k.clone(),
        value: v.clone(),
    }));
    let request = push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels,
            samples: vec![push::RawSample {
                raw_profile: raw,
                id: String::new(),
            }],
        }],
    };
    request.encode_to_vec().into()
}

/// The files of `DATA/pprof/index.tsv` (shared/bench's `gen_fleet.py --pprof`): file,
/// timestamp, labels (`__name__=cpu,namespace=...`); `max` of them, the fleet's files again
/// in later rounds (moved by the fleet's time span) when it has fewer.
fn index(data: &std::path::Path, max: usize) -> Result<Vec<Job>, String> {
    let path = data.join("pprof/index.tsv");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (generate the fleet with gen_fleet.py --pprof)",
            path.display()
        )
    })?;
    let mut files = Vec::new();
    for line in text.lines().skip(1).take(max) {
        let mut cols = line.split('\t');
        let (Some(file), Some(ts), Some(labels)) = (cols.next(), cols.next(), cols.next()) else {
            return Err(format!("{}: bad line {line:?}", path.display()));
        };
        let ts: i64 = ts
            .parse()
            .map_err(|e| format!("{}: bad timestamp {ts:?}: {e}", path.display()))?;
        let mut name = String::new();
        let mut pairs = Vec::new();
        for kv in labels.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{}: bad label {kv:?}", path.display()))?;
            if k == "__name__" {
                name = v.to_owned();
            } else {
                pairs.push((k.to_owned(), v.to_owned()));
            }
        }
        files.push((data.join("pprof").join(file), ts, name, pairs));
    }
    if files.is_empty() {
        return Err(format!("{}: no files", path.display()));
    }
    // A round later is the fleet's span later, plus one scrape interval.
    let (first, last) = files.iter().fold((i64::MAX, i64::MIN), |(lo, hi), f| {
        (lo.min(f.1), hi.max(f.1))
    });
    let span = last - first + 10_000;
    Ok((0..max)
        .map(|i| {
            let (path, _, name, labels) = &files[i % files.len()];
            Job {
                path: path.clone(),
                shift_ms: (i / files.len()) as i64 * span,
                name: name.clone(),
                labels: labels.clone(),
                totals: Vec::new(),
                body: axum::body::Bytes::new(),
                size: 0,
            }
        })
        .collect())
}

/// `raw` (a protobuf) gzipped as Go's runtime writes profiles.
fn gzip(raw: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(raw)
        .and_then(|()| gz.finish())
        .map_err(|e| e.to_string())
}

/// A profile's value total per profile type id (`name` is the profile's name).
fn totals_of(name: &str, p: &frostdb_pprof::proto::Profile) -> Vec<(String, i64)> {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let (pt, pu) = p
        .period_type
        .as_ref()
        .map(|t| (s(t.r#type), s(t.unit)))
        .unwrap_or(("", ""));
    p.sample_type
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let id = format!("{name}:{}:{}:{pt}:{pu}", s(t.r#type), s(t.unit));
            (id, p.sample.iter().map(|x| x.value[i]).sum::<i64>())
        })
        .collect()
}

/// Reads `job`'s file and fills in its totals and its request; a replayed copy is the file
/// with its `time_nanos` moved `shift_ms` later, gzipped again.
fn prepare(job: &mut Job) -> Result<(), String> {
    let bytes = std::fs::read(&job.path).map_err(|e| e.to_string())?;
    let mut p = frostdb_pprof::decode(&bytes, &frostdb_pprof::Limits::default())
        .map_err(|e| e.to_string())?
        .into_inner();
    job.totals = totals_of(&job.name, &p);
    let bytes = if job.shift_ms == 0 {
        bytes
    } else {
        p.time_nanos += job.shift_ms * 1_000_000;
        gzip(&p.encode_to_vec())?
    };
    job.size = bytes.len();
    job.body = push_body(job, bytes);
    Ok(())
}

/// Prepares every job (its totals and request), on all cores.
fn precompute(jobs: &mut [Job]) -> Result<(), String> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = jobs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = jobs
            .chunks_mut(chunk)
            .map(|part| {
                s.spawn(move || -> Result<(), String> {
                    for job in part {
                        prepare(job).map_err(|e| format!("{}: {e}", job.path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| "a thread panicked".to_owned())?)
    })
}

async fn run(args: Args) -> Result<bool, String> {
    let mut jobs = index(&args.data, args.max_files)?;
    let t = Instant::now();
    precompute(&mut jobs)?;
    eprintln!(
        "expected totals and requests of {} files made in {:.1} s",
        jobs.len(),
        t.elapsed().as_secs_f64()
    );
    let jobs = Arc::new(jobs);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let push_latency = Arc::new(Mutex::new(Vec::<f64>::new()));
    let query_latency = Arc::new(Mutex::new(Vec::<f64>::new()));
    let query_failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let totals = Arc::new(Mutex::new(Totals::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(AtomicUsize::new(0));
    let rejected = Arc::new(Mutex::new(Vec::<String>::new()));
    let deadline = Instant::now() + Duration::from_secs(args.max_seconds);
    let started = Instant::now();
    let url = format!("{}/push.v1.PusherService/Push", args.url);
    // Queries start once what they select is stored: before, a selector naming a type or a
    // label value nobody stored yet is rightly a 400 naming what is stored.
    let (queryable, ready) = tokio::sync::watch::channel(false);
    let queryable = Arc::new(queryable);

    let mut pushers = Vec::new();
    for _ in 0..args.clients {
        let (jobs, next, client, url, tenant) = (
            jobs.clone(),
            next.clone(),
            client.clone(),
            url.clone(),
            args.tenant.clone(),
        );
        let queryable = queryable.clone();
        let (push_latency, totals, accepted, bytes, rejected) = (
            push_latency.clone(),
            totals.clone(),
            accepted.clone(),
            bytes.clone(),
            rejected.clone(),
        );
        pushers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let size = job.size;
                let t = Instant::now();
                let response = client
                    .post(&url)
                    .header("content-type", "application/proto")
                    .header("x-scope-orgid", &tenant)
                    .body(job.body.clone())
                    .send()
                    .await;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                match response {
                    Ok(r) if r.status().is_success() => {
                        push_latency.lock().push(ms);
                        accepted.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(size, Ordering::Relaxed);
                        let mut totals = totals.lock();
                        for (id, v) in &job.totals {
                            *totals.entry(id.clone()).or_default() += v;
                        }
                        if job.name == "cpu"
                            && job
                                .labels
                                .iter()
                                .any(|(k, v)| k == "namespace" && v == "payments")
                        {
                            queryable.send_replace(true);
                        }
                    }
                    Ok(r) => {
                        let status = r.status();
                        let body = r.text().await.unwrap_or_default();
                        rejected
                            .lock()
                            .push(format!("{}: {status} {body}", job.path.display()));
                    }
                    Err(e) => rejected.lock().push(format!("{}: {e}", job.path.display())),
                }
            }
        }));
    }
    let mut queriers = Vec::new();
    for q in 0..args.queriers {
        let mut ready = ready.clone();
        let (client, base, tenant, done, query_latency, query_failures) = (
            client.clone(),
            args.url.clone(),
            args.tenant.clone(),
            done.clone(),
            query_latency.clone(),
            query_failures.clone(),
        );
        let mut pace = (args.query_rate > 0.0).then(|| {
            let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / args.query_rate));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every
        });
        queriers.push(tokio::spawn(async move {
            // (Set too when the pushers are done, whatever they stored.)
            let _ = ready.wait_for(|ready| *ready).await;
            let mut n = 0usize;
            while !done.load(Ordering::Relaxed) {
                if let Some(pace) = &mut pace {
                    pace.tick().await;
                }
                let path = match (n + q) % 3 {
                    0 => "/api/v1/query?format=top&selector=cpu:cpu:nanoseconds:cpu:nanoseconds%7B%7D",
                    1 => "/api/v1/query_range?step=1m&selector=cpu:cpu:nanoseconds:cpu:nanoseconds%7Bnamespace%3D%22payments%22%7D",
                    _ => "/api/v1/label/pod/values",
                };
                let t = Instant::now();
                let response = client
                    .get(format!("{base}{path}"))
                    .header("x-scope-orgid", &tenant)
                    .send()
                    .await;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                match response {
                    Ok(r) if r.status().is_success() => query_latency.lock().push(ms),
                    Ok(r) => {
                        let status = r.status();
                        let body = r.text().await.unwrap_or_default();
                        query_failures.lock().push(format!("{path}: {status} {body}"));
                    }
                    Err(e) => query_failures.lock().push(format!("{path}: {e}")),
                }
                n += 1;
            }
        }));
    }
    let mut last = Instant::now();
    for p in pushers {
        while !p.is_finished() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if last.elapsed() >= Duration::from_secs(5) {
                last = Instant::now();
                eprintln!(
                    "  {} pushed, {} rejected, {:.0} s",
                    accepted.load(Ordering::Relaxed),
                    rejected.lock().len(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        p.await.map_err(|e| e.to_string())?;
    }
    let push_secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    queryable.send_replace(true);
    for q in queriers {
        q.await.map_err(|e| e.to_string())?;
    }

    // Verify: every accepted profile is stored and the totals match.
    let get = |path: String| {
        let client = client.clone();
        let url = format!("{}{path}", args.url);
        let tenant = args.tenant.clone();
        async move {
            let r = client
                .get(&url)
                .header("x-scope-orgid", tenant)
                .send()
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let status = r.status();
            let text = r.text().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("{url}: {status} {text}"));
            }
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| format!("{url}: {e}"))
        }
    };
    let mut ok = true;
    let totals = totals.lock().clone();
    let mut mismatches = Vec::new();
    for (id, want) in &totals {
        let top = get(format!(
            "/api/v1/query?format=top&node_fraction=0&selector={}",
            frostdb_server::url_encode(&format!("{id}{{}}"))
        ))
        .await?;
        let got = top["total"].as_i64().unwrap_or(-1);
        if got != *want {
            ok = false;
            mismatches.push(format!("{id}: pushed {want}, stored {got}"));
        }
    }
    let names: BTreeSet<String> = get("/api/v1/labels".into())
        .await?
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let columns: Vec<String> = names
        .iter()
        .map(|n| format!("\"{}\"", frostdb_profile::schema::column::label_column(n)))
        .collect();
    let sql = format!(
        "SELECT count(*) AS n FROM (SELECT DISTINCT name, {} timestamp FROM samples)",
        columns.iter().map(|c| format!("{c},")).collect::<String>()
    );
    let profiles = get(format!(
        "/api/v1/sql?q={}",
        frostdb_server::url_encode(&sql)
    ))
    .await?["rows"][0]["n"]
        .as_i64()
        .unwrap_or(-1);
    let accepted = accepted.load(Ordering::Relaxed);
    if profiles != accepted as i64 {
        ok = false;
        mismatches.push(format!(
            "accepted {accepted} profiles, {profiles} are stored"
        ));
    }
    let rejected = rejected.lock().clone();
    let query_failures = query_failures.lock().clone();
    if !rejected.is_empty() || !query_failures.is_empty() {
        ok = false;
    }
    let mut pl = push_latency.lock().clone();
    let mut ql = query_latency.lock().clone();
    pl.sort_by(f64::total_cmp);
    ql.sort_by(f64::total_cmp);
    let figures = serde_json::json!({
        "files_pushed": accepted,
        "rejected": rejected.len(),
        "clients": args.clients,
        "queriers": args.queriers,
        "push_seconds": push_secs,
        "profiles_per_s": accepted as f64 / push_secs,
        "mb_per_s": bytes.load(Ordering::Relaxed) as f64 / 1e6 / push_secs,
        "push_p50_ms": percentile(&pl, 0.5),
        "push_p99_ms": percentile(&pl, 0.99),
        "query_rate_per_querier": args.query_rate,
        "queries": ql.len(),
        "queries_per_s": ql.len() as f64 / push_secs,
        "query_failures": query_failures.len(),
        "query_p50_ms": percentile(&ql, 0.5),
        "query_p99_ms": percentile(&ql, 0.99),
        "profiles_stored": profiles,
        "profile_types_checked": totals.len(),
        "totals_match": mismatches.is_empty(),
    });
    println!("{figures}");
    for m in &mismatches {
        eprintln!("MISMATCH {m}");
    }
    for r in rejected.iter().take(20) {
        eprintln!("REJECTED {r}");
    }
    for f in query_failures.iter().take(20) {
        eprintln!("QUERY FAILED {f}");
    }
    Ok(ok)
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("frostdb-loadtest: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("frostdb-loadtest: {e}");
            ExitCode::FAILURE
        }
    }
}
