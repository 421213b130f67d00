//! What a store admits: the series limit, counted across reopens; the label limits, each
//! refused by name and value with nothing stored; and a store holding 10,000 label names (as
//! one written before the label limits may) that still opens and answers.

use frostdb_core::{Db, DbOptions, ErrorKind};
use frostdb_pprof::ReadOptions;
use frostdb_pprof::proto::{Label, Profile};
use frostdb_pprof::{Error, IngestOptions, LabelLimits, ProfileStore, StoreOptions, testing};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use prost::Message;

const CPU: &str = "cpu:cpu:nanoseconds:cpu:nanoseconds";
const SAMPLES: usize = 20;

fn options(labels: &[(String, String)]) -> IngestOptions {
    IngestOptions::default()
        .name("cpu")
        .labels(labels.to_vec())
        .timestamp_ms(1_700_000_000_000)
}

fn pairs(labels: &[(&str, &str)]) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The synthetic profile, its samples carrying the pprof string labels `labels`.
fn profile(labels: &[(&str, &str)]) -> Vec<u8> {
    let mut p: Profile = testing::profile(0, SAMPLES, 3);
    let mut string = |s: &str| {
        p.string_table.push(s.to_owned());
        p.string_table.len() as i64 - 1
    };
    let label: Vec<Label> = labels
        .iter()
        .map(|(k, v)| Label {
            key: string(k),
            str: string(v),
            ..Label::default()
        })
        .collect();
    for sample in &mut p.sample {
        sample.label = label.clone();
    }
    p.encode_to_vec()
}

fn pod(i: usize) -> Vec<(String, String)> {
    pairs(&[("pod", &format!("p{i}"))])
}

