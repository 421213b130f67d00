//! A full WAL device: the write that does not fit fails (is not acknowledged), the table stays
//! readable, and once space returns writes succeed again and everything acknowledged
//! survives a reopen. Runs on a small tmpfs, which needs root (CI runs as root); elsewhere
//! it prints why it skipped.

use crate::common;

use std::process::Command;
use std::sync::Arc;

use common::*;
use frostdb_core::{Db, DbOptions, Error, ScanRequest, TableOptions};
use object_store::memory::InMemory;

struct Mount(std::path::PathBuf);

impl Mount {
    fn tmpfs(dir: &std::path::Path, size: &str) -> Result<Self, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "remount failed");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn write(table: &frostdb_core::Table, i: i64) -> frostdb_core::Result<u64> {
    // Values that do not compress well, so the WAL fills fast.
    let values: Vec<i64> = (0..200)
        .map(|r| (i * 7919 + r).wrapping_mul(0x5851_F42D_4C95_7F2D))
        .collect();
    table.insert(&batch(vec![
        ("name", str_n("cpu", 200)),
        ("timestamp", ints(&vec![i; 200])),
        ("value", ints(&values)),
    ]))
}

#[test]
fn a_full_wal_device_fails_the_write_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mount = match Mount::tmpfs(dir.path(), "512k") {
        Ok(m) => m,
        Err(reason) => {
            assert!(
                std::env::var("CI").is_err(),
                "cannot mount a tmpfs under CI=true (CI runs as root): {reason}"
            );
            eprintln!("SKIPPED a_full_wal_device_fails_the_write: {reason} (needs root)");
            return;
        }
    };
    let store = Arc::new(InMemory::new());
    let open = || {
        Db::open_with_store(
            dir.path(),
            store.clone(),
            "",
            DbOptions::default().background_compaction(false),
        )
        .unwrap()
    };
    let db = open();
    let table = db
        .table("samples", samples_schema(), TableOptions::default())
        .unwrap();

    let mut acked = 0i64;
    let failure = loop {
        match write(&table, acked) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 100_000, "the device never filled up");
    };
    match &failure {
        Error::Io { source, context } => {
            assert_eq!(source.raw_os_error(), Some(28), "ENOSPC: {failure}");
            assert!(context.contains("WAL"), "{context}");
        }
        other => panic!("expected an I/O error, got {other}"),
    }
    assert!(acked > 0);
    let rows = |t: &frostdb_core::Table| count(&t.scan(&ScanRequest::new()).unwrap());
    assert_eq!(
        rows(&table),
        acked as usize * 200,
        "reads go on; the failed write is absent"
    );
    // Still full: still refused, still consistent.
    assert!(write(&table, acked).is_err());

    mount.resize("16m");
    write(&table, acked).expect("writes succeed once space returns");
    acked += 1;
    assert_eq!(rows(&table), acked as usize * 200);

    drop(table);
    drop(db);
    let db = open();
    let table = db.get_table("samples").unwrap();
    assert_eq!(
        rows(&table),
        acked as usize * 200,
        "every acknowledged write after reopening"
    );
}
