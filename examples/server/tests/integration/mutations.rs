//! Real profiles, mutated, at every ingest route: truncated, bytes overwritten, a huge
//! varint or a stray wire type put in, chunks repeated, cut or spliced from another file, in
//! the pprof itself, in its gzip stream and in the envelope around it (a Pyroscope push, an
//! OTLP export, a Parca `WriteRaw` over gRPC-Web, a multipart form, the legacy formats).
//! Every request is answered: stored, or refused with a 4xx (503 when busy), never a 5xx
//! or a gRPC `internal`; the server stays up, and every profile type it then holds answers
//! a flame graph. Mutations found a request stored whole in one run that failed every later
//! request mixing known and new symbols (a panic: 500).
//!
//! `FROSTDB_MUTATION_ROUNDS` (default 600) and `FROSTDB_MUTATION_SEED` (default fixed) set
//! the run; the documented long run is 20,000 rounds at a random seed, printed on failure.

use crate::common;

use std::io::Write;

use common::{Server, enc, get, get_json, testdata};

/// The seeded generator, and the draws the cases make of it.
use frostdb_core::testing::SplitMix as Rng;

fn chance(rng: &mut Rng, percent: u64) -> bool {
    rng.next_u64() % 100 < percent
}

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len())]
}

fn varint(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// A length-delimited protobuf field.
fn field(number: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = varint(number << 3 | 2);
    out.extend(varint(payload.len() as u64));
    out.extend_from_slice(payload);
    out
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// The testdata a mutation starts from.
struct Corpus {
    /// Every pprof of testdata/pprof, inflated.
    pprofs: Vec<Vec<u8>>,
    folded: Vec<Vec<u8>>,
    otlp: Vec<Vec<u8>>,
}

impl Corpus {
    fn load() -> Self {
        let dir = common::shared().join("testdata");
        let files = |sub: &str, keep: &dyn Fn(&str) -> bool| -> Vec<Vec<u8>> {
            let mut names: Vec<String> = std::fs::read_dir(dir.join(sub))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect();
            names.sort();
            names
                .iter()
                .map(|n| testdata(&format!("{sub}/{n}")))
                .collect()
        };
        let pprofs = files("pprof", &|n| n.ends_with(".pb") || n.ends_with(".pb.gz"))
            .into_iter()
            .map(|b| {
                if b.starts_with(&[0x1f, 0x8b]) {
                    let mut out = Vec::new();
                    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&b[..]), &mut out)
                        .unwrap();
                    out
                } else {
                    b
                }
            })
            .filter(|b| b.len() < 3 << 20)
            .collect();
        Self {
            pprofs,
            folded: files("folded", &|n| {
                n.ends_with(".txt") && !n.starts_with("README")
            }),
            otlp: files("otlp", &|n| n.ends_with(".pb")),
        }
    }

    /// `b` mutated one of seven ways (or not at all).
    fn mutate(&self, rng: &mut Rng, b: &[u8]) -> Vec<u8> {
        let mut b = b.to_vec();
        let at = |rng: &mut Rng, b: &Vec<u8>| rng.below(b.len() + 1);
        match rng.below(8) {
            0 => b.truncate(rng.below(b.len())),
            1 => {
                for _ in 0..1 + rng.below(20) {
                    if !b.is_empty() {
                        let i = rng.below(b.len());
                        b[i] = rng.next_u64() as u8;
                    }
                }
            }
            2 => {
                let huge = *pick(
                    rng,
                    &[1 << 31, (1 << 32) - 1, 1 << 63, 1 << 40, 1_000_000_000],
                );
                let i = at(rng, &b);
                b.splice(i..i, varint(huge));
            }
            3 => {
                let i = at(rng, &b);
                let j = (i + 1 + rng.below(4_000)).min(b.len());
                let chunk = b[i..j].repeat(1 + rng.below(50));
                b.splice(j..j, chunk);
            }
            4 => {
                let i = at(rng, &b);
                let j = (i + 1 + rng.below(200)).min(b.len());
                b.drain(i..j);
            }
            5 => {
                let other = pick(rng, &self.pprofs);
                let from = rng.below(other.len() + 1);
                let to = (from + 1 + rng.below(3_000)).min(other.len());
                let i = at(rng, &b);
                b.splice(i..i, other[from..to].iter().copied());
            }
            6 => {
                for _ in 0..1 + rng.below(4) {
                    if !b.is_empty() {
                        let i = rng.below(b.len());
                        b[i] = *pick(rng, &[0x07, 0x0e, 0x0f, 0x7a, 0xff, 0x80]);
                    }
                }
            }
            _ => {}
        }
        b
    }
}

