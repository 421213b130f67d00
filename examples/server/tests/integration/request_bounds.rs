//! Small requests that decode to huge messages, sent to `frostdb serve`: each is refused
//! quickly with a 413 (gRPC `resource_exhausted`) naming the limit, the server keeps
//! answering, and its peak memory (`VmHWM`) stays far below what the decoded message
//! would have taken. And a list of thousands of span ids selects as a set.

use crate::common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{Server, get, shared_stack};
use frostdb_pprof::convert::push::proto as push;
use prost::Message;
use serde_json::Value;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Most a refusal may take (a debug build, on a busy machine): what it is refused for
/// would take minutes, or the machine's memory, to decode.
const FAST: Duration = Duration::from_secs(30);

/// Peak memory of the server through every attack: each decoded would be gigabytes.
const MAX_PEAK: u64 = 1 << 30;

/// The server's peak resident memory so far, in bytes.
fn peak_rss(s: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kb * 1024
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `count` copies of `unit`, gzipped cheaply: `unit` repeated to a megabyte is compressed
/// once, and the body is that member again and again (gzip allows many members).
fn gzip_repeated(head: &[u8], unit: &[u8], count: usize, tail: &[u8]) -> Vec<u8> {
    let gz = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    let per_chunk = (1 << 20) / unit.len();
    let chunk = gz(&unit.repeat(per_chunk));
    let mut body = gz(head);
    for _ in 0..count / per_chunk {
        body.extend_from_slice(&chunk);
    }
    let mut rest = unit.repeat(count % per_chunk);
    rest.extend_from_slice(tail);
    body.extend(gz(&rest));
    body
}

/// A message field `number` of `len` bytes: its key and length.
fn field_header(number: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    varint((number << 3) | 2, &mut out);
    varint(len as u64, &mut out);
    out
}

/// A POST answered: status, headers, body text, and how long it took.
async fn post(
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, reqwest::header::HeaderMap, String, Duration) {
    let started = Instant::now();
    let mut req = reqwest::Client::new().post(url).body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    (status, headers, text, started.elapsed())
}

/// Sends `body` to `path` and expects a fast 413 whose JSON message is `message`, then
/// a server that still answers.
async fn refused(
    s: &Server,
    what: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    message: &str,
) {
    let sent = body.len();
    let (status, _, text, took) = post(&format!("{}{path}", s.url), headers, body).await;
    assert_eq!(status, 413, "{what}: {text}");
    let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    assert_eq!(json["code"], "resource_exhausted", "{what}: {text}");
    let got = json["message"].as_str().unwrap();
    assert!(got.contains(message), "{what}: {got:?} lacks {message:?}");
    assert!(took < FAST, "{what}: refused after {took:?}");
    let (status, types) = get(&format!("{}/api/v1/profile_types", s.url), None).await;
    assert_eq!(status, 200, "{what}: then {types}");
    eprintln!(
        "{what}: {sent} bytes sent, 413 in {took:?} ({got}); server peak RSS so far {} MiB",
        peak_rss(s) >> 20
    );
}

/// A gRPC-Web call with `message` framed, expecting `resource_exhausted` (8) and
/// `message` in its status.
/// A real profile is stored: what was refused before was released.
async fn a_real_profile_is_stored(s: &Server) {
    let (status, _, text, _) = post(
        &format!("{}/ingest?name=app.cpu&format=pprof", s.url),
        &[],
        common::testdata("pprof/pyroscope__go-cpu.pb.gz"),
    )
    .await;
    assert_eq!(status, 200, "{text}");
}

async fn refused_grpc_web(s: &Server, what: &str, path: &str, message: Vec<u8>, expect: &str) {
    let mut body = vec![0];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(message);
    let (status, headers, text, took) = post(
        &format!("{}{path}", s.url),
        &[("content-type", "application/grpc-web+proto")],
        body,
    )
    .await;
    assert_eq!(status, 200, "{what}: {text}");
    // The status is in the headers (trailers-only) or in a trailer frame of the body.
    let trailers = format!(
        "{}\n{text}",
        headers
            .iter()
            .map(|(k, v)| format!("{k}:{}", v.to_str().unwrap_or("")))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(trailers.contains("grpc-status:8"), "{what}: {trailers}");
    assert!(
        trailers.contains(&expect.replace(' ', "%20")) || trailers.contains(expect),
        "{what}: {trailers} lacks {expect:?}"
    );
    assert!(took < FAST, "{what}: refused after {took:?}");
    eprintln!(
        "{what}: gRPC-Web resource_exhausted in {took:?}; peak RSS {} MiB",
        peak_rss(s) >> 20
    );
}

#[tokio::test]
async fn requests_that_decode_to_gigabytes_are_refused_on_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let gzip = [("content-encoding", "gzip")];
    let proto = [("content-type", "application/proto"), gzip[0]];
    let json = [("content-type", "application/json"), gzip[0]];
    let n = 20_000_000;
    let empty = [0x0a, 0x00];

    // A push of one series with 20 M empty labels (2 bytes each, 48 decoded): 4.8 GB.
    // (Series 1 holds them: its field 1, labels, is `0a 00` each.)
    let body = gzip_repeated(&field_header(1, 2 * n), &empty, n, &[]);
    assert!(body.len() < 200_000, "{}", body.len());
    refused(
        &s,
        "push: 20 M labels",
        "/push.v1.PusherService/Push",
        &proto,
        body,
        "more than 38 labels: over the label limit max_label_names_per_series = 30",
    )
    .await;

    // 20 M empty series.
    let body = gzip_repeated(&[], &empty, n, &[]);
    refused(
        &s,
        "push: 20 M series",
        "/push.v1.PusherService/Push",
        &proto,
        body,
        "series exceeds the limit of 10000",
    )
    .await;

    // The same in JSON.
    let body = gzip_repeated(br#"{"series":["#, b"{},", 10_000_000, b"{}]}");
    refused(
        &s,
        "push JSON: 10 M series",
        "/push.v1.PusherService/Push",
        &json,
        body,
        "series exceeds the limit of 10000",
    )
    .await;

    // OTLP: 20 M empty ResourceProfiles.
    let otlp_headers = [("content-type", "application/x-protobuf"), gzip[0]];
    let body = gzip_repeated(&[], &empty, n, &[]);
    refused(
        &s,
        "OTLP: 20 M resource profiles",
        "/v1development/profiles",
        &otlp_headers,
        body,
        "resource_profiles exceeds the limit of 10000",
    )
    .await;

    // OTLP: 100,000 samples of one stack 4,096 frames deep: 400 M frames if copied.
    let body = shared_stack(4096, 100_000).encode_to_vec();
    assert!(body.len() < 600_000, "{}", body.len());
    refused(
        &s,
        "OTLP: 100,000 samples of a 4,096-deep stack",
        "/v1development/profiles",
        &[("content-type", "application/x-protobuf")],
        body,
        "stack frames of the request (every sample's stack) exceeds the limit of 16777216",
    )
    .await;

    // The query API: 20 M empty matchers, in protobuf and in JSON.
    let body = gzip_repeated(&[], &empty, n, &[]);
    refused(
        &s,
        "LabelNames: 20 M matchers",
        "/querier.v1.QuerierService/LabelNames",
        &proto,
        body,
        "matchers exceeds the limit of 100",
    )
    .await;
    let body = gzip_repeated(br#"{"matchers":["#, br#""","#, 10_000_000, br#""""]}"#);
    refused(
        &s,
        "Series JSON: 10 M matchers",
        "/querier.v1.QuerierService/Series",
        &json,
        body,
        "matchers exceeds the limit of 100",
    )
    .await;

    // 6 M span ids.
    let span = b"0123456789abcdef";
    let mut unit = field_header(11, span.len());
    unit.extend(span);
    let body = gzip_repeated(&[], &unit, 6_000_000, &[]);
    refused(
        &s,
        "SelectMergeStacktraces: 6 M span ids",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &proto,
        body,
        "span_selector exceeds the limit of 10000",
    )
    .await;

    // A settings value of a megabyte: over limits.max_settings_bytes (1 MiB) with its
    // envelope.
    let body = serde_json::json!({"setting": {"name": "n", "value": "v".repeat(1 << 20)}})
        .to_string()
        .into_bytes();
    refused(
        &s,
        "settings: a 1 MiB value",
        "/settings.v1.SettingsService/Set",
        &[("content-type", "application/json")],
        body,
        "settings request bytes exceeds the limit of 1048576",
    )
    .await;

    // gRPC-Web through tonic: 1.5 M empty matchers (3 MB, under tonic's 4 MiB), and 7 M
    // empty resource profiles (14 MB, under the body limit the OTLP service takes).
    refused_grpc_web(
        &s,
        "gRPC-Web LabelNames: 1.5 M matchers",
        "/querier.v1.QuerierService/LabelNames",
        empty.repeat(1_500_000),
        "matchers exceeds the limit of 100",
    )
    .await;
    refused_grpc_web(
        &s,
        "gRPC-Web OTLP: 7 M resource profiles",
        "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        empty.repeat(7_000_000),
        "resource_profiles exceeds the limit of 10000",
    )
    .await;

    let peak = peak_rss(&s);
    eprintln!("server peak RSS over every attack: {} MiB", peak >> 20);
    assert!(peak < MAX_PEAK, "peak RSS {} MiB", peak >> 20);
}

/// Samples sharing one deep stack are stored as one stack: an export within the frames
/// limit (4,000 samples of a 4,096-deep stack) is accepted and counted whole.
#[tokio::test]
async fn samples_sharing_a_deep_stack_are_accepted_within_the_frames_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let (status, _, text, _) = post(
        &format!("{}/v1development/profiles", s.url),
        &[("content-type", "application/x-protobuf")],
        shared_stack(4096, 4000).encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let top = common::get_json(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            common::enc("samples:samples:count:samples:count{}")
        ),
        None,
    )
    .await;
    assert_eq!(top["total"].as_i64(), Some(4000), "{top}");
    eprintln!("peak RSS {} MiB", peak_rss(&s) >> 20);
}

/// Span ids select as a set: 5,000 of them (a regex of them was too large to build) select
/// exactly the samples of the two real ones among them.
#[tokio::test]
async fn thousands_of_span_ids_select_exactly_their_samples() {
    use frostdb_pprof::testing;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let (samples, spans) = (90usize, 30usize);
    let mut profile = testing::profile(0, samples, 3);
    testing::label_spans(&mut profile, spans);
    let request = push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels: vec![
                push::LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
                push::LabelPair {
                    name: "service_name".into(),
                    value: "api".into(),
                },
            ],
            samples: vec![push::RawSample {
                raw_profile: profile.encode_to_vec(),
                id: String::new(),
            }],
        }],
    };
    let (status, _, text, _) = post(
        &format!("{}/push.v1.PusherService/Push", s.url),
        &[("content-type", "application/proto")],
        request.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    // Two real spans among 5,000 that are not, some with regex characters.
    let mut ids: Vec<String> = (0..4998).map(|i| format!("x{i}.*|(")).collect();
    ids.push("s4".into());
    ids.push("s25".into());
    let total = |ids: &[String]| {
        let body = serde_json::json!({
            "profileTypeID": CPU,
            "labelSelector": "{service_name=\"api\"}",
            "spanSelector": ids,
            "format": "PROFILE_FORMAT_FLAMEGRAPH",
        });
        let url = format!("{}/querier.v1.QuerierService/SelectMergeStacktraces", s.url);
        async move {
            let (status, _, text, _) = post(
                &url,
                &[("content-type", "application/json")],
                body.to_string().into_bytes(),
            )
            .await;
            assert_eq!(status, 200, "{text}");
            let json: Value = serde_json::from_str(&text).unwrap();
            json["flamegraph"]["total"]
                .as_str()
                .map_or(0, |t| t.parse::<i64>().unwrap())
        }
    };
    assert_eq!(
        total(&ids).await,
        testing::span_total(0, samples, spans, &[4, 25])
    );
    // Without the two, nothing; a span that is a prefix of a real one is not it.
    ids.truncate(4998);
    ids.push("s2".into());
    assert_eq!(
        total(&ids).await,
        testing::span_total(0, samples, spans, &[2])
    );
    ids.pop();
    assert_eq!(total(&ids).await, 0);
    // Over the limit of 10,000: refused, naming it.
    let many: Vec<String> = (0..10_001).map(|i| format!("x{i}")).collect();
    let body = serde_json::json!({"profileTypeID": CPU, "spanSelector": many});
    let (status, _, text, _) = post(
        &format!("{}/querier.v1.QuerierService/SelectMergeStacktraces", s.url),
        &[("content-type", "application/json")],
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("span_selector exceeds the limit of 10000"),
        "{text}"
    );
}

