//! Programs with known call chains, built without frame pointers, for the unwinder's tests
//! (`tests/unwind.rs`, the user-space reference) and the sampler's (`tests/sampler.rs`, the
//! kernel side): chain.c with its library chain_lib.c, late.c, which loads that library
//! while it runs, and chain.rs, a Rust release binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// chain.c's call chain below `main`, innermost first.
pub(crate) const C_CHAIN: [&str; 6] = [
    "chain_lib_leaf",
    "chain_lib_d",
    "chain_lib_c",
    "chain_b",
    "chain_a",
    "main",
];

/// chain.rs's call chain, innermost first (names end so; Rust's carry the crate's path).
pub(crate) const RUST_CHAIN: [&str; 5] = ["rust_leaf", "rust_c", "rust_b", "rust_a", "main"];

/// late.c's call chain once it has loaded the library, innermost first.
pub(crate) const LATE_CHAIN: [&str; 5] = [
    "chain_lib_leaf",
    "chain_lib_d",
    "chain_lib_c",
    "late_call",
    "main",
];

fn source(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/chain")
        .join(name)
}

fn cc(dir: &Path, args: &[&str]) {
    let status = Command::new("cc")
        .args(["-O2", "-g", "-fomit-frame-pointer"])
        .args(args)
        .current_dir(dir)
        .status()
        .expect("cc runs (the Rust toolchain links with it)");
    assert!(status.success(), "cc {args:?} failed");
}

/// Builds chain.c and its library, libchain.so, with `-O2 -fomit-frame-pointer` into
/// `dir`; returns (program, library).
pub(crate) fn build_chain(dir: &Path) -> (PathBuf, PathBuf) {
    let lib = source("chain_lib.c");
    cc(
        dir,
        &[
            "-fPIC",
            "-shared",
            "-o",
            "libchain.so",
            lib.to_str().unwrap(),
        ],
    );
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let main = source("chain.c");
    let args = [
        "-o",
        "chain",
        main.to_str().unwrap(),
        "-L.",
        "-lchain",
        &rpath,
    ];
    cc(dir, &args);
    (dir.join("chain"), dir.join("libchain.so"))
}

/// Builds late.c (and libchain.so, which it loads) into `dir`; returns (program, library).
pub(crate) fn build_late(dir: &Path) -> (PathBuf, PathBuf) {
    let (_, library) = build_chain(dir);
    let late = source("late.c");
    cc(dir, &["-o", "late", late.to_str().unwrap(), "-ldl"]);
    (dir.join("late"), library)
}

/// Builds chain.rs with rustc at opt-level 2, without forced frame pointers, into `dir`.
pub(crate) fn build_rust_chain(dir: &Path) -> PathBuf {
    let program = dir.join("chain_rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let status = Command::new(&rustc)
        .args([
            "--edition",
            "2021",
            "-C",
            "opt-level=2",
            "-C",
            "debuginfo=1",
        ])
        .arg("-o")
        .arg(&program)
        .arg(source("chain.rs"))
        .status()
        .unwrap_or_else(|e| panic!("{rustc} runs: {e}"));
    assert!(status.success(), "rustc failed on chain.rs");
    program
}

/// A running program, started and ready (it printed "ready"), killed on drop.
pub(crate) struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Running {
    pub(crate) fn start(program: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", program.display()));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{}", program.display());
        let stdin = child.stdin.take();
        Self { child, stdin }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes a line to the program's standard input.
    pub(crate) fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is piped");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Kills the program and waits for it.
    pub(crate) fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `chain` (innermost first) appears in `names`, whole and in order; a name
/// matches when it ends with the chain's.
pub(crate) fn has_chain(names: &[String], chain: &[&str]) -> bool {
    names.iter().enumerate().any(|(first, _)| {
        chain
            .iter()
            .enumerate()
            .all(|(i, want)| names.get(first + i).is_some_and(|n| n.ends_with(want)))
    })
}
