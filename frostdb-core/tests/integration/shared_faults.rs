//! A database shared through a bucket whose cut fails: the failure is an error to the
//! caller, a `persist error` event to the embedder, and the data stays to be cut again.

use crate::common;

use std::sync::Arc;

use common::faults::{FaultStore, Faulty};
use common::{batch, count, ints, samples_schema, str_n};
use frostdb_core::{Db, DbOptions, Error, EventListener, ScanRequest, SharedOptions, TableOptions};
use parking_lot::Mutex;

/// The persist errors raised, as `table: error`.
#[derive(Default)]
struct PersistErrors(Mutex<Vec<String>>);

impl EventListener for PersistErrors {
    fn on_persist_error(&self, table: &str, error: &Error) {
        self.0.lock().push(format!("{table}: {error}"));
    }
}

#[test]
fn a_failed_cut_of_a_shared_database_is_an_event_and_is_retried() {
    let store = Arc::new(FaultStore::default());
    let errors = Arc::new(PersistErrors::default());
    let options = DbOptions::default()
        .background_compaction(false)
        .listener(errors.clone());
    let shared = SharedOptions::new("a")
        .flush_interval(std::time::Duration::from_secs(3600))
        .retire_grace(std::time::Duration::ZERO);
    let db = Db::open_shared(Arc::new(Faulty(store.clone())), "db", options, shared).unwrap();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    let rows = batch(vec![
        ("name", str_n("cpu", 10)),
        ("labels.pod", str_n("p", 10)),
        ("timestamp", ints(&[1; 10])),
        ("value", ints(&[2; 10])),
    ]);
    table.insert(&rows).unwrap();

    // Every bucket operation fails: the cut cannot be written.
    store.fail_next(usize::MAX);
    let failed = table.persist();
    store.heal();
    assert!(failed.is_err(), "a cut into a failing bucket succeeded");
    let raised = errors.0.lock().clone();
    assert!(
        raised.iter().any(|e| e.starts_with("samples: ")),
        "no persist error event for the failed cut: {raised:?}"
    );

    // The rows are still there, and the next cut writes them.
    assert_eq!(count(&table.scan(&ScanRequest::new()).unwrap()), 10);
    let written = table.persist().unwrap();
    assert!(!written.is_empty(), "the retried cut wrote nothing");
    let reader = Db::open_reader(Arc::new(Faulty(store)), "db", DbOptions::default()).unwrap();
    let seen = reader.get_table("samples").unwrap();
    assert_eq!(count(&seen.scan(&ScanRequest::new()).unwrap()), 10);
}

/// A manifest change whose mirror to the object store fails is kept locally, and the
/// failure is visible: counted, and the reason shown while the mirror is behind; the next
/// change that mirrors clears it.
#[test]
fn a_failed_manifest_mirror_is_counted_and_shown_until_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultStore::default());
    let options = DbOptions::default().background_compaction(false);
    let db =
        Db::open_with_store(dir.path(), Arc::new(Faulty(store.clone())), "db", options).unwrap();
    db.table("a", samples_schema(), TableOptions::default())
        .unwrap();
    let health = db.mirror_health().expect("a local manifest with a mirror");
    assert_eq!((health.failures, health.behind), (0, None));

    // The mirror's put reports a failure (a timeout: whether it happened is unknown).
    store.time_out_next(1);
    db.table("b", samples_schema(), TableOptions::default())
        .expect("the local manifest is the database's: a failed mirror does not fail the change");
    store.heal();
    let health = db.mirror_health().unwrap();
    assert_eq!(health.failures, 1);
    assert!(
        health
            .behind
            .as_ref()
            .is_some_and(|why| why.contains("manifest.json")),
        "{health:?}"
    );

    db.table("c", samples_schema(), TableOptions::default())
        .unwrap();
    let health = db.mirror_health().unwrap();
    assert_eq!((health.failures, health.behind), (1, None));
    // The mirror is whole again: the bucket alone reopens every table.
    drop(db);
    let empty = tempfile::tempdir().unwrap();
    let reopened = Db::open_with_store(
        empty.path(),
        Arc::new(Faulty(store)),
        "db",
        DbOptions::default(),
    )
    .unwrap();
    let mut tables: Vec<String> = reopened
        .tables()
        .iter()
        .map(|t| t.name().to_owned())
        .collect();
    tables.sort();
    assert_eq!(tables, ["a", "b", "c"]);
}

