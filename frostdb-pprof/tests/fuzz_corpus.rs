//! The fuzz targets' bodies on their corpus: every real profile, truncations and bit flips
//! of each (deterministic), and whatever fuzzing left in `fuzz/corpus` and `fuzz/artifacts`.
//! Nothing may panic.

mod common;

use std::path::PathBuf;

use frostdb_pprof::fuzzing::{decode_target, normalize_target};

/// Deterministic variants of `bytes`: truncations and flipped bits, raw and gunzipped.
fn variants(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![bytes.to_vec()];
    let raw = frostdb_pprof::inflate(bytes, 64 << 20)
        .map(|c| c.into_owned())
        .unwrap_or_default();
    let mut seed = bytes.len() as u64 ^ 0x9e37_79b9;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n.max(1)
    };
    for source in [bytes, raw.as_slice()] {
        if source.is_empty() {
            continue;
        }
        for cut in [1, source.len() / 3, source.len() / 2, source.len() - 1] {
            out.push(source[..cut].to_vec());
        }
        for _ in 0..12 {
            let mut v = source.to_vec();
            for _ in 0..(1 + next(4)) {
                let i = next(v.len());
                v[i] ^= 1 << next(8);
            }
            out.push(v);
        }
    }
    out
}

fn extra_corpus() -> Vec<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut out = Vec::new();
    for dir in [
        "corpus/decode",
        "corpus/normalize",
        "artifacts/decode",
        "artifacts/normalize",
    ] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            out.extend(entries.filter_map(|e| std::fs::read(e.ok()?.path()).ok()));
        }
    }
    out
}

#[test]
fn the_decode_target_never_panics_on_its_corpus() {
    let mut runs = 0;
    for (_, bytes) in common::testdata() {
        for v in variants(&bytes) {
            decode_target(&v);
            runs += 1;
        }
    }
    for v in extra_corpus() {
        decode_target(&v);
    }
    assert!(runs > 1000, "{runs} inputs");
}

#[test]
fn the_normalize_target_never_panics_on_its_corpus() {
    let mut runs = 0;
    for (_, bytes) in common::testdata() {
        // Whole files and a few variants each: storing is slower than decoding.
        for v in variants(&bytes).into_iter().step_by(4) {
            normalize_target(&v);
            runs += 1;
        }
    }
    for v in extra_corpus() {
        normalize_target(&v);
    }
    assert!(runs > 200, "{runs} inputs");
}
