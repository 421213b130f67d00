use anyhow::{Context, Result};
use aya::maps::{Array, HashMap, MapData, StackTraceMap};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent, HardwareEvent};
use aya::programs::PerfEvent;
use aya::Ebpf;
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Command, Stdio};
use std::time::Duration;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Key { pid: u32, user_stack_id: i32, kernel_stack_id: i32, kmode: u32 }
unsafe impl aya::Pod for Key {}

#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32, size: u32, config: u64, sample_period: u64, sample_type: u64, read_format: u64,
    flags: u64, wakeup_events: u32, bp_type: u32, config1: u64, config2: u64, branch_sample_type: u64,
    sample_regs_user: u64, sample_stack_user: u32, clockid: i32, sample_regs_intr: u64,
    aux_watermark: u32, sample_max_stack: u16, _r2: u16, aux_sample_size: u32, _r3: u32, sig_data: u64, config3: u64,
}

fn online_cpus() -> Vec<u32> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let mut v = vec![];
    for part in s.trim().split(',') {
        if let Some((a, b)) = part.split_once('-') { for c in a.parse::<u32>().unwrap()..=b.parse().unwrap() { v.push(c) } }
        else { v.push(part.parse().unwrap()) }
    }
    v
}

fn load_kallsyms() -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = std::fs::read_to_string("/proc/kallsyms").unwrap().lines().filter_map(|l| {
        let mut it = l.split_whitespace();
        let a = u64::from_str_radix(it.next()?, 16).ok()?; let t = it.next()?; let n = it.next()?;
        if a == 0 || !matches!(t, "t" | "T" | "w" | "W") { return None }
        Some((a, n.to_string()))
    }).collect();
    v.sort();
    v
}
fn sym(ks: &[(u64, String)], ip: u64) -> String {
    match ks.partition_point(|(a, _)| *a <= ip) { 0 => format!("{ip:#x}"), i => format!("{}+{:#x}", ks[i - 1].1, ip - ks[i - 1].0) }
}

