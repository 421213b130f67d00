//! Parca Agent's requests replayed against `frostdb serve` over gRPC: `WriteRaw` with a
//! profile shaped as the agent builds it, and a debug info upload as the agent makes it.
//! There is no agent binary here; the fixtures follow its source, parca-dev/parca-agent
//! v0.31.0 (`18aade29250e8ee4145777006f287540694b887d`): `pkg/pprof/pprof.go`
//! (`NewConverter`: one `samples`/`count` type, period type `cpu`/`nanoseconds`, the
//! process's mappings then `[kernel.kallsyms]`; `addAddrLocation`: native frames as
//! addresses in their mapping, no lines; kernel frames with their function; `thread_id`
//! and `thread_name` sample labels), `pkg/profiler/store.go` (`RemoteStore.Store`: one
//! series per label set, the pprof gzipped, `__name__` naming it) and
//! `pkg/profiler/cpu/cpu.go` (`parca_agent_cpu`); and for uploads main
//! (`cb46a8ea73a4c97ff0a555a4bab1cf9cec73daa0`) `reporter/parca_uploader.go` and
//! `reporter/grpc_upload_client.go` (ask, begin, an `UploadInfo` then chunks, finish).

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::{Server, enc, get_json};
use frostdb_pprof::convert::parca::proto as store;
use frostdb_pprof::debuginfo::{self, proto as di};
use frostdb_pprof::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use frostdb_server::ingest::parca::grpc::client::debuginfo_service_client::DebuginfoServiceClient;
use frostdb_server::ingest::parca::grpc::client::profile_store_service_client::ProfileStoreServiceClient;
use prost::Message;

const TYPE: &str = "parca_agent_cpu:samples:count:cpu:nanoseconds";
/// The types of the agent's Arrow records (the producer names the profile).
const CPU_TYPE: &str = "parca_agent:samples:count:cpu:nanoseconds";
const OFF_CPU_TYPE: &str = "parca_agent:wallclock:nanoseconds:samples:count";
const BUILD_ID: &str = "2f1ce2d9a0b9c6b3e1f9d3c8a7b6e5d4c3b2a190";

