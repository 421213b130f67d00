//! Model-based property test: random inserts (random dynamic label sets, sort-key values,
//! nulls), compactions and scans (random predicates, projections, order, limits) against a
//! naive model, a `Vec` of rows evaluated with SQL's three-valued logic.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeBinaryArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use frostdb_core::{
    ColumnDef, Db, DbOptions, Encoding, Predicate, Scalar, ScanRequest, Schema, SortingColumn,
    Table, TableOptions, col,
};
use proptest::prelude::*;

const LABELS: [&str; 3] = ["a", "b", "c"];
const NEVER: &str = "d";
const VALUES: [&str; 4] = ["x", "y", "z", "xy"];
const NAMES: [&str; 3] = ["cpu", "mem", "zz"];
const REGEXES: [&str; 5] = ["^x", "y$", "x|z", "^$", "^(?:x)$"];

#[derive(Debug, Clone)]
struct Row {
    name: String,
    labels: BTreeMap<String, Option<String>>,
    ts: i64,
    value: Option<i64>,
    id: [u8; 2],
}

impl Row {
    fn get(&self, column: &str) -> Scalar {
        match column {
            "name" => Scalar::from(self.name.as_str()),
            "ts" => Scalar::Int(self.ts),
            "value" => self.value.map_or(Scalar::Null, Scalar::Int),
            "id" => Scalar::Binary(self.id.to_vec()),
            other => {
                let label = other.strip_prefix("labels.").expect("a label column");
                match self.labels.get(label) {
                    Some(Some(v)) => Scalar::from(v.as_str()),
                    _ => Scalar::Null,
                }
            }
        }
    }
}

fn schema() -> Schema {
    Schema::builder("model")
        .column(ColumnDef::new("name", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::new("ts", DataType::Int64))
        .column(ColumnDef::new("value", DataType::Int64).nullable(true))
        .column(ColumnDef::new("id", DataType::FixedSizeBinary(2)))
        .sort_by(SortingColumn::asc("name"))
        .sort_by(SortingColumn::asc("labels"))
        .sort_by(SortingColumn::desc("ts").nulls_first(false))
        .build()
        .unwrap()
}

/// The model's sort order: name asc, labels (in name order) asc nulls first, ts desc.
fn key_cmp(a: &Row, b: &Row, labels: &BTreeSet<String>) -> Ordering {
    a.name
        .cmp(&b.name)
        .then_with(|| {
            labels
                .iter()
                .map(|l| {
                    let va = a.labels.get(l).cloned().flatten();
                    let vb = b.labels.get(l).cloned().flatten();
                    va.cmp(&vb) // None < Some: nulls first
                })
                .find(|o| o.is_ne())
                .unwrap_or(Ordering::Equal)
        })
        .then_with(|| b.ts.cmp(&a.ts))
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        labels: Vec<String>,
        rows: Vec<Row>,
        reversed: bool,
    },
    Compact,
    CompactFully,
    Scan {
        predicate: Option<Predicate>,
        projection: usize,
        sorted: bool,
        limit: Option<usize>,
    },
}

fn label_value() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        1 => Just(None),
        4 => prop::sample::select(VALUES.to_vec()).prop_map(|v| Some(v.to_owned())),
    ]
}

fn insert() -> impl Strategy<Value = Op> {
    (
        prop::sample::subsequence(LABELS.to_vec(), 0..=3),
        0usize..12,
        any::<bool>(),
    )
        .prop_flat_map(|(labels, n, reversed)| {
            let labels: Vec<String> = labels.into_iter().map(str::to_owned).collect();
            let row = (
                prop::sample::select(NAMES.to_vec()),
                prop::collection::vec(label_value(), labels.len()),
                -5i64..5,
                prop::option::of(-3i64..3),
                any::<[u8; 2]>().prop_map(|b| [b[0] % 3, b[1] % 2]),
            );
            let names = labels.clone();
            (
                Just(labels),
                prop::collection::vec(row, n).prop_map(move |rows| {
                    rows.into_iter()
                        .map(|(name, values, ts, value, id)| Row {
                            name: name.to_owned(),
                            labels: names.iter().cloned().zip(values).collect(),
                            ts,
                            value,
                            id,
                        })
                        .collect::<Vec<_>>()
                }),
                Just(reversed),
            )
        })
        .prop_map(|(labels, rows, reversed)| Op::Insert {
            labels,
            rows,
            reversed,
        })
}

