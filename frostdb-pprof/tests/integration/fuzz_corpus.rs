//! The fuzz targets' bodies (`fuzz/`, AFL++) on their corpus in every test run: every real
//! profile, folded file, OTLP export and push request built from them, selectors,
//! truncations and bit flips of each (deterministic), and whatever AFL++ left in `fuzz/`
//! (its seeds, crashes and hangs). Nothing may panic. The request targets' seeds (real push
//! requests, OTLP exports, Grafana's queries) are built here; `FROSTDB_FUZZ_SEEDS=<dir>`
//! also writes them there (`fuzz/seeds`, which `fuzz/run.sh` seeds AFL++ from).

use crate::common;

use std::path::PathBuf;

use frostdb_core::fuzzing::{found_inputs, variants};
use frostdb_pprof::convert::push::proto as push;
use frostdb_pprof::fuzzing::{
    QUERIER_METHODS, decode_target, folded_target, jfr_target, normalize_target,
    otlp_bounds_target, otlp_target, parca_target, push_bounds_target, push_target, querier_target,
    selector_target, speedscope_target, trie_target,
};
use prost::Message;

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Variants of a pprof file, raw and gunzipped.
fn pprof_variants(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = variants(bytes);
    if let Ok(raw) = frostdb_pprof::inflate(bytes, 64 << 20) {
        out.extend(variants(&raw).into_iter().skip(1));
    }
    out
}

/// Files of a `shared/testdata` directory.
fn files(dir: &str) -> Vec<Vec<u8>> {
    let dir = common::shared().join("testdata").join(dir);
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with("README.txt"))
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// Runs `target` on every input and every variant of it, then on what AFL++ found; returns
/// how many inputs it ran.
fn replay(name: &str, inputs: Vec<Vec<u8>>, target: fn(&[u8])) -> usize {
    let mut runs = 0;
    for input in inputs {
        for v in variants(&input) {
            target(&v);
            runs += 1;
        }
    }
    for v in found_inputs(&fuzz_dir(), name) {
        target(&v);
    }
    runs
}

#[test]
fn the_decode_target_never_panics_on_its_corpus() {
    let mut runs = 0;
    for (_, bytes) in common::testdata() {
        for v in pprof_variants(&bytes) {
            decode_target(&v);
            runs += 1;
        }
    }
    // The legacy formats decode reads after protobuf: a gperftools CPU profile, text heap
    // and contention profiles (google/pprof's testdata lines).
    let cpu: Vec<u8> = [0u64, 3, 0, 10_000, 0, 2, 2, 0x401000, 0x402000, 0, 1, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .chain(
            b"00400000-00fcb000 r-xp 00000000 00:00 0 /bin/server\n"
                .iter()
                .copied(),
        )
        .collect();
    let legacy = [
        cpu,
        b"heap profile: 1: 524288 [3: 1572864] @ heap/1048576\n1: 524288 [3: 1572864] @ 0x420cef 0x420fa9\n\nMAPPED_LIBRARIES:\n00400000-00fcb000 r-xp 00000000 00:00 0 /bin/server\n".to_vec(),
        b"--- contentionz 1 ---\ncycles/second = 3201000000\nsampling period = 100\n19490304 27 @ 0x7f6c4db7e6c8 0x7f6c4db7e2d8\n--- Memory map: ---\n00400000-00fcb000 r-xp 00000000 00:00 0 /bin/server\n".to_vec(),
    ];
    for input in &legacy {
        assert!(frostdb_pprof::decode(input, &frostdb_pprof::Limits::default()).is_ok());
        for v in variants(input) {
            decode_target(&v);
            runs += 1;
        }
    }
    for v in found_inputs(&fuzz_dir(), "decode") {
        decode_target(&v);
    }
    assert!(runs > 1000, "{runs} inputs");
}

#[test]
fn the_normalize_target_never_panics_on_its_corpus() {
    let mut runs = 0;
    for (_, bytes) in common::testdata() {
        // Whole files and a few variants each: storing is slower than decoding.
        for v in pprof_variants(&bytes).into_iter().step_by(4) {
            normalize_target(&v);
            runs += 1;
        }
    }
    for v in found_inputs(&fuzz_dir(), "normalize") {
        normalize_target(&v);
    }
    assert!(runs > 200, "{runs} inputs");
}

#[test]
fn the_folded_otlp_and_push_targets_never_panic_on_their_corpus() {
    let folded = files("folded");
    assert!(!folded.is_empty());
    assert!(replay("folded", folded, folded_target) >= 51);

    let otlp = files("otlp");
    assert!(!otlp.is_empty());
    assert!(replay("otlp", otlp, otlp_target) >= 17);

    // Push requests carrying the real profiles, in protobuf and JSON.
    let mut requests = Vec::new();
    for (name, bytes) in common::testdata().into_iter().take(8) {
        let request = push::PushRequest {
            series: vec![push::RawProfileSeries {
                labels: vec![
                    push::LabelPair {
                        name: "__name__".into(),
                        value: "process_cpu".into(),
                    },
                    push::LabelPair {
                        name: "service_name".into(),
                        value: name,
                    },
                ],
                samples: vec![push::RawSample {
                    raw_profile: bytes,
                    id: String::new(),
                }],
            }],
        };
        requests.push(request.encode_to_vec());
    }
    requests.push(
        br#"{"series":[{"labels":[{"name":"__name__","value":"cpu"}],"samples":[{"rawProfile":"H4sIAAAAAAAA"}]}]}"#
            .to_vec(),
    );
    assert!(replay("push", requests, push_target) >= 8 * 17);
}

/// `(frames root first, count)` of a folded file's lines.
fn folded_stacks(text: &[u8]) -> Vec<(Vec<String>, u64)> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let frames: Vec<String> = stack
                .split(';')
                .filter(|f| !f.is_empty())
                .map(str::to_owned)
                .collect();
            (!frames.is_empty()).then_some(())?;
            Some((frames, count.trim().parse().ok()?))
        })
        .collect()
}

