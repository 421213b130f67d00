//! Storing profiles: one profile type per sample type, labels from the series and pprof,
//! deltas of cumulative profiles, symbols and samples surviving a reopen.

use crate::common;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::ReadOptions;
use frostdb_pprof::report::{pprof, top::TopTable};
use frostdb_pprof::{Error, IngestOptions, Limits, ProfileStore, StoreOptions, decode};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

/// The first profile of a cumulative series stores nothing (it is the baseline of the
/// next), but names a series: its labels are checked, and the series whose previous values
/// are kept are bounded (4 per series the store may hold). Before, a client inventing
/// series had each first profile's values kept in memory, checked and counted by nothing.
#[test]
fn baselines_of_cumulative_series_are_checked_and_bounded() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default().max_series(1)).unwrap();
    let mut allocs = frostdb_pprof::testing::profile(0, 50, 3);
    allocs.string_table[1] = "alloc_space".into();
    allocs.string_table[2] = "bytes".into();
    let allocs = frostdb_pprof::validate(allocs, &Limits::default()).unwrap();
    let push = |run: usize| {
        let mut opts = options("memory", &[("run", &run.to_string())]);
        opts.delta = true;
        store.ingest_profile(&allocs, &opts)
    };
    for run in 0..4 {
        let summary = push(run).unwrap();
        assert_eq!(summary.rows, 0, "a baseline stores nothing");
    }
    let e = push(4).unwrap_err();
    assert_eq!(e.kind(), frostdb_core::ErrorKind::QuotaExceeded, "{e}");
    assert!(e.to_string().contains("cumulative series"), "{e}");
    // A baseline's labels are checked as a stored profile's are.
    let mut opts = options("memory", &[("run", &"x".repeat(3_000))]);
    opts.delta = true;
    let e = store.ingest_profile(&allocs, &opts).unwrap_err();
    assert!(e.to_string().contains("max_label_value_length"), "{e}");
    // The series known go on: their next profiles store their deltas.
    assert!(push(0).is_ok());
}

fn file(name: &str) -> Vec<u8> {
    std::fs::read(common::shared().join("testdata/pprof").join(name)).unwrap()
}

