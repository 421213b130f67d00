//! Grafana Pyroscope's query API on `frostdb serve`: every querier method over Connect unary,
//! in binary protobuf and in proto3 JSON, against profiles pushed through the push API, with
//! answers checked against the pushed files' totals.

use crate::common;

use common::{Server, testdata};
use frostdb_pprof::api::google::v1 as google;
use frostdb_pprof::api::querier::v1 as querier;
use frostdb_pprof::api::types::v1 as types;
use frostdb_pprof::convert::push::proto as push;
use frostdb_pprof::report::pyroscope::{Levels, WIDTH};
use prost::Message;
use serde_json::{Value, json};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const GO_CPU: &str = "pprof/pyroscope__go-cpu.pb.gz";

/// The sum of the `cpu` values of the Go CPU profile.
fn cpu_total() -> i64 {
    let p = frostdb_pprof::decode(&testdata(GO_CPU), &frostdb_pprof::Limits::default()).unwrap();
    common::cpu_total(&p)
}

async fn post(
    url: &str,
    tenant: Option<&str>,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", content_type)
        .body(body);
    if let Some(t) = tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

/// Pushes the Go CPU profile for `service` at `at_ms`.
async fn push(s: &Server, tenant: Option<&str>, service: &str, at_ms: i64) {
    let raw = frostdb_pprof::decode(&testdata(GO_CPU), &frostdb_pprof::Limits::default())
        .unwrap()
        .into_inner();
    push_profile(s, tenant, "process_cpu", raw, service, at_ms).await;
}

/// Pushes `raw` as `name` for `service` at `at_ms`.
async fn push_profile(
    s: &Server,
    tenant: Option<&str>,
    name: &str,
    mut raw: frostdb_pprof::proto::Profile,
    service: &str,
    at_ms: i64,
) {
    raw.time_nanos = at_ms * 1_000_000;
    let req = push::PushRequest {
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
                raw_profile: raw.encode_to_vec(),
                id: String::new(),
            }],
        }],
    };
    let (status, body) = post(
        &format!("{}/push.v1.PusherService/Push", s.url),
        tenant,
        "application/proto",
        req.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
}