fn label_column() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", NEVER]).prop_map(|l| format!("labels.{l}"))
}

fn leaf() -> impl Strategy<Value = Predicate> {
    let op = 0usize..6;
    prop_oneof![
        (op.clone(), prop::sample::select(NAMES.to_vec())).prop_map(|(op, v)| compare(
            col("name"),
            op,
            Scalar::from(v)
        )),
        (
            label_column(),
            op.clone(),
            prop::sample::select(VALUES.to_vec())
        )
            .prop_map(|(c, op, v)| compare(col(c), op, Scalar::from(v))),
        (op.clone(), -6i64..6).prop_map(|(op, v)| compare(col("ts"), op, Scalar::Int(v))),
        (op, -4i64..4).prop_map(|(op, v)| compare(col("value"), op, Scalar::Int(v))),
        (
            label_column(),
            prop::sample::subsequence(VALUES.to_vec(), 1..3),
            any::<bool>()
        )
            .prop_map(|(c, vs, neg)| if neg {
                col(c).not_in_list(vs)
            } else {
                col(c).in_list(vs)
            }),
        (
            prop::sample::select(vec!["labels.a", "labels.b", "labels.d", "value"]),
            any::<bool>()
        )
            .prop_map(|(c, neg)| if neg {
                col(c).is_not_null()
            } else {
                col(c).is_null()
            }),
        (
            label_column(),
            prop::sample::select(REGEXES.to_vec()),
            any::<bool>()
        )
            .prop_map(|(c, re, neg)| if neg {
                col(c).regex_not_match(re)
            } else {
                col(c).regex_match(re)
            }),
        (any::<[u8; 2]>()).prop_map(|b| col("id").eq(Scalar::Binary(vec![b[0] % 3, b[1] % 2]))),
    ]
}

fn compare(c: frostdb_core::Col, op: usize, v: Scalar) -> Predicate {
    match op {
        0 => c.eq(v),
        1 => c.not_eq(v),
        2 => c.lt(v),
        3 => c.lt_eq(v),
        4 => c.gt(v),
        _ => c.gt_eq(v),
    }
}

fn predicate() -> impl Strategy<Value = Predicate> {
    leaf().prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..3).prop_map(Predicate::And),
            prop::collection::vec(inner.clone(), 1..3).prop_map(Predicate::Or),
            inner.prop_map(|p| !p),
        ]
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => insert(),
        1 => Just(Op::Compact),
        1 => Just(Op::CompactFully),
        4 => (
            prop::option::of(predicate()),
            0usize..PROJECTIONS.len(),
            any::<bool>(),
            prop::option::of(0usize..15)
        )
            .prop_map(|(predicate, projection, sorted, limit)| Op::Scan {
                predicate,
                projection,
                sorted,
                limit,
            }),
    ]
}

/// Projections; every one a sorted scan gets includes the sort key, so order is checkable.
const PROJECTIONS: [&[&str]; 5] = [
    &[],
    &["labels.*", "name", "ts", "value"],
    &["ts", "name", "labels", "id"],
    &["name", "labels.a", "labels.b", "labels.c", "ts", "labels.d"],
    &["value", "id"],
];

// ---- the model ----

