//! Writers and readers on many threads, with background compaction running: every snapshot
//! must hold exactly the transactions up to its watermark, each one whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema as ArrowSchema};
use frostdb_core::{
    ColumnDef, CompactionOutcome, Db, DbOptions, Encoding, EventListener, ScanRequest, Schema,
    SortingColumn, Table, TableOptions,
};
use parking_lot::Mutex;

const WRITERS: usize = 4;
const READERS: usize = 2;
const BATCHES_PER_WRITER: i64 = 150;

fn schema() -> Schema {
    Schema::builder("c")
        .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
        .column(ColumnDef::new("batch", DataType::Int64))
        .column(ColumnDef::new("value", DataType::Int64))
        .sort_by(SortingColumn::asc("labels"))
        .sort_by(SortingColumn::asc("value"))
        .build()
        .unwrap()
}

/// Batch `id` has `1 + id % 7` rows and a label of its writer, so the schema grows while
/// readers read.
fn make_batch(writer: usize, id: i64) -> RecordBatch {
    let rows = 1 + (id % 7) as usize;
    let fields = vec![
        Field::new(format!("labels.w{writer}"), DataType::Utf8, true),
        Field::new("batch", DataType::Int64, false),
        Field::new("value", DataType::Int64, false),
    ];
    RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        vec![
            Arc::new(StringArray::from(vec![format!("v{}", id % 3); rows])),
            Arc::new(Int64Array::from(vec![id; rows])),
            Arc::new(Int64Array::from_iter_values(
                (0..rows as i64).map(|r| (id * 31 + r) % 97),
            )),
        ],
    )
    .unwrap()
}

/// Rows per batch id in a snapshot of `table`.
fn observe(table: &Table) -> (u64, BTreeMap<i64, usize>) {
    let snapshot = table.snapshot();
    let mut seen = BTreeMap::new();
    for b in snapshot
        .scan(&ScanRequest::new().project(["batch"]))
        .unwrap()
    {
        for id in b.unwrap().column(0).as_primitive::<Int64Type>().values() {
            *seen.entry(*id).or_insert(0) += 1;
        }
    }
    (snapshot.watermark(), seen)
}

#[test]
fn snapshots_are_prefixes_of_committed_transactions() {
    let (events, compactions) = std::sync::mpsc::channel();
    let listener = Arc::new(Compactions(Mutex::new(events)));
    let db = Db::open_in_memory(DbOptions::default().listener(listener)).unwrap();
    let options = TableOptions::default()
        .granule_rows(32)
        .l0_max_rows(200)
        .l0_max_parts(16)
        .level_fanout(3);
    let table = db.table("c", schema(), options).unwrap();
    let committed: Arc<Mutex<HashMap<i64, (u64, usize)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));

    let observations = std::thread::scope(|s| {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (table, done) = (table.clone(), done.clone());
                s.spawn(move || {
                    let mut observations = Vec::new();
                    while !done.load(Ordering::Acquire) {
                        observations.push(observe(&table));
                    }
                    observations
                })
            })
            .collect();
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (table, committed) = (table.clone(), committed.clone());
                s.spawn(move || {
                    for i in 0..BATCHES_PER_WRITER {
                        let id = w as i64 * 10_000 + i;
                        let batch = make_batch(w, id);
                        let tx = table.insert(&batch).unwrap();
                        committed.lock().insert(id, (tx, batch.num_rows()));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        readers
            .into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });

    let committed = committed.lock().clone();
    let total = WRITERS * BATCHES_PER_WRITER as usize;
    let mut txs: Vec<u64> = committed.values().map(|(tx, _)| *tx).collect();
    txs.sort();
    assert_eq!(
        txs,
        (1..=total as u64).collect::<Vec<_>>(),
        "dense, unique tx ids"
    );

    assert!(observations.len() >= READERS, "readers observed");
    let mut last_by_reader_order = 0;
    for (watermark, seen) in observations.iter().chain(std::iter::once(&observe(&table))) {
        let expected: BTreeMap<i64, usize> = committed
            .iter()
            .filter(|(_, (tx, _))| tx <= watermark)
            .map(|(id, (_, rows))| (*id, *rows))
            .collect();
        assert_eq!(seen, &expected, "snapshot at watermark {watermark}");
        last_by_reader_order = last_by_reader_order.max(*watermark);
    }
    assert_eq!(last_by_reader_order, total as u64);
    let first = compactions
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("background compaction ran");
    assert_eq!(first.job.from_level, 0);
    let (_, seen) = observe(&table);
    assert_eq!(seen.values().sum::<usize>(), table.stats().rows);
}

struct Compactions(Mutex<std::sync::mpsc::Sender<CompactionOutcome>>);

impl EventListener for Compactions {
    fn on_compaction_end(&self, _table: &str, outcome: &CompactionOutcome) {
        let _ = self.0.lock().send(outcome.clone());
    }
}
