//! The fuzz targets' bodies (`fuzz/`, AFL++) on their corpus in every test run: every real
//! profile, folded file, OTLP export and push request built from them, selectors,
//! truncations and bit flips of each (deterministic), and whatever AFL++ left in `fuzz/`
//! (its seeds, crashes and hangs). Nothing may panic.

mod common;

use std::path::PathBuf;

use frostdb_core::fuzzing::{found_inputs, variants};
use frostdb_pprof::convert::push::proto as push;
use frostdb_pprof::fuzzing::{
    decode_target, folded_target, normalize_target, otlp_target, push_target, selector_target,
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
