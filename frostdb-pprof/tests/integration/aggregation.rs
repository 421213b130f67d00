//! Merges that combine each series' profiles over a range by summing, averaging (gauges such
//! as memory in use) or taking the latest, and keep series apart for labelled exports,
//! checked against a model of the profiles stored.

use std::collections::BTreeMap;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::report::pprof;
use frostdb_pprof::{Aggregation, IngestOptions, MergeOptions, ProfileStore, StoreOptions};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use proptest::prelude::*;
use prost::Message;

const BASE: i64 = 1_700_000_000_000;
const MINUTE: i64 = 60_000;
/// Samples (distinct stacks) per profile.
const STACKS: usize = 40;
const SELECTOR: &str = "memory:cpu:nanoseconds:cpu:nanoseconds{}";

/// A profile stored: its series (`pod`), minute and scale (each stack's value times it).
type Shot = (u8, i64, i64);

/// The base profile's value of each stack.
fn stack_values() -> Vec<i64> {
    frostdb_pprof::testing::profile(0, STACKS, 3)
        .sample
        .iter()
        .map(|s| s.value[0])
        .collect()
}

fn ingest(store: &ProfileStore, shots: &[Shot]) {
    for &(pod, minute, scale) in shots {
        let mut p = frostdb_pprof::testing::profile(0, STACKS, 3);
        for s in &mut p.sample {
            s.value[0] *= scale;
        }
        let options = IngestOptions::default()
            .name("memory")
            .labels(vec![
                ("pod".into(), format!("p{pod}")),
                ("service_name".into(), "api".into()),
            ])
            .timestamp_ms(BASE + minute * MINUTE);
        store.ingest(&p.encode_to_vec(), &options).unwrap();
    }
}

/// The model's total of `aggregation` over `range`: per series, its profiles in the range
/// (different ones at one time add up; the same one twice is stored once) summed, averaged
/// per stack, or its latest. An average is rounded once per stack over every series merged
/// (the merge); kept apart, the series share each stack's rounded value (they add up to
/// it), each within one of its exact value (the second: per series, per stack).
fn model(
    shots: &[Shot],
    range: TimeRange,
    aggregation: Aggregation,
) -> (i64, Vec<Vec<f64>>, usize) {
    let values = stack_values();
    let mut series: BTreeMap<u8, BTreeMap<i64, i64>> = BTreeMap::new();
    let distinct: std::collections::BTreeSet<Shot> = shots.iter().copied().collect();
    for (pod, minute, scale) in distinct {
        let t = BASE + minute * MINUTE;
        if range.start_ms <= t && t < range.end_ms {
            *series.entry(pod).or_default().entry(t).or_default() += scale;
        }
    }
    // Per series, per stack, its value (exact: averages as fractions).
    let per_series: Vec<Vec<f64>> = series
        .values()
        .map(|times| {
            let sum: i64 = times.values().sum();
            let n = times.len() as f64;
            let latest = *times.values().next_back().unwrap();
            values
                .iter()
                .map(|&v| match aggregation {
                    Aggregation::Sum => (v * sum) as f64,
                    Aggregation::Average => (v * sum) as f64 / n,
                    Aggregation::Latest => (v * latest) as f64,
                })
                .collect()
        })
        .collect();
    let merged = (0..values.len())
        .map(|k| per_series.iter().map(|s| s[k]).sum::<f64>().round() as i64)
        .sum();
    (merged, per_series, series.len())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn merges_sum_average_or_take_the_latest_of_each_series(
        shots in prop::collection::vec((0u8..4, 0i64..60, 1i64..6), 1..25),
        ranges in prop::collection::vec((0i64..60, 1i64..70), 4),
        persist in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), DbOptions::default()).unwrap();
        let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
        ingest(&store, &shots);
        if persist {
            store.db().flush().unwrap();
        }
        let selector = Selector::parse(SELECTOR).unwrap();
        let ranges = ranges
            .into_iter()
            .map(|(start, len)| TimeRange {
                start_ms: BASE + start * MINUTE,
                end_ms: BASE + (start + len) * MINUTE,
            })
            .chain([TimeRange::ALL]);
        for range in ranges {
            for aggregation in [Aggregation::Sum, Aggregation::Average, Aggregation::Latest] {
                let (want, exact, series) = model(&shots, range, aggregation);
                for by_series in [false, true] {
                    let options = MergeOptions { aggregation, by_series, lenient: false };
                    let merged = store.merge_with(&selector, range, &options).unwrap();
                    prop_assert_eq!(merged.total(), want, "{:?} {:?}", range, options);
                    if !by_series {
                        prop_assert!(merged.series.is_empty());
                        continue;
                    }
                    // Each series apart, labelled, adding up to the merge.
                    prop_assert_eq!(merged.series.len(), series);
                    let per_series: i64 =
                        merged.series.iter().flat_map(|(_, s)| s).map(|(_, v)| v).sum();
                    prop_assert_eq!(per_series, want);
                    // Each series' share of a stack within one of its exact value (series
                    // and stacks in the same order: pods by name, stacks by value).
                    for ((_, stacks), exact) in merged.series.iter().zip(&exact) {
                        let mut got: Vec<i64> = stacks.iter().map(|(_, v)| *v).collect();
                        let mut exact = exact.clone();
                        got.sort_unstable();
                        exact.sort_by(f64::total_cmp);
                        prop_assert!(got.len() <= exact.len());
                        let off = exact.len() - got.len();
                        for (g, e) in got.iter().zip(&exact[off..]) {
                            prop_assert!((*g as f64 - e).abs() < 1.0, "{} against {}", g, e);
                        }
                    }
                    let p = pprof::to_profile(&merged).unwrap();
                    let label = |s: &frostdb_pprof::proto::Sample, k: &str| {
                        s.label
                            .iter()
                            .find(|l| p.string_table[l.key as usize] == k)
                            .map(|l| p.string_table[l.str as usize].clone())
                    };
                    let mut pods = std::collections::BTreeSet::new();
                    for s in &p.sample {
                        let service = label(s, "service_name");
                        prop_assert_eq!(service.as_deref(), Some("api"));
                        pods.insert(label(s, "pod").unwrap());
                    }
                    prop_assert_eq!(pods.len(), series);
                    prop_assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), want);
                }
            }
        }
        // The time series, grouped, averaged per step: a step's profiles (a pod's at a time)
        // summed over how many there are. Grouped by service, pods profiled at the same time
        // are as many profiles (they were counted as one: the average was their sum).
        let total: i64 = stack_values().iter().sum();
        let mut profiles: BTreeMap<(u8, i64), i64> = BTreeMap::new();
        let distinct: std::collections::BTreeSet<Shot> = shots.iter().copied().collect();
        for (pod, minute, scale) in distinct {
            *profiles.entry((pod, BASE + minute * MINUTE)).or_default() += total * scale;
        }
        for (group, step) in [("service_name", 5 * MINUTE), ("pod", 2 * MINUTE)] {
            let mut want: BTreeMap<(String, i64), (i64, u64)> = BTreeMap::new();
            for (&(pod, t), &value) in &profiles {
                let name = match group {
                    "pod" => format!("p{pod}"),
                    _ => "api".to_owned(),
                };
                let point = want.entry((name, t - t.rem_euclid(step))).or_default();
                point.0 += value;
                point.1 += 1;
            }
            let by = [group.to_owned()];
            let series = store
                .range(&selector, TimeRange::ALL, step, Some(&by), frostdb_pprof::ReadOptions::STRICT)
                .unwrap()
                .value;
            let mut got: BTreeMap<(String, i64), f64> = BTreeMap::new();
            for s in &series {
                prop_assert_eq!(s.labels.len(), 1);
                for (t, v) in s.values(true) {
                    got.insert((s.labels[0].1.clone(), t), v);
                }
            }
            let want: BTreeMap<(String, i64), f64> = want
                .into_iter()
                .map(|(k, (sum, n))| (k, sum as f64 / n as f64))
                .collect();
            prop_assert_eq!(got, want, "grouped by {}", group);
        }
        // A plain sum is the store's merge.
        let sum = store
            .merge_with(&selector, TimeRange::ALL, &MergeOptions::default())
            .unwrap();
        prop_assert_eq!(sum.total(), store.merge(&selector, TimeRange::ALL).unwrap().total());
    }
}

