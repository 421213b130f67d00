//! Recording rules against a model: random CPU profiles of two services in two
//! environments, some pushed twice, stored with rules attached (every sample per service; a
//! function anywhere in the stack; the same function as the leaf only; a selector and a
//! function together). Each rule's series equal the model's sums over the profiles stored
//! once, and equal what a merge of the same selector answers for the function; the same
//! profiles stored as Arrow rows are recorded alike.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::proto::Profile;
use frostdb_pprof::rules::{Recorder, RecordingRule, RuleLimits};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions, validate};
use frostdb_profile::{Selector, TimeRange};
use proptest::prelude::*;

const FUNCTIONS: [&str; 5] = ["main", "serve", "parse", "hash", "alloc"];
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A profile: per sample, its stack (function indexes, leaf first) and value.
#[derive(Debug, Clone)]
struct Drawn {
    service: usize,
    env: usize,
    samples: Vec<(Vec<usize>, i64)>,
    twice: bool,
}

fn drawn() -> impl Strategy<Value = Drawn> {
    (
        0..2usize,
        0..2usize,
        prop::collection::vec(
            (prop::collection::vec(0..FUNCTIONS.len(), 1..6), 1..1_000i64),
            1..12,
        ),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(service, env, samples, twice)| Drawn {
            service,
            env,
            samples,
            twice,
        })
}

/// The pprof of `d`: a location per function (id = index + 1).
fn pprof(d: &Drawn) -> Profile {
    common::cpu_profile(
        &FUNCTIONS,
        d.samples
            .iter()
            .map(|(stack, value)| (stack.as_slice(), *value)),
    )
}

fn service(i: usize) -> String {
    format!("svc-{i}")
}

fn rules() -> Vec<RecordingRule> {
    let rule =
        |name: &str, selector: &str, function: Option<&str>, leaf_only: bool| RecordingRule {
            name: name.into(),
            profile_type: CPU.into(),
            selector: selector.into(),
            function: function.map(Into::into),
            leaf_only,
            keep_labels: vec!["service_name".into()],
        };
    vec![
        rule("cpu_total", "", None, false),
        rule("parse_total", "", Some("parse"), false),
        rule("parse_self", "", Some("parse"), true),
        rule("prod_hash", "{env=\"prod\"}", Some("hash"), false),
    ]
}

/// What each rule should hold, by rule and service.
fn model(profiles: &[Drawn]) -> BTreeMap<(String, String), i64> {
    let mut out = BTreeMap::new();
    for d in profiles {
        for (stack, value) in &d.samples {
            let has = |f: &str| stack.iter().any(|&i| FUNCTIONS[i] == f);
            let leaf = FUNCTIONS[stack[0]];
            let mut add = |rule: &str| {
                *out.entry((rule.to_owned(), service(d.service)))
                    .or_insert(0) += value;
            };
            add("cpu_total");
            if has("parse") {
                add("parse_total");
            }
            if leaf == "parse" {
                add("parse_self");
            }
            if d.env == 0 && has("hash") {
                add("prod_hash");
            }
        }
    }
    out
}