fn uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn node(out: &mut Vec<u8>, name: &[u8], value: u64, children: u64) {
    uvarint(out, name.len() as u64);
    out.extend_from_slice(name);
    uvarint(out, value);
    uvarint(out, children);
}

/// A tree body of `stacks` (Pyroscope's "no dictionary" tree), written without recursion.
fn tree_body(stacks: &[(Vec<String>, u64)]) -> Vec<u8> {
    // Nodes: name, self value, children (by first sight).
    let mut nodes: Vec<(String, u64, Vec<usize>)> = vec![(String::new(), 0, Vec::new())];
    for (frames, count) in stacks {
        let mut at = 0;
        for f in frames {
            at = match nodes[at].2.iter().find(|&&c| nodes[c].0 == *f) {
                Some(&c) => c,
                None => {
                    nodes.push((f.clone(), 0, Vec::new()));
                    let c = nodes.len() - 1;
                    nodes[at].2.push(c);
                    c
                }
            };
        }
        nodes[at].1 += count;
    }
    let mut out = Vec::new();
    let mut todo = vec![0];
    while let Some(n) = todo.pop() {
        let (name, value, children) = &nodes[n];
        node(&mut out, name.as_bytes(), *value, children.len() as u64);
        todo.extend(children.iter().rev());
    }
    out
}