/// Four pods' averages of a third (their profiles' values 1, 1 and 2 times the base): a
/// labelled export holds what the merge shows, each stack's value shared out among the
/// series. Rounded per series, each pod's 4/3 was 1, so the export held 4 of a stack the
/// merge showed as 5.
#[test]
fn an_averaged_export_of_series_apart_adds_up_to_the_merge() {
    let dir = tempfile::tempdir().unwrap();
    let store = ProfileStore::open(
        Db::open(dir.path(), DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let shots: Vec<Shot> = (0..4u8)
        .flat_map(|pod| [(pod, 0, 1), (pod, 1, 1), (pod, 2, 2)])
        .collect();
    ingest(&store, &shots);
    let selector = Selector::parse(SELECTOR).unwrap();
    let (want, _, _) = model(&shots, TimeRange::ALL, Aggregation::Average);
    let options = MergeOptions {
        aggregation: Aggregation::Average,
        by_series: true,
        lenient: false,
    };
    let merged = store
        .merge_with(&selector, TimeRange::ALL, &options)
        .unwrap();
    assert_eq!(merged.total(), want);
    let p = pprof::to_profile(&merged).unwrap();
    assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), want);
}

/// A goroutine profile every minute for ten minutes: stack 1 has one goroutine in nine
/// of them, stack 2 three in every one, and stack 3, whose goroutines carry the pprof label
/// `endpoint=/slow`, fifty in the two profiles of minutes 3 and 4. Averaged, each label
/// set is divided by its target's ten profiles (stack 3 is 10, not 50) and rounded once
/// (stack 1 is 0.9: 1, not 0); the latest is the last profile's, which has no `/slow`.
#[test]
fn an_average_divides_sample_labels_by_their_targets_profiles_and_rounds_once() {
    use frostdb_pprof::proto::{Function, Label, Line, Location, Profile, Sample, ValueType};
    let dir = tempfile::tempdir().unwrap();
    let store = ProfileStore::open(
        Db::open(dir.path(), DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let strings: Vec<String> = [
        "",
        "goroutine",
        "count",
        "f1",
        "f2",
        "f3",
        "endpoint",
        "/slow",
    ]
    .map(str::to_owned)
    .to_vec();
    for minute in 0..10i64 {
        let mut sample = vec![Sample {
            location_id: vec![2],
            value: vec![3],
            ..Default::default()
        }];
        if minute != 9 {
            sample.push(Sample {
                location_id: vec![1],
                value: vec![1],
                ..Default::default()
            });
        }
        if minute == 3 || minute == 4 {
            sample.push(Sample {
                location_id: vec![3],
                value: vec![50],
                label: vec![Label {
                    key: 6,
                    str: 7,
                    ..Default::default()
                }],
            });
        }
        let p = Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample,
            location: (1..=3)
                .map(|i| Location {
                    id: i,
                    line: vec![Line {
                        function_id: i,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            function: (1..=3)
                .map(|i| Function {
                    id: i,
                    name: 2 + i as i64,
                    ..Default::default()
                })
                .collect(),
            string_table: strings.clone(),
            period_type: Some(ValueType { r#type: 1, unit: 2 }),
            period: 1,
            ..Default::default()
        };
        let options = IngestOptions::default()
            .name("goroutines")
            .labels(vec![("pod".into(), "p0".into())])
            .timestamp_ms(BASE + minute * MINUTE);
        store.ingest(&p.encode_to_vec(), &options).unwrap();
    }
    let selector = Selector::parse("goroutines:goroutine:count:goroutine:count{}").unwrap();
    let by_function = |aggregation, by_series| {
        let options = MergeOptions {
            aggregation,
            by_series,
            lenient: false,
        };
        let merged = store
            .merge_with(&selector, TimeRange::ALL, &options)
            .unwrap();
        let mut values = BTreeMap::new();
        for (stack, v) in &merged.samples {
            let frames = merged.symbols.frames(*stack);
            values.insert(frames[0].printable_name().into_owned(), *v);
        }
        values
    };
    let want = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(f, v)| ((*f).to_owned(), *v)).collect()
    };
    for by_series in [false, true] {
        assert_eq!(
            by_function(Aggregation::Average, by_series),
            want(&[("f1", 1), ("f2", 3), ("f3", 10)])
        );
        assert_eq!(
            by_function(Aggregation::Latest, by_series),
            want(&[("f2", 3)])
        );
        assert_eq!(
            by_function(Aggregation::Sum, by_series),
            want(&[("f1", 9), ("f2", 30), ("f3", 100)])
        );
    }
    // The time series of the pod, one point: its ten profiles' totals (139) over ten
    // profiles, not over its twelve totals rows (the two `/slow` ones are of profiles
    // counted already).
    let pod = ["pod".to_owned()];
    let series = store
        .range(
            &selector,
            TimeRange::ALL,
            1_000_000_000_000,
            Some(&pod),
            frostdb_pprof::ReadOptions::STRICT,
        )
        .unwrap()
        .value;
    assert_eq!(series.len(), 1);
    let points: Vec<(i64, f64)> = series[0].values(true).collect();
    assert_eq!(points, [(1_000_000_000_000, 13.9)]);
    // Profile by profile (what a comparison tests over): ten, each with its labelled
    // stacks, not twelve fragments.
    let profiles = store
        .profiles(
            &selector,
            TimeRange::ALL,
            frostdb_pprof::ReadOptions::STRICT,
        )
        .unwrap();
    assert_eq!(profiles.stacks.profiles.len(), 10);
    let stacks: Vec<usize> = profiles
        .stacks
        .profiles
        .iter()
        .map(|p| p.stacks.len())
        .collect();
    assert_eq!(stacks, [2, 2, 2, 3, 3, 2, 2, 2, 2, 1]);
}

#[test]
fn gauges_average_by_default_and_the_rest_sum() {
    let of = |t: &str| Aggregation::default_for(&Selector::parse(t).unwrap().profile_type.unwrap());
    assert_eq!(
        of("memory:inuse_space:bytes:space:bytes{}"),
        Aggregation::Average
    );
    assert_eq!(
        of("memory:inuse_objects:count:space:bytes{}"),
        Aggregation::Average
    );
    assert_eq!(
        of("goroutines:goroutine:count:goroutine:count{}"),
        Aggregation::Average
    );
    assert_eq!(
        of("memory:alloc_space:bytes:space:bytes{}"),
        Aggregation::Sum
    );
    assert_eq!(
        of("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}"),
        Aggregation::Sum
    );
    assert_eq!(Aggregation::parse("avg"), Ok(Aggregation::Average));
    assert_eq!(Aggregation::parse("LATEST"), Ok(Aggregation::Latest));
    assert!(
        Aggregation::parse("max")
            .unwrap_err()
            .contains("sum, average or latest")
    );
}
