//! Scenario tests of tables: inserts, dynamic columns, scans, compaction, errors.

use crate::common;

use std::sync::{Arc, mpsc};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type};
use common::*;
use frostdb_core::{
    CompactionOutcome, Db, DbOptions, Error, EventListener, Projection, ScanRequest, TableOptions,
    col,
};

fn db() -> Db {
    Db::open_in_memory(DbOptions::default().background_compaction(false)).unwrap()
}

fn two_batches(table: &frostdb_core::Table) {
    table
        .insert(&batch(vec![
            ("name", str_n("cpu", 3)),
            ("labels.pod", strs(&[Some("b"), Some("a"), None])),
            ("timestamp", ints(&[3, 1, 2])),
            ("value", ints(&[30, 10, 20])),
        ]))
        .unwrap();
    table
        .insert(&batch(vec![
            ("value", ints(&[5, 6])),
            ("labels.job", strs(&[Some("api"), Some("db")])),
            ("timestamp", ints(&[9, 8])),
            ("name", str_n("cpu", 2)),
        ]))
        .unwrap();
}

#[test]
fn schema_grows_and_absent_columns_read_as_null() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    two_batches(&table);
    let out = table.scan(&ScanRequest::new().sorted(true)).unwrap();
    assert_eq!(
        render(&out),
        "\
+------+------------+------------+-----------+-------+
| name | labels.job | labels.pod | timestamp | value |
+------+------------+------------+-----------+-------+
| cpu  |            |            | 2         | 20    |
| cpu  |            | a          | 1         | 10    |
| cpu  |            | b          | 3         | 30    |
| cpu  | api        |            | 9         | 5     |
| cpu  | db         |            | 8         | 6     |
+------+------------+------------+-----------+-------+"
    );
}

#[test]
fn projections_of_dynamic_columns() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    two_batches(&table);
    let names = |p: Vec<&str>| {
        let scan = table
            .snapshot()
            .scan(&ScanRequest::new().project(p))
            .unwrap();
        scan.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(vec!["labels.*", "value"]),
        ["labels.job", "labels.pod", "value"]
    );
    assert_eq!(
        names(vec!["value", "labels"]),
        ["value", "labels.job", "labels.pod"]
    );
    assert_eq!(names(vec!["labels.pod"]), ["labels.pod"]);
    assert_eq!(
        names(vec!["labels.never", "value"]),
        ["labels.never", "value"]
    );

    let never = table
        .scan(&ScanRequest::new().project(["labels.never"]))
        .unwrap();
    assert_eq!(count(&never), 5);
    assert!(
        never
            .iter()
            .all(|b| b.column(0).null_count() == b.num_rows())
    );

    let err = table
        .scan(&ScanRequest::new().project(["nope"]))
        .unwrap_err();
    assert!(matches!(err, Error::UnknownColumn { .. }), "{err}");
    let err = table
        .scan(&ScanRequest::new().project(["value.*"]))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidColumnName { .. }), "{err}");
}

