//! The model under faults: random writes, persistence, compaction, WAL rotation, block
//! deletion, retention, clean reopens and crashes, over an object store and a file layer that
//! inject faults (`common::faults`): writes not fsynced lost at a crash, torn appends, a full
//! disk, failing fsyncs, object-store errors and timeouts whose operation took effect.
//!
//! The model is the set of writes (each a batch of rows tagged with its write number):
//! - *acknowledged* writes (insert returned `Ok`) must be present, exactly once, whole;
//! - *unacknowledged* writes (insert failed) may be present or not, but only whole;
//! - a write seen absent after a recovery, or deleted with its block, never comes back;
//! - a query either errors (only while the object store is failing) or answers exactly.
//!
//! Cases: `PROPTEST_CASES` (default 300; the long run in the README uses 10,000, through
//! `cargo test`, which has no per-test timeout).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema as ArrowSchema};
use common::faults::{FaultFs, FaultStore, Faulty};
use frostdb_core::{
    BlockMeta, ColumnDef, Db, DbOptions, Encoding, ScanRequest, Schema, SortingColumn, Table,
    TableOptions, col,
};
use proptest::prelude::*;

const DIR: &str = "/db";
const LABELS: [&str; 2] = ["a", "b"];
const VALUES: [&str; 2] = ["x", "y"];
const NAMES: [&str; 2] = ["cpu", "mem"];

fn schema() -> Schema {
    Schema::builder("samples")
        .column(ColumnDef::new("name", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::new("ts", DataType::Int64))
        .column(ColumnDef::new("write", DataType::Int64))
        .column(ColumnDef::new("value", DataType::Int64))
        .sort_by(SortingColumn::asc("name"))
        .sort_by(SortingColumn::asc("labels"))
        .sort_by(SortingColumn::asc("ts"))
        .build()
        .unwrap()
}

fn table_options() -> TableOptions {
    TableOptions::default()
        .granule_rows(4)
        .l0_max_rows(16)
        .l0_max_parts(3)
        .level_fanout(2)
        .levels(2)
        .row_group_rows(8)
        .time_column("ts")
}

/// One row as the model keeps it and as a scan renders it.
type Row = (String, Option<String>, Option<String>, i64, i64);

#[derive(Debug, Clone)]
enum Op {
    /// Rows of `(name, label values, ts, value)` over the label subset `labels`.
    Insert {
        labels: Vec<&'static str>,
        rows: Vec<(usize, Vec<usize>, i64, i64)>,
    },
    Persist,
    Compact,
    CompactFully,
    /// Deletes the persisted blocks whose position has its bit set.
    DeleteBlocks(u8),
    /// A retention pass with a ttl every row is older than.
    Retention,
    Reopen,
    /// A crash; with `Some(p)`, each file keeps `p`% of its unsynced appends.
    Crash(Option<u8>),
    DiskFull,
    /// A full disk, and the cut-off of the part of a record that reached it fails too.
    DiskFullUncut,
    FailSyncs(u8),
    StoreFails(u8),
    StoreTimesOut(u8),
    Heal,
}

fn insert() -> impl Strategy<Value = Op> {
    prop::sample::subsequence(LABELS.to_vec(), 0..=2).prop_flat_map(|labels| {
        let n = labels.len();
        let row = (
            0..NAMES.len(),
            prop::collection::vec(0..VALUES.len(), n),
            0i64..20,
            -5i64..100,
        );
        prop::collection::vec(row, 1..6).prop_map(move |rows| Op::Insert {
            labels: labels.clone(),
            rows,
        })
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => insert(),
        3 => Just(Op::Persist),
        1 => Just(Op::Compact),
        1 => Just(Op::CompactFully),
        1 => any::<u8>().prop_map(Op::DeleteBlocks),
        1 => Just(Op::Retention),
        1 => Just(Op::Reopen),
        2 => prop::option::of(0u8..=100).prop_map(Op::Crash),
        1 => Just(Op::DiskFull),
        1 => Just(Op::DiskFullUncut),
        1 => (1u8..3).prop_map(Op::FailSyncs),
        1 => (1u8..4).prop_map(Op::StoreFails),
        1 => (1u8..3).prop_map(Op::StoreTimesOut),
        2 => Just(Op::Heal),
    ]
}

/// What the model knows about a write.
#[derive(Debug, Clone, PartialEq)]
enum Fate {
    /// Acknowledged as transaction `tx`.
    Acked(u64),
    /// Its insert failed: it may or may not be there.
    Unknown,
    /// Deleted, or absent after a recovery: never again.
    Gone,
}

#[derive(Debug, Default)]
struct Model {
    writes: BTreeMap<i64, (Fate, Vec<Row>)>,
}

fn to_batch(write: i64, labels: &[&str], rows: &[(usize, Vec<usize>, i64, i64)]) -> RecordBatch {
    let mut columns: Vec<(String, ArrayRef)> = vec![
        (
            "name".into(),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| NAMES[r.0]),
            )),
        ),
        (
            "ts".into(),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
        ),
        (
            "write".into(),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|_| write))),
        ),
        (
            "value".into(),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        ),
    ];
    for (i, l) in labels.iter().enumerate() {
        let values = StringArray::from_iter_values(rows.iter().map(|r| VALUES[r.1[i]]));
        columns.push((format!("labels.{l}"), Arc::new(values)));
    }
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(n, a.data_type().clone(), false))
        .collect();
    RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn model_rows(labels: &[&str], rows: &[(usize, Vec<usize>, i64, i64)]) -> Vec<Row> {
    let label = |r: &(usize, Vec<usize>, i64, i64), name: &str| {
        labels
            .iter()
            .position(|l| *l == name)
            .map(|i| VALUES[r.1[i]].to_owned())
    };
    let mut out: Vec<Row> = rows
        .iter()
        .map(|r| {
            (
                NAMES[r.0].to_owned(),
                label(r, "a"),
                label(r, "b"),
                r.2,
                r.3,
            )
        })
        .collect();
    out.sort();
    out
}