/// A trie body of `stacks`: the root, and each stack's whole key as a leaf under it.
fn trie_body(stacks: &[(Vec<String>, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    node(&mut out, b"", 0, stacks.len() as u64);
    for (frames, count) in stacks {
        node(&mut out, frames.join(";").as_bytes(), *count, 0);
    }
    out
}

/// A speedscope file of `stacks`, one sampled profile.
fn speedscope_body(stacks: &[(Vec<String>, u64)]) -> Vec<u8> {
    let mut names: Vec<String> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let samples: Vec<Vec<usize>> = stacks
        .iter()
        .map(|(frames, _)| {
            frames
                .iter()
                .map(|f| {
                    *index.entry(f.clone()).or_insert_with(|| {
                        names.push(f.clone());
                        names.len() - 1
                    })
                })
                .collect()
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "$schema": frostdb_pprof::convert::speedscope::SCHEMA,
        "shared": {"frames": names.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>()},
        "profiles": [{
            "type": "sampled", "name": "folded", "unit": "none", "startValue": 0, "endValue": 1,
            "samples": samples, "weights": stacks.iter().map(|s| s.1).collect::<Vec<_>>(),
        }],
    }))
    .unwrap()
}

#[test]
fn the_trie_and_speedscope_targets_never_panic_on_their_corpus() {
    // Every folded file of shared/testdata as a trie, a tree and a speedscope file (each
    // checked to convert whole first), and speedscope's own samples.
    let stacks: Vec<Vec<(Vec<String>, u64)>> = files("folded")
        .iter()
        .map(|f| folded_stacks(f))
        .filter(|s| !s.is_empty())
        .collect();
    assert!(stacks.len() >= 3);
    let units = frostdb_pprof::convert::folded::Units {
        sample: ("cpu".into(), "nanoseconds".into()),
        period: ("cpu".into(), "nanoseconds".into()),
        period_value: 10_000_000,
        scale: 1,
    };
    let limits = frostdb_pprof::Limits::default();
    let total =
        |p: &frostdb_pprof::proto::Profile| p.sample.iter().map(|s| s.value[0]).sum::<i64>();
    let mut tries = Vec::new();
    let mut speedscopes = Vec::new();
    for s in &stacks {
        let want: i64 = s.iter().map(|(_, c)| *c as i64).sum();
        let (trie, tree) = (trie_body(s), tree_body(s));
        use frostdb_pprof::convert::trie::{tree_to_profile, trie_to_profile};
        assert_eq!(
            total(&trie_to_profile(&trie, &units, &limits).unwrap()),
            want
        );
        assert_eq!(
            total(&tree_to_profile(&tree, &units, &limits).unwrap()),
            want
        );
        let scope = speedscope_body(s);
        let converted = frostdb_pprof::convert::speedscope::convert(&scope, 100, &limits).unwrap();
        assert_eq!(total(&converted[0].profile), want * 10_000_000);
        tries.extend([trie, tree]);
        speedscopes.push(scope);
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/speedscope");
    for entry in std::fs::read_dir(&dir).unwrap() {
        speedscopes.push(std::fs::read(entry.unwrap().path()).unwrap());
    }
    write_seeds("trie", &tries);
    write_seeds("speedscope", &speedscopes);
    assert!(replay("trie", tries, trie_target) >= 6 * 17);
    assert!(replay("speedscope", speedscopes, speedscope_target) >= 9 * 17);
}

#[test]
fn the_jfr_target_never_panics_on_its_corpus() {
    // async-profiler's recordings (testdata/jfr), raw: each converts whole first.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/jfr");
    let mut recordings = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".jfr.gz") {
            let raw = frostdb_pprof::inflate(&std::fs::read(&path).unwrap(), 64 << 20)
                .unwrap()
                .into_owned();
            let converted = frostdb_pprof::convert::jfr::convert(
                &raw,
                None,
                100,
                &frostdb_pprof::Limits::default(),
            )
            .unwrap();
            assert!(!converted.profiles.is_empty(), "{}", path.display());
            recordings.push(raw);
        }
    }
    assert_eq!(recordings.len(), 4);
    let runs = replay("jfr", recordings, jfr_target);
    assert!(runs >= 4 * 17, "{runs} inputs");
}

#[test]
fn the_parca_target_never_panics_on_its_corpus() {
    use frostdb_pprof::convert::parca::proto;
    // A WriteRaw request of each real pprof, and the agent's Arrow record.
    let mut inputs = Vec::new();
    for (i, profile) in files("pprof").into_iter().take(6).enumerate() {
        let request = proto::WriteRawRequest {
            series: vec![proto::RawProfileSeries {
                labels: Some(proto::LabelSet {
                    labels: vec![proto::Label {
                        name: "__name__".into(),
                        value: format!("parca_agent_{i}"),
                    }],
                }),
                samples: vec![proto::RawSample {
                    raw_profile: profile,
                    executable_info: vec![],
                }],
            }],
            ..Default::default()
        };
        let mut input = vec![0u8];
        input.extend(request.encode_to_vec());
        inputs.push(input);
    }
    let (record, _, _) = frostdb_pprof::testing::parca_agent_record("00112233445566778899");
    let limits = frostdb_pprof::Limits::default();
    assert_eq!(
        frostdb_pprof::convert::parca::write_arrow(&record, &limits)
            .unwrap()
            .len(),
        2,
        "the agent's record converts whole"
    );
    let mut input = vec![1u8];
    input.extend(record);
    inputs.push(input);
    let (samples, locations, _, _, _) =
        frostdb_pprof::testing::parca_agent_v1_records("00112233445566778899");
    assert_eq!(
        frostdb_pprof::convert::parca::write_v1(&samples, &locations, &limits)
            .unwrap()
            .len(),
        2,
        "the agent's Write records convert whole"
    );
    let mut input = vec![2u8];
    input.extend((samples.len() as u32).to_le_bytes());
    input.extend(samples);
    input.extend(locations);
    inputs.push(input);
    write_seeds("parca", &inputs);
    let runs = replay("parca", inputs, parca_target);
    assert!(runs >= 8 * 17, "{runs} inputs");
}

