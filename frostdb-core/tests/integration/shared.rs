//! A database shared through a bucket: one writer at a time by lease, fenced when another
//! takes over, every acknowledged write replayed by the next writer; readers following the
//! writer's cuts, never seeing a transaction in part; small blocks merged.
//!
//! Each "process" is a view of one in-memory bucket that can be cut off from it (a process
//! that stopped, or lost its network): then its lease runs out and another takes over.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{batch, count, ints, samples_schema, str_n};
use frostdb_core::{
    Db, DbOptions, Error, ScanRequest, SharedOptions, Table, TableOptions, WorkerPool, col,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// One process's view of the shared bucket: fails everything while cut off.
#[derive(Debug)]
struct View {
    bucket: Arc<InMemory>,
    cut_off: Arc<AtomicBool>,
}

impl std::fmt::Display for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("View")
    }
}

impl View {
    fn check(&self) -> object_store::Result<()> {
        if self.cut_off.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "View",
                source: "this process is cut off from the bucket".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl ObjectStore for View {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check()?;
        self.bucket.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.bucket.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check()?;
        self.bucket.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        if let Err(e) = self.check() {
            return futures::stream::iter([Err(e)]).boxed();
        }
        self.bucket.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Err(e) = self.check() {
            return futures::stream::iter([Err(e)]).boxed();
        }
        self.bucket.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.check()?;
        self.bucket.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check()?;
        self.bucket.copy_opts(from, to, options).await
    }
}

struct Bucket(Arc<InMemory>);

impl Bucket {
    fn new() -> Self {
        Self(Arc::new(InMemory::new()))
    }

    /// A process's view, and the switch that cuts it off.
    fn view(&self) -> (Arc<dyn ObjectStore>, Arc<AtomicBool>) {
        let cut_off = Arc::new(AtomicBool::new(false));
        let view = View {
            bucket: self.0.clone(),
            cut_off: cut_off.clone(),
        };
        (Arc::new(view), cut_off)
    }

