//! A profile store shared through a bucket: a writer's profiles answered by a reader (a
//! follower of the bucket) exactly as the writer answers them, cut after cut; a new writer
//! taking over answers with every acknowledged profile.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use frostdb_core::{Db, DbOptions, SharedOptions, WorkerPool};
use frostdb_pprof::report::top::TopTable;
use frostdb_pprof::{Error, IngestOptions, ProfileStore, StoreOptions};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use object_store::ObjectStore;
use object_store::memory::InMemory;

fn file(name: &str) -> Vec<u8> {
    std::fs::read(common::shared().join("testdata/pprof").join(name)).unwrap()
}

fn at(pod: &str, timestamp_ms: i64) -> IngestOptions {
    IngestOptions::default()
        .name("process_cpu")
        .labels(vec![("pod".into(), pod.into())])
        .timestamp_ms(timestamp_ms)
}

fn writer(store: Arc<dyn ObjectStore>, holder: &str) -> ProfileStore {
    let shared = SharedOptions::new(holder)
        .lease_ttl(Duration::from_secs(30))
        .flush_interval(Duration::from_secs(3600))
        .retire_grace(Duration::ZERO);
    let options = DbOptions::default().workers(WorkerPool::new(1).unwrap());
    let db = Db::open_shared(store, "tenants/a", options, shared).unwrap();
    ProfileStore::open(db, StoreOptions::default()).unwrap()
}

fn reader(store: Arc<dyn ObjectStore>) -> frostdb_pprof::Result<ProfileStore> {
    let options = DbOptions::default().workers(WorkerPool::new(1).unwrap());
    let db = Db::open_reader(store, "tenants/a", options).unwrap();
    ProfileStore::open_reader(db, StoreOptions::default())
}

fn top(store: &ProfileStore) -> (i64, String) {
    let selector = Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap();
    let merged = store.merge(&selector, TimeRange::ALL).unwrap();
    (merged.total(), TopTable::build(&merged).render())
}

#[test]
fn a_reader_answers_as_its_writer_did_cut_after_cut() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // No store in the bucket yet: a reader says so, not an empty answer.
    let refused = reader(bucket.clone()).unwrap_err();
    assert!(matches!(refused, Error::Unavailable(_)), "{refused}");
    let w = writer(bucket.clone(), "w");
    // A store without profiles yet answers empty.
    assert_eq!(top(&reader(bucket.clone()).unwrap()).0, 0);
    let cpu = [
        file("pyroscope__go-cpu.pb.gz"),
        file("goapp__go119-cpu-2s.pb.gz"),
    ];
    w.ingest(&cpu[0], &at("a", 1_000)).unwrap();
    w.db().flush().unwrap();
    let r = reader(bucket.clone()).unwrap();
    assert_eq!(top(&r), top(&w));
    let first = top(&r).0;
    // More profiles, new stacks among them, into the partition the reader has read.
    for (i, profile) in cpu.iter().enumerate() {
        w.ingest(profile, &at("b", 2_000 + i as i64)).unwrap();
    }
    assert_eq!(top(&r).0, first, "not cut yet");
    w.db().flush().unwrap();
    assert!(r.refresh().unwrap());
    assert!(top(&r).0 > first);
    assert_eq!(top(&r), top(&w), "the reader's partition is read again");
    // Readers only read.
    let refused = r.ingest(&cpu[0], &at("c", 3_000)).unwrap_err();
    assert!(refused.to_string().contains("read-only"), "{refused}");
}

#[test]
fn a_new_writer_answers_with_every_profile_the_old_one_acknowledged() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let w = writer(bucket.clone(), "w");
    let cpu = file("pyroscope__go-cpu.pb.gz");
    w.ingest(&cpu, &at("a", 1_000)).unwrap();
    w.db().flush().unwrap();
    w.ingest(&cpu, &at("a", 2_000)).unwrap(); // only in the WAL objects
    let before = top(&w);
    // The same writer restarting elsewhere (its name again: it takes its lease at once).
    let again = writer(bucket, "w");
    assert_eq!(top(&again), before);
    assert!(
        w.ingest(&cpu, &at("a", 3_000)).is_err(),
        "the old one is fenced"
    );
}