fn main() -> Result<()> {
    // usage: sampler <obj> <mode> ; mode = aya-sw | aya-hw | raw-sw[:callchain][:exclk]
    let args: Vec<String> = std::env::args().collect();
    let obj = args.get(1).cloned().unwrap_or("prof.bpf.o".into());
    let mode = args.get(2).cloned().unwrap_or("aya-sw".into());
    let mut bpf = Ebpf::load_file(&obj).context("load obj")?;
    let prog: &mut PerfEvent = bpf.program_mut("do_sample").unwrap().try_into()?;
    prog.load().context("load prog")?;
    let mut raw_fds = vec![];
    for cpu in online_cpus() {
        if mode.starts_with("aya") {
            let cfg = if mode == "aya-hw" { PerfEventConfig::Hardware(HardwareEvent::CpuCycles) } else { PerfEventConfig::Software(SoftwareEvent::CpuClock) };
            prog.attach(cfg, PerfEventScope::AllProcessesOneCpu { cpu }, SamplePolicy::Frequency(99), true)
                .with_context(|| format!("attach cpu {cpu}"))?;
        } else {
            let mut a = Attr::default();
            a.size = std::mem::size_of::<Attr>() as u32;
            a.type_ = if mode.starts_with("raw-hw") { 0 } else { 1 }; // HARDWARE / SOFTWARE
            a.config = 0; // CPU_CYCLES / CPU_CLOCK
            a.sample_period = 99;
            a.flags = 1 << 10; // freq
            a.flags |= 1; // disabled
            if mode.contains(":callchain") { a.sample_type = 1 << 5; } // PERF_SAMPLE_CALLCHAIN
            if mode.contains(":exclk") { a.flags |= 1 << 5; }
            let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, &a as *const Attr, -1i32, cpu as i32, -1i32, 8u64 /*CLOEXEC*/) };
            if fd < 0 { anyhow::bail!("perf_event_open cpu {cpu}: {}", std::io::Error::last_os_error()); }
            let pfd = prog.fd()?.as_fd().as_raw_fd();
            unsafe {
                if libc::ioctl(fd as i32, 0x40042408, pfd) < 0 { anyhow::bail!("SET_BPF: {}", std::io::Error::last_os_error()); }
                libc::ioctl(fd as i32, 0x2400, 0);
            }
            raw_fds.push(fd);
        }
    }
    let mut kids = vec![
        Command::new("sh").args(["-c", "while :; do :; done"]).spawn()?,
        Command::new("dd").args(["if=/dev/zero", "of=/dev/null", "bs=1"]).stderr(Stdio::null()).spawn()?,
    ];
    std::thread::sleep(Duration::from_secs(5));
    for k in kids.iter_mut() { let _ = k.kill(); let _ = k.wait(); }
    let kid_pids: Vec<u32> = kids.iter().map(|k| k.id()).collect();

    let errs: Array<&MapData, u64> = Array::try_from(bpf.map("errs").unwrap())?;
    for (kind, kname) in [(0, "kernel"), (1, "user")] {
        for (km, mname) in [(0, "sample-in-user-mode"), (1, "sample-in-kernel-mode")] {
            let mut s = String::new();
            for e in 0..64u32 { let v = errs.get(&((kind * 2 + km) * 64 + e), 0)?; if v > 0 { s += &format!(" {}={v}", if e == 0 { "OK".into() } else { format!("-{e}") }); } }
            println!("stackid {kname:6} | {mname:22}:{s}");
        }
    }
    let gs: Array<&MapData, u64> = Array::try_from(bpf.map("gs").unwrap())?;
    println!("bpf_get_stack(kernel): user-mode ok={} fail={} ; kernel-mode ok={} fail={}",
        gs.get(&1, 0)?, gs.get(&0, 0)?, gs.get(&3, 0)?, gs.get(&2, 0)?);

    let counts: HashMap<&MapData, Key, u64> = HashMap::try_from(bpf.map("counts").unwrap())?;
    let stacks: StackTraceMap<&MapData> = StackTraceMap::try_from(bpf.map("stacks").unwrap())?;
    let ks = load_kallsyms();
    let mut all: Vec<(Key, u64)> = counts.iter().filter_map(|r| r.ok()).collect();
    let tot: u64 = all.iter().map(|x| x.1).sum();
    let kok: u64 = all.iter().filter(|x| x.0.kernel_stack_id >= 0).map(|x| x.1).sum();
    let kid: u64 = all.iter().filter(|x| kid_pids.contains(&x.0.pid)).map(|x| x.1).sum();
    let kidk: u64 = all.iter().filter(|x| kid_pids.contains(&x.0.pid) && x.0.kmode == 1).map(|x| x.1).sum();
    let kidkok: u64 = all.iter().filter(|x| kid_pids.contains(&x.0.pid) && x.0.kernel_stack_id >= 0).map(|x| x.1).sum();
    println!("samples total={tot} with-kernel-stack={kok} ({:.1}%); workload samples={kid}, in-kernel-mode={kidk}, with-kernel-stack={kidkok}", 100.0 * kok as f64 / tot.max(1) as f64);
    all.sort_by_key(|x| std::cmp::Reverse(x.1));
    let mut shown = 0;
    for (k, c) in &all {
        if k.kernel_stack_id < 0 || shown >= 3 { continue }
        shown += 1;
        println!("-- pid {} count {c} kstack {} ustack {} kmode {}", k.pid, k.kernel_stack_id, k.user_stack_id, k.kmode);
        if let Ok(st) = stacks.get(&(k.kernel_stack_id as u32), 0) {
            for f in st.frames().iter().take(12) { println!("     {}", sym(&ks, f.ip)); }
        }
    }
    drop(raw_fds);
    Ok(())
}
