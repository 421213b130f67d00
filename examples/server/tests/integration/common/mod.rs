//! A `frostdb serve` child process for tests, and access to shared/.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// The shared/ folder beside the repository (or `FROSTDB_SHARED`).
pub(crate) fn shared() -> PathBuf {
    if let Ok(dir) = std::env::var("FROSTDB_SHARED") {
        return PathBuf::from(dir);
    }
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    if beside.exists() {
        return beside;
    }
    PathBuf::from("/work/shared")
}

/// A file of shared/testdata.
pub(crate) fn testdata(path: &str) -> Vec<u8> {
    let p = shared().join("testdata").join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Whether a tool runs; in CI its absence is a failure (scripts/test.sh installs it).
pub(crate) fn have(program: &str, arg: &str) -> bool {
    let ok = Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have {program} (scripts/test.sh installs it)"
        );
        eprintln!("SKIPPED: {program} is not installed");
    }
    ok
}

/// A running server on a free loopback port.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub(crate) url: String,
    /// Its data directory.
    pub(crate) data: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `frostdb serve` on `data`, with `config` (TOML) when given.
    pub(crate) fn start(data: &Path, config: Option<&str>) -> Self {
        Self::start_with(data, config, None)
    }

    /// [`Server::start`] under a descriptor limit of `nofile` (soft and hard), when given:
    /// the `ulimit -n 1024` many hosts still have.
    pub(crate) fn start_with(data: &Path, config: Option<&str>, nofile: Option<u64>) -> Self {
        match nofile {
            None => Self::start_after(data, config, None),
            Some(n) => Self::start_after(data, config, Some(&format!("ulimit -n {n}"))),
        }
    }

    /// [`Server::start`] from a shell that runs `setup` first (`ulimit -n 1024`, joining
    /// a cgroup), when given, then becomes the server.
    pub(crate) fn start_after(data: &Path, config: Option<&str>, setup: Option<&str>) -> Self {
        let mut cmd = match setup {
            None => Command::new(env!("CARGO_BIN_EXE_frostdb")),
            Some(setup) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("{setup} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_frostdb"));
                sh
            }
        };
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .env("FROSTDB_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(config) = config {
            let path = data.with_extension("toml");
            std::fs::write(&path, config).unwrap();
            cmd.arg("--config").arg(&path);
        }
        let mut child = cmd.spawn().expect("spawn frostdb serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr: String = rest.chars().take_while(|c| *c != '/').collect();
                    let _ = tx.send(addr);
                }
                eprintln!("[server] {line}");
                sink.lock().unwrap().push(line);
            }
        });
        // A deadline for a server that never comes up, not a synchronisation sleep.
        let addr = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| {
                panic!(
                    "the server did not log its address:\n{}",
                    log.lock().unwrap().join("\n")
                )
            });
        Self {
            child,
            url: format!("http://{addr}"),
            data: data.to_owned(),
            log,
        }
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of the server's `/proc/<pid>/status` (`VmHWM`, `VmRSS`, `Threads`), in its
    /// unit (kB for memory).
    pub(crate) fn status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid()))
    }

    /// Descriptors the server has open.
    pub(crate) fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Whether the process is still running.
    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().map(|s| s.is_none()).unwrap_or(false)
    }

    /// Sends SIGTERM and waits at most `limit` for the exit: `None` when it did not exit
    /// in time (then it is killed), else whether it exited with success.
    pub(crate) fn terminate_within(mut self, limit: Duration) -> Option<bool> {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status.success());
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the server logged so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits (bounded) for a log line matching `pred`: the server writes it while handling
    /// a request the test already has the answer to, but the line travels through a pipe.
    pub(crate) fn log_until(&self, pred: impl Fn(&str) -> bool) -> String {
        self.log_within(Duration::from_secs(30), pred)
    }

    /// [`Self::log_until`], waiting at most `bound` (work whose length depends on the
    /// machine: the eBPF sampler compiles every sampled binary's unwind tables first).
    pub(crate) fn log_within(&self, bound: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + bound;
        loop {
            let log = self.log();
            if log.lines().any(&pred) {
                return log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no such log line:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits for the exit; returns whether it exited with success.
    pub(crate) fn terminate(mut self) -> bool {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        self.child.wait().expect("wait").success()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET returning (status, body).
pub(crate) async fn get(url: &str, tenant: Option<&str>) -> (u16, String) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(t) = tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A POST of `body` as JSON, returning (status, body).
pub(crate) async fn post_json(url: &str, body: &serde_json::Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A GET that must succeed, as JSON.
pub(crate) async fn get_json(url: &str, tenant: Option<&str>) -> serde_json::Value {
    let (status, body) = get(url, tenant).await;
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: {e}: {body}"))
}

/// Percent-encodes a query parameter value.
#[allow(unused_imports)]
pub(crate) use frostdb_server::url_encode as enc;

/// The Python of target/test-venv (scripts/test.sh installs pyroscope-io and Playwright).
pub(crate) fn venv_python(module: &str) -> Option<std::path::PathBuf> {
    let venv = std::env::var("FROSTDB_TEST_VENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-venv")
        });
    let python = venv.join("bin/python");
    let ok = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have {module} in {} (scripts/test.sh installs it)",
            venv.display()
        );
        eprintln!("SKIPPED: {module} is not installed in {}", venv.display());
        return None;
    }
    Some(python)
}

pub(crate) fn e2e_script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e")
        .join(name)
}

