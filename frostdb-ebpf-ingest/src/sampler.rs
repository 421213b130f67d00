//! The sampler: a thread that drains the probe every interval, symbolizes, and hands one
//! profile per process to a [`Sink`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use frostdb_core::now_ms;
use frostdb_pprof::proto;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::probe::{KernelTotals, Probe, RawSample};
use crate::procfs::ProcessInfo;
use crate::profile::ProfileBuilder;
use crate::symbolize::{Resolved, SymbolizeStats, Symbolizer};
use crate::unwind::TableStats;

/// A boxed error a sink returns.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// Where the profiles of each interval go.
pub trait Sink: Send + 'static {
    /// Takes one interval's profiles. An error is logged and counted; sampling goes on.
    fn write(&mut self, interval: Interval) -> Result<(), SinkError>;
}

impl<F> Sink for F
where
    F: FnMut(Interval) -> Result<(), SinkError> + Send + 'static,
{
    fn write(&mut self, interval: Interval) -> Result<(), SinkError> {
        self(interval)
    }
}

/// Sends each interval down a channel, for embedders that consume profiles elsewhere.
impl Sink for mpsc::Sender<Interval> {
    fn write(&mut self, interval: Interval) -> Result<(), SinkError> {
        self.send(interval)
            .map_err(|_| "the receiver of the sampler's profiles is gone".into())
    }
}

/// One process's samples over one interval.
#[derive(Debug, Clone)]
pub struct ProcessProfile {
    /// Host pid.
    pub pid: u32,
    /// What the process is: name, executable, cgroup, container.
    pub info: ProcessInfo,
    /// Samples in `profile`.
    pub samples: u64,
    /// The profile: sample types `samples/count` and `cpu/nanoseconds`, kernel frames
    /// below (leaf-side of) user frames.
    pub profile: proto::Profile,
}

impl ProcessProfile {
    /// The series labels: `pid`, `comm`, `exe`, and `cgroup`/`container_id` where known.
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut labels = vec![
            ("pid".to_owned(), self.pid.to_string()),
            ("comm".to_owned(), self.info.comm.clone()),
        ];
        if !self.info.exe.is_empty() {
            labels.push(("exe".to_owned(), self.info.exe.clone()));
        }
        if !self.info.cgroup.is_empty() {
            labels.push(("cgroup".to_owned(), self.info.cgroup.clone()));
        }
        if let Some(id) = &self.info.container_id {
            labels.push(("container_id".to_owned(), id.clone()));
        }
        labels
    }
}

/// The profiles of one interval and what it took to make them.
#[derive(Debug, Clone)]
pub struct Interval {
    /// Start, ms since the epoch.
    pub start_ms: i64,
    /// Length, ms.
    pub duration_ms: i64,
    /// One profile per process with samples.
    pub profiles: Vec<ProcessProfile>,
    /// Samples recorded (the sum over `profiles`).
    pub samples: u64,
    /// Samples lost because the kernel's count map was full.
    pub dropped: u64,
    /// Time spent symbolizing this interval.
    pub symbolize: Duration,
    /// Time the swap, read and clear of the kernel's buffers took (wall, including the
    /// RCU grace period, which sleeps).
    pub drain: Duration,
    /// Time spent turning the samples into profiles, symbolization included.
    pub build: Duration,
    /// Unique addresses this interval looked up, and how many of those the caches answered.
    pub addresses: (u64, u64),
    /// The unwind tables after this interval's refresh (what is loaded now, and totals).
    pub tables: TableStats,
    /// Time this interval's table refresh took (reading maps, building new tables).
    pub tables_refresh: Duration,
}

