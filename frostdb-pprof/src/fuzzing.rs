//! The bodies of the fuzz targets (`fuzz/`), shared with the test that replays their corpora,
//! so the same code runs under libFuzzer and in CI.

use frostdb_core::{Db, DbOptions, TableOptions};

use crate::{IngestOptions, Limits, ProfileStore, decode};

/// Small limits, so that inputs cannot make a run slow or big.
pub fn limits() -> Limits {
    Limits {
        max_decompressed_bytes: 8 << 20,
        max_samples: 100_000,
        max_locations: 100_000,
        max_functions: 100_000,
        max_stack_depth: 1024,
    }
}

/// Decodes arbitrary bytes: any outcome but a panic (or a hang) is fine.
pub fn decode_target(data: &[u8]) {
    let _ = decode(data, &limits());
}

/// Decodes and stores arbitrary bytes in an in-memory database, then reads back what was
/// stored: any outcome but a panic is fine, and what is stored must be readable.
pub fn normalize_target(data: &[u8]) {
    let Ok(db) = Db::open_in_memory(DbOptions::default().background_compaction(false)) else {
        return;
    };
    let Ok(store) = ProfileStore::open(db, TableOptions::default(), limits()) else {
        return;
    };
    let options = IngestOptions {
        name: "fuzz".into(),
        labels: vec![("job".into(), "fuzz".into())],
        delta: true,
        timestamp_ms: Some(1),
    };
    if store.ingest(data, &options).is_ok() {
        let symbols = store.symbols();
        let rows = store
            .samples()
            .scan(&frostdb_core::ScanRequest::new().project(["stacktrace_id"]))
            .expect("stored rows read back");
        for b in rows {
            let ids = arrow::array::AsArray::as_fixed_size_binary(b.column(0));
            for id in ids.iter().flatten() {
                let id: crate::Id = id.try_into().expect("16-byte ids");
                assert!(
                    symbols.stacks.contains_key(&id),
                    "a stored sample's stack resolves"
                );
            }
        }
    }
}