/// Limit 5: five series stored; after a reopen (from the WAL, then from persisted blocks)
/// the store still holds five, refuses a sixth new one and takes a stored one.
#[test]
fn the_series_limit_counts_the_series_stored_before_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let options = StoreOptions::default().max_series(5);
        ProfileStore::open(Db::open(dir.path(), DbOptions::default()).unwrap(), options).unwrap()
    };
    let bytes = profile(&[]);
    let refused = |store: &ProfileStore, labels: &[(String, String)]| {
        let err = store.ingest(&bytes, &options(labels)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::SeriesLimit {
                    limit: 5,
                    new: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
        assert!(err.to_string().contains("limit of 5 series"), "{err}");
    };
    {
        let store = open();
        for i in 0..5 {
            store.ingest(&bytes, &options(&pod(i))).unwrap();
        }
        assert_eq!(store.series_count(), 5);
        refused(&store, &pod(5));
    }
    for flush in [false, true] {
        let store = open();
        assert_eq!(
            store.series_count(),
            5,
            "counted when opened (flushed: {flush})"
        );
        let rows = store.samples().snapshot().rows();
        refused(&store, &pod(5));
        assert_eq!(
            store.samples().snapshot().rows(),
            rows,
            "nothing of it stored"
        );
        // A stored series is no new series.
        store.ingest(&bytes, &options(&pod(2))).unwrap();
        assert_eq!(store.series_count(), 5);
        assert_eq!(
            store
                .series(
                    &Selector::parse(CPU).unwrap(),
                    TimeRange::ALL,
                    None,
                    ReadOptions::STRICT
                )
                .unwrap()
                .value
                .len(),
            5
        );
        if flush {
            store.db().flush().unwrap();
        }
    }
    // Once persisted, the count comes from blocks alone.
    let store = open();
    assert_eq!(store.series_count(), 5);
    refused(&store, &pod(6));
}

/// Limit 4 label names: a client inventing a label name per push (a request id) is refused
/// at the fifth name, by pprof, with request or sample labels, and by Arrow, naming the
/// limit, with nothing stored; names already held always pass; after a reopen from
/// persisted blocks the names stored count.
#[test]
fn label_names_past_the_limit_are_refused_and_counted_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let options = StoreOptions::default().max_label_names(4);
        ProfileStore::open(Db::open(dir.path(), DbOptions::default()).unwrap(), options).unwrap()
    };
    let refused = |store: &ProfileStore, result: frostdb_pprof::Result<()>, name: &str| {
        let rows = store.samples().snapshot().rows();
        let err = result.unwrap_err();
        assert!(
            matches!(err, Error::LabelNamesLimit { limit: 4, new: 1, ref example } if example == name),
            "{err}"
        );
        assert_eq!(err.kind(), ErrorKind::QuotaExceeded);
        assert!(err.to_string().contains("limit of 4 label names"), "{err}");
        assert_eq!(store.samples().snapshot().rows(), rows, "nothing stored");
    };
    let push = |store: &ProfileStore, request: &[(&str, &str)], sample: &[(&str, &str)]| {
        store
            .ingest(&profile(sample), &options(&pairs(request)))
            .map(|_| ())
    };
    {
        let store = open();
        // pod, a, b
        push(&store, &[("pod", "p0")], &[("a", "1"), ("b", "2")]).unwrap();
        push(&store, &[("pod", "p1"), ("req_1", "x")], &[]).unwrap();
        // A fifth name, as a request label and as a sample label.
        refused(&store, push(&store, &[("req_2", "x")], &[]), "req_2");
        refused(&store, push(&store, &[("pod", "p2")], &[("c", "3")]), "c");
        // Names held pass, in any mix.
        push(&store, &[("a", "9")], &[("pod", "p3"), ("req_1", "y")]).unwrap();
        // The Arrow path counts the same names.
        let p = testing::profile(0, SAMPLES, 3);
        let batch =
            testing::arrow_samples(&p, "cpu", &[("pod", "p4"), ("b", "1")], 1_700_000_000_000);
        store.ingest_arrow(&batch, None).unwrap();
        let batch = testing::arrow_samples(&p, "cpu", &[("job", "j")], 1_700_000_000_000);
        refused(&store, store.ingest_arrow(&batch, None).map(|_| ()), "job");
        store.db().flush().unwrap();
    }
    let store = open();
    refused(&store, push(&store, &[("req_3", "x")], &[]), "req_3");
    push(&store, &[("req_1", "z")], &[]).unwrap();
}

/// Each label limit refuses a profile over it, request labels and pprof labels alike, with
/// an error naming the limit and its value; none of it is stored. Span ids do not count as
/// label names.
#[test]
fn each_label_limit_is_refused_by_name_and_nothing_is_stored() {
    let limits = LabelLimits {
        max_label_names_per_series: 4,
        max_label_name_length: 16,
        max_label_value_length: 16,
    };
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default().label_limits(limits),
    )
    .unwrap();
    let long_name = "n".repeat(17);
    let long_value = "v".repeat(17);
    let three = [("service_name", "api"), ("job", "j"), ("pod", "p")];
    // Request labels, pprof sample labels, and the limit they break.
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            vec![("a", "1"), ("b", "1"), ("c", "1"), ("d", "1"), ("e", "1")],
            vec![],
            "max_label_names_per_series = 4",
        ),
        (
            three.to_vec(),
            vec![("team", "t"), ("route", "r")],
            "max_label_names_per_series = 4",
        ),
        (
            vec![(&long_name, "1")],
            vec![],
            "max_label_name_length = 16",
        ),
        (
            three.to_vec(),
            vec![(&long_name, "1")],
            "max_label_name_length = 16",
        ),
        (
            vec![("pod", &long_value)],
            vec![],
            "max_label_value_length = 16",
        ),
        (
            three.to_vec(),
            vec![("team", &long_value)],
            "max_label_value_length = 16",
        ),
        (
            three.to_vec(),
            vec![("span_id", &long_value)],
            "max_label_value_length = 16",
        ),
    ];
    for (request, sample, limit) in cases {
        let err = store
            .ingest(&profile(&sample), &options(&pairs(&request)))
            .unwrap_err();
        assert!(matches!(err, Error::LabelLimit { .. }), "{err}");
        assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
        assert!(err.to_string().contains(limit), "{limit}: {err}");
        assert_eq!(
            store.samples().snapshot().rows(),
            0,
            "{limit}: nothing stored"
        );
        assert!(
            store
                .label_names(None, TimeRange::ALL, ReadOptions::STRICT)
                .unwrap()
                .value
                .is_empty(),
            "{limit}: no series indexed"
        );
    }
    // At the limits: four names (and a span id, which is not a series label), names of 16
    // bytes, values of 8.
    let name = "n".repeat(16);
    let request = [
        ("service_name", "api"),
        ("job", "j"),
        (name.as_str(), "12345678"),
    ];
    store
        .ingest(
            &profile(&[("team", "t"), ("span_id", "s1")]),
            &options(&pairs(&request)),
        )
        .unwrap();
    assert_eq!(store.samples().snapshot().rows(), SAMPLES);
}

