//! Symbolization from real components: a C program built with a build id and stripped, its
//! debug file kept apart; a profile of its addresses only is named from Debian's
//! `debuginfod` serving that file, and from the same file uploaded instead; a build id
//! nobody has stays an address; a dead debuginfod costs its timeout, once.
//!
//! Needs gcc, binutils and `debuginfod` (`scripts/test.sh` installs them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use frostdb_pprof::proto::{Location, Mapping, Profile};
use frostdb_pprof::symbolize::{Origin, Symbolizer, SymbolizerOptions};

const PROGRAM: &str = r#"
#include <stdlib.h>
static inline __attribute__((always_inline)) int inlined_helper(int x) {
    int s = 0;
    for (int i = 0; i < x; i++) s += i * x;
    return s;
}
__attribute__((noinline)) int hot_function(int x) {
    return inlined_helper(x) + inlined_helper(x + 1);
}
int main(int argc, char **argv) {
    return hot_function(argc + atoi(argc > 1 ? argv[1] : "3")) & 1;
}
"#;

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/test.sh installs it)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The program, stripped, its debug file apart, and as linked; its build id.
struct Built {
    binary: PathBuf,
    debug: PathBuf,
    unstripped: PathBuf,
    build_id: String,
}

fn build(dir: &Path) -> Built {
    let source = dir.join("prog.c");
    std::fs::write(&source, PROGRAM).unwrap();
    let binary = dir.join("prog");
    run(Command::new("gcc")
        .args(["-g", "-O2", "-Wl,--build-id", "-o"])
        .arg(&binary)
        .arg(&source));
    let debug_dir = dir.join("debug");
    std::fs::create_dir_all(&debug_dir).unwrap();
    let debug = debug_dir.join("prog.debug");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&binary)
        .arg(&debug));
    let unstripped = dir.join("prog.unstripped");
    std::fs::copy(&binary, &unstripped).unwrap();
    run(Command::new("strip").arg("--strip-all").arg(&binary));
    let notes = run(Command::new("readelf").arg("-n").arg(&binary));
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("gcc links with a build id")
        .trim()
        .to_owned();
    Built {
        binary,
        debug,
        unstripped,
        build_id,
    }
}

/// The file offsets of `hot_function`'s code: its symbol in the debug file, its segment in
/// the program headers.
fn hot_function_offsets(built: &Built) -> Vec<u64> {
    let symbols = run(Command::new("readelf").arg("-sW").arg(&built.debug));
    let (value, size) = symbols
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[7] == "hot_function").then(|| {
                (
                    u64::from_str_radix(f[1], 16).unwrap(),
                    f[2].parse::<u64>().unwrap(),
                )
            })
        })
        .expect("hot_function in the debug file's symbols");
    let headers = run(Command::new("readelf").arg("-lW").arg(&built.binary));
    let (offset, vaddr) = headers
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.first() != Some(&"LOAD") {
                return None;
            }
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            let (offset, vaddr, memsz) = (hex(f[1]), hex(f[2]), hex(f[5]));
            (vaddr <= value && value < vaddr + memsz).then_some((offset, vaddr))
        })
        .next()
        .expect("a LOAD segment holds hot_function");
    (0..size).map(|i| value + i - vaddr + offset).collect()
}

/// A profile of addresses only, as a process mapped the program at `base`: one location
/// per offset, in a mapping with the build id and no names.
fn profile_of(built: &Built, offsets: &[u64], base: u64) -> Profile {
    let mut p = Profile {
        string_table: vec![
            String::new(),
            built.binary.display().to_string(),
            built.build_id.clone(),
        ],
        ..Profile::default()
    };
    p.mapping.push(Mapping {
        id: 1,
        memory_start: base,
        memory_limit: base + (1 << 20),
        file_offset: 0,
        filename: 1,
        build_id: 2,
        ..Mapping::default()
    });
    for (i, &o) in offsets.iter().enumerate() {
        p.location.push(Location {
            id: i as u64 + 1,
            mapping_id: 1,
            address: base + o,
            ..Location::default()
        });
    }
    p
}

fn names(p: &Profile, location: usize) -> Vec<String> {
    p.location[location]
        .line
        .iter()
        .map(|l| {
            let f = p.function.iter().find(|f| f.id == l.function_id).unwrap();
            p.string_table[f.name as usize].clone()
        })
        .collect()
}

