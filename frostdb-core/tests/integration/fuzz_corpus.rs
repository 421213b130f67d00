//! The engine's fuzz targets (`fuzz/`: wal, manifest) on a real WAL segment and manifest,
//! deterministic variants of each, and whatever AFL++ left in `fuzz/`. Nothing may panic.

use crate::common;

use common::*;
use frostdb_core::fuzzing::{found_inputs, manifest_target, variants, wal_target};
use frostdb_core::{Db, DbOptions, TableOptions};

fn fuzz_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// A database with a few writes: its WAL segments and its manifest.
fn real_files() -> (Vec<Vec<u8>>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let table = db
            .table("samples", samples_schema(), TableOptions::default())
            .unwrap();
        for i in 0..3 {
            table
                .insert(&batch(vec![
                    ("name", str_n("cpu", 4)),
                    ("timestamp", ints(&[i; 4])),
                    ("value", ints(&[1, 2, 3, i])),
                ]))
                .unwrap();
        }
        table.persist().unwrap();
        table
            .insert(&batch(vec![
                ("name", str_n("cpu", 2)),
                ("timestamp", ints(&[9, 9])),
                ("value", ints(&[7, 8])),
            ]))
            .unwrap();
    }
    let mut segments = Vec::new();
    for e in std::fs::read_dir(dir.path().join("wal")).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        if bytes.len() > 8 {
            segments.push(bytes[8..].to_vec()); // the target adds the magic
        }
    }
    let manifest = std::fs::read(dir.path().join("manifest.json")).unwrap();
    (segments, manifest)
}

#[test]
fn the_wal_and_manifest_targets_never_panic_on_their_corpus() {
    let (segments, manifest) = real_files();
    assert!(!segments.is_empty(), "the WAL holds the unpersisted write");
    let mut runs = 0;
    for segment in &segments {
        for v in variants(segment) {
            wal_target(&v);
            runs += 1;
        }
    }
    for v in found_inputs(&fuzz_dir(), "wal") {
        wal_target(&v);
    }
    for v in variants(&manifest) {
        manifest_target(&v);
        runs += 1;
    }
    for v in found_inputs(&fuzz_dir(), "manifest") {
        manifest_target(&v);
    }
    assert!(runs >= 34, "{runs} inputs");
}
