//! Access to shared/testdata and to `go tool pprof`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The shared/ folder beside the repository (or `FROSTDB_SHARED`).
pub(crate) fn shared() -> PathBuf {
    frostdb_pprof::testing::shared_dir()
}

/// Every file of shared/testdata/pprof, by name.
pub(crate) fn testdata() -> Vec<(String, Vec<u8>)> {
    let dir = shared().join("testdata/pprof");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gz" || x == "pb"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// Whether `go` runs; in CI its absence is a failure (scripts/test.sh installs golang-go).
pub(crate) fn have_go() -> bool {
    let ok = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have go (apt-get install golang-go)"
        );
        eprintln!("SKIPPED: go is not installed");
    }
    ok
}

/// `go tool pprof -top` rows of `file` for sample type `index`: (name, flat, cum) as printed.
pub(crate) fn pprof_top(file: &std::path::Path, index: usize) -> Vec<(String, String, String)> {
    try_pprof_top(file, index).unwrap_or_else(|e| panic!("{e}"))
}

/// As [`pprof_top`], or pprof's complaint.
pub(crate) fn try_pprof_top(
    file: &std::path::Path,
    index: usize,
) -> Result<Vec<(String, String, String)>, String> {
    let out = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-nodefraction=0",
            "-edgefraction=0",
            "-nodecount=0",
            "-symbolize=none",
            &format!("-sample_index={index}"),
        ])
        .arg(file)
        .output()
        .expect("go tool pprof runs");
    if !out.status.success() {
        return Err(format!(
            "go tool pprof failed on {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            in_table = true;
            continue;
        }
        if !in_table || line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let flat = parts.next().unwrap_or_default().to_owned();
        let _flat_pct = parts.next();
        let _sum_pct = parts.next();
        let cum = parts.next().unwrap_or_default().to_owned();
        let _cum_pct = parts.next();
        let name: Vec<&str> = parts.collect();
        rows.push((name.join(" "), flat, cum));
    }
    Ok(rows)
}

/// A CPU pprof (`cpu`/`nanoseconds`, period 10 ms) of `functions`, a location each (ids
/// from 1), with a sample per `(stack, value)`: the stack as indexes into `functions`, leaf
/// first.
pub(crate) fn cpu_profile<'a>(
    functions: &[&str],
    samples: impl IntoIterator<Item = (&'a [usize], i64)>,
) -> frostdb_pprof::proto::Profile {
    use frostdb_pprof::proto::{Function, Line, Location, Profile, Sample, ValueType};
    let mut strings: Vec<String> = vec![String::new(), "cpu".into(), "nanoseconds".into()];
    strings.extend(functions.iter().map(|f| (*f).to_owned()));
    Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        period_type: Some(ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        function: (0..functions.len())
            .map(|i| Function {
                id: i as u64 + 1,
                name: i as i64 + 3,
                system_name: i as i64 + 3,
                ..Function::default()
            })
            .collect(),
        location: (0..functions.len())
            .map(|i| Location {
                id: i as u64 + 1,
                line: vec![Line {
                    function_id: i as u64 + 1,
                    line: 1,
                    column: 0,
                }],
                ..Location::default()
            })
            .collect(),
        sample: samples
            .into_iter()
            .map(|(stack, value)| Sample {
                location_id: stack.iter().map(|&f| f as u64 + 1).collect(),
                value: vec![value],
                ..Sample::default()
            })
            .collect(),
        string_table: strings,
        ..Profile::default()
    }
}
