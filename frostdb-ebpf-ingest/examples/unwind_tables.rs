//! The unwind tables this machine's processes would need: every executable file mapped by
//! a running process (each once, however many processes map it), its table built from its
//! `.eh_frame`, with the bytes it takes in the kernel and the time to build it.
//!
//! ```text
//! cargo run --release -p frostdb-ebpf-ingest --example unwind_tables [-- --all]
//! ```
//! Prints one line per file (the 20 largest unless `--all`), then the totals.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use frostdb_ebpf_ingest::executable_mappings;
use frostdb_ebpf_ingest::unwind::compile;

fn main() {
    let all = std::env::args().any(|a| a == "--all");
    // (device, inode) -> a path to read it by, through the mapping process's root.
    let mut files: BTreeMap<(String, u64), PathBuf> = BTreeMap::new();
    let mut processes = 0;
    for entry in std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .flatten()
    {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // Gone meanwhile, or a kernel thread we may not read: nothing to build.
        let Ok(mappings) = executable_mappings(pid) else {
            continue;
        };
        processes += 1;
        for m in mappings {
            if m.path == frostdb_ebpf_ingest::VDSO {
                continue; // in memory, the same in every process: not a file to read
            }
            files
                .entry((m.device, m.inode))
                .or_insert_with(|| PathBuf::from(format!("/proc/{pid}/root{}", m.path)));
        }
    }
    let mut rows = Vec::new();
    let (mut bytes, mut seconds, mut failed) = (0usize, 0f64, 0usize);
    for path in files.values() {
        let data = match std::fs::read(path) {
            Ok(data) => data,
            Err(e) => {
                failed += 1;
                eprintln!("{}: {e}", path.display());
                continue;
            }
        };
        let started = Instant::now();
        match compile(&data) {
            Ok(table) => {
                let s = started.elapsed().as_secs_f64();
                seconds += s;
                bytes += table.encoded_bytes();
                rows.push((table.encoded_bytes(), table, s, path.clone()));
            }
            Err(e) => {
                failed += 1;
                eprintln!("{}: {e}", path.display());
            }
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    // A closed pipe (`| head`) ends the listing quietly.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "bytes\trows\trows_read\tfunctions\tms\tfile");
    for (b, table, s, path) in rows.iter().take(if all { usize::MAX } else { 20 }) {
        let st = table.stats();
        if writeln!(
            out,
            "{b}\t{}\t{}\t{}\t{:.2}\t{}",
            table.rows().len(),
            st.rows_read,
            st.functions,
            s * 1e3,
            path.display()
        )
        .is_err()
        {
            return;
        }
    }
    let _ = writeln!(
        out,
        "{} processes map {} executable files ({} unreadable or not x86-64 ELF): unwind \
         tables {:.2} MiB in all, {:.0} KiB a file on average, built in {:.0} ms",
        processes,
        files.len(),
        failed,
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / 1024.0 / rows.len().max(1) as f64,
        seconds * 1e3
    );
}
