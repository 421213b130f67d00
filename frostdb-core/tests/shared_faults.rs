//! A database shared through a bucket whose cut fails: the failure is an error to the
//! caller, a `persist error` event to the embedder, and the data stays to be cut again.

mod common;

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