/// A store holding one series of 10,000 label names (written with the label limits
/// lifted, as a store written before them may hold it) and one ordinary series reopens,
/// from its WAL and from persisted blocks, and answers label names, label values, series and
/// merges exactly.
#[test]
fn a_store_of_ten_thousand_label_names_reopens_and_answers() {
    const NAMES: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let open = |label_limits| {
        let options = StoreOptions::default().label_limits(label_limits);
        ProfileStore::open(Db::open(dir.path(), DbOptions::default()).unwrap(), options).unwrap()
    };
    let wide: Vec<(String, String)> = (0..NAMES)
        .map(|i| (format!("l{i:05}"), format!("v{i}")))
        .collect();
    let bytes = profile(&[]);
    {
        let store = open(LabelLimits::unlimited());
        store.ingest(&bytes, &options(&wide)).unwrap();
        store
            .ingest(&bytes, &options(&pairs(&[("service_name", "api")])))
            .unwrap();
    }
    let mut names: Vec<String> = wide.iter().map(|(k, _)| k.clone()).collect();
    names.push("service_name".into());
    names.sort();
    let check = |store: &ProfileStore| {
        assert_eq!(
            store
                .label_names(None, TimeRange::ALL, ReadOptions::STRICT)
                .unwrap()
                .value,
            names
        );
        let all = Selector::parse(CPU).unwrap();
        let series = store
            .series(&all, TimeRange::ALL, None, ReadOptions::STRICT)
            .unwrap()
            .value;
        assert_eq!(series.len(), 2);
        let mut labels: Vec<Vec<(String, String)>> = series.into_iter().map(|s| s.labels).collect();
        labels.sort_by_key(Vec::len);
        assert_eq!(labels[0], pairs(&[("service_name", "api")]));
        assert_eq!(labels[1], wide);
        assert_eq!(
            store
                .label_values("l04242", None, TimeRange::ALL, ReadOptions::STRICT)
                .unwrap()
                .value,
            ["v4242"]
        );
        let one = Selector::parse(&format!("{CPU}{{l09999=\"v9999\"}}")).unwrap();
        assert_eq!(
            store.merge(&one, TimeRange::ALL).unwrap().total(),
            testing::total(0, SAMPLES)
        );
        assert_eq!(
            store.merge(&all, TimeRange::ALL).unwrap().total(),
            2 * testing::total(0, SAMPLES)
        );
    };
    {
        // From the WAL: the wide batch was logged as several IPC streams.
        let store = open(LabelLimits::default());
        check(&store);
        store.db().flush().unwrap();
    }
    // From persisted blocks, with today's limits: what is stored is still answered, and a
    // new series over the limit is refused.
    let store = open(LabelLimits::default());
    check(&store);
    let err = store.ingest(&bytes, &options(&wide[..31])).unwrap_err();
    assert!(
        err.to_string().contains("max_label_names_per_series = 30"),
        "{err}"
    );
}

