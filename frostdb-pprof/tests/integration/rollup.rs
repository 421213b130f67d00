//! Rollups: a merge that reads hourly and daily rollups for the whole hours and days of its
//! range gives exactly the answer of raw samples, for any range, with profiles arriving
//! after their hour was rolled up, across a reopen.

use std::collections::BTreeSet;
use std::time::Duration;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{IngestOptions, Limits, ProfileStore, RollupOptions, StoreOptions, validate};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use proptest::prelude::*;

const HOUR: i64 = 3_600_000;
const MINUTE: i64 = 60_000;
/// A day boundary (UTC), so ranges cross days.
const BASE: i64 = 1_717_372_800_000 - 6 * HOUR;
const SPAN_MINUTES: i64 = 40 * 60;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A profile: minute of the span, pod, first stack, stacks.
type Shot = (i64, u8, u64, usize);

fn open(dir: &std::path::Path) -> ProfileStore {
    let db = Db::open(dir, DbOptions::default()).unwrap();
    let options = StoreOptions::default().rollups(RollupOptions {
        delay: Duration::ZERO,
        ..RollupOptions::default()
    });
    ProfileStore::open(db, options).unwrap()
}

fn ingest(store: &ProfileStore, shots: &[Shot]) {
    for &(minute, pod, first, count) in shots {
        let profile = validate(
            frostdb_pprof::testing::profile(first, count, 3),
            &Limits::default(),
        )
        .unwrap();
        let options = IngestOptions::default()
            .name("process_cpu")
            .labels(vec![("pod".into(), format!("pod-{pod}"))])
            .timestamp_ms(BASE + minute * MINUTE + i64::from(pod));
        store.ingest_profile(&profile, &options).unwrap();
    }
}

/// What the model says a merge of `range` (pod `pod`, or all) totals.
fn model_total(shots: &[Shot], range: TimeRange, pod: Option<u8>) -> i64 {
    shots
        .iter()
        .filter(|(m, p, ..)| {
            let t = BASE + m * MINUTE + i64::from(*p);
            range.start_ms <= t && t < range.end_ms && pod.is_none_or(|x| x == *p)
        })
        .map(|&(_, _, first, count)| frostdb_pprof::testing::total(first, count))
        .sum()
}

/// Merges `range` with rollups and from raw samples, checks both against each other and
/// the model; returns the rows read from rollups.
fn check(store: &ProfileStore, shots: &[Shot], range: TimeRange) -> usize {
    let mut from_rollups = 0;
    for pod in [None, Some(1u8)] {
        let selector = match pod {
            None => Selector::parse(&format!("{CPU}{{}}")).unwrap(),
            Some(p) => Selector::parse(&format!("{CPU}{{pod=\"pod-{p}\"}}")).unwrap(),
        };
        let merged = store.merge(&selector, range).unwrap();
        let raw = store.merge_raw(&selector, range).unwrap();
        assert_eq!(merged.samples, raw.samples, "{range:?} pod {pod:?}");
        assert_eq!(merged.total(), model_total(shots, range, pod), "{range:?}");
        if !merged.samples.is_empty() {
            assert_eq!(merged.period, raw.period);
        }
        assert_eq!(raw.rollup_rows, 0);
        from_rollups += merged.rollup_rows;
    }
    from_rollups
}

/// Whether `range` wholly holds an hour with a profile.
fn holds_a_rolled_hour(shots: &[Shot], range: TimeRange) -> bool {
    shots.iter().any(|(m, ..)| {
        let hour = (BASE + m * MINUTE).div_euclid(HOUR) * HOUR;
        range.start_ms <= hour && hour + HOUR <= range.end_ms
    })
}

