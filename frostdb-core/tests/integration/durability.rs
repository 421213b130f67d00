//! Scenario tests of the on-disk database: WAL replay, block persistence and reads across
//! memory and blocks, pruning, bad storage, retention.

use crate::common;

use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use common::*;
use frostdb_core::{
    BlockMeta, Db, DbOptions, Error, ErrorKind, ScanRequest, Table, TableOptions, col,
};
use object_store::memory::InMemory;
use tempfile::TempDir;

fn options() -> DbOptions {
    DbOptions::default().background_compaction(false)
}

fn small_blocks() -> TableOptions {
    TableOptions::default()
        .granule_rows(16)
        .row_group_rows(64)
        .l0_max_parts(8)
}

/// Batch `i`: 10 rows, pods `pod-(i*7+r)%50`, timestamps `i*10+r`, values `i*1000+r`.
fn fill(table: &Table, from: usize, to: usize) {
    for i in from..to {
        let pods: Vec<String> = (0..10)
            .map(|r| format!("pod-{:03}", (i * 7 + r) % 50))
            .collect();
        let pods: Vec<Option<&str>> = pods.iter().map(|p| Some(p.as_str())).collect();
        let ts: Vec<i64> = (0..10).map(|r| (i * 10 + r) as i64).collect();
        let values: Vec<i64> = (0..10).map(|r| (i * 1000 + r) as i64).collect();
        table
            .insert(&batch(vec![
                ("name", str_n(if i % 2 == 0 { "cpu" } else { "mem" }, 10)),
                ("labels.pod", strs(&pods)),
                ("timestamp", ints(&ts)),
                ("value", ints(&values)),
            ]))
            .unwrap();
    }
}

fn values(batches: &[RecordBatch]) -> Vec<i64> {
    let mut v: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let i = b.schema().index_of("value").unwrap();
            b.column(i).as_primitive::<Int64Type>().values().to_vec()
        })
        .collect();
    v.sort();
    v
}

fn expected(from: usize, to: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (from..to)
        .flat_map(|i| (0..10).map(move |r| (i * 1000 + r) as i64))
        .collect();
    v.sort();
    v
}

#[test]
fn the_wal_brings_back_unpersisted_writes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let table = db
            .table("samples", samples_schema(), small_blocks())
            .unwrap();
        fill(&table, 0, 20);
        assert_eq!(table.stats().blocks, 0);
    }
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .get_table("samples")
        .expect("recovered from the manifest");
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(0, 20)
    );
    // Transaction ids continue after the replayed ones.
    assert_eq!(table.stats().watermark, 20);
    fill(&table, 20, 21);
    assert_eq!(table.stats().watermark, 21);
}

#[test]
fn persisted_blocks_read_back_with_memory_as_one_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&table, 0, 30);
    let sorted = ScanRequest::new().sorted(true);
    let before = render(&table.scan(&sorted).unwrap());
    let blocks = table.persist().unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].rows, 300);
    assert_eq!(blocks[0].row_groups, 5, "300 rows in row groups of 64");
    let stats = table.stats();
    assert_eq!(
        (stats.blocks, stats.block_rows, stats.frozen_blocks),
        (1, 300, 0)
    );
    assert!(stats.levels.iter().all(|l| l.rows == 0), "memory freed");
    assert_eq!(render(&table.scan(&sorted).unwrap()), before);

    // New writes live in memory beside the block; one sorted snapshot covers both.
    fill(&table, 30, 40);
    let all = table.scan(&ScanRequest::new()).unwrap();
    assert_eq!(values(&all), expected(0, 40));
    let merged = table
        .scan(&sorted.clone().project(["name", "labels.pod", "timestamp"]))
        .unwrap();
    let mut keys: Vec<(String, String, i64)> = Vec::new();
    for b in &merged {
        for i in 0..b.num_rows() {
            let text = |c: usize| match frostdb_core::Scalar::from_array(b.column(c).as_ref(), i) {
                frostdb_core::Scalar::Utf8(s) => s,
                other => panic!("{other:?}"),
            };
            let ts = b.column(2).as_primitive::<Int64Type>().value(i);
            keys.push((text(0), text(1), ts));
        }
    }
    let mut sorted_keys = keys.clone();
    sorted_keys.sort();
    assert_eq!(keys.len(), 400);
    assert!(keys == sorted_keys, "blocks and memory merge in sort order");

    drop(table);
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(0, 40)
    );
    assert_eq!(table.stats().blocks, 1);
}

/// Batches 0..150 in three persisted blocks of 50 (the database's directory kept with it).
fn three_blocks() -> (tempfile::TempDir, Db, Table) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    for (from, to) in [(0, 50), (50, 100), (100, 150)] {
        fill(&table, from, to);
        table.persist().unwrap();
    }
    (dir, db, table)
}

#[test]
fn blocks_row_groups_and_pages_are_pruned() {
    let (_dir, _db, table) = three_blocks();
    assert_eq!(table.stats().blocks, 3);
    // Timestamps 600..620 are batches 60 and 61: one block, and within it few rows.
    let filter = col("timestamp").gt_eq(600).and(col("timestamp").lt(620));
    let scan = table
        .snapshot()
        .scan(&ScanRequest::new().filter(filter).project(["value"]))
        .unwrap();
    let m = scan.metrics();
    let got = values(&scan.collect::<Result<Vec<_>, _>>().unwrap());
    assert_eq!(got, expected(60, 62));
    assert_eq!((m.blocks, m.blocks_pruned), (3, 2), "{m:?}");
    assert!(
        m.row_groups_pruned > 0 || m.rows_skipped_by_pages > 0,
        "{m:?}"
    );
    assert!(
        m.rows_read < 500,
        "read {} of 500 rows of the block: {m:?}",
        m.rows_read
    );

    // A label selective within a block's sort order: pages skip the rest.
    let scan = table
        .snapshot()
        .scan(
            &ScanRequest::new().filter(col("name").eq("cpu").and(col("labels.pod").eq("pod-007"))),
        )
        .unwrap();
    let m = scan.metrics();
    let rows: usize = scan.map(|b| b.unwrap().num_rows()).sum();
    let want = (0..150)
        .step_by(2)
        .flat_map(|i| (0..10).map(move |r| (i * 7 + r) % 50))
        .filter(|&p| p == 7)
        .count();
    assert_eq!(rows, want);
    assert!(m.rows_read < 1500 / 4, "{m:?}");
}

