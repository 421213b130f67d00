//! `spin`, a C program that spins in known functions (spin.c), for the sampler's tests and
//! its overhead bench.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Builds spin.c with frame pointers into `dir`.
pub(crate) fn build_spin(dir: &Path) -> PathBuf {
    let out = dir.join("spin");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/spin/spin.c");
    let status = Command::new("cc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&out)
        .arg(&source)
        .status()
        .expect("cc runs (the Rust toolchain links with it)");
    assert!(status.success(), "cc failed on {}", source.display());
    out
}

/// A running spin program, killed on drop.
pub(crate) struct Spin(Child);

impl Spin {
    /// Starts `binary` in `mode` (`user` or `mixed`) and waits until it runs.
    pub(crate) fn start(binary: &Path, mode: &str) -> Self {
        let mut child = Command::new(binary)
            .arg(mode)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spin starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        Self(child)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }

    /// CPU time used so far (user + system), from /proc/<pid>/stat.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the parenthesised comm; utime and stime are the 14th and 15th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ticks as f64 / 100.0 // USER_HZ
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
