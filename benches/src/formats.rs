//! `frostdb-bench formats`: the ingest rate of each format `/ingest` takes, beside pprof's,
//! on the same machine and store: a real body of each (the repository's and
//! `shared/testdata`'s files) converted and stored `--runs` times, one request after
//! another on one thread, each at a new timestamp (a repeat would be recognised as a
//! retry and not stored). Printed per format: requests/s, profiles stored/s, the body's
//! MB/s, and the share of the time spent converting (the rest is storing).
//!
//! ```sh
//! cargo run --release -p frostdb-benches --bin frostdb-bench -- formats --store /tmp/formats --runs 200
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::convert::Incoming;
use frostdb_pprof::convert::legacy::Params;
use frostdb_pprof::{Limits, ProfileStore, StoreOptions};

use crate::external::BoxError;

/// A format's body and how `/ingest` converts it.
struct Format {
    name: &'static str,
    source: String,
    body: Vec<u8>,
    convert: fn(&Params, &[u8], &Limits) -> frostdb_pprof::Result<Vec<Incoming>>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shared() -> PathBuf {
    std::env::var_os("FROSTDB_SHARED").map_or_else(|| repo().join("../shared"), PathBuf::from)
}

fn read(path: &Path) -> Result<Vec<u8>, BoxError> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// A folded file of `shared/testdata/folded`: perf's collapsed stacks of a Java program
/// (the largest well-formed one; py-spy's has a line without frames, which we refuse).
fn folded_file() -> Result<PathBuf, BoxError> {
    let path = shared().join("testdata/folded/flameshow__perf-vertx-java-collapsed.txt");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("{} is not there (FROSTDB_SHARED)", path.display()).into())
    }
}

/// Pyroscope's tree body of folded stacks: each node `uvarint(name length)`, the name,
/// `uvarint(self value)`, `uvarint(children)`, depth first from a nameless root.
fn tree_body(folded: &str) -> Vec<u8> {
    #[derive(Default)]
    struct Node {
        value: u64,
        children: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for line in folded.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.trim().parse::<u64>() else {
            continue;
        };
        let mut node = &mut root;
        for frame in stack.split(';') {
            node = node.children.entry(frame.to_owned()).or_default();
        }
        node.value += count;
    }
    fn uvarint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = Vec::new();
    let mut todo: Vec<(&str, &Node)> = vec![("", &root)];
    while let Some((name, node)) = todo.pop() {
        uvarint(&mut out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
        uvarint(&mut out, node.value);
        uvarint(&mut out, node.children.len() as u64);
        todo.extend(node.children.iter().rev().map(|(k, v)| (k.as_str(), v)));
    }
    out
}

fn formats() -> Result<Vec<Format>, BoxError> {
    let testdata = repo().join("testdata");
    let folded = folded_file()?;
    let folded_text = String::from_utf8(read(&folded)?)?;
    let mut out = vec![
        Format {
            name: "pprof",
            source: "testdata/pprof/goapp__go119-cpu-2s.pb.gz".into(),
            body: read(&testdata.join("pprof/goapp__go119-cpu-2s.pb.gz"))?,
            convert: |p, b, l| Ok(vec![p.pprof(frostdb_pprof::decode(b, l)?, None)]),
        },
        Format {
            name: "folded",
            source: format!(
                "shared/testdata/folded/{}",
                folded.file_name().unwrap().to_string_lossy()
            ),
            body: folded_text.clone().into_bytes(),
            convert: |p, b, l| {
                let text = std::str::from_utf8(b)
                    .map_err(|e| frostdb_pprof::Error::Query(e.to_string()))?;
                Ok(vec![p.folded(text, false, l)?])
            },
        },
        Format {
            name: "tree",
            source: "the folded file as a tree body".into(),
            body: tree_body(&folded_text),
            convert: |p, b, l| Ok(vec![p.trie(b, true, l)?]),
        },
        Format {
            name: "speedscope",
            source: "testdata/speedscope/0.6.0_two-sampled.speedscope.json".into(),
            body: read(&testdata.join("speedscope/0.6.0_two-sampled.speedscope.json"))?,
            convert: |p, b, l| p.speedscope(b, l),
        },
    ];
    for (file, what) in [
        ("example.jfr.gz", "async-profiler: CPU, allocations, locks"),
        ("dump1.jfr.gz", "async-profiler: itimer CPU"),
    ] {
        out.push(Format {
            name: "jfr",
            source: format!("testdata/jfr/{file} ({what})"),
            body: read(&testdata.join("jfr").join(file))?,
            convert: |p, b, l| p.jfr(b, None, l),
        });
    }
    out.push(Format {
        name: "parca-arrow",
        source: "Parca Agent's v2 record (frostdb_pprof::testing::parca_agent_record)".into(),
        body: frostdb_pprof::testing::parca_agent_record("0011223344556677").0,
        convert: |_, b, l| frostdb_pprof::convert::parca::write_arrow(b, l),
    });
    Ok(out)
}

/// Runs the formats bench.
pub fn run(args: &[String]) -> Result<(), BoxError> {
    let dir = crate::external::arg(args, "--store")?;
    let runs = crate::scale::number(args, "--runs", 200)?;
    let store = ProfileStore::open(
        Db::open(&dir, DbOptions::default())?,
        StoreOptions::default(),
    )?;
    let limits = *store.limits();
    let base_ms: i64 = 1_763_805_600_000;
    let mut step = 0i64;
    println!(
        "{:<11} {:>9} {:>10} {:>11} {:>8} {:>9}  body",
        "format", "bytes", "requests/s", "profiles/s", "MB/s", "convert"
    );
    for f in formats()? {
        let query: HashMap<String, String> =
            [("name".to_owned(), format!("bench.{}", f.name))].into();
        let params = Params::parse(&query, base_ms)?;
        let (mut convert, mut total) = (Duration::ZERO, Duration::ZERO);
        let mut profiles = 0usize;
        for _ in 0..runs {
            step += 1;
            let started = Instant::now();
            let mut incoming = (f.convert)(&params, &f.body, &limits)
                .map_err(|e| format!("{} ({}): {e}", f.name, f.source))?;
            convert += started.elapsed();
            for i in &mut incoming {
                i.timestamp_ms = Some(base_ms + step * 10_000);
            }
            let stored = frostdb_pprof::convert::store(&store, &incoming)?;
            total += started.elapsed();
            profiles += stored.iter().filter(|s| !s.duplicate).count();
        }
        let secs = total.as_secs_f64();
        println!(
            "{:<11} {:>9} {:>10.0} {:>11.0} {:>8.1} {:>8.0}%  {}",
            f.name,
            f.body.len(),
            runs as f64 / secs,
            profiles as f64 / secs,
            (f.body.len() * runs) as f64 / secs / 1e6,
            convert.as_secs_f64() * 100.0 / secs,
            f.source
        );
    }
    Ok(())
}
