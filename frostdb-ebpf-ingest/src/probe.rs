//! The kernel half, seen from user space: loads the BPF object built from
//! `src/bpf/sampler.bpf.c`, attaches it to a CPU-clock perf event on every online CPU, and
//! drains its double-buffered counts.
//!
//! The swap: the program reads `active` once per sample and writes only to that buffer.
//! [`Probe::drain`] flips `active`, then waits for one RCU grace period
//! (`membarrier(MEMBARRIER_CMD_GLOBAL)` is `synchronize_rcu()`); perf-event BPF programs run
//! inside RCU read-side sections, so once it returns no program can still be writing the old
//! buffer, which is then read and cleared at leisure. A sample is in exactly one drain.

use std::collections::HashMap;
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuValues};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{PerfEvent, RawTracePoint};
use aya::{Ebpf, EbpfLoader, include_bytes_aligned};

use crate::config::{Config, Target};
use crate::error::{Error, Result};
use crate::unwind::loader::{CHUNK_BYTES, TableLoader};

static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sampler.bpf.o"));

// Keep in step with src/bpf/sampler.bpf.c.
const FILTER_ALL: u32 = 0;
const FILTER_PIDS: u32 = 1;
const FILTER_CGROUP: u32 = 2;
const T_SAMPLED: u32 = 0;
const T_DROPPED: u32 = 2;
const T_IDLE: u32 = 4;
const T_NO_USER_STACK: u32 = 5;
const T_NO_KERNEL_STACK: u32 = 6;
const T_STACKS_FULL: u32 = 7;
const T_FRAME_POINTERS: u32 = 8;
const T_UNWOUND: u32 = 9;
const STACK_DEPTH: usize = 127;

/// `struct key_t` of the BPF program.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    /// How the table walk of the user stack ended, + 1 ([`UserEnd`]); 0 for a
    /// frame-pointer walk.
    user_end: u32,
    /// Hash of the user stack; 0 when there is none.
    user_stack: u64,
    /// Hash of the kernel stack; 0 when there is none.
    kernel_stack: u64,
    comm: [u8; 16],
}

/// `struct settings_t` of the BPF program.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Settings {
    filter: u32,
    cgroup_level: u32,
    cgroup_id: u64,
    hash_seed: u64,
}

// SAFETY: both are `repr(C)` structs of plain integers with no implicit padding
// (4+4+8+8+16 and 4+4+8+8 bytes), so every bit pattern is a valid value, as `Pod` requires.
#[allow(unsafe_code)]
unsafe impl aya::Pod for Key {}
#[allow(unsafe_code)]
unsafe impl aya::Pod for Settings {}

/// How the kernel's walk of a user stack with unwind tables ended (`END_*` in
/// sampler.bpf.c, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UserEnd {
    /// At the outermost frame: the stack is whole.
    Complete,
    /// At an address in no file mapping (JIT code, the vDSO).
    NotMapped,
    /// At CFI the tables do not follow.
    Unsupported,
    /// Where neither CFI nor a frame pointer led on.
    NoCfi,
    /// Where stack memory could not be read.
    Unreadable,
    /// At the depth limit (127 frames).
    TooDeep,
}

impl UserEnd {
    const ALL: [UserEnd; 6] = [
        UserEnd::Complete,
        UserEnd::NotMapped,
        UserEnd::Unsupported,
        UserEnd::NoCfi,
        UserEnd::Unreadable,
        UserEnd::TooDeep,
    ];

    /// What a stack cut short by this shows at its root, so a flame graph never passes off
    /// a partial stack as a whole one; `None` for a whole stack.
    pub(crate) fn root_frame(self) -> Option<&'static str> {
        match self {
            UserEnd::Complete => None,
            UserEnd::NotMapped => Some("[unwind stopped: code outside any file]"),
            UserEnd::Unsupported => Some("[unwind stopped: unsupported CFI]"),
            UserEnd::NoCfi => Some("[unwind stopped: no CFI and no frame pointer]"),
            UserEnd::Unreadable => Some("[unwind stopped: stack not readable]"),
            UserEnd::TooDeep => Some("[unwind stopped: deeper than 127 frames]"),
        }
    }
}

