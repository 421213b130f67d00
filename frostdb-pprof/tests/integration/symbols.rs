//! Symbols at scale: partitions that close, a bounded cache in front of the stored symbol
//! tables read back lazily, and symbols that expire with the samples that use them.

use std::time::Duration;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::report::top::TopTable;
use frostdb_pprof::{
    Aggregation, IngestOptions, MergeOptions, ProfileStore, ReadOptions, StoreOptions,
    SymbolOptions, testing, validate,
};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

const CPU: &str = "cpu:cpu:nanoseconds:cpu:nanoseconds";

fn ingest(store: &ProfileStore, first: u64, count: usize, timestamp_ms: i64) {
    ingest_labelled(store, first, count, timestamp_ms, &[]);
}

/// [`ingest`] with more labels than its pod.
fn ingest_labelled(
    store: &ProfileStore,
    first: u64,
    count: usize,
    timestamp_ms: i64,
    more: &[(&str, &str)],
) {
    let profile = validate(testing::profile(first, count, 5), store.limits()).unwrap();
    let mut labels = vec![("pod".into(), format!("pod-{}", first % 3))];
    labels.extend(more.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let options = IngestOptions::default()
        .name("cpu")
        .labels(labels)
        .delta(false)
        .timestamp_ms(timestamp_ms);
    let summary = store.ingest_profile(&profile, &options).unwrap();
    assert_eq!(summary.rows, count);
}

fn all() -> Selector {
    Selector::parse(&format!("{CPU}{{}}")).unwrap()
}

fn rows(store: &ProfileStore, table: &str) -> usize {
    store.db().get_table(table).unwrap().stats().rows
}

#[test]
fn closed_partitions_are_read_back_lazily_into_a_bounded_cache() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default().symbols(SymbolOptions {
        cache_bytes: 256 << 10,
        ..SymbolOptions::default()
    });
    let open = || {
        ProfileStore::open(
            Db::open(dir.path(), DbOptions::default()).unwrap(),
            options.clone(),
        )
        .unwrap()
    };
    // Ten partitions of 2,000 distinct stacks each.
    let store = open();
    for p in 0..10u64 {
        ingest(&store, p * 2_000, 2_000, 1_000 + p as i64);
        store.rotate_symbols();
    }
    store.db().flush().unwrap();
    drop(store);

    let store = open();
    assert_eq!(
        store.symbol_memory_bytes(),
        0,
        "symbols were loaded at open"
    );
    // One merge resolves stacks of every partition: all are read back, the totals are exact
    // and every stack has its frames.
    let merged = store.merge(&all(), TimeRange::ALL).unwrap();
    assert_eq!(merged.samples.len(), 20_000);
    assert_eq!(merged.total(), testing::total(0, 20_000));
    for (stack, _) in &merged.samples {
        assert_eq!(merged.symbols.depth(*stack), 6);
    }
    let top = TopTable::build_with(&merged, 0.0, 0.0);
    assert_eq!(top.total, merged.total());
    assert!(top.rows.iter().any(|r| r.name == "main"));
    drop((top, merged));
    // Afterwards the cache holds no more than its bound (plus the one partition it always
    // keeps), far less than all ten.
    let memory = store.symbol_memory_bytes();
    let one_partition = {
        let merged = store
            .merge(
                &all(),
                TimeRange {
                    start_ms: 1_000,
                    end_ms: 1_001,
                },
            )
            .unwrap();
        assert_eq!(merged.total(), testing::total(0, 2_000));
        store.symbol_memory_bytes().min(memory)
    };
    assert!(
        memory <= (256 << 10) + one_partition,
        "{memory} bytes of symbols cached, bound 256 KiB"
    );
}