/// A scan's rows grouped by write number, each group sorted.
fn by_write(batches: &[RecordBatch]) -> BTreeMap<i64, Vec<Row>> {
    let mut out: BTreeMap<i64, Vec<Row>> = BTreeMap::new();
    for b in batches {
        let strings = |name: &str| -> Option<Vec<Option<String>>> {
            let c = b.column_by_name(name)?;
            let c = arrow::compute::cast(c, &DataType::Utf8).unwrap();
            let c = c.as_string::<i32>();
            Some(
                (0..c.len())
                    .map(|i| c.is_valid(i).then(|| c.value(i).to_owned()))
                    .collect(),
            )
        };
        let ints = |name: &str| {
            b.column_by_name(name)
                .unwrap()
                .as_primitive::<Int64Type>()
                .clone()
        };
        let names = strings("name").unwrap();
        let (a, bl) = (strings("labels.a"), strings("labels.b"));
        let (ts, write, value) = (ints("ts"), ints("write"), ints("value"));
        for i in 0..b.num_rows() {
            let get = |c: &Option<Vec<Option<String>>>| c.as_ref().and_then(|c| c[i].clone());
            out.entry(write.value(i)).or_default().push((
                names[i].clone().unwrap(),
                get(&a),
                get(&bl),
                ts.value(i),
                value.value(i),
            ));
        }
    }
    for rows in out.values_mut() {
        rows.sort();
    }
    out
}

struct World {
    fs: FaultFs,
    store: Arc<FaultStore>,
    db: Option<(Db, Table)>,
}

impl World {
    fn open(&mut self) -> frostdb_core::Result<()> {
        let options = DbOptions::default()
            .background_compaction(false)
            .wal_segment_bytes(700)
            .retention_interval(std::time::Duration::from_secs(86_400 * 365))
            .file_system(Arc::new(self.fs.clone()));
        let db = Db::open_with_store(
            Path::new(DIR),
            Arc::new(Faulty(self.store.clone())),
            "",
            options,
        )?;
        let table = db.table("samples", schema(), table_options())?;
        self.db = Some((db, table));
        Ok(())
    }

    fn table(&self) -> &Table {
        &self.db.as_ref().expect("open").1
    }

    fn heal(&self) {
        self.fs.set_full(false);
        self.fs.fail_syncs(0);
        self.fs.fail_cuts(0);
        self.fs.full_in(0);
        self.store.heal();
    }

    /// Opens after a crash or a close; faults armed may make the first try fail, a healed
    /// world may not.
    fn recover(&mut self) -> Result<(), TestCaseError> {
        if self.open().is_err() {
            self.heal();
            if let Err(e) = self.open() {
                return Err(TestCaseError::fail(format!("recovery failed: {e}")));
            }
        }
        Ok(())
    }
}