fn values(batches: &[RecordBatch]) -> Vec<i64> {
    let mut v: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let i = b.schema().index_of("value").unwrap();
            b.column(i)
                .as_primitive::<Int64Type>()
                .iter()
                .flatten()
                .collect::<Vec<_>>()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn predicates_follow_three_valued_logic() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    two_batches(&table);
    let run = |p| values(&table.scan(&ScanRequest::new().filter(p)).unwrap());
    assert_eq!(run(col("labels.pod").eq("a")), [10]);
    // Nulls are unknown under != and NOT, as in SQL.
    assert_eq!(run(col("labels.pod").not_eq("a")), [30]);
    assert_eq!(run(!col("labels.pod").eq("a")), [30]);
    assert_eq!(run(col("labels.pod").is_null()), [5, 6, 20]);
    assert_eq!(run(col("labels.pod").is_not_null()), [10, 30]);
    assert_eq!(run(col("labels.never").is_null()), [5, 6, 10, 20, 30]);
    assert_eq!(run(col("labels.never").eq("x")), Vec::<i64>::new());
    assert_eq!(run(col("timestamp").lt(3)), [10, 20]);
    assert_eq!(run(col("timestamp").lt_eq(3)), [10, 20, 30]);
    assert_eq!(run(col("timestamp").gt(8)), [5]);
    assert_eq!(run(col("timestamp").gt_eq(8)), [5, 6]);
    assert_eq!(run(col("labels.job").in_list(["db", "x"])), [6]);
    assert_eq!(run(col("labels.job").not_in_list(["db"])), [5]);
    // A long list of text is evaluated as a set, with the same answers (nulls unknown).
    let long = |hit: &str| {
        let mut values: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
        values.push(hit.to_owned());
        values
    };
    assert_eq!(run(col("labels.job").in_list(long("db"))), [6]);
    assert_eq!(run(col("labels.job").not_in_list(long("db"))), [5]);
    assert_eq!(run(col("labels.pod").in_list(long("a"))), [10]);
    assert_eq!(run(col("labels.pod").not_in_list(long("a"))), [30]);
    assert_eq!(run(col("labels.job").regex_match("^a")), [5]);
    assert_eq!(run(col("labels.job").regex_not_match("^a")), [6]);
    assert_eq!(
        run(col("labels.pod").eq("a").or(col("labels.job").eq("db"))),
        [6, 10]
    );
    assert_eq!(
        run(col("name").eq("cpu").and(!col("timestamp").gt(2))),
        [10, 20]
    );
    assert_eq!(run(col("value").gt(25u64)), [30]);

    for (bad, what) in [
        (col("timestamp").eq("x"), "cannot be compared"),
        (col("labels.pod").regex_match("("), "bad regex"),
        (col("timestamp").regex_match("1"), "regex match on a Int64"),
        (col("value").eq(frostdb_core::Scalar::Null), "IS NULL"),
    ] {
        let err = table.scan(&ScanRequest::new().filter(bad)).unwrap_err();
        assert!(
            matches!(err, Error::InvalidPredicate { .. }) && err.to_string().contains(what),
            "{err}"
        );
    }
    let err = table
        .scan(&ScanRequest::new().filter(col("missing").eq(1)))
        .unwrap_err();
    assert!(matches!(err, Error::UnknownColumn { .. }));
}

#[test]
fn limits_and_sorted_limits() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    two_batches(&table);
    let out = table.scan(&ScanRequest::new().limit(3)).unwrap();
    assert_eq!(count(&out), 3);
    let out = table
        .scan(&ScanRequest::new().limit(2).sorted(true).project(["value"]))
        .unwrap();
    let v: Vec<i64> = out
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(v, [20, 10]);
    assert_eq!(count(&table.scan(&ScanRequest::new().limit(0)).unwrap()), 0);
}

/// Inserts `n` batches of `rows` rows with distinct pods and rising timestamps.
fn fill(table: &frostdb_core::Table, n: usize, rows: usize) {
    for i in 0..n {
        let pods: Vec<String> = (0..rows)
            .map(|r| format!("pod-{:03}", (i * 7 + r) % 50))
            .collect();
        let pods: Vec<Option<&str>> = pods.iter().map(|p| Some(p.as_str())).collect();
        let ts: Vec<i64> = (0..rows).map(|r| (i * rows + r) as i64).collect();
        table
            .insert(&batch(vec![
                ("name", str_n(if i % 2 == 0 { "cpu" } else { "mem" }, rows)),
                ("labels.pod", strs(&pods)),
                ("timestamp", ints(&ts)),
                ("value", ints(&ts)),
            ]))
            .unwrap();
    }
}

#[test]
fn compaction_is_invisible_to_readers() {
    let db = db();
    let options = TableOptions::default()
        .granule_rows(16)
        .l0_max_rows(100)
        .l0_max_parts(8)
        .level_fanout(2);
    let table = db.table("samples", samples_schema(), options).unwrap();
    fill(&table, 40, 10);
    let request = ScanRequest::new().sorted(true);
    let before = render(&table.scan(&request).unwrap());
    let held = table.snapshot();

    let steps = table.compact().unwrap();
    assert!(steps > 0);
    let stats = table.stats();
    assert_eq!(stats.rows, 400);
    assert!(stats.levels[0].rows < 100, "L0 flushed: {stats:?}");
    assert!(stats.levels[1].chunks + stats.levels[2].chunks > 0);
    assert_eq!(render(&table.scan(&request).unwrap()), before);
    // A snapshot taken before compaction still reads its own version.
    assert_eq!(render(&held.collect(&request).unwrap()), before);

    table.compact_fully().unwrap();
    let stats = table.stats();
    assert_eq!((stats.levels[0].rows, stats.levels[1].rows), (0, 0));
    assert_eq!(stats.levels[2].runs, 1);
    assert_eq!(stats.levels[2].chunks, 400 / 16);
    assert_eq!(render(&table.scan(&request).unwrap()), before);
    let unsorted = table.scan(&ScanRequest::new()).unwrap();
    assert_eq!(
        render(&unsorted),
        before,
        "one run is already in sort order"
    );
}

