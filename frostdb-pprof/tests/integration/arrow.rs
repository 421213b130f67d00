//! Samples given as Arrow columns (`ProfileStore::ingest_arrow`): stored as a model sums
//! them (merges, series over time, label values, after a reopen), as the same profiles
//! stored through pprof, and bad batches refused naming the fault with nothing stored.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Int32Array, Int64Array, ListBuilder, RecordBatch, StringArray, StringBuilder,
    StringDictionaryBuilder, TimestampSecondArray, UInt64Array,
};
use arrow::datatypes::Int32Type;
use frostdb_core::{Db, DbOptions, ErrorKind};
use frostdb_pprof::{
    IngestOptions, LabelLimits, Limits, ProfileStore, ReadOptions, StoreOptions, testing, validate,
};
use frostdb_profile::{Selector, TimeRange};
use proptest::prelude::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A row of the model: series labels, time, stack (function names, leaf first), value.
#[derive(Debug, Clone)]
struct Row {
    pod: String,
    container: Option<String>,
    timestamp: i64,
    stack: Vec<String>,
    value: i64,
}

/// The rows as a samples batch, stacks inline (`frames`) or by id into a stacks batch.
fn batches(rows: &[Row], by_id: bool) -> (RecordBatch, Option<RecordBatch>) {
    let n = rows.len();
    let constant = |v: &str| Arc::new(StringArray::from(vec![v; n])) as ArrayRef;
    // The profile name dictionary-encoded, as an embedder holding Arrow already may send it.
    let mut name = StringDictionaryBuilder::<Int32Type>::new();
    for _ in rows {
        name.append_value("process_cpu");
    }
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("name", Arc::new(name.finish())),
        ("sample_type", constant("cpu")),
        ("sample_unit", constant("nanoseconds")),
        ("period_type", constant("cpu")),
        ("period_unit", constant("nanoseconds")),
        (
            "labels.pod",
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.pod))),
        ),
        (
            "labels.container",
            Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r.container.as_deref()),
            )),
        ),
        (
            "timestamp",
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.timestamp),
            )),
        ),
        (
            "value",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.value))),
        ),
    ];
    if !by_id {
        columns.push(("frames", Arc::new(frames(rows.iter().map(|r| &r.stack)))));
        return (RecordBatch::try_from_iter(columns).unwrap(), None);
    }
    // Ids as a caller's own: the stack's position in a list of distinct stacks, spread out.
    let distinct: Vec<&Vec<String>> = rows
        .iter()
        .map(|r| &r.stack)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let id = |s: &Vec<String>| distinct.iter().position(|d| *d == s).unwrap() as u64 * 7919 + 3;
    columns.push((
        "stacktrace_id",
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| id(&r.stack)),
        )),
    ));
    let stacks = RecordBatch::try_from_iter([
        (
            "stacktrace_id",
            Arc::new(UInt64Array::from_iter_values(
                distinct.iter().map(|s| id(s)),
            )) as ArrayRef,
        ),
        ("frames", Arc::new(frames(distinct.iter().copied()))),
    ])
    .unwrap();
    (RecordBatch::try_from_iter(columns).unwrap(), Some(stacks))
}

fn frames<'a>(stacks: impl Iterator<Item = &'a Vec<String>>) -> arrow::array::ListArray {
    let mut b = ListBuilder::new(StringBuilder::new());
    for stack in stacks {
        for f in stack {
            b.values().append_value(f);
        }
        b.append(true);
    }
    b.finish()
}

/// Per stack (root first, as merges name them), the model's sum over `rows` matching `keep`.
fn model_stacks(rows: &[Row], keep: impl Fn(&Row) -> bool) -> BTreeMap<Vec<String>, i64> {
    let mut out = BTreeMap::new();
    for r in rows.iter().filter(|r| keep(r) && r.value != 0) {
        let root_first: Vec<String> = r.stack.iter().rev().cloned().collect();
        *out.entry(root_first).or_insert(0) += r.value;
    }
    out.retain(|_, v| *v != 0);
    out
}

