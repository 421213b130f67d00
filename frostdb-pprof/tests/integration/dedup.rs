//! A profile pushed again is stored once: the same series, time and content are recognised
//! (also across a restart, and when pushed from several threads at once); a different
//! profile at the same series and time, or the same one at another time, is stored.

use crate::common;

use std::time::Duration;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{IngestOptions, IngestSummary, ProfileStore, StoreOptions, testing};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use proptest::prelude::*;
use prost::Message;

const T0: i64 = 1_700_000_000_000;

fn file(name: &str) -> Vec<u8> {
    std::fs::read(common::shared().join("testdata/pprof").join(name)).unwrap()
}

fn options(job: &str, timestamp_ms: Option<i64>) -> IngestOptions {
    IngestOptions::default()
        .name("memory")
        .labels(vec![("job".into(), job.into())])
        .timestamp_ms(timestamp_ms)
}

fn in_memory() -> ProfileStore {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    ProfileStore::open(db, StoreOptions::default()).unwrap()
}

/// The merged total of each of `types` (profile type ids), for series `job`.
fn totals(store: &ProfileStore, types: &[String], job: &str) -> Vec<i64> {
    types
        .iter()
        .map(|t| {
            let selector = Selector::parse(&format!("{t}{{job=\"{job}\"}}")).unwrap();
            store.merge(&selector, TimeRange::ALL).unwrap().total()
        })
        .collect()
}

fn stored(summary: &IngestSummary) {
    assert!(!summary.duplicate, "{summary:?}");
    assert!(summary.rows > 0, "{summary:?}");
}

fn skipped(summary: &IngestSummary) {
    assert!(summary.duplicate, "not recognised: {summary:?}");
    assert_eq!(summary.rows, 0, "{summary:?}");
    assert_eq!(summary.new_stacks, 0, "{summary:?}");
}

#[test]
fn a_file_ingested_twice_is_stored_once() {
    let store = in_memory();
    let heap = file("goapp__go119-heap.pb.gz");
    let first = store.ingest(&heap, &options("a", None)).unwrap();
    stored(&first);
    let types = first.profile_types.clone();
    assert_eq!(types.len(), 4);
    let once = totals(&store, &types, "a");
    assert!(once.iter().all(|&t| t > 0), "{once:?}");

    let second = store.ingest(&heap, &options("a", None)).unwrap();
    skipped(&second);
    assert_eq!(second.timestamp_ms, first.timestamp_ms);
    assert_eq!(totals(&store, &types, "a"), once);
    // Also with the time given, and once the first is persisted.
    store.db().flush().unwrap();
    let given = Some(first.timestamp_ms);
    skipped(&store.ingest(&heap, &options("a", given)).unwrap());
    assert_eq!(totals(&store, &types, "a"), once);
    let rows: usize = types
        .iter()
        .map(|t| {
            let selector = Selector::parse(t).unwrap();
            store.merge_raw(&selector, TimeRange::ALL).unwrap().rows
        })
        .sum();
    assert_eq!(rows, first.rows, "the sample rows were written once");

    // Another series: a profile of its own.
    stored(&store.ingest(&heap, &options("b", None)).unwrap());
    assert_eq!(totals(&store, &types, "b"), once);
}

#[test]
fn the_same_profile_at_another_time_is_stored_again() {
    let store = in_memory();
    let cpu = file("pyroscope__go-cpu.pb.gz");
    let first = store.ingest(&cpu, &options("a", Some(T0))).unwrap();
    stored(&first);
    let once = totals(&store, &first.profile_types, "a");
    // A minute later, and a millisecond later.
    for t in [T0 + 60_000, T0 + 1] {
        stored(&store.ingest(&cpu, &options("a", Some(t))).unwrap());
    }
    let thrice: Vec<i64> = once.iter().map(|v| 3 * v).collect();
    assert_eq!(totals(&store, &first.profile_types, "a"), thrice);
    // Each of the three is recognised again.
    for t in [T0, T0 + 60_000, T0 + 1] {
        skipped(&store.ingest(&cpu, &options("a", Some(t))).unwrap());
    }
    assert_eq!(totals(&store, &first.profile_types, "a"), thrice);
}

#[test]
fn different_profiles_of_one_series_and_time_are_both_stored() {
    let store = in_memory();
    // Two heap profiles, of two programs.
    let a = file("goapp__go119-heap.pb.gz");
    let b = file("parca__go-heap-series-1644509272337470000.pb.gz");
    // Each alone, in series of their own.
    let summary = store.ingest(&a, &options("a", Some(T0))).unwrap();
    let types = summary.profile_types;
    stored(&store.ingest(&b, &options("b", Some(T0))).unwrap());
    let (ta, tb) = (totals(&store, &types, "a"), totals(&store, &types, "b"));
    assert_ne!(ta, tb, "the two profiles differ");
    // Both in one series at one time: their values add up.
    stored(&store.ingest(&a, &options("both", Some(T0))).unwrap());
    stored(&store.ingest(&b, &options("both", Some(T0))).unwrap());
    let sum: Vec<i64> = ta.iter().zip(&tb).map(|(a, b)| a + b).collect();
    assert_eq!(totals(&store, &types, "both"), sum);
    // And each is recognised again.
    skipped(&store.ingest(&b, &options("both", Some(T0))).unwrap());
    skipped(&store.ingest(&a, &options("both", Some(T0))).unwrap());
    assert_eq!(totals(&store, &types, "both"), sum);
}