/// An in-memory store counting into a recorder of [`rules`].
fn store_with_rules() -> (ProfileStore, Arc<Recorder>) {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::new(RuleLimits::default()));
    recorder.set_rules(&rules()).unwrap();
    assert!(store.attach_recorder(recorder.clone()));
    (store, recorder)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn rules_record_what_the_model_sums_and_a_merge_answers(
        profiles in prop::collection::vec(drawn(), 1..12)
    ) {
        let (store, recorder) = store_with_rules();
        for (i, d) in profiles.iter().enumerate() {
            let options = IngestOptions::default()
                .name("process_cpu")
                .labels(vec![
                    ("service_name".into(), service(d.service)),
                    ("env".into(), ["prod", "dev"][d.env].into()),
                ])
                .delta(false)
                .timestamp_ms(1_700_000_000_000 + i as i64 * 10_000);
            let profile = validate(pprof(d), store.limits()).unwrap();
            store.ingest_profile(&profile, &options).unwrap();
            if d.twice {
                // Stored once: counted once.
                let again = store.ingest_profile(&profile, &options).unwrap();
                prop_assert!(again.duplicate);
            }
        }
        let recorded: BTreeMap<(String, String), i64> = recorder
            .series()
            .into_iter()
            .map(|s| ((s.rule, s.labels[0].1.clone()), s.value))
            .collect();
        prop_assert_eq!(&recorded, &model(&profiles));
        // A merge of the rule's selector answers the same: the samples with the function.
        for ((rule, svc), value) in &recorded {
            let r = rules().into_iter().find(|r| &r.name == rule).unwrap();
            let matchers = r.selector.trim_start_matches('{').trim_end_matches('}');
            let comma = if matchers.is_empty() { "" } else { "," };
            let selector =
                Selector::parse(&format!("{CPU}{{service_name=\"{svc}\"{comma}{matchers}}}"))
                    .unwrap();
            let merged = store.merge(&selector, TimeRange::ALL).unwrap();
            let answered: i64 = merged
                .samples
                .iter()
                .filter(|&&(stack, _)| {
                    let frames = merged.symbols.frames(stack);
                    match (&r.function, r.leaf_only) {
                        (None, _) => true,
                        (Some(f), true) => frames.first().is_some_and(|x| x.display_name() == *f),
                        (Some(f), false) => frames.iter().any(|x| x.display_name() == *f),
                    }
                })
                .map(|&(_, v)| v)
                .sum();
            prop_assert_eq!(answered, *value, "{} of {}", rule, svc);
        }
    }
}

/// A drawn sample: its stack and value.
type Drawing = (Vec<usize>, i64);