#[test]
fn granule_statistics_prune() {
    let db = db();
    let options = TableOptions::default().granule_rows(16);
    let table = db.table("samples", samples_schema(), options).unwrap();
    fill(&table, 40, 10);
    table.compact_fully().unwrap();
    let snapshot = table.snapshot();
    let scan = snapshot
        .scan(
            &ScanRequest::new().filter(col("name").eq("cpu").and(col("labels.pod").eq("pod-007"))),
        )
        .unwrap();
    let m = scan.metrics();
    let rows = count(&scan.collect::<Result<Vec<_>, _>>().unwrap());
    let expected = (0..40)
        .step_by(2)
        .flat_map(|i| (0..10).map(move |r| (i * 7 + r) % 50))
        .filter(|&pod| pod == 7)
        .count();
    assert_eq!(rows, expected);
    assert_eq!(m.chunks, 25);
    // The rows sit in at most two granules; a third may straddle the cpu/mem boundary, where
    // per-column min/max cannot exclude pod-007.
    assert!(m.chunks_pruned >= 22, "{m:?}");
    assert!(m.rows_read <= 48, "{m:?}");

    // L0 parts are pruned too: FrostDB scans every L0 record.
    let fresh = db
        .table("fresh", samples_schema(), TableOptions::default())
        .unwrap();
    fill(&fresh, 10, 10);
    let m = fresh
        .snapshot()
        .scan(&ScanRequest::new().filter(col("timestamp").gt_eq(95)))
        .unwrap()
        .metrics();
    assert_eq!((m.chunks, m.chunks_pruned), (10, 9));
}

#[test]
fn bad_inserts_change_nothing() {
    let db = db();
    let table = db
        .table(
            "samples",
            samples_schema(),
            TableOptions::default().max_batch_rows(4),
        )
        .unwrap();
    two_batches(&table);
    let before = table.stats();
    let bad: Vec<RecordBatch> = vec![
        batch(vec![("name", ints(&[1])), ("timestamp", ints(&[1]))]),
        batch(vec![("timestamp", ints(&[1]))]),
        batch(vec![
            ("name", str_n("x", 1)),
            ("timestamp", ints(&[1])),
            ("other", ints(&[1])),
        ]),
        batch(vec![
            ("name", str_n("x", 1)),
            ("timestamp", ints(&[1])),
            ("labels.a.b", str_n("x", 1)),
        ]),
        batch(vec![
            ("name", str_n("x", 5)),
            ("timestamp", ints(&[1, 2, 3, 4, 5])),
        ]),
    ];
    for b in &bad {
        assert!(table.insert(b).is_err());
    }
    assert_eq!(table.stats(), before);
    let empty = batch(vec![("name", str_n("x", 0)), ("timestamp", ints(&[]))]);
    assert_eq!(table.insert(&empty).unwrap(), before.watermark);
    assert_eq!(table.stats(), before);
}

