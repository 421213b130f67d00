//! A smoke of `frostdb-bench symbolize` (the symbolizer over this machine's binaries): the
//! system libraries its own process maps, served by Debian's debuginfod, are named by a
//! cold query, and a warm one resolves nothing again. The full run (every binary, the
//! figures) is the documented command in the README.

#[test]
fn the_machines_libraries_are_named_cold_and_found_named_warm() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_frostdb-bench"))
        .args([
            "symbolize",
            "--addresses",
            "20",
            "--under",
            "/usr/",
            "--work",
        ])
        .arg(dir.path().join("work"))
        .output()
        .expect("frostdb-bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = |path: &str| {
        report
            .pointer(path)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("{path} in {report}"))
    };
    assert!(n("/binaries") >= 1, "{report}");
    assert!(n("/cold_query/resolved") > 0, "{report}");
    assert_eq!(n("/cold_query/missing_build_ids"), 0, "{report}");
    assert_eq!(n("/warm_query/unsymbolized"), 0, "{report}");
    assert_eq!(
        n("/background_warm_cache/resolved"),
        n("/cold_query/resolved"),
        "{report}"
    );
    assert_eq!(n("/symbolizer/from_debuginfod"), n("/binaries"), "{report}");
}