#[test]
fn a_profile_encoded_again_is_recognised_and_a_changed_value_is_not() {
    let store = in_memory();
    let limits = frostdb_pprof::Limits::default();
    let original = frostdb_pprof::decode(&file("goapp__go119-cpu-2s.pb.gz"), &limits)
        .unwrap()
        .into_inner();
    let options = options("a", Some(T0));
    let ingest = |p: frostdb_pprof::proto::Profile| {
        let p = frostdb_pprof::validate(p, &limits).unwrap();
        store.ingest_profile(&p, &options).unwrap()
    };
    stored(&ingest(original.clone()));
    // Its samples, locations and functions in the reverse order.
    let mut reordered = original.clone();
    reordered.sample.reverse();
    reordered.location.reverse();
    reordered.function.reverse();
    skipped(&ingest(reordered));
    // One sample's value changed: another profile.
    let mut changed = original.clone();
    let sample = changed
        .sample
        .iter_mut()
        .find(|s| s.value.iter().any(|v| *v != 0))
        .unwrap();
    sample.value[0] += 1;
    stored(&ingest(changed));
}

#[test]
fn a_profile_pushed_again_after_a_restart_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        ProfileStore::open(db, StoreOptions::default()).unwrap()
    };
    let heap = file("goapp__go119-heap.pb.gz");
    let (types, before) = {
        let store = open();
        // One profile persisted in a block, the other left in the WAL.
        let first = store.ingest(&heap, &options("a", Some(T0))).unwrap();
        stored(&first);
        store.db().flush().unwrap();
        stored(
            &store
                .ingest(&heap, &options("a", Some(T0 + 10_000)))
                .unwrap(),
        );
        let types = first.profile_types;
        let before = totals(&store, &types, "a");
        (types, before)
    };
    let store = open();
    assert_eq!(totals(&store, &types, "a"), before);
    for t in [T0, T0 + 10_000] {
        skipped(&store.ingest(&heap, &options("a", Some(t))).unwrap());
    }
    assert_eq!(totals(&store, &types, "a"), before);
    // Not everything is recognised: a new time is a new profile.
    stored(
        &store
            .ingest(&heap, &options("a", Some(T0 + 20_000)))
            .unwrap(),
    );
}

#[test]
fn a_profile_pushed_from_many_threads_at_once_is_stored_once() {
    const THREADS: usize = 8;
    let store = in_memory();
    let heap = file("goapp__go119-heap.pb.gz");
    let barrier = std::sync::Barrier::new(THREADS);
    let summaries: Vec<IngestSummary> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    store.ingest(&heap, &options("a", Some(T0))).unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let (firsts, again): (Vec<_>, Vec<_>) = summaries.iter().partition(|s| !s.duplicate);
    assert_eq!(firsts.len(), 1, "{summaries:?}");
    stored(firsts[0]);
    again.iter().for_each(|s| skipped(s));

    let reference = in_memory();
    reference.ingest(&heap, &options("a", Some(T0))).unwrap();
    let types = &firsts[0].profile_types;
    assert_eq!(totals(&store, types, "a"), totals(&reference, types, "a"));
}

#[test]
fn without_a_window_every_push_is_stored() {
    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let options_off = StoreOptions::default().dedup_window(Duration::ZERO);
    let store = ProfileStore::open(db, options_off).unwrap();
    let cpu = file("pyroscope__go-cpu.pb.gz");
    let first = store.ingest(&cpu, &options("a", Some(T0))).unwrap();
    let once = totals(&store, &first.profile_types, "a");
    stored(&store.ingest(&cpu, &options("a", Some(T0))).unwrap());
    let twice: Vec<i64> = once.iter().map(|v| 2 * v).collect();
    assert_eq!(totals(&store, &first.profile_types, "a"), twice);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Pushes of (series, time, content), some repeated: what is stored is each distinct
    /// push once.
    #[test]
    fn each_distinct_push_is_stored_once(
        pushes in proptest::collection::vec((0..2u8, 0..2i64, 0..3u64), 1..10)
    ) {
        let store = in_memory();
        let mut model = std::collections::BTreeSet::new();
        for &(series, time, content) in &pushes {
            let profile = testing::profile(content * 10, 5, 2).encode_to_vec();
            let options = IngestOptions::default().name("process_cpu").labels(vec![("pod".into(), format!("pod-{series}"))]).timestamp_ms(T0 + time * 1000);
            let summary = store.ingest(&profile, &options).unwrap();
            let new = model.insert((series, time, content));
            prop_assert_eq!(summary.duplicate, !new);
        }
        let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
        let expected: i64 = model
            .iter()
            .map(|&(_, _, content)| testing::total(content * 10, 5))
            .sum();
        prop_assert_eq!(store.merge(&selector, TimeRange::ALL).unwrap().total(), expected);
    }
}