/// Calls a querier method in binary protobuf.
async fn call<Req: Message, Resp: Message + Default>(s: &Server, method: &str, req: &Req) -> Resp {
    let (status, body) = post(
        &format!("{}/querier.v1.QuerierService/{method}", s.url),
        None,
        "application/proto",
        req.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{method}: {}", String::from_utf8_lossy(&body));
    Resp::decode(body.as_slice()).unwrap()
}

/// Calls a querier method in JSON; the status and the parsed answer.
async fn call_json(s: &Server, tenant: Option<&str>, method: &str, req: Value) -> (u16, Value) {
    let (status, body) = post(
        &format!("{}/querier.v1.QuerierService/{method}", s.url),
        tenant,
        "application/json",
        req.to_string().into_bytes(),
    )
    .await;
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{method}: {e}: {}", String::from_utf8_lossy(&body)));
    (status, value)
}

/// Checks a flame graph's encoding: levels cover their parents exactly and `total` is the
/// root's; returns the total.
fn check_flame_graph(g: &querier::FlameGraph) -> i64 {
    assert_eq!(g.names.first().map(String::as_str), Some("total"));
    let levels = Levels {
        names: g.names.clone(),
        levels: g.levels.iter().map(|l| l.values.clone()).collect(),
        total: g.total,
        max_self: g.max_self,
    };
    let abs = levels.absolute(WIDTH, 0);
    assert_eq!(abs[0], vec![(0, g.total, 0, "total".to_owned())]);
    for depth in 1..abs.len() {
        // Every node lies inside a node of the level above, after its self.
        for &(x, total, _, ref name) in &abs[depth] {
            let parent = abs[depth - 1]
                .iter()
                .find(|(px, pt, ..)| *px <= x && x + total <= px + pt)
                .unwrap_or_else(|| panic!("{name} at depth {depth} has no parent"));
            assert!(
                x >= parent.0 + parent.2,
                "{name} overlaps its parent's self"
            );
        }
    }
    let selves: i64 = abs.iter().flatten().map(|n| n.2).sum();
    assert_eq!(selves, g.total, "selves add up to the total");
    g.total
}

/// Sums a Pyroscope serialized tree's selves.
fn tree_total(mut b: &[u8]) -> i64 {
    fn varint(b: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }
    let mut pending = 1u64;
    let mut total = 0i64;
    while pending > 0 {
        pending -= 1;
        let len = varint(&mut b) as usize;
        b = &b[len..];
        total += varint(&mut b) as i64;
        pending += varint(&mut b);
    }
    assert!(b.is_empty(), "trailing bytes after the tree");
    total
}

fn pprof_total(p: &google::Profile) -> i64 {
    p.sample.iter().map(|s| s.value[0]).sum()
}

#[tokio::test]
async fn every_querier_method_answers_in_proto_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let want = cpu_total();
    let t0 = 1_700_000_000_000i64;
    push(&s, None, "a", t0).await;
    push(&s, None, "a", t0 + 10_000).await;
    push(&s, None, "b", t0 + 5_000).await;
    let (start, end) = (t0 - 60_000, t0 + 60_000);

    // Profile types, label names and values, series.
    let types: querier::ProfileTypesResponse = call(
        &s,
        "ProfileTypes",
        &querier::ProfileTypesRequest { start, end },
    )
    .await;
    assert!(types.profile_types.iter().any(|t| t.id == CPU), "{types:?}");
    let (status, json_types) = call_json(&s, None, "ProfileTypes", json!({})).await;
    assert_eq!(status, 200);
    // A span profile is a flame graph or a tree: a pprof or a dot asked for is refused,
    // not built and answered empty as if there were no data.
    for (format, status) in [(1, 200), (2, 200), (3, 400), (4, 400)] {
        let (got, answer) = call_json(
            &s,
            None,
            "SelectMergeSpanProfile",
            json!({"profileTypeID": CPU, "labelSelector": "{}", "spanSelector": ["ab"],
                   "start": start.to_string(), "end": end.to_string(), "format": format}),
        )
        .await;
        assert_eq!(got, status, "format {format}: {answer}");
        if status == 400 {
            assert!(
                answer.to_string().contains("FLAMEGRAPH or TREE"),
                "{answer}"
            );
        }
    }
    assert!(
        json_types["profileTypes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["ID"] == CPU)
    );
    let names: types::LabelNamesResponse = call(
        &s,
        "LabelNames",
        &types::LabelNamesRequest {
            matchers: vec![],
            start,
            end,
        },
    )
    .await;
    for n in ["service_name", "__name__", "__profile_type__"] {
        assert!(
            names.names.iter().any(|x| x == n),
            "{n} in {:?}",
            names.names
        );
    }
    let (_, values) = call_json(
        &s,
        None,
        "LabelValues",
        json!({"name": "service_name", "matchers": [format!("{{__profile_type__=\"{CPU}\"}}")],
               "start": start.to_string(), "end": end.to_string()}),
    )
    .await;
    assert_eq!(values["names"], json!(["a", "b"]));
    let (_, values) = call_json(
        &s,
        None,
        "LabelValues",
        json!({"name": "service_name", "matchers": ["{service_name=\"b\"}"]}),
    )
    .await;
    assert_eq!(values["names"], json!(["b"]));
    let (_, values) = call_json(&s, None, "LabelValues", json!({"name": "__profile_type__"})).await;
    assert!(values["names"].as_array().unwrap().contains(&json!(CPU)));
    let series: querier::SeriesResponse = call(
        &s,
        "Series",
        &querier::SeriesRequest {
            matchers: vec![format!("{{__profile_type__=\"{CPU}\"}}")],
            label_names: vec!["service_name".into(), "__profile_type__".into()],
            start,
            end,
        },
    )
    .await;
    let sets: Vec<Vec<(String, String)>> = series
        .labels_set
        .iter()
        .map(|l| {
            l.labels
                .iter()
                .map(|p| (p.name.clone(), p.value.clone()))
                .collect()
        })
        .collect();
    let set = |svc: &str| {
        vec![
            ("__profile_type__".to_owned(), CPU.to_owned()),
            ("service_name".to_owned(), svc.to_owned()),
        ]
    };
    assert_eq!(sets, vec![set("a"), set("b")]);

    // The merged flame graph: in JSON with Pyroscope's spellings (int64 as strings), then
    // binary, then as a tree and as pprof.
    let (status, fg) = call_json(
        &s,
        None,
        "SelectMergeStacktraces",
        json!({"profile_typeID": CPU, "labelSelector": "{service_name=\"a\"}",
               "start": start.to_string(), "end": end.to_string(), "maxNodes": "16"}),
    )
    .await;
    assert_eq!(status, 200, "{fg}");
    assert_eq!(fg["flamegraph"]["total"], json!((2 * want).to_string()));
    let request = querier::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: "{}".into(),
        start,
        end,
        max_nodes: Some(16),
        ..Default::default()
    };
    let merged: querier::SelectMergeStacktracesResponse =
        call(&s, "SelectMergeStacktraces", &request).await;
    let graph = merged.flamegraph.unwrap();
    assert_eq!(check_flame_graph(&graph), 3 * want);
    // 16 nodes besides the root, and an `other` per parent whose callees were cut.
    let other = graph
        .names
        .iter()
        .position(|n| n == "other")
        .map(|i| i as i64);
    let kept = graph
        .levels
        .iter()
        .flat_map(|l| l.values.chunks(WIDTH))
        .filter(|n| Some(n[3]) != other)
        .count();
    assert_eq!(kept, 16 + 1, "max_nodes 16");
    assert!(other.is_some());
    let full: querier::SelectMergeStacktracesResponse = call(
        &s,
        "SelectMergeStacktraces",
        &querier::SelectMergeStacktracesRequest {
            max_nodes: None,
            ..request.clone()
        },
    )
    .await;
    assert!(check_flame_graph(full.flamegraph.as_ref().unwrap()) == 3 * want);
    assert!(full.flamegraph.unwrap().names.len() > graph.names.len());
    let tree: querier::SelectMergeStacktracesResponse = call(
        &s,
        "SelectMergeStacktraces",
        &querier::SelectMergeStacktracesRequest {
            format: querier::ProfileFormat::Tree as i32,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(tree_total(&tree.tree), 3 * want);
    let pprof: querier::SelectMergeStacktracesResponse = call(
        &s,
        "SelectMergeStacktraces",
        &querier::SelectMergeStacktracesRequest {
            format: querier::ProfileFormat::Pprof as i32,
            ..request.clone()
        },
    )
    .await;
    assert_eq!(
        pprof_total(pprof.pprof.unwrap().profile.as_ref().unwrap()),
        3 * want
    );
    let profile: google::Profile = call(
        &s,
        "SelectMergeProfile",
        &querier::SelectMergeProfileRequest {
            profile_type_id: CPU.into(),
            label_selector: "{service_name=\"b\"}".into(),
            start,
            end,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(pprof_total(&profile), want);
    let (_, json_profile) = call_json(
        &s,
        None,
        "SelectMergeProfile",
        json!({"profileTypeID": CPU, "labelSelector": "{}", "start": start, "end": end}),
    )
    .await;
    assert!(!json_profile["sample"].as_array().unwrap().is_empty());

    // Series over time: a point per profile at a 1 s step; grouped; averaged; limited.
    let select = |group_by: Vec<String>, aggregation, limit| querier::SelectSeriesRequest {
        profile_type_id: CPU.into(),
        label_selector: "{}".into(),
        start,
        end,
        group_by,
        step: 1.0,
        aggregation,
        limit,
        ..Default::default()
    };
    let by_service: querier::SelectSeriesResponse = call(
        &s,
        "SelectSeries",
        &select(vec!["service_name".into()], None, None),
    )
    .await;
    assert_eq!(by_service.series.len(), 2);
    let a = &by_service.series[0];
    assert_eq!(a.labels[0].value, "a");
    assert_eq!(
        a.points
            .iter()
            .map(|p| (p.timestamp, p.value))
            .collect::<Vec<_>>(),
        vec![(t0, want as f64), (t0 + 10_000, want as f64)]
    );
    let all: querier::SelectSeriesResponse = call(
        &s,
        "SelectSeries",
        &querier::SelectSeriesRequest {
            step: 60.0,
            ..select(vec![], None, None)
        },
    )
    .await;
    let sum: f64 = all
        .series
        .iter()
        .flat_map(|s| &s.points)
        .map(|p| p.value)
        .sum();
    assert_eq!(sum, (3 * want) as f64);
    let averaged: querier::SelectSeriesResponse = call(
        &s,
        "SelectSeries",
        &querier::SelectSeriesRequest {
            step: 60.0,
            ..select(
                vec!["service_name".into()],
                Some(types::TimeSeriesAggregationType::Average as i32),
                None,
            )
        },
    )
    .await;
    // Service a: two profiles in one step average to one profile's value.
    let a_points: Vec<f64> = averaged.series[0].points.iter().map(|p| p.value).collect();
    assert_eq!(a_points.iter().sum::<f64>(), want as f64, "{averaged:?}");
    let (_, limited) = call_json(
        &s,
        None,
        "SelectSeries",
        json!({"profileTypeID": CPU, "labelSelector": "{}", "start": start.to_string(),
               "end": end.to_string(), "groupBy": ["service_name"], "step": 60, "limit": "1",
               "aggregation": "TIME_SERIES_AGGREGATION_TYPE_SUM"}),
    )
    .await;
    let limited = limited["series"].as_array().unwrap();
    assert_eq!(limited.len(), 1);
    assert_eq!(
        limited[0]["labels"][0]["value"], "a",
        "the larger series is kept"
    );

    // A diff of a against b, and the stats.
    let diff: querier::DiffResponse = call(
        &s,
        "Diff",
        &querier::DiffRequest {
            left: Some(querier::SelectMergeStacktracesRequest {
                label_selector: "{service_name=\"a\"}".into(),
                ..request.clone()
            }),
            right: Some(querier::SelectMergeStacktracesRequest {
                label_selector: "{service_name=\"b\"}".into(),
                ..request.clone()
            }),
        },
    )
    .await;
    let d = diff.flamegraph.unwrap();
    assert_eq!(
        (d.left_ticks, d.right_ticks, d.total),
        (2 * want, want, 3 * want)
    );
    assert_eq!(d.levels[0].values, vec![0, 2 * want, 0, 0, want, 0, 0]);
    let stats: types::GetProfileStatsResponse =
        call(&s, "GetProfileStats", &types::GetProfileStatsRequest {}).await;
    assert!(stats.data_ingested);
    assert_eq!(
        (stats.oldest_profile_time, stats.newest_profile_time),
        (t0, t0 + 10_000)
    );
    let (status, analyzed) = call_json(
        &s,
        None,
        "AnalyzeQuery",
        json!({"query": format!("{CPU}{{service_name=\"a\"}}"), "start": start, "end": end}),
    )
    .await;
    assert_eq!(status, 200, "{analyzed}");
    assert_eq!(analyzed["queryImpact"]["totalQueriedSeries"], "1");

    // Settings: an empty list.
    let (status, body) = post(
        &format!("{}/settings.v1.SettingsService/Get", s.url),
        None,
        "application/json",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!((status, body.as_slice()), (200, b"{}".as_slice()));

    // Another tenant sees nothing.
    let (status, other) = call_json(&s, Some("other"), "ProfileTypes", json!({})).await;
    assert_eq!((status, other), (200, json!({})));
}

#[tokio::test]
async fn querier_errors_are_connect_errors_with_the_right_codes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    push(&s, None, "a", 1_700_000_000_000).await;
    let cases = [
        (
            "SelectMergeStacktraces",
            json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"a\""}),
            400,
            "invalid_argument",
            "label_selector",
        ),
        (
            "SelectMergeStacktraces",
            json!({"labelSelector": "{}"}),
            400,
            "invalid_argument",
            "profile_typeID",
        ),
        (
            "SelectMergeStacktraces",
            json!({"profileTypeID": CPU, "stackTraceSelector": {"goPgo": {"keepLocations": 2}}}),
            501,
            "unimplemented",
            "go_pgo",
        ),
        (
            "SelectSeries",
            json!({"profileTypeID": CPU}),
            400,
            "invalid_argument",
            "step",
        ),
        ("NoSuchMethod", json!({}), 404, "not_found", "NoSuchMethod"),
        (
            "ProfileTypes",
            json!({"start": "x"}),
            400,
            "invalid_argument",
            "proto3 JSON",
        ),
        (
            "ProfileTypes",
            json!({"start": "20", "end": "10"}),
            400,
            "invalid_argument",
            "before",
        ),
    ];
    for (method, body, status, code, what) in cases {
        let (got, error) = call_json(&s, None, method, body.clone()).await;
        assert_eq!(got, status, "{method} {body}: {error}");
        assert_eq!(error["code"], code, "{method} {body}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(what), "{method} {body}: {message}");
    }
    // Garbage protobuf and an unknown content type.
    let (status, body) = post(
        &format!("{}/querier.v1.QuerierService/ProfileTypes", s.url),
        None,
        "application/proto",
        vec![0xff, 0xff, 0xff],
    )
    .await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _) = post(
        &format!("{}/querier.v1.QuerierService/ProfileTypes", s.url),
        None,
        "text/plain",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(status, 415);
}

#[tokio::test]
async fn grpc_and_grpc_web_give_the_connect_answers() {
    use frostdb_server::querier::grpc::querier::querier_service_client::QuerierServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let want = cpu_total();
    let t0 = 1_700_000_000_000i64;
    push(&s, Some("team-a"), "a", t0).await;
    let request = querier::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: "{service_name=\"a\"}".into(),
        start: t0 - 1,
        end: t0 + 1,
        ..Default::default()
    };

    // gRPC (HTTP/2 without TLS), the tenant in the metadata.
    let channel = tonic::transport::Channel::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = QuerierServiceClient::new(channel);
    let with_tenant = |r: querier::SelectMergeStacktracesRequest, tenant: &str| {
        let mut r = tonic::Request::new(r);
        r.metadata_mut()
            .insert("x-scope-orgid", tenant.parse().unwrap());
        r
    };
    let answer = client
        .select_merge_stacktraces(with_tenant(request.clone(), "team-a"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(check_flame_graph(&answer.flamegraph.unwrap()), want);
    let empty = client
        .select_merge_stacktraces(with_tenant(request.clone(), "team-b"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        empty.flamegraph.unwrap().total,
        0,
        "another tenant sees nothing"
    );
    let error = client
        .select_merge_stacktraces(with_tenant(
            querier::SelectMergeStacktracesRequest {
                label_selector: "{".into(),
                ..request.clone()
            },
            "team-a",
        ))
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error}");
    assert!(error.message().contains("label_selector"), "{error}");

    // gRPC-Web over HTTP/1.1: a length-prefixed message, then the trailers frame.
    let mut body = vec![0u8];
    let message = request.encode_to_vec();
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(message);
    let response = reqwest::Client::new()
        .post(format!(
            "{}/querier.v1.QuerierService/SelectMergeStacktraces",
            s.url
        ))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .header("x-scope-orgid", "team-a")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let bytes = response.bytes().await.unwrap();
    assert_eq!(bytes[0], 0, "a data frame first");
    let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
    let answer = querier::SelectMergeStacktracesResponse::decode(&bytes[5..5 + len]).unwrap();
    assert_eq!(check_flame_graph(&answer.flamegraph.unwrap()), want);
    let trailers = String::from_utf8_lossy(&bytes[5 + len + 5..]);
    assert_eq!(bytes[5 + len], 0x80, "then the trailers frame");
    assert!(trailers.contains("grpc-status:0"), "{trailers}");
}

#[tokio::test]
async fn the_render_api_answers_flamebearer_json_with_timelines_and_diffs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let want = cpu_total();
    let t0 = 1_700_000_000_000i64;
    push(&s, None, "a", t0).await;
    push(&s, None, "a", t0 + 60_000).await;
    push(&s, None, "b", t0 + 30_000).await;
    let get = |path: String| {
        let url = format!("{}{path}", s.url);
        async move {
            let r = reqwest::get(url).await.unwrap();
            let status = r.status().as_u16();
            (
                status,
                serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap(),
            )
        }
    };
    let query = common::enc(&format!("{CPU}{{}}"));
    let (from, until) = (t0 / 1000 - 600, t0 / 1000 + 600);
    let (status, fb) = get(format!(
        "/pyroscope/render?query={query}&from={from}&until={until}&groupBy=service_name&max-nodes=32"
    ))
    .await;
    assert_eq!(status, 200, "{fb}");
    assert_eq!(fb["version"], 1);
    assert_eq!(fb["flamebearer"]["numTicks"], 3 * want);
    assert_eq!(fb["flamebearer"]["names"][0], "total");
    assert_eq!(fb["metadata"]["format"], "single");
    assert_eq!(fb["metadata"]["units"], "samples");
    assert_eq!(fb["metadata"]["name"], "cpu");
    let levels = fb["flamebearer"]["levels"].as_array().unwrap();
    assert_eq!(levels[0], json!([0, 3 * want, 0, 0]));
    let sum = |t: &Value| -> i64 {
        t["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .sum()
    };
    assert_eq!(fb["timeline"]["durationDelta"], 15);
    assert_eq!(sum(&fb["timeline"]), 3 * want);
    assert_eq!(sum(&fb["groups"]["a"]), 2 * want);
    assert_eq!(sum(&fb["groups"]["b"]), want);
    // Averaged over a step holding both of a's profiles: one profile's value.
    let (_, avg) = get(format!(
        "/pyroscope/render?query={}&from={from}&until={until}&aggregation=avg",
        common::enc(&format!("{CPU}{{service_name=\"a\"}}"))
    ))
    .await;
    assert_eq!(avg["flamebearer"]["numTicks"], 2 * want);
    assert_eq!(
        sum(&avg["timeline"]),
        2 * want,
        "one profile a step, each its own value"
    );

    let (status, diff) = get(format!(
        "/pyroscope/render-diff?leftQuery={}&leftFrom={from}&leftUntil={until}&rightQuery={}&rightFrom={from}&rightUntil={until}",
        common::enc(&format!("{CPU}{{service_name=\"a\"}}")),
        common::enc(&format!("{CPU}{{service_name=\"b\"}}")),
    ))
    .await;
    assert_eq!(status, 200, "{diff}");
    assert_eq!(diff["metadata"]["format"], "double");
    assert_eq!(
        (diff["leftTicks"].as_i64(), diff["rightTicks"].as_i64()),
        (Some(2 * want), Some(want))
    );
    assert_eq!(
        diff["flamebearer"]["levels"][0],
        json!([0, 2 * want, 0, 0, want, 0, 0])
    );

    let (status, error) = get("/pyroscope/render?query=%7Bservice_name%3D%22a%22%7D".into()).await;
    assert_eq!(status, 400);
    assert!(
        error["message"].as_str().unwrap().contains("profile type"),
        "{error}"
    );
}

#[tokio::test]
async fn generated_python_clients_agree_over_grpc_grpc_web_and_connect() {
    let Some(python) = common::venv_python("grpc_tools") else {
        return;
    };
    if common::venv_python("pyroscope").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    // A real program profiled by the real pyroscope-io client.
    let out = tokio::process::Command::new(&python)
        .arg(common::e2e_script("pyroscope_client.py"))
        .args([s.url.as_str(), "py-querier", "3"])
        .output()
        .await
        .unwrap();
    common::assert_ran(&out, "pyroscope_client.py");
    let (status, types) = call_json(&s, Some("py-querier"), "ProfileTypes", json!({})).await;
    assert_eq!(status, 200);
    let cpu = types["profileTypes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["ID"].as_str())
        .find(|t| t.starts_with("process_cpu:"))
        .unwrap_or_else(|| panic!("no process_cpu type in {types}"))
        .to_owned();
    // The total as the server's own API reports it.
    let service = "frostdb-e2e-python";
    let top = common::get_json(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            common::enc(&format!("{cpu}{{service_name=\"{service}\"}}"))
        ),
        Some("py-querier"),
    )
    .await;
    let total = top["total"].as_i64().unwrap();
    assert!(total > 0, "{top}");
    let protos = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../frostdb-pprof/proto");
    let out = tokio::process::Command::new(&python)
        .arg(common::e2e_script("querier_client.py"))
        .args([
            s.url.as_str(),
            "py-querier",
            protos.to_str().unwrap(),
            &cpu,
            service,
            &total.to_string(),
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    for method in [
        "ProfileTypes",
        "LabelNames",
        "LabelValues",
        "Series",
        "SelectMergeStacktraces",
        "SelectMergeSpanProfile",
        "SelectMergeProfile",
        "SelectSeries",
        "Diff",
        "GetProfileStats",
        "AnalyzeQuery",
        "Get",
    ] {
        assert!(
            stdout.contains(&format!(
                "{method}: grpc, connect+proto, connect+json, grpc-web agree"
            )),
            "{method} not checked:\n{stdout}"
        );
    }
}

/// In-use memory, a gauge.
const INUSE: &str = "memory:inuse_space:bytes:space:bytes";

/// The querier's Diff, `render-diff` and SelectMergeStacktraces answer one question one way:
/// a gauge's side is averaged over the range as its flame graph is (and as `/api/v1/query`
/// answers), a counter's summed.
#[tokio::test]
async fn a_querier_diff_side_totals_what_its_flame_graph_totals() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    // One program's heap taken twice, every other sample tripled the second time.
    let t0 = 1_700_000_000_000i64;
    let mut each = Vec::new();
    for (i, grow) in [1, 3].into_iter().enumerate() {
        let mut p = frostdb_pprof::decode(
            &testdata("pprof/goapp__go119-heap.pb.gz"),
            &frostdb_pprof::Limits::default(),
        )
        .unwrap()
        .into_inner();
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
        each.push(p.sample.iter().map(|s| s.value[inuse]).sum::<i64>());
        push_profile(&s, None, "memory", p, "heapy", t0 + 10_000 * i as i64).await;
    }
    assert!(each[0] < each[1], "{each:?}");
    push(&s, None, "heapy", t0).await;
    push(&s, None, "heapy", t0 + 10_000).await;
    let (start, end) = (t0 - 60_000, t0 + 60_000);
    let sum = each[0] + each[1];
    let label_selector = "{service_name=\"heapy\"}";

    // The server's own answer, averaged.
    let top = common::get_json(
        &format!(
            "{}/api/v1/query?format=top&selector={}&from={start}&to={end}",
            s.url,
            common::enc(&format!("{INUSE}{label_selector}"))
        ),
        None,
    )
    .await;
    let average = top["total"].as_i64().unwrap();
    assert!(
        average * 2 <= sum && average > sum / 4,
        "{average} of {each:?}"
    );

    for (profile_type, want) in [(INUSE, average), (CPU, 2 * cpu_total())] {
        let request = querier::SelectMergeStacktracesRequest {
            profile_type_id: profile_type.into(),
            label_selector: label_selector.into(),
            start,
            end,
            ..Default::default()
        };
        let merged: querier::SelectMergeStacktracesResponse =
            call(&s, "SelectMergeStacktraces", &request).await;
        let merged = check_flame_graph(&merged.flamegraph.unwrap());
        assert_eq!(merged, want, "{profile_type}: SelectMergeStacktraces");
        let diff: querier::DiffResponse = call(
            &s,
            "Diff",
            &querier::DiffRequest {
                left: Some(request.clone()),
                right: Some(request.clone()),
            },
        )
        .await;
        let d = diff.flamegraph.unwrap();
        assert_eq!(
            (d.left_ticks, d.right_ticks),
            (want, want),
            "{profile_type}: Diff"
        );

        // The legacy render API, in seconds.
        let query = common::enc(&format!("{profile_type}{label_selector}"));
        let (from, until) = (start / 1000, end / 1000);
        let render_diff = |extra: &'static str| {
            let url = format!(
                "{}/pyroscope/render-diff?leftQuery={query}&leftFrom={from}&leftUntil={until}&rightQuery={query}&rightFrom={from}&rightUntil={until}{extra}",
                s.url
            );
            async move {
                let r = reqwest::get(url).await.unwrap();
                assert_eq!(r.status(), 200);
                let said = r.headers()["x-frostdb-aggregation"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                let fb: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
                let ticks = |k: &str| fb[k].as_i64().unwrap_or_else(|| panic!("{k} in {fb}"));
                (said, ticks("leftTicks"), ticks("rightTicks"))
            }
        };
        let default = if profile_type == INUSE {
            "average"
        } else {
            "sum"
        };
        assert_eq!(
            render_diff("").await,
            (default.to_owned(), want, want),
            "{profile_type}: render-diff"
        );
        if profile_type == INUSE {
            assert_eq!(
                render_diff("&aggregation=sum").await,
                ("sum".to_owned(), sum, sum)
            );
            assert_eq!(
                render_diff("&aggregation=latest").await,
                ("latest".to_owned(), each[1], each[1])
            );
        }
    }
}

/// A CPU profile of one stack (`main` → `spin`) whose one sample is worth `value`.
fn one_stack(value: i64) -> frostdb_pprof::proto::Profile {
    use frostdb_pprof::proto::{Function, Line, Location, Sample, ValueType};
    let strings = ["", "cpu", "nanoseconds", "main", "spin"];
    let vt = ValueType { r#type: 1, unit: 2 };
    let function = |id: u64, name: i64| Function {
        id,
        name,
        system_name: name,
        ..Default::default()
    };
    let location = |id: u64| Location {
        id,
        line: vec![Line {
            function_id: id,
            line: 1,
            ..Default::default()
        }],
        ..Default::default()
    };
    frostdb_pprof::proto::Profile {
        sample_type: vec![vt],
        period_type: Some(vt),
        period: 10_000_000,
        duration_nanos: 10_000_000_000,
        function: vec![function(1, 3), function(2, 4)],
        location: vec![location(1), location(2)],
        sample: vec![Sample {
            location_id: vec![2, 1],
            value: vec![value],
            ..Default::default()
        }],
        string_table: strings.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

/// Sums past `i64::MAX` add up to `i64::MAX` on every route, never wrapping to a negative
/// total: two series of one stack merged (flame graphs, tops, trees, diffs), two profiles of
/// one series in one step (series over time). A sample holds at most 2^53, so each
/// profile is 1,100 samples of it on one stack, past i64::MAX by itself.
#[tokio::test]
async fn sums_past_i64_max_saturate_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let big = || {
        let mut p = one_stack(1 << 53);
        p.sample = vec![p.sample[0].clone(); 1_100];
        p
    };
    let t0 = 1_700_000_000_000i64;
    push_profile(&s, None, "process_cpu", big(), "a", t0).await;
    push_profile(&s, None, "process_cpu", big(), "b", t0).await;
    push_profile(&s, None, "process_cpu", big(), "a", t0 + 1_000).await;
    let (from, to) = (t0 - 60_000, t0 + 60_000);
    let get = |path: String| {
        let url = format!("{}{path}", s.url);
        async move {
            let r = reqwest::get(&url).await.unwrap();
            assert_eq!(r.status(), 200, "{url}");
            serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap()
        }
    };
    let all = common::enc(&format!("{CPU}{{}}"));
    let top = get(format!(
        "/api/v1/query?format=top&selector={all}&from={from}&to={to}"
    ))
    .await;
    assert_eq!(top["total"].as_i64(), Some(i64::MAX), "{top}");
    let diff = get(format!("/api/v1/diff?selector={all}&from={from}&to={to}")).await;
    assert_eq!(
        (diff["base"].as_i64(), diff["compare"].as_i64()),
        (Some(i64::MAX), Some(i64::MAX)),
        "{diff}"
    );
    let range = get(format!(
        "/api/v1/query_range?selector={}&from={from}&to={to}&step=1h",
        common::enc(&format!("{CPU}{{service_name=\"a\"}}"))
    ))
    .await;
    assert_eq!(
        range["series"][0]["points"][0][1].as_i64(),
        Some(i64::MAX),
        "{range}"
    );
    let (f, u) = (from / 1000, to / 1000);
    let render = get(format!("/pyroscope/render?query={all}&from={f}&until={u}")).await;
    assert_eq!(
        render["flamebearer"]["numTicks"].as_i64(),
        Some(i64::MAX),
        "{render}"
    );
    let (status, merged) = call_json(
        &s,
        None,
        "SelectMergeStacktraces",
        json!({"profile_typeID": CPU, "labelSelector": "{}",
               "start": from.to_string(), "end": to.to_string()}),
    )
    .await;
    assert_eq!(status, 200, "{merged}");
    assert_eq!(merged["flamegraph"]["total"], json!(i64::MAX.to_string()));
    let (status, series) = call_json(
        &s,
        None,
        "SelectSeries",
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"a\"}",
               "start": from.to_string(), "end": to.to_string(), "step": 3600.0}),
    )
    .await;
    assert_eq!(status, 200, "{series}");
    let point = series["series"][0]["points"][0]["value"].as_f64().unwrap();
    assert_eq!(point, i64::MAX as f64, "{series}");
}