fn eval(p: &Predicate, row: &Row) -> Option<bool> {
    match p {
        Predicate::Const(b) => Some(*b),
        Predicate::Not(inner) => eval(inner, row).map(|b| !b),
        Predicate::And(children) => {
            let vals: Vec<_> = children.iter().map(|c| eval(c, row)).collect();
            if vals.contains(&Some(false)) {
                Some(false)
            } else if vals.contains(&None) {
                None
            } else {
                Some(true)
            }
        }
        Predicate::Or(children) => {
            let vals: Vec<_> = children.iter().map(|c| eval(c, row)).collect();
            if vals.contains(&Some(true)) {
                Some(true)
            } else if vals.contains(&None) {
                None
            } else {
                Some(false)
            }
        }
        Predicate::Compare { column, op, value } => {
            let v = row.get(column);
            let o = v.partial_cmp_same(value)?;
            use frostdb_core::CmpOp::*;
            Some(match op {
                Eq => o.is_eq(),
                NotEq => o.is_ne(),
                Lt => o.is_lt(),
                LtEq => o.is_le(),
                Gt => o.is_gt(),
                GtEq => o.is_ge(),
            })
        }
        Predicate::InList {
            column,
            values,
            negated,
        } => {
            let v = row.get(column);
            if v == Scalar::Null {
                return None;
            }
            Some(values.contains(&v) != *negated)
        }
        Predicate::IsNull { column, negated } => {
            Some((row.get(column) == Scalar::Null) != *negated)
        }
        Predicate::Regex {
            column,
            pattern,
            negated,
        } => match row.get(column) {
            Scalar::Utf8(s) => Some(regex::Regex::new(pattern).unwrap().is_match(&s) != *negated),
            _ => None,
        },
        _ => unreachable!("the generator makes no other predicates"),
    }
}

struct Model {
    rows: Vec<Row>,
    labels: BTreeSet<String>,
}

impl Model {
    fn projection(&self, index: usize) -> Vec<String> {
        let all_labels: Vec<String> = self.labels.iter().map(|l| format!("labels.{l}")).collect();
        let spec = PROJECTIONS[index];
        if spec.is_empty() {
            let mut out = vec!["name".to_owned()];
            out.extend(all_labels);
            out.extend(["ts", "value", "id"].map(str::to_owned));
            return out;
        }
        let mut out: Vec<String> = Vec::new();
        for name in spec {
            let expanded = match *name {
                "labels.*" | "labels" => all_labels.clone(),
                other => vec![other.to_owned()],
            };
            for n in expanded {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        out
    }
}

fn to_batch(labels: &[String], rows: &[Row], reversed: bool) -> RecordBatch {
    let mut columns: Vec<(String, ArrayRef)> = vec![
        (
            "name".into(),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.name.as_str()),
            )),
        ),
        (
            "ts".into(),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.ts))),
        ),
        (
            "value".into(),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.value))),
        ),
        (
            "id".into(),
            Arc::new(
                FixedSizeBinaryArray::try_from_iter(rows.iter().map(|r| r.id))
                    .unwrap_or_else(|_| FixedSizeBinaryArray::new_null(2, 0)),
            ),
        ),
    ];
    for l in labels {
        let values: StringArray = rows
            .iter()
            .map(|r| r.labels.get(l).cloned().flatten())
            .collect();
        columns.push((format!("labels.{l}"), Arc::new(values)));
    }
    if reversed {
        columns.reverse();
    }
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new_with_options(
        Arc::new(ArrowSchema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
        &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows.len())),
    )
    .unwrap()
}

/// Output rows as rendered values, one `Vec<String>` per row, in output order.
fn rendered(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| format!("{:?}", Scalar::from_array(c.as_ref(), i)))
                    .collect(),
            );
        }
    }
    out
}