    /// Object names under `prefix`.
    fn objects(&self, prefix: &str) -> Vec<String> {
        let bucket = self.0.clone();
        let prefix = ObjectPath::from(prefix);
        futures::executor::block_on(async move {
            use futures::TryStreamExt;
            bucket
                .list(Some(&prefix))
                .map_ok(|m| m.location.to_string())
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
        })
    }
}

fn options() -> DbOptions {
    // No background work by time: cuts and merges run when the tests call them.
    DbOptions::default().workers(WorkerPool::new(1).unwrap())
}

fn writer(holder: &str) -> SharedOptions {
    SharedOptions::new(holder)
        .lease_ttl(Duration::from_millis(600))
        // Longer than any test: the tests cut with `flush`.
        .flush_interval(Duration::from_secs(3600))
        .retire_grace(Duration::ZERO)
        .merge_blocks(0)
}

fn samples(db: &Db) -> Table {
    db.table("samples", samples_schema(), TableOptions::default())
        .unwrap()
}

/// `n` rows of pod `pod`, values `first..first + n`.
fn rows(pod: &str, first: i64, n: usize) -> arrow::array::RecordBatch {
    let values: Vec<i64> = (first..first + n as i64).collect();
    batch(vec![
        ("name", str_n("cpu", n)),
        ("labels.pod", str_n(pod, n)),
        ("timestamp", ints(&values)),
        ("value", ints(&values)),
    ])
}

fn sum_of(table: &Table, pod: &str) -> (usize, i64) {
    let batches = table
        .scan(&ScanRequest::new().filter(col("labels.pod").eq(pod)))
        .unwrap();
    let sum = batches
        .iter()
        .map(|b| {
            let v = b
                .column_by_name("value")
                .unwrap()
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .unwrap();
            v.iter().flatten().sum::<i64>()
        })
        .sum();
    (count(&batches), sum)
}

/// Objects read back whole from the bucket are sized first: a lease or a manifest larger
/// than any this database writes (damaged, or not its own) is refused naming it, before
/// its bytes are read, and what was stored is still there once the object is put right.
#[test]
fn a_lease_or_manifest_larger_than_any_written_is_refused_before_it_is_read() {
    let bucket = Bucket::new();
    let (store, _) = bucket.view();
    let a = Db::open_shared(store.clone(), "t1", options(), writer("a")).unwrap();
    samples(&a).insert(&rows("p", 0, 10)).unwrap();
    a.flush().unwrap();
    drop(a);
    use object_store::ObjectStoreExt;
    let put = |name: &str, bytes: Vec<u8>| {
        let (store, path) = (bucket.0.clone(), ObjectPath::from(name));
        futures::executor::block_on(async move { store.put(&path, bytes.into()).await }).unwrap();
    };
    let get = |name: &str| {
        let (store, path) = (bucket.0.clone(), ObjectPath::from(name));
        futures::executor::block_on(async move { store.get(&path).await?.bytes().await })
            .unwrap()
            .to_vec()
    };
    let lease = get("t1/lease.json");
    let mut padded = lease.clone();
    padded.resize(100 << 10, b' ');
    put("t1/lease.json", padded);
    let err = Db::open_shared(store.clone(), "t1", options(), writer("b")).unwrap_err();
    assert!(
        err.to_string()
            .contains("lease t1/lease.json is 102400 bytes, more than the 65536"),
        "{err}"
    );
    put("t1/lease.json", lease);
    let manifest = get("t1/manifest.json");
    let mut padded = manifest.clone();
    padded.resize((256 << 20) + 1, b' ');
    put("t1/manifest.json", padded);
    let err = Db::open_reader(store.clone(), "t1", options()).unwrap_err();
    assert!(
        err.to_string()
            .contains("manifest t1/manifest.json is 268435457 bytes"),
        "{err}"
    );
    put("t1/manifest.json", manifest);
    let b = Db::open_shared(store, "t1", options(), writer("b")).unwrap();
    assert_eq!(sum_of(&samples(&b), "p"), (10, 45));
}

#[test]
fn another_writer_is_refused_while_the_lease_runs_and_takes_it_once_given_up() {
    let bucket = Bucket::new();
    let (a_store, _) = bucket.view();
    let (b_store, _) = bucket.view();
    let a = Db::open_shared(a_store, "t1", options(), writer("a")).unwrap();
    samples(&a).insert(&rows("p", 0, 10)).unwrap();
    let refused = Db::open_shared(b_store.clone(), "t1", options(), writer("b")).unwrap_err();
    assert!(
        matches!(&refused, Error::LeaseHeld { holder, .. } if holder == "a"),
        "{refused}"
    );
    assert!(refused.to_string().contains("written by a"), "{refused}");
    // A clean close gives the lease up: no waiting for it to run out.
    drop(a);
    let b = Db::open_shared(b_store, "t1", options(), writer("b")).unwrap();
    assert_eq!(sum_of(&samples(&b), "p"), (10, 45));
}

#[test]
fn a_writer_cut_off_is_taken_over_and_fenced_and_nothing_it_acknowledged_is_lost() {
    let bucket = Bucket::new();
    let (a_store, a_cut) = bucket.view();
    let (b_store, _) = bucket.view();
    let a = Db::open_shared(a_store, "t1", options(), writer("a")).unwrap();
    let table = samples(&a);
    table.insert(&rows("p", 0, 10)).unwrap();
    a.flush().unwrap(); // some rows in a block
    table.insert(&rows("p", 10, 5)).unwrap(); // some only in the WAL
    // A stops reaching the bucket: its lease runs out (600 ms) and b takes over.
    a_cut.store(true, Ordering::SeqCst);
    let taken = std::time::Instant::now();
    let b = loop {
        match Db::open_shared(b_store.clone(), "t1", options(), writer("b")) {
            Ok(b) => break b,
            Err(Error::LeaseHeld { .. }) if taken.elapsed() < Duration::from_secs(10) => {
                std::thread::yield_now()
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        sum_of(&samples(&b), "p"),
        (15, (0..15).sum()),
        "every acknowledged write"
    );
    // A comes back: it may no longer write, neither WAL nor manifest.
    a_cut.store(false, Ordering::SeqCst);
    let refused = table.insert(&rows("p", 100, 1)).unwrap_err();
    assert!(
        matches!(refused, Error::Fenced { .. } | Error::Poisoned { .. }),
        "{refused}"
    );
    assert!(a.flush().is_err(), "a fenced writer's cut must fail");
    // b goes on, and a third writer after it sees b's writes too.
    samples(&b).insert(&rows("p", 15, 5)).unwrap();
    drop(b);
    let (c_store, _) = bucket.view();
    let c = Db::open_shared(c_store, "t1", options(), writer("c")).unwrap();
    assert_eq!(sum_of(&samples(&c), "p"), (20, (0..20).sum()));
}

#[test]
fn a_restarted_writer_takes_its_own_lease_back_at_once() {
    let bucket = Bucket::new();
    let (store, _) = bucket.view();
    let a = Db::open_shared(store.clone(), "t1", options(), writer("a")).unwrap();
    samples(&a).insert(&rows("p", 0, 3)).unwrap();
    // The same holder again while the first still runs (a restart after a crash): the
    // first is fenced, the second has everything.
    let again = Db::open_shared(store, "t1", options(), writer("a")).unwrap();
    assert_eq!(sum_of(&samples(&again), "p"), (3, 3));
    assert!(samples(&a).insert(&rows("p", 3, 1)).is_err());
}

/// A writer of two tables in `bucket` (`samples`, then `second`), and a reader of it.
fn two_tables_and_a_reader(bucket: &Bucket) -> (Db, Table, Table, Db) {
    let (w_store, _) = bucket.view();
    let (r_store, _) = bucket.view();
    let w = Db::open_shared(w_store, "t1", options(), writer("w")).unwrap();
    let first = samples(&w);
    let second = w
        .table("second", samples_schema(), TableOptions::default())
        .unwrap();
    let reader = Db::open_reader(r_store, "t1", options()).unwrap();
    (w, first, second, reader)
}

#[test]
fn readers_follow_cuts_and_see_transactions_whole() {
    let bucket = Bucket::new();
    let (w, first, second, reader) = two_tables_and_a_reader(&bucket);
    assert!(reader.is_read_only());
    for round in 0..5i64 {
        // One transaction writes both tables.
        let mut tx = w.transaction();
        tx.insert(&first, &rows("p", round * 10, 10)).unwrap();
        tx.insert(&second, &rows("p", round * 10, 10)).unwrap();
        tx.commit().unwrap();
        // Not cut yet: the reader does not see it.
        reader.refresh().unwrap();
        let seen = |name: &str| reader.get_table(name).map_or((0, 0), |t| sum_of(&t, "p"));
        assert_eq!(seen("samples"), seen("second"));
        assert_eq!(seen("samples").0, round as usize * 10);
        w.flush().unwrap();
        assert!(reader.refresh().unwrap(), "a cut changes the manifest");
        assert_eq!(
            seen("samples"),
            ((round as usize + 1) * 10, (0..(round + 1) * 10).sum())
        );
        assert_eq!(seen("samples"), seen("second"));
    }
    // Readers write nothing.
    let table = reader.get_table("samples").unwrap();
    let refused = table.insert(&rows("p", 0, 1)).unwrap_err();
    assert!(matches!(refused, Error::ReadOnly { .. }), "{refused}");
    let refused = reader
        .table("third", samples_schema(), TableOptions::default())
        .unwrap_err();
    assert!(matches!(refused, Error::ReadOnly { .. }), "{refused}");
    assert!(reader.flush().is_ok(), "nothing to persist");
}

/// A table of the bucket's manifest that a reader cannot follow (a block naming a column it
/// cannot resolve: a writer of another build, or a buggy one) fails the refresh, and fails
/// it again at the next: the manifest was taken as read, and the next refresh answered
/// nothing changed while the reader stayed on its old blocks. The tables after it wait
/// (their rows may use its), so a transaction is still seen whole or not at all.
#[test]
fn a_table_a_reader_cannot_follow_fails_the_refresh_again_and_again() {
    use object_store::ObjectStoreExt as _;
    let bucket = Bucket::new();
    let (w, first, second, reader) = two_tables_and_a_reader(&bucket);
    let write = |from: i64| {
        let mut tx = w.transaction();
        tx.insert(&first, &rows("p", from, 10)).unwrap();
        tx.insert(&second, &rows("p", from, 10)).unwrap();
        tx.commit().unwrap();
        w.flush().unwrap();
    };
    write(0);
    reader.refresh().unwrap();
    write(10);
    // The first table's newest block names a column no build resolves.
    let path = bucket
        .objects("t1")
        .into_iter()
        .find(|o| o.ends_with("manifest.json"))
        .expect("the bucket's manifest");
    let object = ObjectPath::from(path.as_str());
    let store = bucket.0.clone();
    let mut manifest: serde_json::Value = futures::executor::block_on(async {
        let bytes = store.get(&object).await.unwrap().bytes().await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    });
    let columns = manifest["tables"]["samples"]["blocks"]
        .as_array_mut()
        .and_then(|b| b.last_mut())
        .and_then(|b| b["columns"].as_object_mut())
        .expect("a block's columns");
    let any = columns.values().next().unwrap().clone();
    columns.insert("not..a column".into(), any);
    futures::executor::block_on(async {
        store
            .put(&object, serde_json::to_vec(&manifest).unwrap().into())
            .await
            .unwrap();
    });
    let seen = |name: &str| reader.get_table(name).map_or((0, 0), |t| sum_of(&t, "p"));
    assert!(
        reader.refresh().is_err(),
        "the table that cannot be followed"
    );
    assert_eq!(
        seen("samples").0,
        10,
        "the one that cannot be keeps its blocks"
    );
    assert_eq!(
        seen("second"),
        seen("samples"),
        "the transaction is not seen in part"
    );
    assert!(
        reader.refresh().is_err(),
        "and fails again, not read and forgotten"
    );
}

#[test]
fn cuts_truncate_the_wal_and_merges_keep_blocks_few_and_rows_exact() {
    let bucket = Bucket::new();
    let (w_store, _) = bucket.view();
    let (r_store, _) = bucket.view();
    let w = Db::open_shared(w_store, "t1", options(), writer("w").merge_blocks(4)).unwrap();
    let table = samples(&w);
    let reader = Db::open_reader(r_store, "t1", options()).unwrap();
    for round in 0..16i64 {
        table
            .insert(&rows(&format!("p{}", round % 3), round * 100, 50))
            .unwrap();
        w.flush().unwrap();
        // The WAL objects of what the cut persisted are gone (the newest stays, to keep
        // the sequence).
        let wal = bucket.objects("t1/wal");
        assert!(wal.len() <= 2, "{wal:?}");
    }
    assert_eq!(table.blocks().len(), 16);
    let merged = w.merge_blocks().unwrap();
    assert!(merged >= 4, "{merged} merges");
    let blocks = table.blocks().len();
    assert!(blocks <= 4, "{blocks} blocks after merging 16 by 4s");
    let total = |t: &Table| {
        (0..3)
            .map(|p| sum_of(t, &format!("p{p}")))
            .fold((0, 0), |(r, s), (r2, s2)| (r + r2, s + s2))
    };
    let expected: i64 = (0..16i64)
        .map(|r| (r * 100..r * 100 + 50).sum::<i64>())
        .sum();
    assert_eq!(total(&table), (800, expected));
    // Blocks stay sorted: a sorted scan of the merged data is in key order.
    let sorted = table.scan(&ScanRequest::new().sorted(true)).unwrap();
    assert_eq!(count(&sorted), 800);
    // The reader sees the merged blocks, and the same rows.
    reader.refresh().unwrap();
    let followed = reader.get_table("samples").unwrap();
    assert_eq!(followed.blocks().len(), blocks);
    assert_eq!(total(&followed), (800, expected));
    // The merged-away objects are deleted (no grace here) at the next retention pass.
    table.enforce_retention().unwrap();
    let objects = bucket.objects("t1/samples");
    assert_eq!(objects.len(), blocks, "{objects:?}");
}

#[test]
fn a_snapshot_of_row_groups_reads_those_and_refuses_ones_a_block_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions::default()).unwrap();
    let table = db
        .table(
            "samples",
            samples_schema(),
            TableOptions::default().row_group_rows(10),
        )
        .unwrap();
    table.insert(&rows("p", 0, 100)).unwrap();
    let block = table.persist().unwrap().remove(0);
    assert_eq!(block.row_groups, 10);
    let read = |row_groups: Option<std::ops::Range<u32>>| {
        let slice = frostdb_core::BlockSlice {
            block: block.clone(),
            row_groups,
        };
        table
            .snapshot_of_blocks(vec![slice])
            .unwrap()
            .collect(&ScanRequest::new())
            .map(|b| count(&b))
    };
    assert_eq!(read(None).unwrap(), 100);
    assert_eq!(read(Some(0..3)).unwrap(), 30);
    assert_eq!(read(Some(3..10)).unwrap(), 70);
    let refused = read(Some(8..11)).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("row groups 8..11 were asked for"),
        "{refused}"
    );
}