#[test]
fn filters_that_statistics_prove_are_not_evaluated() {
    let (_dir, _db, table) = three_blocks();
    let scan = |filter: frostdb_core::Predicate| {
        let scan = table
            .snapshot()
            .scan(&ScanRequest::new().filter(filter).project(["value"]))
            .unwrap();
        let m = scan.metrics();
        (values(&scan.collect::<Result<Vec<_>, _>>().unwrap()), m)
    };
    // Every row of the last block holds: proven, and the answer unchanged.
    let (got, m) = scan(col("timestamp").gt_eq(1000));
    assert_eq!(got, expected(100, 150));
    assert_eq!(m.blocks_pruned, 2, "{m:?}");
    assert_eq!(
        m.row_groups_proven,
        m.row_groups - m.row_groups_pruned,
        "{m:?}"
    );
    // Every row of every block: all three proven.
    let (got, m) = scan(col("timestamp").gt_eq(0).and(col("name").not_eq("nope")));
    assert_eq!(got, expected(0, 150));
    assert_eq!(
        (m.row_groups_proven, m.row_groups_pruned),
        (m.row_groups, 0),
        "{m:?}"
    );
    // Rows on both sides of the bound in one block: filtered, as ever.
    let (got, m) = scan(col("timestamp").gt_eq(655));
    let mut want = expected(66, 150);
    want.extend((5..10).map(|r| 65_000 + r));
    want.sort();
    assert_eq!(got, want);
    let read = m.row_groups - m.row_groups_pruned;
    assert!(
        m.row_groups_proven >= 8 && m.row_groups_proven < read,
        "{m:?}"
    );
    // Row groups of one name are proven, the one where the names meet is filtered.
    let (got, m) = scan(col("name").eq("cpu"));
    let read = m.row_groups - m.row_groups_pruned;
    assert!(
        m.row_groups_proven > 0 && m.row_groups_proven < read,
        "{m:?}"
    );
    let want: Vec<i64> = expected(0, 150)
        .into_iter()
        .filter(|v| (v / 1000) % 2 == 0)
        .collect();
    assert_eq!(got, want);
    // A conjunct proven where the other is not: row groups of the last two blocks hold
    // timestamps >= 500 throughout, so only the name is evaluated there.
    let (got, m) = scan(col("timestamp").gt_eq(500).and(col("name").eq("cpu")));
    assert!(m.row_groups_partly_proven > 0, "{m:?}");
    let want: Vec<i64> = expected(50, 150)
        .into_iter()
        .filter(|v| (v / 1000) % 2 == 0)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn columns_of_one_value_are_filled_in_from_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    // A value of 10 for cpu rows and 20 for mem rows: one value per row group but where
    // the names meet.
    for i in 0..40 {
        let (name, value) = if i % 2 == 0 { ("cpu", 10) } else { ("mem", 20) };
        let ts: Vec<i64> = (0..10).map(|r| i * 10 + r).collect();
        table
            .insert(&batch(vec![
                ("name", str_n(name, 10)),
                ("timestamp", ints(&ts)),
                ("value", ints(&[value; 10])),
            ]))
            .unwrap();
    }
    table.persist().unwrap();
    let scan = |filter: Option<frostdb_core::Predicate>| {
        let mut request = ScanRequest::new().project(["name", "value"]);
        if let Some(f) = filter {
            request = request.filter(f);
        }
        let scan = table.snapshot().scan(&request).unwrap();
        let m = scan.metrics();
        let mut rows: Vec<(String, i64)> = Vec::new();
        for b in scan {
            let b = b.unwrap();
            let names =
                arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
            let values = b.column(1).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                rows.push((
                    names.as_string::<i32>().value(i).to_owned(),
                    values.value(i),
                ));
            }
        }
        (rows, m)
    };
    let (rows, m) = scan(None);
    assert_eq!(rows.len(), 400);
    assert!(
        rows.iter()
            .all(|(n, v)| *v == if n == "cpu" { 10 } else { 20 })
    );
    let read = m.row_groups - m.row_groups_pruned;
    assert!(
        m.columns_from_statistics > 0 && m.columns_from_statistics < read,
        "{m:?}"
    );
    // Filtered on the filled-in column: the same rows as by name.
    let (rows, _) = scan(Some(col("value").eq(20i64)));
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|(n, _)| n == "mem"));
}

#[test]
fn rotation_persists_in_the_background_and_truncates_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let listener = Arc::new(Persisted(parking_lot::Mutex::new(tx)));
    let db = Db::open(dir.path(), DbOptions::default().listener(listener)).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema(),
            small_blocks().block_size(20_000),
        )
        .unwrap();
    fill(&table, 0, 100);
    let first = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a block persisted in the background");
    assert!(first.rows > 0);
    db.flush().unwrap();
    let stats = table.stats();
    assert_eq!(stats.rows, 1000);
    assert_eq!(stats.block_rows, 1000);
    assert!(stats.blocks >= 2, "{stats:?}");
    assert!(stats.wal_bytes < 1000, "WAL prefix deleted: {stats:?}");
    let wal_files = std::fs::read_dir(dir.path().join("wal")).unwrap().count();
    assert_eq!(wal_files, 1, "only the current segment remains");
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(0, 100)
    );
}

struct Persisted(parking_lot::Mutex<std::sync::mpsc::Sender<frostdb_core::BlockMeta>>);