/// Checks the table against the model. After a recovery, unacknowledged writes not seen are
/// gone for good.
fn check(
    world: &World,
    model: &mut Model,
    store_failing: bool,
    recovered: bool,
) -> Result<(), TestCaseError> {
    let batches = match world.table().scan(&ScanRequest::new()) {
        Ok(b) => b,
        Err(e) => {
            prop_assert!(store_failing, "a query failed with nothing failing: {e}");
            return Ok(());
        }
    };
    let seen = by_write(&batches);
    for (write, rows) in &seen {
        let Some((fate, want)) = model.writes.get(write) else {
            return Err(TestCaseError::fail(format!("write {write} was never made")));
        };
        prop_assert!(*fate != Fate::Gone, "write {} came back: {:?}", write, rows);
        prop_assert_eq!(rows, want, "write {} is not whole, or twice", write);
    }
    for (write, (fate, _)) in model.writes.iter_mut() {
        match fate {
            Fate::Acked(tx) => prop_assert!(
                seen.contains_key(write),
                "acknowledged write {} (tx {}) is missing",
                write,
                tx
            ),
            Fate::Unknown if recovered && !seen.contains_key(write) => *fate = Fate::Gone,
            _ => {}
        }
    }
    // A filtered, sorted query agrees with the unfiltered one.
    let request = ScanRequest::new()
        .filter(col("name").eq("cpu"))
        .sorted(true);
    if let Ok(batches) = world.table().scan(&request) {
        let cpu: BTreeMap<i64, Vec<Row>> = seen
            .iter()
            .map(|(w, rows)| {
                let rows: Vec<Row> = rows.iter().filter(|r| r.0 == "cpu").cloned().collect();
                (*w, rows)
            })
            .filter(|(_, rows)| !rows.is_empty())
            .collect();
        prop_assert_eq!(by_write(&batches), cpu);
        let ts: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let labels: Vec<_> = LABELS
                    .iter()
                    .map(|l| b.column_by_name(&format!("labels.{l}")).cloned())
                    .collect();
                let ts = b
                    .column_by_name("ts")
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .clone();
                (0..b.num_rows())
                    .filter(move |&i| {
                        labels
                            .iter()
                            .all(|c| c.as_ref().is_none_or(|c| c.is_null(i)))
                    })
                    .map(move |i| ts.value(i))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Rows without labels come first in sort order, by time.
        prop_assert!(ts.is_sorted(), "sorted scan out of order: {:?}", ts);
    } else {
        prop_assert!(
            store_failing,
            "a filtered query failed with nothing failing"
        );
    }
    Ok(())
}

