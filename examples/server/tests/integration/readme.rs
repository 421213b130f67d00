//! The README's examples, run as printed. Its first command starts the server; each block
//! fenced as `sh tested:<when>` then runs in bash (`set -euo pipefail`) in a scratch
//! directory holding the repository's `testdata/` and `scripts/`, as a newcomer's clone
//! would: `tested:server` blocks while that server runs, `tested:stopped` ones after it was
//! sent SIGTERM (and exited cleanly), `tested:cli` ones any time. A `text` block right after
//! a tested block lists lines its output (stdout, then stderr) must contain. `cargo` is answered by the build the
//! tests made (the same binaries, unoptimised): `cargo run --release --bin frostdb -- ARGS`
//! runs it, `cargo build --release --bin frostdb` puts it at `target/release/frostdb`; any
//! other cargo command fails the test, so a README that grows one is noticed here.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A fenced block of the README: its info string (`sh tested:cli`), its text, its line.
#[derive(Debug)]
struct Block {
    info: String,
    text: String,
    line: usize,
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in readme.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_owned(),
                    text: String::new(),
                    line: i + 1,
                })
            }
            (Some(_), Some("")) => out.extend(open.take()),
            (Some(b), _) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory laid out as a clone's root, with `cargo` answered by the tests' build.
fn scratch() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for name in ["testdata", "scripts"] {
        std::os::unix::fs::symlink(
            repo().join(name).canonicalize().unwrap(),
            dir.path().join(name),
        )
        .unwrap();
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_frostdb"));
    let shims = dir.path().join(".shims");
    std::fs::create_dir(&shims).unwrap();
    let cargo = shims.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            r#"#!/bin/sh
# The README's cargo commands, answered by the binary the tests built.
case "$*" in
  "run --release --bin frostdb -- "*) shift 5; exec '{bin}' "$@" ;;
  "build --release --bin frostdb") mkdir -p target/release && ln -sf '{bin}' target/release/frostdb ;;
  *) echo "the README test does not know: cargo $*" >&2; exit 2 ;;
esac
"#,
            bin = bin.display()
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&cargo).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&cargo, permissions).unwrap();
    let path = format!(
        "{}:{}",
        shims.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (dir, path)
}

/// Runs `script` in bash in `dir`; its stdout and stderr, or a failure naming the block.
fn run(dir: &Path, path: &str, script: &str, block: &Block) -> String {
    let out = Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .current_dir(dir)
        .env("PATH", path)
        .output()
        .expect("bash runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "README line {}: the block failed ({}):\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        block.line,
        out.status,
    );
    // What a terminal shows: an error a block answers (`|| echo`) is part of its example.
    format!("{stdout}{stderr}")
}

/// Every line of the `text` block shown after a tested block is a line of its output.
fn check_output(expected: &Block, stdout: &str) {
    let lines: Vec<&str> = stdout.lines().map(str::trim_end).collect();
    for want in expected
        .text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
    {
        assert!(
            lines.contains(&want),
            "README line {}: the output lacks the line\n{want}\n--- the output was:\n{stdout}",
            expected.line
        );
    }
}

/// The server the README's first command starts, with its log.
struct Server {
    child: std::process::Child,
    log: std::sync::mpsc::Receiver<String>,
}

impl Server {
    /// Starts `command` (the README's first line) and waits until the server says where it
    /// listens.
    fn start(dir: &Path, path: &str, command: &str) -> Self {
        let mut child = Command::new("bash")
            .args(["-c", command])
            .current_dir(dir)
            .env("PATH", path)
            .env("FROSTDB_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("bash runs");
        let (send, log) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let server = Self { child, log };
        let mut seen = Vec::new();
        loop {
            match server.log.recv_timeout(std::time::Duration::from_secs(300)) {
                Ok(line) if line.contains("listening on http://127.0.0.1:7070/") => break,
                Ok(line) => seen.push(line),
                Err(e) => panic!(
                    "the server did not start ({e}); it said:\n{}",
                    seen.join("\n")
                ),
            }
        }
        server
    }

    /// Sends `signal` to the command's process group.
    fn signal(&self, signal: &str) -> bool {
        let group = format!("-{}", self.child.id());
        Command::new("kill")
            .args([signal, "--", &group])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// SIGTERM; the server must exit cleanly.
    fn stop(mut self) {
        assert!(self.signal("-TERM"));
        let status = self.child.wait().unwrap();
        let log: Vec<String> = self.log.try_iter().collect();
        assert!(
            status.success(),
            "the server exited with {status}:\n{}",
            log.join("\n")
        );
    }
}

impl Drop for Server {
    /// A test that failed midway leaves no server behind (holding the README's port).
    fn drop(&mut self) {
        if self.child.try_wait().is_ok_and(|s| s.is_none()) {
            self.signal("-KILL");
            let _ = self.child.wait();
        }
    }
}

use std::os::unix::process::CommandExt;

#[test]
fn the_readme_examples_work_as_printed() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = blocks(&readme);
    let first = blocks
        .iter()
        .find(|b| b.info == "sh")
        .expect("the set-up block");
    let command = first.text.lines().next().unwrap();
    let command = command.split("   #").next().unwrap().trim();
    assert!(
        command.contains("cargo run --release --bin frostdb -- serve"),
        "the README's first command starts the server: {command}"
    );
    let tested: Vec<usize> = (0..blocks.len())
        .filter(|&i| blocks[i].info.starts_with("sh tested"))
        .collect();
    for when in ["server", "stopped", "cli"] {
        assert!(
            tested
                .iter()
                .any(|&i| blocks[i].info == format!("sh tested:{when}")),
            "no `sh tested:{when}` block in the README"
        );
    }

    let (dir, path) = scratch();
    let mut server = Some(Server::start(dir.path(), &path, command));
    for &i in &tested {
        let block = &blocks[i];
        match block.info.as_str() {
            "sh tested:server" => assert!(
                server.is_some(),
                "README line {}: a server block after a stopped one",
                block.line
            ),
            "sh tested:stopped" => {
                if let Some(s) = server.take() {
                    s.stop();
                }
            }
            "sh tested:cli" => {}
            other => panic!("README line {}: unknown block {other:?}", block.line),
        }
        let stdout = run(dir.path(), &path, &block.text, block);
        println!("README line {}:\n{}{stdout}", block.line, block.text);
        if let Some(next) = blocks.get(i + 1).filter(|b| b.info == "text") {
            check_output(next, &stdout);
        }
    }
    if let Some(s) = server {
        s.stop();
    }
}

/// The README's `[dependencies]` for embedders name the crates the embedding check (a crate
/// outside the workspace that runs the README's Rust examples as doc tests) builds with.
#[test]
fn the_readme_dependencies_are_those_the_embedding_check_builds_with() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = blocks(&readme)
        .into_iter()
        .find(|b| b.info == "toml" && b.text.starts_with("[dependencies]"))
        .expect("a [dependencies] block");
    let names = |text: &str| -> Vec<String> {
        let value: toml::Table = toml::from_str(text).unwrap();
        let mut names: Vec<String> = value["dependencies"]
            .as_table()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    };
    let check = std::fs::read_to_string(repo().join("embedding/Cargo.toml")).unwrap();
    assert_eq!(names(&block.text), names(&check));
    assert!(
        readme.contains("use frostdb_pprof::{Db, DbOptions, IngestOptions, ProfileStore"),
        "the embedding example is the ProfileStore one"
    );
}
