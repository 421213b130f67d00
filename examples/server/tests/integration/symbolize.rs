//! Frames stored as addresses named at query time: a stripped C program's profile of
//! addresses only (its mapping's build id, no names), pushed to the server, comes back
//! from `/api/v1/query?format=pprof` with its functions, inlined frames and lines, from
//! Debian's debuginfod serving the debug file (`[symbolizer] debuginfod_urls`).
//!
//! Needs gcc, binutils and debuginfod (`scripts/test.sh` installs them).

use crate::common;

use common::{Reap, Server, enc, eventually, get, get_json, metric};
use frostdb_pprof::proto::{Profile, Sample, ValueType};
use frostdb_pprof::testing::stripped::{
    Built, Debuginfod, build, debuginfod, hot_function_offsets, names, profile_of,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_programs_addresses_come_back_named_from_debuginfod() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _debuginfod, url) = served(dir.path()).await;
    let s = symbolizing(dir.path(), &url, "");

    push_addresses(&s, &built, &offsets).await;
    // Pyroscope's render API (Grafana's and the web page's) names them, first: the names
    // go into the symbol partition, which every later report reads.
    let rendered = get_json(
        &format!(
            "{}/pyroscope/render?query={}&from=0&until=9999999999",
            s.url,
            enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"prog\"}")
        ),
        None,
    )
    .await;
    let shown: Vec<&str> = rendered["flamebearer"]["names"]
        .as_array()
        .unwrap_or_else(|| panic!("a flame graph: {rendered}"))
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(
        shown.contains(&"hot_function") && shown.contains(&"inlined_helper"),
        "{shown:?}"
    );
    let merged = queried_pprof(&s).await;
    assert_eq!(merged.location.len(), offsets.len());
    for i in 0..merged.location.len() {
        let n = names(&merged, i);
        assert_eq!(
            n.last().map(String::as_str),
            Some("hot_function"),
            "location {i}: {n:?}"
        );
        assert!(merged.location[i].line.last().unwrap().line > 0);
    }
    assert!(
        (0..merged.location.len()).any(|i| names(&merged, i) == ["inlined_helper", "hot_function"]),
        "the inlined helper is a frame of its own"
    );
    // Every report shows the names, not only the pprof: the folded stacks name the
    // inlined helper inside hot_function.
    let folded = folded(&s).await;
    assert!(folded.contains("hot_function;inlined_helper "), "{folded}");
    // The mapping still says where the names came from.
    assert!(
        merged
            .mapping
            .iter()
            .any(|m| merged.string_table[m.build_id as usize] == built.build_id)
    );
}

/// Named in the background with no query asking: once ingest stored the addresses, the
/// tenant's resolver names them (the symbolizer's metrics count them), and a query given no
/// time to resolve anything itself (`query_budget = "1ms"`) finds them named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_are_named_in_the_background_before_any_query() {
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _debuginfod, url) = served(dir.path()).await;
    let s = symbolizing(dir.path(), &url, "query_budget = \"1ms\"\n");
    push_addresses(&s, &built, &offsets).await;
    let resolved =
        || async { metric(&s, "frostdb_symbolizer_resolved_locations_total").await as usize };
    assert!(
        eventually(std::time::Duration::from_secs(60), async || resolved()
            .await
            >= offsets.len())
        .await,
        "the background resolver named {} of {} locations",
        resolved().await,
        offsets.len()
    );
    let merged = queried_pprof(&s).await;
    for i in 0..merged.location.len() {
        assert_eq!(
            names(&merged, i).last().map(String::as_str),
            Some("hot_function"),
            "location {i}"
        );
    }
}

/// The program built in `dir`, its `hot_function`'s file offsets, and Debian's debuginfod
/// serving its files at the URL returned.
async fn served(dir: &std::path::Path) -> (Built, Vec<u64>, Debuginfod, String) {
    let built = build(dir);
    let offsets = hot_function_offsets(&built);
    let (server, url) = debuginfod(&built.served, &dir.join("db"), &built.build_id).await;
    (built, offsets, server, url)
}

/// Pushes a CPU profile of the program as an eBPF profiler without its symbols takes it: a
/// sample per address of `offsets`, in a mapping with the build id and no names.
async fn push_addresses(s: &Server, built: &Built, offsets: &[u64]) {
    let mut p = profile_of(built, offsets, 0x5555_0000_0000);
    p.string_table.extend(["cpu".into(), "nanoseconds".into()]);
    let (cpu, ns) = (
        p.string_table.len() as i64 - 2,
        p.string_table.len() as i64 - 1,
    );
    p.sample_type = vec![ValueType {
        r#type: cpu,
        unit: ns,
    }];
    p.period_type = Some(ValueType {
        r#type: cpu,
        unit: ns,
    });
    p.period = 10_000_000;
    p.sample = p
        .location
        .iter()
        .map(|l| Sample {
            location_id: vec![l.id],
            value: vec![10_000_000],
            ..Sample::default()
        })
        .collect();
    let body = frostdb_pprof::report::pprof::encode_gzip(&p).unwrap();
    push(s, "/ingest?name=prog.cpu&format=pprof", body).await;
}

