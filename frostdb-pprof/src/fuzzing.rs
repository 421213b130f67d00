//! The bodies of the fuzz targets (`fuzz/`), shared with the test that replays their corpora,
//! so the same code runs under libFuzzer and in CI.

use frostdb_core::{Db, DbOptions};

use crate::{IngestOptions, Limits, ProfileStore, StoreOptions, decode};

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
    let options = StoreOptions {
        limits: limits(),
        query_threads: 1,
        ..StoreOptions::default()
    };
    let Ok(store) = ProfileStore::open(db, options) else {
        return;
    };
    let options = IngestOptions {
        name: "fuzz".into(),
        labels: vec![("job".into(), "fuzz".into())],
        delta: true,
        timestamp_ms: Some(1),
    };
    if let Ok(summary) = store.ingest(data, &options) {
        for t in &summary.profile_types {
            let selector = frostdb_query::Selector::parse(&format!("{t}{{}}"))
                .expect("a stored profile type is a selector");
            let merged = store
                .merge(&selector, frostdb_query::profile::TimeRange::ALL)
                .expect("stored rows merge");
            for (stack, _) in &merged.samples {
                assert!(
                    merged.symbols.depth(*stack) > 0 || merged.symbols.frames(*stack).is_empty(),
                    "a stored sample's stack resolves"
                );
                assert!(
                    merged.symbols.has_stack(*stack),
                    "a stored sample's stack resolves"
                );
            }
        }
    }
}