/// One request: its path, body and content type.
struct Case {
    path: String,
    body: Vec<u8>,
    content_type: &'static str,
}

fn case(corpus: &Corpus, rng: &mut Rng) -> Case {
    let pprof = pick(rng, &corpus.pprofs).clone();
    let ingest = |format: &str| format!("/ingest?name=mutated.cpu&format={format}&from=1700000000");
    match rng.below(8) {
        0 => {
            let raw = corpus.mutate(rng, &pprof);
            let body = if chance(rng, 50) { gzip(&raw) } else { raw };
            Case {
                path: ingest("pprof"),
                body,
                content_type: "application/octet-stream",
            }
        }
        // The gzip stream mutated, not what it holds.
        1 => Case {
            path: ingest("pprof"),
            body: corpus.mutate(rng, &gzip(&pprof)),
            content_type: "application/octet-stream",
        },
        2 => {
            let format = *pick(
                rng,
                &["folded", "lines", "trie", "tree", "speedscope", "jfr"],
            );
            let source = match format {
                "folded" | "lines" => pick(rng, &corpus.folded).clone(),
                "speedscope" => br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"},{"name":"b"}]},"profiles":[{"type":"sampled","name":"p","unit":"none","startValue":0,"endValue":3,"samples":[[0,1],[1]],"weights":[1,2]}]}"#.to_vec(),
                _ => pprof,
            };
            Case {
                path: ingest(format),
                body: corpus.mutate(rng, &source),
                content_type: "application/octet-stream",
            }
        }
        3 => {
            let raw = corpus.mutate(rng, &pprof);
            let raw = if chance(rng, 50) { gzip(&raw) } else { raw };
            let labels = [field(1, b"__name__"), field(2, b"process_cpu")].concat();
            let service = [field(1, b"service_name"), field(2, b"mutated")].concat();
            let series = [
                field(1, &labels),
                field(1, &service),
                field(2, &[field(1, &raw), field(2, b"id")].concat()),
            ]
            .concat();
            let mut body = field(1, &series);
            if chance(rng, 30) {
                body = corpus.mutate(rng, &body);
            }
            Case {
                path: "/push.v1.PusherService/Push".into(),
                body,
                content_type: "application/proto",
            }
        }
        4 => {
            let export = pick(rng, &corpus.otlp);
            Case {
                path: "/v1development/profiles".into(),
                body: corpus.mutate(rng, export),
                content_type: "application/x-protobuf",
            }
        }
        5 => {
            let raw = gzip(&corpus.mutate(rng, &pprof));
            let label = |k: &[u8], v: &[u8]| field(1, &[field(1, k), field(2, v)].concat());
            let set = [
                label(b"__name__", b"process_cpu"),
                label(b"job", b"mutated"),
            ]
            .concat();
            let series = [field(1, &set), field(2, &field(1, &raw))].concat();
            let message = field(2, &series);
            let mut body = vec![0];
            body.extend((message.len() as u32).to_be_bytes());
            body.extend(message);
            if chance(rng, 20) {
                body = corpus.mutate(rng, &body);
            }
            Case {
                path: "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw".into(),
                body,
                content_type: "application/grpc-web+proto",
            }
        }
        6 => {
            let raw = gzip(&corpus.mutate(rng, &pprof));
            let mut body = b"--XYZ\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"p\"\r\n\r\n".to_vec();
            body.extend(raw);
            body.extend(b"\r\n--XYZ--\r\n");
            if chance(rng, 50) {
                body = corpus.mutate(rng, &body);
            }
            Case {
                path: "/ingest?name=mutated.cpu&from=1700000000".into(),
                body,
                content_type: "multipart/form-data; boundary=XYZ",
            }
        }
        _ => {
            let inner = field(1, &corpus.mutate(rng, &pprof));
            Case {
                path: "/querier.v1.QuerierService/SelectMergeStacktraces".into(),
                body: corpus.mutate(rng, &inner),
                content_type: "application/proto",
            }
        }
    }
}