#[test]
fn the_selector_target_never_panics_on_its_corpus() {
    let selectors = [
        r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="api", pod=~"api-.*"}"#,
        r#"{namespace!="kube-system",env!~"dev|test"}"#,
        r#"memory:inuse_space:bytes:space:bytes{}"#,
        r#"{a="\"quoted\" \\ and unicode ✓"}"#,
        r#"{a=~"(a+)+$"}"#,
    ];
    let runs = replay(
        "selector",
        selectors.iter().map(|s| s.as_bytes().to_vec()).collect(),
        selector_target,
    );
    assert!(runs >= 5 * 17, "{runs} inputs");
}

/// The committed seeds of `target` (`fuzz/seeds/<target>`).
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir().join("seeds").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// Writes `inputs` as the seeds of `target` when `FROSTDB_FUZZ_SEEDS` names a directory:
/// those under 64 KiB (`fuzz/run.sh` takes larger ones from shared/testdata itself).
fn write_seeds(target: &str, inputs: &[Vec<u8>]) {
    let Ok(dir) = std::env::var("FROSTDB_FUZZ_SEEDS") else {
        return;
    };
    let dir = PathBuf::from(dir).join(target);
    std::fs::create_dir_all(&dir).unwrap();
    for (i, input) in inputs.iter().enumerate() {
        if input.len() < 64 << 10 {
            std::fs::write(dir.join(format!("{i:02}")), input).unwrap();
        }
    }
}