/// Fails unless the program that wrote `out` exited successfully, showing what it printed.
pub(crate) fn assert_ran(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sum of the `cpu` values of a profile.
pub(crate) fn cpu_total(p: &frostdb_pprof::proto::Profile) -> i64 {
    let i = p
        .sample_type
        .iter()
        .position(|t| p.string_table[t.r#type as usize] == "cpu")
        .unwrap();
    p.sample.iter().map(|s| s.value[i]).sum()
}

/// An export of one profile of `samples` samples, all on one stack `depth` frames deep
/// (of one location, one function).
pub(crate) fn shared_stack(
    depth: usize,
    samples: usize,
) -> frostdb_pprof::convert::otlp::proto::ExportProfilesServiceRequest {
    use frostdb_pprof::convert::otlp::proto as otlp;
    otlp::ExportProfilesServiceRequest {
        dictionary: Some(otlp::ProfilesDictionary {
            string_table: vec![
                String::new(),
                "main".into(),
                "samples".into(),
                "count".into(),
            ],
            function_table: vec![
                otlp::Function::default(),
                otlp::Function {
                    name_strindex: 1,
                    ..Default::default()
                },
            ],
            location_table: vec![
                otlp::Location::default(),
                otlp::Location {
                    lines: vec![otlp::Line {
                        function_index: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            stack_table: vec![otlp::Stack {
                location_indices: vec![1; depth],
            }],
            ..Default::default()
        }),
        resource_profiles: vec![otlp::ResourceProfiles {
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![otlp::Profile {
                    sample_type: Some(otlp::ValueType {
                        type_strindex: 2,
                        unit_strindex: 3,
                    }),
                    time_unix_nano: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_nanos() as u64,
                    samples: vec![
                        otlp::Sample {
                            values: vec![1],
                            ..Default::default()
                        };
                        samples
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Polls `check` until it holds, for at most `limit`: for state that changes on its own
/// time (a timeout elapsing in the server), which no event announces to the client.
pub(crate) async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A loopback address held bound, not listening, until [`HeldAddr::release`]: a connection
/// to it is refused, as to a target that is down, and no other process can take its port
/// meanwhile. A port found free and let go is soon another test's server, answering 404 to
/// a scrape meant for a program started later.
pub(crate) struct HeldAddr {
    socket: tokio::net::TcpSocket,
    pub(crate) addr: String,
}

impl HeldAddr {
    pub(crate) fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind("127.0.0.1:0".parse().unwrap())
            .expect("a loopback port");
        let addr = socket.local_addr().expect("its address").to_string();
        Self { socket, addr }
    }

    /// Lets the port go, for a child to bind now: its address.
    pub(crate) fn release(self) -> String {
        drop(self.socket);
        self.addr
    }
}

/// Waits (bounded) until `child` accepts connections at `addr`, failing the test with its
/// exit status if it ended first (a port another process took, a crash).
pub(crate) async fn wait_listening(child: &mut std::process::Child, addr: &str) {
    let up = eventually(Duration::from_secs(30), async || {
        if let Some(status) = child.try_wait().expect("a child's status") {
            panic!("{addr}: the program ended before it listened: {status}");
        }
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    assert!(up, "{addr}: nothing listening after 30 s");
}

/// A child process killed and reaped on drop.
pub(crate) struct Reap(pub(crate) std::process::Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether this process may load BPF programs: under CI=true (CI runs as root) it must;
/// elsewhere a test without it skips, saying why.
pub(crate) fn bpf_permitted() -> bool {
    match frostdb_ebpf_ingest::check_permitted() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("CI").is_err(),
                "BPF is not permitted under CI=true (CI runs as root): {why}"
            );
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

/// The value of the unlabelled series `name` on the server's `/metrics` (0 when absent).
pub(crate) async fn metric(s: &Server, name: &str) -> u64 {
    let (_, metrics) = get(&format!("{}/metrics", s.url), None).await;
    metric_in(&metrics, name).unwrap_or(0)
}

/// The value of the unlabelled series `name` in the text of `/metrics`.
pub(crate) fn metric_in(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