/// Totals over the sampler's life, returned by [`Sampler::stop`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Intervals emitted (including the last, partial one).
    pub intervals: u64,
    /// Samples recorded.
    pub samples: u64,
    /// Samples lost because a count map was full.
    pub dropped: u64,
    /// Intervals a sink refused.
    pub sink_errors: u64,
    /// Sum of [`DrainCounts::unaccounted`](crate::DrainCounts): 0 when the double buffer
    /// neither lost nor double-counted a sample.
    pub unaccounted: i64,
    /// Sum of [`DrainCounts::missing_stacks`](crate::DrainCounts): samples kept without
    /// their lost stack.
    pub missing_stacks: u64,
    /// Sum of [`DrainCounts::stale_entries`](crate::DrainCounts): map entries a drain could
    /// not remove.
    pub stale_entries: u64,
    /// What the kernel side counted.
    pub kernel: KernelTotals,
    /// Symbolization totals.
    pub symbolize: SymbolizeStats,
    /// Unwind tables at the end, and what building them took.
    pub tables: TableStats,
    /// CPUs sampled.
    pub cpus: usize,
}

/// How a sampler is while it runs ([`SamplerHealth::get`]): for a server's health check,
/// which otherwise learns only at [`Sampler::stop`] that sampling ended long ago.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// Whether its thread still samples.
    pub running: bool,
    /// Intervals lost whole: the kernel's buffers could not be drained, or building or
    /// storing their profiles panicked (caught: sampling goes on).
    pub failed_intervals: u64,
    /// The last failure, or why sampling ended.
    pub last_error: Option<String>,
}

/// A handle on a sampler's [`Health`], to keep apart from the [`Sampler`] (which its owner
/// stops).
#[derive(Debug, Clone, Default)]
pub struct SamplerHealth(Arc<Mutex<Health>>);

impl SamplerHealth {
    /// The sampler's health now.
    pub fn get(&self) -> Health {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes an interval lost to `why`.
    fn failed(&self, why: String) {
        tracing::error!("eBPF sampler: an interval is lost: {why}");
        let mut h = self.lock();
        h.failed_intervals += 1;
        h.last_error = Some(why);
    }
}

/// Marks the sampler stopped however its thread ends (returning, an error, a panic).
struct Running(SamplerHealth);

impl Drop for Running {
    fn drop(&mut self) {
        let mut h = self.0.lock();
        h.running = false;
        if std::thread::panicking() {
            h.last_error = Some("the sampler's thread panicked".into());
        }
    }
}

/// Drains in a row that may fail before the sampler gives up (each loses its interval).
const MAX_FAILED_DRAINS: u32 = 10;

/// A running sampler. [`Sampler::stop`] (or dropping it) emits the last partial interval
/// and detaches the BPF program from every CPU.
#[derive(Debug)]
pub struct Sampler {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<Result<Stats>>>,
    health: SamplerHealth,
}

impl Sampler {
    /// Loads and attaches the BPF program, then samples on a thread of its own. Returns once
    /// sampling runs, or the reason it cannot ([`Error::NotPermitted`] without privileges).
    pub fn start(config: Config, sink: impl Sink) -> Result<Self> {
        config.validate()?;
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let health = SamplerHealth::default();
        health.lock().running = true;
        let running = Running(health.clone());
        let thread = std::thread::Builder::new()
            .name("frostdb-ebpf".into())
            .spawn(move || {
                let probe = match Probe::attach(&config) {
                    Ok(p) => {
                        let _ = ready_tx.send(Ok(()));
                        p
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(Stats::default());
                    }
                };
                let ended = run(config, probe, sink, stop_rx, &running.0);
                if let Err(e) = &ended {
                    tracing::error!("eBPF sampler: sampling ended: {e}");
                    running.0.lock().last_error = Some(format!("sampling ended: {e}"));
                }
                drop(running);
                ended
            })
            .map_err(|e| Error::Io("spawning the sampler thread".into(), e))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                stop: Some(stop_tx),
                thread: Some(thread),
                health,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(Error::Thread(join_error(thread))),
        }
    }

    /// A handle on how the sampler is while it runs.
    pub fn health(&self) -> SamplerHealth {
        self.health.clone()
    }

    /// Emits the last partial interval, detaches, and returns the totals.
    pub fn stop(mut self) -> Result<Stats> {
        self.finish()
    }

    fn finish(&mut self) -> Result<Stats> {
        drop(self.stop.take());
        match self.thread.take() {
            Some(t) => t.join().map_err(|p| Error::Thread(panic_text(&p)))?,
            None => Ok(Stats::default()),
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::error!("eBPF sampler: {e}");
        }
    }
}

