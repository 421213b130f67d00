//! Unwind tables checked against binutils' own reading of the same call frame information:
//! for every function of a binary, every row `readelf --debug-dump=frames-interp` prints
//! must be what the compiled (sorted, compacted) table says at that address, through to the
//! function's last byte. Run on libc (PLT entries, a signal trampoline, hand-written
//! assembly), a C program and its library built `-O2 -fomit-frame-pointer`, and this Rust
//! test binary. Then the user-space unwinder walks that C program's live stack, from the
//! registers the kernel shows for it while it sleeps, through the library to `_start`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use frostdb_ebpf_ingest::unwind::{
    Cfa, End, ProcessTables, Registers, SavedRbp, UnwindTable, compile,
};

mod chain;

use chain::{C_CHAIN, RUST_CHAIN, Running, build_chain, build_rust_chain, has_chain};

/// A row as readelf prints it: CFA, rbp and return address rules.
type Rules = (String, String, String);

/// One function as readelf interprets it: its range and its rows `(pc, CFA, rbp, ra)`.
#[derive(Debug)]
struct Function {
    start: u64,
    end: u64,
    signal: bool,
    rows: Vec<(u64, String, String, String)>,
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// readelf's interpretation of `path`'s `.eh_frame`.
fn readelf(path: &Path) -> Vec<Function> {
    let out = Command::new("readelf")
        .args(["--wide", "--debug-dump=frames-interp"])
        .arg(path)
        .output()
        .expect("readelf runs (binutils, installed with the C toolchain)");
    let text = String::from_utf8_lossy(&out.stdout);
    // readelf exits 1 on some distributions' libc without saying why on stderr; what counts
    // is that it printed the section.
    assert!(
        text.contains("Contents of the .eh_frame section"),
        "readelf printed no .eh_frame for {} ({}): {}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // CIE offset -> (signal frame?, its initial row).
    let mut cies: HashMap<u64, (bool, Option<Rules>)> = HashMap::new();
    let mut functions = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 4 || fields[0].len() != 8 || !matches!(fields[3], "CIE" | "FDE") {
            continue;
        }
        // The rows, if any: a header naming the columns, then one line per row.
        let mut rows = Vec::new();
        if lines
            .peek()
            .is_some_and(|l| l.trim_start().starts_with("LOC"))
        {
            let header: Vec<String> = lines
                .next()
                .unwrap()
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            let column = |name: &str| header.iter().position(|h| h == name);
            let (cfa, rbp, ra) = (column("CFA").unwrap(), column("rbp"), column("ra"));
            while let Some(row) = lines.next_if(|l| !l.trim().is_empty()) {
                // A register rule prints as two words, `r10 (r10)`: one column.
                let mut f: Vec<String> = Vec::new();
                for word in row.split_whitespace() {
                    match f.last_mut() {
                        Some(last) if word.starts_with('(') => {
                            last.push(' ');
                            last.push_str(word);
                        }
                        _ => f.push(word.to_owned()),
                    }
                }
                rows.push((
                    hex(&f[0]),
                    f[cfa].clone(),
                    rbp.map_or("u".to_owned(), |i| f[i].clone()),
                    ra.map_or("u".to_owned(), |i| f[i].clone()),
                ));
            }
        }
        if fields[3] == "CIE" {
            let augmentation = fields.get(4).copied().unwrap_or("");
            let initial = rows
                .first()
                .map(|r| (r.1.clone(), r.2.clone(), r.3.clone()));
            cies.insert(hex(fields[0]), (augmentation.contains('S'), initial));
            continue;
        }
        let cie = fields[4].strip_prefix("cie=").map(hex).unwrap();
        let (start, end) = fields[5]
            .strip_prefix("pc=")
            .and_then(|r| r.split_once(".."))
            .map(|(a, b)| (hex(a), hex(b)))
            .unwrap();
        let (signal, initial) = cies.get(&cie).cloned().unwrap_or((false, None));
        if rows.is_empty()
            && let Some((cfa, rbp, ra)) = initial
        {
            rows.push((start, cfa, rbp, ra));
        }
        functions.push(Function {
            start,
            end,
            signal,
            rows,
        });
    }
    functions
}

/// What the table must say for a row readelf prints.
fn expected(signal: bool, cfa: &str, rbp: &str, ra: &str) -> (Option<Cfa>, SavedRbp) {
    let cfa = if signal {
        Some(Cfa::Signal)
    } else if ra == "u" {
        Some(Cfa::Outermost)
    } else if ra != "c-8" {
        Some(Cfa::Unsupported)
    } else if let Some(o) = cfa.strip_prefix("rsp+") {
        Some(Cfa::Rsp(o.parse().unwrap()))
    } else if let Some(o) = cfa.strip_prefix("rbp+") {
        Some(Cfa::Rbp(o.parse().unwrap()))
    } else if cfa == "exp" {
        None // the PLT expression, or another: either is right, checked below
    } else {
        Some(Cfa::Unsupported)
    };
    let rbp = match rbp {
        "u" | "s" => SavedRbp::Unchanged,
        c if c.starts_with("c-") || c.starts_with("c+") => c[1..]
            .parse::<i16>()
            .map_or(SavedRbp::Unsupported, SavedRbp::AtCfa),
        _ => SavedRbp::Unsupported,
    };
    (cfa, rbp)
}

/// Checks `path`'s compiled table against readelf; returns (functions, rows checked).
fn check(path: &Path) -> (usize, usize) {
    let table: UnwindTable = compile(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let functions = readelf(path);
    assert!(
        !functions.is_empty(),
        "{}: readelf found no FDE",
        path.display()
    );
    assert_eq!(
        table.stats().functions,
        functions.len(),
        "{}",
        path.display()
    );
    // Functions that overlap another one have no single answer; binaries here have none.
    let mut sorted: Vec<&Function> = functions.iter().filter(|f| f.start < f.end).collect();
    sorted.sort_by_key(|f| f.start);
    assert!(
        sorted.windows(2).all(|w| w[0].end <= w[1].start),
        "{}: overlapping FDEs",
        path.display()
    );
    let mut checked = 0;
    for f in sorted {
        for (i, (pc, cfa, rbp, ra)) in f.rows.iter().enumerate() {
            let last = f.rows.get(i + 1).map_or(f.end, |r| r.0) - 1;
            let (want_cfa, want_rbp) = expected(f.signal, cfa, rbp, ra);
            for at in [*pc, last] {
                let got = table.lookup(at).unwrap_or_else(|| {
                    panic!(
                        "{}: no row at {at:#x} ({pc:#x}: {cfa} {rbp})",
                        path.display()
                    )
                });
                let cfa_ok = match want_cfa {
                    Some(want) => got.cfa == want,
                    None => matches!(got.cfa, Cfa::Plt | Cfa::Unsupported),
                };
                assert!(
                    cfa_ok && (got.rbp == want_rbp || got.cfa == Cfa::Signal),
                    "{}: at {at:#x} readelf says CFA {cfa}, rbp {rbp}, ra {ra} (function \
                     {:#x}..{:#x}); the table says {got:?}",
                    path.display(),
                    f.start,
                    f.end
                );
                checked += 1;
            }
        }
        // Past a function that no other one covers: no CFI, said by an end marker, unless
        // only padding (under 16 bytes, to a 16-aligned start) comes before the next one.
        let padding = functions
            .iter()
            .any(|g| g.start >= f.end && g.start - f.end < 16 && g.start.is_multiple_of(16));
        if !padding && !functions.iter().any(|g| g.start <= f.end && f.end < g.end) {
            assert_eq!(
                table.lookup(f.end).map(|r| r.cfa),
                Some(Cfa::None),
                "{}: nothing marks the end of {:#x}..{:#x}",
                path.display(),
                f.start,
                f.end
            );
        }
    }
    (functions.len(), checked)
}

fn libc() -> PathBuf {
    // The libc this test process runs with.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
        .map(PathBuf::from)
        .expect("this process maps a libc")
}

#[test]
fn libc_tables_read_as_readelf_reads_its_cfi() {
    let path = libc();
    let (functions, rows) = check(&path);
    let table = compile(&std::fs::read(&path).unwrap()).unwrap();
    println!(
        "{}: {functions} functions, {rows} rows checked; {} rows read, {} kept ({} bytes)",
        path.display(),
        table.stats().rows_read,
        table.rows().len(),
        table.encoded_bytes()
    );
    assert!(functions > 1000 && rows > 10_000);
    // libc has PLT entries and the signal trampoline; both are recognized.
    assert!(
        table.rows().iter().any(|r| r.cfa == Cfa::Plt),
        "no PLT rows"
    );
    assert!(
        table.rows().iter().any(|r| r.cfa == Cfa::Signal),
        "no signal frame"
    );
    assert!(
        table.rows().len() < table.stats().rows_read,
        "nothing compacted"
    );
}

#[test]
fn a_c_program_without_frame_pointers_reads_as_readelf_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let (program, library) = build_chain(dir.path());
    for file in [&program, &library] {
        let (functions, rows) = check(file);
        assert!(
            functions >= 3 && rows >= 6,
            "{functions} functions, {rows} rows"
        );
        // Without frame pointers, every CFA is rsp-based.
        let table = compile(&std::fs::read(file).unwrap()).unwrap();
        assert!(table.rows().iter().all(|r| !matches!(r.cfa, Cfa::Rbp(_))));
    }
}

/// `pid`'s user registers while it is blocked in a system call, from
/// `/proc/<pid>/syscall` ("nr args... sp pc"; "running" while it runs).
fn blocked_registers(pid: u32) -> Registers {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap();
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() >= 9 {
            let value = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            return Registers {
                sp: value(f[f.len() - 2]),
                ip: value(f[f.len() - 1]),
                bp: 0, // not shown; code built without frame pointers does not need it
            };
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} never blocked: {text:?}"
        );
        std::thread::yield_now();
    }
}

