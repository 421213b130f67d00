//! Recording rules read by a real Prometheus (Debian's): rules set through the API before
//! two services' CPU profiles are pushed; Prometheus scrapes `/metrics`, and PromQL over
//! its API answers the CPU of the chosen function per service, equal to what the server's
//! merge (its top table) answers for the same selector.
//!
//! Needs `prometheus` (`scripts/test.sh` installs it).

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Reap, Server, enc, eventually, get, get_json, metric, testdata};

/// The function with the largest self value in a pprof file.
fn hottest(file: &[u8]) -> String {
    let p = frostdb_pprof::decode(file, &Default::default())
        .unwrap()
        .into_inner();
    let name = |location_id: u64| {
        let l = p.location.iter().find(|l| l.id == location_id)?;
        let id = l.line.first()?.function_id;
        let f = p.function.iter().find(|f| f.id == id)?;
        Some(p.string_table[f.name as usize].clone())
    };
    let mut flat: std::collections::BTreeMap<String, i64> = Default::default();
    for s in &p.sample {
        if let Some(leaf) = s.location_id.first().and_then(|&l| name(l)) {
            *flat.entry(leaf).or_default() += s.value.last().copied().unwrap_or(0);
        }
    }
    flat.into_iter().max_by_key(|(_, v)| *v).unwrap().0
}

/// Prometheus scraping `target` (host:port) every second, its API's URL.
fn prometheus(dir: &std::path::Path, target: &str) -> (Reap, String) {
    prometheus_with(
        dir,
        &format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: frostdb\n    \
             static_configs:\n      - targets: [\"{target}\"]\n"
        ),
        &[],
    )
}

/// Prometheus with `config` and `flags`, its API's URL.
fn prometheus_with(dir: &std::path::Path, config: &str, flags: &[&str]) -> (Reap, String) {
    let port = frostdb_core::testing::free_port();
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let child = std::process::Command::new("prometheus")
        .args(flags)
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prometheus (scripts/test.sh installs it)");
    (Reap(child), format!("http://127.0.0.1:{port}"))
}

/// PromQL `query`'s instant value per `service_name`, from Prometheus at `url`.
async fn promql(url: &str, query: &str) -> BTreeMap<String, i64> {
    // Prometheus may not listen yet: no answer is no value.
    let Ok(answer) = reqwest::get(format!("{url}/api/v1/query?query={}", enc(query))).await else {
        return Default::default();
    };
    let Ok(body) = answer.text().await else {
        return Default::default();
    };
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    answer["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let service = r["metric"]["service_name"].as_str()?.to_owned();
            let value = r["value"][1].as_str()?.parse::<f64>().ok()?;
            Some((service, value as i64))
        })
        .collect()
}