#[test]
fn reopening_a_table_checks_the_schema() {
    let db = db();
    db.table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    assert!(
        db.table("samples", samples_schema(), TableOptions::default())
            .is_ok()
    );
    let other = frostdb_core::Schema::builder("samples")
        .column(frostdb_core::ColumnDef::new("x", DataType::Int64))
        .build()
        .unwrap();
    let mismatch = db
        .table("samples", other, TableOptions::default())
        .unwrap_err();
    assert!(matches!(mismatch, Error::SchemaMismatch { .. }));
    // Compression hints only shape blocks written later: a schema that differs in them
    // opens the table (which keeps its own); an encoding is part of the schema.
    let with_codec = |compression, encoding| {
        frostdb_core::Schema::builder("samples")
            .column(
                frostdb_core::ColumnDef::new("name", DataType::Utf8)
                    .encoding(frostdb_core::Encoding::RleDictionary)
                    .compression(compression),
            )
            .column(
                frostdb_core::ColumnDef::dynamic("labels", DataType::Utf8)
                    .encoding(frostdb_core::Encoding::RleDictionary),
            )
            .column(
                frostdb_core::ColumnDef::new("timestamp", DataType::Int64)
                    .encoding(encoding)
                    .compression(frostdb_core::Compression::Lz4Raw),
            )
            .column(frostdb_core::ColumnDef::new("value", DataType::Int64).nullable(true))
            .sort_by(frostdb_core::SortingColumn::asc("name"))
            .sort_by(frostdb_core::SortingColumn::asc("labels"))
            .sort_by(frostdb_core::SortingColumn::asc("timestamp"))
            .build()
            .unwrap()
    };
    let delta = frostdb_core::Encoding::DeltaBinaryPacked;
    let reopened = db
        .table(
            "samples",
            with_codec(frostdb_core::Compression::Uncompressed, delta),
            TableOptions::default(),
        )
        .unwrap();
    assert_eq!(
        **reopened.schema(),
        samples_schema(),
        "the stored schema is kept"
    );
    let plain = frostdb_core::Encoding::Plain;
    assert!(matches!(
        db.table(
            "samples",
            with_codec(frostdb_core::Compression::Uncompressed, plain),
            TableOptions::default()
        )
        .unwrap_err(),
        Error::SchemaMismatch { .. }
    ));
    assert_eq!(mismatch.kind(), frostdb_core::ErrorKind::Conflict);
    assert_eq!(
        db.table("bad.name", samples_schema(), TableOptions::default())
            .unwrap_err()
            .kind(),
        frostdb_core::ErrorKind::InvalidInput
    );
    assert_eq!(db.tables().len(), 1);
}

struct Waiter(parking_lot::Mutex<mpsc::Sender<CompactionOutcome>>);

impl EventListener for Waiter {
    fn on_compaction_end(&self, _table: &str, outcome: &CompactionOutcome) {
        let _ = self.0.lock().send(outcome.clone());
    }
}

#[test]
fn background_compaction_runs_and_reports() {
    let (tx, rx) = mpsc::channel();
    let db = Db::open_in_memory(
        DbOptions::default().listener(Arc::new(Waiter(parking_lot::Mutex::new(tx)))),
    )
    .unwrap();
    let table = db
        .table(
            "samples",
            samples_schema(),
            TableOptions::default().l0_max_parts(4),
        )
        .unwrap();
    fill(&table, 4, 10);
    let outcome = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("a background flush");
    assert_eq!(outcome.job.from_level, 0);
    assert_eq!(outcome.job.rows, 40);
    assert_eq!(table.stats().rows, 40);
    assert_eq!(values(&table.scan(&ScanRequest::new()).unwrap()).len(), 40);
}

#[test]
fn all_projection_matches_effective_schema() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    two_batches(&table);
    let snapshot = table.snapshot();
    let scan = snapshot
        .scan(&ScanRequest::new().projection(Projection::All))
        .unwrap();
    assert_eq!(scan.schema(), snapshot.schema().arrow_schema());
    let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    assert_eq!(scan.schema().field(1).data_type(), &dict);
}

