//! Test support shared by the workspace's tests: an S3-compatible server (moto's) on
//! 127.0.0.1, and the kill -9 harness of the crash tests ([`crash`]). Not part of the API.

pub mod crash;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Bucket;

/// Pseudo-random numbers (xorshift64, from a fixed seed): values, or bytes, that do not
/// compress.
pub fn incompressible() -> impl Iterator<Item = u64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// A small seeded generator (SplitMix64) for tests that draw cases: the same seed draws
/// the same numbers, so a failure names the seed that replays it.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A port free now on 127.0.0.1 (bound, then released for a child process to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// moto's S3 server, running while this lives.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `moto_server`: `FROSTDB_MOTO`, or on the `PATH`.
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

/// Sends one HTTP/1.1 request with an empty body and returns the status code.
pub fn http(port: u16, method: &str, path: &str) -> std::io::Result<u16> {
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

impl S3Server {
    /// Starts moto's server, or `None` (printing why, as `test` names it) where it is not
    /// installed; under `CI` a missing server is a failure (scripts/test.sh installs it).
    pub fn start(test: &str) -> Option<Self> {
        let Some(moto) = moto() else {
            assert!(
                std::env::var("CI").is_err(),
                "CI must run {test}: install moto[server] (scripts/test.sh does)"
            );
            eprintln!("SKIPPED {test}: no moto_server (pip install 'moto[server]')");
            return None;
        };
        let port = free_port();
        let child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {moto}: {e}"));
        let server = Self { child, port };
        // Wait for the server to answer (another process: there is no event to wait on).
        let deadline = Instant::now() + Duration::from_secs(60);
        while http(port, "GET", "/").is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(server)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates bucket `name` and returns it with prefix `prefix`, its endpoint and test
    /// credentials set.
    pub fn bucket(&self, name: &str, prefix: &str) -> Bucket {
        let status = http(self.port, "PUT", &format!("/{name}")).expect("moto answers");
        assert_eq!(status, 200, "creating bucket {name}");
        Bucket::new(format!("s3://{name}/{prefix}"))
            .endpoint(self.endpoint())
            .region("us-east-1")
            .allow_http(true)
            .credentials("test", "test")
    }
}

/// A WAL record of transaction `tx` writing `batch` to `table`, framed as a segment holds it
/// (header, checksums, payload): for tests that append records nobody inserted.
pub fn wal_record(tx: u64, table: &str, batch: &arrow::record_batch::RecordBatch) -> Vec<u8> {
    let payload =
        crate::wal::record::encode_entries(&[(table, batch)]).expect("an encodable batch");
    crate::wal::record::frame(tx, &payload)
}