fn join_error(thread: JoinHandle<Result<Stats>>) -> String {
    match thread.join() {
        Ok(Ok(_)) => "it ended before attaching".into(),
        Ok(Err(e)) => e.to_string(),
        Err(p) => panic_text(&p),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panic".into())
}

fn run(
    config: Config,
    mut probe: Probe,
    mut sink: impl Sink,
    stop: mpsc::Receiver<()>,
    health: &SamplerHealth,
) -> Result<Stats> {
    let mut symbolizer = Symbolizer::new();
    let mut stats = Stats {
        cpus: probe.cpus(),
        ..Stats::default()
    };
    let mut start_ms = now_ms();
    let mut next = Instant::now() + config.interval;
    let mut failed_drains = 0;
    loop {
        let last = match stop.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
        };
        next += config.interval;
        let end_ms = now_ms();
        let drain_started = Instant::now();
        // A drain that fails loses its interval (the next covers its time); only failing
        // drain after drain ends sampling.
        let (raw, counts) = match probe.drain() {
            Ok(drained) => {
                failed_drains = 0;
                drained
            }
            Err(e) => {
                failed_drains += 1;
                health.failed(format!("draining the kernel's buffers: {e}"));
                if failed_drains >= MAX_FAILED_DRAINS {
                    return Err(e);
                }
                if last {
                    break;
                }
                continue;
            }
        };
        let drained = drain_started.elapsed();
        let refresh_started = Instant::now();
        if config.unwind_table_bytes > 0 {
            let mut pids: Vec<u32> = raw.iter().map(|s| s.pid).collect();
            pids.sort_unstable();
            pids.dedup();
            probe.tables.refresh(&pids);
        }
        let tables_refresh = refresh_started.elapsed();
        let before = symbolizer.stats;
        let build_started = Instant::now();
        // Symbolizing reads whatever executables the host runs: a panic there loses the
        // interval and the symbolizer's state, not the sampler.
        let profiles = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            build(&config, &mut symbolizer, raw, start_ms, end_ms - start_ms)
        })) {
            Ok(profiles) => profiles,
            Err(panic) => {
                health.failed(format!(
                    "building its profiles panicked: {}",
                    panic_text(&panic)
                ));
                symbolizer = Symbolizer::new();
                start_ms = end_ms;
                if last {
                    break;
                }
                continue;
            }
        };
        symbolizer.end_interval();
        let built = build_started.elapsed();
        let after = symbolizer.stats;
        let interval = Interval {
            start_ms,
            duration_ms: end_ms - start_ms,
            samples: counts.sampled,
            dropped: counts.dropped,
            symbolize: after.elapsed - before.elapsed,
            drain: drained,
            build: built,
            addresses: (
                after.addresses - before.addresses,
                after.cache_hits - before.cache_hits,
            ),
            tables: probe.tables.stats(),
            tables_refresh,
            profiles,
        };
        stats.intervals += 1;
        stats.samples += interval.samples;
        stats.dropped += interval.dropped;
        stats.unaccounted += counts.unaccounted;
        stats.missing_stacks += counts.missing_stacks;
        stats.stale_entries += counts.stale_entries;
        tracing::debug!(
            processes = interval.profiles.len(),
            samples = interval.samples,
            dropped = interval.dropped,
            symbolize_ms = interval.symbolize.as_secs_f64() * 1e3,
            tables_ms = interval.tables_refresh.as_secs_f64() * 1e3,
            table_files = interval.tables.files,
            table_bytes = interval.tables.bytes,
            addresses = interval.addresses.0,
            cached = interval.addresses.1,
            "eBPF interval"
        );
        if interval.dropped > 0 {
            tracing::warn!(
                dropped = interval.dropped,
                "eBPF count map full: samples lost"
            );
        }
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink.write(interval))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                stats.sink_errors += 1;
                tracing::warn!("eBPF sampler: the sink refused an interval: {e}");
            }
            Err(panic) => {
                stats.sink_errors += 1;
                health.failed(format!("its sink panicked: {}", panic_text(&panic)));
            }
        }
        start_ms = end_ms;
        if last {
            break;
        }
    }
    stats.kernel = probe.totals()?;
    stats.symbolize = symbolizer.stats;
    stats.tables = probe.tables.stats();
    probe.detach();
    tracing::info!(
        intervals = stats.intervals,
        samples = stats.samples,
        "eBPF sampler detached"
    );
    Ok(stats)
}