/// Marks the writes of deleted blocks gone: those listed before and not after, and those
/// the call reports (a retention pass may persist a block and delete it at once).
fn deleted(model: &mut Model, before: &[BlockMeta], after: &[BlockMeta], reported: &[BlockMeta]) {
    let kept: BTreeSet<u64> = after.iter().map(|b| b.id).collect();
    let gone = before
        .iter()
        .filter(|b| !kept.contains(&b.id))
        .chain(reported);
    for block in gone {
        for (fate, _) in model.writes.values_mut() {
            if let Fate::Acked(tx) = fate
                && (block.min_tx..=block.max_tx).contains(tx)
            {
                *fate = Fate::Gone;
            }
        }
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut world = World {
        fs: FaultFs::default(),
        store: Arc::new(FaultStore::default()),
        db: None,
    };
    world.open().unwrap();
    let mut model = Model::default();
    let mut next_write = 0i64;
    for op in ops {
        note(format!("{op:?}"));
        let mut recovered = false;
        match op {
            Op::Insert { labels, rows } => {
                next_write += 1;
                let batch = to_batch(next_write, labels, rows);
                let fate = match world.table().insert(&batch) {
                    Ok(tx) => Fate::Acked(tx),
                    Err(_) => Fate::Unknown,
                };
                note(format!("  write {next_write}: {fate:?}"));
                model
                    .writes
                    .insert(next_write, (fate, model_rows(labels, rows)));
            }
            Op::Persist => {
                let result = world.table().persist();
                note(format!("  {:?}", result.map(|b| b.len())));
            }
            Op::Compact => {
                world.table().compact().unwrap();
            }
            Op::CompactFully => {
                world.table().compact_fully().unwrap();
            }
            Op::DeleteBlocks(mask) => {
                let before = world.table().blocks();
                let doomed: BTreeSet<u64> = before
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << (i % 8)) != 0)
                    .map(|(_, b)| b.id)
                    .collect();
                let result = world.table().delete_blocks(|b| doomed.contains(&b.id));
                let after = world.table().blocks();
                prop_assert!(
                    result.is_ok() || after.len() == before.len(),
                    "a failed deletion deleted blocks"
                );
                let reported = result.as_deref().unwrap_or_default();
                deleted(&mut model, &before, &after, reported);
            }
            Op::Retention => {
                let before = world.table().blocks();
                let table = world.table();
                let result = table
                    .set_ttl(Some(std::time::Duration::from_secs(3600)))
                    .and_then(|_| table.enforce_retention());
                let after = world.table().blocks();
                let ranges = |b: &[BlockMeta]| -> Vec<(u64, u64)> {
                    b.iter().map(|b| (b.min_tx, b.max_tx)).collect()
                };
                note(format!(
                    "  {:?}: blocks {:?} -> {:?}",
                    result.as_ref().map(|d| ranges(d)),
                    ranges(&before),
                    ranges(&after)
                ));
                if result.is_ok() {
                    // Every row is older than the ttl: no block listed before survives (one
                    // persisted during the pass may wait for the next).
                    let kept: BTreeSet<u64> = after.iter().map(|b| b.id).collect();
                    prop_assert!(
                        before.iter().all(|b| !kept.contains(&b.id)),
                        "retention kept an expired block"
                    );
                }
                let reported = result.as_deref().unwrap_or_default();
                deleted(&mut model, &before, &after, reported);
                let _ = table.set_ttl(None);
            }
            Op::Reopen => {
                world.db = None;
                world.recover()?;
                recovered = true;
            }
            Op::Crash(torn) => {
                let keep = torn.map(|p| move |n: usize| n * p as usize / 100);
                let fs = world
                    .fs
                    .crash(keep.as_ref().map(|k| k as &dyn Fn(usize) -> usize));
                world.db = None;
                world.fs = fs;
                world.recover()?;
                recovered = true;
            }
            Op::DiskFull => world.fs.set_full(true),
            Op::DiskFullUncut => {
                // Past the next write (a new segment's header, when the log rotates), so
                // that a record's append is what fails.
                world.fs.full_in(2);
                world.fs.fail_cuts(1);
            }
            Op::FailSyncs(n) => world.fs.fail_syncs(*n as usize),
            Op::StoreFails(n) => world.store.fail_next(*n as usize),
            Op::StoreTimesOut(n) => world.store.time_out_next(*n as usize),
            Op::Heal => world.heal(),
        }
        let store_failing = world.store.failing();
        check(&world, &mut model, store_failing, recovered)?;
    }
    // Healed and recovered from a last crash, everything acknowledged is there.
    world.heal();
    let fs = world.fs.crash(None);
    world.db = None;
    world.fs = fs;
    world.recover()?;
    check(&world, &mut model, false, true)?;
    Ok(())
}

/// A failed append whose cut-off fails too leaves part of a record in the segment: the log
/// takes no more writes, where the next one was acknowledged after the garbage and the next
/// open then refused the database; after a crash every acknowledged write is back.
#[test]
fn a_failed_append_that_cannot_be_cut_off_stops_the_log() {
    let write = || Op::Insert {
        labels: vec![],
        rows: vec![(0, vec![], 1, 1)],
    };
    traced(&[
        write(),
        Op::DiskFullUncut,
        write(),
        Op::Heal,
        write(),
        Op::Crash(None),
        write(),
    ])
    .unwrap();
}

thread_local! {
    static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Notes a step of the current case, shown when it fails.
fn note(line: String) {
    TRACE.with(|t| t.borrow_mut().push(line));
}

/// Runs a case; a failure carries the steps that led to it.
fn traced(ops: &[Op]) -> Result<(), TestCaseError> {
    TRACE.with(|t| t.borrow_mut().clear());
    run(ops).map_err(|e| {
        let steps = TRACE.with(|t| t.borrow().join("\n"));
        TestCaseError::fail(format!("{e}\nsteps:\n{steps}"))
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_engine_matches_the_model_under_faults(ops in prop::collection::vec(op(), 1..40)) {
        traced(&ops)?;
    }
}