impl frostdb_core::EventListener for Persisted {
    fn on_persist_end(&self, _table: &str, block: &frostdb_core::BlockMeta) {
        let _ = self.0.lock().send(block.clone());
    }
}

#[test]
fn any_object_store_holds_the_blocks_and_the_manifest_mirror() {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
    let first = tempfile::tempdir().unwrap();
    {
        let db = Db::open_with_store(first.path(), store.clone(), "db1", options()).unwrap();
        let table = db
            .table("samples", samples_schema(), small_blocks())
            .unwrap();
        fill(&table, 0, 10);
        db.flush().unwrap();
    }
    // A fresh local directory: the manifest comes from the store.
    let second = tempfile::tempdir().unwrap();
    let db = Db::open_with_store(second.path(), store, "db1", options()).unwrap();
    let table = db
        .get_table("samples")
        .expect("table from the mirrored manifest");
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(0, 10)
    );
}

#[test]
fn retired_blocks_stay_readable_by_older_snapshots_and_orphans_go_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&table, 0, 10);
    let old = table.persist().unwrap().remove(0);
    fill(&table, 10, 20);
    table.persist().unwrap();
    let blocks_dir = dir.path().join("blocks").join("samples");
    let files = || std::fs::read_dir(&blocks_dir).unwrap().count();
    assert_eq!(files(), 2);

    // A snapshot taken before the deletion, and a scan of it started before.
    let before = table.snapshot();
    let mut started = before
        .scan(&ScanRequest::new().batch_rows(1).sorted(true))
        .unwrap();
    let first = started.next().unwrap().unwrap();
    let deleted = table.delete_blocks(|b| b.id == old.id).unwrap();
    assert_eq!(deleted.len(), 1);
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(10, 20)
    );
    assert_eq!(
        files(),
        2,
        "the object stays while a snapshot holds its block"
    );
    let mut rest = vec![first];
    rest.extend(started.map(Result::unwrap));
    assert_eq!(
        values(&rest),
        expected(0, 20),
        "the started scan reads it whole"
    );
    assert_eq!(
        values(
            &before
                .scan(&ScanRequest::new())
                .unwrap()
                .map(Result::unwrap)
                .collect::<Vec<_>>()
        ),
        expected(0, 20),
        "and so does a new scan of the old snapshot"
    );
    drop(before);
    table.enforce_retention().unwrap(); // a maintenance pass reaps what nobody holds
    assert_eq!(files(), 1, "the last holder gone, the object is deleted");

    // An object the manifest does not list (a crash between writing a block and recording
    // it) is deleted at the next open; listed blocks are kept.
    std::fs::copy(
        blocks_dir.join(
            std::fs::read_dir(&blocks_dir)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .file_name(),
        ),
        blocks_dir.join("00000000000000000099.parquet"),
    )
    .unwrap();
    // So is an upload a crash cut off before its rename (the local store's staging file,
    // which it never lists).
    std::fs::write(blocks_dir.join("00000000000000000100.parquet#3"), b"PAR1").unwrap();
    drop(table);
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(files(), 1, "the orphan and the cut-off upload are gone");
    let table = db.get_table("samples").unwrap();
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(10, 20)
    );
}

#[test]
fn retention_deletes_old_blocks_and_their_space() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let ttl = std::time::Duration::from_secs(3600);
    let table = db
        .table("samples", samples_schema(), small_blocks().ttl(ttl))
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let insert_at = |t: i64, value: i64| {
        table
            .insert(&batch(vec![
                ("name", str_n("cpu", 1)),
                ("timestamp", ints(&[t])),
                ("value", ints(&[value])),
            ]))
            .unwrap();
    };
    insert_at(now - 3 * 3600 * 1000, 1);
    table.persist().unwrap();
    insert_at(now - 2 * 3600 * 1000, 2);
    table.persist().unwrap();
    insert_at(now - 60_000, 3);
    table.persist().unwrap();
    let blocks_dir = dir.path().join("blocks").join("samples");
    let files = || std::fs::read_dir(&blocks_dir).unwrap().count();
    assert_eq!(files(), 3);
    let deleted = table.enforce_retention().unwrap();
    assert_eq!(deleted.len(), 2);
    assert_eq!(files(), 1, "space reclaimed");
    assert_eq!(values(&table.scan(&ScanRequest::new()).unwrap()), [3]);
    drop(table);
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        [3],
        "and stays gone"
    );
}

/// Data pages damaged behind an intact footer: the read fails midway, read from the local
/// file on the scanning thread (`Db::open`) or fetched through the object store
/// (`Db::open_with_store` on the same directory), with the same answers both ways.
/// Two persisted blocks of batches 0..10 and 10..20, the first's bytes changed by
/// `damage`; the first's meta and the database's directory.
fn two_blocks_the_first_changed(damage: impl FnOnce(&mut Vec<u8>)) -> (TempDir, BlockMeta) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&table, 0, 10);
    let changed = table.persist().unwrap().remove(0);
    fill(&table, 10, 20);
    table.persist().unwrap();
    drop(table);
    drop(db);
    let path = dir.path().join("blocks").join(&changed.path);
    let mut bytes = std::fs::read(&path).unwrap();
    damage(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    (dir, changed)
}

/// Read from its file and through the object store in turn, the database in `dir` fails a
/// scan naming block `changed` (its reason containing `reason`), and a lenient scan skips
/// it, counted, answering the other block's rows.
fn refused_by_name_on_both_read_paths(dir: &TempDir, changed: &BlockMeta, reason: &str) {
    refused_on_both_read_paths(dir, changed, reason, true)
}