/// A store written before the series keys existed (a series index, no keys table) builds
/// them from its series index when opened: its series count against the limit, and the
/// keys built are those a profile of the same series makes (it is still accepted).
#[test]
fn a_store_without_series_keys_counts_the_series_of_its_index() {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let index = db
            .table(
                frostdb_pprof::schema::SERIES,
                frostdb_pprof::schema::series(),
                frostdb_core::TableOptions::default(),
            )
            .unwrap();
        // Three series, one of them in two hours.
        let pods = ["p0", "p1", "p2", "p1"];
        let hour = 3_600_000;
        let text = |v: &str| Arc::new(StringArray::from(vec![v; pods.len()])) as ArrayRef;
        let columns = [
            "name",
            "sample_type",
            "sample_unit",
            "period_type",
            "period_unit",
        ];
        let mut fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, false))
            .collect();
        let mut arrays: Vec<ArrayRef> = ["cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"]
            .into_iter()
            .map(text)
            .collect();
        fields.push(Field::new("labels.pod", DataType::Utf8, true));
        arrays.push(Arc::new(StringArray::from(pods.to_vec())));
        fields.push(Field::new("timestamp", DataType::Int64, false));
        arrays.push(Arc::new(Int64Array::from(vec![0, 0, 0, hour])));
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap();
        let mut tx = db.transaction();
        tx.insert(&index, &batch).unwrap();
        tx.commit().unwrap();
        db.flush().unwrap();
    }
    let store = ProfileStore::open(
        Db::open(dir.path(), DbOptions::default()).unwrap(),
        StoreOptions::default().max_series(3),
    )
    .unwrap();
    assert_eq!(store.series_count(), 3);
    let bytes = profile(&[]);
    store.ingest(&bytes, &options(&pod(1))).unwrap();
    let err = store.ingest(&bytes, &options(&pod(3))).unwrap_err();
    assert!(matches!(err, Error::SeriesLimit { limit: 3, .. }), "{err}");
}

/// A sample value beyond ±2^53 is refused, nothing of its profile stored: i64::MIN, stored
/// once, made every report of its profile type overflow (it has no magnitude). Values
/// within it that sum past i64 in a merge make reports that saturate, never overflow.
#[test]
fn extreme_sample_values_are_refused_and_sums_past_i64_saturate_in_reports() {
    use frostdb_pprof::report::{dot, top::TopTable, tree};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let with_values = |value: i64, samples: usize| {
        let mut p: Profile = testing::profile(0, samples, 3);
        for s in &mut p.sample {
            s.value = vec![value];
        }
        p.encode_to_vec()
    };
    let pushed = |name: &str, bytes: Vec<u8>| {
        store.ingest(
            &bytes,
            &IngestOptions::default()
                .name(name)
                .timestamp_ms(1_700_000_000_000),
        )
    };
    for value in [i64::MIN, i64::MAX, (1 << 53) + 1, -(1 << 53) - 1] {
        let e = pushed("cpu", with_values(value, SAMPLES)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("beyond ±2^53"), "{e}");
    }
    let types = store
        .profile_types(TimeRange::ALL, ReadOptions::STRICT)
        .unwrap();
    assert!(types.value.is_empty(), "nothing was stored");
    // 2,048 samples of ±2^53 each: sums of ±2^64, past i64 either way.
    pushed("up", with_values(1 << 53, 2048)).unwrap();
    pushed("down", with_values(-(1 << 53), 2048)).unwrap();
    let merged = |name: &str| {
        let selector = Selector::parse(&format!("{name}:cpu:nanoseconds:cpu:nanoseconds")).unwrap();
        store.merge(&selector, TimeRange::ALL).unwrap()
    };
    let (up, down) = (merged("up"), merged("down"));
    assert!(
        up.total() > 0 && down.total() < 0,
        "{} {}",
        up.total(),
        down.total()
    );
    for m in [&up, &down] {
        assert!(!TopTable::build(m).render().is_empty());
        assert!(dot::render(m, 80).contains("digraph"));
    }
    let diff = tree::diff(&down, &up);
    assert!(!format!("{diff:?}").is_empty());
}

