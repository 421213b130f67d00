//! Regressions against what the synthetic profiles were drawn from: two versions of a
//! service, each profile a few thousand samples drawn from a distribution over six stacks
//! (enough for a rise of three percentage points to stand out of the noise of 20 profiles).
//! When both versions draw from one distribution, no regression is reported; when one
//! stack's probability rises (its leaf function's share grows by one and a half times the
//! threshold, so the observed rise clears it), that function is reported, self, and nothing
//! else is. The comparison reads the store (`ProfileStore::profiles`), so the per-profile
//! read is checked with it: every profile stored is counted, with its total.
//!
//! The test is statistical, so its cases come from a fixed seed: a run cannot flake, and the
//! false positive rate it checks is that of the 48 cases below, none allowed.

use crate::common;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::proto::Profile;
use frostdb_pprof::regress::{CompareOptions, compare};
use frostdb_pprof::{IngestOptions, ProfileStore, ReadOptions, StoreOptions, validate};
use frostdb_profile::{Selector, TimeRange};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

const FUNCTIONS: [&str; 7] = ["main", "work", "parse", "compute", "encode", "gc", "io"];
/// The stacks, leaf first, as indexes into [`FUNCTIONS`].
const STACKS: [&[usize]; 6] = [
    &[2, 1, 0],
    &[3, 1, 0],
    &[4, 1, 0],
    &[5],
    &[6, 0],
    &[4, 6, 0],
];
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

use frostdb_core::testing::SplitMix as Rng;

/// Counts per stack of `samples` draws from `p`.
fn draw(p: &[f64], samples: usize, rng: &mut Rng) -> Vec<i64> {
    let mut counts = vec![0i64; p.len()];
    for _ in 0..samples {
        let mut u = rng.unit();
        let mut k = p.len() - 1;
        for (i, &pi) in p.iter().enumerate() {
            if u < pi {
                k = i;
                break;
            }
            u -= pi;
        }
        counts[k] += 1;
    }
    counts
}

/// The pprof of one profile: a sample per stack with its count (times the 10 ms period).
fn pprof(counts: &[i64]) -> Profile {
    common::cpu_profile(
        &FUNCTIONS,
        STACKS
            .iter()
            .zip(counts)
            .filter(|(_, c)| **c > 0)
            .map(|(stack, c)| (*stack, c * 10_000_000)),
    )
}

/// A case: the stacks' weights, the profiles of each version, samples per profile, the
/// stack whose probability rises (when one does), and the samples' seed.
#[derive(Debug, Clone)]
struct Case {
    weights: Vec<u32>,
    profiles: (usize, usize),
    samples: usize,
    grows: Option<usize>,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(5..100u32, STACKS.len()),
        (20..40usize, 20..40usize),
        2_000..5_000usize,
        prop::option::of(0..STACKS.len()),
        any::<u64>(),
    )
        .prop_map(|(weights, profiles, samples, grows, seed)| Case {
            weights,
            profiles,
            samples,
            grows,
            seed,
        })
}