/// A manifest update that lands but reports a failure (a timeout: its response lost) leaves
/// the writer unsure of the manifest: it writes no block over one the bucket's manifest
/// names, stops (its log poisoned, so nothing more is acknowledged that it could not
/// persist), and opened again reads the manifest as it is, every row there. Before, the
/// next cut reused the merged block's id and overwrote it, and the blocks it merged were
/// deleted as orphans at the next open: their rows lost.
#[test]
fn a_manifest_update_that_lands_unseen_loses_no_block() {
    let store = Arc::new(FaultStore::default());
    let open = || {
        let options = DbOptions::default().background_compaction(false);
        let shared = SharedOptions::new("a")
            .flush_interval(std::time::Duration::from_secs(3600))
            .retire_grace(std::time::Duration::ZERO)
            .merge_blocks(2);
        Db::open_shared(Arc::new(Faulty(store.clone())), "db", options, shared).unwrap()
    };
    let db = open();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    let rows = |ts: i64| {
        batch(vec![
            ("name", str_n("cpu", 10)),
            ("labels.pod", str_n("p", 10)),
            ("timestamp", ints(&[ts; 10])),
            ("value", ints(&[2; 10])),
        ])
    };
    for ts in [1, 2] {
        table.insert(&rows(ts)).unwrap();
        db.flush().unwrap();
    }
    // The merge's manifest update lands, and reports a timeout.
    store.time_out_next_put_to("manifest.json");
    assert!(db.merge_blocks().is_err());
    // A later cut writes no block over the merged one, and fails: the writer is fenced.
    table.insert(&rows(3)).unwrap();
    let e = db.flush().unwrap_err();
    assert!(matches!(e, Error::Fenced { .. }), "{e}");
    drop(table);
    drop(db);
    let db = open();
    let table = db.get_table("samples").unwrap();
    assert_eq!(count(&table.scan(&ScanRequest::new()).unwrap()), 30);
    let reader = Db::open_reader(Arc::new(Faulty(store)), "db", DbOptions::default()).unwrap();
    let seen = reader.get_table("samples").unwrap();
    assert_eq!(
        count(&seen.scan(&ScanRequest::new()).unwrap()),
        20,
        "the persisted rows"
    );
}

/// A bucket that ignores conditional puts cannot fence a shared database's writers: it is
/// refused when the database opens, naming why, rather than letting two writers overwrite
/// each other's acknowledged writes without an error.
#[test]
fn a_bucket_that_ignores_conditional_puts_is_refused() {
    let store = Arc::new(FaultStore::default());
    store.ignore_conditions();
    let shared = SharedOptions::new("a");
    let e = Db::open_shared(Arc::new(Faulty(store)), "db", DbOptions::default(), shared)
        .expect_err("opened on a bucket without conditional puts");
    assert!(
        e.to_string().contains("does not honour conditional puts"),
        "{e}"
    );
}

/// A manifest naming blocks outside its own prefix (a tenant's prefix copied to another, or
/// a manifest written by anyone who can write that prefix) is refused when read: its writer
/// read, merged and deleted the other prefix's blocks.
#[test]
fn a_manifest_naming_blocks_of_another_prefix_is_refused() {
    use object_store::{ObjectStore, ObjectStoreExt, path::Path};
    let store = Arc::new(FaultStore::default());
    let options = || DbOptions::default().background_compaction(false);
    let shared = SharedOptions::new("a").flush_interval(std::time::Duration::from_secs(3600));
    let db = Db::open_shared(Arc::new(Faulty(store.clone())), "a", options(), shared).unwrap();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    table
        .insert(&batch(vec![
            ("name", str_n("cpu", 10)),
            ("labels.pod", str_n("p", 10)),
            ("timestamp", ints(&[1; 10])),
            ("value", ints(&[2; 10])),
        ]))
        .unwrap();
    db.flush().unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(Faulty(store.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let manifest = bucket
            .get(&Path::from("a/manifest.json"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        bucket
            .put(&Path::from("b/manifest.json"), manifest.into())
            .await
            .unwrap();
    });
    let e = Db::open_reader(Arc::new(Faulty(store)), "b", options())
        .expect_err("a manifest naming another prefix's blocks was read");
    assert!(
        e.to_string().contains("is not under the database's prefix"),
        "{e}"
    );
}

/// A block whose upload fails midway (a part refused: a merge's input that fails to read
/// ends it the same way) gives up the parts it uploaded. Dropped, a multipart upload is
/// neither completed nor aborted, and S3 keeps and bills its parts: a merge retried at
/// every cut left a block's worth each time, which no quota or orphan sweep saw.
#[test]
fn a_block_upload_that_fails_midway_aborts_its_parts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FaultStore::default());
    let options = DbOptions::default().background_compaction(false);
    let db =
        Db::open_with_store(dir.path(), Arc::new(Faulty(store.clone())), "db", options).unwrap();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    // Values that do not compress, past one 8 MiB part of the upload.
    const ROWS: usize = 1_500_000;
    let values: Vec<i64> = frostdb_core::testing::incompressible()
        .take(ROWS)
        .map(|x| x as i64)
        .collect();
    let timestamps: Vec<i64> = (0..ROWS as i64).collect();
    table
        .insert(&batch(vec![
            ("name", str_n("cpu", ROWS)),
            ("labels.pod", str_n("p", ROWS)),
            ("timestamp", ints(&timestamps)),
            ("value", ints(&values)),
        ]))
        .unwrap();

    // Every part fails until healed: the rotation also wakes the background persistence
    // worker, which may try the block first (it took a single armed failure, and this
    // thread's retry then succeeded). Both attempts must fail and leave nothing.
    store.fail_next_parts(usize::MAX);
    assert!(
        table.persist().is_err(),
        "a block whose part failed was kept"
    );
    assert!(
        table.blocks().is_empty(),
        "a block whose part failed was kept"
    );
    store.heal();
    // The rows are still there, and the next cut writes them whole. It waits for any
    // background attempt (persistence is one at a time), so every failed upload has
    // ended by now and must have been aborted.
    assert_eq!(table.persist().unwrap().len(), 1);
    assert_eq!(
        store.open_uploads(),
        0,
        "the failed upload's parts were left"
    );
    assert_eq!(count(&table.scan(&ScanRequest::new()).unwrap()), ROWS);
}