/// Push requests of small real profiles, in protobuf and JSON, and of many empty labels
/// and series.
fn push_seeds() -> Vec<Vec<u8>> {
    use base64::Engine;
    let mut small: Vec<(String, Vec<u8>)> = common::testdata();
    small.sort_by_key(|(_, bytes)| bytes.len());
    let mut out = Vec::new();
    for (name, bytes) in small.into_iter().take(3) {
        let label = |name: &str, value: &str| push::LabelPair {
            name: name.into(),
            value: value.into(),
        };
        let request = push::PushRequest {
            series: vec![push::RawProfileSeries {
                labels: vec![
                    label("__name__", "process_cpu"),
                    label("service_name", &name),
                ],
                samples: vec![push::RawSample {
                    raw_profile: bytes.clone(),
                    id: "5b2e8a5e-0f5c-4b8e-9f0e-1a2b3c4d5e6f".into(),
                }],
            }],
        };
        out.push(request.encode_to_vec());
        let json = serde_json::json!({"series": [{
            "labels": [{"name": "__name__", "value": "process_cpu"},
                       {"name": "service_name", "value": name}],
            "samples": [{"rawProfile": base64::engine::general_purpose::STANDARD.encode(&bytes)}],
        }]});
        out.push(json.to_string().into_bytes());
    }
    let empty = push::PushRequest {
        series: vec![
            push::RawProfileSeries {
                labels: vec![push::LabelPair::default(); 100],
                samples: Vec::new(),
            };
            3
        ],
    };
    out.push(empty.encode_to_vec());
    out.push(format!(r#"{{"series":[{}]}}"#, vec!["{}"; 100].join(",")).into_bytes());
    out
}

/// The real OTLP export, one of samples sharing a deep stack, and one of many empty
/// resource profiles.
fn otlp_seeds() -> Vec<Vec<u8>> {
    use frostdb_pprof::convert::otlp::proto as otlp;
    let mut out = files("otlp");
    let shared = otlp::ExportProfilesServiceRequest {
        dictionary: Some(otlp::ProfilesDictionary {
            string_table: vec![String::new(), "main".into()],
            function_table: vec![
                otlp::Function::default(),
                otlp::Function {
                    name_strindex: 1,
                    ..Default::default()
                },
            ],
            location_table: vec![
                otlp::Location::default(),
                otlp::Location {
                    lines: vec![otlp::Line {
                        function_index: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            stack_table: vec![otlp::Stack {
                location_indices: vec![1; 64],
            }],
            ..Default::default()
        }),
        resource_profiles: vec![otlp::ResourceProfiles {
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![otlp::Profile {
                    samples: vec![
                        otlp::Sample {
                            values: vec![1],
                            ..Default::default()
                        };
                        100
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    out.push(shared.encode_to_vec());
    out.push(
        otlp::ExportProfilesServiceRequest {
            resource_profiles: vec![otlp::ResourceProfiles::default(); 100],
            dictionary: None,
        }
        .encode_to_vec(),
    );
    out
}

/// Grafana's requests (`examples/server/tests/fixtures/grafana_requests.json`, what its data
/// source, the Profiles Drilldown and Pyroscope's page send) as the querier target takes
/// them: the method's byte, then the body in proto3 JSON, or in binary protobuf.
fn querier_seeds() -> Vec<Vec<u8>> {
    use frostdb_pprof::api::querier::v1 as querier;
    use frostdb_pprof::api::settings::v1 as settings;
    use frostdb_pprof::api::types::v1 as types;
    fn proto<M: Message + serde::de::DeserializeOwned>(json: &str) -> Vec<u8> {
        serde_json::from_str::<M>(json)
            .unwrap_or_else(|e| panic!("{json}: {e}"))
            .encode_to_vec()
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/server/tests/fixtures/grafana_requests.json");
    let fixtures: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    for request in fixtures.as_array().unwrap() {
        let path = request["path"].as_str().unwrap();
        let method = match path.rsplit_once('/') {
            Some(("/querier.v1.QuerierService", m)) => m.to_owned(),
            Some(("/settings.v1.SettingsService", m)) => format!("settings.{m}"),
            _ => continue,
        };
        let Some(i) = QUERIER_METHODS.iter().position(|m| *m == method) else {
            continue;
        };
        let mut json = request["body"].to_string();
        for (placeholder, value) in [
            ("${START_MS}", "1700000000000"),
            ("${END_MS}", "1700003600000"),
            ("${START_S}", "1700000000"),
            ("${END_S}", "1700003600"),
            (
                "${PROFILE_TYPE}",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            ),
            ("${SERVICE}", "api"),
            ("${GRAFANA}", "grafana"),
            ("${TENANT}", "anonymous"),
        ] {
            json = json.replace(placeholder, value);
        }
        let bytes = match method.as_str() {
            "ProfileTypes" => proto::<querier::ProfileTypesRequest>(&json),
            "LabelValues" => proto::<types::LabelValuesRequest>(&json),
            "LabelNames" => proto::<types::LabelNamesRequest>(&json),
            "Series" => proto::<querier::SeriesRequest>(&json),
            "SelectMergeStacktraces" => proto::<querier::SelectMergeStacktracesRequest>(&json),
            "SelectMergeSpanProfile" => proto::<querier::SelectMergeSpanProfileRequest>(&json),
            "SelectMergeProfile" => proto::<querier::SelectMergeProfileRequest>(&json),
            "SelectSeries" => proto::<querier::SelectSeriesRequest>(&json),
            "SelectHeatmap" => proto::<querier::SelectHeatmapRequest>(&json),
            "Diff" => proto::<querier::DiffRequest>(&json),
            "GetProfileStats" => proto::<types::GetProfileStatsRequest>(&json),
            "AnalyzeQuery" => proto::<querier::AnalyzeQueryRequest>(&json),
            "settings.Get" => proto::<settings::GetSettingsRequest>(&json),
            "settings.Set" => proto::<settings::SetSettingsRequest>(&json),
            _ => proto::<settings::DeleteSettingsRequest>(&json),
        };
        for body in [json.into_bytes(), bytes] {
            let mut input = vec![i as u8];
            input.extend(body);
            out.push(input);
        }
    }
    out
}

#[test]
fn the_request_bounds_targets_never_panic_on_their_corpus() {
    for (target, inputs, body, least) in [
        (
            "push_bounds",
            push_seeds(),
            push_bounds_target as fn(&[u8]),
            8,
        ),
        ("otlp_bounds", otlp_seeds(), otlp_bounds_target, 3),
        ("querier", querier_seeds(), querier_target, 30),
    ] {
        assert!(inputs.len() >= least, "{target}: {} seeds", inputs.len());
        write_seeds(target, &inputs);
        let mut all = inputs;
        all.extend(seeds(target));
        let runs = replay(target, all, body);
        assert!(runs >= least * 17, "{target}: {runs} inputs");
    }
}
