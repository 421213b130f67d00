//! The bodies of the engine's fuzz targets (`fuzz/`): the parsers of bytes the engine reads
//! back from disk or an object store, a WAL segment and the manifest. Shared with the test
//! that replays their corpora, so the same code runs under the fuzzer and in CI. Any outcome
//! but a panic, a hang or unbounded memory is fine.

use std::io::Cursor;

use crate::wal::record::{MAGIC, SegmentReader, decode_entries, encode_entries, frame};

/// A WAL segment of arbitrary bytes (after the magic), read to its end; every record's
/// payload decoded. The same bytes are also decoded as one record's payload, directly and
/// framed as a whole segment (the checksums then hold, so the payload parser is reached).
pub fn wal_target(data: &[u8]) {
    let mut segment = MAGIC.to_vec();
    segment.extend_from_slice(data);
    read_segment(&segment);

    let direct = decode_entries(data);
    let mut framed = MAGIC.to_vec();
    framed.extend(frame(1, data));
    let records = read_segment(&framed);
    assert_eq!(
        records.len(),
        1,
        "a framed payload reads back as one record"
    );
    assert_eq!(records[0], data, "byte for byte");
    // What decodes encodes again to a payload that decodes to the same writes.
    if let Ok(entries) = direct {
        let refs: Vec<(&str, &arrow::record_batch::RecordBatch)> =
            entries.iter().map(|(t, b)| (t.as_str(), b)).collect();
        if let Ok(payload) = encode_entries(&refs) {
            let again = decode_entries(&payload).expect("a payload we wrote decodes");
            assert_eq!(again, entries, "and holds the same writes");
        }
    }
}

/// The payloads of a segment's readable records (decoding each).
fn read_segment(segment: &[u8]) -> Vec<Vec<u8>> {
    let Ok(reader) = SegmentReader::new("fuzz".into(), Cursor::new(segment), segment.len() as u64)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for record in reader {
        let Ok(record) = record else { break };
        let _ = decode_entries(&record.payload);
        out.push(record.payload);
    }
    out
}

/// A manifest of arbitrary bytes: parsed, and when it parses, written back and parsed
/// again to the same manifest.
pub fn manifest_target(data: &[u8]) {
    if let Ok(manifest) = crate::manifest::parse(data, "fuzz") {
        let bytes = serde_json::to_vec(&manifest).expect("a parsed manifest serialises");
        let again = crate::manifest::parse(&bytes, "fuzz").expect("and parses again");
        assert_eq!(
            serde_json::to_value(&again).expect("serialises"),
            serde_json::to_value(&manifest).expect("serialises"),
        );
    }
}

/// Deterministic variants of `bytes` for replaying a target in every test run: the bytes,
/// truncations, and a dozen copies with a few bits flipped.
pub fn variants(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![bytes.to_vec()];
    if bytes.is_empty() {
        return out;
    }
    let mut seed = bytes.len() as u64 ^ 0x9e37_79b9;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n.max(1)
    };
    for cut in [1, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1] {
        out.push(bytes[..cut].to_vec());
    }
    for _ in 0..12 {
        let mut v = bytes.to_vec();
        for _ in 0..(1 + next(4)) {
            let i = next(v.len());
            v[i] ^= 1 << next(8);
        }
        out.push(v);
    }
    out
}

/// The inputs kept for `target` under `fuzz/`: fixed findings (`fuzz/regressions/<target>`,
/// committed), AFL++'s corpus and what it found (`fuzz/out/<target>/default/{crashes,hangs}`),
/// so a found input is replayed by every test run.
pub fn found_inputs(fuzz_dir: &std::path::Path, target: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dir in [
        fuzz_dir.join("regressions").join(target),
        fuzz_dir.join("corpus").join(target),
        fuzz_dir.join("out").join(target).join("default/crashes"),
        fuzz_dir.join("out").join(target).join("default/hangs"),
    ] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            out.extend(entries.filter_map(|e| {
                let path = e.ok()?.path();
                (path.is_file() && !path.ends_with("README.txt"))
                    .then(|| std::fs::read(path).ok())?
            }));
        }
    }
    out
}