/// User stacks walked since the probe was attached, by how.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserWalks {
    /// By frame pointer: the process had no unwind tables loaded (yet).
    pub frame_pointers: u64,
    /// With unwind tables, by how the walk ended (indexed by `UserEnd as usize`).
    pub unwound: [u64; 6],
}

impl UserWalks {
    /// Table walks that ended at the outermost frame.
    pub fn complete(&self) -> u64 {
        self.unwound[0]
    }

    /// Table walks, all ends.
    pub fn unwound_total(&self) -> u64 {
        self.unwound.iter().sum()
    }
}

/// One (process, thread name, user stack, kernel stack) and how often it was sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawSample {
    pub(crate) pid: u32,
    /// The sampled thread's name, as the kernel had it at the sample.
    pub(crate) comm: String,
    /// Return addresses, leaf first; empty when the user stack could not be read.
    pub(crate) user: Vec<u64>,
    /// How the walk of `user` with unwind tables ended; `None` for a frame-pointer walk.
    pub(crate) user_end: Option<UserEnd>,
    /// Kernel addresses, leaf first; empty when the sample interrupted user mode.
    pub(crate) kernel: Vec<u64>,
    pub(crate) count: u64,
}

/// What one drain read, besides the samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainCounts {
    /// Samples kept (the sum of the counts read).
    pub sampled: u64,
    /// Samples lost because the kernel's count map was full.
    pub dropped: u64,
    /// The kernel's own count of samples recorded in the buffer minus `sampled`: nonzero
    /// only if a program wrote to the buffer after the swap (never, with the RCU wait).
    pub unaccounted: i64,
    /// Samples whose stack (hash given, nonzero) was not in the stack map: kept with that
    /// stack empty, counted here and logged, never silently.
    pub missing_stacks: u64,
    /// Map entries that could not be removed after reading: left in the buffer, they would
    /// be read again at its next turn; counted here and logged.
    pub stale_entries: u64,
}

/// Totals since the probe was attached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelTotals {
    /// Samples of the idle task, not recorded.
    pub idle: u64,
    /// Samples whose user stack could not be read (kernel threads have none).
    pub no_user_stack: u64,
    /// Samples in kernel mode whose kernel stack could not be read.
    pub no_kernel_stack: u64,
    /// Stacks not kept because a stack map was full (their samples still count).
    pub stacks_full: u64,
    /// How user stacks were walked.
    pub user_walks: UserWalks,
    /// Runs of the BPF program and the time they took, as the kernel accounts them: zero
    /// unless BPF run-time statistics are on (`kernel.bpf_stats_enabled`, or
    /// `aya::sys::enable_stats`).
    pub bpf_runs: u64,
    /// See `bpf_runs`.
    pub bpf_run_time: Duration,
}

/// The loaded, attached BPF program and its maps. Dropping it detaches everything.
pub(crate) struct Probe {
    ebpf: Ebpf,
    buffers: [Buffer; 2],
    active: Array<MapData, u32>,
    totals: PerCpuArray<MapData, u64>,
    /// The unwind tables in the program's maps.
    pub(crate) tables: TableLoader,
    /// The buffer the program writes now.
    current: u32,
    /// Online CPUs, attached to.
    cpus: usize,
    /// Possible CPUs: the width of a per-CPU value.
    possible_cpus: usize,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("current", &self.current)
            .field("cpus", &self.cpus)
            .finish_non_exhaustive()
    }
}

struct Buffer {
    counts: BpfHashMap<MapData, Key, u64>,
    stacks: BpfHashMap<MapData, u64, [u64; STACK_DEPTH]>,
}