/// A profile as the agent's converter writes one: (stack of addresses, thread, count).
fn agent_profile() -> (Profile, i64) {
    let mut strings = vec![String::new()];
    let mut s = |x: &str| {
        strings.push(x.to_owned());
        strings.len() as i64 - 1
    };
    let (samples_, count, cpu, ns) = (s("samples"), s("count"), s("cpu"), s("nanoseconds"));
    let (app, build_id, kernel) = (s("/usr/bin/app"), s(BUILD_ID), s("[kernel.kallsyms]"));
    let (thread_id, thread_name, worker, main_) =
        (s("thread_id"), s("thread_name"), s("worker"), s("main"));
    let (t1, t2, syscall) = (s("101"), s("102"), s("do_syscall_64"));
    let mut p = Profile {
        sample_type: vec![ValueType {
            r#type: samples_,
            unit: count,
        }],
        period_type: Some(ValueType {
            r#type: cpu,
            unit: ns,
        }),
        period: 1_000_000_000 / 19,
        time_nanos: 1_763_805_600_000_000_000,
        duration_nanos: 10_000_000_000,
        mapping: vec![
            Mapping {
                id: 1,
                memory_start: 0x55_0000_0000,
                memory_limit: 0x55_0010_0000,
                file_offset: 0,
                filename: app,
                build_id,
                ..Mapping::default()
            },
            Mapping {
                id: 2,
                filename: kernel,
                ..Mapping::default()
            },
        ],
        function: vec![Function {
            id: 1,
            name: syscall,
            system_name: syscall,
            ..Function::default()
        }],
        ..Profile::default()
    };
    // Native frames: addresses in the app's mapping, no lines; one kernel frame, named.
    for (id, address) in [(1u64, 0x1140u64), (2, 0x11a0), (3, 0x1220)] {
        p.location.push(Location {
            id,
            mapping_id: 1,
            address,
            ..Location::default()
        });
    }
    p.location.push(Location {
        id: 4,
        mapping_id: 2,
        address: 0xffff_ffff_8100_0000,
        line: vec![Line {
            function_id: 1,
            ..Line::default()
        }],
        ..Location::default()
    });
    let label = |k: i64, v: i64| Label {
        key: k,
        str: v,
        ..Label::default()
    };
    let mut total = 0;
    for (stack, tid, name, n) in [
        (vec![1u64, 2, 3], t1, worker, 7i64),
        (vec![2, 3], t1, worker, 3),
        (vec![4, 1, 3], t2, main_, 5),
    ] {
        total += n;
        p.sample.push(Sample {
            location_id: stack,
            value: vec![n],
            label: vec![label(thread_id, tid), label(thread_name, name)],
        });
    }
    p.string_table = strings;
    (p, total)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> Option<store::LabelSet> {
    Some(store::LabelSet {
        labels: pairs
            .iter()
            .map(|(n, v)| store::Label {
                name: (*n).into(),
                value: (*v).into(),
            })
            .collect(),
    })
}

async fn channel(s: &Server) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(s.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn top_total(s: &Server, selector: &str) -> i64 {
    let top = get_json(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            s.url,
            enc(selector)
        ),
        None,
    )
    .await;
    top["total"]
        .as_i64()
        .unwrap_or_else(|| panic!("{selector}: {top}"))
}

#[tokio::test]
async fn write_raw_stores_the_agents_profiles_unsymbolized_frames_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let mut client = ProfileStoreServiceClient::new(channel(&s).await);
    let (profile, total) = agent_profile();
    let request = store::WriteRawRequest {
        series: vec![store::RawProfileSeries {
            labels: labels(&[
                ("__name__", "parca_agent_cpu"),
                ("node", "test-node"),
                ("pid", "4242"),
                ("comm", "app"),
            ]),
            samples: vec![store::RawSample {
                raw_profile: gzip(&profile.encode_to_vec()),
                executable_info: vec![store::ExecutableInfo {
                    elf_type: 3,
                    load_segment: Some(store::LoadSegment {
                        offset: 0,
                        vaddr: 0,
                    }),
                }],
            }],
        }],
        ..Default::default()
    };
    client.write_raw(request).await.unwrap();
    assert_eq!(
        top_total(&s, &format!("{TYPE}{{node=\"test-node\",comm=\"app\"}}")).await,
        total
    );
    // The agent's per-sample thread labels are labels of the samples.
    assert_eq!(
        top_total(&s, &format!("{TYPE}{{thread_name=\"main\"}}")).await,
        5
    );
    // The native frames come back as they were sent: addresses in the mapping with its
    // build id, for a symbolizer.
    let response = reqwest::get(format!(
        "{}/api/v1/query?format=pprof&selector={}",
        s.url,
        enc(&format!("{TYPE}{{node=\"test-node\"}}"))
    ))
    .await
    .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body = response.bytes().await.unwrap();
    let merged = frostdb_pprof::decode(&body, &Default::default()).expect("a pprof answer");
    let mapping = merged
        .mapping
        .iter()
        .find(|m| merged.string_table[m.build_id as usize] == BUILD_ID)
        .expect("the app's mapping keeps its build id");
    let mut addresses: Vec<u64> = merged
        .location
        .iter()
        .filter(|l| l.mapping_id == mapping.id)
        .map(|l| l.address)
        .collect();
    addresses.sort();
    assert_eq!(addresses, [0x1140, 0x11a0, 0x1220]);

    // A series without __name__, and a sample that is not pprof: INVALID_ARGUMENT naming
    // it, nothing stored.
    let nameless = store::WriteRawRequest {
        series: vec![store::RawProfileSeries {
            labels: labels(&[("node", "nameless")]),
            samples: vec![store::RawSample {
                raw_profile: gzip(&profile.encode_to_vec()),
                executable_info: vec![],
            }],
        }],
        ..Default::default()
    };
    let e = client.write_raw(nameless).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("__name__"), "{e}");
    let garbage = store::WriteRawRequest {
        series: vec![store::RawProfileSeries {
            labels: labels(&[("__name__", "parca_agent_cpu"), ("node", "garbage")]),
            samples: vec![store::RawSample {
                raw_profile: gzip(b"not a profile"),
                executable_info: vec![],
            }],
        }],
        ..Default::default()
    };
    let e = client.write_raw(garbage).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("series[0].samples[0]"), "{e}");
    let answer = get_json(&format!("{}/api/v1/label/node/values", s.url), None).await;
    assert_eq!(
        answer,
        serde_json::json!(["test-node"]),
        "nothing else stored"
    );
}

