//! Whole-system eBPF stack sampling into frostdb-rs tables.
//!
//! The data flows one way:
//!
//! - `bpf/sampler.bpf.c` (C, compiled by clang in `build.rs`): on every CPU-clock tick of
//!   every online CPU, keeps the sample if its process passes the filter and counts
//!   (pid, thread name, user stack, kernel stack) in one of two buffers in the kernel.
//! - [`probe`](crate::probe) loads and attaches it with aya and drains the buffers,
//!   double-buffered: nothing is lost or counted twice across a swap.
//! - `symbolize` turns addresses into frames with blazesym (user code via
//!   `/proc/<pid>/maps` and build ids, the kernel via /proc/kallsyms), cached by build id.
//! - `profile` builds one pprof profile per process per interval, and the [`Sampler`]
//!   hands them to a [`Sink`]: a channel, a closure, or [`StoreSink`], which writes them
//!   through the pprof normalizer into a [`frostdb_pprof::ProfileStore`].
//!
//! ```no_run
//! use frostdb_ebpf_ingest::{Config, Sampler, Target};
//! let (tx, rx) = std::sync::mpsc::channel();
//! let sampler = Sampler::start(Config::default().target(Target::Pids(vec![1])), tx)?;
//! for interval in rx.iter().take(1) {
//!     for p in &interval.profiles {
//!         println!("{} ({}): {} samples", p.info.comm, p.pid, p.samples);
//!     }
//! }
//! sampler.stop()?;
//! # Ok::<(), frostdb_ebpf_ingest::Error>(())
//! ```

mod config;
mod error;
mod probe;
mod procfs;
mod profile;
mod sampler;
mod sink;
mod symbolize;
pub mod unwind;

pub use config::{Config, DEFAULT_UNWIND_TABLE_BYTES, MAX_UNWIND_TABLE_BYTES, Target};
pub use error::{Error, Result};
pub use probe::{DrainCounts, KernelTotals, UserEnd, UserWalks};
pub use procfs::{
    ExecutableMapping, ProcessInfo, VDSO, check_permitted, executable_mappings, read_vdso,
};
pub use sampler::{
    Health, Interval, ProcessProfile, Sampler, SamplerHealth, Sink, SinkError, Stats,
};
pub use sink::{PROFILE_NAME, StoreSink};
pub use symbolize::SymbolizeStats;
pub use unwind::TableStats;