/// [`refused_by_name_on_both_read_paths`]; with `whole` false, the lenient scan's rows are
/// not checked (a block found short at its end has given the rows it read before).
fn refused_on_both_read_paths(dir: &TempDir, changed: &BlockMeta, reason: &str, whole: bool) {
    let blocks = dir.path().join("blocks");
    for local in [true, false] {
        let db = if local {
            Db::open(dir.path(), options()).unwrap()
        } else {
            let store = object_store::local::LocalFileSystem::new_with_prefix(&blocks).unwrap();
            Db::open_with_store(dir.path(), Arc::new(store), "", options()).unwrap()
        };
        let table = db.get_table("samples").unwrap();
        match table.scan(&ScanRequest::new()).unwrap_err() {
            Error::BlockUnreadable {
                block, reason: why, ..
            } => {
                assert_eq!(block, changed.id, "{local}");
                assert!(why.contains(reason), "{local}: {why}");
            }
            other => panic!("expected the changed block by name ({local}), got {other}"),
        }
        let mut scan = table
            .snapshot()
            .scan(&ScanRequest::new().lenient(true))
            .unwrap();
        let rows = values(&scan.by_ref().collect::<Result<Vec<_>, _>>().unwrap());
        assert_eq!(scan.metrics().blocks_failed, 1, "{local}");
        if whole {
            assert_eq!(rows, expected(10, 20), "{local}");
        }
    }
}

#[test]
fn damaged_pages_fail_the_read_midway_by_name_on_both_read_paths() {
    // The first column chunks start after the 4-byte magic; the footer stays readable.
    let (dir, damaged) = two_blocks_the_first_changed(|bytes| bytes[4..200].fill(0xA5));
    refused_by_name_on_both_read_paths(&dir, &damaged, "");
}

/// A block whose footer declares 2³¹−1 row groups in a few bytes: Parquet would reserve about
/// 200 GB for them before reading one (an abort where memory is not overcommitted). The
/// footer is checked first: the block is unreadable, by name.
#[test]
fn a_footer_declaring_more_than_it_holds_is_refused_before_parquet_reads_it() {
    let (dir, bombed) = two_blocks_the_first_changed(|bytes| {
        let n = bytes.len();
        let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
        // FileMetaData { 1: version = 1, 4: row_groups = list<struct> of 2³¹−1 }, then the
        // rest of the old footer's bytes: the object keeps its size and its magic.
        let bomb = [0x15, 0x02, 0x39, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07];
        bytes[n - 8 - footer_len..][..bomb.len()].copy_from_slice(&bomb);
    });
    refused_by_name_on_both_read_paths(&dir, &bombed, "footer");
    refused_by_name_on_both_read_paths(&dir, &bombed, "2147483647 elements");
}

/// A block whose first page header declares 2³¹−1 bytes uncompressed: Parquet would reserve
/// that and decompress into it. Every page header is checked against its column chunk
/// first, on both read paths: the block is unreadable, by name, naming the page.
#[test]
fn a_page_declaring_more_than_its_column_chunk_is_refused_before_parquet_reads_it() {
    let (dir, bombed) = two_blocks_the_first_changed(|bytes| {
        let size = bytes.len();
        // The first page's header follows the magic: field 1 (its type, one byte), then
        // field 2, the uncompressed size, a zigzag varint of `n` bytes. It becomes the 5
        // bytes of 2³¹−1; the last bytes of the column chunk make room, so everything after
        // it (the other chunks, the page indexes, the footer) keeps its place.
        let chunk_end = {
            use parquet::file::reader::FileReader;
            let reader = parquet::file::serialized_reader::SerializedFileReader::new(
                bytes::Bytes::from(bytes.clone()),
            )
            .unwrap();
            let (start, len) = reader.metadata().row_group(0).column(0).byte_range();
            assert_eq!(start, 4, "the first chunk follows the magic");
            (start + len) as usize
        };
        assert_eq!(
            (bytes[4], bytes[6]),
            (0x15, 0x15),
            "a page header at byte 4"
        );
        let n = bytes[7..].iter().position(|b| b & 0x80 == 0).unwrap() + 1;
        bytes.splice(7..7 + n, [0xfe, 0xff, 0xff, 0xff, 0x0f]);
        bytes.drain(chunk_end..chunk_end + (5 - n));
        assert_eq!(bytes.len(), size);
    });
    refused_by_name_on_both_read_paths(
        &dir,
        &bombed,
        "the page at byte 4 declares 2147483647 bytes uncompressed",
    );
}

/// A block whose dictionary page declares 2³¹−1 values in a few bytes: Parquet would
/// zero-fill gigabytes for them before finding the page holds a few. Checked against the
/// page's bytes first: the block is unreadable, by name.
#[test]
fn a_dictionary_page_declaring_more_values_than_it_holds_is_refused() {
    let (dir, bombed) = two_blocks_the_first_changed(|bytes| {
        let size = bytes.len();
        let (at, chunk_end) = {
            use parquet::file::reader::FileReader;
            let reader = parquet::file::serialized_reader::SerializedFileReader::new(
                bytes::Bytes::from(bytes.clone()),
            )
            .unwrap();
            let column = reader
                .metadata()
                .row_group(0)
                .columns()
                .iter()
                .find(|c| c.dictionary_page_offset().is_some())
                .expect("a dictionary-encoded column")
                .clone();
            let (start, len) = column.byte_range();
            (
                column.dictionary_page_offset().unwrap() as usize,
                (start + len) as usize,
            )
        };
        // PageHeader { 1: type DICTIONARY_PAGE (2), 2, 3: sizes, ..., 7:
        // DictionaryPageHeader { 1: num_values } }.
        assert_eq!(bytes[at..at + 2], [0x15, 0x04], "a dictionary page at {at}");
        let field_7 = (at + 2..at + 64)
            .find(|&i| {
                bytes[i] & 0x0f == 12 && (3..=6).contains(&(bytes[i] >> 4)) && bytes[i + 1] == 0x15
            })
            .expect("the dictionary page header");
        let v = field_7 + 2;
        let n = bytes[v..].iter().position(|b| b & 0x80 == 0).unwrap() + 1;
        bytes.splice(v..v + n, [0xfe, 0xff, 0xff, 0xff, 0x0f]);
        bytes.drain(chunk_end..chunk_end + (5 - n));
        assert_eq!(bytes.len(), size);
    });
    refused_by_name_on_both_read_paths(&dir, &bombed, "declares 2147483647 values");
}