/// `pid`'s user registers while it is blocked, read by gdb (which attaches, prints them and
/// detaches; the process goes back to the same system call with the same stack).
fn registers_by_gdb(pid: u32) -> Registers {
    // Blocked first, so that gdb stops it inside its system call.
    blocked_registers(pid);
    let out = Command::new("gdb")
        .args(["-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "info registers rip rsp rbp"])
        .output()
        .expect("gdb runs (scripts/setup.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let register = |name: &str| {
        text.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(name)).then(|| f.next()).flatten()
            })
            .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            .unwrap_or_else(|| panic!("gdb printed no {name}: {text}"))
    };
    Registers {
        ip: register("rip"),
        sp: register("rsp"),
        bp: register("rbp"),
    }
}

/// Starts `program`, waits for its "ready" line and for it to block in a system call, and
/// unwinds it from its registers (`registers(pid)`): the frames' names (innermost first) and
/// why the walk ended.
fn unwind_blocked(
    program: &Path,
    args: &[&str],
    registers: impl Fn(u32) -> Registers,
) -> (Vec<String>, End) {
    use std::os::unix::fs::FileExt;
    let child = Running::start(program, args);
    let pid = child.pid();
    let regs = registers(pid);
    let tables = ProcessTables::read(pid).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let read = |at: u64| {
        let mut b = [0u8; 8];
        mem.read_exact_at(&mut b, at)
            .ok()
            .map(|()| u64::from_le_bytes(b))
    };
    let unwound = tables.unwind(regs, read, 127);
    // Every frame but the first is a return address, which may point past the end of its
    // function (after a call that does not return): name the call instruction.
    let calls: Vec<u64> = unwound
        .frames
        .iter()
        .enumerate()
        .map(|(i, ip)| if i == 0 { *ip } else { ip - 1 })
        .collect();
    use blazesym::symbolize::source::{Process, Source};
    use blazesym::symbolize::{Input, Symbolized, Symbolizer};
    let names: Vec<String> = Symbolizer::new()
        .symbolize(
            &Source::Process(Process::new(pid.into())),
            Input::AbsAddr(&calls),
        )
        .unwrap()
        .into_iter()
        .map(|s| match s {
            // Demangled as the sampler does (blazesym is built without demangling).
            Symbolized::Sym(sym) => frostdb_pprof::symbolize::demangle(&sym.name),
            Symbolized::Unknown(_) => "?".to_owned(),
        })
        .collect();
    println!(
        "{}: {names:?} {:?}, from {regs:x?}: {:x?}",
        program.display(),
        unwound.end,
        unwound.frames
    );
    (names, unwound.end)
}

