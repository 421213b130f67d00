//! Group commit: profiles that arrive while a group's fsync runs are committed together in
//! the next group (one WAL record, one fsync), and a lone writer commits at once.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;

use frostdb_core::fs::{FileSystem, OsFs, WritableFile};
use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions, testing};
use parking_lot::{Condvar, Mutex};
use prost::Message;

/// The OS file system, with fsyncs of WAL segments held while the gate is closed; each
/// held fsync is announced on a channel.
#[derive(Debug, Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    held: Mutex<Option<mpsc::Sender<()>>>,
}

impl Gate {
    fn set(&self, closed: bool) {
        *self.closed.lock() = closed;
        self.opened.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.closed.lock();
        if *closed && let Some(held) = &*self.held.lock() {
            let _ = held.send(());
        }
        while *closed {
            self.opened.wait(&mut closed);
        }
    }
}

#[derive(Debug)]
struct GatedFs(Arc<Gate>);

struct GatedFile(Box<dyn WritableFile>, Arc<Gate>);

impl WritableFile for GatedFile {
    fn write_all(&self, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_all(buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.1.pass();
        self.0.sync_data()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
}

impl FileSystem for GatedFs {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        OsFs.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        OsFs.list(dir)
    }
    fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        OsFs.read(path)
    }
    fn open_read(&self, path: &Path) -> std::io::Result<(Box<dyn std::io::Read + Send>, u64)> {
        OsFs.open_read(path)
    }
    fn create(&self, path: &Path) -> std::io::Result<Box<dyn WritableFile>> {
        let file = OsFs.create(path)?;
        Ok(if path.extension().is_some_and(|e| e == "wal") {
            Box::new(GatedFile(file, self.0.clone()))
        } else {
            file
        })
    }
    fn sync_file(&self, path: &Path) -> std::io::Result<()> {
        OsFs.sync_file(path)
    }
    fn truncate(&self, path: &Path, len: u64) -> std::io::Result<()> {
        OsFs.truncate(path, len)
    }
    fn len(&self, path: &Path) -> std::io::Result<u64> {
        OsFs.len(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        OsFs.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        OsFs.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        OsFs.sync_dir(dir)
    }
    fn lock(&self, dir: &Path) -> frostdb_core::Result<Box<dyn Send + Sync>> {
        OsFs.lock(dir)
    }
}

fn profile(i: u64) -> Vec<u8> {
    testing::profile(i * 100, 20, 4).encode_to_vec()
}

fn options(pod: u64) -> IngestOptions {
    IngestOptions::default()
        .name("process_cpu")
        .labels(vec![("pod".into(), format!("pod-{pod}"))])
        .timestamp_ms(1_700_000_000_000)
}

fn records(store: &ProfileStore) -> (u64, u64) {
    let wal = store
        .db()
        .wal_stats()
        .expect("an on-disk database has a WAL");
    (wal.records, wal.syncs)
}

#[test]
fn profiles_arriving_during_an_fsync_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let db = Db::open(
        dir.path(),
        DbOptions::default().file_system(Arc::new(GatedFs(gate.clone()))),
    )
    .unwrap();
    let store = Arc::new(ProfileStore::open(db, StoreOptions::default()).unwrap());

    // A lone writer: each profile its own record and fsync, none waiting for company.
    for i in 0..3 {
        store.ingest(&profile(i), &options(i)).unwrap();
    }
    let (lone_records, lone_syncs) = records(&store);
    assert_eq!(
        lone_records, 3,
        "a lone writer commits each profile at once"
    );

    // The first profile's fsync is held; five more arrive meanwhile.
    let (held_tx, held) = mpsc::channel();
    *gate.held.lock() = Some(held_tx);
    gate.set(true);
    std::thread::scope(|s| {
        let first = s.spawn(|| store.ingest(&profile(10), &options(10)));
        held.recv().unwrap();
        let later: Vec<_> = (11..16)
            .map(|i| {
                let store = store.clone();
                s.spawn(move || store.ingest(&profile(i), &options(i)))
            })
            .collect();
        // Every later profile joins the open group (interned, rows appended) while the
        // fsync is held; the gate opens either way, so that a failure cannot hang the test.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.profiles_awaiting_commit() < 5 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let joined = store.profiles_awaiting_commit();
        gate.set(false);
        assert_eq!(joined, 5, "the later profiles did not wait in one group");
        first.join().unwrap().unwrap();
        for t in later {
            t.join().unwrap().unwrap();
        }
    });
    let (all_records, all_syncs) = records(&store);
    assert_eq!(
        (all_records - lone_records, all_syncs - lone_syncs),
        (2, 2),
        "the held profile's group, then one group of the five that came meanwhile"
    );
    // Every profile is stored.
    let selector =
        frostdb_profile::Selector::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}").unwrap();
    let merged = store
        .merge(&selector, frostdb_profile::TimeRange::ALL)
        .unwrap();
    let expected: i64 = [0, 1, 2, 10, 11, 12, 13, 14, 15]
        .iter()
        .map(|i| testing::total(i * 100, 20))
        .sum();
    assert_eq!(merged.total(), expected);
}