/// A block whose first offset index declares 2³¹−1 page locations in 7 bytes: Parquet
/// would reserve 51 GB for them. The page indexes are checked (ranges and bytes) before
/// Parquet decodes them: the block is unreadable, by name.
#[test]
fn an_offset_index_declaring_more_than_it_holds_is_refused_before_parquet_reads_it() {
    let (dir, bombed) = two_blocks_the_first_changed(|bytes| {
        let at = {
            use parquet::file::reader::FileReader;
            let reader = parquet::file::serialized_reader::SerializedFileReader::new(
                bytes::Bytes::from(bytes.clone()),
            )
            .unwrap();
            let column = reader.metadata().row_group(0).column(0);
            assert!(column.offset_index_length().unwrap() >= 7);
            column.offset_index_offset().unwrap() as usize
        };
        // OffsetIndex { 1: page_locations = list<struct> of 2³¹−1 }.
        bytes[at..at + 7].copy_from_slice(&[0x19, 0xfc, 0xff, 0xff, 0xff, 0xff, 0x07]);
    });
    refused_by_name_on_both_read_paths(&dir, &bombed, "a malformed page index");
    refused_by_name_on_both_read_paths(&dir, &bombed, "2147483647");
}

/// A block whose pages hold fewer rows than its footer declares (here: its first row
/// group's offset indexes list no page) is unreadable, by name, on both read paths: Parquet's
/// reader ends early without an error, and the scan answered without those rows. (A lenient
/// scan counts it failed; the rows it read before its end was found short are in its
/// answer, as a block failing midway gives its rows before the failure.)
#[test]
fn a_block_whose_pages_hold_fewer_rows_than_its_footer_is_refused_not_read_short() {
    let (dir, short) = two_blocks_the_first_changed(|bytes| {
        use parquet::file::reader::FileReader;
        let reader = parquet::file::serialized_reader::SerializedFileReader::new(
            bytes::Bytes::from(bytes.clone()),
        )
        .unwrap();
        let group = reader.metadata().row_group(0);
        for column in group.columns() {
            let at = column.offset_index_offset().unwrap() as usize;
            let len = column.offset_index_length().unwrap() as usize;
            assert!(len >= 3);
            // OffsetIndex { 1: page_locations = [] }, then zeros (stops) to its end.
            bytes[at..at + len].fill(0);
            bytes[at..at + 3].copy_from_slice(&[0x19, 0x0c, 0x00]);
        }
    });
    refused_on_both_read_paths(&dir, &short, "rows its footer plans", false);
    // Filtered, its page statistics are read first (Parquet asserts on an offset index of
    // no page): they prune nothing, and the read is found short, by name, not a panic.
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    let filter = col("timestamp")
        .gt_eq(0)
        .and(col("timestamp").lt(1_000_000));
    match table.scan(&ScanRequest::new().filter(filter)).unwrap_err() {
        Error::BlockUnreadable { block, reason, .. } => {
            assert_eq!(block, short.id);
            assert!(reason.contains("rows its footer plans"), "{reason}");
        }
        other => panic!("expected the short block by name, got {other}"),
    }
}

#[test]
fn a_damaged_block_fails_the_scan_by_name_unless_the_scan_is_lenient() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&table, 0, 10);
    let first = table.persist().unwrap().remove(0);
    fill(&table, 10, 20);
    let second = table.persist().unwrap().remove(0);
    fill(&table, 20, 30);
    let third = table.persist().unwrap().remove(0);
    let path = |b: &frostdb_core::BlockMeta| dir.path().join("blocks").join(&b.path);
    std::fs::remove_file(path(&first)).unwrap();
    let len = std::fs::metadata(path(&second)).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path(&second))
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    std::fs::write(path(&third), b"not parquet at all, but the right length?").unwrap();
    drop(table);
    drop(db);

    let db = Db::open(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    fill(&table, 30, 31);
    let scan = table
        .snapshot()
        .scan(&ScanRequest::new().lenient(true))
        .unwrap();
    let m = scan.metrics();
    assert_eq!(m.blocks_failed, 3, "{m:?}");
    assert_eq!(
        values(&scan.collect::<Result<Vec<_>, _>>().unwrap()),
        expected(30, 31)
    );

    // By default (strict) the scan is an error naming the first block it cannot read.
    let err = table.scan(&ScanRequest::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    match err {
        Error::BlockUnreadable {
            table, block, path, ..
        } => {
            assert_eq!((table.as_str(), block), ("samples", first.id));
            assert!(path.ends_with(".parquet"));
        }
        other => panic!("expected an unreadable block, got {other}"),
    }
}

/// A WAL record is checked at replay as an insert is: a record whose checksums hold but
/// which nobody could have inserted (a column of another type, or 2^44 rows of a column of
/// no bytes, which a later scan or merge would spread into 128 TiB of nulls) stops the open,
/// naming where it is, instead of being taken as the table's.
#[test]
fn a_wal_record_nobody_could_insert_stops_the_open_naming_it() {
    use arrow::array::{ArrayRef, NullArray, StringArray};
    for (what, column, array) in [
        (
            "another type",
            "value",
            Arc::new(StringArray::from(vec!["1"])) as ArrayRef,
        ),
        (
            "2^44 rows",
            "timestamp",
            Arc::new(NullArray::new(1 << 44)) as ArrayRef,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), options()).unwrap();
        let table = db
            .table("samples", samples_schema(), small_blocks())
            .unwrap();
        fill(&table, 0, 2);
        drop(table);
        drop(db);
        let mut segments: Vec<_> = std::fs::read_dir(dir.path().join("wal"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        segments.sort();
        let last = segments.pop().unwrap();
        let batch = RecordBatch::try_from_iter([(column, array)]).unwrap();
        let mut bytes = std::fs::read(&last).unwrap();
        bytes.extend(frostdb_core::testing::wal_record(1_000, "samples", &batch));
        std::fs::write(&last, bytes).unwrap();
        let err = Db::open(dir.path(), options()).unwrap_err();
        match &err {
            Error::WalCorrupt { reason, .. } => {
                assert!(reason.contains("transaction 1000"), "{what}: {reason}");
                assert!(
                    reason.contains(column) || reason.contains("rows"),
                    "{what}: {reason}"
                );
            }
            other => panic!("{what}: expected the record named as corrupt, got {other}"),
        }
    }
}

#[test]
fn wal_corruption_before_the_end_stops_the_open_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let table = db
            .table("samples", samples_schema(), small_blocks())
            .unwrap();
        fill(&table, 0, 5);
    }
    let wal_dir = dir.path().join("wal");
    let segment = std::fs::read_dir(&wal_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::metadata(p).unwrap().len() > 100)
        .unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&segment, &bytes).unwrap();
    let err = Db::open(dir.path(), options()).unwrap_err();
    match err {
        Error::WalCorrupt {
            segment: s, offset, ..
        } => {
            assert_eq!(s, segment.display().to_string());
            assert!(offset > 0 && (offset as usize) < middle);
        }
        other => panic!("expected WAL corruption, got {other}"),
    }

    // A torn tail instead is cut with a warning, and every whole record comes back.
    bytes[middle] ^= 0x55;
    bytes.truncate(bytes.len() - 7);
    std::fs::write(&segment, &bytes).unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(0, 4)
    );
}

