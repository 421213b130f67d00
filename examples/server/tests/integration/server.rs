//! `frostdb serve` end to end over HTTP: each push protocol, the query API, tenants, limits,
//! restarts. Each test runs its own server on a free loopback port.

use crate::common;

use std::io::Write;

use common::{Reap, Server, e2e_script, enc, get, get_json, testdata, venv_python};
use frostdb_core::testing::free_port;
use frostdb_pprof::convert::otlp::proto as otlp;
use frostdb_pprof::convert::push::proto as push;
use prost::Message;
use serde_json::Value;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const GO_CPU: &str = "pprof/pyroscope__go-cpu.pb.gz";

/// The sum of a sample type's values in a pprof file.
fn total(file: &str, sample_type: &str) -> i64 {
    let p = frostdb_pprof::decode(&testdata(file), &frostdb_pprof::Limits::default()).unwrap();
    let i = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == sample_type)
        .unwrap();
    p.sample.iter().map(|s| s.value[i]).sum()
}

fn push_request(name: &str, labels: &[(&str, &str)], profile: Vec<u8>) -> push::PushRequest {
    let mut l = vec![push::LabelPair {
        name: "__name__".into(),
        value: name.into(),
    }];
    l.extend(labels.iter().map(|(k, v)| push::LabelPair {
        name: (*k).into(),
        value: (*v).into(),
    }));
    push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels: l,
            samples: vec![push::RawSample {
                raw_profile: profile,
                id: String::new(),
            }],
        }],
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

async fn post(
    url: &str,
    tenant: Option<&str>,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, String) {
    let mut req = reqwest::Client::new().post(url).body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(t) = tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn push_proto(s: &Server, tenant: Option<&str>, req: &push::PushRequest) -> (u16, String) {
    post(
        &format!("{}/push.v1.PusherService/Push", s.url),
        tenant,
        &[("content-type", "application/proto")],
        req.encode_to_vec(),
    )
    .await
}

/// The top table of `selector` as the server answers it: status and body.
async fn top_of(s: &Server, selector: &str) -> (u16, String) {
    get(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            enc(selector)
        ),
        None,
    )
    .await
}

async fn top_total(s: &Server, tenant: Option<&str>, selector: &str) -> i64 {
    let top = get_json(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            enc(selector)
        ),
        tenant,
    )
    .await;
    top["total"].as_i64().unwrap()
}

