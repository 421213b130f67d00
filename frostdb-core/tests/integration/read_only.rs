//! Scenario tests of `Db::open_read_only`: a directory read whole (persisted blocks and the
//! WAL after them) without a single file created, removed or changed; writes refused; the
//! directory's lock shared among readers and never with a writer.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use common::*;
use frostdb_core::{Db, DbOptions, Error, LOCK_FILE, ScanRequest, Table, TableOptions, col};

fn options() -> DbOptions {
    DbOptions::default().background_compaction(false)
}

/// Batch `i` of `name`: 10 rows, pods `pod-(i*7+r)%50`, timestamps `i*10+r`.
fn fill(table: &Table, name: &str, from: usize, to: usize) {
    for i in from..to {
        let pods: Vec<String> = (0..10)
            .map(|r| format!("pod-{:03}", (i * 7 + r) % 50))
            .collect();
        let pods: Vec<Option<&str>> = pods.iter().map(|p| Some(p.as_str())).collect();
        let ts: Vec<i64> = (0..10).map(|r| (i * 10 + r) as i64).collect();
        table
            .insert(&batch(vec![
                ("name", str_n(name, 10)),
                ("labels.pod", strs(&pods)),
                ("timestamp", ints(&ts)),
                ("value", ints(&ts)),
            ]))
            .unwrap();
    }
}

fn rows(table: &Table, name: &str) -> usize {
    count(
        &table
            .scan(&ScanRequest::new().filter(col("name").eq(name)))
            .unwrap(),
    )
}

/// What a directory tree is, file by file: kind, length, modification time and bytes (the
/// directories' own times show a file created and removed again).
type Tree = BTreeMap<PathBuf, (bool, u64, SystemTime, Vec<u8>)>;

fn tree(dir: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, into: &mut Tree) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let bytes = if meta.is_file() {
                std::fs::read(&path).unwrap()
            } else {
                Vec::new()
            };
            let at = path.strip_prefix(root).unwrap().to_path_buf();
            into.insert(
                at,
                (meta.is_dir(), meta.len(), meta.modified().unwrap(), bytes),
            );
            if meta.is_dir() {
                walk(root, &path, into);
            }
        }
    }
    let mut into = Tree::new();
    let meta = std::fs::metadata(dir).unwrap();
    into.insert(
        PathBuf::new(),
        (true, meta.len(), meta.modified().unwrap(), Vec::new()),
    );
    walk(dir, dir, &mut into);
    into
}

/// A database whose table `samples` has 30 batches persisted in blocks and 20 more only in
/// the WAL.
fn persisted_and_in_the_wal(dir: &Path) {
    let db = Db::open(dir, options()).unwrap();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();
    fill(&table, "cpu", 0, 30);
    db.flush().unwrap();
    fill(&table, "mem", 30, 50);
    assert!(table.stats().blocks > 0);
    assert_eq!(
        table.stats().block_rows,
        300,
        "the later rows are only in the WAL"
    );
}

#[test]
fn a_read_only_open_reads_blocks_and_the_wal_and_changes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    persisted_and_in_the_wal(dir.path());
    let before = tree(dir.path());
    assert!(before.contains_key(Path::new(LOCK_FILE)));

    let db = Db::open_read_only(dir.path(), options()).unwrap();
    assert!(db.is_read_only());
    let table = db.get_table("samples").unwrap();
    assert_eq!(rows(&table, "cpu"), 300, "from the blocks");
    assert_eq!(rows(&table, "mem"), 200, "from the WAL");
    assert_eq!(table.stats().rows, 500);
    // Neither in-memory work nor a flush writes anything.
    table.compact_fully().unwrap();
    db.flush().unwrap();
    assert_eq!(table.stats().block_rows, 300, "nothing was persisted");
    assert_eq!(db.wal_stats(), None, "no WAL opened to write");
    drop((table, db));

    assert_eq!(
        tree(dir.path()),
        before,
        "no file created, removed or changed"
    );
    // And the writer finds it as it left it.
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(db.get_table("samples").unwrap().stats().rows, 500);
}

#[test]
fn blocks_that_fill_during_replay_stay_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Db::open(dir.path(), options()).unwrap();
        let table = db
            .table(
                "small",
                samples_schema(),
                TableOptions::default().block_size(4096),
            )
            .unwrap();
        // The writer cannot persist the blocks it fills (a file stands where their
        // directory would go), so they stay in the WAL.
        let obstacle = dir.path().join("blocks").join("small");
        std::fs::write(&obstacle, b"in the way").unwrap();
        fill(&table, "cpu", 0, 40);
        assert_eq!(table.stats().blocks, 0);
        drop((table, db));
        std::fs::remove_file(&obstacle).unwrap();
    }
    let before = tree(dir.path());

    let db = Db::open_read_only(dir.path(), options()).unwrap();
    let table = db.get_table("small").unwrap();
    let stats = table.stats();
    assert!(stats.frozen_blocks > 1, "replay filled blocks: {stats:?}");
    assert_eq!(stats.blocks, 0, "and persisted none of them");
    assert_eq!(rows(&table, "cpu"), 400);
    drop((table, db));

    assert_eq!(
        tree(dir.path()),
        before,
        "no block written, no manifest changed"
    );
}

