//! A C program built with a GNU build id and stripped, its debug file apart, and Debian's
//! `debuginfod` serving it: what symbolization tests name addresses from. Needs gcc,
//! binutils and debuginfod (`scripts/test.sh` installs them).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::proto::{Location, Mapping, Profile};

/// The program: `hot_function` calls an always-inlined helper, whose loop stores to a
/// volatile so the compiler keeps it a loop; `prog spin` calls it for ever (for a sampler
/// to profile).
const PROGRAM: &str = r#"
#include <stdlib.h>
#include <string.h>
volatile int sink;
static inline __attribute__((always_inline)) int inlined_helper(int x) {
    int s = 0;
    for (int i = 0; i < x; i++) { s += i * x; sink = s; }
    return s;
}
__attribute__((noinline)) int hot_function(int x) {
    return inlined_helper(x) + inlined_helper(x + 1);
}
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "spin") == 0)
        for (;;) hot_function(100000);
    return hot_function(argc + atoi(argc > 1 ? argv[1] : "3")) & 1;
}
"#;

/// Runs `cmd`, its standard output.
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
#[derive(Debug)]
pub struct Built {
    /// The stripped program.
    pub binary: PathBuf,
    /// Its debug file (`objcopy --only-keep-debug`).
    pub debug: PathBuf,
    /// The program as linked, symbols and DWARF in it.
    pub unstripped: PathBuf,
    /// Its GNU build id, hex.
    pub build_id: String,
    /// The directory for debuginfod: the debug file and the stripped program.
    pub served: PathBuf,
}

/// A C++ program: a member function of a class in a namespace, overloaded, so its name is
/// mangled (`_ZN6shapes6Circle4areaEi`) and demangled `shapes::Circle::area(int)`.
const CPP_PROGRAM: &str = r#"
#include <cstdlib>
namespace shapes {
struct Circle {
    __attribute__((noinline)) static long area(int r);
    __attribute__((noinline)) static long area(double r);
};
volatile long sink;
long Circle::area(int r) { long s = 0; for (int i = 0; i < r; i++) { s += i * r; sink = s; } return s; }
long Circle::area(double r) { return (long)(r * r * 3); }
}
int main(int argc, char **argv) {
    return (int)(shapes::Circle::area(argc + std::atoi(argc > 1 ? argv[1] : "3"))
        + shapes::Circle::area(2.0)) & 1;
}
"#;

/// The mangled name of the C++ program's `shapes::Circle::area(int)`.
pub const CPP_FUNCTION: &str = "_ZN6shapes6Circle4areaEi";

/// Builds the program in `dir` (what debuginfod serves under `dir/debug`).
pub fn build(dir: &Path) -> Built {
    build_with(dir, "gcc", "prog.c", PROGRAM)
}

/// Builds the C++ program in `dir` as [`build`] builds the C one.
pub fn build_cpp(dir: &Path) -> Built {
    build_with(dir, "g++", "prog.cc", CPP_PROGRAM)
}

/// Builds the C program `program` in `dir` as [`build`] builds its own.
pub fn build_c(dir: &Path, program: &str) -> Built {
    build_with(dir, "gcc", "prog.c", program)
}

fn build_with(dir: &Path, compiler: &str, file: &str, program: &str) -> Built {
    let source = dir.join(file);
    std::fs::write(&source, program).unwrap();
    let binary = dir.join("prog");
    run(Command::new(compiler)
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
    // What debuginfod serves: the debug file, and the stripped executable, which says where
    // the code's file offsets are loaded (the debug file keeps the addresses only).
    std::fs::copy(&binary, debug_dir.join("prog")).unwrap();
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
        served: debug_dir,
    }
}

/// The file offsets of `hot_function`'s code: its symbol in the debug file, its segment in
/// the program headers.
pub fn hot_function_offsets(built: &Built) -> Vec<u64> {
    function_offsets(built, "hot_function")
}

/// The file offsets of the code of the function whose symbol is `symbol` (as the symbol
/// table spells it: mangled).
pub fn function_offsets(built: &Built, symbol: &str) -> Vec<u64> {
    let symbols = run(Command::new("readelf").arg("-sW").arg(&built.debug));
    let (value, size) = symbols
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[7] == symbol).then(|| {
                (
                    u64::from_str_radix(f[1], 16).unwrap(),
                    f[2].parse::<u64>().unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("{symbol} in the debug file's symbols"));
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
        .unwrap_or_else(|| panic!("a LOAD segment holds {symbol}"));
    (0..size).map(|i| value + i - vaddr + offset).collect()
}

/// A profile of addresses only, as a process mapped the program at `base`: one location
/// per offset, in a mapping with the build id and no names.
pub fn profile_of(built: &Built, offsets: &[u64], base: u64) -> Profile {
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

/// The function names of `location`'s lines, innermost first.
pub fn names(p: &Profile, location: usize) -> Vec<String> {
    p.location[location]
        .line
        .iter()
        .map(|l| {
            let f = p.function.iter().find(|f| f.id == l.function_id).unwrap();
            p.string_table[f.name as usize].clone()
        })
        .collect()
}

/// A running debuginfod, killed when dropped.
#[derive(Debug)]
pub struct Debuginfod(Child);

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Debian's debuginfod serving the ELF/DWARF files under `dir`, once it serves both files
/// of `build_id` (asked until it does, for at most a minute).
pub async fn debuginfod(dir: &Path, db: &Path, build_id: &str) -> (Debuginfod, String) {
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