#[tokio::test]
async fn push_in_every_encoding_then_query_every_way() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let raw = testdata(GO_CPU);
    let want = total(GO_CPU, "cpu");

    // Binary protobuf, gzipped pprof inside.
    let (status, body) = push_proto(
        &s,
        None,
        &push_request("process_cpu", &[("service_name", "a")], raw.clone()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Binary protobuf, the whole body gzipped.
    let req = push_request("process_cpu", &[("service_name", "b")], raw.clone());
    let (status, body) = post(
        &format!("{}/push.v1.PusherService/Push", s.url),
        None,
        &[
            ("content-type", "application/proto"),
            ("content-encoding", "gzip"),
        ],
        gzip(&req.encode_to_vec()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Proto JSON with a base64 rawProfile.
    use base64::Engine;
    let json = serde_json::json!({"series": [{
        "labels": [{"name": "__name__", "value": "process_cpu"}, {"name": "service_name", "value": "c"}],
        "samples": [{"rawProfile": base64::engine::general_purpose::STANDARD.encode(&raw), "ID": "x"}],
    }]});
    let (status, body) = post(
        &format!("{}/push.v1.PusherService/Push", s.url),
        None,
        &[("content-type", "application/json")],
        json.to_string().into_bytes(),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "{}"));

    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    assert!(
        types.as_array().unwrap().iter().any(|t| t["id"] == CPU),
        "{types}"
    );
    let values = get_json(&format!("{}/api/v1/label/service_name/values", s.url), None).await;
    assert_eq!(values, serde_json::json!(["a", "b", "c"]));
    let names = get_json(&format!("{}/api/v1/labels", s.url), None).await;
    assert!(
        names
            .as_array()
            .unwrap()
            .contains(&Value::from("service_name")),
        "{names}"
    );
    let series = get_json(
        &format!(
            "{}/api/v1/series?selector={}",
            s.url,
            enc(&format!("{CPU}{{}}"))
        ),
        None,
    )
    .await;
    assert_eq!(series.as_array().unwrap().len(), 3, "{series}");

    for svc in ["a", "b", "c"] {
        assert_eq!(
            top_total(&s, None, &format!("{CPU}{{service_name=\"{svc}\"}}")).await,
            want
        );
    }
    assert_eq!(top_total(&s, None, &format!("{CPU}{{}}")).await, 3 * want);
    // Regex and negative matchers.
    assert_eq!(
        top_total(&s, None, &format!("{CPU}{{service_name=~\"a|b\"}}")).await,
        2 * want
    );
    assert_eq!(
        top_total(&s, None, &format!("{CPU}{{service_name!=\"a\"}}")).await,
        2 * want
    );

    // Flame graph tree: the root's total, and children sum to at most it.
    let sel = enc(&format!("{CPU}{{service_name=\"a\"}}"));
    let flame = get_json(&format!("{}/api/v1/query?selector={sel}", s.url), None).await;
    assert_eq!(flame["root"]["total"].as_i64().unwrap(), want);
    let children: i64 = flame["root"]["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["total"].as_i64().unwrap())
        .sum();
    assert!(children <= want && children > 0);
    // `max_nodes=1`: one named node, the rest summed into `other`, the total unchanged.
    let small = get_json(
        &format!("{}/api/v1/query?selector={sel}&max_nodes=1", s.url),
        None,
    )
    .await;
    assert_eq!(small["root"]["total"].as_i64().unwrap(), want);
    fn count(node: &serde_json::Value, name: Option<&str>) -> usize {
        let here = usize::from(name.is_none_or(|n| node["name"] == n));
        let below = node["children"]
            .as_array()
            .map_or(0, |c| c.iter().map(|c| count(c, name)).sum());
        here + below
    }
    let others = count(&small["root"], Some("other"));
    assert_eq!(count(&small["root"], None) - 1 - others, 1, "{small}");
    assert!(
        others >= 1 && small["truncated"].as_u64().unwrap() > 0,
        "{small}"
    );
    // Folded: the values add up.
    let (status, folded) = get(
        &format!("{}/api/v1/query?format=folded&selector={sel}", s.url),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let sum: i64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(sum, want);
    // pprof: decodes, same total.
    let bytes = reqwest::get(format!(
        "{}/api/v1/query?format=pprof&selector={sel}",
        s.url
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    let p = frostdb_pprof::decode(&bytes, &frostdb_pprof::Limits::default()).unwrap();
    assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), want);
    // SVG.
    let (status, svg) = get(
        &format!("{}/api/v1/query?format=svg&selector={sel}", s.url),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        svg.starts_with("<?xml") || svg.starts_with("<svg"),
        "{}",
        &svg[..100.min(svg.len())]
    );
    // Range: one series per service, values adding up to the total.
    let range = get_json(
        &format!(
            "{}/api/v1/query_range?step=1h&selector={}",
            s.url,
            enc(&format!("{CPU}{{}}"))
        ),
        None,
    )
    .await;
    let series = range["series"].as_array().unwrap();
    assert_eq!(series.len(), 3, "{range}");
    let sum: i64 = series
        .iter()
        .flat_map(|s| s["points"].as_array().unwrap())
        .map(|p| p[1].as_i64().unwrap())
        .sum();
    assert_eq!(sum, 3 * want);
    // Timestamps of the series.
    let ts = get_json(&format!("{}/api/v1/timestamps?selector={sel}", s.url), None).await;
    assert_eq!(ts.as_array().unwrap().len(), 1);
    // Diff of two services: same profile, so base equals compare everywhere.
    let diff = get_json(
        &format!(
            "{}/api/v1/diff?base={}&compare={}",
            s.url,
            enc(&format!("{CPU}{{service_name=\"a\"}}")),
            enc(&format!("{CPU}{{service_name=~\"b|c\"}}"))
        ),
        None,
    )
    .await;
    assert_eq!(diff["base"].as_i64().unwrap(), want);
    assert_eq!(diff["compare"].as_i64().unwrap(), 2 * want);
    // Truncated as a flame graph is: one named callee of the root, the rest one `other`,
    // the totals whole; past the cap, refused.
    let url = |max_nodes: u64| {
        format!(
            "{}/api/v1/diff?base={}&compare={}&max_nodes={max_nodes}",
            s.url,
            enc(&format!("{CPU}{{service_name=\"a\"}}")),
            enc(&format!("{CPU}{{service_name=~\"b|c\"}}"))
        )
    };
    let cut = get_json(&url(1), None).await;
    assert_eq!(cut["base"].as_i64().unwrap(), want);
    assert_eq!(cut["compare"].as_i64().unwrap(), 2 * want);
    let mut named = 0;
    let mut nodes = vec![&cut];
    while let Some(node) = nodes.pop() {
        for child in node["children"].as_array().into_iter().flatten() {
            named += usize::from(child["name"] != "other");
            nodes.push(child);
        }
    }
    assert_eq!(named, 1, "{cut}");
    let (status, body) = get(&url(1 << 40), None).await;
    assert_eq!(status, 400, "{body}");
    // SQL.
    let rows = get_json(
        &format!("{}/api/v1/sql?q={}", s.url, enc("SELECT \"labels.service_name\" AS s, sum(value) AS v FROM samples WHERE sample_type = 'cpu' GROUP BY 1 ORDER BY 1")),
        None,
    )
    .await;
    assert_eq!(rows["rows"].as_array().unwrap().len(), 3, "{rows}");
    assert_eq!(rows["rows"][0]["v"].as_i64().unwrap(), want);

    // `go tool pprof` reads the pprof URL.
    if common::have("go", "version") {
        let out = std::process::Command::new("go")
            .args(["tool", "pprof", "-top"])
            .arg(format!(
                "{}/api/v1/query?format=pprof&selector={sel}",
                s.url
            ))
            .env("HOME", dir.path())
            .env("PPROF_TMPDIR", dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("flat%"), "{stdout}");
    }
}

#[tokio::test]
async fn bad_requests_get_clear_4xx_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[limits]\nmax_body_bytes = 200000\nmax_decompressed_bytes = 1000000\nmax_series_per_tenant = 2\n";
    let s = Server::start(&dir.path().join("data"), Some(config));
    let raw = testdata(GO_CPU);
    let url = format!("{}/push.v1.PusherService/Push", s.url);
    let proto = [("content-type", "application/proto")];

    // Garbage protobuf.
    let (status, body) = post(&url, None, &proto, b"\xff\xff\xff garbage".to_vec()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("PushRequest"), "{body}");
    // A garbage pprof inside a good request names the sample.
    let (status, body) = push_proto(
        &s,
        None,
        &push_request("process_cpu", &[], b"nope".to_vec()),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("series[0].samples[0]"), "{body}");
    // Truncated gzip.
    let (status, body) = push_proto(
        &s,
        None,
        &push_request("process_cpu", &[], raw[..raw.len() / 2].to_vec()),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // No profile name.
    let mut req = push_request("process_cpu", &[], raw.clone());
    req.series[0].labels.remove(0);
    let (status, body) = push_proto(&s, None, &req).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("__name__"), "{body}");
    // A body over the limit.
    let (status, _) = post(&url, None, &proto, vec![0u8; 300_000]).await;
    assert_eq!(status, 413);
    // A decompression bomb: 50 MB of zeros in a small gzip body.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&vec![0u8; 50_000_000]).unwrap();
    let bomb = e.finish().unwrap();
    assert!(bomb.len() < 200_000);
    let (status, body) = post(
        &url,
        None,
        &[
            ("content-type", "application/proto"),
            ("content-encoding", "gzip"),
        ],
        bomb.clone(),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    // The same bomb as a sample's pprof: over the limit too, and the sample is named.
    let (status, body) = push_proto(&s, None, &push_request("process_cpu", &[], bomb)).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("series[0].samples[0]"), "{body}");
    // Unknown content types and encodings.
    let (status, _) = post(&url, None, &[("content-type", "text/csv")], vec![]).await;
    assert_eq!(status, 415);
    let (status, _) = post(
        &url,
        None,
        &[
            ("content-type", "application/proto"),
            ("content-encoding", "br"),
        ],
        vec![],
    )
    .await;
    assert_eq!(status, 415);
    // Bad tenant ids.
    let (status, body) = push_proto(
        &s,
        Some("../etc"),
        &push_request("process_cpu", &[], raw.clone()),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // Series limit: two series pass, a third is refused, known ones still pass.
    for svc in ["a", "b"] {
        let (status, body) = push_proto(
            &s,
            None,
            &push_request("process_cpu", &[("service_name", svc)], raw.clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = push_proto(
        &s,
        None,
        &push_request("process_cpu", &[("service_name", "c")], raw.clone()),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("limit of 2 series"), "{body}");
    let (status, _) = push_proto(
        &s,
        None,
        &push_request("process_cpu", &[("service_name", "a")], raw.clone()),
    )
    .await;
    assert_eq!(status, 200);
    // (That push repeated series a's profile, time and samples: a retry, stored once.)

    // Query errors: a bad selector points at the column, no profile type, bad times, SQL.
    let (status, body) = get(
        &format!(
            "{}/api/v1/query?selector={}",
            s.url,
            enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{a=~}")
        ),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("column"), "{body}");
    let (status, body) = get(
        &format!("{}/api/v1/query?selector={}", s.url, enc("{a=\"b\"}")),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("profile type"), "{body}");
    let (status, _) = get(
        &format!(
            "{}/api/v1/query?selector={}&from=yesterday",
            s.url,
            enc(CPU)
        ),
        None,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = get(
        &format!("{}/api/v1/query?selector={}&format=gif", s.url, enc(CPU)),
        None,
    )
    .await;
    assert_eq!(status, 400);
    let (status, body) = get(
        &format!("{}/api/v1/sql?q={}", s.url, enc("SELECT nope FROM samples")),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = get(
        &format!(
            "{}/api/v1/sql?q={}",
            s.url,
            enc("CREATE TABLE t AS SELECT 1")
        ),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // The SQL route reads only: no COPY, external tables, settings or file table functions.
    for q in [
        "COPY samples TO '/tmp/frostdb-leak.parquet'",
        "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
        "SET datafusion.execution.batch_size = 1",
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
    ] {
        let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
        assert_eq!(status, 400, "{q}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert!(error["error"].is_string(), "{q}: {body}");
    }
    assert!(!std::path::Path::new("/tmp/frostdb-leak.parquet").exists());

    // Unknown routes and methods get the JSON error body too.
    let (status, body) = get(&format!("{}/api/v1/nope", s.url), None).await;
    assert_eq!(status, 404, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"].as_str().unwrap().contains("/api/v1/nope"),
        "{body}"
    );
    assert_eq!(error["code"], "not_found");
    let (status, body) = post(&format!("{}/api/v1/labels", s.url), None, &[], vec![]).await;
    assert_eq!(status, 405, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(error["error"].as_str().unwrap().contains("POST"), "{body}");

    // Nothing stored was lost on the way: the two series are intact, the retry not
    // counted twice.
    assert_eq!(
        top_total(&s, None, &format!("{CPU}{{}}")).await,
        2 * total(GO_CPU, "cpu")
    );
}

#[tokio::test]
async fn tenants_never_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let raw = testdata(GO_CPU);
    assert_eq!(
        push_proto(
            &s,
            Some("team-a"),
            &push_request("process_cpu", &[("service_name", "secret-a")], raw.clone())
        )
        .await
        .0,
        200
    );
    assert_eq!(
        push_proto(
            &s,
            Some("team-b"),
            &push_request("process_cpu", &[("service_name", "b")], raw.clone())
        )
        .await
        .0,
        200
    );
    let values = |t: &'static str| {
        let url = format!("{}/api/v1/label/service_name/values", s.url);
        async move { get_json(&url, Some(t)).await }
    };
    assert_eq!(values("team-a").await, serde_json::json!(["secret-a"]));
    assert_eq!(values("team-b").await, serde_json::json!(["b"]));
    assert_eq!(values("team-c").await, serde_json::json!([]));
    // Default tenant: nothing.
    assert_eq!(
        get_json(&format!("{}/api/v1/profile_types", s.url), None).await,
        serde_json::json!([])
    );
    // A selector naming the other tenant's label finds nothing, and the values it lists
    // are the tenant's own.
    let (status, body) = get(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            enc(&format!("{CPU}{{service_name=\"secret-a\"}}"))
        ),
        Some("team-b"),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"].as_str().unwrap().ends_with("its values: b"),
        "{body}"
    );
    assert_eq!(
        top_total(&s, Some("team-a"), &format!("{CPU}{{}}")).await,
        total(GO_CPU, "cpu")
    );
    // SQL runs on the caller's tables only.
    let rows = get_json(
        &format!(
            "{}/api/v1/sql?q={}",
            s.url,
            enc("SELECT DISTINCT \"labels.service_name\" AS s FROM samples")
        ),
        Some("team-b"),
    )
    .await;
    assert_eq!(rows["rows"], serde_json::json!([{"s": "b"}]));
    let (status, _) = get(
        &format!("{}/api/v1/sql?q={}", s.url, enc("SELECT 1")),
        Some("team-c"),
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn bearer_token_guards_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), Some("token = \"s3cret\"\n"));
    let url = format!("{}/api/v1/profile_types", s.url);
    let (status, body) = get(&url, None).await;
    assert_eq!(status, 401, "{body}");
    let r = reqwest::Client::new()
        .get(&url)
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = reqwest::Client::new()
        .get(&url)
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // The page itself loads (it asks for the token when the API refuses).
    assert_eq!(get(&format!("{}/", s.url), None).await.0, 200);
}

/// A tenant's own token acts for that tenant only: another tenant in X-Scope-OrgID is
/// refused 403, none means its own, and /metrics and /healthz show it nothing of others,
/// not even their names. The server's token still acts for any tenant and sees all.
#[tokio::test]
async fn a_tenants_token_reads_and_writes_that_tenant_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some(
            "token = \"ops\"\n[tenants.team-a]\ntoken = \"ta\"\n[tenants.team-b]\ntoken = \"tb\"\n",
        ),
    );
    let call = |method: reqwest::Method, path: &str, token: &str, tenants: &[&str]| {
        let mut r = reqwest::Client::new()
            .request(method, format!("{}{path}", s.url))
            .bearer_auth(token);
        for t in tenants {
            r = r.header("X-Scope-OrgID", *t);
        }
        r
    };
    let text = async |r: reqwest::RequestBuilder| {
        let r = r.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    // team-a records a rule and pushes, with its token and no header.
    let rule = serde_json::json!({
        "name": "a_cpu_nanoseconds_total",
        "profile_type": CPU,
        "selector": "{}",
        "keep_labels": ["service_name"],
    });
    let put = call(
        reqwest::Method::PUT,
        "/api/v1/rules/a_cpu_nanoseconds_total",
        "ta",
        &[],
    )
    .body(rule.to_string());
    assert_eq!(text(put).await.0, 200);
    let pushed = call(
        reqwest::Method::POST,
        "/ingest?name=secret-a.cpu&format=pprof",
        "ta",
        &[],
    )
    .body(testdata(GO_CPU));
    assert_eq!(text(pushed).await.0, 200);
    let types = "/api/v1/profile_types";
    // team-b's token cannot name team-a, whatever it asks.
    let (status, body) = text(call(reqwest::Method::GET, types, "tb", &["team-a"])).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("acts for tenant \\\"team-b\\\" only"),
        "{body}"
    );
    let (status, body) = text(call(
        reqwest::Method::DELETE,
        "/api/v1/rules/a_cpu_nanoseconds_total",
        "tb",
        &["team-a"],
    ))
    .await;
    assert_eq!(status, 403, "{body}");
    // Without a header each token is its own tenant.
    let (status, b_types) = text(call(reqwest::Method::GET, types, "tb", &[])).await;
    assert_eq!((status, b_types.as_str()), (200, "[]"));
    let (status, a_types) = text(call(reqwest::Method::GET, types, "ta", &[])).await;
    assert_eq!(status, 200);
    assert!(a_types.contains("process_cpu"), "{a_types}");
    // The server's token acts for whichever tenant is named; two names are refused.
    let (status, ops_types) = text(call(reqwest::Method::GET, types, "ops", &["team-a"])).await;
    assert_eq!((status, ops_types), (200, a_types));
    let (status, body) = text(call(
        reqwest::Method::GET,
        types,
        "ops",
        &["team-a", "team-b"],
    ))
    .await;
    assert_eq!(status, 400, "{body}");
    // /metrics: team-a's series to team-a and the server, nothing of team-a to team-b.
    let series = "a_cpu_nanoseconds_total{tenant=\"team-a\"";
    let (status, ops) = text(call(reqwest::Method::GET, "/metrics", "ops", &[])).await;
    assert_eq!(status, 200);
    assert!(
        ops.contains(series) && ops.contains("frostdb_open_tenants"),
        "{ops}"
    );
    let (_, own) = text(call(reqwest::Method::GET, "/metrics", "ta", &[])).await;
    assert!(
        own.contains(series) && !own.contains("frostdb_open_tenants"),
        "{own}"
    );
    let (_, other) = text(call(reqwest::Method::GET, "/metrics", "tb", &[])).await;
    assert!(
        !other.contains("team-a") && !other.contains("secret-a"),
        "{other}"
    );
    assert_eq!(
        text(call(reqwest::Method::GET, types, "nobody", &[]))
            .await
            .0,
        401
    );
}

#[tokio::test]
async fn legacy_ingest_speaks_folded_lines_pprof_and_multipart() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let ingest = |q: &str| format!("{}/ingest?{q}", s.url);
    // Folded at 100 Hz: each sample is 10 ms of CPU; from in seconds.
    let (status, body) = post(
        &ingest(&format!(
            "name={}&from=1763805600&until=1763805610&sampleRate=100&spyName=pyspy",
            enc("shop.cpu{env=prod}")
        )),
        None,
        &[("content-type", "text/plain")],
        b"main;work;hash 3\nmain;work 2\nmain;work;hash 1\n".to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sel = enc(&format!(
        "{CPU}{{service_name=\"shop\",env=\"prod\",pyroscope_spy=\"pyspy\"}}"
    ));
    let (_, folded) = get(
        &format!("{}/api/v1/query?format=folded&selector={sel}", s.url),
        None,
    )
    .await;
    let mut lines: Vec<&str> = folded.lines().collect();
    lines.sort();
    assert_eq!(lines, ["main;work 20000000", "main;work;hash 40000000"]);
    let ts = get_json(&format!("{}/api/v1/timestamps?selector={sel}", s.url), None).await;
    assert_eq!(ts, serde_json::json!([1_763_805_600_000i64]));
    // Lines: one sample per line; from in nanoseconds.
    let (status, _) = post(
        &ingest("name=lines.cpu&format=lines&from=1763805600000000000"),
        None,
        &[],
        b"a;b\na;b\na\n".to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        top_total(&s, None, &format!("{CPU}{{service_name=\"lines\"}}")).await,
        30_000_000
    );
    // pprof body (format=pprof), gzipped pprof as clients send it.
    let (status, body) = post(
        &ingest("name=gocpu.cpu&format=pprof"),
        None,
        &[("content-type", "binary/octet-stream")],
        testdata(GO_CPU),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        top_total(&s, None, &format!("{CPU}{{service_name=\"gocpu\"}}")).await,
        total(GO_CPU, "cpu")
    );
    // Multipart with prev_profile: the same heap twice gives zero allocations, the in-use
    // types as they are.
    let heap = testdata("pprof/goapp__go119-heap.pb.gz");
    let form = reqwest::multipart::Form::new()
        .part(
            "profile",
            reqwest::multipart::Part::bytes(heap.clone()).file_name("profile.pprof"),
        )
        .part(
            "prev_profile",
            reqwest::multipart::Part::bytes(heap.clone()).file_name("profile.pprof"),
        )
        .part(
            "sample_type_config",
            reqwest::multipart::Part::bytes(br#"{"alloc_space":{"units":"bytes"}}"#.to_vec()),
        );
    let r = reqwest::Client::new()
        .post(ingest("name=goheap{}&from=1763805600"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    // No allocation between the two: no alloc_space sample was stored, and a query of it
    // says so rather than answer an empty profile.
    let (status, body) = get(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            enc("memory:alloc_space:bytes:space:bytes{service_name=\"goheap\"}")
        ),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("no profile type memory:alloc_space:bytes:space:bytes is stored"),
        "{body}"
    );
    assert_eq!(
        top_total(
            &s,
            None,
            "memory:inuse_space:bytes:space:bytes{service_name=\"goheap\"}"
        )
        .await,
        total("pprof/goapp__go119-heap.pb.gz", "inuse_space")
    );
    // pyroscope-go sends its block and mutex profiles under one name, told apart only by
    // the display names of their sample types: each is stored as its own type (both were
    // `mutex`, summed). Folded lock bodies are named by their suffix.
    for (file, kind) in [
        ("pprof/goapp__go119-block.pb.gz", "block"),
        ("pprof/goapp__go119-mutex.pb.gz", "mutex"),
    ] {
        let config = format!(
            r#"{{"contentions":{{"display-name":"{kind}_count","units":"lock_samples"}},"delay":{{"display-name":"{kind}_duration","units":"lock_nanoseconds"}}}}"#
        );
        let form = reqwest::multipart::Form::new()
            .part(
                "profile",
                reqwest::multipart::Part::bytes(testdata(file)).file_name("profile.pprof"),
            )
            .part(
                "sample_type_config",
                reqwest::multipart::Part::bytes(config.into_bytes()),
            );
        let r = reqwest::Client::new()
            .post(ingest("name=golock{}&from=1763805600"))
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    }
    for (file, kind) in [
        ("pprof/goapp__go119-block.pb.gz", "block"),
        ("pprof/goapp__go119-mutex.pb.gz", "mutex"),
    ] {
        assert_eq!(
            top_total(
                &s,
                None,
                &format!("{kind}:contentions:count:contentions:count{{service_name=\"golock\"}}")
            )
            .await,
            total(file, "contentions"),
            "{kind}"
        );
    }
    let (status, body) = post(
        &ingest("name=folded.block_count&units=lock_samples"),
        None,
        &[],
        b"a;b 3\n".to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        top_total(
            &s,
            None,
            "block:contentions:count:contentions:count{service_name=\"folded\"}"
        )
        .await,
        3
    );
    // What is not supported says so.
    let (status, body) = post(&ingest("name=x&format=flamegraph"), None, &[], vec![1]).await;
    assert_eq!(status, 400);
    assert!(body.contains("unknown format"), "{body}");
    let (status, body) = post(&ingest("name=x"), None, &[], b"a;b notanumber\n".to_vec()).await;
    assert_eq!(status, 400);
    assert!(body.contains("line 1"), "{body}");
    let (status, _) = post(&ingest("from=1"), None, &[], b"a 1\n".to_vec()).await;
    assert_eq!(status, 400);
}

/// The stacks of `selector` as sorted `root;…;leaf value` lines.
async fn folded_lines(s: &Server, selector: &str) -> Vec<String> {
    let (status, folded) = get(
        &format!(
            "{}/api/v1/query?format=folded&selector={}",
            s.url,
            enc(selector)
        ),
        None,
    )
    .await;
    assert_eq!(status, 200, "{folded}");
    let mut lines: Vec<String> = folded.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn legacy_ingest_speaks_trie_tree_and_speedscope() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let ingest = |q: &str| format!("{}/ingest?{q}&from=1763805600", s.url);
    // A transport trie as the first Go agent sent it (by content type, no format), and the
    // same stacks as a tree (by format): `foo;bar 2`, `foo;baz 3` samples at 100 Hz.
    let trie = b"\x00\x00\x01\x06foo;ba\x00\x02\x01r\x02\x00\x01z\x03\x00".to_vec();
    let (status, body) = post(
        &ingest("name=trie.cpu"),
        None,
        &[("content-type", "binary/octet-stream+trie")],
        trie.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let tree = b"\x00\x00\x01\x03foo\x00\x02\x03bar\x02\x00\x03baz\x03\x00".to_vec();
    let (status, body) = post(&ingest("name=tree.cpu&format=tree"), None, &[], tree).await;
    assert_eq!(status, 200, "{body}");
    for app in ["trie", "tree"] {
        assert_eq!(
            folded_lines(&s, &format!("{CPU}{{service_name=\"{app}\"}}")).await,
            ["foo;bar 20000000", "foo;baz 30000000"],
            "{app}"
        );
    }
    // speedscope's own two-profile sample: each profile under its name, in seconds.
    let file = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/speedscope/0.6.0_two-sampled.speedscope.json"),
    )
    .unwrap();
    let (status, body) = post(&ingest("name=scope&format=speedscope"), None, &[], file).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["profiles"], 2, "{body}");
    for profile in ["one", "two"] {
        assert_eq!(
            folded_lines(
                &s,
                &format!("{CPU}{{service_name=\"scope\",profile_name=\"{profile}\"}}")
            )
            .await,
            ["a;b 5000000000", "a;b;c 5000000000", "a;b;d 4000000000"],
            "{profile}"
        );
    }
    // Broken bodies are refused, naming what is wrong, and store nothing.
    let mut cut = trie.clone();
    cut.truncate(cut.len() - 4);
    for (query, body, want) in [
        (
            "name=broken&format=trie",
            cut,
            "trie body: invalid trie: byte 16: the body ends while a node still expects 1 more",
        ),
        (
            "name=broken&format=tree",
            b"\x00\x00\x01\x09foo".to_vec(),
            "invalid tree: byte 3: a node's name of 9 bytes, but 3 bytes are left",
        ),
        (
            "name=broken&format=speedscope",
            br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"}]},"profiles":[{"type":"sampled","name":"p","unit":"seconds","startValue":0,"endValue":1,"samples":[[0],[7]],"weights":[1,1]}]}"#.to_vec(),
            "profiles[0].samples[1]: frame 7 of 1 shared frames",
        ),
    ] {
        let (status, answer) = post(&ingest(query), None, &[], body).await;
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(answer.contains(want), "{query}: {answer}");
    }
    // A trie bomb: one stack of 3,000 frames named once, 3,000 one-byte leaves below it (9
    // million frames from 27 kB) is refused before it is built.
    let mut bomb = b"\x00\x00\x01".to_vec();
    for _ in 0..3_000 {
        bomb.extend_from_slice(b"\x02f;\x00\x01");
    }
    bomb.pop();
    bomb.extend_from_slice(&[0x80 | (3_000 & 0x7f) as u8, (3_000 >> 7) as u8]);
    for i in 0..3_000u32 {
        bomb.extend_from_slice(&[2, b'a' + (i % 26) as u8, b'a' + (i / 26 % 26) as u8, 1, 0]);
    }
    let (status, answer) = post(&ingest("name=broken&format=trie"), None, &[], bomb).await;
    assert_eq!(status, 413, "{answer}");
    assert!(
        answer.contains("bytes of frames the body expands to"),
        "{answer}"
    );
    let (status, body) = top_of(&s, &format!("{CPU}{{service_name=\"broken\"}}")).await;
    assert_eq!(status, 400, "{body}");
}

fn jfr_testdata(name: &str) -> Vec<u8> {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/jfr")
            .join(name),
    )
    .unwrap()
}

/// Per profile type a recording makes, the total of its values.
fn jfr_totals(recording: &[u8], labels: Option<&[u8]>) -> Vec<(String, i64)> {
    let converted =
        frostdb_pprof::convert::jfr::convert(recording, labels, 100, &Default::default()).unwrap();
    let mut out = Vec::new();
    for c in &converted.profiles {
        let p = &c.profile;
        let s = |i: i64| p.string_table[i as usize].as_str();
        let period = p.period_type.as_ref().unwrap();
        for (i, t) in p.sample_type.iter().enumerate() {
            out.push((
                format!(
                    "{}:{}:{}:{}:{}",
                    c.profile_name,
                    s(t.r#type),
                    s(t.unit),
                    s(period.r#type),
                    s(period.unit)
                ),
                p.sample.iter().map(|x| x.value[i]).sum(),
            ));
        }
    }
    out
}

#[tokio::test]
async fn legacy_ingest_takes_jfr_as_pyroscope_java_sends_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let ingest = |q: &str| format!("{}/ingest?{q}&from=1763805600", s.url);
    // pyroscope-java's form: the recording and its context labels, each gzipped.
    let recording = jfr_testdata("new_spancontext.jfr.gz");
    let labels = jfr_testdata("new_spancontext.labels.gz");
    let form = reqwest::multipart::Form::new()
        .part(
            "jfr",
            reqwest::multipart::Part::bytes(recording.clone()).file_name("jfr"),
        )
        .part(
            "labels",
            reqwest::multipart::Part::bytes(labels.clone()).file_name("labels"),
        );
    let r = reqwest::Client::new()
        .post(ingest(
            "name=javaapp{env=prod}&format=jfr&sampleRate=100&spyName=javaspy",
        ))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["profile_types"], serde_json::json!([CPU]), "{body}");
    assert_eq!(answer["series_labels"]["jfr_event"], "ctimer", "{body}");
    let want = jfr_totals(&recording, Some(&labels));
    assert_eq!(want[0].0, CPU);
    assert!(want[0].1 > 0);
    assert_eq!(
        top_total(
            &s,
            None,
            &format!("{CPU}{{service_name=\"javaapp\",env=\"prod\"}}")
        )
        .await,
        want[0].1
    );
    // A context's labels are the samples' labels: the `dyn2="v2"` context alone.
    let dyn2 = top_total(
        &s,
        None,
        &format!("{CPU}{{service_name=\"javaapp\",dyn2=\"v2\"}}"),
    )
    .await;
    assert!(dyn2 > 0 && dyn2 < want[0].1, "dyn2 {dyn2} of {}", want[0].1);

    // The raw recording as the body: every kind of profile in it stored, totals kept.
    let recording = jfr_testdata("example.jfr.gz");
    let (status, body) = post(
        &ingest("name=javaraw&format=jfr"),
        None,
        &[],
        recording.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let want = jfr_totals(&recording, None);
    assert_eq!(want.len(), 7, "{want:?}");
    for (profile_type, total) in &want {
        assert!(
            answer["profile_types"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t == profile_type),
            "{profile_type} in {body}"
        );
        assert_eq!(
            top_total(
                &s,
                None,
                &format!("{profile_type}{{service_name=\"javaraw\"}}")
            )
            .await,
            *total,
            "{profile_type}"
        );
    }

    // Cut short, garbage, a bomb: refused, naming the problem, nothing stored.
    let raw = frostdb_pprof::inflate(&recording, 64 << 20)
        .unwrap()
        .into_owned();
    // 300 MB of zeros as 300 gzip members of a megabyte (quick to make in a debug build).
    let bomb = gzip(&vec![0u8; 1 << 20]).repeat(300);
    for (body, status_want, want) in [
        (
            raw[..raw.len() / 2].to_vec(),
            400,
            "JFR recording: invalid JFR: byte 8 (chunk 0): the chunk says it is",
        ),
        (b"PK\x03\x04 not a recording".to_vec(), 400, "no FLR magic"),
        (Vec::new(), 400, "the recording is empty"),
        (bomb, 413, "JFR recording"),
    ] {
        let (status, answer) = post(&ingest("name=broken&format=jfr"), None, &[], body).await;
        assert_eq!(status, status_want, "{answer}");
        assert!(answer.contains(want), "{want}: {answer}");
    }
    let (status, body) = top_of(&s, &format!("{CPU}{{service_name=\"broken\"}}")).await;
    assert_eq!(status, 400, "nothing of broken is stored: {body}");
}

#[tokio::test]
async fn otlp_export_of_the_ebpf_profiler_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let bytes = testdata("otlp/pyroscope__otel-ebpf-profile.ExportProfilesServiceRequest.pb");
    let (status, body) = post(
        &format!("{}/v1development/profiles", s.url),
        None,
        &[("content-type", "application/x-protobuf")],
        bytes.clone(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let types: Vec<String> = get_json(&format!("{}/api/v1/profile_types", s.url), None)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(types.contains(&CPU.to_owned()), "{types:?}");
    assert!(
        types
            .iter()
            .any(|t| t.starts_with("off_cpu:off_cpu:nanoseconds")),
        "{types:?}"
    );
    // The CPU total is the sample count times the 50 ms period.
    let request = otlp::ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap();
    let dict = request.dictionary.as_ref().unwrap();
    let mut want = 0i64;
    for p in request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
    {
        let t = p.sample_type.as_ref().unwrap();
        if dict.string_table[t.type_strindex as usize] == "samples" {
            for s in &p.samples {
                let n: i64 = if s.values.is_empty() {
                    s.timestamps_unix_nano.len() as i64
                } else {
                    s.values.iter().sum()
                };
                want += n * p.period;
            }
        }
    }
    assert!(want > 0);
    assert_eq!(top_total(&s, None, &format!("{CPU}{{}}")).await, want);
    let services = get_json(&format!("{}/api/v1/label/service_name/values", s.url), None).await;
    assert!(!services.as_array().unwrap().is_empty());

    // The same export over gRPC (as OTel collectors send it, gzip-compressed), into a tenant.
    use frostdb_server::ingest::otlp::grpc::profiles_service_client::ProfilesServiceClient;
    let channel = tonic::transport::Channel::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ProfilesServiceClient::new(channel)
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    let mut grpc_request = tonic::Request::new(request);
    grpc_request
        .metadata_mut()
        .insert("x-scope-orgid", "otlp-grpc".parse().unwrap());
    client.export(grpc_request).await.unwrap();
    assert_eq!(
        top_total(&s, Some("otlp-grpc"), &format!("{CPU}{{}}")).await,
        want
    );
    // Garbage is refused with INVALID_ARGUMENT, and nothing is stored for it.
    let mut bad = otlp::ExportProfilesServiceRequest::default();
    bad.resource_profiles
        .push(otlp::ResourceProfiles::default());
    bad.resource_profiles[0]
        .scope_profiles
        .push(otlp::ScopeProfiles::default());
    bad.resource_profiles[0].scope_profiles[0]
        .profiles
        .push(otlp::Profile {
            sample_type: Some(otlp::ValueType {
                type_strindex: 99,
                ..Default::default()
            }),
            ..Default::default()
        });
    let error = client.export(tonic::Request::new(bad)).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error}");
}

#[tokio::test]
async fn sigterm_flushes_and_a_restart_has_everything() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::start(&data, None);
    let raw = testdata(GO_CPU);
    for svc in ["a", "b"] {
        assert_eq!(
            push_proto(
                &s,
                Some("t1"),
                &push_request("process_cpu", &[("service_name", svc)], raw.clone())
            )
            .await
            .0,
            200
        );
    }
    assert!(s.terminate(), "the server must exit cleanly on SIGTERM");
    let s = Server::start(&data, None);
    assert!(s.log().contains("opened tenant"), "{}", s.log());
    assert_eq!(
        top_total(&s, Some("t1"), &format!("{CPU}{{}}")).await,
        2 * total(GO_CPU, "cpu")
    );
}

#[tokio::test]
async fn a_stalled_client_does_not_stall_others() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let addr = s.url.trim_start_matches("http://").to_owned();
    // Half a request: headers promise a body that never comes.
    let mut stalled = std::net::TcpStream::connect(&addr).unwrap();
    stalled
        .write_all(
            b"POST /ingest?name=x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\nmain 1",
        )
        .unwrap();
    // Others are served meanwhile.
    for _ in 0..5 {
        assert_eq!(
            get(&format!("{}/api/v1/profile_types", s.url), None)
                .await
                .0,
            200
        );
        let (status, _) = push_proto(
            &s,
            None,
            &push_request("process_cpu", &[], testdata(GO_CPU)),
        )
        .await;
        assert_eq!(status, 200);
    }
    drop(stalled);
}

/// Starts shared/tools/goapp (built with Debian's Go) on `addr`; returns its pid.
fn start_goapp(addr: &str, out: &std::path::Path) -> u32 {
    let run = common::shared().join("tools/goapp/run.sh");
    let output = std::process::Command::new("bash")
        .arg(&run)
        .env("GOAPP_ADDR", addr)
        .env("GOAPP_DURATION", "3m")
        .env("GOAPP_OUT", out)
        .env("HOME", out)
        .env("GOCACHE", out.join("gocache"))
        .output()
        .expect("run.sh");
    assert!(
        output.status.success(),
        "goapp: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

struct Kill(u32);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.0.to_string())
            .status();
    }
}

#[tokio::test]
async fn scrapes_every_go_profile_and_reports_targets_that_are_down() {
    if !common::have("go", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let goapp = format!("127.0.0.1:{}", free_port());
    let _goapp = Kill(start_goapp(&goapp, &dir.path().join("goapp")));
    // Held for the whole test: refused, and no other test's server takes its port.
    let down = common::HeldAddr::new();
    let down = &down.addr;
    let config = format!(
        r#"
[[scrape]]
job = "goapp"
targets = ["{goapp}"]
interval = "2s"
labels = {{ env = "test" }}

[[scrape]]
job = "gone"
targets = ["{down}"]
interval = "1s"
profiles = ["heap"]
"#
    );
    let s = Server::start(&dir.path().join("data"), Some(&config));
    // Wait (bounded) until every goapp profile was scraped three times.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let targets = loop {
        let t = get_json(&format!("{}/api/v1/targets", s.url), None).await;
        let list = t.as_array().unwrap().clone();
        let ready = list
            .iter()
            .filter(|t| t["job"] == "goapp")
            .all(|t| t["scrapes"].as_u64().unwrap() >= 3);
        if ready {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "scrapes did not happen: {t}\n{}",
            s.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    assert_eq!(targets.len(), 7, "{targets:?}");
    for t in &targets {
        if t["job"] == "goapp" {
            assert_eq!(t["health"], "up", "{t}");
        } else {
            assert_eq!(t["health"], "down", "{t}");
            assert!(t["last_error"].as_str().unwrap().len() > 3, "{t}");
            assert!(t["failures"].as_u64().unwrap() >= 1);
        }
    }
    let types: Vec<String> = get_json(&format!("{}/api/v1/profile_types", s.url), None)
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    for want in [
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "process_cpu:samples:count:cpu:nanoseconds",
        "memory:alloc_space:bytes:space:bytes",
        "memory:inuse_space:bytes:space:bytes",
        "allocs:alloc_objects:count:space:bytes",
        "goroutines:goroutine:count:goroutine:count",
        "mutex:contentions:count:contentions:count",
        "mutex:delay:nanoseconds:contentions:count",
        "block:contentions:count:contentions:count",
        "block:delay:nanoseconds:contentions:count",
    ] {
        assert!(
            types.contains(&want.to_owned()),
            "{want} missing from {types:?}"
        );
    }
    let instance = get_json(&format!("{}/api/v1/label/instance/values", s.url), None).await;
    assert_eq!(instance, serde_json::json!([goapp]));
    let env = get_json(&format!("{}/api/v1/label/env/values", s.url), None).await;
    assert_eq!(env, serde_json::json!(["test"]));
    // The goroutine profile shows the program's own functions.
    let (_, folded) = get(
        &format!(
            "{}/api/v1/query?format=folded&selector={}",
            s.url,
            enc("goroutines:goroutine:count:goroutine:count{job=\"goapp\"}")
        ),
        None,
    )
    .await;
    assert!(folded.contains("main."), "{folded}");
    // Allocations are cumulative in Go: stored as deltas, the stored total of every scrape
    // is at most what the program has allocated by now (stored whole, it would be about
    // scrapes × that).
    let stored = top_total(
        &s,
        None,
        "allocs:alloc_space:bytes:space:bytes{job=\"goapp\"}",
    )
    .await;
    let now = reqwest::get(format!("http://{goapp}/debug/pprof/allocs"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let p = frostdb_pprof::decode(&now, &frostdb_pprof::Limits::default()).unwrap();
    let i = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "alloc_space")
        .unwrap();
    let cumulative: i64 = p.sample.iter().map(|s| s.value[i]).sum();
    assert!(stored > 0, "no allocations stored");
    assert!(
        stored <= cumulative,
        "stored {stored} > cumulative {cumulative}: not deltas"
    );
}

#[tokio::test]
async fn the_pyroscope_python_client_pushes_a_real_program() {
    let Some(python) = venv_python("pyroscope") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let out = tokio::process::Command::new(&python)
        .arg(e2e_script("pyroscope_client.py"))
        .args([s.url.as_str(), "py-tenant", "4"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tenant = Some("py-tenant");
    let services = get_json(
        &format!("{}/api/v1/label/service_name/values", s.url),
        tenant,
    )
    .await;
    assert_eq!(
        services,
        serde_json::json!(["frostdb-e2e-python"]),
        "{}",
        s.log()
    );
    let env = get_json(&format!("{}/api/v1/label/env/values", s.url), tenant).await;
    assert_eq!(env, serde_json::json!(["e2e"]));
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), tenant).await;
    let cpu = types
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .find(|t| t.starts_with("process_cpu:"))
        .unwrap_or_else(|| panic!("no process_cpu type in {types}"));
    let selector = format!("{cpu}{{service_name=\"frostdb-e2e-python\",env=\"e2e\"}}");
    let flame = get_json(
        &format!("{}/api/v1/query?selector={}", s.url, enc(&selector)),
        tenant,
    )
    .await;
    let text = flame.to_string();
    for f in ["frostdb_e2e_busy_loop", "frostdb_e2e_hash"] {
        assert!(text.contains(f), "{f} is not in the flame graph: {text}");
    }
    assert!(flame["root"]["total"].as_i64().unwrap() > 0);
}

#[tokio::test]
async fn the_web_page_shows_the_flame_graph_in_chromium() {
    let Some(python) = venv_python("playwright") else {
        return;
    };
    if !common::have("chromium", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    for (app, file) in [
        ("goapp.cpu", "pprof/goapp__go119-cpu-2s.pb.gz"),
        ("other.cpu", GO_CPU),
        ("locky", "pprof/goapp__go119-mutex.pb.gz"),
    ] {
        let (status, body) = post(
            &format!(
                "{}/ingest?name={app}{}&format=pprof",
                s.url,
                enc("{env=demo}")
            ),
            None,
            &[],
            testdata(file),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    // The diff of web.py: one program's heap every 3 s, growing in the last two (base: the
    // first two, at 1,700,000,000,000 ms and 3 s later; compare: the next two).
    for (i, grow) in [1, 1, 2, 4].into_iter().enumerate() {
        push_heap(&s, "heapy", 1_700_000_000_000 + 3_000 * i as i64, grow).await;
    }
    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e");
    let out = tokio::process::Command::new(&python)
        .arg(e2e_script("web.py"))
        .arg(&s.url)
        .arg("main.fib")
        .arg(&shots)
        .output()
        .await
        .unwrap();
    common::assert_ran(&out, "web.py");
    let png = std::fs::read(shots.join("flamegraph.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
    eprintln!("screenshots in {}", shots.display());
}

#[tokio::test]
async fn a_load_of_concurrent_pushes_and_queries_loses_nothing() {
    let fleet = std::env::var("FROSTDB_BENCH_DATA")
        .ok()
        .map(std::path::PathBuf::from);
    let Some(fleet) = fleet.filter(|d| d.join("pprof/index.tsv").exists()) else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must run the load test: scripts/test.sh generates the tiny fleet's pprof files"
        );
        eprintln!("SKIPPED: FROSTDB_BENCH_DATA has no pprof/index.tsv");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_frostdb-loadtest"))
        .args(["--url", &s.url, "--clients", "4", "--queriers", "1"])
        .args(["--max-files", "300", "--max-seconds", "120", "--data"])
        .arg(&fleet)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(figures["files_pushed"], 300, "{figures}");
    assert_eq!(figures["profiles_stored"], 300, "{figures}");
    assert_eq!(figures["totals_match"], true, "{figures}");
    assert!(figures["profile_types_checked"].as_u64().unwrap() >= 2);
    assert!(figures["queries"].as_u64().unwrap() > 0, "{figures}");
    assert_eq!(figures["query_failures"], 0, "{figures}");
}

#[tokio::test]
async fn refused_requests_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let (status, _) = get(
        &format!("{}/api/v1/query?selector=nope{{", s.url),
        Some("t9"),
    )
    .await;
    assert_eq!(status, 400);
    // The log line is written before the response is sent.
    let log = s.log_until(|l| l.contains("request refused"));
    assert!(
        log.contains("/api/v1/query") && log.contains("t9") && log.contains("400"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ebpf_stores_every_process_on_the_host_as_a_profile() {
    if !common::bpf_permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A program that spins in known functions, built with frame pointers.
    let spin = dir.path().join("spin");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../frostdb-ebpf-ingest/tests/spin/spin.c");
    let status = std::process::Command::new("cc")
        .args(["-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&spin)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success());
    let spin = Reap(
        std::process::Command::new(&spin)
            .arg("user")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // And a call chain through a shared library, built without frame pointers: whole only
    // when the sampler unwinds it with the tables compiled from its .eh_frame.
    let chain_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../frostdb-ebpf-ingest/tests/chain");
    let cc = |args: &[&std::ffi::OsStr]| {
        let status = std::process::Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer"])
            .args(args)
            .current_dir(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "cc {args:?}");
    };
    let lib = chain_dir.join("chain_lib.c");
    cc(&[
        "-fPIC".as_ref(),
        "-shared".as_ref(),
        "-o".as_ref(),
        "libchain.so".as_ref(),
        lib.as_os_str(),
    ]);
    let main = chain_dir.join("chain.c");
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    cc(&[
        "-o".as_ref(),
        "chain".as_ref(),
        main.as_os_str(),
        "-L.".as_ref(),
        "-lchain".as_ref(),
        rpath.as_ref(),
    ]);
    let chain = Reap(
        std::process::Command::new(dir.path().join("chain"))
            .arg("spin")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let s = Server::start(
        &dir.path().join("data"),
        Some("[ebpf]\nfrequency_hz = 99\ninterval = \"1s\"\n"),
    );
    // The first interval is stored once the unwind tables of every process's binaries are
    // compiled: some 20 s for this debug build beside a busy test run.
    s.log_within(std::time::Duration::from_secs(180), |l| {
        l.contains("eBPF interval stored") && !l.contains("processes=0")
    });
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    assert!(
        types
            .to_string()
            .contains("ebpf_cpu:cpu:nanoseconds:cpu:nanoseconds"),
        "{types}"
    );
    let comms = get_json(&format!("{}/api/v1/label/comm/values", s.url), None).await;
    assert!(comms.to_string().contains("\"spin\""), "{comms}");
    let selector = format!(
        "ebpf_cpu:cpu:nanoseconds:cpu:nanoseconds{{comm=\"spin\",pid=\"{}\"}}",
        spin.0.id()
    );
    let (status, top) = get(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            common::enc(&selector)
        ),
        None,
    )
    .await;
    assert_eq!(status, 200, "{top}");
    assert!(top.contains("frostdb_spin_user"), "{top}");
    // The sampler's health is the server's: sampling, no interval lost.
    let (status, metrics) = get(&format!("{}/metrics", s.url), None).await;
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics.contains("frostdb_ebpf_sampler_running 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("frostdb_ebpf_intervals_failed_total 0"),
        "{metrics}"
    );
    let (_, health) = get(&format!("{}/healthz", s.url), None).await;
    assert_eq!(health, "ok\n");

    // The chain's flame graph holds every caller, from the library's leaf to main. Its
    // first interval may be walked by frame pointer (its tables load after its first
    // samples), so wait for an interval past that.
    s.log_until(|l| l.contains("eBPF interval stored") && l.contains("unwind_table_files="));
    let selector = format!(
        "ebpf_cpu:cpu:nanoseconds:cpu:nanoseconds{{comm=\"chain\",pid=\"{}\"}}",
        chain.0.id()
    );
    // As long as the first interval may take: an interval waits for the tables of the
    // processes that started since (other tests' servers and test binaries here).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let (status, folded) = get(
            &format!(
                "{}/api/v1/query?format=folded&selector={}",
                s.url,
                common::enc(&selector)
            ),
            None,
        )
        .await;
        assert_eq!(status, 200, "{folded}");
        let whole = "main;chain_a;chain_b;chain_lib_c;chain_lib_d;chain_lib_leaf";
        if folded.lines().any(|l| l.contains(whole)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no whole chain ({whole}) in three minutes: {folded}"
        );
        // Until the next interval is stored.
        let stored = |log: &str| log.matches("eBPF interval stored").count();
        let seen = stored(&s.log());
        while stored(&s.log()) == seen {
            assert!(std::time::Instant::now() < deadline, "no interval stored");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert!(s.terminate(), "the server stops cleanly");
}

#[tokio::test]
async fn a_tenant_database_another_process_holds_is_a_503_then_works_once_released() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::start(&data, None);
    // This test process holds the tenant's database before the server opens it.
    let holder = frostdb_core::Db::open(
        data.join("tenants/team-x"),
        frostdb_core::DbOptions::default(),
    )
    .unwrap();
    let req = push_request("process_cpu", &[("service_name", "x")], testdata(GO_CPU));
    let (status, body) = push_proto(&s, Some("team-x"), &req).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains(&format!("in use by process {}", std::process::id())),
        "names the holder: {body}"
    );
    drop(holder);
    let (status, body) = push_proto(&s, Some("team-x"), &req).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        top_total(
            &s,
            Some("team-x"),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{}"
        )
        .await,
        total(GO_CPU, "cpu")
    );
}

#[tokio::test]
async fn a_damaged_block_fails_queries_by_name_and_lenient_queries_say_they_are_partial() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::start(&data, None);
    let req = push_request("process_cpu", &[("service_name", "a")], testdata(GO_CPU));
    assert_eq!(push_proto(&s, Some("t1"), &req).await.0, 200);
    assert!(s.terminate(), "SIGTERM persists the tenant's blocks");
    // The samples' block, the series index's (which label names and values read) and the
    // totals' (which timestamps read).
    let mut names = Vec::new();
    for table in ["samples", "series", "totals"] {
        let dir = data.join("tenants/t1/blocks").join(table);
        let blocks: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect();
        assert_eq!(blocks.len(), 1, "{blocks:?}");
        std::fs::write(&blocks[0], b"not a parquet file").unwrap();
        let file = blocks[0].file_name().unwrap().to_str().unwrap();
        names.push(format!("{table}/{file}"));
    }

    let s = Server::start(&data, None);
    let selector = enc(&format!("{CPU}{{}}"));
    for route in [
        format!("query?format=top&selector={selector}"),
        "sql?q=SELECT%20count(*)%20FROM%20samples".to_owned(),
        "labels".to_owned(),
        "label/service_name/values".to_owned(),
        "profile_types".to_owned(),
        format!("series?selector={selector}"),
        format!("timestamps?selector={selector}"),
    ] {
        let (status, body) = get(&format!("{}/api/v1/{route}", s.url), Some("t1")).await;
        assert_eq!(status, 500, "{route}: {body}");
        assert!(
            names.iter().any(|n| body.contains(n.as_str())),
            "{route}: names the block: {body}"
        );

        let sep = if route.contains('?') { '&' } else { '?' };
        let url = format!("{}/api/v1/{route}{sep}lenient=true", s.url);
        let r = reqwest::Client::new()
            .get(&url)
            .header("X-Scope-OrgID", "t1")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{url}");
        let failed = r.headers().get("x-frostdb-blocks-failed").cloned();
        assert_eq!(
            failed.as_ref().and_then(|v| v.to_str().ok()),
            Some("1"),
            "{url}: the partial answer says so"
        );
    }
}

/// A profiler labelling every request's samples with its span (as `pyroscope-otel` does)
/// makes no series per span: a tenant limited to 2 series takes 30 spans in 2 pushes, a
/// query of some spans answers their share, and label values do not list span ids.
#[tokio::test]
async fn span_ids_are_not_series_and_a_query_selects_spans() {
    use frostdb_pprof::testing;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\nmax_series_per_tenant = 2\n"),
    );
    let (samples, spans) = (90usize, 30usize);
    let mut profile = testing::profile(0, samples, 3);
    testing::label_spans(&mut profile, spans);
    for pod in ["a", "b"] {
        let req = push_request(
            "process_cpu",
            &[("service_name", "api"), ("pod", pod)],
            profile.encode_to_vec(),
        );
        let (status, body) = push_proto(&s, None, &req).await;
        assert_eq!(status, 200, "{body}");
    }
    let selector = format!("{CPU}{{service_name=\"api\"}}");
    assert_eq!(
        top_total(&s, None, &selector).await,
        2 * testing::total(0, samples)
    );
    let top = get_json(
        &format!(
            "{}/api/v1/query?format=top&span_id=s4,s25&selector={}",
            s.url,
            enc(&selector)
        ),
        None,
    )
    .await;
    assert_eq!(
        top["total"].as_i64().unwrap(),
        2 * testing::span_total(0, samples, spans, &[4, 25])
    );
    let (status, values) = get(&format!("{}/api/v1/label/span_id/values", s.url), None).await;
    assert_eq!(status, 200, "{values}");
    assert_eq!(
        serde_json::from_str::<Value>(&values).unwrap(),
        serde_json::json!([])
    );
}

/// Pushes over a label limit are answered 413 with JSON naming the limit and its value, and
/// nothing of them is stored; the default limit of 30 label names refuses a push of 10,000.
#[tokio::test]
async fn a_push_over_a_label_limit_is_a_413_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[limits]\nmax_label_names_per_series = 3\nmax_label_value_length = 16\n";
    let s = Server::start(&dir.path().join("data"), Some(config));
    let raw = testdata(GO_CPU);
    let long = "v".repeat(17);
    for (labels, limit) in [
        (
            vec![("service_name", "a"), ("a", "1"), ("b", "1"), ("c", "1")],
            "max_label_names_per_series = 3",
        ),
        (
            vec![("service_name", "a"), ("pod", long.as_str())],
            "max_label_value_length = 16",
        ),
    ] {
        let (status, body) =
            push_proto(&s, None, &push_request("process_cpu", &labels, raw.clone())).await;
        assert_eq!(status, 413, "{body}");
        let json: Value = serde_json::from_str(&body).unwrap();
        assert!(json["error"].as_str().unwrap().contains(limit), "{body}");
        assert_eq!(json["code"], "resource_exhausted", "{body}");
    }
    let labels = get_json(&format!("{}/api/v1/labels", s.url), None).await;
    assert_eq!(labels, serde_json::json!([]), "nothing stored");
    let ok = [("service_name", "a"), ("pod", "p")];
    let (status, body) = push_proto(&s, None, &push_request("process_cpu", &ok, raw.clone())).await;
    assert_eq!(status, 200, "{body}");

    // The defaults: 10,000 label names in one push are refused at 30.
    let s = Server::start(&dir.path().join("defaults"), None);
    let names: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("l{i:05}"), "v".to_owned()))
        .collect();
    let names: Vec<(&str, &str)> = names
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (status, body) = push_proto(&s, None, &push_request("process_cpu", &names, raw)).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("max_label_names_per_series = 30"), "{body}");
}

/// A push request's profiles are stored whole or not at all: a second series over a label
/// limit, or with a garbage profile, refuses the request and leaves the first unstored; a
/// good request stores both.
#[tokio::test]
async fn a_push_of_several_profiles_is_stored_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[limits]\nmax_label_value_length = 16\n";
    let s = Server::start(&dir.path().join("data"), Some(config));
    let raw = testdata(GO_CPU);
    let two = |second: &[(&str, &str)], second_raw: Vec<u8>| {
        let mut request = push_request("process_cpu", &[("service_name", "first")], raw.clone());
        let other = push_request("process_cpu", second, second_raw);
        request.series.extend(other.series);
        request
    };
    let long = "v".repeat(17);
    for (request, status) in [
        (two(&[("service_name", long.as_str())], raw.clone()), 413),
        (two(&[("service_name", "second")], b"garbage".to_vec()), 400),
    ] {
        let (got, body) = push_proto(&s, None, &request).await;
        assert_eq!(got, status, "{body}");
        assert!(
            body.contains("series[1]"),
            "the error names the profile: {body}"
        );
        let services = get_json(&format!("{}/api/v1/label/service_name/values", s.url), None).await;
        assert_eq!(services, serde_json::json!([]), "nothing stored: {body}");
    }
    let (got, body) = push_proto(&s, None, &two(&[("service_name", "second")], raw.clone())).await;
    assert_eq!(got, 200, "{body}");
    let services = get_json(&format!("{}/api/v1/label/service_name/values", s.url), None).await;
    assert_eq!(services, serde_json::json!(["first", "second"]));
}

/// A tenant whose manifest cannot be mirrored to its object store (here its blocks
/// directory, where a directory stands in the mirror's place) keeps taking pushes, and the
/// failure is visible: `/healthz` says degraded and names the tenant, `/metrics` counts the
/// failed mirrors and shows the mirror behind; a healthy tenant shows none.
#[tokio::test]
async fn a_failing_manifest_mirror_shows_on_the_health_route_and_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::start(&data, None);
    let (status, body) = get(&format!("{}/healthz", s.url), None).await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    std::fs::create_dir_all(data.join("tenants/broken/blocks/manifest.json/x")).unwrap();
    let raw = testdata(GO_CPU);
    for tenant in ["fine", "broken"] {
        let request = push_request("process_cpu", &[("service_name", "a")], raw.clone());
        let (status, body) = push_proto(&s, Some(tenant), &request).await;
        assert_eq!(status, 200, "{tenant}: {body}");
    }
    let (status, body) = get(&format!("{}/healthz", s.url), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("degraded\n"), "{body}");
    assert!(
        body.contains("tenant \"broken\": the manifest's mirror"),
        "{body}"
    );
    assert!(!body.contains("\"fine\""), "{body}");
    // A page of another origin (a DNS name rebound to this loopback server, which asks no
    // token) learns that something is wrong, not which tenants there are.
    let url = s.url.clone();
    let elsewhere = tokio::task::spawn_blocking(move || {
        crate::hostile::raw(
            &url,
            b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
        )
    })
    .await
    .unwrap();
    assert!(elsewhere.contains("degraded\n"), "{elsewhere}");
    assert!(!elsewhere.contains("broken"), "{elsewhere}");
    let (status, metrics) = get(&format!("{}/metrics", s.url), None).await;
    assert_eq!(status, 200, "{metrics}");
    let value = |series: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{series} ")))
            .unwrap_or_else(|| panic!("no {series} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("frostdb_manifest_mirror_failures_total{tenant=\"broken\"}") >= 1);
    assert_eq!(
        value("frostdb_manifest_mirror_behind{tenant=\"broken\"}"),
        1
    );
    assert_eq!(
        value("frostdb_manifest_mirror_failures_total{tenant=\"fine\"}"),
        0
    );
    assert_eq!(value("frostdb_manifest_mirror_behind{tenant=\"fine\"}"), 0);
    assert_eq!(value("frostdb_open_tenants"), 2);
    // What was pushed to the broken tenant is there.
    let total = top_total(
        &s,
        Some("broken"),
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
    )
    .await;
    assert!(total > 0);
}

/// The series limit counts what a tenant stored before a restart: after one, a new series
/// over the limit is still refused (429) and a stored one still accepted.
#[tokio::test]
async fn the_series_limit_holds_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = Some("[limits]\nmax_series_per_tenant = 2\n");
    let raw = testdata(GO_CPU);
    let push = |s: &Server, svc: &'static str| {
        let req = push_request("process_cpu", &[("service_name", svc)], raw.clone());
        let url = s.url.clone();
        async move {
            post(
                &format!("{url}/push.v1.PusherService/Push"),
                None,
                &[("content-type", "application/proto")],
                req.encode_to_vec(),
            )
            .await
        }
    };
    let s = Server::start(&data, config);
    for svc in ["a", "b"] {
        let (status, body) = push(&s, svc).await;
        assert_eq!(status, 200, "{body}");
    }
    assert!(s.terminate(), "the server must exit cleanly on SIGTERM");
    let s = Server::start(&data, config);
    let (status, body) = push(&s, "c").await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("limit of 2 series"), "{body}");
    let (status, body) = push(&s, "a").await;
    assert_eq!(status, 200, "{body}");
}

/// In-use memory, a gauge.
const INUSE: &str = "memory:inuse_space:bytes:space:bytes";
/// A Go heap profile of the test program.
const GO_HEAP: &str = "pprof/goapp__go119-heap.pb.gz";

/// The Go heap profile taken at `at_ms`, every other sample's values times `grow` (a
/// program whose memory grew), as raw pprof; and its in-use total.
fn heap_at(at_ms: i64, grow: i64) -> (Vec<u8>, i64) {
    let mut p = frostdb_pprof::decode(&testdata(GO_HEAP), &frostdb_pprof::Limits::default())
        .unwrap()
        .into_inner();
    p.time_nanos = at_ms * 1_000_000;
    for s in p.sample.iter_mut().step_by(2) {
        for v in &mut s.value {
            *v *= grow;
        }
    }
    let inuse = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "inuse_space")
        .unwrap();
    let total = p.sample.iter().map(|s| s.value[inuse]).sum();
    (p.encode_to_vec(), total)
}

/// Pushes [`heap_at`] as service `service`; its in-use total.
async fn push_heap(s: &Server, service: &str, at_ms: i64, grow: i64) -> i64 {
    let (raw, total) = heap_at(at_ms, grow);
    let req = push_request("memory", &[("service_name", service)], raw);
    let (status, body) = push_proto(s, None, &req).await;
    assert_eq!(status, 200, "{body}");
    total
}

/// A diff answers the question a query answers: each side of the same selection and range
/// totals what `/api/v1/query` totals for it (a gauge averaged over the range unless told),
/// with `aggregation=sum` the sum, `latest` the latest, and both say which they did.
#[tokio::test]
async fn a_diff_side_totals_what_the_query_of_it_totals() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    // One program's heap, taken twice: its memory grew in between.
    let (t1, t2) = (1_700_000_000_000i64, 1_700_000_015_000i64);
    let first = push_heap(&s, "heapy", t1, 1).await;
    let second = push_heap(&s, "heapy", t2, 3).await;
    assert!(first < second, "{first} {second}");
    let samples = frostdb_pprof::decode(&testdata(GO_HEAP), &frostdb_pprof::Limits::default())
        .unwrap()
        .sample
        .len() as i64;
    let selector = enc(&format!("{INUSE}{{service_name=\"heapy\"}}"));
    let answer = |path: String| {
        let url = format!("{}{path}", s.url);
        async move {
            let r = reqwest::get(&url).await.unwrap();
            assert_eq!(r.status(), 200, "{url}");
            let said = r.headers()["x-frostdb-aggregation"]
                .to_str()
                .unwrap()
                .to_owned();
            (
                said,
                serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap(),
            )
        }
    };
    let query = |params: String| async move {
        let (said, top) = answer(format!("/api/v1/query?format=top&{params}")).await;
        (said, top["total"].as_i64().unwrap())
    };
    let diff = |params: String| async move {
        let (said, root) = answer(format!("/api/v1/diff?{params}")).await;
        let side = |k: &str| root[k].as_i64().unwrap_or_else(|| panic!("{k} in {root}"));
        (said, side("base"), side("compare"))
    };

    // Unless told, a gauge is averaged: about half the sum (each stack rounds down).
    let (said, average) = query(format!("selector={selector}")).await;
    assert_eq!(said, "average");
    let sum = first + second;
    assert!(
        average * 2 <= sum && average * 2 > sum - 2 * samples,
        "average {average} of {first} and {second}"
    );
    // The diff of the selection with itself: both sides the query's total, not the sum.
    assert_eq!(
        diff(format!("selector={selector}")).await,
        ("average".to_owned(), average, average)
    );
    assert_eq!(
        diff(format!("base={selector}&compare={selector}")).await,
        ("average".to_owned(), average, average)
    );
    // Told otherwise, the diff and the query agree again.
    for (aggregation, want) in [("sum", sum), ("average", average), ("latest", second)] {
        let (said, total) = query(format!("selector={selector}&aggregation={aggregation}")).await;
        assert_eq!((said.as_str(), total), (aggregation, want));
        assert_eq!(
            diff(format!("selector={selector}&aggregation={aggregation}")).await,
            (aggregation.to_owned(), want, want),
            "aggregation={aggregation}"
        );
    }
    // One profile a side: each side is that profile, as the query of its range says.
    let (_, alone) = query(format!("selector={selector}&from={t1}&to={}", t1 + 1)).await;
    assert_eq!(alone, first);
    assert_eq!(
        diff(format!(
            "selector={selector}&base_from={t1}&base_to={}&compare_from={t2}&compare_to={}",
            t1 + 1,
            t2 + 1
        ))
        .await,
        ("average".to_owned(), first, second)
    );
    // A CPU profile sums, in the diff as in the query.
    let (status, body) = push_proto(
        &s,
        None,
        &push_request(
            "process_cpu",
            &[("service_name", "heapy")],
            testdata(GO_CPU),
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let cpu = enc(&format!("{CPU}{{service_name=\"heapy\"}}"));
    let (said, cpu_total) = query(format!("selector={cpu}")).await;
    assert_eq!((said.as_str(), cpu_total), ("sum", total(GO_CPU, "cpu")));
    assert_eq!(
        diff(format!("selector={cpu}")).await,
        ("sum".to_owned(), cpu_total, cpu_total)
    );
    let (status, body) = get(
        &format!(
            "{}/api/v1/diff?selector={selector}&aggregation=median",
            s.url
        ),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("aggregation"), "{body}");
}

/// The previous values of a tenant's cumulative series outlive the tenant's closing: with
/// one tenant open at a time, a baseline pushed to `a`, a push to `b` (which closes `a`),
/// then `a`'s next profile is stored as the delta from the baseline. Before, the baseline
/// went with the closed store: the next profile was a baseline again, and its push was
/// answered 200 with nothing stored.
#[tokio::test]
async fn baselines_of_cumulative_series_outlive_a_tenants_closing() {
    use frostdb_pprof::testing;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\nmax_open_tenants = 1\n"),
    );
    // The synthetic profile as allocations (cumulative), its values times `times`.
    let allocations = |times: i64, at_s: i64| {
        let mut p = testing::profile(0, 50, 3);
        for s in &mut p.string_table {
            match s.as_str() {
                "cpu" => *s = "alloc_objects".into(),
                "nanoseconds" => *s = "count".into(),
                _ => {}
            }
        }
        for sample in &mut p.sample {
            for v in &mut sample.value {
                *v *= times;
            }
        }
        p.time_nanos = (1_700_000_000 + at_s) * 1_000_000_000;
        push_request(
            "memory",
            &[("__delta__", "true"), ("service_name", "api")],
            p.encode_to_vec(),
        )
    };
    let (status, body) = push_proto(&s, Some("a"), &allocations(1, 0)).await;
    assert_eq!(status, 200, "{body}");
    let req = push_request(
        "process_cpu",
        &[],
        testing::profile(0, 5, 3).encode_to_vec(),
    );
    let (status, body) = push_proto(&s, Some("b"), &req).await;
    assert_eq!(status, 200, "{body}");
    s.log_within(std::time::Duration::from_secs(30), |log| {
        log.contains("closing the least recently used tenant") && log.contains("tenant=a")
    });
    let (status, body) = push_proto(&s, Some("a"), &allocations(3, 10)).await;
    assert_eq!(status, 200, "{body}");
    let stored = top_total(
        &s,
        Some("a"),
        "memory:alloc_objects:count:alloc_objects:count{service_name=\"api\"}",
    )
    .await;
    assert_eq!(stored, 2 * testing::total(0, 50));
}

/// A tmpfs of `bytes` mounted on a new directory, unmounted when dropped; `None` (with
/// the reason printed) where this process may not mount (not root, or no CAP_SYS_ADMIN).
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Self(dir)),
            Ok(out) => {
                eprintln!(
                    "SKIPPED: cannot mount a small tmpfs here (CI runs as root and can): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: no mount(8) to make a small disk: {e}");
                None
            }
        }
    }

    fn resize(&self, bytes: u64) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(self.0.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

/// A full disk refuses writes with a 503 and `Retry-After` (which agents retry, where a
/// 500 of a path was dropped), says so on `/healthz`, stores again once space is freed,
/// and keeps every write it acknowledged across a kill -9. Before, the push was answered
/// 500 with the WAL segment's full path and `/healthz` said `ok`.
#[tokio::test]
async fn a_full_disk_refuses_writes_for_a_retry_and_keeps_every_acknowledged_one() {
    let Some(disk) = SmallDisk::mount(4 << 20) else {
        return;
    };
    let data = disk.0.path().join("d");
    let s = Server::start(&data, None);
    let client = reqwest::Client::new();
    // Each push a new service, with names long enough to fill the disk in a few hundred.
    let push = |i: usize| {
        let body: String = (0..40)
            .map(|f| format!("main;service{i}_function{f}_{} 10\n", "x".repeat(200)))
            .collect();
        client
            .post(format!(
                "{}/ingest?name=app{i}.cpu&format=folded&from={}",
                s.url,
                1_700_000_000 + i
            ))
            .body(body)
            .send()
    };
    let mut acknowledged = 0;
    let refused = loop {
        assert!(acknowledged < 5_000, "4 MiB never filled");
        let r = push(acknowledged).await.unwrap();
        if r.status() != 200 {
            break r;
        }
        acknowledged += 1;
    };
    assert!(acknowledged > 0, "nothing was stored on an empty disk");
    assert_eq!(refused.status().as_u16(), 503);
    assert!(
        refused.headers().contains_key("retry-after"),
        "{:?}",
        refused.headers()
    );
    let body = refused.text().await.unwrap();
    assert!(body.contains("storage is full"), "{body}");
    assert!(
        !body.contains(disk.0.path().to_str().unwrap()),
        "the answer shows the server's paths: {body}"
    );
    let (status, health) = get(&format!("{}/healthz", s.url), None).await;
    assert_eq!(status, 200);
    assert!(
        health.starts_with("degraded") && health.contains("storage is full"),
        "{health}"
    );

    // Space freed: the same push is stored, with no restart.
    disk.resize(64 << 20);
    let r = push(acknowledged).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    acknowledged += 1;

    // Every acknowledged push is there after a kill -9.
    std::process::Command::new("kill")
        .args(["-KILL", &s.pid().to_string()])
        .status()
        .unwrap();
    drop(s);
    let s = Server::start(&data, None);
    let names = get_json(&format!("{}/api/v1/label/service_name/values", s.url), None).await;
    let names = names.as_array().unwrap_or_else(|| panic!("{names}"));
    for i in 0..acknowledged {
        assert!(
            names.iter().any(|n| n == &format!("app{i}")),
            "app{i} was acknowledged and is gone: {names:?}"
        );
    }
}

/// A tenant at the bytes it may store is refused (429 naming the quota) while every other
/// tenant stores on, and a tenant's own quota is its own: one tenant cannot fill the disk
/// that every tenant writes to.
#[tokio::test]
async fn a_tenant_at_its_stored_bytes_quota_is_refused_and_the_others_store_on() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmax_stored_bytes_per_tenant = \"256KiB\"\n\n\
             [tenants.big]\nmax_stored_bytes = \"64MiB\"\n",
        ),
    );
    let client = reqwest::Client::new();
    let push = |tenant: &'static str, i: usize| {
        let body: String = (0..20)
            .map(|f| format!("main;{tenant}{i}_function{f}_{} 10\n", "x".repeat(100)))
            .collect();
        client
            .post(format!(
                "{}/ingest?name=app.cpu&format=folded&from={}",
                s.url,
                1_700_000_000 + i
            ))
            .header("X-Scope-OrgID", tenant)
            .body(body)
            .send()
    };
    let mut stored = 0;
    let refused = loop {
        assert!(stored < 5_000, "256 KiB never reached");
        let r = push("small", stored).await.unwrap();
        if r.status() != 200 {
            break r;
        }
        stored += 1;
    };
    assert_eq!(refused.status().as_u16(), 429);
    let body = refused.text().await.unwrap();
    assert!(
        body.contains("limits.max_stored_bytes_per_tenant") && body.contains("262144"),
        "{body}"
    );
    // Refused, not stored: the next push is refused too.
    assert_eq!(push("small", stored + 1).await.unwrap().status(), 429);
    // Another tenant under the server's quota stores, and so does one as large as `small`
    // under its own larger quota.
    assert_eq!(push("other", 0).await.unwrap().status(), 200);
    for i in 0..=stored {
        let r = push("big", i).await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "big's push {i}: {}",
            r.text().await.unwrap()
        );
    }
}