/// An agent's writes count against its tenant's ingest rate as HTTP pushes do: past it,
/// RESOURCE_EXHAUSTED naming the limit, and nothing of the refused write is stored.
#[tokio::test]
async fn write_raw_past_the_tenants_ingest_rate_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\ningest_rate_per_tenant = 1024\ningest_burst_per_tenant = 8192\n"),
    );
    let mut client = ProfileStoreServiceClient::new(channel(&s).await);
    let (profile, _) = agent_profile();
    let request = |node: usize| store::WriteRawRequest {
        series: vec![store::RawProfileSeries {
            labels: labels(&[
                ("__name__", "parca_agent_cpu"),
                ("node", &format!("n{node}")),
            ]),
            samples: vec![store::RawSample {
                raw_profile: profile.encode_to_vec(),
                executable_info: vec![],
            }],
        }],
        ..Default::default()
    };
    let mut written = 0;
    let refused = loop {
        match client.write_raw(request(written)).await {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 1_000, "never refused");
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    assert!(
        refused.message().contains("limits.ingest_rate_per_tenant"),
        "{refused}"
    );
    let nodes = get_json(&format!("{}/api/v1/label/node/values", s.url), None).await;
    assert_eq!(
        nodes.as_array().map(Vec::len),
        Some(written),
        "the refused write stored nothing: {nodes}"
    );
}

#[tokio::test]
async fn the_write_stream_asks_for_the_stacks_then_stores_the_agents_v1_records() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let mut client = ProfileStoreServiceClient::new(channel(&s).await);
    let (samples, locations, ids, cpu, off_cpu) =
        frostdb_pprof::testing::parca_agent_v1_records(BUILD_ID);
    // As the agent does it: the samples; the server's answer names the stack trace ids it
    // wants; their locations; then the stream ends, the profiles stored.
    let (mut tx, rx) = futures::channel::mpsc::channel(2);
    tx.try_send(store::WriteRequest { record: samples })
        .unwrap();
    let mut answers = client.write(rx).await.unwrap().into_inner();
    let wanted = answers
        .message()
        .await
        .unwrap()
        .expect("the server asks for stacks");
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(wanted.record), None)
            .unwrap();
    let mut asked: Vec<Vec<u8>> = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let column = batch
            .column_by_name("stacktrace_id")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::BinaryArray>()
            .expect("a binary column, as the agent reads it")
            .clone();
        asked.extend(column.iter().map(|v| v.unwrap().to_vec()));
    }
    assert_eq!(asked, ids, "every stack trace id, each once");
    tx.try_send(store::WriteRequest { record: locations })
        .unwrap();
    drop(tx);
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ends once stored"
    );
    assert_eq!(
        top_total(&s, &format!("{CPU_TYPE}{{node=\"v1-node\"}}")).await,
        cpu
    );
    assert_eq!(
        top_total(&s, &format!("{OFF_CPU_TYPE}{{node=\"v1-node\"}}")).await,
        off_cpu
    );
    assert_eq!(
        top_total(&s, &format!("{CPU_TYPE}{{thread_name=\"main\"}}")).await,
        3
    );

    // Locations that miss a stack the samples name: the stream ends in INVALID_ARGUMENT
    // and nothing is stored.
    let (samples, _, _, _, _) = frostdb_pprof::testing::parca_agent_v1_records(BUILD_ID);
    let (_, locations, _, _, _) = frostdb_pprof::testing::parca_agent_v1_records(BUILD_ID);
    let cut = {
        // The samples again, under another node; the locations record is the same, so
        // tamper with the samples' ids instead: the server asks for ids the agent lacks.
        let mut bytes = samples.clone();
        let a = vec![0xa1u8; 16];
        let at = bytes.windows(16).position(|w| w == a.as_slice()).unwrap();
        bytes[at..at + 16].copy_from_slice(&[0xc3; 16]);
        bytes
    };
    let (mut tx, rx) = futures::channel::mpsc::channel(2);
    tx.try_send(store::WriteRequest { record: cut }).unwrap();
    let mut answers = client.write(rx).await.unwrap().into_inner();
    answers
        .message()
        .await
        .unwrap()
        .expect("the server asks for stacks");
    tx.try_send(store::WriteRequest { record: locations })
        .unwrap();
    drop(tx);
    let e = answers.message().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("stack trace id"), "{e}");
    // A stream that ends before its locations: an error too.
    let (samples, _, _, _, _) = frostdb_pprof::testing::parca_agent_v1_records(BUILD_ID);
    let (tx, mut answers) = samples_answered(&mut client, samples).await;
    drop(tx);
    let e = answers.message().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert_eq!(
        top_total(&s, &format!("{CPU_TYPE}{{node=\"v1-node\"}}")).await,
        cpu,
        "nothing more stored"
    );
}