fn store_version(store: &ProfileStore, version: &str, p: &[f64], case: &Case, rng: &mut Rng) {
    let n = if version == "1" {
        case.profiles.0
    } else {
        case.profiles.1
    };
    let drawn: Vec<_> = (0..n)
        .map(|i| {
            let profile = validate(pprof(&draw(p, case.samples, rng)), store.limits()).unwrap();
            let options = IngestOptions::default()
                .name("process_cpu")
                .labels(vec![
                    ("service_name".into(), "api".into()),
                    ("version".into(), version.into()),
                    // Two replicas: profiles of one time are apart by series.
                    ("pod".into(), format!("api-{}", i % 2)),
                ])
                .delta(false)
                .timestamp_ms(1_700_000_000_000 + (i as i64 / 2) * 10_000);
            (profile, options)
        })
        .collect();
    let refs: Vec<_> = drawn.iter().map(|(p, o)| (p, o)).collect();
    store.ingest_all(&refs).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        rng_seed: RngSeed::Fixed(0x5eed_2026),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]
    #[test]
    fn a_regression_is_reported_exactly_when_a_share_grew(case in case()) {
        let options = CompareOptions {
            min_increase: 0.02,
            ..CompareOptions::default()
        };
        let sum: f64 = case.weights.iter().map(|&w| f64::from(w)).sum();
        let before: Vec<f64> = case.weights.iter().map(|&w| f64::from(w) / sum).collect();
        let mut after = before.clone();
        if let Some(k) = case.grows {
            // Stack k's probability rises by 1.5 thresholds, the others shrink in proportion.
            let rise = 1.5 * options.min_increase;
            let rest = 1.0 - before[k];
            for (i, p) in after.iter_mut().enumerate() {
                *p = if i == k { before[k] + rise } else { *p * (rest - rise) / rest };
            }
        }
        let store = ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap();
        let mut rng = Rng(case.seed);
        store_version(&store, "1", &before, &case, &mut rng);
        store_version(&store, "2", &after, &case, &mut rng);
        let read = |v: &str| {
            let selector =
                Selector::parse(&format!("{CPU}{{service_name=\"api\",version=\"{v}\"}}")).unwrap();
            store.profiles(&selector, TimeRange::ALL, ReadOptions::STRICT).unwrap()
        };
        let (b, a) = (read("1"), read("2"));
        // Every profile stored is read, each with all its samples.
        prop_assert_eq!(b.stacks.profiles.len(), case.profiles.0);
        prop_assert_eq!(a.stacks.profiles.len(), case.profiles.1);
        for p in b.stacks.profiles.iter().chain(&a.stacks.profiles) {
            let total: i64 = p.stacks.iter().map(|(_, v)| v).sum();
            prop_assert_eq!(total, case.samples as i64 * 10_000_000);
        }
        let found = compare(&b, &a, &options).unwrap();
        prop_assert_eq!(found.before.profiles, case.profiles.0);
        prop_assert_eq!(found.after.profiles, case.profiles.1);
        let reported: Vec<&str> = found.regressions.iter().map(|r| r.function.as_str()).collect();
        match case.grows {
            None => prop_assert!(reported.is_empty(), "false positives: {:?}", found.regressions),
            Some(k) => {
                let leaf = FUNCTIONS[STACKS[k][0]];
                let r = found.regressions.iter().find(|r| r.function == leaf);
                prop_assert!(r.is_some(), "{} not reported: {:?}", leaf, found);
                let r = r.unwrap();
                prop_assert!(r.kind.contains("self"), "{:?}", r);
                prop_assert!(r.self_after - r.self_before >= options.min_increase, "{:?}", r);
                // Only the grown stack's functions can rise: its leaf, and callers only it
                // and shrinking stacks share (encode is the leaf of two stacks).
                for other in &reported {
                    prop_assert!(STACKS[k].iter().any(|&f| FUNCTIONS[f] == *other), "{} reported too: {:?}", other, found);
                }
            }
        }
    }
}

#[test]
fn too_few_profiles_and_different_types_are_refused_by_name() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let case = Case {
        weights: vec![1; STACKS.len()],
        profiles: (3, 3),
        samples: 100,
        grows: None,
        seed: 1,
    };
    let p = vec![1.0 / STACKS.len() as f64; STACKS.len()];
    let mut rng = Rng(7);
    store_version(&store, "1", &p, &case, &mut rng);
    store_version(&store, "2", &p, &case, &mut rng);
    let read = |s: &str| {
        store
            .profiles(
                &Selector::parse(s).unwrap(),
                TimeRange::ALL,
                ReadOptions::STRICT,
            )
            .unwrap()
    };
    let b = read(&format!("{CPU}{{version=\"1\"}}"));
    let a = read(&format!("{CPU}{{version=\"2\"}}"));
    let error = compare(&b, &a, &CompareOptions::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the before side has 3 profiles; a comparison needs at least 10"
    );
    // Past the function ids a side may keep (6 stacks naming 15 in all), refused naming
    // the side, before the side is kept whole.
    let few = CompareOptions {
        min_profiles: 1,
        max_side_functions: 10,
        ..CompareOptions::default()
    };
    let error = compare(&b, &a, &few).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the before side's distinct stacks name more than 10 functions in all; it is not compared"
    );
    let enough = CompareOptions {
        max_side_functions: 15,
        ..few
    };
    compare(&b, &a, &enough).unwrap();
    let other = read("memory:alloc_space:bytes:space:bytes{}");
    assert!(other.stacks.profiles.is_empty());
    let error = compare(&b, &other, &CompareOptions::default()).unwrap_err();
    assert!(
        error.to_string().contains("different profile types"),
        "{error}"
    );
}