#[test]
fn symbols_expire_with_the_samples_that_use_them() {
    let dir = tempfile::tempdir().unwrap();
    let open = |retention: Option<Duration>| {
        ProfileStore::open(
            Db::open(dir.path(), DbOptions::default()).unwrap(),
            StoreOptions::default().retention(retention),
        )
        .unwrap()
    };
    let now = frostdb_core::now_ms();
    let old = now - 10 * 24 * 3600 * 1000;
    // Old profiles, in their own symbol partition and blocks, stored before the retention
    // was set (past it, they are refused: `profiles_older_than_the_retention_are_refused`).
    let store = open(None);
    for i in 0..4u64 {
        ingest(&store, i * 1_000, 1_000, old + i as i64);
    }
    store.rotate_symbols();
    store.db().flush().unwrap();
    drop(store);
    let store = open(Some(Duration::from_secs(7 * 24 * 3600)));
    // Recent profiles sharing half of those stacks (stored again in the new partition).
    for i in 0..2u64 {
        ingest(&store, 2_000 + i * 1_000, 1_000, now - 1_000 + i as i64);
    }
    store.db().flush().unwrap();
    let (samples_before, stacks_before) = (rows(&store, "samples"), rows(&store, "stacktraces"));
    assert_eq!(samples_before, 6_000);
    assert_eq!(stacks_before, 6_000);

    let expired = store.samples().enforce_retention().unwrap();
    assert!(!expired.is_empty(), "no sample block expired");
    let deleted = store.expire_symbols().unwrap();
    assert!(deleted > 0, "no symbol block deleted");
    assert_eq!(rows(&store, "samples"), 2_000);
    assert_eq!(rows(&store, "stacktraces"), 2_000);
    for table in ["locations", "functions", "mappings"] {
        let t = store.db().get_table(table).unwrap();
        assert!(t.stats().rows > 0, "{table} lost the symbols still in use");
    }

    // What is retained still merges in full, after a reopen too.
    let check = |store: &ProfileStore| {
        let merged = store.merge(&all(), TimeRange::ALL).unwrap();
        assert_eq!(merged.samples.len(), 2_000);
        assert_eq!(merged.total(), testing::total(2_000, 2_000));
    };
    check(&store);
    drop(store);
    let store = ProfileStore::open(
        Db::open(dir.path(), DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    check(&store);
    assert_eq!(rows(&store, "stacktraces"), 2_000);
}

/// A profile older than the store's retention is refused, naming the retention: stored,
/// it was acknowledged and then deleted by the next retention pass (a backfill, or an
/// agent catching up after an outage, lost its profiles behind a 200). Arrow rows too.
/// One within the retention is stored.
#[test]
fn profiles_older_than_the_retention_are_refused() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default().retention(Duration::from_secs(24 * 3600)),
    )
    .unwrap();
    let now = frostdb_core::now_ms();
    let profile = validate(testing::profile(0, 10, 5), store.limits()).unwrap();
    let at = |t: i64| {
        IngestOptions::default()
            .name("cpu")
            .delta(false)
            .timestamp_ms(t)
    };
    let e = store
        .ingest_profile(&profile, &at(now - 3 * 24 * 3600 * 1000))
        .unwrap_err();
    assert!(e.to_string().contains("retention of 86400 s"), "{e}");
    assert_eq!(e.kind(), frostdb_core::ErrorKind::InvalidInput, "{e}");
    assert_eq!(rows(&store, "samples"), 0);
    let raw = testing::profile(0, 4, 2);
    let old_rows =
        testing::arrow_samples(&raw, "cpu", &[("pod", "p1")], now - 2 * 24 * 3600 * 1000);
    let e = store.ingest_arrow(&old_rows, None).unwrap_err();
    assert!(
        e.to_string().contains("samples.timestamp") && e.to_string().contains("retention"),
        "{e}"
    );
    assert_eq!(rows(&store, "samples"), 0);
    let stored = store.ingest_profile(&profile, &at(now - 1_000)).unwrap();
    assert!(stored.rows > 0);
    let recent = testing::arrow_samples(&raw, "cpu", &[("pod", "p1")], now - 1_000);
    assert!(store.ingest_arrow(&recent, None).unwrap().rows > 0);
}