/// Per stack (root first), the store's merge of `selector` over everything.
fn merged_stacks(store: &ProfileStore, selector: &str) -> BTreeMap<Vec<String>, i64> {
    let merged = store
        .merge(&Selector::parse(selector).unwrap(), TimeRange::ALL)
        .unwrap();
    let mut out = BTreeMap::new();
    frostdb_pprof::report::tree::each_named_stack(&merged, |root_first, value| {
        let stack: Vec<String> = root_first.iter().map(|s| s.to_string()).collect();
        *out.entry(stack).or_insert(0) += value;
    });
    out.retain(|_, v| *v != 0);
    out
}

/// Per pod, the sum per timestamp, from the store's series over time (which read totals).
fn stored_points(store: &ProfileStore) -> BTreeMap<(String, i64), i64> {
    let series = store
        .range(
            &Selector::parse(&format!("{CPU}{{}}")).unwrap(),
            TimeRange::ALL,
            1,
            Some(&["pod".to_owned()]),
            ReadOptions::STRICT,
        )
        .unwrap()
        .value;
    let mut out = BTreeMap::new();
    for s in series {
        let pod = s.labels[0].1.clone();
        for (t, v) in s.points {
            *out.entry((pod.clone(), t)).or_insert(0) += v;
        }
    }
    out.retain(|_, v| *v != 0);
    out
}

fn model_points(rows: &[Row]) -> BTreeMap<(String, i64), i64> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry((r.pod.clone(), r.timestamp)).or_insert(0) += r.value;
    }
    out.retain(|_, v| *v != 0);
    out
}

fn check_against_model(store: &ProfileStore, rows: &[Row]) {
    assert_eq!(
        merged_stacks(store, &format!("{CPU}{{}}")),
        model_stacks(rows, |_| true)
    );
    assert_eq!(
        merged_stacks(store, &format!("{CPU}{{pod=\"p1\"}}")),
        model_stacks(rows, |r| r.pod == "p1")
    );
    assert_eq!(
        merged_stacks(store, &format!("{CPU}{{container=\"sidecar\"}}")),
        model_stacks(rows, |r| r.container.as_deref() == Some("sidecar"))
    );
    assert_eq!(stored_points(store), model_points(rows));
    let pods: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.value != 0)
        .map(|r| r.pod.clone())
        .collect();
    let values = store
        .label_values("pod", None, TimeRange::ALL, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert_eq!(values.into_iter().collect::<BTreeSet<_>>(), pods);
}