#[test]
fn replaying_a_long_wal_persists_as_blocks_fill() {
    let dir = tempfile::tempdir().unwrap();
    let options = small_blocks().block_size(usize::MAX / 2);
    {
        let db = Db::open(dir.path(), options_without_background()).unwrap();
        let table = db.table("samples", samples_schema(), options).unwrap();
        fill(&table, 0, 200);
        assert_eq!(
            table.stats().blocks,
            0,
            "nothing persisted before the crash"
        );
    }
    // Reopen with a block size far below the WAL's content: replay must not hold it all.
    let dir_path = dir.path().to_path_buf();
    let manifest = dir_path.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let big = format!("\"block_size\":{}", usize::MAX / 2);
    assert!(text.contains(&big), "the manifest records the block size");
    let text = text.replace(&big, "\"block_size\":30000");
    std::fs::write(&manifest, text).unwrap();
    let version = |text: &str| -> u64 {
        let manifest: serde_json::Value = serde_json::from_str(text).unwrap();
        manifest["version"]
            .as_u64()
            .expect("the manifest's version")
    };
    let before = version(&std::fs::read_to_string(&manifest).unwrap());
    let db = Db::open(dir.path(), options_without_background()).unwrap();
    let table = db.get_table("samples").unwrap();
    let stats = table.stats();
    assert!(
        stats.blocks >= 3,
        "blocks persisted during replay: {stats:?}"
    );
    // Recorded together, a few manifest updates for all of them (one per 64 MiB of frozen
    // blocks, and one once the WAL is open; 4 here): the manifest is rewritten whole each
    // time, and one update per block (100 here) made reopening quadratic in the blocks
    // replayed.
    let updates = version(&std::fs::read_to_string(&manifest).unwrap()) - before;
    assert!(
        updates * 10 <= stats.blocks as u64,
        "{updates} manifest updates for {} blocks",
        stats.blocks
    );
    assert_eq!(stats.frozen_blocks, 0);
    assert!(stats.levels.iter().map(|l| l.bytes).sum::<usize>() < 30_000 * 2);
    assert_eq!(
        values(&table.scan(&ScanRequest::new()).unwrap()),
        expected(0, 200)
    );
}

fn options_without_background() -> DbOptions {
    DbOptions::default().background_compaction(false)
}

/// One row: `name`, timestamp and value `value`.
fn one(name: &str, value: i64) -> RecordBatch {
    batch(vec![
        ("name", str_n(name, 1)),
        ("timestamp", ints(&[value])),
        ("value", ints(&[value])),
    ])
}

#[test]
fn a_transaction_over_tables_is_replayed_whole_into_each() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let a = db.table("a", samples_schema(), small_blocks()).unwrap();
        let b = db.table("b", samples_schema(), small_blocks()).unwrap();
        for i in 0..20i64 {
            let mut tx = db.transaction();
            tx.insert(
                &a,
                &batch(vec![
                    ("name", str_n("x", 2)),
                    ("timestamp", ints(&[i, i])),
                    ("value", ints(&[i, i])),
                ]),
            )
            .unwrap();
            tx.insert(&b, &one("y", i)).unwrap();
            let id = tx.commit().unwrap();
            assert_eq!(a.stats().watermark, id);
            assert_eq!(b.stats().watermark, id);
        }
        // Only `a` persists: `b`'s writes must still come back from the WAL.
        a.persist().unwrap();
    }
    let db = Db::open(dir.path(), options()).unwrap();
    let a = db.get_table("a").unwrap();
    let b = db.get_table("b").unwrap();
    let all = ScanRequest::new();
    let mut want: Vec<i64> = (0..20).flat_map(|i| [i, i]).collect();
    want.sort();
    assert_eq!(values(&a.scan(&all).unwrap()), want);
    assert_eq!(values(&b.scan(&all).unwrap()), (0..20).collect::<Vec<_>>());

    // A batch that does not fit is refused at insert; the transaction still commits the rest.
    let mut tx = db.transaction();
    let bad = batch(vec![("name", ints(&[1]))]);
    assert!(matches!(
        tx.insert(&a, &bad),
        Err(Error::TypeMismatch { .. })
    ));
    tx.insert(&b, &one("y", 99)).unwrap();
    tx.commit().unwrap();
    assert_eq!(count(&b.scan(&all).unwrap()), 21);
    // A table of another database is refused.
    let other = Db::open_in_memory(options()).unwrap();
    let foreign = other.table("a", samples_schema(), small_blocks()).unwrap();
    let err = db.transaction().insert(&foreign, &one("y", 1)).unwrap_err();
    assert!(err.to_string().contains("another database"), "{err}");
}