/// `profiles` as Arrow sample rows (frames inline, leaf first; the profile name
/// dictionary-encoded), a batch of rows per call.
fn arrow_batches(profiles: &[Drawn]) -> Vec<arrow::array::RecordBatch> {
    use arrow::array::{
        ArrayRef, Int64Array, ListBuilder, RecordBatch, StringArray, StringBuilder,
        StringDictionaryBuilder,
    };
    // Two calls: the first half of the profiles, then the rest.
    let half = profiles.len().div_ceil(2);
    let mut out = Vec::new();
    for (part, chunk) in [&profiles[..half], &profiles[half..]]
        .into_iter()
        .enumerate()
    {
        let rows: Vec<(usize, &Drawn, &Drawing)> = chunk
            .iter()
            .enumerate()
            .flat_map(|(i, d)| d.samples.iter().map(move |s| (part * half + i, d, s)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let n = rows.len();
        let constant = |v: &str| std::sync::Arc::new(StringArray::from(vec![v; n])) as ArrayRef;
        let mut name = StringDictionaryBuilder::<arrow::datatypes::Int32Type>::new();
        let mut frames = ListBuilder::new(StringBuilder::new());
        for (_, _, (stack, _)) in &rows {
            name.append_value("process_cpu");
            for &f in stack {
                frames.values().append_value(FUNCTIONS[f]);
            }
            frames.append(true);
        }
        let text = |f: &dyn Fn(&Drawn) -> String| {
            std::sync::Arc::new(StringArray::from_iter_values(
                rows.iter().map(|(_, d, _)| f(d)),
            )) as ArrayRef
        };
        out.push(
            RecordBatch::try_from_iter([
                ("name", std::sync::Arc::new(name.finish()) as ArrayRef),
                ("sample_type", constant("cpu")),
                ("sample_unit", constant("nanoseconds")),
                ("period_type", constant("cpu")),
                ("period_unit", constant("nanoseconds")),
                ("labels.service_name", text(&|d| service(d.service))),
                ("labels.env", text(&|d| ["prod", "dev"][d.env].into())),
                (
                    "timestamp",
                    std::sync::Arc::new(Int64Array::from_iter_values(
                        rows.iter()
                            .map(|(i, _, _)| 1_700_000_000_000 + *i as i64 * 10_000),
                    )),
                ),
                (
                    "value",
                    std::sync::Arc::new(Int64Array::from_iter_values(
                        rows.iter().map(|(_, _, (_, v))| *v),
                    )),
                ),
                ("frames", std::sync::Arc::new(frames.finish())),
            ])
            .unwrap(),
        );
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    /// The Arrow samples API (what Parca Agent's Arrow records and bulk loads use) feeds the
    /// rules as pprof profiles do: the same model's sums.
    #[test]
    fn rows_stored_through_arrow_are_recorded_as_profiles_are(
        profiles in prop::collection::vec(drawn(), 1..12)
    ) {
        let (store, recorder) = store_with_rules();
        for batch in arrow_batches(&profiles) {
            store.ingest_arrow(&batch, None).unwrap();
        }
        let recorded: BTreeMap<(String, String), i64> = recorder
            .series()
            .into_iter()
            .map(|s| ((s.rule, s.labels[0].1.clone()), s.value))
            .collect();
        prop_assert_eq!(&recorded, &model(&profiles));
    }
}

#[test]
fn rules_are_refused_whole_naming_the_fault() {
    let recorder = Recorder::new(RuleLimits {
        max_rules: 2,
        max_series: 1,
    });
    let ok = rules()[1].clone();
    let refused = |rules: &[RecordingRule]| recorder.set_rules(rules).unwrap_err().to_string();
    assert!(refused(&rules()).contains("limits.max_recording_rules"));
    let mut bad = ok.clone();
    bad.name = "cpu-by-service".into();
    assert!(refused(&[bad]).contains("Prometheus metric name"));
    let mut bad = ok.clone();
    bad.profile_type = "process_cpu".into();
    assert!(refused(&[bad]).contains("profile type"));
    let mut bad = ok.clone();
    bad.selector = "{service_name=~\"(\"}".into();
    assert!(refused(&[bad]).contains("parse_total"));
    assert!(refused(&[ok.clone(), ok.clone()]).contains("two recording rules"));
    let mut bad = ok.clone();
    bad.selector = format!("{{service_name=\"{}\"}}", "x".repeat(1 << 20));
    assert!(refused(&[bad]).contains("at most"));
    let mut bad = ok.clone();
    bad.function = None;
    bad.leaf_only = true;
    assert!(refused(&[bad]).contains("leaf_only"));
    // Series /metrics could not serve: a kept label twice, or one Prometheus reserves.
    let mut bad = ok.clone();
    bad.keep_labels = vec!["service_name".into(), "service_name".into()];
    assert!(refused(&[bad]).contains("twice"));
    let mut bad = ok.clone();
    bad.keep_labels = vec!["__name__".into()];
    assert!(refused(&[bad]).contains("reserved by Prometheus"));
    // Regexes hold compiled programs for as long as the rules stand: bounded in all.
    let many = Recorder::new(RuleLimits {
        max_rules: 100,
        max_series: 1,
    });
    let with_regexes = |n: usize| -> Vec<RecordingRule> {
        (0..n)
            .map(|i| {
                let mut r = ok.clone();
                r.name = format!("cpu_{i}_total");
                let matchers: Vec<String> = (0..16).map(|j| format!("l{j}=~\"a.+{i}\"")).collect();
                r.selector = format!("{{{}}}", matchers.join(","));
                r
            })
            .collect()
    };
    many.set_rules(&with_regexes(4)).unwrap();
    // Refused at the fifth rule, which crosses the bound: the rules after it are not
    // compiled (a later rule that does not parse is not what the error names).
    let mut past = with_regexes(5);
    let mut late = ok.clone();
    late.name = "late_total".into();
    late.selector = "{l=~\"(\"}".into();
    past.push(late);
    let e = many.set_rules(&past).unwrap_err().to_string();
    assert!(e.contains("more than 64 regex matchers"), "{e}");
    // Nothing set by any of those.
    assert!(recorder.status().is_empty());
    recorder.set_rules(&[ok]).unwrap();
    assert_eq!(recorder.status().len(), 1);
}

/// An in-memory store counting into a recorder of `limits` and the first of [`rules`].
fn store_with_one_rule(limits: RuleLimits) -> (ProfileStore, Arc<Recorder>) {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::new(limits));
    recorder.set_rules(&rules()[..1]).unwrap();
    store.attach_recorder(recorder.clone());
    (store, recorder)
}

/// Stores a CPU profile of service `svc`, one sample of 5 (10 ms each) on one stack, `at`
/// ms after the first.
fn store_small(store: &ProfileStore, svc: &str, at: i64) {
    let d = Drawn {
        service: 0,
        env: 0,
        samples: vec![(vec![0, 1], 5)],
        twice: false,
    };
    let options = IngestOptions::default()
        .name("process_cpu")
        .labels(vec![("service_name".into(), svc.into())])
        .delta(false)
        .timestamp_ms(1_700_000_000_000 + at);
    store
        .ingest_profile(&validate(pprof(&d), store.limits()).unwrap(), &options)
        .unwrap();
}

#[test]
fn series_past_the_limit_are_dropped_and_counted() {
    let (store, recorder) = store_with_one_rule(RuleLimits {
        max_rules: 10,
        max_series: 1,
    });
    for (i, svc) in [0, 1, 0].into_iter().enumerate() {
        store_small(&store, &service(svc), i as i64);
    }
    // svc-0's series was first: kept, and added to; svc-1's, past the limit, dropped.
    let series = recorder.series();
    assert_eq!(series.len(), 1);
    assert_eq!(
        (series[0].labels[0].1.as_str(), series[0].value),
        ("svc-0", 10)
    );
    let status = recorder.status();
    assert_eq!((status[0].series, status[0].dropped), (1, 1));
}

#[test]
fn a_profile_repeating_its_sample_type_counts_each_rule_once_a_row() {
    // Three sample types alike: each rule matches all three, and is one entry for the
    // profile (a row costs a look at each rule, not each repetition). What it records is
    // what a merge of the type answers: every repetition's values.
    let (store, recorder) = store_with_rules();
    let d = Drawn {
        service: 0,
        env: 0,
        samples: vec![(vec![2, 0], 5), (vec![3, 1, 0], 7)],
        twice: false,
    };
    let mut p = pprof(&d);
    let cpu = p.sample_type[0];
    p.sample_type = vec![cpu; 3];
    for s in &mut p.sample {
        let v = s.value[0];
        s.value = vec![v, 2 * v, 3 * v];
    }
    let options = IngestOptions::default()
        .name("process_cpu")
        .labels(vec![("service_name".into(), service(0))])
        .delta(false)
        .timestamp_ms(1_700_000_000_000);
    store
        .ingest_profile(&validate(p, store.limits()).unwrap(), &options)
        .unwrap();
    let merged = store
        .merge(
            &Selector::parse(&format!("{CPU}{{}}")).unwrap(),
            TimeRange::ALL,
        )
        .unwrap();
    let recorded: BTreeMap<String, i64> = recorder
        .series()
        .into_iter()
        .map(|s| (s.rule.clone(), s.value))
        .collect();
    assert_eq!(merged.total(), 6 * (5 + 7));
    assert_eq!(recorded["cpu_total"], merged.total());
    assert_eq!(recorded["parse_total"], 6 * 5, "{recorded:?}");
}

/// A series keeps at most 1 KiB of label values: one whose kept values pass it (a
/// service name of 1,025 bytes, within the label limits) is dropped and counted, so no
/// tenant keeps hundreds of megabytes of series for the server's life; a short one beside
/// it is kept.
#[test]
fn a_series_keeping_more_than_its_bytes_is_dropped_and_counted() {
    let (store, recorder) = store_with_one_rule(RuleLimits::default());
    let long = "s".repeat(frostdb_pprof::rules::MAX_KEPT_BYTES + 1);
    for (i, svc) in [long.as_str(), "svc-0"].into_iter().enumerate() {
        store_small(&store, svc, i as i64);
    }
    let series = recorder.series();
    assert_eq!(series.len(), 1, "only the short series is kept");
    assert_eq!(series[0].labels[0].1, "svc-0");
    let status = recorder.status();
    assert_eq!((status[0].series, status[0].dropped), (1, 1));
}

/// A store with one rule, `tagged`, counting CPU profiles whose `tag` matches a regex.
/// The synthetic profile of `samples` samples, sample `i` of the value and `tag` label
/// `sample(i)` gives.
fn tagged(samples: usize, sample: impl Fn(usize) -> (i64, String)) -> Profile {
    use frostdb_pprof::proto::Label;
    let mut p: Profile = frostdb_pprof::testing::profile(0, samples, 3);
    let key = p.string_table.len() as i64;
    p.string_table.push("tag".into());
    for (i, s) in p.sample.iter_mut().enumerate() {
        let (value, tag) = sample(i);
        s.value = vec![value];
        p.string_table.push(tag);
        s.label = vec![Label {
            key,
            str: p.string_table.len() as i64 - 1,
            ..Label::default()
        }];
    }
    p
}

/// `{i}x`, padded with `a` to `bytes` bytes.
fn padded(i: usize, bytes: usize) -> String {
    let mut tag = format!("{i}x");
    tag.extend(std::iter::repeat_n('a', bytes - tag.len()));
    tag
}

/// Stores `p` as service 0's CPU profile, `at` ms after the tests' time.
fn store_cpu(store: &ProfileStore, p: Profile, at: i64) {
    let options = IngestOptions::default()
        .name("process_cpu")
        .labels(vec![("service_name".into(), service(0))])
        .delta(false)
        .timestamp_ms(1_700_000_000_000 + at);
    store
        .ingest_profile(&validate(p, store.limits()).unwrap(), &options)
        .unwrap();
}

fn store_with_a_tag_rule() -> (ProfileStore, Arc<Recorder>) {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let recorder = Arc::new(Recorder::new(RuleLimits::default()));
    recorder
        .set_rules(&[RecordingRule {
            name: "tagged".into(),
            profile_type: CPU.into(),
            selector: "{tag=~\".*x.*\"}".into(),
            function: None,
            leaf_only: false,
            keep_labels: vec!["service_name".into()],
        }])
        .unwrap();
    store.attach_recorder(recorder.clone());
    (store, recorder)
}

/// A rule's regexes test at most 16 MiB of one profile's label values: a profile of
/// thousands of label sets of long values is not counted by the rule (and counted as
/// dropped) rather than tested for minutes where nothing can stop it; a small one is.
#[test]
fn a_profile_of_more_label_bytes_than_rules_may_test_is_dropped_and_counted() {
    let (store, recorder) = store_with_a_tag_rule();
    // `samples` samples of 10 each, every one labelled with its own `tag` of `bytes` bytes.
    let push = |samples: usize, bytes: usize, at: i64| {
        store_cpu(&store, tagged(samples, |i| (10, padded(i, bytes))), at);
    };
    // 9,000 label sets of 2,000 bytes: 18 MB to test.
    push(9_000, 2_000, 0);
    push(10, 2_000, 1);
    let series = recorder.series();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].value, 100, "only the small profile is counted");
    assert_eq!(recorder.status()[0].dropped, 1);
}