/// Asserts `chain` (innermost first) appears in `names`, whole and in order.
fn assert_chain(names: &[String], chain: &[&str]) {
    assert!(has_chain(names, chain), "{chain:?} not whole in {names:?}");
}

#[test]
fn a_chain_through_a_shared_library_unwinds_whole_from_its_registers() {
    let dir = tempfile::tempdir().unwrap();
    let (program, _) = build_chain(dir.path());
    // Code without frame pointers needs no rbp: /proc/<pid>/syscall shows only sp and pc.
    let (names, end) = unwind_blocked(&program, &["sleep"], blocked_registers);
    assert_chain(&names, &C_CHAIN);
    assert_eq!(end, End::Complete, "{names:?}");
}

#[test]
fn a_stack_unwinds_through_a_signal_frame_into_the_interrupted_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (program, _) = build_chain(dir.path());
    let (names, end) = unwind_blocked(&program, &["signal"], blocked_registers);
    // The handler, then the kernel's signal frame (glibc's __restore_rt, whose call site is
    // the unnamed nop before it), then the code the signal interrupted (raise, inside the
    // chain), and on to _start.
    let handler = names.iter().position(|n| n == "on_signal");
    let raise = names.iter().position(|n| n.ends_with("raise"));
    assert!(
        matches!((handler, raise), (Some(h), Some(r)) if h + 1 < r),
        "no handler above the interrupted raise in {names:?}"
    );
    assert_chain(&names, &C_CHAIN);
    assert_eq!(end, End::Complete, "{names:?}");
}

#[test]
fn a_rust_release_binary_unwinds_whole_from_its_registers() {
    let dir = tempfile::tempdir().unwrap();
    let program = build_rust_chain(dir.path());
    // Rust's precompiled std keeps frame pointers (its CFA is rbp-based): the real rbp.
    let (names, end) = unwind_blocked(&program, &[], registers_by_gdb);
    assert_chain(&names, &RUST_CHAIN);
    assert_eq!(end, End::Complete, "{names:?}");
}

#[test]
fn this_rust_binary_reads_as_readelf_reads_it() {
    let exe = std::env::current_exe().unwrap();
    let (functions, rows) = check(&exe);
    assert!(
        functions > 1000 && rows > 10_000,
        "{functions} functions, {rows} rows"
    );
}