impl Probe {
    /// Loads the program, configures its filter and attaches it to every online CPU.
    pub(crate) fn attach(config: &Config) -> Result<Self> {
        crate::procfs::check_permitted()?;
        // The rows array takes the configured bytes (at least one chunk: a map cannot be
        // empty); with 0 no process is ever given tables.
        let chunks = (config.unwind_table_bytes / CHUNK_BYTES as u64) as u32;
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("unwind_rows", chunks.max(1))
            .load(OBJECT)
            .map_err(|e| Error::bpf("loading the BPF object", e))?;
        let settings = settings(config)?;
        {
            let map = ebpf
                .map_mut("settings")
                .ok_or(Error::MissingMap("settings"))?;
            let mut array: Array<&mut MapData, Settings> =
                Array::try_from(map).map_err(|e| Error::bpf("opening map settings", e))?;
            array
                .set(0, settings, 0)
                .map_err(|e| Error::bpf("writing the filter", e))?;
        }
        if let Target::Pids(list) = &config.target {
            let map = ebpf.map_mut("pids").ok_or(Error::MissingMap("pids"))?;
            let mut pids: BpfHashMap<&mut MapData, u32, u8> =
                BpfHashMap::try_from(map).map_err(|e| Error::bpf("opening map pids", e))?;
            for pid in list {
                pids.insert(pid, 1, 0)
                    .map_err(|e| Error::bpf(format!("adding pid {pid} to the filter"), e))?;
            }
        }
        let active = Array::try_from(take(&mut ebpf, "active")?)
            .map_err(|e| Error::bpf("opening map active", e))?;
        let totals = PerCpuArray::try_from(take(&mut ebpf, "totals")?)
            .map_err(|e| Error::bpf("opening map totals", e))?;
        let buffers = [buffer(&mut ebpf, 0)?, buffer(&mut ebpf, 1)?];
        let mut tables = TableLoader::new(
            Array::try_from(take(&mut ebpf, "unwind_rows")?)
                .map_err(|e| Error::bpf("opening map unwind_rows", e))?,
            BpfHashMap::try_from(take(&mut ebpf, "unwind_processes")?)
                .map_err(|e| Error::bpf("opening map unwind_processes", e))?,
            chunks,
        );
        // Listed processes get their tables before the first sample, in the list's order;
        // others from the interval after their first (walked by frame pointer until then).
        if let (Target::Pids(list), true) = (&config.target, config.unwind_table_bytes > 0) {
            tables.refresh(list);
        }

        let program: &mut RawTracePoint = ebpf
            .program_mut("on_exec")
            .ok_or(Error::MissingMap("on_exec (program)"))?
            .try_into()
            .map_err(|e| Error::bpf("the on_exec program", e))?;
        program
            .load()
            .map_err(|e| Error::bpf("loading the on_exec program", e))?;
        // Raw tracepoints attach by name, without tracefs (often not mounted).
        program
            .attach("sched_process_exec")
            .map_err(|e| Error::bpf("attaching to the sched_process_exec tracepoint", e))?;
        let program: &mut PerfEvent = ebpf
            .program_mut("sample")
            .ok_or(Error::MissingMap("sample (program)"))?
            .try_into()
            .map_err(|e| Error::bpf("the sample program", e))?;
        program
            .load()
            .map_err(|e| Error::bpf("loading the sample program into the kernel", e))?;
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| Error::Io(format!("reading {what}"), e))?;
        let possible_cpus =
            aya::util::nr_cpus().map_err(|(what, e)| Error::Io(format!("reading {what}"), e))?;
        // CPU-clock periods are nanoseconds of CPU time: a fixed period samples at exactly
        // the asked frequency, where the frequency mode would let the kernel adjust it.
        let period = config.period_ns();
        for &cpu in &cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period),
                    false,
                )
                .map_err(|e| Error::bpf(format!("attaching to the CPU clock of cpu {cpu}"), e))?;
        }
        tracing::info!(
            cpus = cpus.len(),
            frequency_hz = config.frequency_hz,
            "eBPF sampler attached"
        );
        Ok(Self {
            ebpf,
            buffers,
            active,
            totals,
            tables,
            current: 0,
            cpus: cpus.len(),
            possible_cpus,
        })
    }

    /// How many CPUs the program is attached to.
    pub(crate) fn cpus(&self) -> usize {
        self.cpus
    }

    /// Swaps buffers and returns everything the program recorded since the last drain.
    pub(crate) fn drain(&mut self) -> Result<(Vec<RawSample>, DrainCounts)> {
        let old = self.current;
        let new = 1 - old;
        self.active
            .set(0, new, 0)
            .map_err(|e| Error::bpf("swapping buffers", e))?;
        self.current = new;
        wait_for_programs();

        let buffer = &mut self.buffers[old as usize];
        let mut keys = Vec::new();
        for entry in buffer.counts.iter() {
            let (key, count) = entry.map_err(|e| Error::bpf("reading counts", e))?;
            keys.push((key, count));
        }
        let mut stacks: HashMap<u64, Vec<u64>> = HashMap::new();
        for entry in buffer.stacks.iter() {
            let (hash, ips) = entry.map_err(|e| Error::bpf("reading stacks", e))?;
            // The slots past the stack's depth are zero. An address in page zero is where a
            // frame-pointer walk went astray (code compiled without frame pointers used the
            // register): it and what follows are garbage, not frames.
            let depth = ips.iter().position(|&ip| ip < 4096).unwrap_or(ips.len());
            stacks.insert(hash, ips[..depth].to_vec());
        }
        // A hash of 0 is no stack (none was taken); another one missing from the stack map
        // is a sample whose stack was lost.
        let mut missing_stacks = 0u64;
        let mut frames = |hash: u64| match stacks.get(&hash) {
            Some(frames) => frames.clone(),
            None => {
                if hash != 0 {
                    missing_stacks += 1;
                }
                Vec::new()
            }
        };
        let mut samples = Vec::with_capacity(keys.len());
        let mut sampled = 0;
        for (key, count) in &keys {
            sampled += count;
            let user = frames(key.user_stack);
            samples.push(RawSample {
                pid: key.pid,
                comm: comm(&key.comm),
                user,
                user_end: key
                    .user_end
                    .checked_sub(1)
                    .and_then(|i| UserEnd::ALL.get(i as usize).copied()),
                kernel: frames(key.kernel_stack),
                count: *count,
            });
        }
        if missing_stacks > 0 {
            tracing::warn!(
                missing_stacks,
                "eBPF samples whose stack was not in the stack map; kept without it"
            );
        }
        // Clear both maps of this buffer for its next turn.
        let mut stale_entries = 0u64;
        let mut last_error = None;
        for (key, _) in &keys {
            if let Err(e) = buffer.counts.remove(key) {
                stale_entries += 1;
                last_error = Some(e.to_string());
            }
        }
        for hash in stacks.keys() {
            if let Err(e) = buffer.stacks.remove(hash) {
                stale_entries += 1;
                last_error = Some(e.to_string());
            }
        }
        if let Some(error) = last_error {
            tracing::error!(stale_entries, %error, "eBPF map entries could not be removed after a drain; they will be read again");
        }
        let kept = self.take_total(T_SAMPLED + old)?;
        let dropped = self.take_total(T_DROPPED + old)?;
        let unaccounted = kept as i64 - sampled as i64;
        if unaccounted != 0 {
            // Only possible if the swap were not quiescent; worth a loud log.
            tracing::warn!(kept, sampled, "eBPF buffer counts disagree");
        }
        Ok((
            samples,
            DrainCounts {
                sampled,
                dropped,
                unaccounted,
                missing_stacks,
                stale_entries,
            },
        ))
    }

    /// Totals since attach.
    pub(crate) fn totals(&self) -> Result<KernelTotals> {
        let program: &PerfEvent = self
            .ebpf
            .program("sample")
            .ok_or(Error::MissingMap("sample (program)"))?
            .try_into()
            .map_err(|e| Error::bpf("the sample program", e))?;
        let info = program
            .info()
            .map_err(|e| Error::bpf("reading the program's statistics", e))?;
        let mut unwound = [0; 6];
        for (i, n) in (0..).zip(unwound.iter_mut()) {
            *n = self.read_total(T_UNWOUND + i)?;
        }
        Ok(KernelTotals {
            idle: self.read_total(T_IDLE)?,
            no_user_stack: self.read_total(T_NO_USER_STACK)?,
            no_kernel_stack: self.read_total(T_NO_KERNEL_STACK)?,
            stacks_full: self.read_total(T_STACKS_FULL)?,
            user_walks: UserWalks {
                frame_pointers: self.read_total(T_FRAME_POINTERS)?,
                unwound,
            },
            bpf_runs: info.run_count(),
            bpf_run_time: info.run_time(),
        })
    }

    fn read_total(&self, index: u32) -> Result<u64> {
        let values = self
            .totals
            .get(&index, 0)
            .map_err(|e| Error::bpf("reading totals", e))?;
        Ok(values.iter().sum())
    }

    /// Reads a per-buffer total and zeroes it; only for the buffer no program writes.
    fn take_total(&mut self, index: u32) -> Result<u64> {
        let total = self.read_total(index)?;
        let zeros = PerCpuValues::try_from(vec![0u64; self.possible_cpus])
            .map_err(|e| Error::Io("sizing per-CPU values".into(), e))?;
        self.totals
            .set(index, zeros, 0)
            .map_err(|e| Error::bpf("clearing totals", e))?;
        Ok(total)
    }

    /// Detaches the program from every CPU.
    pub(crate) fn detach(self) {
        drop(self.ebpf);
    }
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map> {
    ebpf.take_map(name).ok_or(Error::MissingMap(name))
}