#[tokio::test]
async fn mutated_profiles_at_every_ingest_route_are_stored_or_refused_never_a_5xx() {
    let rounds: usize = std::env::var("FROSTDB_MUTATION_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(600);
    let seed: u64 = match std::env::var("FROSTDB_MUTATION_SEED").ok().as_deref() {
        None => 0x5eed,
        Some("random") => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
        Some(s) => s
            .parse()
            .expect("FROSTDB_MUTATION_SEED: a number or `random`"),
    };
    let corpus = Corpus::load();
    assert!(corpus.pprofs.len() > 20 && !corpus.otlp.is_empty() && !corpus.folded.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmemory = \"512MiB\"\n"),
    );
    let client = reqwest::Client::new();
    let mut rng = Rng(seed);
    let mut seen: std::collections::BTreeMap<(String, u16), usize> = Default::default();
    for round in 0..rounds {
        let case = case(&corpus, &mut rng);
        let replay = format!(
            "round {round} of seed {seed} (FROSTDB_MUTATION_SEED={seed} FROSTDB_MUTATION_ROUNDS={})",
            round + 1
        );
        let response = client
            .post(format!("{}{}", s.url, case.path))
            .header("Content-Type", case.content_type)
            .body(case.body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{replay}: POST {}: {e}", case.path));
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let (grpc_status, grpc_message) = (header("grpc-status"), header("grpc-message"));
        let body = response.bytes().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        assert!(
            status < 500 || status == 503,
            "{replay}: POST {} answered {status}: {}",
            case.path,
            &text[..text.len().min(400)]
        );
        if case.content_type.starts_with("application/grpc") {
            // gRPC-Web: the status is in the headers (an answer of trailers only) or in the
            // trailers, the body's last frame. A request message gRPC cannot parse is
            // INTERNAL by gRPC's own table of status codes ("error parsing request proto"),
            // which tonic follows, naming the fault; any other INTERNAL or UNKNOWN is ours.
            let message = grpc_message.as_deref().unwrap_or("").replace("%20", " ");
            let protocol = [
                "Unexpected EOF decoding stream",
                "failed to decode Protobuf message",
                "protocol error:",
                "Invalid header bit",
                "tonic-web:",
            ]
            .iter()
            .any(|m| message.starts_with(m));
            let internal = |s: &str| (s == "13" && !protocol) || s == "2";
            assert!(
                !grpc_status.as_deref().is_some_and(internal)
                    && !text.contains("grpc-status:13")
                    && !text.contains("grpc-status:2\r"),
                "{replay}: {} answered grpc-status {grpc_status:?} {grpc_message:?} {}",
                case.path,
                &text[text.len().saturating_sub(400)..]
            );
        }
        let route = case.path.split('?').next().unwrap().to_owned();
        *seen.entry((route, status)).or_default() += 1;
        assert!(s.running(), "{replay}: the server died");
    }
    eprintln!("seed {seed}, {rounds} rounds: {seen:?}");
    // Some of each kind were stored, and some refused: the mutations reach past the first
    // check, and not every one is accepted.
    let stored = seen.iter().filter(|((_, st), _)| *st == 200).count();
    let refused = seen.iter().filter(|((_, st), _)| *st == 400).count();
    assert!(stored >= 3 && refused >= 3, "{seen:?}");
    // What was stored reads: every profile type answers a flame graph.
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    let types = types.as_array().unwrap();
    assert!(!types.is_empty());
    for t in types {
        let id = t["id"].as_str().unwrap();
        let (status, body) = get(
            &format!(
                "{}/api/v1/query?selector={}&format=flamegraph",
                s.url,
                enc(id)
            ),
            None,
        )
        .await;
        assert!(
            status == 200 || (400..500).contains(&status),
            "{id}: {status} {}",
            &body[..body.len().min(400)]
        );
    }
    assert!(s.running(), "the server died");
}