/// Sets two rules on `s` (a function's CPU per service, all CPU per service), checks a bad
/// one is refused, pushes two services' CPU profiles, and returns what the server's merges
/// answer for each rule per service (its top table's cum of the function, its total).
async fn rules_and_profiles(s: &Server) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let files = [
        ("api", testdata("pprof/goapp__go119-cpu-2s.pb.gz")),
        ("worker", testdata("pprof/pyroscope__go-cpu.pb.gz")),
    ];
    let function = hottest(&files[0].1);
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    for (name, rule) in [
        (
            "function_cpu_nanoseconds_total",
            serde_json::json!({
                "name": "function_cpu_nanoseconds_total",
                "profile_type": cpu,
                "function": function,
                "keep_labels": ["service_name"],
            }),
        ),
        (
            "cpu_nanoseconds_total",
            serde_json::json!({
                "name": "cpu_nanoseconds_total",
                "profile_type": cpu,
                "selector": "{}",
                "keep_labels": ["service_name"],
            }),
        ),
    ] {
        let set = reqwest::Client::new()
            .put(format!("{}/api/v1/rules/{name}", s.url))
            .body(rule.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(set.status().as_u16(), 200, "{}", set.text().await.unwrap());
    }
    // A rule over the limits or malformed is refused, naming what is wrong.
    let (status, refused) = {
        let r = reqwest::Client::new()
            .put(format!("{}/api/v1/rules/bad-name", s.url))
            .body(serde_json::json!({"name": "bad-name", "profile_type": cpu}).to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert_eq!(status, 400, "{refused}");
    assert!(refused.contains("Prometheus metric name"), "{refused}");
    // A rule named as one of the server's own metrics would make /metrics describe that
    // family twice, and Prometheus refuse every series of the scrape.
    let r = reqwest::Client::new()
        .put(format!("{}/api/v1/rules/frostdb_open_tenants", s.url))
        .body(serde_json::json!({"name": "frostdb_open_tenants", "profile_type": cpu}).to_string())
        .send()
        .await
        .unwrap();
    let (status, refused) = (r.status().as_u16(), r.text().await.unwrap());
    assert_eq!(status, 400, "{refused}");
    assert!(refused.contains("the server's own metrics"), "{refused}");

    for (service, file) in &files {
        let pushed = reqwest::Client::new()
            .post(format!("{}/ingest?name={service}.cpu&format=pprof", s.url))
            .body(file.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(pushed.status().as_u16(), 200);
    }
    // What the server's merges answer: per service, the function's cum and the total.
    let mut expected_function = BTreeMap::new();
    let mut expected_total = BTreeMap::new();
    for (service, _) in &files {
        let top = get_json(
            &format!(
                "{}/api/v1/query?format=top&node_fraction=0&selector={}",
                s.url,
                enc(&format!("{cpu}{{service_name=\"{service}\"}}"))
            ),
            None,
        )
        .await;
        expected_total.insert(service.to_string(), top["total"].as_i64().unwrap());
        if let Some(row) = top["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == function.as_str())
        {
            expected_function.insert(service.to_string(), row["cum"].as_i64().unwrap());
        }
    }
    assert!(
        expected_function.contains_key("api"),
        "{expected_function:?}"
    );

    (expected_function, expected_total)
}

/// Fails unless Prometheus at `url` comes to answer, per service, the rules' values the
/// server's merges answered (within two minutes).
async fn answers_as_the_merges(
    url: &str,
    expected_function: &BTreeMap<String, i64>,
    expected_total: &BTreeMap<String, i64>,
) {
    assert!(
        eventually(Duration::from_secs(120), async || {
            promql(url, "function_cpu_nanoseconds_total").await == *expected_function
                && promql(url, "cpu_nanoseconds_total").await == *expected_total
        })
        .await,
        "Prometheus answered {:?} and {:?}; the server's merges {expected_function:?} and \
         {expected_total:?}",
        promql(url, "function_cpu_nanoseconds_total").await,
        promql(url, "cpu_nanoseconds_total").await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_cpu_of_a_function_per_service() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let (expected_function, expected_total) = rules_and_profiles(&s).await;
    let port = s.url.rsplit(':').next().unwrap().trim_end_matches('/');
    let (_prometheus, url) = prometheus(dir.path(), &format!("127.0.0.1:{port}"));
    answers_as_the_merges(&url, &expected_function, &expected_total).await;
    // The rules list says what each recorded.
    let listed = get_json(&format!("{}/api/v1/rules", s.url), None).await;
    assert_eq!(listed["rules"].as_array().unwrap().len(), 2, "{listed}");
}

/// The same series sent by remote write (`[remote_write]`) to a Prometheus receiving it
/// (`--web.enable-remote-write-receiver`), which scrapes nothing: PromQL answers what the
/// merges answer, and the sender counts acknowledged batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_receives_the_series_by_remote_write() {
    let dir = tempfile::tempdir().unwrap();
    let (_prometheus, url) = prometheus_with(
        dir.path(),
        "global:\n  scrape_interval: 1m\n",
        &["--web.enable-remote-write-receiver"],
    );
    let s = Server::start(
        &dir.path().join("data"),
        Some(&format!(
            "[remote_write]\nurl = \"{url}/api/v1/write\"\ninterval = \"1s\"\n"
        )),
    );
    let (expected_function, expected_total) = rules_and_profiles(&s).await;
    answers_as_the_merges(&url, &expected_function, &expected_total).await;
    let sent = metric(&s, "frostdb_remote_write_batches_sent_total").await;
    assert!(sent >= 1, "{sent} batches acknowledged");
}

/// What a remote-write receiver was sent: the tenant header and the decompressed body.
type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

/// A remote-write receiver on a port of its own (its URL), logging what it is sent; it
/// answers `refusing`'s batches 429 (logged too), never answers `silent`'s (logged, the
/// connection held), and the rest 200.
async fn remote_write_receiver(
    refusing: Option<&'static str>,
    silent: Option<&'static str>,
) -> (String, Received) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received: Received = Default::default();
    let log = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut socket = tokio::io::BufReader::new(socket);
                loop {
                    let (mut tenant, mut length) = (String::new(), 0usize);
                    loop {
                        let mut line = String::new();
                        if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':') {
                            match k.trim().to_ascii_lowercase().as_str() {
                                "x-scope-orgid" => tenant = v.trim().to_owned(),
                                "content-length" => length = v.trim().parse().unwrap_or(0),
                                _ => {}
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if socket.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let body = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
                    let answer: &[u8] = match refusing == Some(tenant.as_str()) {
                        true => b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n",
                        false => b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                    };
                    let hold = silent == Some(tenant.as_str());
                    log.lock().unwrap().push((tenant, body));
                    if hold {
                        return std::future::pending().await;
                    }
                    if socket.get_mut().write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, received)
}

/// A server remote-writing to `url` every second, with a recording rule in team-a and
/// team-b, each of which has pushed a profile of its service (`svc-<tenant>`).
async fn remote_writing(url: &str, dir: &std::path::Path, more: &str) -> Server {
    let s = Server::start(
        &dir.join("data"),
        Some(&format!(
            "[remote_write]\nurl = \"{url}/api/v1/write\"\ninterval = \"1s\"\n{more}"
        )),
    );
    let client = reqwest::Client::new();
    for tenant in ["team-a", "team-b"] {
        let rule = serde_json::json!({
            "name": "cpu_nanoseconds_total",
            "profile_type": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "selector": "{}",
            "keep_labels": ["service_name"],
        });
        let put = client
            .put(format!("{}/api/v1/rules/cpu_nanoseconds_total", s.url))
            .header("X-Scope-OrgID", tenant)
            .body(rule.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status().as_u16(), 200);
        let pushed = client
            .post(format!(
                "{}/ingest?name=svc-{tenant}.cpu&format=pprof",
                s.url
            ))
            .header("X-Scope-OrgID", tenant)
            .body(testdata("pprof/pyroscope__go-cpu.pb.gz"))
            .send()
            .await
            .unwrap();
        assert_eq!(pushed.status().as_u16(), 200);
    }
    s
}

/// Remote write sends each tenant's series as a batch of its own with `X-Scope-OrgID` (as
/// a multi-tenant receiver, Mimir or Cortex, takes them), never one tenant's series in
/// another's batch. A receiver (here a socket that records what it is sent) sees a batch
/// per tenant and interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_write_sends_each_tenants_series_under_its_own_header() {
    let (url, received) = remote_write_receiver(None, None).await;
    let dir = tempfile::tempdir().unwrap();
    let _s = remote_writing(&url, dir.path(), "").await;
    let both = eventually(Duration::from_secs(30), async || {
        let got = received.lock().unwrap();
        ["team-a", "team-b"]
            .iter()
            .all(|t| got.iter().any(|(tenant, _)| tenant == t))
    })
    .await;
    assert!(both, "a batch of each tenant");
    let contains = |body: &[u8], text: &str| body.windows(text.len()).any(|w| w == text.as_bytes());
    for (tenant, body) in received.lock().unwrap().iter() {
        let other = if tenant == "team-a" {
            "team-b"
        } else {
            "team-a"
        };
        assert!(
            contains(body, &format!("svc-{tenant}")),
            "{tenant}'s batch lacks its series"
        );
        assert!(
            !contains(body, other),
            "{tenant}'s batch holds {other}'s series"
        );
    }
}

/// A receiver refusing one tenant for now (429, again and again) holds back that tenant's
/// batches, not the others': one queue and one backoff for all, team-a's refused batch
/// stood first in every interval and nothing behind it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_the_receiver_refuses_does_not_hold_back_the_others() {
    let (url, received) = remote_write_receiver(Some("team-a"), None).await;
    let dir = tempfile::tempdir().unwrap();
    let _s = remote_writing(&url, dir.path(), "").await;
    // team-a refused twice (its backoff under way), and team-b's batches of three
    // intervals taken meanwhile.
    let through = eventually(Duration::from_secs(60), async || {
        let got = received.lock().unwrap();
        let count = |t: &str| got.iter().filter(|(tenant, _)| tenant == t).count();
        count("team-a") >= 2 && count("team-b") >= 3
    })
    .await;
    assert!(
        through,
        "{:?}",
        received
            .lock()
            .unwrap()
            .iter()
            .map(|(t, _)| t)
            .collect::<Vec<_>>()
    );
}

/// A receiver that never answers one tenant holds back neither the next intervals'
/// sampling nor the other tenants' batches. Sends were awaited inside the sampling loop:
/// team-a's silent receiver (its whole `timeout` a try) stopped every interval's sample,
/// and team-b's batches with it, counted nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_silent_for_one_tenant_holds_back_neither_sampling_nor_the_others() {
    let (url, received) = remote_write_receiver(None, Some("team-a")).await;
    let dir = tempfile::tempdir().unwrap();
    let s = remote_writing(&url, dir.path(), "timeout = \"600s\"\n").await;
    // team-a's first batch held unanswered, team-b's of three intervals taken meanwhile.
    let team_b = |got: &[(String, Vec<u8>)]| -> Vec<Vec<u8>> {
        got.iter()
            .filter(|(tenant, _)| tenant == "team-b")
            .map(|(_, body)| body.clone())
            .collect()
    };
    let through = eventually(Duration::from_secs(60), async || {
        let got = received.lock().unwrap();
        got.iter().any(|(tenant, _)| tenant == "team-a") && team_b(&got).len() >= 3
    })
    .await;
    let got = received.lock().unwrap().clone();
    assert!(
        through,
        "{:?}",
        got.iter().map(|(t, _)| t).collect::<Vec<_>>()
    );
    let batches = team_b(&got);
    assert!(
        batches.windows(2).all(|w| w[0] != w[1]),
        "each of team-b's batches is an interval of its own (its own timestamp)"
    );
    assert_eq!(
        got.iter().filter(|(tenant, _)| tenant == "team-a").count(),
        1,
        "team-a's batch is still being sent"
    );
    let (_, metrics) = get(&format!("{}/metrics", s.url), None).await;
    assert!(
        metrics.contains("\nfrostdb_remote_write_intervals_missed_total "),
        "intervals the sampler missed are counted"
    );
}