/// A message within the request limits still decodes to many times its bytes: what it will
/// take decoded is charged to the memory budget before it is made, over HTTP and gRPC alike,
/// so requests a small budget can never hold are refused (413, gRPC `resource_exhausted`:
/// a retry would be refused again) naming the budget, and the server stores the next push
/// that fits.
#[tokio::test]
async fn decoded_requests_are_charged_to_the_memory_budget_before_they_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\nmemory = \"8MiB\"\n"),
    );
    let what = "the decoded request message";

    // A push of 10,000 series of 30 empty labels (within every count limit): 630 KB sent,
    // 15 MB decoded.
    let mut series = field_header(1, 60);
    series.extend([0x0a, 0x00].repeat(30));
    let body = series.repeat(10_000);
    let (status, _, text, _) = post(
        &format!("{}/push.v1.PusherService/Push", s.url),
        &[("content-type", "application/proto")],
        body,
    )
    .await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains(what) && text.contains("limits.memory"),
        "{text}"
    );

    // An OTLP export over gRPC-Web whose dictionary holds 2 M empty strings: 4 MB sent,
    // 48 MB decoded, decoded by tonic's codec.
    let n = 2_000_000;
    let mut message = field_header(2, 2 * n);
    message.extend(field_header(5, 0).repeat(n));
    refused_grpc_web(
        &s,
        "gRPC-Web OTLP: 2 M empty strings",
        "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        message,
        what,
    )
    .await;

    // What was refused was released: a real profile fits the same budget.
    a_real_profile_is_stored(&s).await;
}