fn buffer(ebpf: &mut Ebpf, index: usize) -> Result<Buffer> {
    let counts = BpfHashMap::try_from(take(ebpf, ["counts0", "counts1"][index])?)
        .map_err(|e| Error::bpf("opening a count map", e))?;
    let stacks = BpfHashMap::try_from(take(ebpf, ["stacks0", "stacks1"][index])?)
        .map_err(|e| Error::bpf("opening a stack map", e))?;
    Ok(Buffer { counts, stacks })
}

fn settings(config: &Config) -> Result<Settings> {
    // Seeded from the operating system's randomness, as std's hash maps are.
    let hash_seed = {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(u64::from(std::process::id()));
        h.finish()
    };
    let (filter, cgroup_level, cgroup_id) = match &config.target {
        Target::All => (FILTER_ALL, 0, 0),
        Target::Pids(_) => (FILTER_PIDS, 0, 0),
        Target::Cgroup(path) => {
            let (id, level) = crate::procfs::cgroup_id(path)?;
            (FILTER_CGROUP, level, id)
        }
    };
    Ok(Settings {
        filter,
        cgroup_level,
        cgroup_id,
        hash_seed,
    })
}

/// Waits until no BPF program can still be running with the buffer index it read before
/// the swap: one RCU grace period.
pub(crate) fn wait_for_programs() {
    use rustix::thread::{MembarrierCommand, membarrier};
    if let Err(e) = membarrier(MembarrierCommand::Global) {
        // nohz_full kernels refuse MEMBARRIER_CMD_GLOBAL. A program runs for microseconds
        // inside one timer interrupt, so a few milliseconds cover it with a wide margin.
        tracing::debug!("membarrier unavailable ({e}); waiting 5 ms instead");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn comm(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each load starts stack hashes somewhere else, unknown outside this process: a
    /// process that could compute the hash of another's stack could store frames of its
    /// choosing under it first.
    #[test]
    fn each_load_seeds_stack_hashes_anew() {
        let seeds: std::collections::HashSet<u64> = (0..8)
            .map(|_| settings(&Config::default()).unwrap().hash_seed)
            .collect();
        assert_eq!(seeds.len(), 8, "{seeds:?}");
    }
}