/// A Write stream that sent `samples` and got the server's answer asking for stacks: its
/// sender (still open) and the server's answers.
async fn samples_answered(
    client: &mut ProfileStoreServiceClient<tonic::transport::Channel>,
    samples: Vec<u8>,
) -> (
    futures::channel::mpsc::Sender<store::WriteRequest>,
    tonic::Streaming<store::WriteResponse>,
) {
    let (mut tx, rx) = futures::channel::mpsc::channel(2);
    tx.try_send(store::WriteRequest { record: samples })
        .unwrap();
    let mut answers = client.write(rx).await.unwrap().into_inner();
    answers
        .message()
        .await
        .unwrap()
        .expect("the server asks for stacks");
    (tx, answers)
}

/// A hostile (or stuck) agent that sends its samples, gets the server's answer and never
/// sends the locations: the stream ends in DEADLINE_EXCEEDED naming the limit once the
/// request's deadline passes (the samples record it held is dropped), nothing is stored,
/// and the server goes on answering.
#[tokio::test]
async fn a_write_stream_that_never_sends_its_locations_ends_at_the_request_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\nrequest_timeout_secs = 1\n"),
    );
    let mut client = ProfileStoreServiceClient::new(channel(&s).await);
    let (samples, _, _, _, _) = frostdb_pprof::testing::parca_agent_v1_records(BUILD_ID);
    let (tx, mut answers) = samples_answered(&mut client, samples).await;
    // The sender stays open: only the server's deadline can end the stream.
    let e = answers.message().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
    assert!(
        e.message().contains("limits.request_timeout_secs"),
        "the error names the limit: {e}"
    );
    drop(tx);
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    assert_eq!(types, serde_json::json!([]), "nothing was stored");
}

/// A system binary's GNU build id, as readelf reads it.
fn build_id_of(path: &Path) -> String {
    let out = std::process::Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build id: {text}", path.display()))
        .trim()
        .to_owned()
}

fn with_tenant<T>(message: T, tenant: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("x-scope-orgid", tenant.parse().unwrap());
    r
}