/// Rows stored through the Arrow samples API are bounded as a profile is: a call whose
/// series' label values would have a rule's regexes test more than the bound is not
/// counted by that rule, and counted as dropped; a small call after it is counted.
#[test]
fn a_call_of_more_label_bytes_than_rules_may_test_is_dropped_and_counted() {
    use arrow::array::{ArrayRef, RecordBatch, StringArray};
    let (store, recorder) = store_with_a_tag_rule();
    // `rows` rows of 10 each, each its own series: a `tag` of `bytes` bytes.
    let call = |rows: usize, bytes: usize, at: i64| {
        let mut p: Profile = frostdb_pprof::testing::profile(0, rows, 3);
        for s in &mut p.sample {
            s.value = vec![10];
        }
        let batch = frostdb_pprof::testing::arrow_samples(
            &p,
            "process_cpu",
            &[("service_name", &service(0))],
            1_700_000_000_000 + at,
        );
        let tags: Vec<String> = (0..batch.num_rows())
            .map(|i| {
                let mut tag = format!("{i}x");
                tag.extend(std::iter::repeat_n('a', bytes - tag.len()));
                tag
            })
            .collect();
        let mut columns: Vec<(String, ArrayRef)> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, c)| (f.name().clone(), c.clone()))
            .collect();
        columns.push((
            frostdb_profile::schema::column::label_column("tag"),
            std::sync::Arc::new(StringArray::from(tags)),
        ));
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        store.ingest_arrow(&batch, None).unwrap();
    };
    // 9,000 series of 2,000-byte tags in one call: 18 MB to test.
    call(9_000, 2_000, 0);
    call(10, 2_000, 1);
    let series = recorder.series();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].value, 100, "only the small call is counted");
    assert_eq!(recorder.status()[0].dropped, 1);
}