/// Each part of a profile type (the profile's name, a sample or period type or unit) is
/// part of every series key, bounded as a label's value: one longer is refused naming the
/// field and the limit, nothing stored (a 120 MiB sample type was stored, and the rollup
/// copied it whole for each series it keyed).
#[test]
fn the_parts_of_a_profile_type_are_bounded_as_label_values() {
    let limits = LabelLimits {
        max_label_value_length: 16,
        ..LabelLimits::default()
    };
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default().label_limits(limits),
    )
    .unwrap();
    let with_type = |sample_type: &str| {
        let mut p: Profile = testing::profile(0, SAMPLES, 3);
        p.string_table.push(sample_type.to_owned());
        p.sample_type[0].r#type = p.string_table.len() as i64 - 1;
        p.encode_to_vec()
    };
    let err = store
        .ingest(&with_type(&"c".repeat(17)), &options(&[]))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("sample_type.type") && text.contains("max_label_value_length"),
        "{text}"
    );
    let long_name = IngestOptions::default()
        .name("c".repeat(17))
        .timestamp_ms(1_700_000_000_000);
    let text = store
        .ingest(&with_type("cpu"), &long_name)
        .unwrap_err()
        .to_string();
    assert!(text.contains("max_label_value_length"), "{text}");
    assert_eq!(store.samples().stats().rows, 0);
    // Sixteen bytes are within it.
    store
        .ingest(&with_type(&"c".repeat(16)), &options(&[]))
        .unwrap();
    assert!(store.samples().stats().rows > 0);
}

/// A function's or a mapping's strings are a frame's name, bounded as every other format
/// bounds one (65,535 bytes): one longer is refused naming the field; at the bound, stored.
#[test]
fn symbol_strings_are_bounded_as_frame_names() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let with_name = |bytes: usize| {
        let mut p: Profile = testing::profile(0, SAMPLES, 3);
        p.string_table.push("\u{1}".repeat(bytes));
        p.function[0].name = p.string_table.len() as i64 - 1;
        p.encode_to_vec()
    };
    let text = store
        .ingest(&with_name(65_536), &options(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("function.name") && text.contains("65535"),
        "{text}"
    );
    let mut p: Profile = testing::profile(0, SAMPLES, 3);
    p.string_table.push("b".repeat(65_536));
    p.mapping[0].build_id = p.string_table.len() as i64 - 1;
    let text = store
        .ingest(&p.encode_to_vec(), &options(&[]))
        .unwrap_err()
        .to_string();
    assert!(text.contains("mapping.build_id"), "{text}");
    assert_eq!(store.samples().stats().rows, 0);
    store.ingest(&with_name(65_535), &options(&[])).unwrap();
}

/// A sample is a row for each of its types: a profile's samples times its types are
/// bounded by `max_samples` before any row is built (1,900 samples of 65,536 types were
/// 124 million rows, built uncharged before the table refused them).
#[test]
fn samples_times_sample_types_are_bounded() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default().limits(frostdb_pprof::Limits {
            max_samples: 100,
            ..frostdb_pprof::Limits::default()
        }),
    )
    .unwrap();
    let with_types = |types: usize| {
        let mut p: Profile = testing::profile(0, SAMPLES, 3);
        let first = p.sample_type[0];
        p.sample_type = vec![first; types];
        for s in &mut p.sample {
            s.value = vec![1; types];
        }
        p.encode_to_vec()
    };
    let text = store
        .ingest(&with_types(6), &options(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("sample values") && text.contains("100"),
        "{text}"
    );
    assert_eq!(store.samples().stats().rows, 0);
    store.ingest(&with_types(5), &options(&[])).unwrap();
}