#[tokio::test]
async fn compressed_grpc_messages_are_charged_what_they_may_inflate_to() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\nmemory = \"8MiB\"\n"),
    );
    let export = format!(
        "{}/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        s.url
    );
    // An OTLP export whose one message is a field nobody reads, gzipped by gRPC: `len`
    // bytes inflated, none of them decoded into anything.
    let send = |len: usize| {
        let mut message = field_header(15, len);
        message.resize(message.len() + len, 0);
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&message).unwrap();
        let message = e.finish().unwrap();
        let mut body = vec![1];
        body.extend((message.len() as u32).to_be_bytes());
        body.extend(message);
        post(
            &export,
            &[
                ("content-type", "application/grpc-web+proto"),
                ("grpc-encoding", "gzip"),
            ],
            body,
        )
    };
    // 12 MiB inflated from 12 KB sent: tonic inflates it before any decoder of ours sees
    // it, so it is reserved (a thousand times the bytes sent, up to the largest message)
    // as they arrive, and refused whole under an 8 MiB budget, in gRPC's words.
    let (status, headers, text, took) = send(12 << 20).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(headers["grpc-status"], "8", "{headers:?}");
    let message = headers["grpc-message"].to_str().unwrap();
    assert!(
        message.contains("compressed%20gRPC%20message") && message.contains("limits.memory"),
        "{message}"
    );
    assert!(took < FAST, "refused after {took:?}");
    // One that fits is taken, and what was reserved ahead of it given back: the budget
    // holds nothing between requests, so the next ones fit too.
    for _ in 0..3 {
        let (status, headers, text, _) = send(2 << 20).await;
        assert_eq!(status, 200, "{text}");
        let grpc_status = headers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_else(|| text.clone());
        assert!(
            grpc_status == "0" || text.contains("grpc-status:0"),
            "{grpc_status} {text}"
        );
    }
    a_real_profile_is_stored(&s).await;
}
