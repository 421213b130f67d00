//! The samples columns are named in one place, `frostdb_profile::schema::column`: a column
//! spelled as a string literal elsewhere (`col("value")`, `Field::new("timestamp", ..)`,
//! `format!("labels.{l}")`) is a second definition of the layout that a rename would miss.
//! This test reads the library sources of the workspace (test modules and tests/ aside) and
//! fails on any.

use std::path::{Path, PathBuf};

use frostdb_profile::schema::column;
use regex::Regex;

/// The library sources checked: every crate's `src/`.
const ROOTS: [&str; 8] = [
    "frostdb-core/src",
    "frostdb-query/src",
    "frostdb-profile/src",
    "frostdb-pprof/src",
    "frostdb-ebpf-ingest/src",
    "examples/src",
    "examples/server/src",
    "benches/src",
];

/// Literals that name a column of another table, not of the samples: (file, literal, why).
const ALLOWED: [(&str, &str, &str); 1] = [(
    "frostdb-pprof/src/symbols/tables.rs",
    "name",
    "the functions table's column",
)];

/// A detector of samples-column literals in the places code names a column.
struct Detector(Vec<Regex>);

impl Detector {
    fn new() -> Self {
        let names = [
            column::NAME,
            column::SAMPLE_TYPE,
            column::SAMPLE_UNIT,
            column::PERIOD_TYPE,
            column::PERIOD_UNIT,
            column::LABELS,
            column::STACKTRACE_ID,
            column::TIMESTAMP,
            column::DURATION,
            column::PERIOD,
            column::VALUE,
            column::PROFILE_KEY,
        ]
        .join("|");
        let lit = format!(r#""({names})""#);
        let calls = "col|ident|column|column_by_name|column_stats|index_of|asc|alias|constant|project|dynamic|new";
        Detector(vec![
            // An argument of a call that names a column (`col("value")`, `column(&b, "value")`).
            Regex::new(&format!(r"\b({calls})\(\s*(&?[\w.]+,\s*)?{lit}")).unwrap(),
            // A comparison with a column's name.
            Regex::new(&format!(r"(==|!=)\s*{lit}")).unwrap(),
            // A list of columns (`["stacktrace_id", ...]`, `("value", array)`), not a call's
            // first argument (`.field("name", ..)` of a Debug).
            Regex::new(&format!(r"(^|[^\w])[\[(]\s*{lit}\s*,")).unwrap(),
            // A label's column spelled by hand.
            Regex::new(r#""labels\."#).unwrap(),
        ])
    }

    /// The literal a line names a column with, if any.
    fn find<'a>(&self, line: &'a str) -> Option<&'a str> {
        let code = line.trim_start();
        if code.starts_with("//") || code.contains("json!") {
            return None;
        }
        self.0.iter().find_map(|r| r.find(line)).map(|m| m.as_str())
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_detector_finds_a_column_spelled_by_hand() {
    let d = Detector::new();
    for line in [
        r#"let v = batch.column_by_name("value");"#,
        r#"    .filter(col("timestamp").gt_eq(start))"#,
        r#"fields.push(Field::new("stacktrace_id", DataType::UInt64, false));"#,
        r#"if name == "period" {"#,
        r#"let c = format!("labels.{l}");"#,
        r#"    .project(["stacktrace_id", VALUE])"#,
        r#"    let ids = column(&b, "stacktrace_id")?;"#,
    ] {
        assert!(d.find(line).is_some(), "missed: {line}");
    }
    for line in [
        r#"let v = batch.column_by_name(VALUE);"#,
        r#"json!({"value": 1})"#,
        r#"// col("value")"#,
        r#"let x = "value of the thing";"#,
        r#"f.debug_struct("Frame").field("name", &self.name)"#,
    ] {
        assert_eq!(d.find(line), None, "flagged: {line}");
    }
}

#[test]
fn samples_columns_are_named_only_in_the_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let d = Detector::new();
    let mut files = Vec::new();
    for r in ROOTS {
        rust_files(&root.join(r), &mut files);
    }
    assert!(
        files.len() > 100,
        "read {} files: the roots moved?",
        files.len()
    );
    let mut found = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "frostdb-profile/src/schema.rs" {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for (i, line) in text.lines().enumerate() {
            // Unit tests sit at the end of a file, after their `#[cfg(test)]`.
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let Some(hit) = d.find(line) else { continue };
            let allowed = ALLOWED
                .iter()
                .any(|(f, lit, _)| *f == rel && hit.contains(&format!("\"{lit}\"")));
            if !allowed {
                found.push(format!("{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "samples columns spelled as literals (use frostdb_profile::schema::column):\n{}",
        found.join("\n")
    );
}