#[test]
fn a_rarely_written_table_does_not_keep_the_wal_alive() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 64 << 10;
    struct Persisted(std::sync::Mutex<std::sync::mpsc::Sender<String>>);
    impl frostdb_core::EventListener for Persisted {
        fn on_persist_end(&self, table: &str, _: &frostdb_core::BlockMeta) {
            let _ = self.0.lock().unwrap().send(table.to_owned());
        }
    }
    let (sender, persisted) = std::sync::mpsc::channel();
    let db = Db::open(
        dir.path(),
        options()
            .wal_segment_bytes(8 << 10)
            .max_wal_bytes(limit)
            .listener(Arc::new(Persisted(std::sync::Mutex::new(sender)))),
    )
    .unwrap();
    let busy = db
        .table(
            "busy",
            samples_schema(),
            small_blocks().block_size(32 << 10),
        )
        .unwrap();
    let quiet = db.table("quiet", samples_schema(), small_blocks()).unwrap();
    quiet.insert(&one("q", 7)).unwrap();
    fill(&busy, 0, 600);
    // The persistence worker relieves the WAL in the background: wait for the quiet table's
    // block, which nothing but the WAL limit would ever write.
    loop {
        let table = persisted
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the quiet table was never persisted");
        if table == "quiet" {
            break;
        }
    }
    assert_eq!(quiet.stats().blocks, 1);
    busy.persist().unwrap();
    let wal = busy.stats().wal_bytes;
    assert!(wal < limit, "WAL of {wal} bytes, limit {limit}");
    // Its tables can still write: the database stays locked until they are gone too.
    drop((db, busy, quiet));
    let db = Db::open(dir.path(), options()).unwrap();
    let quiet = db.get_table("quiet").unwrap();
    assert_eq!(values(&quiet.scan(&ScanRequest::new()).unwrap()), vec![7]);
}

#[test]
fn the_ttl_can_change_and_is_kept_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let day = std::time::Duration::from_secs(86_400);
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let t = db
            .table("samples", samples_schema(), small_blocks())
            .unwrap();
        assert_eq!(t.ttl(), None);
        t.set_ttl(Some(day)).unwrap();
        assert_eq!(t.ttl(), Some(day));
    }
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    assert_eq!(t.ttl(), Some(day), "kept in the manifest");
    let no_time = db
        .table(
            "plain",
            frostdb_core::Schema::builder("plain")
                .column(frostdb_core::ColumnDef::new(
                    "value",
                    arrow::datatypes::DataType::Int64,
                ))
                .build()
                .unwrap(),
            TableOptions::default(),
        )
        .unwrap();
    let err = no_time.set_ttl(Some(day)).unwrap_err();
    assert!(err.to_string().contains("time_column"), "{err}");
}

#[test]
fn blocks_can_be_deleted_by_what_their_statistics_say() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&t, 0, 10);
    t.persist().unwrap();
    fill(&t, 10, 20);
    t.persist().unwrap();
    assert_eq!(t.stats().blocks, 2);
    let deleted = t
        .delete_blocks(|b| {
            matches!(b.stats_of("timestamp").max, Some(frostdb_core::Scalar::Int(max)) if max < 100)
        })
        .unwrap();
    assert_eq!(deleted.len(), 1);
    assert_eq!(
        values(&t.scan(&ScanRequest::new()).unwrap()),
        expected(10, 20)
    );
    drop(t);
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    let t = db.get_table("samples").unwrap();
    assert_eq!(
        values(&t.scan(&ScanRequest::new()).unwrap()),
        expected(10, 20)
    );
}

#[test]
fn a_manifest_of_another_format_is_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("manifest.json"),
        r#"{"format": 1, "version": 3, "tables": {}}"#,
    )
    .unwrap();
    let err = Db::open(dir.path(), options()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("format 1") && text.contains("older build"),
        "{text}"
    );
}

#[test]
fn concurrent_writers_share_fsyncs_and_a_lone_writer_syncs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options_without_background()).unwrap();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    // Alone: every commit is acknowledged durable by its own fsync, without waiting for
    // company (a delay would show as fewer syncs than records).
    for i in 0..20 {
        table.insert(&one("lone", i)).unwrap();
    }
    let lone = db.wal_stats().unwrap();
    assert_eq!(lone.records, 20);
    assert_eq!(
        lone.syncs, 20,
        "a lone writer's commits were not synced one by one"
    );
    assert!(
        lone.sync_time > std::time::Duration::ZERO,
        "20 fsyncs took no time: the time in them is not counted"
    );

    // Together: 16 writers, 25 commits each; fsyncs in flight cover the records appended
    // meanwhile, so there are fewer fsyncs than records.
    std::thread::scope(|s| {
        for w in 0..16 {
            let table = table.clone();
            s.spawn(move || {
                for i in 0..25 {
                    table.insert(&one("together", w * 100 + i)).unwrap();
                }
            });
        }
    });
    let after = db.wal_stats().unwrap();
    let (records, syncs) = (after.records - lone.records, after.syncs - lone.syncs);
    assert_eq!(records, 400);
    assert!(
        after.sync_time >= lone.sync_time,
        "time in fsyncs went back"
    );
    assert!(
        syncs < records,
        "{syncs} fsyncs for {records} concurrent records: nothing was shared"
    );
    // And every one of them was durable when acknowledged: it comes back after a reopen.
    drop((table, db));
    let db = Db::open(dir.path(), options_without_background()).unwrap();
    let rows = db
        .get_table("samples")
        .unwrap()
        .scan(&ScanRequest::new().filter(col("name").eq("together")))
        .unwrap();
    assert_eq!(count(&rows), 400);
}

