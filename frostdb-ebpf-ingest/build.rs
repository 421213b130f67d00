//! Compiles the BPF half of the sampler (`src/bpf/sampler.bpf.c`) with clang.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "src/bpf/sampler.bpf.c";
    println!("cargo::rerun-if-changed={source}");
    println!("cargo::rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let object = out.join("sampler.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    // The uapi headers include <asm/types.h>, which lives under the multiarch directory.
    let multiarch = Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "x86_64-linux-gnu".to_owned());
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", source, "-o"])
        .arg(&object)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} could not compile {source} ({s}); see the errors above"),
        Err(e) => panic!(
            "cannot run {clang} ({e}): the eBPF sampler is C compiled at build time. \
             Install it with `apt-get install -y clang libbpf-dev` (scripts/setup.sh does), \
             or point CLANG at a clang binary"
        ),
    }
}