#[test]
fn a_torn_tail_is_skipped_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    persisted_and_in_the_wal(dir.path());
    let wal = dir.path().join("wal");
    let last = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let segment = last.strip_prefix(dir.path()).unwrap().to_path_buf();
    // A write cut short by a crash.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&last)
        .unwrap()
        .write_all(&[0x5a; 11])
        .unwrap();
    let before = tree(dir.path());

    let db = Db::open_read_only(dir.path(), options()).unwrap();
    assert_eq!(db.get_table("samples").unwrap().stats().rows, 500);
    drop(db);
    assert_eq!(tree(dir.path()), before, "the torn tail is still there");

    // A writer cuts it off as usual.
    let db = Db::open(dir.path(), options()).unwrap();
    assert_eq!(db.get_table("samples").unwrap().stats().rows, 500);
    drop(db);
    assert!(
        tree(dir.path())[&segment].1 < before[&segment].1,
        "the writer cut the tail off"
    );
}

#[test]
fn writes_to_a_read_only_database_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    persisted_and_in_the_wal(dir.path());
    let before = tree(dir.path());
    let db = Db::open_read_only(dir.path(), options()).unwrap();
    let table = db.get_table("samples").unwrap();
    let read_only = |result: Result<_, Error>| {
        let error = result.expect_err("refused");
        assert!(matches!(error, Error::ReadOnly { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains(&dir.path().display().to_string()),
            "names the directory: {message}"
        );
    };

    let one = batch(vec![
        ("name", str_n("cpu", 1)),
        ("timestamp", ints(&[1])),
        ("value", ints(&[1])),
    ]);
    read_only(table.insert(&one).map(drop));
    read_only(
        db.table("other", samples_schema(), TableOptions::default())
            .map(drop),
    );
    let mut tx = db.transaction();
    tx.insert(&table, &one).unwrap();
    read_only(tx.commit().map(drop));
    read_only(table.persist().map(drop));
    read_only(table.set_ttl(Some(std::time::Duration::from_secs(60))));
    read_only(table.delete_blocks(|_| true).map(drop));
    assert_eq!(table.stats().rows, 500, "nothing changed");
    drop((table, db));
    assert_eq!(tree(dir.path()), before);
}

#[test]
fn readers_share_the_directory_and_never_with_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    persisted_and_in_the_wal(dir.path());
    let pid = format!("process {}", std::process::id());

    let writer = Db::open(dir.path(), options()).unwrap();
    match Db::open_read_only(dir.path(), options()) {
        Err(Error::Locked { holder, .. }) => assert_eq!(holder, pid, "names the writer"),
        other => panic!("a reader opened beside a writer: {other:?}"),
    }
    drop(writer);

    let first = Db::open_read_only(dir.path(), options()).unwrap();
    let second = Db::open_read_only(dir.path(), options()).unwrap();
    match Db::open(dir.path(), options()) {
        Err(error @ Error::Locked { .. }) => {
            let message = error.to_string();
            assert!(message.contains("read-only"), "{message}");
            assert!(
                !message.contains(&pid),
                "no pid of a writer gone: {message}"
            );
        }
        other => panic!("a writer opened beside readers: {other:?}"),
    }
    assert_eq!(first.get_table("samples").unwrap().stats().rows, 500);
    assert_eq!(second.get_table("samples").unwrap().stats().rows, 500);
    drop(first);
    assert!(
        matches!(Db::open(dir.path(), options()), Err(Error::Locked { .. })),
        "one reader left is enough"
    );
    drop(second);
    Db::open(dir.path(), options()).unwrap();
}

#[test]
fn no_database_is_an_error_and_nothing_is_created() {
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("missing");
    let not_found = |error: Error, dir: &Path| match &error {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                error.to_string().contains(&dir.display().to_string()),
                "{error}"
            );
        }
        _ => panic!("not a NotFound error: {error}"),
    };
    not_found(
        Db::open_read_only(&missing, options()).unwrap_err(),
        &missing,
    );
    assert!(!missing.exists(), "no directory created");

    let empty = parent.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    not_found(Db::open_read_only(&empty, options()).unwrap_err(), &empty);
    assert_eq!(
        std::fs::read_dir(&empty).unwrap().count(),
        0,
        "nothing created"
    );

    // A database whose writer never created a table (only a WAL) opens, with no tables.
    drop(Db::open(&empty, options()).unwrap());
    let db = Db::open_read_only(&empty, options()).unwrap();
    assert!(db.tables().is_empty());
}