/// Groups the raw samples by process, symbolizes them, and builds a profile per process.
fn build(
    config: &Config,
    symbolizer: &mut Symbolizer,
    raw: Vec<RawSample>,
    start_ms: i64,
    duration_ms: i64,
) -> Vec<ProcessProfile> {
    let mut by_pid: BTreeMap<u32, Vec<RawSample>> = BTreeMap::new();
    for mut s in raw {
        to_call_sites(&mut s.kernel);
        to_call_sites(&mut s.user);
        by_pid.entry(s.pid).or_default().push(s);
    }
    // Kernel addresses: one lookup for all processes.
    let kernel = unique(by_pid.values().flatten().flat_map(|s| &s.kernel));
    let kernel: HashMap<u64, _> = kernel
        .iter()
        .copied()
        .zip(symbolizer.kernel(&kernel))
        .collect();
    let period = config.period_ns() as i64;
    let no_stack = Resolved::placeholder("[stack not readable]");
    let mut out = Vec::with_capacity(by_pid.len());
    for (pid, samples) in by_pid {
        let info = ProcessInfo::read(pid, &samples[0].comm);
        let user = unique(samples.iter().flat_map(|s| &s.user));
        let user: HashMap<u64, _> = user
            .iter()
            .copied()
            .zip(symbolizer.user(pid, &info, &user))
            .collect();
        let mut builder =
            ProfileBuilder::new(start_ms * 1_000_000, duration_ms * 1_000_000, period);
        let mut total = 0;
        for s in &samples {
            let mut ids = Vec::with_capacity(s.kernel.len() + s.user.len());
            for a in &s.kernel {
                ids.push(builder.location(&kernel[a]));
            }
            for a in &s.user {
                ids.push(builder.location(&user[a]));
            }
            // A table walk cut short: say so at the root.
            if let Some(root) = s.user_end.and_then(|e| e.root_frame())
                && !s.user.is_empty()
            {
                ids.push(builder.location(&Resolved::placeholder(root)));
            }
            if ids.is_empty() {
                ids.push(builder.location(&no_stack));
            }
            builder.sample(ids, s.count);
            total += s.count;
        }
        out.push(ProcessProfile {
            pid,
            info,
            samples: total,
            profile: builder.finish(),
        });
    }
    out
}

/// Every frame of a stack but its innermost is a return address: the instruction after a
/// call. After a call that does not return (a `noreturn` function, a panic), that is already
/// the next function's first byte or padding, and would be named as the next function or
/// not at all. One byte back is inside the call, named as the caller; pprof allows it ("a
/// non-leaf address may be in the middle of a call instruction"). The innermost frame is
/// the interrupted instruction (or, for the user part of a sample taken in the kernel, the
/// one after `syscall`, still inside its function) and stays as it is.
fn to_call_sites(frames: &mut [u64]) {
    for a in frames.iter_mut().skip(1) {
        *a = a.saturating_sub(1);
    }
}

/// The distinct addresses, each once.
fn unique<'a>(addresses: impl Iterator<Item = &'a u64>) -> Vec<u64> {
    let set: HashSet<u64> = addresses.copied().collect();
    set.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_addresses_become_call_sites_and_the_innermost_frame_stays() {
        let mut frames = [0x1000, 0x2005, 0x3000];
        to_call_sites(&mut frames);
        assert_eq!(frames, [0x1000, 0x2004, 0x2fff]);
        let mut none: [u64; 0] = [];
        to_call_sites(&mut none);
        let mut zero = [7, 0];
        to_call_sites(&mut zero);
        assert_eq!(zero, [7, 0]);
    }
}
