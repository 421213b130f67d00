//! Blocks on a real S3-compatible server: moto's server on 127.0.0.1, started by the test.
//! The README's test command installs it (`FROSTDB_MOTO` points at `moto_server`); in CI a
//! missing server is a failure, elsewhere the test prints why it skipped.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use frostdb_core::{Db, DbOptions, ScanRequest, TableOptions, col};
use object_store::aws::AmazonS3Builder;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto() -> Option<String> {
    if let Ok(path) = std::env::var("FROSTDB_MOTO") {
        return Some(path);
    }
    let found = Command::new("sh")
        .args(["-c", "command -v moto_server"])
        .output()
        .ok()?;
    found
        .status
        .success()
        .then(|| String::from_utf8_lossy(&found.stdout).trim().to_owned())
}

/// Sends one HTTP/1.1 request and returns the status code.
fn http(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok(code)
}

fn start(moto: &str) -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {moto}: {e}"));
    let server = Server(child);
    // Wait for the server to answer (it is another process: there is no event to wait on).
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(port, "GET", "/").is_err() {
        assert!(
            Instant::now() < deadline,
            "moto_server did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, port)
}

#[test]
fn blocks_persist_to_s3_and_reopen_from_the_bucket() {
    let Some(moto) = moto() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must run the S3 test: install moto[server] (scripts/test.sh does)"
        );
        eprintln!("SKIPPED blocks_persist_to_s3: no moto_server (pip install 'moto[server]')");
        return;
    };
    let (_server, port) = start(&moto);
    assert_eq!(
        http(port, "PUT", "/frostdb").unwrap(),
        200,
        "bucket created"
    );
    let s3 = Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{port}"))
            .with_allow_http(true)
            .with_bucket_name("frostdb")
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .unwrap(),
    );
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