/// Profiles stored from many threads while partitions close under them (a rotation every
/// few stores, as a full partition closes mid-ingest): each profile's symbols are written
/// with a group of the partition it interned them in, so every stack resolves whole, before
/// and after the store is reopened from its write-ahead log.
#[test]
fn profiles_stored_while_partitions_close_keep_every_stack_whole() {
    const THREADS: u64 = 6;
    const PROFILES: u64 = 24;
    const STACKS: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        ProfileStore::open(
            Db::open(dir.path(), DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap()
    };
    let check = |store: &ProfileStore| {
        let merged = store.merge(&all(), TimeRange::ALL).unwrap();
        let stacks = (THREADS * PROFILES) as usize * STACKS;
        assert_eq!(merged.samples.len(), stacks);
        assert_eq!(merged.total(), testing::total(0, stacks));
        for (stack, _) in &merged.samples {
            assert_eq!(merged.symbols.depth(*stack), 6, "a stack lost frames");
        }
    };
    let store = open();
    let storing = std::sync::atomic::AtomicU64::new(THREADS);
    let rotations = std::thread::scope(|s| {
        for t in 0..THREADS {
            let (store, storing) = (&store, &storing);
            s.spawn(move || {
                for i in 0..PROFILES {
                    let first = (t * PROFILES + i) * STACKS as u64;
                    ingest(store, first, STACKS, 1_000 + first as i64);
                }
                storing.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            });
        }
        // Rotates until every thread is done: partitions close between, and while,
        // profiles intern their symbols and join their groups.
        let mut rotations = 0;
        while storing.load(std::sync::atomic::Ordering::Acquire) > 0 {
            store.rotate_symbols();
            rotations += 1;
            std::thread::yield_now();
        }
        rotations
    });
    assert!(rotations > 1, "no partition closed during the ingest");
    check(&store);
    drop(store);
    check(&open());
}

/// Rollups kept longer than samples (30 days beside 7, as the README's config keeps them)
/// still answer once the samples they roll up have expired: the series index merges
/// narrow by, and the symbol partitions their stacks are in, are kept as long as they are.
/// Before, an old range answered an empty profile with a pod matcher (200, the index had
/// expired with the samples), and failed for ever without one (the symbols were deleted).
/// A label only the expired samples had (`region`) still selects once the store is opened
/// again, when the samples table no longer has its column: before, the merge's narrowing
/// by the series index dropped every series with a column the samples lacked (200, empty).
#[test]
fn rollups_kept_longer_than_samples_answer_after_the_samples_expire() {
    let dir = tempfile::tempdir().unwrap();
    let retention = std::cell::Cell::new(None);
    let open = || {
        ProfileStore::open(
            Db::open(dir.path(), DbOptions::default()).unwrap(),
            StoreOptions::default().retention(retention.get()).rollups(
                frostdb_pprof::RollupOptions {
                    delay: Duration::ZERO,
                    hourly_retention: Some(Duration::from_secs(30 * 24 * 3600)),
                    daily_retention: Some(Duration::from_secs(30 * 24 * 3600)),
                    ..Default::default()
                },
            ),
        )
        .unwrap()
    };
    let store = open();
    const HOUR: i64 = 3_600_000;
    let now = frostdb_core::now_ms();
    let hour = (now - 10 * 24 * HOUR).div_euclid(HOUR) * HOUR;
    for i in 0..3u64 {
        let region = if i == 1 { "us" } else { "eu" };
        ingest_labelled(
            &store,
            i * 1_000,
            1_000,
            hour + 60_000 * i as i64,
            &[("region", region)],
        );
    }
    store.rotate_symbols();
    store.db().flush().unwrap();
    // The old profiles were stored before the retention was set (past it, they are
    // refused).
    drop(store);
    retention.set(Some(Duration::from_secs(7 * 24 * 3600)));
    let store = open();
    ingest(&store, 0, 10, now - 1_000);
    store.db().flush().unwrap();
    let range = TimeRange {
        start_ms: hour,
        end_ms: hour + HOUR,
    };
    let pod = Selector::parse(&format!("{CPU}{{pod=\"pod-1\"}}")).unwrap();
    let eu = Selector::parse(&format!("{CPU}{{region=\"eu\"}}")).unwrap();
    let totals = |store: &ProfileStore| {
        (
            store.merge(&all(), range).unwrap().total(),
            store.merge(&pod, range).unwrap().total(),
            store.merge(&eu, range).unwrap().total(),
        )
    };
    let before = totals(&store);
    assert!(before.1 > 0 && before.0 > before.1, "{before:?}");
    assert!(before.2 > 0 && before.0 > before.2, "{before:?}");
    assert!(
        store.roll_up_at(now).unwrap().hours > 0,
        "the old hour rolled up"
    );

    for table in [
        frostdb_profile::schema::SAMPLES,
        frostdb_profile::schema::SERIES,
        frostdb_profile::schema::TOTALS,
    ] {
        store
            .db()
            .get_table(table)
            .unwrap()
            .enforce_retention()
            .unwrap();
    }
    assert!(
        store.merge_raw(&all(), range).unwrap().samples.is_empty(),
        "samples expired"
    );
    store.expire_symbols().unwrap();
    assert_eq!(totals(&store), before);
    // What reads raw samples only is refused for a range before those kept, rather than
    // answering for the samples kept; the time series is read from totals kept as long as
    // the rollups.
    for aggregation in [Aggregation::Average, Aggregation::Latest] {
        let options = MergeOptions {
            aggregation,
            by_series: false,
            lenient: false,
        };
        let e = store
            .merge_with(&all(), range, &options)
            .unwrap_err()
            .to_string();
        assert!(e.contains("reads the raw samples, kept 7 days"), "{e}");
    }
    let points: i64 = store
        .range(&all(), range, HOUR, None, ReadOptions::STRICT)
        .unwrap()
        .value
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, v)| v))
        .sum();
    assert_eq!(points, before.0);
    drop(store);
    let store = open();
    assert!(
        store
            .samples()
            .snapshot()
            .schema()
            .index_of("labels.region")
            .is_none(),
        "the reopened samples table has no column of the expired label"
    );
    assert_eq!(totals(&store), before);
}