fn row_strategy() -> impl Strategy<Value = Row> {
    let functions = ["main", "serve", "parse", "alloc", "hash", "write"];
    (
        0..3usize,
        prop::option::of(prop::sample::select(vec!["app", "sidecar", ""])),
        0..4i64,
        prop::collection::vec(prop::sample::select(functions.to_vec()), 0..5),
        -5..1000i64,
    )
        .prop_map(|(pod, container, t, stack, value)| Row {
            pod: format!("p{pod}"),
            // An empty value is a label the row lacks.
            container: container.filter(|c| !c.is_empty()).map(str::to_owned),
            timestamp: 1_700_000_000_000 + t * 1_800_000,
            stack: stack.into_iter().map(str::to_owned).collect(),
            value: if value < 0 { 0 } else { value },
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Rows stored in calls of any size, stacks inline or by id (each call with its own
    /// stacks batch, or all with one given once as `ArrowStacks`), merge, sum over time and
    /// list label values as the model sums them, and again after a reopen. A call's rows
    /// are stored in the samples table's order.
    #[test]
    fn arrow_rows_are_stored_as_a_model_sums_them(
        rows in prop::collection::vec(row_strategy(), 1..120),
        calls in 1..4usize,
        by_id in any::<bool>(),
        shared_stacks in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = ProfileStore::open(
                Db::open(dir.path(), DbOptions::default()).unwrap(),
                StoreOptions::default(),
            )
            .unwrap();
            let per_call = rows.len().div_ceil(calls);
            let mut stored = 0;
            let (all, all_stacks) = batches(&rows, true);
            let shared = all_stacks.map(|s| store.arrow_stacks(&s).unwrap());
            for (i, chunk) in rows.chunks(per_call).enumerate() {
                let summary = match (by_id && shared_stacks, &shared) {
                    (true, Some(stacks)) => store
                        .ingest_arrow_with(&all.slice(i * per_call, chunk.len()), stacks)
                        .unwrap(),
                    _ => {
                        let (samples, stacks) = batches(chunk, by_id);
                        store.ingest_arrow(&samples, stacks.as_ref()).unwrap()
                    }
                };
                prop_assert_eq!(summary.rows, chunk.iter().filter(|r| r.value != 0).count());
                stored += summary.rows;
            }
            prop_assert_eq!(store.samples().snapshot().rows(), stored);
            if calls == 1 && stored > 0 {
                // One call's rows, as stored (one part, or one run once compacted).
                let scanned = store.samples().scan(&frostdb_core::ScanRequest::new()).unwrap();
                let scanned =
                    arrow::compute::concat_batches(&scanned[0].schema(), &scanned).unwrap();
                let order = store.samples().sort_indices(&scanned).unwrap();
                prop_assert!(order.is_sorted(), "stored out of the table's order: {:?}", order);
            }
            check_against_model(&store, &rows);
        }
        let store = ProfileStore::open(
            Db::open(dir.path(), DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap();
        check_against_model(&store, &rows);
    }
}

/// A synthetic CPU profile stored through pprof, and the same profile's rows through Arrow
/// into another store: the same merges, series and profile types; and into the first
/// store, rows of its stacks add no stacks.
#[test]
fn arrow_rows_answer_as_the_same_profile_stored_through_pprof() {
    let raw = testing::profile(0, 50, 3);
    let labels = [("pod", "p1"), ("container", "app")];
    let rows = testing::arrow_samples(&raw, "process_cpu", &labels, 1_700_000_000_000);
    let open = || {
        ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default(),
        )
        .unwrap()
    };
    let (pprof, arrow) = (open(), open());
    let profile = validate(raw, &Limits::default()).unwrap();
    let options = IngestOptions::default()
        .name("process_cpu")
        .labels(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .timestamp_ms(1_700_000_000_000);
    pprof.ingest_profile(&profile, &options).unwrap();
    // A slice of a batch is its rows, not its buffers'.
    let sliced = open();
    let part = sliced.ingest_arrow(&rows.slice(10, 20), None).unwrap();
    assert_eq!((part.rows, part.stacks), (20, 20));
    let all = Selector::parse(&format!("{CPU}{{}}")).unwrap();
    let expected: i64 = (10..30).map(|x| (1 + (x % 7)) * 10_000_000).sum();
    assert_eq!(
        sliced.merge(&all, TimeRange::ALL).unwrap().total(),
        expected
    );
    let summary = arrow.ingest_arrow(&rows, None).unwrap();
    assert_eq!((summary.rows, summary.series, summary.profiles), (50, 1, 1));
    assert_eq!(summary.stacks, 50);
    assert_eq!(summary.new_stacks, 50);
    assert_eq!(summary.profile_types, vec![CPU.to_owned()]);
    for selector in ["{}", "{pod=\"p1\"}", "{container=\"app\"}", "{pod=\"p2\"}"] {
        let selector = format!("{CPU}{selector}");
        assert_eq!(
            merged_stacks(&pprof, &selector),
            merged_stacks(&arrow, &selector),
            "{selector}"
        );
    }
    assert_eq!(stored_points(&pprof), stored_points(&arrow));
    let types = |s: &ProfileStore| {
        s.profile_types(TimeRange::ALL, ReadOptions::STRICT)
            .unwrap()
            .value
    };
    assert_eq!(types(&pprof), types(&arrow));
    // Function names alone are one stack whichever way they came: the same rows again add
    // no stack, and add up.
    let again = arrow.ingest_arrow(&rows, None).unwrap();
    assert_eq!(again.new_stacks, 0);
    assert_eq!(
        arrow.merge(&all, TimeRange::ALL).unwrap().total(),
        2 * testing::total(0, 50)
    );
}

/// Rows labelled with a span are kept per span (the spans table), not as series.
#[test]
fn span_labels_are_kept_per_sample_not_as_series() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let raw = testing::profile(0, 10, 2);
    let rows = testing::arrow_samples(&raw, "process_cpu", &[("pod", "p1")], 1_700_000_000_000);
    let n = rows.num_rows();
    let span: StringArray = (0..n)
        .map(|i| Some(if i % 2 == 0 { "s0" } else { "s1" }))
        .collect();
    let mut columns: Vec<(String, ArrayRef)> = rows
        .schema()
        .fields()
        .iter()
        .zip(rows.columns())
        .map(|(f, c)| (f.name().clone(), c.clone()))
        .collect();
    columns.push(("labels.span_id".into(), Arc::new(span)));
    let rows = RecordBatch::try_from_iter(columns).unwrap();
    let summary = store.ingest_arrow(&rows, None).unwrap();
    assert_eq!(summary.series, 1, "span ids make no series");
    let names = store
        .label_names(None, TimeRange::ALL, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert!(!names.iter().any(|n| n == "span_id"), "{names:?}");
    let selector = Selector::parse(&format!("{CPU}{{span_id=\"s0\"}}")).unwrap();
    let s0 = store.merge(&selector, TimeRange::ALL).unwrap().total();
    assert_eq!(s0, testing::span_total(0, 10, 2, &[0]));
    assert!(s0 > 0);
}

/// A good batch (4 rows, one series, stacks inline) with `f` applied to its columns.
fn mangled(f: impl FnOnce(&mut Vec<(String, ArrayRef)>)) -> RecordBatch {
    let raw = testing::profile(0, 4, 2);
    let rows = testing::arrow_samples(&raw, "process_cpu", &[("pod", "p1")], 1_700_000_000_000);
    let mut columns: Vec<(String, ArrayRef)> = rows
        .schema()
        .fields()
        .iter()
        .zip(rows.columns())
        .map(|(f, c)| (f.name().clone(), c.clone()))
        .collect();
    f(&mut columns);
    RecordBatch::try_from_iter(columns).unwrap()
}

fn set(columns: &mut Vec<(String, ArrayRef)>, name: &str, column: ArrayRef) {
    match columns.iter_mut().find(|(n, _)| n == name) {
        Some(c) => c.1 = column,
        None => columns.push((name.to_owned(), column)),
    }
}

fn remove(columns: &mut Vec<(String, ArrayRef)>, name: &str) {
    columns.retain(|(n, _)| n != name);
}

/// Every way a batch can be wrong gets an error naming the column (and row) at fault, of
/// the right kind, and stores nothing, whatever was stored before stays.
#[test]
fn bad_batches_are_refused_naming_the_fault_and_store_nothing() {
    let limits = LabelLimits {
        max_label_names_per_series: 3,
        max_label_value_length: 16,
        ..LabelLimits::default()
    };
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default()
            .label_limits(limits)
            .max_series(4)
            .limits(Limits {
                max_samples: 8,
                max_locations: 12,
                ..Limits::default()
            }),
    )
    .unwrap();
    let good = mangled(|_| {});
    let before = store.ingest_arrow(&good, None).unwrap().rows;
    let n = good.num_rows();
    let strings = |v: &str| Arc::new(StringArray::from(vec![v; n])) as ArrayRef;
    let stack_ids = Arc::new(UInt64Array::from(vec![1u64; n])) as ArrayRef;
    let one_stack = RecordBatch::try_from_iter([
        (
            "stacktrace_id",
            Arc::new(UInt64Array::from(vec![1u64])) as ArrayRef,
        ),
        ("frames", Arc::new(frames([vec!["main".to_owned()]].iter()))),
    ])
    .unwrap();
    let many_stacks = RecordBatch::try_from_iter([
        (
            "stacktrace_id",
            Arc::new(UInt64Array::from_iter_values(1..=9)) as ArrayRef,
        ),
        (
            "frames",
            Arc::new(frames(std::iter::repeat_n(&vec!["main".to_owned()], 9))),
        ),
    ])
    .unwrap();
    let deep = vec!["f".to_owned(); Limits::default().max_stack_depth + 1];
    let with = |name: &str, column: ArrayRef| mangled(|c| set(c, name, column));
    let by_ids = |ids: ArrayRef| {
        mangled(|c| {
            remove(c, "frames");
            set(c, "stacktrace_id", ids);
        })
    };
    type Case = (
        &'static str,
        RecordBatch,
        Option<RecordBatch>,
        ErrorKind,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "value of another type",
            with("value", Arc::new(Int32Array::from(vec![1; n]))),
            None,
            ErrorKind::InvalidInput,
            "samples.value: is Int32, not Int64",
        ),
        (
            "a null time",
            with(
                "timestamp",
                Arc::new(Int64Array::from_iter(
                    (0..n).map(|i| (i != 2).then_some(1_700_000_000_000i64)),
                )),
            ),
            None,
            ErrorKind::InvalidInput,
            "samples.timestamp: is null at row 2",
        ),
        (
            "a time before 1970",
            with("timestamp", Arc::new(Int64Array::from(vec![-1; n]))),
            None,
            ErrorKind::InvalidInput,
            "row 0: -1 ms is outside",
        ),
        (
            "seconds that overflow",
            with(
                "timestamp",
                Arc::new(TimestampSecondArray::from(vec![i64::MAX / 10; n])),
            ),
            None,
            ErrorKind::InvalidInput,
            "samples.timestamp: row 0",
        ),
        (
            "no name",
            mangled(|c| remove(c, "name")),
            None,
            ErrorKind::InvalidInput,
            "samples.name: the column is missing",
        ),
        (
            "an empty name",
            with("name", strings("")),
            None,
            ErrorKind::InvalidInput,
            "samples.name: is empty at row 0",
        ),
        (
            "a name of another type",
            with("name", Arc::new(Int64Array::from(vec![1; n]))),
            None,
            ErrorKind::InvalidInput,
            "samples.name: is Int64, not a string type",
        ),
        (
            "a label name that is not one",
            with("labels.a-b", strings("x")),
            None,
            ErrorKind::InvalidInput,
            "\"a-b\" is not a label name",
        ),
        (
            "a reserved label name",
            with("labels.__name__", strings("x")),
            None,
            ErrorKind::InvalidInput,
            "reserved",
        ),
        (
            "a label value too long",
            with("labels.pod", strings(&"x".repeat(17))),
            None,
            ErrorKind::LimitExceeded,
            "max_label_value_length",
        ),
        (
            "too many labels",
            mangled(|c| {
                for l in ["a", "b", "c"] {
                    set(c, &format!("labels.{l}"), strings("x"));
                }
            }),
            None,
            ErrorKind::LimitExceeded,
            "max_label_names_per_series",
        ),
        (
            "too many series",
            with(
                "labels.pod",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("q{i}")),
                )),
            ),
            None,
            ErrorKind::QuotaExceeded,
            "the limit of 4 series",
        ),
        (
            "an unknown column",
            with("weight", strings("x")),
            None,
            ErrorKind::InvalidInput,
            "samples.weight: is not a column of sample rows",
        ),
        (
            "no stacks",
            mangled(|c| remove(c, "frames")),
            None,
            ErrorKind::InvalidInput,
            "the stacks are missing",
        ),
        (
            "ids without their stacks",
            by_ids(stack_ids.clone()),
            None,
            ErrorKind::InvalidInput,
            "none was given",
        ),
        (
            "ids and frames both",
            with("stacktrace_id", stack_ids.clone()),
            Some(one_stack.clone()),
            ErrorKind::InvalidInput,
            "not both",
        ),
        (
            "a dangling stack id",
            by_ids(Arc::new(UInt64Array::from_iter_values(
                (0..n as u64).map(|i| 1 + i % 2),
            ))),
            Some(one_stack.clone()),
            ErrorKind::InvalidInput,
            "row 1: stack 2 is not in the stacks batch",
        ),
        (
            "too many stacks",
            by_ids(stack_ids.clone()),
            Some(many_stacks),
            ErrorKind::LimitExceeded,
            "the stacks of an Arrow stacks batch exceeds the limit of 8",
        ),
        (
            "a stack id given twice",
            by_ids(stack_ids.clone()),
            Some(
                arrow::compute::concat_batches(&one_stack.schema(), [&one_stack, &one_stack])
                    .unwrap(),
            ),
            ErrorKind::InvalidInput,
            "stack 1 is given twice",
        ),
        (
            "a null frame",
            with("frames", {
                let mut b = ListBuilder::new(StringBuilder::new());
                for _ in 0..n {
                    b.values().append_value("main");
                    b.values().append_null();
                    b.append(true);
                }
                Arc::new(b.finish())
            }),
            None,
            ErrorKind::InvalidInput,
            "row 0 has a null frame",
        ),
        (
            "a null stack",
            with("frames", {
                let mut b = ListBuilder::new(StringBuilder::new());
                for i in 0..n {
                    b.values().append_value("main");
                    b.append(i != 1);
                }
                Arc::new(b.finish())
            }),
            None,
            ErrorKind::InvalidInput,
            "samples.frames: is null at row 1",
        ),
        (
            "a stack too deep",
            with("frames", Arc::new(frames(std::iter::repeat_n(&deep, n)))),
            None,
            ErrorKind::InvalidInput,
            "max_stack_depth",
        ),
        (
            "a frame name too long",
            with(
                "frames",
                Arc::new(frames(std::iter::repeat_n(&vec!["f".repeat(65_536)], n))),
            ),
            None,
            ErrorKind::InvalidInput,
            "row 0 has a frame name of 65536 bytes, over the limit of 65535",
        ),
        (
            "more distinct frames than a profile may have",
            with("frames", {
                let stacks: Vec<Vec<String>> = (0..n)
                    .map(|r| (0..4).map(|f| format!("f{r}.{f}")).collect())
                    .collect();
                Arc::new(frames(stacks.iter()))
            }),
            None,
            ErrorKind::LimitExceeded,
            "distinct frame names of an Arrow batch (max_locations, max_functions) exceeds the limit of 12",
        ),
        (
            "a profile type's value too long",
            with("name", strings(&"n".repeat(17))),
            None,
            ErrorKind::LimitExceeded,
            "a value of column \"name\", in bytes",
        ),
        (
            "frames not a list",
            with("frames", strings("main")),
            None,
            ErrorKind::InvalidInput,
            "samples.frames: is Utf8, not a list",
        ),
    ];
    for (what, samples, stacks, kind, says) in cases {
        let err = store.ingest_arrow(&samples, stacks.as_ref()).unwrap_err();
        assert_eq!(err.kind(), kind, "{what}: {err}");
        assert!(
            err.to_string().contains(says),
            "{what}: {err:?} does not say {says:?}"
        );
        assert_eq!(
            store.samples().snapshot().rows(),
            before,
            "{what}: something was stored"
        );
    }
    let pods = store
        .label_values("pod", None, TimeRange::ALL, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert_eq!(pods, vec!["p1".to_owned()]);
    let names = store
        .label_names(None, TimeRange::ALL, ReadOptions::STRICT)
        .unwrap()
        .value;
    assert!(
        !names
            .iter()
            .any(|n| n == "a" || n == "a_b" || n == "weight"),
        "{names:?}"
    );
}