struct Debuginfod(Child);

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Debian's debuginfod serving the ELF/DWARF files under `dir`, once it serves both files
/// of `build_id` (asked until it does, for at most a minute).
async fn debuginfod(dir: &Path, db: &Path, build_id: &str) -> (Debuginfod, String) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = Command::new("debuginfod")
        .arg("-F")
        .arg(dir)
        .arg("-d")
        .arg(db)
        .args(["-p", &port.to_string(), "-t", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("debuginfod (scripts/test.sh installs it)");
    let server = Debuginfod(child);
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    for kind in ["debuginfo", "executable"] {
        let file = format!("{url}/buildid/{build_id}/{kind}");
        loop {
            let status = reqwest::get(&file).await.map(|r| r.status().as_u16());
            if status.as_ref().is_ok_and(|&s| s == 200) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "debuginfod did not serve {file} within a minute: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    (server, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_programs_addresses_are_named_from_debuginfod() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    // The debug file and the stripped executable (which says where the code's file
    // offsets are loaded; the debug file keeps the addresses only).
    let served = dir.path().join("debug");
    std::fs::copy(&built.binary, served.join("prog")).unwrap();
    let (_server, url) = debuginfod(&served, &dir.path().join("db"), &built.build_id).await;
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![url];
    let s = Symbolizer::new(options).unwrap();

    let base = 0x5555_5555_0000;
    let mut p = profile_of(&built, &offsets, base);
    // And one location of a build id nobody has.
    p.string_table.push("0badc0de".into());
    p.mapping.push(Mapping {
        id: 2,
        memory_start: 0x7000_0000,
        memory_limit: 0x7010_0000,
        build_id: p.string_table.len() as i64 - 1,
        ..Mapping::default()
    });
    p.location.push(Location {
        id: offsets.len() as u64 + 1,
        mapping_id: 2,
        address: 0x7000_1234,
        ..Location::default()
    });
    let summary = s
        .symbolize_profile(&mut p, None, Duration::from_secs(60))
        .await;
    assert_eq!(summary.unsymbolized, offsets.len() + 1);
    assert_eq!(
        summary.resolved,
        offsets.len(),
        "{summary:?} {:?}",
        s.stats()
    );
    assert_eq!(summary.missing, vec!["0badc0de".to_owned()]);
    // Every address of hot_function is named, the outermost frame hot_function, with its
    // file and a line; the inlined helper shows as a frame of its own inside it.
    for i in 0..offsets.len() {
        let n = names(&p, i);
        assert_eq!(n.last().map(String::as_str), Some("hot_function"), "{n:?}");
        let line = p.location[i].line.last().unwrap();
        let f = p
            .function
            .iter()
            .find(|f| f.id == line.function_id)
            .unwrap();
        assert!(p.string_table[f.filename as usize].ends_with("prog.c"));
        assert!(line.line > 0);
    }
    assert!(
        (0..offsets.len()).any(|i| names(&p, i) == ["inlined_helper", "hot_function"]),
        "the inlined helper is a frame of its own"
    );
    // The unknown build id stays an address, in its mapping.
    assert!(p.location.last().unwrap().line.is_empty());
    let stats = s.stats();
    assert_eq!(
        (stats.from_debuginfod, stats.not_found),
        (2, 1),
        "the debug file and the executable; the unknown build id"
    );

    // Again: from the cache and the remembered miss, nobody asked.
    let mut again = profile_of(&built, &offsets[..1], base);
    s.symbolize_profile(&mut again, None, Duration::from_secs(60))
        .await;
    assert_eq!(names(&again, 0), names(&p, 0));
    assert_eq!(s.stats().cache.hits, 2);
    assert_eq!(s.stats().from_debuginfod, 2);
}

#[tokio::test]
async fn uploaded_debug_info_names_the_addresses_and_a_dead_debuginfod_costs_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let built = build(dir.path());
    let offsets = hot_function_offsets(&built);
    // The tenant's uploads, in an object store on disk.
    let objects: std::sync::Arc<dyn object_store::ObjectStore> = std::sync::Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
    );
    std::fs::create_dir_all(dir.path().join("objects")).unwrap();
    let uploads = frostdb_pprof::debuginfo::DebugInfoStore::new(
        objects,
        object_store::path::Path::from("objects"),
        1 << 30,
        Duration::from_secs(60),
    );
    // The program as linked, with its symbols and DWARF (what `frostdb debuginfo upload`
    // takes): its own segments place the file offsets.
    let file = std::fs::read(&built.unstripped).unwrap();
    let id = uploads
        .initiate(
            &built.build_id,
            file.len() as i64,
            "sha256-of-the-file",
            false,
        )
        .await
        .unwrap();
    uploads
        .upload(
            &built.build_id,
            &id,
            futures::stream::iter([Ok(bytes::Bytes::from(file))]),
        )
        .await
        .unwrap();
    uploads.finish(&built.build_id, &id).await.unwrap();

    // A debuginfod that accepts and never answers: asked only after the uploads, and
    // given up after its timeout when the uploads lack a build id.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut options = SymbolizerOptions::new(dir.path().join("cache"));
    options.debuginfod_urls = vec![format!("http://{}", silent.local_addr().unwrap())];
    options.fetch_timeout = Duration::from_secs(1);
    let s = Symbolizer::new(options).unwrap();
    let mut p = profile_of(&built, &offsets[..4], 0x4000_0000);
    let summary = s
        .symbolize_profile(&mut p, Some(&uploads), Duration::from_secs(60))
        .await;
    assert_eq!(summary.resolved, 4, "{summary:?}");
    assert_eq!(
        names(&p, 0).last().map(String::as_str),
        Some("hot_function")
    );
    assert_eq!(s.stats().from_uploads, 1);
    let found = s.debug_file(&built.build_id, Some(&uploads)).await.unwrap();
    assert_eq!(found.map(|(_, o)| o), Some(Origin::Cache));

    let started = Instant::now();
    assert!(
        s.debug_file("0badc0de", Some(&uploads))
            .await
            .unwrap()
            .is_none()
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(20),
        "the silent server cost its timeout: {took:?}"
    );
    assert_eq!(s.stats().failed_fetches, 1);
    // A query's budget bounds it too: a profile of an unknown build id with a budget
    // shorter than the fetch timeout ends at the budget (the miss is remembered now,
    // so use another id).
    let mut unknown = profile_of(&built, &offsets[..1], 0x4000_0000);
    unknown.string_table[2] = "0badc0df".into();
    let started = Instant::now();
    let summary = s
        .symbolize_profile(&mut unknown, Some(&uploads), Duration::from_millis(200))
        .await;
    assert!(summary.out_of_budget, "{summary:?}");
    assert!(started.elapsed() < Duration::from_millis(900));
    assert!(unknown.location[0].line.is_empty());
}
