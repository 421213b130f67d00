//! The profiles C++ programs still write, made here by Debian's gperftools (`-lprofiler`'s
//! binary CPU profile, tcmalloc's text heap profile) from a small C program with a known
//! hot function and an allocator that frees half of what it allocates: we decode each as
//! `go tool pprof` reads it (the same samples and values, address for address, as `go tool
//! pprof -proto` converts them), and store it.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::{IngestOptions, Limits, ProfileStore, StoreOptions, decode};

const PROGRAM: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <gperftools/profiler.h>
#include <gperftools/heap-profiler.h>

volatile unsigned long sink;

__attribute__((noinline)) void burn(unsigned long n) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
}

__attribute__((noinline)) void *hoard(int blocks) {
    void **kept = malloc(blocks * sizeof(void *));
    for (int i = 0; i < blocks; i++) {
        kept[i] = malloc(4096);
        memset(kept[i], i, 4096);
    }
    /* Free half: the heap profile then has allocation and in-use values apart. */
    for (int i = 0; i < blocks; i += 2) free(kept[i]);
    return kept;
}

int main(int argc, char **argv) {
    ProfilerStart(argv[1]);
    burn(400000000UL);
    ProfilerStop();
    HeapProfilerStart(argv[2]);
    void *kept = hoard(20000);
    HeapProfilerDump("end");
    HeapProfilerStop();
    sink = (unsigned long)kept;
    return 0;
}
"#;

/// Whether gcc and gperftools are here; in CI they must be.
fn have_gperftools() -> bool {
    let ok = Path::new("/usr/include/gperftools/profiler.h").exists()
        && Command::new("gcc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have gcc and gperftools (apt-get install libgoogle-perftools-dev)"
        );
        eprintln!("SKIPPED: gcc or gperftools (libgoogle-perftools-dev) is not installed");
    }
    ok
}

/// Per stack of addresses (leaf first), its values summed.
type Stacks = BTreeMap<Vec<u64>, Vec<i64>>;

fn stacks(p: &frostdb_pprof::proto::Profile) -> Stacks {
    let address: BTreeMap<u64, u64> = p.location.iter().map(|l| (l.id, l.address)).collect();
    let mut out = Stacks::new();
    for s in &p.sample {
        let key: Vec<u64> = s.location_id.iter().map(|id| address[id]).collect();
        let v = out.entry(key).or_insert_with(|| vec![0; s.value.len()]);
        for (a, b) in v.iter_mut().zip(&s.value) {
            *a += b;
        }
    }
    out
}

fn types(p: &frostdb_pprof::proto::Profile) -> Vec<String> {
    let s = |i: i64| p.string_table[i as usize].clone();
    p.sample_type
        .iter()
        .map(|t| format!("{}/{}", s(t.r#type), s(t.unit)))
        .collect()
}

#[test]
fn gperftools_profiles_decode_as_go_tool_pprof_reads_them() {
    if !have_gperftools() || !common::have_go() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (source, binary) = (dir.path().join("p.c"), dir.path().join("p"));
    std::fs::write(&source, PROGRAM).unwrap();
    let built = Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&binary)
        .arg(&source)
        .args(["-ltcmalloc_and_profiler"])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let (cpu, heap) = (dir.path().join("cpu.prof"), dir.path().join("heap"));
    let ran = Command::new(&binary).arg(&cpu).arg(&heap).output().unwrap();
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let heap = dir.path().join("heap.0001.heap");

    let db = Db::open_in_memory(DbOptions::default()).unwrap();
    let store = ProfileStore::open(db, StoreOptions::default()).unwrap();
    for (file, want_types) in [
        (&cpu, vec!["samples/count", "cpu/nanoseconds"]),
        (
            &heap,
            vec![
                "alloc_objects/count",
                "alloc_space/bytes",
                "inuse_objects/count",
                "inuse_space/bytes",
            ],
        ),
    ] {
        let bytes = std::fs::read(file).unwrap();
        let ours = decode(&bytes, &Limits::default())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .into_inner();
        assert_eq!(types(&ours), want_types, "{}", file.display());
        // What go tool pprof makes of the same file, unsymbolized.
        let converted = dir.path().join("converted.pb.gz");
        let out = Command::new("go")
            .args(["tool", "pprof", "-proto", "-symbolize=none", "-output"])
            .arg(&converted)
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = decode(&std::fs::read(&converted).unwrap(), &Limits::default())
            .unwrap()
            .into_inner();
        assert_eq!(types(&ours), types(&theirs));
        assert_eq!(ours.period, theirs.period, "{}", file.display());
        assert_eq!(stacks(&ours), stacks(&theirs), "{}", file.display());
        // Addresses of the program's own code are in the binary's mapping, the first.
        let total: i64 = ours.sample.iter().map(|s| *s.value.last().unwrap()).sum();
        assert!(total > 0, "{}: {total}", file.display());
        let main = &ours.mapping[0];
        let filename = &ours.string_table[main.filename as usize];
        assert!(
            filename.ends_with("/p"),
            "{}: main mapping {filename}",
            file.display()
        );
        // And it is stored as any pprof is.
        let summary = store
            .ingest(&bytes, &IngestOptions::default().name("legacy"))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(summary.rows > 0);
    }
}