fn options(name: &str, labels: &[(&str, &str)]) -> IngestOptions {
    IngestOptions::default().name(name).labels(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_heap_profile_is_four_profile_types_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let heap = file("goapp__go119-heap.pb.gz");
    let before = {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        let summary = store
            .ingest(&heap, &options("memory", &[("job", "goapp")]))
            .unwrap();
        assert_eq!(
            summary.profile_types,
            [
                "memory:alloc_objects:count:space:bytes",
                "memory:alloc_space:bytes:space:bytes",
                "memory:inuse_objects:count:space:bytes",
                "memory:inuse_space:bytes:space:bytes",
            ]
        );
        let selector =
            Selector::parse("memory:inuse_space:bytes:space:bytes{job=\"goapp\"}").unwrap();
        let merged = store.merge(&selector, TimeRange::ALL).unwrap();
        store.db().flush().unwrap(); // half persisted...
        store
            .ingest(&heap, &options("memory", &[("job", "other")]))
            .unwrap(); // ...half in the WAL
        TopTable::build(&merged).render()
    };
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let selector = Selector::parse("memory:inuse_space:bytes:space:bytes{job=\"goapp\"}").unwrap();
    let merged = store.merge(&selector, TimeRange::ALL).unwrap();
    assert_eq!(TopTable::build(&merged).render(), before);
    // Both series, one from blocks and one from the WAL, merge to twice the profile.
    let all = Selector::parse("memory:inuse_space:bytes:space:bytes").unwrap();
    let both = store.merge(&all, TimeRange::ALL).unwrap();
    assert_eq!(both.total(), 2 * merged.total());
    // Nothing in the store is unresolvable.
    pprof::to_profile(&both).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cumulative_profiles_become_deltas() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let series = [
        "parca__go-heap-series-1644509272337470000.pb.gz",
        "parca__go-heap-series-1644509275338070000.pb.gz",
        "parca__go-heap-series-1644509278338696000.pb.gz",
        "parca__go-heap-series-1644509281339135000.pb.gz",
        "parca__go-heap-series-1644509284338649000.pb.gz",
    ];
    let mut opts = options("memory", &[("instance", "a")]);
    opts.delta = true;
    let mut totals = Vec::new();
    for name in series {
        let bytes = file(name);
        let p = decode(&bytes, &Limits::default()).unwrap();
        let alloc_space = p
            .sample_type
            .iter()
            .position(|t| p.string_table[t.r#type as usize] == "alloc_space")
            .unwrap();
        totals.push(p.sample.iter().map(|s| s.value[alloc_space]).sum::<i64>());
        store.ingest(&bytes, &opts).unwrap();
    }
    let ctx = store.session().unwrap();
    let alloc = Selector::parse("memory:alloc_space:bytes:space:bytes{instance=\"a\"}").unwrap();
    let merged = store.merge(&alloc, TimeRange::ALL).unwrap();
    // The first profile is the baseline; the deltas add up to the growth since (no resets
    // in this series: counters only grow).
    assert!(totals.windows(2).all(|w| w[1] >= w[0]), "{totals:?}");
    assert_eq!(merged.total(), totals[4] - totals[0]);
    // In-use memory is a gauge: every profile is kept as it is.
    let inuse = Selector::parse("memory:inuse_space:bytes:space:bytes{instance=\"a\"}").unwrap();
    let timestamps = frostdb_profile::plans::timestamps(&ctx, "samples", &inuse, TimeRange::ALL)
        .await
        .unwrap();
    let n: usize = futures::TryStreamExt::try_collect::<Vec<_>>(timestamps)
        .await
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(n, 5);
}

/// Stores `base` as a cumulative alloc_space profile of series `instance="a"`, at
/// `at` ms past a fixed time, each sample's value times `scale` of its index.
fn push_cumulative(
    store: &ProfileStore,
    base: &frostdb_pprof::proto::Profile,
    scale: &dyn Fn(usize) -> i64,
    at: i64,
) -> frostdb_pprof::IngestSummary {
    use prost::Message;
    let mut p = base.clone();
    p.string_table
        .extend(["alloc_space".to_owned(), "bytes".to_owned()]);
    let n = p.string_table.len() as i64;
    p.sample_type[0].r#type = n - 2;
    p.sample_type[0].unit = n - 1;
    for (i, s) in p.sample.iter_mut().enumerate() {
        s.value[0] *= scale(i);
    }
    let mut opts = options("memory", &[("instance", "a")]).timestamp_ms(1_700_000_000_000 + at);
    opts.delta = true;
    store.ingest(&p.encode_to_vec(), &opts).unwrap()
}

/// A cumulative profile pushed again (a retry arriving late) is not stored, and is not
/// taken as the series' baseline either: the next profile is the difference from the last
/// one stored. Before, the retry became the baseline and the growth between it and the
/// last stored profile was counted twice, silently.
#[test]
fn a_late_retry_of_a_cumulative_profile_is_not_the_next_ones_baseline() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    // A cumulative profile (alloc_space) of `scale` times the synthetic one's values.
    let base = frostdb_pprof::testing::profile(0, 20, 3);
    let total: i64 = base.sample.iter().map(|s| s.value[0]).sum();
    let push = |scale: i64, at: i64| push_cumulative(&store, &base, &|_| scale, at);
    push(1, 0); // the baseline, stored as nothing
    push(2, 10_000);
    push(4, 20_000);
    // The second again, a retry: older than the last stored, it stores nothing.
    let retried = push(2, 10_000);
    assert_eq!(retried.rows, 0, "{retried:?}");
    push(8, 30_000);
    let alloc =
        Selector::parse("memory:alloc_space:bytes:cpu:nanoseconds{instance=\"a\"}").unwrap();
    let merged = store.merge(&alloc, TimeRange::ALL).unwrap();
    // (2 - 1) + (4 - 2) + (8 - 4); before, the last was 8 - 2.
    assert_eq!(merged.total(), 7 * total);
    // Not after the last stored: the first again (which stored nothing, so is no
    // duplicate), and one never stored before, both late. What they counted is in the
    // differences stored since: they store nothing, and are no baseline. Before, each was
    // stored whole as a reset, and the next profile counted its interval again.
    push(1, 0);
    push(3, 15_000);
    push(16, 40_000);
    let merged = store.merge(&alloc, TimeRange::ALL).unwrap();
    assert_eq!(merged.total(), 15 * total, "(16 - 8) more");
}

/// A cumulative profile with any stack below its series' previous value is a restarted
/// process's: every stack counts from 0, the grown ones too. Before, a stack that had
/// grown past its old total in the new process was stored as the difference.
#[test]
fn a_reset_counts_the_whole_profile_from_zero() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let base = frostdb_pprof::testing::profile(0, 20, 3);
    let values: Vec<i64> = base.sample.iter().map(|s| s.value[0]).collect();
    let push = |scale: &dyn Fn(usize) -> i64, at: i64| push_cumulative(&store, &base, scale, at);
    push(&|_| 1, 0);
    push(&|_| 16, 10_000);
    // Restarted: stack 0 has grown past 16 since, the others are at 1.
    push(&|i| if i == 0 { 100 } else { 1 }, 20_000);
    let alloc =
        Selector::parse("memory:alloc_space:bytes:cpu:nanoseconds{instance=\"a\"}").unwrap();
    let merged = store.merge(&alloc, TimeRange::ALL).unwrap();
    let total: i64 = values.iter().sum();
    assert_eq!(
        merged.total(),
        15 * total + 100 * values[0] + (total - values[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pprof_labels_become_labels_and_collisions_are_errors() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    store
        .ingest(&cpu, &options("process_cpu", &[("job", "goapp")]))
        .unwrap();
    let ctx = store.session().unwrap();
    let values =
        frostdb_profile::plans::label_values(&ctx, "samples", "team", None, TimeRange::ALL)
            .await
            .unwrap();
    let teams: Vec<String> = futures::TryStreamExt::try_collect::<Vec<_>>(values)
        .await
        .unwrap()
        .iter()
        .flat_map(|b| {
            (0..b.num_rows())
                .map(|i| arrow::util::display::array_value_to_string(b.column(0), i).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !teams.is_empty(),
        "pprof.Do labels are stored as labels.team"
    );

    let before = store.samples().stats().rows;
    let err = store
        .ingest(
            &cpu,
            &options("process_cpu", &[("team", "not-in-the-profile")]),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::LabelCollision { ref label, .. } if label == "team"),
        "{err}"
    );
    assert_eq!(
        store.samples().stats().rows,
        before,
        "nothing stored from the rejected profile"
    );
}

/// The distinct label sets stored, by the series query.
async fn stored_series(store: &ProfileStore) -> usize {
    use futures::TryStreamExt;
    let ctx = store.session().unwrap();
    let batches: Vec<_> = frostdb_profile::plans::series(&ctx, "samples", None, TimeRange::ALL)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    batches.iter().map(|b| b.num_rows()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pprof_sample_labels_count_against_the_series_limit() {
    // A Go CPU profile whose samples carry pprof labels (foo, function, profile_id): one
    // request creates several series. Learn how many from an unlimited store.
    let labelled = file("pyroscope__go-cpu-labels.pb.gz");
    let request = options("process_cpu", &[("service_name", "api")]);
    let unlimited = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    unlimited.ingest(&labelled, &request).unwrap();
    let series = stored_series(&unlimited).await;
    // Two sample types of one profile are two profile types, each with every label set.
    assert!(series >= 4, "{series} series");
    let label_sets = series / 2;

    let limited = |max_series| {
        ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default().max_series(max_series),
        )
        .unwrap()
    };
    // One short: refused whole, nothing stored.
    let store = limited(label_sets - 1);
    let err = store.ingest(&labelled, &request).unwrap_err();
    assert!(matches!(err, Error::SeriesLimit { .. }), "{err}");
    assert_eq!(err.kind(), frostdb_core::ErrorKind::QuotaExceeded);
    assert!(
        err.to_string()
            .contains(&format!("would add {label_sets} new series")),
        "{err}"
    );
    assert_eq!(
        store.samples().snapshot().rows(),
        0,
        "nothing of it is stored"
    );
    // Exactly enough: stored; the same series again pass; a new service does not fit.
    let store = limited(label_sets);
    store.ingest(&labelled, &request).unwrap();
    assert_eq!(store.series_count(), label_sets);
    store.ingest(&labelled, &request).unwrap();
    let other = options("process_cpu", &[("service_name", "web")]);
    assert!(matches!(
        store.ingest(&labelled, &other),
        Err(Error::SeriesLimit { .. })
    ));
    assert_eq!(stored_series(&store).await, series);
}

/// Span ids are not series labels: a span per request does not make a series per request
/// (a store limited to one series takes 20 spans), the merge adds every span up, and the
/// spans are still there to select, before and after a reopen; label values do not list them.
#[test]
fn span_and_trace_ids_are_kept_per_sample_not_as_series() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let options = StoreOptions::default().max_series(1);
        ProfileStore::open(db, options).unwrap()
    };
    use frostdb_pprof::testing;
    use prost::Message;
    let (samples, spans) = (200usize, 20usize);
    let mut profile = testing::profile(0, samples, 3);
    testing::label_spans(&mut profile, spans);
    let selector =
        Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"api\"}")
            .unwrap();
    let check = |store: &ProfileStore| {
        let all = store.merge(&selector, TimeRange::ALL).unwrap();
        assert_eq!(all.total(), testing::total(0, samples));
        let some = store
            .merge_spans(&selector, TimeRange::ALL, &["s3", "s17"])
            .unwrap();
        assert_eq!(
            some.total(),
            testing::span_total(0, samples, spans, &[3, 17])
        );
        let none = store
            .merge_spans(&selector, TimeRange::ALL, &["s99"])
            .unwrap();
        assert_eq!(none.total(), 0);
        for label in ["span_id", "trace_id"] {
            let values = store
                .label_values(label, None, TimeRange::ALL, ReadOptions::STRICT)
                .unwrap()
                .value;
            assert!(values.is_empty(), "{label}: {values:?}");
        }
        // A span matcher that accepts samples without a span is refused: the spans table,
        // which span matchers read, holds only the samples with one.
        for matcher in [r#"span_id!="s3""#, r#"span_id="""#, r#"trace_id=~".*""#] {
            let wide = Selector::parse(&format!(
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds{{{matcher}}}"
            ))
            .unwrap();
            let e = store.merge(&wide, TimeRange::ALL).unwrap_err().to_string();
            assert!(e.contains("also selects samples without"), "{matcher}: {e}");
        }
        // Series, times and labels are read where no span is kept: a span matcher there
        // is refused, not answered with nothing.
        let spanned = Selector::parse(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"api\",span_id=\"s3\"}",
        )
        .unwrap();
        let refused = |r: Result<(), Error>| {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("span labels are kept on samples"), "{e}");
        };
        refused(
            store
                .range(&spanned, TimeRange::ALL, 1000, None, ReadOptions::STRICT)
                .map(drop),
        );
        refused(
            store
                .timestamps(&spanned, TimeRange::ALL, ReadOptions::STRICT)
                .map(drop),
        );
        refused(
            store
                .series(&spanned, TimeRange::ALL, None, ReadOptions::STRICT)
                .map(drop),
        );
        refused(
            store
                .label_names(Some(&spanned), TimeRange::ALL, ReadOptions::STRICT)
                .map(drop),
        );
    };
    {
        let store = open();
        store
            .ingest(
                &profile.encode_to_vec(),
                &options("process_cpu", &[("service_name", "api")]),
            )
            .unwrap();
        assert_eq!(store.series_count(), 1);
        // Every span adds up in the series' samples: one row per stack, not per span.
        assert_eq!(store.samples().snapshot().rows(), samples);
        check(&store);
    }
    check(&open());
}

/// Label names and values as a scan of the sample rows finds them.
fn from_samples(
    store: &ProfileStore,
    selector: Option<&Selector>,
    range: TimeRange,
) -> (Vec<String>, Vec<String>) {
    use frostdb_profile::native;
    let snapshot = store.samples().snapshot();
    (
        native::label_names(&snapshot, selector, range).unwrap(),
        native::label_values(&snapshot, "pod", selector, range).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_names_and_values_come_from_the_series_index() {
    const HOUR: i64 = 3_600_000;
    let h0 = 1_717_372_800_000; // a whole hour
    let dir = tempfile::tempdir().unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    let heap = file("goapp__go119-heap.pb.gz");
    let check = |store: &ProfileStore, what: &str| {
        let selectors = [
            None,
            Some(Selector::parse("{ns=\"n1\"}").unwrap()),
            Some(Selector::parse("{pod=~\"p[12]\", zone!=\"\"}").unwrap()),
            Some(Selector::parse("memory:inuse_space:bytes:space:bytes{}").unwrap()),
        ];
        let ranges = [
            TimeRange::ALL,
            TimeRange {
                start_ms: h0,
                end_ms: h0 + HOUR,
            },
            TimeRange {
                start_ms: h0 + HOUR,
                end_ms: h0 + 3 * HOUR,
            },
            TimeRange {
                start_ms: h0 + 2 * HOUR,
                end_ms: i64::MAX,
            },
            TimeRange {
                start_ms: h0 + 9 * HOUR,
                end_ms: i64::MAX,
            },
        ];
        // Merges narrowed by the series index answer as a plain scan of the samples.
        let cpu = "cpu:cpu:nanoseconds:cpu:nanoseconds";
        let pool = frostdb_query::memory_pool(None);
        let mut merged = 0;
        for matchers in [
            "{pod=\"p1\"}",
            "{pod=~\"p[12]\", zone!=\"\"}",
            "{zone=\"\"}",
            "{ns!=\"n0\", pod=~\"p.*\"}",
            "{pod=\"nope\"}",
            // Between stored pods: statistics cannot rule it out, the index does.
            "{pod=\"p1x\"}",
        ] {
            let selector = Selector::parse(&format!("{cpu}{matchers}")).unwrap();
            for range in ranges {
                let got = store.merge(&selector, range).unwrap();
                let want = frostdb_profile::native::merge_stacks(
                    &store.samples().snapshot(),
                    &selector,
                    range,
                    1,
                    false,
                    &pool,
                    None,
                )
                .unwrap();
                if matchers.contains("nope") || matchers.contains("p1x") {
                    // No series has this pod: the index says so, and no sample is read.
                    let read = (got.metrics.blocks, got.metrics.rows_read, got.rows);
                    assert_eq!(read, (0, 0, 0), "{what}: {range:?}");
                }
                let got: Vec<(u64, i64)> = got.samples.iter().map(|(s, v)| (s.0, *v)).collect();
                assert_eq!(got, want.stacks, "{what}: {selector:?} over {range:?}");
                merged += usize::from(!got.is_empty());
            }
        }
        assert!(merged > 10, "{what}: only {merged} non-empty merges");
        let mut answered = 0;
        for range in ranges {
            let want =
                frostdb_profile::native::profile_types(&store.samples().snapshot(), range).unwrap();
            assert_eq!(
                store
                    .profile_types(range, ReadOptions::STRICT)
                    .unwrap()
                    .value,
                want,
                "{what}: {range:?}"
            );
        }
        for selector in &selectors {
            for range in ranges {
                let want = from_samples(store, selector.as_ref(), range);
                let got = (
                    store
                        .label_names(selector.as_ref(), range, ReadOptions::STRICT)
                        .unwrap()
                        .value,
                    store
                        .label_values("pod", selector.as_ref(), range, ReadOptions::STRICT)
                        .unwrap()
                        .value,
                );
                assert_eq!(got, want, "{what}: {selector:?} over {range:?}");
                answered += usize::from(!got.1.is_empty());
            }
        }
        assert!(answered > 10, "{what}: only {answered} non-empty answers");
    };
    let index_rows = {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        // Nine scrapes 20 minutes apart: three hours; pods, namespaces and a zone on some.
        for i in 0..9i64 {
            let (pod, ns) = (format!("p{}", i % 4), format!("n{}", i % 3));
            let mut labels = vec![("pod", pod.as_str()), ("ns", ns.as_str())];
            if i % 4 == 1 {
                labels.push(("zone", "z1"));
            }
            for (name, bytes) in [("cpu", &cpu), ("memory", &heap)] {
                let mut o = options(name, &labels);
                o.timestamp_ms = Some(h0 + i * 20 * 60_000);
                store.ingest(bytes, &o).unwrap();
            }
        }
        check(&store, "as written");
        let index = store.db().get_table("series").unwrap();
        let (index_rows, sample_rows) =
            (index.snapshot().rows(), store.samples().snapshot().rows());
        // One row per series (sample labels included), profile type and hour, not per
        // sample.
        assert!(
            index_rows * 20 < sample_rows,
            "{index_rows} of {sample_rows}"
        );
        // A store written before the index: its rows persisted, then deleted.
        store.db().flush().unwrap();
        assert!(!index.delete_blocks(|_| true).unwrap().is_empty());
        assert_eq!(index.snapshot().rows(), 0);
        index_rows
    };
    // Opening it builds the index from the sample rows: the same rows, each once.
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let rebuilt = store.db().get_table("series").unwrap().snapshot().rows();
    assert_eq!(rebuilt, index_rows);

    check(&store, "rebuilt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_over_the_memory_limit_fail_naming_it() {
    let open = |limit: Option<usize>| {
        let db = Db::open_in_memory(DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default().query_memory(limit)).unwrap();
        store
            .ingest(
                &file("goapp__go119-cpu-2s.pb.gz"),
                &options("cpu", &[("job", "a")]),
            )
            .unwrap();
        store
    };
    let cpu = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let unlimited = open(None).merge(&cpu, TimeRange::ALL).unwrap();
    assert!(unlimited.total() > 0);

    // 256 bytes: the sums of the merge (8 bytes per stack of the partition) do not fit.
    let store = open(Some(256));
    let err = store.merge(&cpu, TimeRange::ALL).unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    assert!(
        err.to_string().contains("query memory limit of 256 bytes"),
        "{err}"
    );
    // What was reserved is given back (SQL shares the pool), and a merge that selects
    // nothing still answers.
    let ctx = store.session().unwrap();
    assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
    let none = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{job=\"b\"}").unwrap();
    assert_eq!(store.merge(&none, TimeRange::ALL).unwrap().total(), 0);
    // An aggregation in SQL fails too: at the limit, or (with nowhere to spill, the
    // default) where it would have spilled.
    let sql = "SELECT stacktrace_id, sum(value) FROM samples GROUP BY stacktrace_id";
    let err = match ctx.sql(sql).await.unwrap().collect().await {
        Ok(batches) => panic!("{} batches under a 256-byte limit", batches.len()),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("query memory limit of 256 bytes") || err.contains("DiskManager is disabled"),
        "{err}"
    );
    // A limit the merge fits in answers as without one.
    let roomy = open(Some(64 << 20)).merge(&cpu, TimeRange::ALL).unwrap();
    assert_eq!(roomy.samples, unlimited.samples);
}

/// A range's series are charged their labels as each is found, not only their points: 20
/// profiles of a 2,000-byte label (4 series each, by their samples' labels), one point
/// each, are about 170 KB, past a 64 KiB limit (at 64 bytes a series and a point they were
/// charged under 11 KB, and the labels held
/// uncharged: a tenant's 10,000 series of 30 labels of 2 KiB each made gigabytes a GET).
#[test]
fn a_ranges_series_are_charged_their_labels() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store =
        ProfileStore::open(db, StoreOptions::default().query_memory(Some(64 << 10))).unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    let push = |i: usize| {
        let value = format!("{i:03}{}", "x".repeat(1_997));
        store
            .ingest(
                &cpu,
                &options("cpu", &[("job", &value)])
                    .timestamp_ms(1_700_000_000_000 + i as i64 * 1_000),
            )
            .unwrap();
    };
    for i in 0..5 {
        push(i);
    }
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let hour = 3_600_000;
    let series = store
        .range(&selector, TimeRange::ALL, hour, None, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert_eq!(
        series.len(),
        20,
        "4 series a profile, by its samples' labels"
    );
    for i in 5..20 {
        push(i);
    }
    let err = store
        .range(&selector, TimeRange::ALL, hour, None, ReadOptions::STRICT)
        .unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("query memory limit"), "{err}");
}

/// A range is a point per series and step: over many profiles with a short step, the points
/// are reserved from the query memory pool as they are made, and past its limit the range
/// fails naming it; a step the points fit in answers.
#[test]
fn a_range_of_more_points_than_the_memory_limit_fails_naming_it() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default().query_memory(Some(4096))).unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    for i in 0..100 {
        store
            .ingest(
                &cpu,
                &options("cpu", &[("job", "a")]).timestamp_ms(1_700_000_000_000 + i * 1_000),
            )
            .unwrap();
    }
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    // A point a second for each label set of the profile: 100 points each, 6 KiB or more.
    let err = store
        .range(&selector, TimeRange::ALL, 1_000, None, ReadOptions::STRICT)
        .unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    assert!(
        err.to_string().contains("query memory limit of 4096 bytes"),
        "{err}"
    );
    // A point an hour: one each.
    let series = store
        .range(
            &selector,
            TimeRange::ALL,
            3_600_000,
            None,
            ReadOptions::STRICT,
        )
        .unwrap()
        .value;
    assert!(!series.is_empty());
    assert!(series.iter().all(|s| s.points.len() == 1), "{series:?}");
    // The times of the stored profiles, a time each: charged as ranges are.
    let err = store
        .timestamps(&selector, TimeRange::ALL, ReadOptions::STRICT)
        .unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("query memory limit"), "{err}");
    let ten = TimeRange {
        start_ms: 1_700_000_000_000,
        end_ms: 1_700_000_010_000,
    };
    let times = store
        .timestamps(&selector, ten, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert_eq!(times.len(), 10, "{times:?}");
}

/// A listing of series reserves each series it keeps from the query memory: 200 series of
/// a 2,000-byte label are refused under 64 KiB, naming the limit, and listed under 4 MiB,
/// each once however many of its rows were read. Before, a listing of 10,000 series of 30
/// long labels copied 600 MB charged to nothing.
#[test]
fn a_listing_of_series_is_charged_to_the_query_memory() {
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    let open = |limit: usize| {
        let db = Db::open_in_memory(DbOptions::default()).unwrap();
        let store =
            ProfileStore::open(db, StoreOptions::default().query_memory(Some(limit))).unwrap();
        for i in 0..200 {
            for t in 0..2 {
                let pod = format!("{i:0>2000}");
                store
                    .ingest(
                        &cpu,
                        &options("cpu", &[("pod", pod.as_str())])
                            .timestamp_ms(1_700_000_000_000 + t * 1_000),
                    )
                    .unwrap();
            }
        }
        store
    };
    let all = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let err = open(64 << 10)
        .series(&all, TimeRange::ALL, None, ReadOptions::STRICT)
        .unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("query memory limit"), "{err}");
    let listed = open(4 << 20)
        .series(&all, TimeRange::ALL, None, ReadOptions::STRICT)
        .unwrap()
        .value;
    let pods: std::collections::BTreeSet<&str> = listed
        .iter()
        .flat_map(|s| s.labels.iter())
        .filter(|(k, _)| k == "pod")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(pods.len(), 200);
}

/// A merge that keeps series apart (a labelled export, a gauge's average) charges each
/// series' labels to the query memory as it reads them: 200 series of a 2,000-byte label
/// and one stack each are refused under 256 KiB, naming the limit, and merged under 4 MiB.
/// Before, only the sums were charged (a few KiB here): ten thousand series of long labels
/// held gigabytes of label copies no reservation saw.
#[test]
fn a_merge_of_series_apart_charges_their_labels_to_the_query_memory() {
    use frostdb_pprof::{Aggregation, MergeOptions};
    let open = |limit: usize| {
        let db = Db::open_in_memory(DbOptions::default()).unwrap();
        let store =
            ProfileStore::open(db, StoreOptions::default().query_memory(Some(limit))).unwrap();
        let one = prost::Message::encode_to_vec(&frostdb_pprof::testing::profile(0, 1, 1));
        for i in 0..200 {
            let pod = format!("{i:0>2000}");
            store
                .ingest(&one, &options("memory", &[("pod", pod.as_str())]))
                .unwrap();
        }
        store
    };
    let all = Selector::parse("memory:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let apart = MergeOptions {
        aggregation: Aggregation::Sum,
        by_series: true,
        lenient: false,
    };
    let err = open(256 << 10)
        .merge_with(&all, TimeRange::ALL, &apart)
        .unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("query memory limit"), "{err}");
    let merged = open(4 << 20)
        .merge_with(&all, TimeRange::ALL, &apart)
        .unwrap();
    assert_eq!(merged.series.len(), 200);
}