/// Label sets whose samples are all 0 store nothing, and rules do not test them: a profile
/// of 9,000 such sets of 2,000-byte values and one real sample is counted (before, the
/// empty sets used up the regex's bytes and the real value was dropped).
#[test]
fn label_sets_that_store_nothing_are_not_tested_by_rules() {
    let (store, recorder) = store_with_a_tag_rule();
    let profile = tagged(9_001, |i| match i {
        9_000 => (10, format!("{i}x")),
        _ => (0, padded(i, 2_000)),
    });
    store_cpu(&store, profile, 0);
    let series = recorder.series();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].value, 10);
    assert_eq!(recorder.status()[0].dropped, 0);
}

/// A store in memory whose CPU profiles `recorder` counts by one rule: the samples whose
/// stack holds `main`.
fn counting_main(recorder: Recorder) -> (ProfileStore, Arc<Recorder>) {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let recorder = Arc::new(recorder);
    recorder
        .set_rules(&[RecordingRule {
            name: "main".into(),
            profile_type: CPU.into(),
            selector: "{}".into(),
            function: Some("main".into()),
            leaf_only: false,
            keep_labels: vec![],
        }])
        .unwrap();
    assert_eq!(recorder.memory_bytes(), 0, "nothing counted yet");
    store.attach_recorder(recorder.clone());
    (store, recorder)
}

