//! The kill -9 harness of the crash tests. A crash test re-runs its own test binary as a
//! child: one of its tests, `#[ignore]`d so that only the harness runs it, writes and
//! reports what it does on stdout, one line per event ([`say`]: `TRY 7`, `ACK 7`, ...). The
//! parent reads the lines ([`kill_when`]) and sends SIGKILL when they say so, then reopens
//! what the child wrote and checks it. The child learns its directory and round from the
//! environment ([`child_dir`], [`child_round`]).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The child's directory.
const DIR: &str = "FROSTDB_CRASH_CHILD_DIR";
/// The child's round.
const ROUND: &str = "FROSTDB_CRASH_CHILD_ROUND";

/// Rounds to run: `FROSTDB_CRASH_ROUNDS`, else `default`.
pub fn rounds(default: u32) -> u32 {
    std::env::var("FROSTDB_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A line from the child, written at once (a kill must not lose what it said before).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// In the child: the directory it writes, `None` when the test was not started by the
/// harness (run by hand with `--ignored`: it then has nothing to do).
pub fn child_dir() -> Option<PathBuf> {
    std::env::var_os(DIR).map(PathBuf::from)
}

/// In the child: its round (1, 2, ...), 0 when not started by the harness.
pub fn child_round() -> u64 {
    std::env::var(ROUND)
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// A line's event and its number: `ACK 7` is `("ACK", Some(7))`.
pub fn event(line: &str) -> (&str, Option<i64>) {
    let mut words = line.split_whitespace();
    (
        words.next().unwrap_or(""),
        words.next().and_then(|w| w.parse().ok()),
    )
}

/// Runs round `round` of the child test `child` (of this test binary) on `dir`, giving each
/// line it writes to `line`, which answers whether to kill it now. Lines the child wrote
/// before it died are still given after the kill (with the answer ignored): a write it
/// acknowledged then counts as acknowledged. Panics when the child ends by itself.
pub fn kill_when(child: &str, dir: &Path, round: u64, mut line: impl FnMut(&str) -> bool) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut process = Command::new(&exe)
        .args([
            child,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(DIR, dir)
        .env(ROUND, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    let stdout = BufReader::new(process.stdout.take().expect("piped"));
    let mut killed = false;
    for text in stdout.lines() {
        let text = text.expect("the child's stdout");
        if line(&text) && !killed {
            process.kill().expect("SIGKILL");
            killed = true;
        }
    }
    let status = process.wait().expect("the child's status");
    assert!(
        killed,
        "round {round}: the child {child} ended by itself: {status}"
    );
}
