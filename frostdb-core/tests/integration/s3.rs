//! Blocks on a real S3-compatible server: moto's server on 127.0.0.1, started by the test.
//! The README's test command installs it (`FROSTDB_MOTO` points at `moto_server`); in CI a
//! missing server is a failure, elsewhere the test prints why it skipped.

use crate::common;

use common::*;
use frostdb_core::testing::S3Server;
use frostdb_core::{Db, DbOptions, ScanRequest, TableOptions, col};

#[test]
fn blocks_persist_to_s3_and_reopen_from_the_bucket() {
    let Some(server) = S3Server::start("blocks_persist_to_s3") else {
        return;
    };
    let s3 = server.bucket("frostdb", "").store().unwrap();
    let options = || DbOptions::default().background_compaction(false);
    let first = tempfile::tempdir().unwrap();
    {
        let db = Db::open_with_store(first.path(), s3.clone(), "fleet", options()).unwrap();
        let table = db
            .table(
                "samples",
                samples_schema(),
                TableOptions::default().row_group_rows(100),
            )
            .unwrap();
        for i in 0..50i64 {
            table
                .insert(&batch(vec![
                    ("name", str_n("cpu", 10)),
                    ("labels.pod", str_n(&format!("pod-{}", i % 5), 10)),
                    ("timestamp", ints(&[i; 10])),
                    ("value", ints(&[i; 10])),
                ]))
                .unwrap();
        }
        let blocks = table.persist().unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!((blocks[0].rows, blocks[0].row_groups), (500, 5));
        assert!(blocks[0].path.starts_with("fleet/samples/"));
    }
    // A machine with nothing local: everything comes from the bucket.
    let second = tempfile::tempdir().unwrap();
    let db = Db::open_with_store(second.path(), s3, "fleet", options()).unwrap();
    let table = db
        .get_table("samples")
        .expect("table from the bucket's manifest");
    let all = table.scan(&ScanRequest::new()).unwrap();
    assert_eq!(count(&all), 500);
    let pod = table
        .scan(&ScanRequest::new().filter(col("labels.pod").eq("pod-3")))
        .unwrap();
    assert_eq!(count(&pod), 100);
}

/// The conditional puts a shared database rests on, against a real S3 API: a second
/// writer is refused while the first's lease runs, takes over with every acknowledged write
/// when the first's holder name comes back (a restart), and the first is fenced off; a
/// reader follows the cuts.
#[test]
fn a_shared_database_on_s3_fences_its_old_writer_and_feeds_readers() {
    use frostdb_core::{Error, SharedOptions};
    let Some(server) = S3Server::start("a_shared_database_on_s3") else {
        return;
    };
    let bucket = server.bucket("shared", "fleet");
    let store = bucket.store().unwrap();
    let prefix = bucket.database("t1").unwrap();
    let shared = |holder: &str| {
        SharedOptions::new(holder)
            .flush_interval(std::time::Duration::from_secs(3600))
            .retire_grace(std::time::Duration::ZERO)
    };
    let options = || DbOptions::default().background_compaction(false);
    let rows = |i: i64| {
        batch(vec![
            ("name", str_n("cpu", 10)),
            ("labels.pod", str_n("p", 10)),
            ("timestamp", ints(&[i; 10])),
            ("value", ints(&[i; 10])),
        ])
    };
    let a = Db::open_shared(store.clone(), &prefix, options(), shared("a")).unwrap();
    let table = a
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    table.insert(&rows(1)).unwrap();
    a.flush().unwrap();
    table.insert(&rows(2)).unwrap(); // only in the bucket's WAL
    let refused = Db::open_shared(store.clone(), &prefix, options(), shared("b")).unwrap_err();
    assert!(matches!(refused, Error::LeaseHeld { .. }), "{refused}");
    let reader = Db::open_reader(store.clone(), &prefix, options()).unwrap();
    let seen = |db: &Db| {
        count(
            &db.get_table("samples")
                .unwrap()
                .scan(&ScanRequest::new())
                .unwrap(),
        )
    };
    assert_eq!(seen(&reader), 10, "the cut, not the WAL");
    let again = Db::open_shared(store, &prefix, options(), shared("a")).unwrap();
    assert_eq!(seen(&again), 20, "every acknowledged write");
    let fenced = table.insert(&rows(3)).unwrap_err();
    assert!(
        matches!(fenced, Error::Fenced { .. } | Error::Poisoned { .. }),
        "{fenced}"
    );
    again.flush().unwrap();
    assert!(reader.refresh().unwrap());
    assert_eq!(seen(&reader), 20);
}