/// Range queries read the profile totals (a row per profile, type and label set) and answer
/// as the sample rows do, pprof sample labels included; a store whose totals are gone
/// rebuilds them from its samples when opened.
#[test]
fn ranges_read_profile_totals_and_answer_as_samples_do() {
    use frostdb_profile::native::range;
    let dir = tempfile::tempdir().unwrap();
    let selectors = [
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds{}",
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds{pod=\"p1\"}",
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds{handler=\"h0\"}",
    ];
    let ranges = [
        TimeRange::ALL,
        TimeRange {
            start_ms: 1_700_000_030_000,
            end_ms: 1_700_000_090_000,
        },
    ];
    let check = |store: &ProfileStore| {
        let mut points = 0;
        for s in selectors {
            let selector = Selector::parse(s).unwrap();
            for r in ranges {
                for (step, group_by) in [
                    (10_000, None),
                    (60_000, Some(vec!["handler".to_owned()])),
                    (1_000_000, Some(vec![])),
                ] {
                    let totals = store
                        .range(&selector, r, step, group_by.as_deref(), ReadOptions::STRICT)
                        .unwrap()
                        .value;
                    let samples = range(
                        &store.samples().snapshot(),
                        &selector,
                        r,
                        step,
                        group_by.as_deref(),
                    )
                    .unwrap();
                    // The same sums; rows differ (a row per profile, against a row per
                    // sample), a count per point.
                    let sums = |series: &[frostdb_profile::native::Series]| {
                        series
                            .iter()
                            .map(|s| {
                                assert_eq!(s.rows.len(), s.points.len());
                                (s.labels.clone(), s.points.clone())
                            })
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        sums(&totals),
                        sums(&samples),
                        "{s} {r:?} step {step} by {group_by:?}"
                    );
                    assert!(totals.iter().flat_map(|s| &s.rows).all(|n| *n >= 1));
                    points += totals.iter().map(|s| s.points.len()).sum::<usize>();
                }
            }
        }
        assert!(points > 0);
    };
    {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        for i in 0..12u64 {
            let mut p = frostdb_pprof::testing::profile(i * 5, 20, 3);
            // Half the samples under handler h0, half under h1: two label sets a profile.
            let key = p.string_table.len() as i64;
            p.string_table
                .extend(["handler".to_owned(), "h0".to_owned(), "h1".to_owned()]);
            for (j, sample) in p.sample.iter_mut().enumerate() {
                sample.label = vec![frostdb_pprof::proto::Label {
                    key,
                    str: key + 1 + (j % 2) as i64,
                    ..Default::default()
                }];
            }
            let profile = frostdb_pprof::validate(p, &Limits::default()).unwrap();
            let options = IngestOptions::default()
                .name("process_cpu")
                .labels(vec![("pod".into(), format!("p{}", i % 3))])
                .timestamp_ms(1_700_000_000_000 + i as i64 * 10_000);
            store.ingest_profile(&profile, &options).unwrap();
        }
        check(&store);
        let totals = store.db().get_table("totals").unwrap();
        // A row per profile and handler, not per sample.
        assert_eq!(totals.snapshot().rows(), 24);
        store.db().flush().unwrap();
        assert!(!totals.delete_blocks(|_| true).unwrap().is_empty());
        assert_eq!(totals.snapshot().rows(), 0);
    }
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    assert_eq!(
        store.db().get_table("totals").unwrap().snapshot().rows(),
        24
    );
    check(&store);
}

/// Stores a CPU profile for pods p1 and p2, each with containers app and sidecar; returns
/// the profile.
fn ingest_pods_and_containers(store: &ProfileStore) -> Vec<u8> {
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    for pod in ["p1", "p2"] {
        for container in ["app", "sidecar"] {
            let labels = [("pod", pod), ("container", container)];
            store
                .ingest(&cpu, &options("process_cpu", &labels))
                .unwrap();
        }
    }
    cpu
}

/// The pods a sorted scan of the samples of one type meets, in order, one entry per run.
fn pod_runs(store: &ProfileStore) -> Vec<String> {
    use arrow::array::AsArray;
    let batches = store
        .samples()
        .scan(
            &frostdb_core::ScanRequest::new()
                .project(["labels.pod"])
                .filter(frostdb_core::col("sample_type").eq("cpu"))
                .sorted(true),
        )
        .unwrap();
    let mut runs: Vec<String> = Vec::new();
    for batch in &batches {
        let pods =
            arrow::compute::cast(batch.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
        for pod in pods.as_string::<i32>().iter().flatten() {
            if runs.last().map(String::as_str) != Some(pod) {
                runs.push(pod.to_owned());
            }
        }
    }
    runs
}

/// Series labels sort in hierarchy order (service, namespace, job, pod, instance,
/// container, then by name): a pod's containers are adjacent, so a selector naming one pod
/// reads one run of rows. In name order `container` would lead and split every pod.
#[test]
fn a_pods_series_are_adjacent_whatever_its_containers() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    ingest_pods_and_containers(&store);
    assert_eq!(pod_runs(&store), ["p1", "p2"]);
}

/// A store made when labels sorted by name opens with its tables as they were made (their
/// rows are in that order) rather than failing on the changed definition, and answers.
#[test]
fn a_store_whose_labels_sort_by_name_opens_as_it_was_made() {
    use frostdb_pprof::schema;
    let dir = tempfile::tempdir().unwrap();
    let by_names = |current: frostdb_core::Schema| {
        let json = current.to_json().unwrap();
        let json = json.replace(
            &format!(
                ",\"first\":{}",
                serde_json::to_string(&schema::LABELS_FIRST).unwrap()
            ),
            "",
        );
        let old = frostdb_core::Schema::from_json(&json).unwrap();
        assert_ne!(old, current, "the hierarchy is part of the definition");
        old
    };
    {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        for (name, current) in [
            (schema::SAMPLES, schema::samples()),
            (schema::SPANS, schema::spans()),
            (schema::TOTALS, schema::totals()),
            (schema::SERIES, schema::series()),
            (
                schema::ROLLUPS_HOURLY,
                schema::rollups(schema::ROLLUPS_HOURLY),
            ),
            (
                schema::ROLLUPS_DAILY,
                schema::rollups(schema::ROLLUPS_DAILY),
            ),
        ] {
            db.table(
                name,
                by_names(current),
                frostdb_core::TableOptions::default(),
            )
            .unwrap();
        }
    }
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    assert_eq!(**store.samples().schema(), by_names(schema::samples()));
    let cpu = ingest_pods_and_containers(&store);
    // Name order: container first, so each pod appears once per container.
    assert_eq!(pod_runs(&store), ["p1", "p2", "p1", "p2"]);
    let selector =
        Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{pod=\"p1\"}").unwrap();
    let merged = store.merge(&selector, TimeRange::ALL).unwrap();
    let one = decode(&cpu, &Limits::default()).unwrap();
    let sample_total: i64 = one.into_inner().sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(merged.total(), 2 * sample_total);
}

/// Each pod's time series point, averaged, of the two containers' profiles
/// [`ingest_pods_and_containers`] stores per pod at one time (and their sum).
fn pod_points(store: &ProfileStore, average: bool) -> Vec<(String, f64)> {
    let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let pod = ["pod".to_owned()];
    let series = store
        .range(
            &selector,
            TimeRange::ALL,
            i64::MAX / 4,
            Some(&pod),
            ReadOptions::STRICT,
        )
        .unwrap()
        .value;
    series
        .iter()
        .map(|s| {
            let points: Vec<(i64, f64)> = s.values(average).collect();
            assert_eq!(points.len(), 1);
            (s.labels[0].1.clone(), points[0].1)
        })
        .collect()
}

/// Two profiles of one time in a group of series (a pod's two containers) average to one
/// profile's total: the totals rows say which profile each is of. Counted by time, they
/// were one profile, and the average their sum.
#[test]
fn profiles_of_one_time_in_a_group_average_as_that_many() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let cpu = ingest_pods_and_containers(&store);
    let one = decode(&cpu, &Limits::default()).unwrap();
    let total: i64 = one.into_inner().sample.iter().map(|s| s.value[1]).sum();
    let pods = |v: f64| vec![("p1".to_owned(), v), ("p2".to_owned(), v)];
    assert_eq!(pod_points(&store, false), pods(2.0 * total as f64));
    assert_eq!(pod_points(&store, true), pods(total as f64));
}

/// A store whose totals were made before profile keys opens with them as they were made
/// (rather than failing on the changed definition), stores into them and answers their
/// time series. (Its rows cannot tell apart the profiles of one time in a group: those
/// average as one, as before.)
#[test]
fn a_store_whose_totals_lack_profile_keys_opens_as_they_were_made() {
    use frostdb_pprof::schema;
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        db.table(
            schema::TOTALS,
            schema::totals_without_profile_keys(),
            frostdb_core::TableOptions::default(),
        )
        .unwrap();
    }
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let cpu = ingest_pods_and_containers(&store);
    let totals = store.db().get_table(schema::TOTALS).unwrap();
    assert_eq!(**totals.schema(), schema::totals_without_profile_keys());
    let one = decode(&cpu, &Limits::default()).unwrap();
    let total: i64 = one.into_inner().sample.iter().map(|s| s.value[1]).sum();
    let sums = pod_points(&store, false);
    assert_eq!(
        sums,
        [
            ("p1".to_owned(), 2.0 * total as f64),
            ("p2".to_owned(), 2.0 * total as f64)
        ]
    );
    // Made now, the totals have the key.
    let fresh = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(fresh, StoreOptions::default()).unwrap();
    let totals = store.db().get_table(schema::TOTALS).unwrap();
    assert_eq!(**totals.schema(), schema::totals());
}