#[test]
fn one_owner_at_a_time_and_a_table_keeps_the_database_locked() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&table, 0, 3);

    let second = Db::open(dir.path(), options()).unwrap_err();
    assert!(matches!(second, Error::Locked { .. }), "{second}");
    assert_eq!(second.kind(), ErrorKind::Unavailable, "a retryable refusal");
    assert!(
        second
            .to_string()
            .contains(&format!("process {}", std::process::id())),
        "{second}"
    );
    // The table can still commit through the WAL: the lock stays with it.
    drop(db);
    fill(&table, 3, 4);
    assert!(matches!(
        Db::open(dir.path(), options()),
        Err(Error::Locked { .. })
    ));
    drop(table);
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(db.get_table("samples").unwrap().stats().rows, 40);
}

#[test]
fn row_groups_whose_key_range_cannot_hold_a_series_are_skipped() {
    // Namespaces a..c with pods p00..p19 each, 6 samples a series: sorted by name, labels
    // (ns, pod) and time, so a row group (and a page) where two namespaces meet spans every
    // pod in its column bounds while holding only a few series of each.
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    let mut want = Vec::new();
    for (n, ns) in ["a", "b", "c"].iter().enumerate() {
        let (mut nss, mut pods, mut ts, mut values) = (vec![], vec![], vec![], vec![]);
        for p in 0..20 {
            for t in 0..6 {
                let value = (n * 10_000 + p * 100 + t) as i64;
                nss.push(Some(*ns));
                pods.push(format!("p{p:02}"));
                ts.push(t as i64);
                values.push(value);
                if *ns == "b" && p == 5 {
                    want.push(value);
                }
            }
        }
        let pods: Vec<Option<&str>> = pods.iter().map(|p| Some(p.as_str())).collect();
        table
            .insert(&batch(vec![
                ("name", str_n("cpu", 120)),
                ("labels.ns", strs(&nss)),
                ("labels.pod", strs(&pods)),
                ("timestamp", ints(&ts)),
                ("value", ints(&values)),
            ]))
            .unwrap();
    }
    table.persist().unwrap();
    // The key's first column fixed too, as a profile type fixes it.
    let filter = col("name")
        .eq("cpu")
        .and(col("labels.ns").eq("b"))
        .and(col("labels.pod").eq("p05"));
    let scan = table
        .snapshot()
        .scan(&ScanRequest::new().filter(filter.clone()).project(["value"]))
        .unwrap();
    let m = scan.metrics();
    assert_eq!(values(&scan.collect::<Result<Vec<_>, _>>().unwrap()), want);
    assert!(m.row_groups_pruned_by_keys > 0, "{m:?}");
    // The same as a prune-only bound, and after a reopen (the ranges live in the footer).
    drop(table);
    drop(db);
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    let scan = table
        .snapshot()
        .scan(
            &ScanRequest::new()
                .filter(filter.clone())
                .prune(filter)
                .project(["value"]),
        )
        .unwrap();
    let m = scan.metrics();
    assert_eq!(values(&scan.collect::<Result<Vec<_>, _>>().unwrap()), want);
    assert!(m.row_groups_pruned_by_keys > 0, "{m:?}");
}

/// A block file lacking a column its manifest entry says holds values (a writer's bug, a
/// block of another build, tampering): refused by name, where it was read as all null, so
/// that a query on that label pruned the block's rows away and answered without them.
#[test]
fn a_block_lacking_a_column_its_manifest_lists_is_refused_by_name() {
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::metadata::KeyValue;
    use parquet::file::properties::WriterProperties;

    let (dir, changed) = two_blocks_the_first_changed(|bytes| {
        let original = bytes::Bytes::from(bytes.clone());
        // The same rows without `labels.pod`, padded in the footer to the object's size
        // (the manifest's), so that only the column is missing.
        let without = |pad: usize| -> Vec<u8> {
            let reader = ParquetRecordBatchReaderBuilder::try_new(original.clone())
                .unwrap()
                .build()
                .unwrap();
            let batches: Vec<RecordBatch> = reader
                .map(|b| {
                    let mut b = b.unwrap();
                    b.remove_column(b.schema().index_of("labels.pod").unwrap());
                    b
                })
                .collect();
            let props = WriterProperties::builder()
                .set_key_value_metadata(Some(vec![KeyValue::new("pad".into(), "x".repeat(pad))]))
                .build();
            let mut out = Vec::new();
            let mut w = ArrowWriter::try_new(&mut out, batches[0].schema(), Some(props)).unwrap();
            for b in &batches {
                w.write(b).unwrap();
            }
            w.close().unwrap();
            out
        };
        let short = original.len() - without(0).len();
        let mut padded = without(short);
        let over = padded.len() - original.len();
        if over > 0 {
            padded = without(short - over);
        }
        assert_eq!(padded.len(), original.len());
        *bytes = padded;
    });
    refused_by_name_on_both_read_paths(&dir, &changed, "\"labels.pod\"");
}

/// A database closed while one of its tables is still held stays open (its directory
/// locked) until that handle goes; `Db::closed` says when, so whoever opens it again waits
/// instead of meeting its own lock.
#[test]
fn a_database_is_closed_when_its_last_handle_goes() {
    let dir = TempDir::new().unwrap();
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    fill(&table, 0, 2);
    let closed = db.closed();
    drop(db);
    assert!(!closed.is_closed(), "its table still holds it");
    assert!(!closed.wait(std::time::Duration::ZERO));
    let err = Db::open(dir.path(), options()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    let waiting = {
        let closed = closed.clone();
        std::thread::spawn(move || closed.wait(std::time::Duration::from_secs(600)))
    };
    drop(table);
    assert!(waiting.join().unwrap(), "told once the table went");
    assert!(closed.is_closed());
    let db = Db::open(dir.path(), options()).unwrap();
    let table = db
        .table("samples", samples_schema(), small_blocks())
        .unwrap();
    let rows = table.scan(&ScanRequest::new()).unwrap();
    assert_eq!(count(&rows), 20, "both batches replayed");
}