/// Posts `body` to `path`, which must take it.
async fn push(s: &Server, path: &str, body: Vec<u8>) {
    let pushed = reqwest::Client::new()
        .post(format!("{}{path}", s.url))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        pushed.status().as_u16(),
        200,
        "{}",
        pushed.text().await.unwrap()
    );
}

/// A server on `dir/data` asking the debuginfod at `url`, with more `[symbolizer]` lines.
fn symbolizing(dir: &std::path::Path, url: &str, more: &str) -> Server {
    Server::start(
        &dir.join("data"),
        Some(&format!(
            "[symbolizer]\ndebuginfod_urls = [\"{url}\"]\n{more}"
        )),
    )
}

/// The folded stacks of the program's CPU profiles, as the server answers them.
async fn folded(s: &Server) -> String {
    reqwest::get(format!(
        "{}/api/v1/query?format=folded&selector={}",
        s.url,
        enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"prog\"}")
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap()
}

/// The merged pprof of the program's CPU profiles, as the server answers it.
async fn queried_pprof(s: &Server) -> Profile {
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    let cpu_type = types
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .find(|t| t.contains(":cpu:nanoseconds"))
        .unwrap_or_else(|| panic!("a CPU type: {types}"))
        .to_owned();
    let answer = reqwest::get(format!(
        "{}/api/v1/query?format=pprof&selector={}",
        s.url,
        enc(&format!("{cpu_type}{{service_name=\"prog\"}}"))
    ))
    .await
    .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    frostdb_pprof::decode(&answer.bytes().await.unwrap(), &Default::default())
        .expect("a pprof answer")
        .into_inner()
}

/// `frostdb debuginfo upload` of the program as linked (symbols and DWARF in it) names
/// the same addresses with no debuginfod, from the next query on (a query before the upload
/// found nothing and answered addresses); a file uploaded under a build id that is not its
/// own is refused, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploaded_binary_names_the_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    let s = Server::start(
        &dir.path().join("data"),
        Some("[symbolizer]\ndebuginfod_urls = []\n"),
    );
    push_addresses(&s, &built, &offsets).await;
    let unnamed = queried_pprof(&s).await;
    assert!(
        unnamed.location.iter().all(|l| l.line.is_empty()),
        "nothing uploaded yet: addresses"
    );
    let frostdb = env!("CARGO_BIN_EXE_frostdb");
    let upload = |extra: &[&str]| {
        let mut cmd = std::process::Command::new(frostdb);
        cmd.args(["debuginfo", "upload", "--url", &s.url])
            .args(extra)
            .arg(&built.unstripped);
        cmd.output().unwrap()
    };
    let wrong = upload(&["--build-id", "0123456789abcdef"]);
    assert!(!wrong.status.success());
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        said.contains(&built.build_id) && said.contains("0123456789abcdef"),
        "{said}"
    );
    let out = upload(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&built.build_id));
    // The first query remembered the build id as missing; the upload made it forget, so
    // the next query finds the file at once.
    let merged = queried_pprof(&s).await;
    for i in 0..merged.location.len() {
        assert_eq!(
            names(&merged, i).last().map(String::as_str),
            Some("hot_function"),
            "location {i}"
        );
    }
}