/// The stack cache of a rule naming a function stays within its bound inside one profile
/// of more distinct stacks than it may hold, and gives its memory back when the rules
/// change (a cleared table kept its room for the server's life).
#[test]
fn the_rules_stack_cache_keeps_its_bound_within_a_profile() {
    let (store, recorder) =
        counting_main(Recorder::new(RuleLimits::default()).with_stack_cache(64));
    let p: Profile = frostdb_pprof::testing::profile(0, 1_000, 3);
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    store_cpu(&store, p, 0);
    let (len, capacity) = recorder.stack_cache();
    assert!(
        len <= 64 && capacity <= 128,
        "{len} stacks in room for {capacity}"
    );
    // Every sample holds main: all 1,000 counted, cache or not.
    let series = recorder.series();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].value, total);
    recorder.set_rules(&[]).unwrap();
    assert_eq!(recorder.stack_cache(), (0, 0));
}

/// What a recorder holds is counted (its stack cache and its series), and its stack cache
/// is given back when forgotten (a tenant closing), its series kept.
#[test]
fn a_recorders_memory_is_counted_and_its_stack_cache_forgotten() {
    let (store, recorder) = counting_main(Recorder::new(RuleLimits::default()));
    store_cpu(&store, frostdb_pprof::testing::profile(0, 1_000, 3), 0);
    let cache = recorder.stack_cache_bytes();
    let (len, capacity) = recorder.stack_cache();
    assert!(
        len > 0 && cache >= capacity * 33,
        "{len} stacks, {cache} bytes"
    );
    assert!(recorder.series_bytes() > 0);
    assert_eq!(recorder.memory_bytes(), cache + recorder.series_bytes());
    let series = recorder.series();
    recorder.forget_stacks();
    assert_eq!(recorder.stack_cache(), (0, 0));
    assert_eq!(recorder.memory_bytes(), recorder.series_bytes());
    assert_eq!(recorder.series(), series, "the series stay");
}