fn check_scan(
    table: &Table,
    model: &Model,
    predicate: &Option<Predicate>,
    projection: usize,
    sorted: bool,
    limit: Option<usize>,
) -> Result<(), TestCaseError> {
    let columns = model.projection(projection);
    let mut request = ScanRequest::new().sorted(sorted);
    if !PROJECTIONS[projection].is_empty() {
        request = request.project(PROJECTIONS[projection].iter().copied());
    }
    if let Some(p) = predicate {
        request = request.filter(p.clone());
    }
    if let Some(n) = limit {
        request = request.limit(n);
    }
    let scan = table.snapshot().scan(&request).unwrap();
    let names: Vec<String> = scan
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    prop_assert_eq!(&names, &columns);
    let batches: Vec<RecordBatch> = scan.collect::<Result<_, _>>().unwrap();
    let got = rendered(&batches);

    let mut matched: Vec<&Row> = model
        .rows
        .iter()
        .filter(|r| predicate.as_ref().is_none_or(|p| eval(p, r) == Some(true)))
        .collect();
    let render_row =
        |r: &Row| -> Vec<String> { columns.iter().map(|c| format!("{:?}", r.get(c))).collect() };
    let mut want_all: Vec<Vec<String>> = matched.iter().map(|r| render_row(r)).collect();
    want_all.sort();
    let expected_len = limit.map_or(matched.len(), |n| n.min(matched.len()));
    prop_assert_eq!(got.len(), expected_len);

    // Every returned row is a matching row (as a multiset).
    let mut got_sorted = got.clone();
    got_sorted.sort();
    if limit.is_none() {
        prop_assert_eq!(&got_sorted, &want_all);
    } else {
        let mut pool = want_all.clone();
        for row in &got_sorted {
            let at = pool.iter().position(|w| w == row);
            prop_assert!(at.is_some(), "row {:?} does not match", row);
            pool.remove(at.unwrap());
        }
    }

    if sorted && projection != 4 {
        // The sort-key columns of the output, in order, equal the model's first rows.
        matched.sort_by(|a, b| key_cmp(a, b, &model.labels));
        let key: Vec<String> = std::iter::once("name".to_owned())
            .chain(model.labels.iter().map(|l| format!("labels.{l}")))
            .chain(std::iter::once("ts".to_owned()))
            .collect();
        let positions: Vec<usize> = key
            .iter()
            .map(|k| columns.iter().position(|c| c == k).expect("key projected"))
            .collect();
        let got_keys: Vec<Vec<String>> = got
            .iter()
            .map(|r| positions.iter().map(|&p| r[p].clone()).collect())
            .collect();
        let want_keys: Vec<Vec<String>> = matched
            .iter()
            .take(expected_len)
            .map(|r| key.iter().map(|k| format!("{:?}", r.get(k))).collect())
            .collect();
        prop_assert_eq!(got_keys, want_keys);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        let db = Db::open_in_memory(DbOptions::default().background_compaction(false)).unwrap();
        let options = TableOptions::default()
            .granule_rows(4)
            .l0_max_rows(16)
            .l0_max_parts(3)
            .level_fanout(2)
            .levels(2);
        let table = db.table("model", schema(), options).unwrap();
        let mut model = Model { rows: Vec::new(), labels: BTreeSet::new() };
        let mut last_tx = 0;
        for op in &ops {
            match op {
                Op::Insert { labels, rows, reversed } => {
                    let tx = table.insert(&to_batch(labels, rows, *reversed)).unwrap();
                    if rows.is_empty() {
                        prop_assert_eq!(tx, last_tx);
                    } else {
                        prop_assert_eq!(tx, last_tx + 1);
                        last_tx = tx;
                        model.rows.extend(rows.iter().cloned());
                        model.labels.extend(labels.iter().cloned());
                    }
                }
                Op::Compact => { table.compact().unwrap(); }
                Op::CompactFully => { table.compact_fully().unwrap(); }
                Op::Scan { predicate, projection, sorted, limit } => {
                    check_scan(&table, &model, predicate, *projection, *sorted, *limit)?;
                }
            }
            prop_assert_eq!(table.stats().rows, model.rows.len());
        }
        // A final full check, sorted and not, after everything is compacted.
        check_scan(&table, &model, &None, 0, true, None)?;
        table.compact_fully().unwrap();
        check_scan(&table, &model, &None, 0, true, None)?;
        check_scan(&table, &model, &None, 1, false, None)?;
    }
}