/// The program's addresses as the OpenTelemetry eBPF profiler exports a CPU profile of it
/// (`reporter/internal/pdata/generate.go`): frames as file offsets in a mapping with no
/// start address, the mapping's build ids as attributes (its own file hash first, the GNU
/// one after), a `profile.frame.type` of `native`, samples as timestamps without values.
/// Pushed to `/v1development/profiles`, queried back named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otel_ebpf_profilers_native_frames_come_back_named() {
    use frostdb_pprof::convert::otlp::proto as otlp;
    let dir = tempfile::tempdir().unwrap();
    let (built, offsets, _debuginfod, url) = served(dir.path()).await;
    let s = symbolizing(dir.path(), &url, "");
    let strings: Vec<String> = [
        "",
        built.binary.to_str().unwrap(),
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "process.executable.build_id.htlhash",
        "process.executable.build_id.gnu",
        "profile.frame.type",
        "/usr/lib/libnobody.so",
    ]
    .map(String::from)
    .to_vec();
    let text = |s: &str| otlp::AnyValue {
        value: Some(otlp::any_value::Value::StringValue(s.into())),
    };
    let attribute = |key: i32, value: &str| otlp::KeyValueAndUnit {
        key_strindex: key,
        value: Some(text(value)),
        ..Default::default()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let request = otlp::ExportProfilesServiceRequest {
        dictionary: Some(otlp::ProfilesDictionary {
            string_table: strings,
            attribute_table: vec![
                otlp::KeyValueAndUnit::default(),
                attribute(6, "9f86d081884c7d659a2feaa0c55ad015"),
                attribute(7, &built.build_id),
                attribute(8, "native"),
                // A library whose build id nobody has.
                attribute(7, "0badc0de0badc0de"),
            ],
            mapping_table: vec![
                otlp::Mapping::default(),
                otlp::Mapping {
                    filename_strindex: 1,
                    attribute_indices: vec![1, 2],
                    ..Default::default()
                },
                otlp::Mapping {
                    filename_strindex: 9,
                    attribute_indices: vec![4],
                    ..Default::default()
                },
            ],
            location_table: std::iter::once(otlp::Location::default())
                .chain(offsets.iter().map(|&o| otlp::Location {
                    mapping_index: 1,
                    address: o,
                    attribute_indices: vec![3],
                    ..Default::default()
                }))
                .chain(std::iter::once(otlp::Location {
                    mapping_index: 2,
                    address: 0x1234,
                    attribute_indices: vec![3],
                    ..Default::default()
                }))
                .collect(),
            stack_table: std::iter::once(otlp::Stack::default())
                .chain((0..=offsets.len()).map(|i| otlp::Stack {
                    location_indices: vec![i as i32 + 1],
                }))
                .collect(),
            ..Default::default()
        }),
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(otlp::Resource {
                attributes: vec![otlp::KeyValue {
                    key: "process.executable.name".into(),
                    value: Some(text("prog")),
                }],
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![otlp::Profile {
                    sample_type: Some(otlp::ValueType {
                        type_strindex: 2,
                        unit_strindex: 3,
                    }),
                    period_type: Some(otlp::ValueType {
                        type_strindex: 4,
                        unit_strindex: 5,
                    }),
                    period: 50_000_000,
                    time_unix_nano: now,
                    samples: (0..=offsets.len())
                        .map(|i| otlp::Sample {
                            stack_index: i as i32 + 1,
                            timestamps_unix_nano: vec![now; 2],
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    push(
        &s,
        "/v1development/profiles",
        prost::Message::encode_to_vec(&request),
    )
    .await;
    let merged = queried_pprof(&s).await;
    assert_eq!(merged.location.len(), offsets.len() + 1);
    let build_id = |l: &frostdb_pprof::proto::Location| {
        let m = merged
            .mapping
            .iter()
            .find(|m| m.id == l.mapping_id)
            .unwrap();
        merged.string_table[m.build_id as usize].clone()
    };
    let mut unknown = 0;
    for (i, l) in merged.location.iter().enumerate() {
        // The GNU build id is the mapping's, not the profiler's own file hash.
        if build_id(l) == built.build_id {
            assert_eq!(
                names(&merged, i).last().map(String::as_str),
                Some("hot_function"),
                "location {i}"
            );
        } else {
            // The build id nobody has: an address, its mapping's build id kept.
            assert_eq!(build_id(l), "0badc0de0badc0de");
            assert!(l.line.is_empty() && l.address == 0x1234, "{l:?}");
            unknown += 1;
        }
    }
    assert_eq!(unknown, 1);
    assert!(
        (0..merged.location.len()).any(|i| names(&merged, i) == ["inlined_helper", "hot_function"])
    );
    // And the flame graph shows it as its address in its library.
    let folded = folded(&s).await;
    assert!(folded.contains("0x1234 [libnobody.so]"), "{folded}");
}

/// `frostdb serve --ebpf` profiling the stripped program as it runs: the sampler finds no
/// names in the binary and stores its frames as file offsets with the build id; the
/// server's symbolizer names them from debuginfod, inlined helper included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ebpf_samplers_frames_of_a_stripped_program_come_back_named() {
    if !common::bpf_permitted() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (built, _, _debuginfod, url) = served(dir.path()).await;
    let prog = Reap(
        std::process::Command::new(&built.binary)
            .arg("spin")
            .spawn()
            .unwrap(),
    );
    let s = Server::start(
        &dir.path().join("data"),
        Some(&format!(
            "[ebpf]\nfrequency_hz = 99\ninterval = \"1s\"\npids = [{}]\n\
             [symbolizer]\ndebuginfod_urls = [\"{url}\"]\n",
            prog.0.id()
        )),
    );
    let selector = format!(
        "ebpf_cpu:cpu:nanoseconds:cpu:nanoseconds{{pid=\"{}\"}}",
        prog.0.id()
    );
    let folded = || async {
        let (status, folded) = get(
            &format!(
                "{}/api/v1/query?format=folded&selector={}",
                s.url,
                enc(&selector)
            ),
            None,
        )
        .await;
        // 400 until its first interval is stored.
        format!("{status}: {folded}")
    };
    // Until an interval of the program is stored (its first waits for the unwind tables).
    let named = |f: &str| f.contains("hot_function;inlined_helper");
    assert!(
        eventually(std::time::Duration::from_secs(180), async || named(
            &folded().await
        ))
        .await,
        "{}",
        folded().await
    );
    // Its mapping kept the build id the names came from.
    let pprof = reqwest::get(format!(
        "{}/api/v1/query?format=pprof&selector={}",
        s.url,
        enc(&selector)
    ))
    .await
    .unwrap()
    .bytes()
    .await
    .unwrap();
    let p = frostdb_pprof::decode(&pprof, &Default::default())
        .unwrap()
        .into_inner();
    assert!(
        p.mapping
            .iter()
            .any(|m| p.string_table[m.build_id as usize] == built.build_id)
    );
}
