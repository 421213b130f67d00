//! Whole-system eBPF stack sampling into frostdb-rs tables.
//!
//! What comes here: a sampler that attaches a BPF program (C, compiled with clang) to a CPU
//! clock perf event on every online CPU, aggregates (pid, user stack, kernel stack) counts in
//! the kernel, reads them double-buffered every interval, symbolizes them in user space and
//! writes one profile per process per interval through the pprof normalizer.