/// An upload as the agent streams it: the info, then the file in chunks of `chunk` bytes.
fn upload_stream(
    build_id: &str,
    upload_id: &str,
    file: &[u8],
    chunk: usize,
) -> impl futures::Stream<Item = di::UploadRequest> + use<> {
    let mut messages = vec![di::UploadRequest {
        data: Some(di::upload_request::Data::Info(di::UploadInfo {
            build_id: build_id.into(),
            upload_id: upload_id.into(),
            r#type: 0,
        })),
    }];
    messages.extend(file.chunks(chunk).map(|c| di::UploadRequest {
        data: Some(di::upload_request::Data::ChunkData(c.to_vec())),
    }));
    futures::stream::iter(messages)
}

/// The stored files named `debuginfo` under `dir`, with their build id directories.
fn stored_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n == "debuginfo") {
                let id = p
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((id, p));
            }
        }
    }
    out
}

/// A debug file streamed over gRPC holds its parts in flight of the memory budget, not
/// each message it sends decoded: an upload larger than the whole budget (96 MiB under 64)
/// is taken whole.
#[tokio::test]
async fn a_grpc_upload_larger_than_the_memory_budget_streams_through_it() {
    if !common::have("readelf", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[limits]\nmemory = \"64MiB\"\n"),
    );
    let mut client = DebuginfoServiceClient::new(channel(&s).await);
    let binary = PathBuf::from("/usr/bin/true");
    let mut file = std::fs::read(&binary).unwrap();
    file.resize(file.len() + (96 << 20), 0);
    let build_id = build_id_of(&binary);
    let instructions = client
        .initiate_upload(di::InitiateUploadRequest {
            build_id: build_id.clone(),
            size: file.len() as i64,
            hash: "file-hash".into(),
            build_id_type: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .upload_instructions
        .unwrap();
    let uploaded = client
        .upload(upload_stream(
            &build_id,
            &instructions.upload_id,
            &file,
            1 << 20,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(uploaded.size, file.len() as u64);
}

#[tokio::test]
async fn debug_info_uploads_as_the_agent_makes_them_are_kept_by_build_id() {
    if !common::have("readelf", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::start(&data, None);
    let mut client = DebuginfoServiceClient::new(channel(&s).await);
    let binary = PathBuf::from("/usr/bin/true");
    let file = std::fs::read(&binary).unwrap();
    let build_id = build_id_of(&binary);

    let ask = |id: &str, force: bool| di::ShouldInitiateUploadRequest {
        build_id: id.into(),
        force,
        build_id_type: 1,
        ..Default::default()
    };
    let answer = client
        .should_initiate_upload(ask(&build_id, false))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.should_initiate_upload, "{answer:?}");
    let begin = |id: &str, size: usize| di::InitiateUploadRequest {
        build_id: id.into(),
        size: size as i64,
        hash: "file-hash".into(),
        build_id_type: 1,
        ..Default::default()
    };
    let instructions = client
        .initiate_upload(begin(&build_id, file.len()))
        .await
        .unwrap()
        .into_inner()
        .upload_instructions
        .unwrap();
    assert_eq!(
        instructions.upload_strategy,
        di::upload_instructions::UploadStrategy::Grpc as i32
    );
    // While it uploads, another agent is told to wait, in the words the agent matches.
    let answer = client
        .should_initiate_upload(ask(&build_id, false))
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.should_initiate_upload);
    assert_eq!(answer.reason, debuginfo::REASON_IN_PROGRESS);
    let uploaded = client
        .upload(upload_stream(
            &build_id,
            &instructions.upload_id,
            &file,
            4096,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(uploaded.size, file.len() as u64);
    client
        .mark_upload_finished(di::MarkUploadFinishedRequest {
            build_id: build_id.clone(),
            upload_id: instructions.upload_id.clone(),
            r#type: 0,
        })
        .await
        .unwrap();
    let stored = stored_files(&data);
    let kept = stored
        .iter()
        .find(|(id, _)| *id == build_id)
        .expect("kept by build id");
    assert_eq!(
        std::fs::read(&kept.1).unwrap(),
        file,
        "the file byte for byte"
    );
    let answer = client
        .should_initiate_upload(ask(&build_id, false))
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.should_initiate_upload);
    let e = client
        .initiate_upload(begin(&build_id, file.len()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");

    // Another tenant has seen nothing.
    let answer = client
        .should_initiate_upload(with_tenant(ask(&build_id, false), "other"))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.should_initiate_upload, "tenants share no debug info");

    // A file whose build id is not the one it is uploaded as: refused when finished, and
    // not kept.
    let wrong = "00112233445566778899aabbccddeeff00112233";
    let up = client
        .initiate_upload(begin(wrong, file.len()))
        .await
        .unwrap()
        .into_inner();
    let upload_id = up.upload_instructions.unwrap().upload_id;
    client
        .upload(upload_stream(wrong, &upload_id, &file, 1 << 20))
        .await
        .unwrap();
    let e = client
        .mark_upload_finished(di::MarkUploadFinishedRequest {
            build_id: wrong.into(),
            upload_id,
            r#type: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains(&build_id), "{e}");
    assert!(
        !stored_files(&data).iter().any(|(id, _)| id == wrong),
        "not kept"
    );

    // More bytes than announced, a build id that is a path, an upload nobody began.
    let small = "aabbccddeeff";
    let up = client
        .initiate_upload(begin(small, 10))
        .await
        .unwrap()
        .into_inner();
    let upload_id = up.upload_instructions.unwrap().upload_id;
    let e = client
        .upload(upload_stream(small, &upload_id, &file, 1024))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("announced"), "{e}");
    for id in ["../../etc", "ab", "zz11"] {
        let e = client
            .should_initiate_upload(ask(id, false))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id}: {e}");
    }
    let e = client
        .upload(upload_stream("cafebabe", "nobody", b"x", 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
}

#[tokio::test]
async fn write_arrow_stores_the_agents_v2_records() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let mut client = ProfileStoreServiceClient::new(channel(&s).await);
    let (ipc, cpu, off_cpu) = frostdb_pprof::testing::parca_agent_record(BUILD_ID);
    client
        .write_arrow(store::WriteArrowRequest {
            ipc_buffer: ipc.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        top_total(&s, &format!("{CPU_TYPE}{{node=\"arrow-node\"}}")).await,
        cpu
    );
    assert_eq!(
        top_total(&s, &format!("{OFF_CPU_TYPE}{{node=\"arrow-node\"}}")).await,
        off_cpu
    );
    assert_eq!(
        top_total(&s, &format!("{CPU_TYPE}{{thread_name=\"worker\"}}")).await,
        cpu
    );
    // The Python frame keeps its function, the kernel frame its symbol; the native frames
    // are addresses in the app's mapping with its build id.
    let response = reqwest::get(format!(
        "{}/api/v1/query?format=pprof&selector={}",
        s.url,
        enc(&format!("{CPU_TYPE}{{}}"))
    ))
    .await
    .unwrap();
    let merged =
        frostdb_pprof::decode(&response.bytes().await.unwrap(), &Default::default()).unwrap();
    let names: Vec<&str> = merged
        .function
        .iter()
        .map(|f| merged.string_table[f.name as usize].as_str())
        .collect();
    assert!(
        names.contains(&"handler") && names.contains(&"do_syscall_64"),
        "{names:?}"
    );
    let mapping = merged
        .mapping
        .iter()
        .find(|m| merged.string_table[m.build_id as usize] == BUILD_ID)
        .expect("the app's mapping keeps its build id");
    assert!(
        merged
            .location
            .iter()
            .any(|l| l.mapping_id == mapping.id && l.address == 0x1220)
    );

    // Not v2, not Arrow, a stream cut short: INVALID_ARGUMENT, nothing stored.
    let e = client
        .write_arrow(store::WriteArrowRequest {
            ipc_buffer: b"garbage".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = client
        .write_arrow(store::WriteArrowRequest {
            ipc_buffer: ipc[..ipc.len() / 2].to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
}
