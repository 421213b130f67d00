//! The profile queries against the rows the test inserted, with Prometheus selector
//! semantics (absent labels are empty, regexes anchored).

// The small profile table of frostdb-query's tests, shared rather than copied.
use crate::common;

use std::collections::BTreeMap;

use arrow::array::RecordBatch;
use arrow::util::display::array_value_to_string;
use common::*;
use datafusion::physical_plan::SendableRecordBatchStream;
use frostdb_core::{Db, DbOptions, TableOptions};
use frostdb_profile::Selector;
use frostdb_profile::{TimeRange, plans};
use futures::TryStreamExt;

async fn collect(stream: datafusion::error::Result<SendableRecordBatchStream>) -> Vec<Vec<String>> {
    let batches: Vec<RecordBatch> = stream.unwrap().try_collect().await.unwrap();
    let mut out = Vec::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| array_value_to_string(c, i).unwrap())
                    .collect(),
            );
        }
    }
    out
}

fn setup() -> (Db, Vec<Row>) {
    let data = rows(6, 24, 10_000, 5);
    let db = Db::open_in_memory(DbOptions::default().background_compaction(false)).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema(),
            TableOptions::default().granule_rows(128),
        )
        .unwrap();
    insert(&table, &data);
    table.compact().unwrap();
    (db, data)
}

const CPU: &str = "cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Whether `r` is selected by `{env op value}` in Prometheus terms.
fn env_is(r: &Row, value: &str) -> bool {
    r.env.as_deref().unwrap_or("") == value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_sums_stacks_of_the_selected_series() {
    let (db, data) = setup();
    let ctx = frostdb_query::session(&db).unwrap();
    let range = TimeRange {
        start_ms: START_MS + 30_000,
        end_ms: START_MS + 150_000,
    };
    type Select = Box<dyn Fn(&Row) -> bool>;
    let cases: Vec<(&str, Select)> = vec![
        ("{job=\"api\"}", Box::new(|r: &Row| r.job == "api")),
        (
            "{pod=~\"p[12]\"}",
            Box::new(|r: &Row| r.pod == "p1" || r.pod == "p2"),
        ),
        ("{pod=~\"p\"}", Box::new(|_: &Row| false)),
        ("{env!=\"prod\"}", Box::new(|r: &Row| !env_is(r, "prod"))),
        ("{env=\"\"}", Box::new(|r: &Row| env_is(r, ""))),
        (
            "{env=~\"pr.*\", job!~\"d.*\"}",
            Box::new(|r: &Row| env_is(r, "prod") && r.job != "db"),
        ),
        ("{nosuch=\"\"}", Box::new(|_: &Row| true)),
        ("{nosuch=\"x\"}", Box::new(|_: &Row| false)),
    ];
    for (matchers, select) in cases {
        let selector = Selector::parse(&format!("{CPU}{matchers}")).unwrap();
        let got = collect(plans::merge(&ctx, "samples", &selector, range, &[]).await).await;
        let mut want: BTreeMap<u64, i64> = BTreeMap::new();
        for r in data.iter().filter(|r| {
            r.name == "cpu"
                && r.timestamp >= range.start_ms
                && r.timestamp < range.end_ms
                && select(r)
        }) {
            *want.entry(r.stack).or_default() += r.value;
        }
        let mut got: Vec<(u64, i64)> = got
            .iter()
            .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
            .collect();
        got.sort();
        assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{matchers}");
    }

    // Grouped by a label, as Parca compares profiles along a dimension.
    let selector = Selector::parse(CPU).unwrap();
    let got =
        collect(plans::merge(&ctx, "samples", &selector, TimeRange::ALL, &["job".into()]).await)
            .await;
    let mut want: BTreeMap<(u64, String), i64> = BTreeMap::new();
    for r in data.iter().filter(|r| r.name == "cpu") {
        *want.entry((r.stack, r.job.clone())).or_default() += r.value;
    }
    let mut got: Vec<((u64, String), i64)> = got
        .iter()
        .map(|r| ((r[0].parse().unwrap(), r[1].clone()), r[2].parse().unwrap()))
        .collect();
    got.sort();
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_sums_per_series_and_step() {
    let (db, data) = setup();
    let ctx = frostdb_query::session(&db).unwrap();
    let selector = Selector::parse(&format!("{CPU}{{pod=\"p3\"}}")).unwrap();
    let got = collect(plans::range(&ctx, "samples", &selector, TimeRange::ALL, 60_000).await).await;
    let mut want: BTreeMap<i64, i64> = BTreeMap::new();
    for r in data.iter().filter(|r| r.name == "cpu" && r.pod == "p3") {
        *want.entry(r.timestamp - r.timestamp % 60_000).or_default() += r.value;
    }
    // Columns: labels.env, labels.job, labels.pod, timestamp, value.
    let p3 = data.iter().find(|r| r.pod == "p3").unwrap();
    let env = p3.env.clone().unwrap_or_default();
    let got: Vec<(i64, i64)> = got
        .iter()
        .map(|r| {
            assert_eq!(
                (r[0].as_str(), r[1].as_str(), r[2].as_str()),
                (env.as_str(), p3.job.as_str(), "p3")
            );
            (r[3].parse().unwrap(), r[4].parse().unwrap())
        })
        .collect();
    assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "ordered by time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_types_and_timestamps() {
    let (db, data) = setup();
    let ctx = frostdb_query::session(&db).unwrap();
    let names = collect(plans::label_names(&ctx, "samples", None, TimeRange::ALL).await).await;
    assert_eq!(names, vec![vec!["env"], vec!["job"], vec!["pod"]]);
    let no_env = Selector::parse("{env=\"\"}").unwrap();
    let names =
        collect(plans::label_names(&ctx, "samples", Some(&no_env), TimeRange::ALL).await).await;
    assert_eq!(
        names,
        vec![vec!["job"], vec!["pod"]],
        "env is absent where env=\"\""
    );

    let api = Selector::parse("{job=\"api\"}").unwrap();
    let pods =
        collect(plans::label_values(&ctx, "samples", "pod", Some(&api), TimeRange::ALL).await)
            .await;
    assert_eq!(pods, vec![vec!["p0"], vec!["p2"], vec!["p4"]]);
    let none =
        collect(plans::label_values(&ctx, "samples", "nosuch", None, TimeRange::ALL).await).await;
    assert!(none.is_empty());

    let types = collect(plans::profile_types(&ctx, "samples", TimeRange::ALL).await).await;
    assert_eq!(
        types,
        vec![
            vec!["cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"],
            vec!["memory", "alloc_space", "bytes", "space", "bytes"],
        ]
    );

    let selector = Selector::parse(&format!("{CPU}{{pod=\"p1\"}}")).unwrap();
    let range = TimeRange {
        start_ms: START_MS + 100_000,
        end_ms: START_MS + 140_000,
    };
    let ts = collect(plans::timestamps(&ctx, "samples", &selector, range).await).await;
    let mut want: Vec<String> = data
        .iter()
        .filter(|r| r.pod == "p1" && r.timestamp >= range.start_ms && r.timestamp < range.end_ms)
        .map(|r| r.timestamp.to_string())
        .collect();
    want.dedup();
    assert_eq!(ts, want.into_iter().map(|t| vec![t]).collect::<Vec<_>>());
}