/// `p` with every id and string index renumbered (ids scaled by `scale` times a small prime
/// and shifted, the string table reversed after its empty first entry): the same profile, as
/// another writer numbers it.
fn renumbered(mut p: frostdb_pprof::proto::Profile, scale: u64) -> frostdb_pprof::proto::Profile {
    let n = p.string_table.len() as i64;
    let s = |i: &mut i64| {
        if *i > 0 {
            *i = n - *i;
        }
    };
    p.string_table[1..].reverse();
    for t in p.sample_type.iter_mut().chain(p.period_type.as_mut()) {
        s(&mut t.r#type);
        s(&mut t.unit);
    }
    for m in &mut p.mapping {
        m.id = m.id * 7 * scale + 3;
        s(&mut m.filename);
        s(&mut m.build_id);
    }
    for f in &mut p.function {
        f.id = f.id * 5 * scale + 11;
        s(&mut f.name);
        s(&mut f.system_name);
        s(&mut f.filename);
    }
    for l in &mut p.location {
        l.id = l.id * 3 * scale + 1000;
        if l.mapping_id != 0 {
            l.mapping_id = l.mapping_id * 7 * scale + 3;
        }
        for line in &mut l.line {
            line.function_id = line.function_id * 5 * scale + 11;
        }
    }
    p.location.reverse();
    for sample in &mut p.sample {
        for id in &mut sample.location_id {
            *id = *id * 3 * scale + 1000;
        }
        for label in &mut sample.label {
            s(&mut label.key);
            s(&mut label.str);
            s(&mut label.num_unit);
        }
    }
    for i in [
        &mut p.drop_frames,
        &mut p.keep_frames,
        &mut p.default_sample_type,
    ] {
        s(i);
    }
    p.comment.iter_mut().for_each(s);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_stack_is_found_by_its_content_whatever_its_ids_and_a_changed_frame_is_new() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let limits = Limits::default();
    let original = decode(&file("goapp__go119-cpu-2s.pb.gz"), &limits)
        .unwrap()
        .into_inner();
    // Each at a time of its own: the same profile at one time would be stored once, its
    // stacks not looked up at all.
    let at = std::cell::Cell::new(1_700_000_000_000);
    let ingest = |p: frostdb_pprof::proto::Profile| {
        let p = frostdb_pprof::validate(p, &limits).unwrap();
        at.set(at.get() + 1);
        let options = options("process_cpu", &[("job", "goapp")]).timestamp_ms(at.get());
        let summary = store.ingest_profile(&p, &options).unwrap();
        assert!(!summary.duplicate);
        summary
    };
    let first = ingest(original.clone());
    assert!(first.new_stacks > 0);
    // Renumbered, every stack is one the store has: ids a few times the message count (looked
    // up in a table by id) and ids far past it (looked up in a map).
    assert_eq!(ingest(renumbered(original.clone(), 1)).new_stacks, 0);
    assert_eq!(ingest(renumbered(original.clone(), 1 << 33)).new_stacks, 0);
    // One function moved to another file: the stacks through it are new, the others not.
    let mut moved = original.clone();
    let leaf = moved.sample[0].location_id[0];
    let function = moved
        .location
        .iter()
        .find(|l| l.id == leaf)
        .map(|l| l.line[0].function_id)
        .unwrap();
    moved.string_table.push("elsewhere.go".into());
    let elsewhere = moved.string_table.len() as i64 - 1;
    moved
        .function
        .iter_mut()
        .find(|f| f.id == function)
        .unwrap()
        .filename = elsewhere;
    let through: usize = {
        let locations: std::collections::HashSet<u64> = moved
            .location
            .iter()
            .filter(|l| l.line.iter().any(|line| line.function_id == function))
            .map(|l| l.id)
            .collect();
        let stacks: std::collections::HashSet<&Vec<u64>> = moved
            .sample
            .iter()
            .filter(|s| s.value.iter().any(|v| *v != 0))
            .filter(|s| s.location_id.iter().any(|id| locations.contains(id)))
            .map(|s| &s.location_id)
            .collect();
        stacks.len()
    };
    assert!(through > 0);
    assert_eq!(ingest(moved).new_stacks, through);
    // Each stored stack is named by its own frames: the four profiles merge to four times
    // the first's total.
    let merged = store
        .merge(
            &Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap(),
            TimeRange::ALL,
        )
        .unwrap();
    let total: i64 = merged.samples.iter().map(|(_, v)| v).sum();
    let first_total: i64 = original.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(total, 4 * first_total);
    // The new stacks' frames are the partition's own locations where their content is
    // known (found by content key), and new locations only through the moved function:
    // the locations the stored stacks use are the original's plus one per moved one.
    let used = |p: &frostdb_pprof::proto::Profile| -> std::collections::HashSet<u64> {
        p.sample
            .iter()
            .filter(|s| s.value.iter().any(|v| *v != 0))
            .flat_map(|s| s.location_id.iter().copied())
            .collect()
    };
    let moved_locations = original
        .location
        .iter()
        .filter(|l| used(&original).contains(&l.id))
        .filter(|l| l.line.iter().any(|line| line.function_id == function))
        .count();
    let (mut locations, mut elsewhere) = (std::collections::HashSet::new(), 0);
    for (stack, _) in &merged.samples {
        merged.symbols.for_each_frame(*stack, |f| {
            locations.insert(f.location_id());
            elsewhere += usize::from(f.filename() == "elsewhere.go");
        });
    }
    assert_eq!(locations.len(), used(&original).len() + moved_locations);
    assert!(
        elsewhere > 0,
        "the moved function's new frames resolve to its new file"
    );
    // And every stored stack is its own frames: by (function, line) sequence, the merge
    // holds four times the original's values.
    let name = |id: u64| {
        let f = original.function.iter().find(|f| f.id == id).unwrap();
        original.string_table[f.name as usize].clone()
    };
    let mut expected: std::collections::HashMap<Vec<(String, i64)>, i64> = Default::default();
    for sample in original.sample.iter().filter(|s| s.value[1] != 0) {
        let frames = sample
            .location_id
            .iter()
            .flat_map(|id| &original.location.iter().find(|l| l.id == *id).unwrap().line)
            .map(|line| (name(line.function_id), line.line))
            .collect();
        *expected.entry(frames).or_default() += 4 * sample.value[1];
    }
    let mut stored: std::collections::HashMap<Vec<(String, i64)>, i64> = Default::default();
    for (stack, v) in &merged.samples {
        let frames = merged
            .symbols
            .frames(*stack)
            .iter()
            .map(|f| (f.function().unwrap().name.to_owned(), f.line()))
            .collect();
        *stored.entry(frames).or_default() += v;
    }
    assert_eq!(stored, expected);
}

/// A request whose first profiles use only symbols the partition has, and whose later one
/// brings new ones: the first are found by the shared lookup, the later one needs the
/// exclusive writer, and the profiles found already keep what the lookup found. Before,
/// every profile was interned again under the exclusive writer, and those whose stacks had
/// been handed over panicked (an OTLP export of a known service and a new one: 500).
#[test]
fn a_request_mixing_known_and_new_symbols_is_stored_whole() {
    let cpu = decode(&file("goapp__go119-cpu-2s.pb.gz"), &Limits::default()).unwrap();
    let heap = decode(&file("goapp__go119-heap.pb.gz"), &Limits::default()).unwrap();
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let job = |j: &str| options("process_cpu", &[("job", j)]);
    let first = store.ingest_profile(&cpu, &job("a")).unwrap();
    let (b, c) = (job("b"), options("memory", &[("job", "c")]).delta(false));
    let summaries = store
        .ingest_all(&[(&cpu, &b), (&cpu, &job("d")), (&heap, &c)])
        .unwrap();
    assert_eq!(summaries[0].rows, first.rows, "{summaries:?}");
    assert_eq!(summaries[1].rows, first.rows, "{summaries:?}");
    assert_eq!(
        summaries[0].new_stacks, 0,
        "its stacks were known: {summaries:?}"
    );
    assert!(
        summaries[2].rows > 0 && summaries[2].new_stacks > 0,
        "{summaries:?}"
    );
    let all = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let one = store
        .merge(
            &Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{job=\"a\"}").unwrap(),
            TimeRange::ALL,
        )
        .unwrap()
        .total();
    assert!(one > 0);
    assert_eq!(store.merge(&all, TimeRange::ALL).unwrap().total(), 3 * one);
    let heap_rows = store.samples().snapshot().rows() - 3 * first.rows;
    assert_eq!(heap_rows, summaries[2].rows);
}

/// `ingest_all` stores a request's profiles whole or not at all: a profile that fails its
/// label checks, or series over the limit, leave nothing of the others stored (nor their
/// series admitted); a profile given twice is stored once; deltas run through the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_profiles_are_stored_whole_or_not_at_all() {
    let cpu = decode(&file("goapp__go119-cpu-2s.pb.gz"), &Limits::default()).unwrap();
    let job = |j: &str| options("process_cpu", &[("job", j)]);
    let (a, b) = (job("a"), job("b"));
    let open = |max_series| {
        ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default().max_series(max_series),
        )
        .unwrap()
    };
    // A label collision in the second profile: the first is not stored either.
    let store = open(usize::MAX);
    let colliding = options("process_cpu", &[("team", "not-in-the-profile")]);
    let err = store
        .ingest_all(&[(&cpu, &a), (&cpu, &colliding)])
        .unwrap_err();
    // The error names the profile at fault, and keeps its kind.
    assert!(
        matches!(&err, Error::At { at, error } if at == "profiles[1]"
            && matches!(**error, Error::LabelCollision { .. })),
        "{err}"
    );
    assert_eq!(store.samples().snapshot().rows(), 0, "nothing stored");

    // Room for one profile's series, not two: refused whole, and nothing admitted.
    let one = open(usize::MAX);
    one.ingest_profile(&cpu, &a).unwrap();
    let per_profile = stored_series(&one).await / 2; // label sets; two sample types
    let store = open(per_profile);
    let err = store.ingest_all(&[(&cpu, &a), (&cpu, &b)]).unwrap_err();
    assert!(matches!(err, Error::SeriesLimit { .. }), "{err}");
    assert_eq!(store.samples().snapshot().rows(), 0, "nothing stored");
    assert_eq!(store.series_count(), 0, "no series admitted");
    store.ingest_profile(&cpu, &a).unwrap();

    // Stored whole: both series, and the profile given twice stored once.
    let store = open(usize::MAX);
    let summaries = store
        .ingest_all(&[(&cpu, &a), (&cpu, &b), (&cpu, &a)])
        .unwrap();
    let duplicates: Vec<bool> = summaries.iter().map(|s| s.duplicate).collect();
    assert_eq!(duplicates, [false, false, true]);
    assert!(summaries[0].rows > 0 && summaries[0].rows == summaries[1].rows);
    let all = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let alone = one.merge(&all, TimeRange::ALL).unwrap().total();
    assert_eq!(
        store.merge(&all, TimeRange::ALL).unwrap().total(),
        2 * alone
    );
    // Pushed again, all of it is recognised.
    let again = store.ingest_all(&[(&cpu, &a), (&cpu, &b)]).unwrap();
    assert!(again.iter().all(|s| s.duplicate && s.rows == 0));

    // Deltas of a series within one call: each from the one before it.
    let heap: Vec<_> = [
        "parca__go-heap-series-1644509272337470000.pb.gz",
        "parca__go-heap-series-1644509275338070000.pb.gz",
        "parca__go-heap-series-1644509278338696000.pb.gz",
    ]
    .into_iter()
    .map(|n| decode(&file(n), &Limits::default()).unwrap())
    .collect();
    let alloc_total = |p: &frostdb_pprof::ValidProfile| {
        let t = p
            .sample_type
            .iter()
            .position(|t| p.string_table[t.r#type as usize] == "alloc_space")
            .unwrap();
        p.sample.iter().map(|s| s.value[t]).sum::<i64>()
    };
    let store = open(usize::MAX);
    let delta = options("memory", &[("instance", "a")]).delta(true);
    let batch: Vec<_> = heap.iter().map(|p| (p, &delta)).collect();
    store.ingest_all(&batch).unwrap();
    let alloc = Selector::parse("memory:alloc_space:bytes:space:bytes{instance=\"a\"}").unwrap();
    assert_eq!(
        store.merge(&alloc, TimeRange::ALL).unwrap().total(),
        alloc_total(&heap[2]) - alloc_total(&heap[0])
    );
}

/// Profiles stored in one group (one call of `ingest_all`), given out of the table's order
/// (series and times descending, two sample types, samples under two handlers), are stored
/// in it: compaction finds the group's rows sorted. Their series index, totals and merges
/// are those of the same profiles stored one at a time.
#[test]
fn a_groups_rows_are_stored_in_the_tables_order_and_answer_as_profiles_stored_alone() {
    let profiles: Vec<(frostdb_pprof::ValidProfile, IngestOptions)> = (0..12u64)
        .rev()
        .map(|i| {
            let mut p = frostdb_pprof::testing::profile(i * 5, 20, 3);
            let key = p.string_table.len() as i64;
            p.string_table
                .extend(["handler".to_owned(), "h0".to_owned(), "h1".to_owned()]);
            // A second sample type: two profile types a profile.
            let alloc = p.string_table.len() as i64;
            p.string_table.push("alloc".to_owned());
            p.sample_type.push(frostdb_pprof::proto::ValueType {
                r#type: alloc,
                unit: alloc,
            });
            for (j, sample) in p.sample.iter_mut().enumerate() {
                sample.value.push(j as i64 + 1);
                // The handlers alternate: a profile's rows of one label set are not runs.
                sample.label = vec![frostdb_pprof::proto::Label {
                    key,
                    str: key + 1 + ((j + i as usize) % 2) as i64,
                    ..Default::default()
                }];
            }
            let profile = frostdb_pprof::validate(p, &Limits::default()).unwrap();
            let options = IngestOptions::default()
                .name("process_cpu")
                .labels(vec![("pod".into(), format!("p{}", i % 3))])
                // Two profiles of each pod share a time.
                .timestamp_ms(1_700_000_000_000 + (i / 2) as i64 * 10_000);
            (profile, options)
        })
        .collect();
    let open = || {
        ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap()
    };
    let grouped = open();
    let all: Vec<_> = profiles.iter().map(|(p, o)| (p, o)).collect();
    grouped.ingest_all(&all).unwrap();
    let alone = open();
    for (p, o) in &profiles {
        alone.ingest_profile(p, o).unwrap();
    }
    // One part, in the table's order; and so is a group of one profile.
    let in_order = |store: &ProfileStore| {
        let scanned = store
            .samples()
            .scan(&frostdb_core::ScanRequest::new())
            .unwrap();
        let scanned = arrow::compute::concat_batches(&scanned[0].schema(), &scanned).unwrap();
        let order = store.samples().sort_indices(&scanned).unwrap();
        assert!(
            order.is_sorted(),
            "stored out of the table's order: {order:?}"
        );
        scanned.num_rows()
    };
    assert_eq!(in_order(&grouped), alone.samples().snapshot().rows());
    // A profile of one type and label set, its samples in the reverse of the order their
    // stacks were first stored in: one run of rows, sorted by stack.
    let one = open();
    let mut p = frostdb_pprof::testing::profile(0, 20, 3);
    let options = IngestOptions::default().name("process_cpu");
    let first = frostdb_pprof::validate(p.clone(), &Limits::default()).unwrap();
    one.ingest_profile(&first, &options.clone().timestamp_ms(1_700_000_000_000))
        .unwrap();
    p.sample.reverse();
    let reversed = frostdb_pprof::validate(p, &Limits::default()).unwrap();
    one.ingest_profile(&reversed, &options.timestamp_ms(1_700_000_010_000))
        .unwrap();
    assert!(in_order(&one) > 0);

    let totals = |s: &ProfileStore| s.db().get_table("totals").unwrap().snapshot().rows();
    assert_eq!(totals(&grouped), totals(&alone));
    for ty in ["cpu:nanoseconds", "alloc:alloc"] {
        for labels in ["", "pod=\"p1\"", "handler=\"h0\",pod=\"p2\""] {
            let selector =
                Selector::parse(&format!("process_cpu:{ty}:cpu:nanoseconds{{{labels}}}")).unwrap();
            let merge = |s: &ProfileStore| {
                let merged = s.merge(&selector, TimeRange::ALL).unwrap();
                (merged.total(), TopTable::build(&merged).render())
            };
            assert_eq!(merge(&grouped), merge(&alone), "{selector}");
            assert!(merge(&grouped).0 > 0, "{selector}");
            let range = |s: &ProfileStore| {
                let read = s
                    .range(&selector, TimeRange::ALL, 10_000, None, ReadOptions::STRICT)
                    .unwrap();
                read.value
                    .iter()
                    .map(|s| (s.labels.clone(), s.points.clone(), s.rows.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(range(&grouped), range(&alone), "{selector}");
            let series = |s: &ProfileStore| {
                s.series(&selector, TimeRange::ALL, None, ReadOptions::STRICT)
                    .unwrap()
                    .value
            };
            assert_eq!(series(&grouped), series(&alone), "{selector}");
        }
    }
}

/// Every read of a merge, a merge by series and a range goes through scans that stop once
/// the work is called off ([`frostdb_core::stop_scans_when`], what the server sets for a
/// request that ended): it fails naming why, rather than reading to its end for nobody.
/// Outside, the same reads answer.
#[test]
fn merges_and_ranges_stop_once_their_work_is_called_off() {
    use frostdb_pprof::{Aggregation, MergeOptions};
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    for i in 0..20 {
        store
            .ingest(
                &cpu,
                &options("cpu", &[("job", "a")]).timestamp_ms(1_700_000_000_000 + i * 1_000),
            )
            .unwrap();
    }
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{job=\"a\"}").unwrap();
    let by_series = MergeOptions {
        aggregation: Aggregation::Average,
        by_series: true,
        ..MergeOptions::default()
    };
    let reads = |store: &ProfileStore| -> Vec<Result<usize, Error>> {
        vec![
            store
                .merge(&selector, TimeRange::ALL)
                .map(|m| m.samples.len()),
            store
                .merge_with(&selector, TimeRange::ALL, &by_series)
                .map(|m| m.samples.len()),
            store
                .range(&selector, TimeRange::ALL, 1_000, None, ReadOptions::STRICT)
                .map(|r| r.value.len()),
        ]
    };
    for answer in reads(&store) {
        assert!(answer.unwrap() > 0);
    }
    let stopped = frostdb_core::stop_scans_when(
        || Some("the request ended (test)".to_owned()),
        || reads(&store),
    );
    for answer in stopped {
        let err = answer.unwrap_err();
        assert_eq!(err.kind(), frostdb_core::ErrorKind::Unavailable, "{err}");
        assert!(
            err.to_string().contains("the request ended (test)"),
            "{err}"
        );
    }
}

/// A merge with series kept apart is charged what a pprof export of it copies: each
/// series' stacks' location ids, a stack in many series copied into each. The charge
/// covers what the export builds, and grows with the series, as the copies do.
#[test]
fn series_kept_apart_are_charged_their_stacks_copies() {
    use frostdb_pprof::{Aggregation, MergeOptions};
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let by_series = MergeOptions {
        aggregation: Aggregation::Sum,
        by_series: true,
        ..MergeOptions::default()
    };
    let mut charged = Vec::new();
    for pods in [1usize, 8] {
        for pod in charged.len() * 100..charged.len() * 100 + pods {
            let pod = pod.to_string();
            store
                .ingest(
                    &cpu,
                    &options("cpu", &[("pod", &pod)]).timestamp_ms(1_700_000_000_000),
                )
                .unwrap();
        }
        let merged = store
            .merge_with(&selector, TimeRange::ALL, &by_series)
            .unwrap();
        let exported = pprof::to_profile(&merged).unwrap();
        let ids: usize = exported.sample.iter().map(|s| s.location_id.len()).sum();
        assert!(ids > 0);
        assert!(
            merged.series_bytes() >= ids * 8 + exported.sample.len() * 64,
            "{} bytes charged for {ids} location ids in {} samples",
            merged.series_bytes(),
            exported.sample.len()
        );
        assert!(merged.series_bytes() > merged.frame_bytes() || pods == 1);
        charged.push(merged.series_bytes());
        // Without series kept, nothing is charged for them.
        assert_eq!(
            store
                .merge(&selector, TimeRange::ALL)
                .unwrap()
                .series_bytes(),
            0
        );
    }
    assert!(charged[1] >= charged[0] * 8, "{charged:?}");
}

/// A range grouped by a label named twice groups by it once (it was a 500: the scan
/// projects a column once, and the timestamp was read where the second label was).
#[test]
fn a_range_grouped_by_a_label_named_twice_groups_by_it_once() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    let cpu = file("goapp__go119-cpu-2s.pb.gz");
    for pod in ["a", "b"] {
        store
            .ingest(
                &cpu,
                &options("cpu", &[("pod", pod)]).timestamp_ms(1_700_000_000_000),
            )
            .unwrap();
    }
    let selector = Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let range = |by: &[&str]| {
        let by: Vec<String> = by.iter().map(|s| s.to_string()).collect();
        store
            .range(
                &selector,
                TimeRange::ALL,
                10_000,
                Some(&by),
                ReadOptions::STRICT,
            )
            .unwrap()
            .value
            .iter()
            .map(|s| (s.labels.clone(), s.points.clone()))
            .collect::<Vec<_>>()
    };
    let once = range(&["pod"]);
    assert_eq!(once.len(), 2);
    assert_eq!(range(&["pod", "pod"]), once);
}

/// A store's series index is rebuilt in one transaction, however many batches its samples
/// are read in: built partly before a crash, it was taken for whole at the next open (it is
/// built only when empty), and merges and label queries left out the series it lacked.
#[test]
fn a_series_index_is_rebuilt_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let options = |i: usize| {
        let mut o = options("process_cpu", &[("pod", &format!("p{i}"))]);
        o.timestamp_ms = Some(1_700_000_000_000 + i as i64 * 1000);
        o
    };
    let (index_rows, sample_rows) = {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        for i in 0..400 {
            let p = frostdb_pprof::validate(
                frostdb_pprof::testing::profile(i as u64 * 50, 50, 3),
                &Limits::default(),
            )
            .unwrap();
            store.ingest_profile(&p, &options(i)).unwrap();
        }
        store.db().flush().unwrap();
        let index = store.db().get_table("series").unwrap();
        let rows = (index.snapshot().rows(), store.samples().snapshot().rows());
        assert!(!index.delete_blocks(|_| true).unwrap().is_empty());
        rows
    };
    // More sample rows than a scan's batch: the index is made from several.
    assert!(sample_rows > 2 * 8192, "{sample_rows}");
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    assert_eq!(
        store.db().get_table("series").unwrap().snapshot().rows(),
        index_rows
    );
    assert_eq!(
        store.db().wal_stats().unwrap().records,
        1,
        "the index is built in one transaction"
    );
    let pods = store
        .label_values("pod", None, TimeRange::ALL, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert_eq!(pods.len(), 400);
}