/// `sort_indices` orders a batch's rows as the table's sort key does (as a sorted scan
/// reads them back), also given only some of the table's columns, and a batch inserted in
/// that order reads back as inserted; a batch the schema refuses is an error.
#[test]
fn sort_indices_order_rows_as_the_table_does() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    let pods = [
        Some("b"),
        None,
        Some("a"),
        Some("b"),
        Some("a"),
        None,
        Some("c"),
    ];
    let jobs = [None, Some("x"), Some("x"), None, None, Some("y"), Some("x")];
    let names = ["mem", "cpu", "cpu", "cpu", "mem", "cpu", "cpu"];
    let times = [5, 3, 9, 1, 2, 8, 4];
    let values: Vec<i64> = (0..7).collect(); // each row's place in the batch
    let rows = batch(vec![
        ("name", strs(&names.map(Some))),
        ("labels.pod", strs(&pods)),
        ("labels.job", strs(&jobs)),
        ("timestamp", ints(&times)),
        ("value", ints(&values)),
    ]);
    let order = table.sort_indices(&rows).unwrap();
    table.insert(&rows).unwrap();
    let stored = table.scan(&ScanRequest::new().sorted(true)).unwrap();
    let read: Vec<u32> = values_of(&stored).into_iter().map(|v| v as u32).collect();
    assert_eq!(order, read, "the order a sorted scan reads");
    assert!(!order.is_sorted(), "the rows were given out of order");

    // The key's columns alone, as a writer ranking its series sends them.
    let key_only = batch(vec![
        ("labels.job", strs(&jobs)),
        ("name", strs(&names.map(Some))),
        ("labels.pod", strs(&pods)),
        ("timestamp", ints(&times)),
    ]);
    assert_eq!(table.sort_indices(&key_only).unwrap(), order);

    // Inserted in that order, the rows read back as inserted, sorted or not.
    let sorted = db
        .table("sorted", samples_schema(), TableOptions::default())
        .unwrap();
    let indices = arrow::array::UInt32Array::from(order.clone());
    sorted
        .insert(&arrow::compute::take_record_batch(&rows, &indices).unwrap())
        .unwrap();
    let unsorted_scan = sorted.scan(&ScanRequest::new()).unwrap();
    assert_eq!(
        values_of(&unsorted_scan),
        order.iter().map(|&i| i64::from(i)).collect::<Vec<_>>()
    );
    sorted.compact_fully().unwrap();
    assert_eq!(
        render(&sorted.scan(&ScanRequest::new().sorted(true)).unwrap()),
        render(&stored)
    );

    let wrong = batch(vec![("timestamp", strs(&[Some("soon")]))]);
    assert!(matches!(
        table.sort_indices(&wrong),
        Err(Error::TypeMismatch { .. })
    ));
    assert!(table.sort_indices(&rows.slice(0, 0)).unwrap().is_empty());
}

/// The `value` column of `batches`, in order.
fn values_of(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("value")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// A scan started under [`frostdb_core::stop_scans_when`] ends at its next batch once the
/// condition gives a reason, with an error naming it, also when read on another thread; a
/// scan started outside reads to its end.
#[test]
fn a_scan_stops_at_its_next_batch_once_its_work_is_called_off() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    fill(&table, 10, 100);
    let snapshot = table.snapshot();
    let request = ScanRequest::new();
    let all: usize = snapshot
        .scan(&request)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(all, 1_000);
    let called_off = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = called_off.clone();
    let scan = frostdb_core::stop_scans_when(
        move || {
            flag.load(std::sync::atomic::Ordering::Acquire)
                .then(|| "the request ended".to_owned())
        },
        || snapshot.scan(&request).unwrap(),
    );
    // Outside the closure, scans are not stopped.
    let outside: usize = snapshot
        .scan(&request)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(outside, 1_000);
    // The scan carries its condition to the thread that reads it.
    let (read, error, after) = std::thread::spawn(move || {
        let mut scan = scan;
        let first = scan.next().unwrap().unwrap().num_rows();
        called_off.store(true, std::sync::atomic::Ordering::Release);
        let error = scan.next().unwrap().unwrap_err();
        (first, error, scan.next().is_none())
    })
    .join()
    .unwrap();
    assert!(read > 0 && read < 1_000, "{read}");
    assert!(matches!(error, Error::Stopped { .. }), "{error}");
    assert_eq!(error.kind(), frostdb_core::ErrorKind::Unavailable);
    assert!(error.to_string().contains("the request ended"), "{error}");
    assert!(after, "a stopped scan ends");
}

/// [`Scan::stop_when`] stops a scan at its next source batch, not its next batch with
/// rows: a filter that matches no row of ten parts (which statistics cannot prune) stops
/// after the condition first holds, at the third batch looked at. Before, the scan's first
/// step read every part and ended, whatever the condition said meanwhile.
#[test]
fn a_scan_stops_at_its_next_source_batch_once_told() {
    let db = db();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    fill(&table, 10, 100);
    let request = ScanRequest::new().filter(col("labels.pod").eq("pod-007x"));
    let mut scan = table.snapshot().scan(&request).unwrap();
    let checks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = checks.clone();
    scan.stop_when(move || {
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        (n >= 3).then(|| "the reader left".to_owned())
    });
    let error = scan.next().unwrap().unwrap_err();
    assert!(error.to_string().contains("the reader left"), "{error}");
    assert_eq!(checks.load(std::sync::atomic::Ordering::Relaxed), 3);
    // Unstopped, the same scan finds nothing in all ten.
    assert!(table.snapshot().scan(&request).unwrap().next().is_none());
}