fn shots() -> impl Strategy<Value = Vec<Shot>> {
    prop::collection::vec((0..SPAN_MINUTES, 0u8..3, 0u64..300, 1usize..20), 1..30)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn merges_read_rollups_and_answer_as_raw_samples_do(
        first in shots(),
        late in shots(),
        ranges in prop::collection::vec((-60i64..SPAN_MINUTES + 60, 1i64..SPAN_MINUTES + 120), 6),
        persist in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let all: Vec<Shot> = first.iter().chain(&late).copied().collect();
        let ranges: Vec<TimeRange> = ranges
            .into_iter()
            .map(|(start, len)| TimeRange {
                start_ms: BASE + start * MINUTE,
                end_ms: BASE + (start + len) * MINUTE,
            })
            .chain([TimeRange::ALL])
            .collect();
        {
            let store = open(dir.path());
            ingest(&store, &first);
            if persist {
                store.db().flush().unwrap();
            }
            let later = BASE + 30 * 24 * HOUR;
            let summary = store.roll_up_at(later).unwrap();
            let hours: BTreeSet<i64> =
                first.iter().map(|(m, ..)| (BASE + m * MINUTE).div_euclid(HOUR)).collect();
            prop_assert_eq!(summary.hours, hours.len());
            let days: BTreeSet<i64> = hours.iter().map(|h| h.div_euclid(24)).collect();
            prop_assert_eq!(summary.days, days.len());
            // Profiles of hours and days already rolled up, and of new ones.
            ingest(&store, &late);
            for &range in &ranges {
                let from_rollups = check(&store, &all, range);
                if holds_a_rolled_hour(&first, range) {
                    prop_assert!(from_rollups > 0, "{:?} read no rollup", range);
                }
            }
            store.roll_up_at(later).unwrap();
            for &range in &ranges {
                check(&store, &all, range);
            }
        }
        // Reopened: the rollups and the buckets they hold are read back.
        let store = open(dir.path());
        prop_assert_eq!(store.roll_up_at(BASE + 30 * 24 * HOUR).unwrap().hours, 0);
        for &range in &ranges {
            let from_rollups = check(&store, &all, range);
            if holds_a_rolled_hour(&all, range) {
                prop_assert!(from_rollups > 0, "{:?} read no rollup after reopening", range);
            }
        }
    }
}

/// A week of hourly profiles: a merge of it reads one row per stack and day, not one per
/// profile.
#[test]
fn a_week_merge_reads_daily_rollups() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    // Day-aligned week, four profiles an hour, the same 50 stacks.
    let start = BASE + 6 * HOUR;
    let shots: Vec<Shot> = (0..7 * 24 * 4)
        .map(|i| ((6 * 60) + i * 15, 0u8, 0u64, 50usize))
        .collect();
    ingest(&store, &shots);
    let summary = store.roll_up_at(start + 30 * 24 * HOUR).unwrap();
    assert_eq!((summary.hours, summary.days), (7 * 24, 7));
    let week = TimeRange {
        start_ms: start,
        end_ms: start + 7 * 24 * HOUR,
    };
    let selector = Selector::parse(&format!("{CPU}{{}}")).unwrap();
    let merged = store.merge(&selector, week).unwrap();
    let raw = store.merge_raw(&selector, week).unwrap();
    assert_eq!(merged.samples, raw.samples);
    assert_eq!(raw.rows, 7 * 24 * 4 * 50);
    assert_eq!(merged.rows, 7 * 50, "one row per stack and day");
    assert_eq!(merged.rollup_rows, merged.rows);
}

/// A pass rolls up at most `MAX_BUCKETS_PER_PASS` hours (the newest first) and leaves the
/// rest, counted, to the next passes: profiles back-dated an hour apart made one pass of
/// as many rolls as hours, each a durable write on a thread other tenants share. Merges
/// answer as raw samples do throughout.
#[test]
fn a_pass_rolls_up_a_bounded_number_of_hours() {
    use frostdb_pprof::rollup::MAX_BUCKETS_PER_PASS;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let hours = MAX_BUCKETS_PER_PASS + 44;
    let shots: Vec<Shot> = (0..hours as i64)
        .map(|h| (h * 60, 0u8, 0u64, 2usize))
        .collect();
    ingest(&store, &shots);
    let now = BASE + (hours as i64 + 48) * HOUR;
    let first = store.roll_up_at(now).unwrap();
    assert_eq!((first.hours, first.left), (MAX_BUCKETS_PER_PASS, 44));
    let all = TimeRange {
        start_ms: BASE - 24 * HOUR,
        end_ms: now,
    };
    let selector = Selector::parse(&format!("{CPU}{{}}")).unwrap();
    let raw = store.merge_raw(&selector, all).unwrap();
    assert_eq!(store.merge(&selector, all).unwrap().samples, raw.samples);
    let second = store.roll_up_at(now).unwrap();
    assert_eq!((second.hours, second.left), (44, 0));
    assert_eq!(store.merge(&selector, all).unwrap().samples, raw.samples);
    assert_eq!(raw.rows, hours * 2);
}
