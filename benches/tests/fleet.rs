//! The six queries of shared/bench on its tiny fleet, through `frostdb-bench`'s ingest (both
//! load paths: profiles rebuilt from the Parquet rows, and the pprof files) and query,
//! checked against the generator's reference checksums (computed with numpy, independently
//! of any engine). `scripts/test.sh` generates the fleet and points
//! `FROSTDB_BENCH_DATA` at it; in CI a missing fleet is a failure.

use std::path::PathBuf;

use arrow::array::RecordBatch;
use arrow::util::display::array_value_to_string;
use frostdb_benches::external;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sha2::{Digest, Sha256};

fn fleet() -> Option<PathBuf> {
    let dir = std::env::var("FROSTDB_BENCH_DATA").ok().map(PathBuf::from);
    match dir {
        Some(d) if d.join("expected.json").exists() => Some(d),
        _ => {
            assert!(
                std::env::var("CI").is_err(),
                "CI must run the fleet cross-check: scripts/test.sh generates it"
            );
            eprintln!(
                "SKIPPED: FROSTDB_BENCH_DATA does not point at a generated shared/bench fleet"
            );
            None
        }
    }
}

/// shared/bench's checksum: rows rendered `a|b|c`, sorted, joined by newlines, SHA-256, 16 hex.
fn checksum(batches: &[RecordBatch]) -> (usize, String) {
    let mut rows: Vec<String> = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let values: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, i).unwrap())
                .collect();
            rows.push(values.join("|"));
        }
    }
    rows.sort();
    let digest = Sha256::digest(rows.join("\n").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    (rows.len(), hex[..16].to_owned())
}

/// Loads the fleet with `ingest` (extra arguments: `--pprof` for the pprof files), runs the
/// six queries and compares each result with the reference checksums.
fn load_and_query(data: &std::path::Path, extra: &[&str]) {
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let s = |p: &std::path::Path| p.display().to_string();
    let args = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let (data_dir, store_dir) = (s(data), s(store.path()));
    let mut ingest = vec!["ingest", "--data", &data_dir, "--store", &store_dir];
    ingest.extend_from_slice(extra);
    if extra.contains(&"--pprof") {
        external::ingest_pprof(&args(&ingest)).unwrap();
    } else {
        external::ingest(&args(&ingest)).unwrap();
    }
    external::query(&args(&[
        "query",
        "--data",
        &data_dir,
        "--store",
        &store_dir,
        "--queries",
        &s(&data.join("queries.json")),
        "--runs",
        "1",
        "--out",
        &s(out.path()),
    ]))
    .unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("expected.json")).unwrap())
            .unwrap();
    for q in ["Q1", "Q2", "Q3", "Q4", "Q5", "Q6"] {
        let file = std::fs::File::open(out.path().join(format!("{q}.parquet"))).unwrap();
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let (rows, sha) = checksum(&batches);
        assert_eq!(
            rows as u64,
            expected[q]["rows"].as_u64().unwrap(),
            "{q} rows ({extra:?})"
        );
        assert_eq!(
            sha,
            expected[q]["sha"].as_str().unwrap(),
            "{q} checksum ({extra:?})"
        );
    }
}

#[test]
fn the_six_queries_match_the_reference_checksums_loaded_from_parquet_rows() {
    let Some(data) = fleet() else { return };
    load_and_query(&data, &["--threads", "8"]);
}

#[test]
fn the_six_queries_match_the_reference_checksums_loaded_from_pprof_files() {
    let Some(data) = fleet() else { return };
    load_and_query(&data, &["--pprof", "--threads", "8"]);
}
