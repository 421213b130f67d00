//! The bodies of the fuzz targets (`fuzz/`), shared with the test that replays their corpora,
//! so the same code runs under libFuzzer and in CI.

use frostdb_core::{Db, DbOptions};

use crate::bounds::{self, Bounded};
use crate::{IngestOptions, Limits, ProfileStore, RequestLimits, StoreOptions, decode};

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

/// The request limits of the targets: the defaults, with a decoded request of at most
/// 64 MiB (AFL++ runs them within a memory limit, `fuzz/run.sh`).
pub fn request_limits() -> RequestLimits {
    RequestLimits {
        max_decoded_bytes: 64 << 20,
        ..RequestLimits::default()
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
    let options = StoreOptions::default().limits(limits()).query_threads(1);
    let Ok(store) = ProfileStore::open(db, options) else {
        return;
    };
    let options = IngestOptions::default()
        .name("fuzz")
        .labels(vec![("job".into(), "fuzz".into())])
        .delta(true)
        .timestamp_ms(1);
    if let Ok(summary) = store.ingest(data, &options) {
        for t in &summary.profile_types {
            let selector = frostdb_profile::Selector::parse(&format!("{t}{{}}"))
                .expect("a stored profile type is a selector");
            let merged = store
                .merge(&selector, frostdb_profile::TimeRange::ALL)
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
    use crate::convert::folded::to_profile;
    let text = String::from_utf8_lossy(data);
    let units = folded_units();
    for lines in [false, true] {
        let small = Limits {
            max_samples: 10_000,
            ..limits()
        };
        if let Ok(profile) = to_profile(&text, lines, &units, &small) {
            crate::validate(profile, &limits()).expect("a converted folded profile is valid");
        }
    }
}

/// Pyroscope's trie and tree bodies of arbitrary bytes converted to pprof: what converts
/// must validate.
pub fn trie_target(data: &[u8]) {
    use crate::convert::trie::{tree_to_profile, trie_to_profile};
    let units = folded_units();
    for profile in [
        trie_to_profile(data, &units, &limits()),
        tree_to_profile(data, &units, &limits()),
    ]
    .into_iter()
    .flatten()
    {
        crate::validate(profile, &limits()).expect("a converted trie or tree is valid");
    }
}

/// speedscope files of arbitrary bytes converted to pprof: what converts must validate.
pub fn speedscope_target(data: &[u8]) {
    if let Ok(profiles) = crate::convert::speedscope::convert(data, 100, &limits()) {
        for c in profiles {
            crate::validate(c.profile, &limits()).expect("a converted speedscope profile is valid");
        }
    }
}

/// JFR recordings of arbitrary bytes converted to profiles: what converts must validate.
pub fn jfr_target(data: &[u8]) {
    if let Ok(recording) = crate::convert::jfr::convert(data, None, 100, &limits()) {
        for c in recording.profiles {
            crate::validate(c.profile, &limits()).expect("a converted JFR profile is valid");
        }
    }
}

/// Parca Agent's requests of arbitrary bytes: the first byte picks a `WriteRaw` request
/// (protobuf), a `WriteArrow` record (Arrow IPC) or a `Write` stream's two records (their
/// split at the little-endian u32 that follows); what converts must be named.
pub fn parca_target(data: &[u8]) {
    use prost::Message;
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let converted = match kind % 3 {
        0 => match crate::convert::parca::proto::WriteRawRequest::decode(rest) {
            Ok(request) => crate::convert::parca::write_raw(&request, &limits()),
            Err(_) => return,
        },
        1 => crate::convert::parca::write_arrow(rest, &limits()),
        _ => {
            let Some((split, rest)) = rest.split_first_chunk::<4>() else {
                return;
            };
            let split = (u32::from_le_bytes(*split) as usize).min(rest.len());
            let (samples, locations) = rest.split_at(split);
            let _ = crate::convert::parca::write_v1_wanted(samples, &limits());
            crate::convert::parca::write_v1(samples, locations, &limits())
        }
    };
    for incoming in converted.into_iter().flatten() {
        assert!(
            !incoming.name.is_empty(),
            "a converted Parca profile is named"
        );
    }
}

fn folded_units() -> crate::convert::folded::Units {
    crate::convert::folded::Units {
        sample: ("cpu".into(), "nanoseconds".into()),
        period: ("cpu".into(), "nanoseconds".into()),
        period_value: 10_000_000,
        scale: 10_000_000,
    }
}

/// An OTLP `ExportProfilesServiceRequest` of arbitrary bytes converted to pprof (decoded
/// by prost alone, all profiles at once).
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
        if let Ok(request) = parse(encoding, data, &request_limits()) {
            let _ = convert(&request, &limits());
        }
    }
}

/// What scanning a message's protobuf `data` against its shape and decoding it with prost
/// alone must agree on: what prost decodes, the scan passes (or finds over a limit; it
/// refuses groups, which proto3 has not and prost skips); what the scan passes and prost
/// decodes is no larger than the scan said (`size`, the decoded message's bytes by
/// length). The message prost decoded, if it did.
fn agree_protobuf<M: prost::Message + Default + Bounded>(
    data: &[u8],
    size: impl Fn(&M) -> usize,
) -> Option<M> {
    use frostdb_core::ErrorKind;
    let scanned = bounds::check_protobuf("fuzz", M::shape(), data, &request_limits());
    let decoded = M::decode(data).ok();
    match (&scanned, &decoded) {
        (Ok(s), Some(m)) => assert!(
            size(m) <= s.decoded_bytes,
            "decoded {} bytes, the scan said {}",
            size(m),
            s.decoded_bytes
        ),
        (Err(e), Some(_)) => assert!(
            e.kind() == ErrorKind::LimitExceeded || e.to_string().contains("is a group"),
            "the scan refused what prost decodes: {e}"
        ),
        _ => {}
    }
    decoded
}

/// The same of proto3 JSON `data`: what decodes as `M` (`parse`, unbounded), the JSON
/// scan passes or finds over a limit; what it passes and decodes is no larger than it said.
fn agree_json<M>(
    data: &[u8],
    parse: impl Fn(&[u8]) -> Option<M>,
    size: impl Fn(&M) -> usize,
    shape: &'static bounds::Shape,
) {
    use frostdb_core::ErrorKind;
    let scanned = bounds::check_json("fuzz", shape, data, &request_limits());
    match (&scanned, parse(data)) {
        (Ok(s), Some(m)) => assert!(
            size(&m) <= s.decoded_bytes,
            "decoded {} bytes, the JSON scan said {}",
            size(&m),
            s.decoded_bytes
        ),
        (Err(e), Some(_)) => assert_eq!(
            e.kind(),
            ErrorKind::LimitExceeded,
            "the JSON scan refused what decodes: {e}"
        ),
        _ => {}
    }
}

/// A push request's decoded bytes, by the lengths of its vectors and strings.
fn push_size(r: &crate::convert::push::proto::PushRequest) -> usize {
    use std::mem::size_of;

    use crate::convert::push::proto as push;
    let series = r.series.iter().map(|s| {
        let labels = s.labels.iter().map(|l| l.name.len() + l.value.len());
        let samples = s.samples.iter().map(|x| x.raw_profile.len() + x.id.len());
        size_of::<push::RawProfileSeries>()
            + s.labels.len() * size_of::<push::LabelPair>()
            + s.samples.len() * size_of::<push::RawSample>()
            + labels.sum::<usize>()
            + samples.sum::<usize>()
    });
    size_of::<push::PushRequest>() + series.sum::<usize>()
}

/// A Pyroscope push request of arbitrary bytes through the scan that guards its decoding
/// ([`crate::bounds`]), as protobuf and JSON: the scan and decoding agree (see
/// [`agree_protobuf`]), then the request is converted within the limits.
pub fn push_bounds_target(data: &[u8]) {
    use crate::convert::push::{Encoding, convert, parse, proto};
    agree_protobuf::<proto::PushRequest>(data, push_size);
    agree_json(
        data,
        |d| {
            parse(
                Encoding::Json,
                d,
                &RequestLimits {
                    max_decoded_bytes: usize::MAX,
                    max_push_series: usize::MAX,
                    max_labels_per_series: usize::MAX,
                    max_samples_per_series: usize::MAX,
                    ..request_limits()
                },
            )
            .ok()
        },
        push_size,
        proto::PushRequest::shape(),
    );
    for encoding in [Encoding::Protobuf, Encoding::Json] {
        if let Ok(request) = parse(encoding, data, &request_limits()) {
            let _ = convert(&request, &limits());
        }
    }
}

/// An OTLP export of arbitrary bytes through the scan that guards its decoding, then
/// converted one profile at a time within the limits (stack frames included).
pub fn otlp_bounds_target(data: &[u8]) {
    use crate::convert::otlp::{parse, profiles, proto};
    agree_protobuf::<proto::ExportProfilesServiceRequest>(data, |_| 0);
    if let Ok(request) = parse(data, &request_limits())
        && let Ok(converted) = profiles(&request, &limits(), &request_limits())
    {
        for profile in converted {
            let _ = profile;
        }
    }
}

/// The query API's methods whose requests [`querier_target`] decodes, by the input's first
/// byte (modulo their count); settings' last.
pub const QUERIER_METHODS: [&str; 15] = [
    "ProfileTypes",
    "LabelValues",
    "LabelNames",
    "Series",
    "SelectMergeStacktraces",
    "SelectMergeSpanProfile",
    "SelectMergeProfile",
    "SelectSeries",
    "SelectHeatmap",
    "Diff",
    "GetProfileStats",
    "AnalyzeQuery",
    "settings.Get",
    "settings.Set",
    "settings.Delete",
];

/// A query API (or settings) request of arbitrary bytes, decoded as a Connect server
/// decodes it: the method is the first byte ([`QUERIER_METHODS`]), the rest the body, as
/// binary protobuf and as proto3 JSON, scanned within the limits first; the scans and
/// decoding agree (see [`agree_protobuf`]).
pub fn querier_target(data: &[u8]) {
    use crate::api::querier::v1 as querier;
    use crate::api::settings::v1 as settings;
    use crate::api::types::v1 as types;
    fn one<M>(body: &[u8])
    where
        M: prost::Message + Default + serde::de::DeserializeOwned + Bounded,
    {
        agree_protobuf::<M>(body, |_| 0);
        agree_json(
            body,
            |d| serde_json::from_slice::<M>(d).ok(),
            |_| 0,
            M::shape(),
        );
        let _ = bounds::decode_protobuf::<M>("fuzz", body, &request_limits());
        let _ = bounds::decode_json::<M>("fuzz", body, &request_limits());
    }
    let Some((&method, body)) = data.split_first() else {
        return;
    };
    match usize::from(method) % QUERIER_METHODS.len() {
        0 => one::<querier::ProfileTypesRequest>(body),
        1 => one::<types::LabelValuesRequest>(body),
        2 => one::<types::LabelNamesRequest>(body),
        3 => one::<querier::SeriesRequest>(body),
        4 => one::<querier::SelectMergeStacktracesRequest>(body),
        5 => one::<querier::SelectMergeSpanProfileRequest>(body),
        6 => one::<querier::SelectMergeProfileRequest>(body),
        7 => one::<querier::SelectSeriesRequest>(body),
        8 => one::<querier::SelectHeatmapRequest>(body),
        9 => one::<querier::DiffRequest>(body),
        10 => one::<types::GetProfileStatsRequest>(body),
        11 => one::<querier::AnalyzeQueryRequest>(body),
        12 => one::<settings::GetSettingsRequest>(body),
        13 => one::<settings::SetSettingsRequest>(body),
        _ => one::<settings::DeleteSettingsRequest>(body),
    }
}

/// A label selector of arbitrary text: parsed, and when it parses, its predicate bound on
/// the samples table (regexes compiled, types checked).
pub fn selector_target(data: &[u8]) {
    static SAMPLES: std::sync::OnceLock<frostdb_core::Table> = std::sync::OnceLock::new();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(selector) = frostdb_profile::Selector::parse(text) else {
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