/// A merge holds every symbol partition its stacks are in until its report is written,
/// whether the cache keeps them or not: they are reserved from the query memory pool as
/// they are taken, and a range whose partitions do not fit is refused naming the limit,
/// where it used to hold them all uncounted (one partition an hour at least: a month's
/// range is hundreds). A range of fewer partitions still answers.
#[test]
fn a_merges_symbol_partitions_are_held_within_the_query_memory() {
    let dir = tempfile::tempdir().unwrap();
    let symbols = SymbolOptions {
        cache_bytes: 1,
        ..SymbolOptions::default()
    };
    let open = |query_memory: Option<usize>| {
        ProfileStore::open(
            Db::open(dir.path(), DbOptions::default()).unwrap(),
            StoreOptions::default()
                .symbols(symbols)
                .query_memory(query_memory),
        )
        .unwrap()
    };
    // Ten partitions of 2,000 distinct stacks each, a millisecond apart.
    let store = open(None);
    for p in 0..10u64 {
        ingest(&store, p * 2_000, 2_000, 1_000 + p as i64);
        store.rotate_symbols();
    }
    store.db().flush().unwrap();
    let first = TimeRange {
        start_ms: 1_000,
        end_ms: 1_001,
    };
    // What one partition takes: the cache keeps the last one read, and only it.
    store.merge(&all(), first).unwrap();
    let partition = store.symbol_memory_bytes();
    assert!(partition > 0);
    drop(store);

    // Three partitions' worth: far more than the sums of all 20,000 stacks (160 KB).
    let store = open(Some(3 * partition));
    let one = store.merge(&all(), first).unwrap();
    assert_eq!(one.total(), testing::total(0, 2_000));
    drop(one);
    let err = store.merge(&all(), TimeRange::ALL).unwrap_err();
    assert_eq!(err.kind(), frostdb_core::ErrorKind::LimitExceeded, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("partitions") && message.contains("query memory limit"),
        "{message}"
    );
    // The refused merge gave back what it had reserved: a merge that fits answers.
    let again = store.merge(&all(), first).unwrap();
    assert_eq!(again.total(), testing::total(0, 2_000));
}

/// A pprof export holds a location id for every location of every stack, and their
/// encoding: what it is charged covers both, location by location. (A call tree's charge
/// stops at the tree's node cap; an export has no such cap, and was charged as a tree.)
#[test]
fn a_pprof_export_is_charged_every_location_it_writes() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    ingest(&store, 0, 2_000, 1_000);
    let merged = store.merge(&all(), TimeRange::ALL).unwrap();
    let p = frostdb_pprof::report::pprof::to_profile(&merged).unwrap();
    let ids: usize = p.sample.iter().map(|s| s.location_id.len()).sum();
    assert_eq!(ids, 2_000 * 6);
    let encoded: usize = p.sample.iter().map(prost::Message::encoded_len).sum();
    let charged = merged.export_bytes();
    assert!(
        charged >= ids * 8 + encoded,
        "{charged} bytes charged for {ids} ids and {encoded} bytes of samples"
    );
    // And not the tree's charge, which counts frames' names once per distinct frame.
    assert_ne!(charged, merged.frame_bytes());
}

/// A report is charged its frames' names as it writes them: a name of control characters
/// is six bytes a character in JSON (and `&` five in SVG), where it was charged its length.
#[test]
fn frame_names_are_charged_as_reports_write_them() {
    let charged = |name: &str| {
        let store = ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap();
        let mut p = testing::profile(0, 1, 1);
        // The leaf's function (the first after the five fixed strings).
        p.string_table[5] = name.to_owned();
        let profile = validate(p, store.limits()).unwrap();
        let options = IngestOptions::default()
            .name("cpu")
            .delta(false)
            .timestamp_ms(1_000);
        store.ingest_profile(&profile, &options).unwrap();
        store.merge(&all(), TimeRange::ALL).unwrap().frame_bytes()
    };
    let plain = charged(&"a".repeat(10_000));
    let controls = charged(&"\u{1}".repeat(10_000));
    let entities = charged(&"&".repeat(10_000));
    assert!(controls >= plain + 50_000, "{controls} against {plain}");
    assert!(entities >= plain + 50_000, "{entities} against {plain}");
}
