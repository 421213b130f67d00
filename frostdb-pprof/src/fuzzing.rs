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

/// Folded stacks (and "lines") of arbitrary text converted to pprof: what converts must
/// validate, and carry every counted sample.
pub fn folded_target(data: &[u8]) {
    use crate::convert::folded::{Units, to_profile};
    let text = String::from_utf8_lossy(data);
    let units = Units {
        sample: ("cpu".into(), "nanoseconds".into()),
        period: ("cpu".into(), "nanoseconds".into()),
        period_value: 10_000_000,
        scale: 10_000_000,
    };
    for lines in [false, true] {
        if let Ok(profile) = to_profile(&text, lines, &units, 10_000) {
            crate::validate(profile, &limits()).expect("a converted folded profile is valid");
        }
    }
}

/// An OTLP `ExportProfilesServiceRequest` of arbitrary bytes converted to pprof.
pub fn otlp_target(data: &[u8]) {
    use prost::Message;
    if let Ok(request) = crate::convert::otlp::proto::ExportProfilesServiceRequest::decode(data) {
        let _ = crate::convert::otlp::convert(&request, &limits());
    }
}

/// A Pyroscope push request of arbitrary bytes, as protobuf and as JSON, converted to pprof.
pub fn push_target(data: &[u8]) {
    use crate::convert::push::{Encoding, convert, parse};
    for encoding in [Encoding::Protobuf, Encoding::Json] {
        if let Ok(request) = parse(encoding, data) {
            let _ = convert(&request, &limits());
        }
    }
}

/// A label selector of arbitrary text: parsed, and when it parses, its predicate bound on
/// the samples table (regexes compiled, types checked).
pub fn selector_target(data: &[u8]) {
    static SAMPLES: std::sync::OnceLock<frostdb_core::Table> = std::sync::OnceLock::new();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(selector) = frostdb_query::Selector::parse(text) else {
        return;
    };
    let table = SAMPLES.get_or_init(|| {
        let db = Db::open_in_memory(DbOptions::default().background_compaction(false))
            .expect("an in-memory database opens");
        db.table(
            crate::schema::SAMPLES,
            crate::schema::samples(),
            frostdb_core::TableOptions::default(),
        )
        .expect("the samples table is created")
    });
    let snapshot = table.snapshot();
    let schema = snapshot.schema();
    let predicate = selector.to_predicate(&|c| schema.index_of(c).is_some());
    let _ = snapshot.scan(&frostdb_core::ScanRequest::new().filter(predicate));
}