/// `n` string views, each naming the same `len` bytes of one buffer: 16 bytes a view,
/// whatever it names.
fn aliased_views(n: usize, len: usize) -> arrow::array::StringViewArray {
    let data = arrow::buffer::Buffer::from(vec![b'x'; len]);
    let prefix = u32::from_le_bytes(*b"xxxx") as u128;
    let view = len as u128 | (prefix << 32); // buffer 0, offset 0
    arrow::array::StringViewArray::try_new(
        arrow::buffer::ScalarBuffer::from(vec![view; n]),
        vec![data],
        None,
    )
    .unwrap()
}

/// A string view is 16 bytes whatever it names, and arrow's casts copy out what views
/// name: the lengths are checked before the cast. A dictionary of a few MB of views into
/// one buffer had arrow allocate the sum of their lengths (terabytes: an abort), or panic
/// past 2 GiB; a list of frames likewise.
#[test]
fn string_views_are_measured_before_they_are_copied_out() {
    use arrow::array::{DictionaryArray, ListArray};
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default().limits(Limits {
            max_decompressed_bytes: 1 << 20,
            ..Limits::default()
        }),
    )
    .unwrap();
    let n = mangled(|_| {}).num_rows();
    let pods = |values: arrow::array::StringViewArray| {
        let keys = Int32Array::from(vec![0; n]);
        let pods = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap();
        mangled(|c| set(c, "labels.pod", Arc::new(pods)))
    };
    // Within the limits: stored.
    store
        .ingest_arrow(&pods(aliased_views(4, 64)), None)
        .unwrap();
    // One value over max_label_value_length, named by views that alias it: refused (before
    // the cast copies it out, as the next case shows it is).
    let long = LabelLimits::default().max_label_value_length + 1;
    let e = store
        .ingest_arrow(&pods(aliased_views(1 << 10, long)), None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert!(e.to_string().contains("labels.pod"), "{e}");
    // Values each within the limit, 2 MiB in all: over max_decompressed_bytes.
    let e = store
        .ingest_arrow(&pods(aliased_views(1 << 10, 2 << 10)), None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert!(e.to_string().contains("string views"), "{e}");
    // Frames: each row's stack 512 views of the same 1 KiB name.
    let frames = |len: usize| {
        let names = aliased_views(512 * n, len);
        let offsets = arrow::buffer::OffsetBuffer::from_lengths(vec![512; n]);
        let item = Arc::new(arrow::datatypes::Field::new(
            "item",
            arrow::datatypes::DataType::Utf8View,
            true,
        ));
        let lists = ListArray::new(item, offsets, Arc::new(names), None);
        mangled(|c| set(c, "frames", Arc::new(lists)))
    };
    store.ingest_arrow(&frames(16), None).unwrap();
    let e = store.ingest_arrow(&frames(1 << 10), None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    assert!(e.to_string().contains("frame names"), "{e}");
}

/// Stacks checked by one store are not taken unchecked by a store of stricter limits.
#[test]
fn stacks_checked_under_looser_limits_are_refused() {
    let open = |limits: Limits| {
        ProfileStore::open(
            Db::open_in_memory(DbOptions::default()).unwrap(),
            StoreOptions::default().limits(limits),
        )
        .unwrap()
    };
    let loose = open(Limits::default());
    let strict = open(Limits {
        max_stack_depth: 4,
        ..Limits::default()
    });
    let deep: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    let stacks = RecordBatch::try_from_iter([
        (
            "stacktrace_id",
            Arc::new(UInt64Array::from(vec![1u64])) as ArrayRef,
        ),
        ("frames", Arc::new(frames([deep].iter()))),
    ])
    .unwrap();
    let samples = mangled(|c| {
        let n = c[0].1.len();
        remove(c, "frames");
        set(
            c,
            "stacktrace_id",
            Arc::new(UInt64Array::from(vec![1u64; n])),
        );
    });
    let checked = loose.arrow_stacks(&stacks).unwrap();
    assert!(strict.arrow_stacks(&stacks).is_err(), "too deep for it");
    let e = strict.ingest_arrow_with(&samples, &checked).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("looser limits"), "{e}");
    assert_eq!(
        loose.ingest_arrow_with(&samples, &checked).unwrap().rows,
        samples.num_rows()
    );
}

/// A column of views is copied out as its distinct values: views of overlapping windows
/// are distinct, and are measured before the cast; views of one value are one value. A
/// dictionary of no values (stacks all empty) is measured without a panic.
#[test]
fn distinct_views_are_measured_and_an_empty_dictionary_is_no_fault() {
    use arrow::array::{DictionaryArray, ListArray, StringViewArray};
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default().limits(Limits {
            max_decompressed_bytes: 6 << 10,
            ..Limits::default()
        }),
    )
    .unwrap();
    let n = mangled(|_| {}).num_rows();
    assert!(n >= 4, "{n}");
    let len = 2 << 10;
    let text: Vec<u8> = (0..len + n).map(|i| b'a' + (i % 26) as u8).collect();
    let data = arrow::buffer::Buffer::from(text);
    let view = |offset: usize| {
        let prefix = u32::from_le_bytes(data[offset..offset + 4].try_into().unwrap()) as u128;
        len as u128 | (prefix << 32) | ((offset as u128) << 96)
    };
    let pods = |offsets: Vec<usize>| {
        let views = offsets.into_iter().map(view).collect::<Vec<_>>();
        let pods = StringViewArray::try_new(
            arrow::buffer::ScalarBuffer::from(views),
            vec![data.clone()],
            None,
        )
        .unwrap();
        mangled(|c| set(c, "labels.pod", Arc::new(pods)))
    };
    // One value, by every row: within the limit.
    store.ingest_arrow(&pods(vec![0; n]), None).unwrap();
    // A window a row, each its own value: 2 KiB each, over the 6 KiB limit.
    let e = store
        .ingest_arrow(&pods((0..n).collect()), None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
    // Stacks all empty, their names a dictionary of no values.
    let names = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from(Vec::<i32>::new()),
        Arc::new(StringArray::from(Vec::<&str>::new())),
    )
    .unwrap();
    let item = Arc::new(arrow::datatypes::Field::new(
        "item",
        arrow::array::Array::data_type(&names).clone(),
        true,
    ));
    let empty = ListArray::new(
        item,
        arrow::buffer::OffsetBuffer::new_zeroed(n),
        Arc::new(names),
        None,
    );
    // (A panic fails the test.)
    let empty = mangled(|c| set(c, "frames", Arc::new(empty)));
    store.ingest_arrow(&empty, None).unwrap();
}
