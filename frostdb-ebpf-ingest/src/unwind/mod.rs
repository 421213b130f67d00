//! Unwinding native code built without frame pointers.
//!
//! Most native code in a fleet is built without frame pointers (distribution packages,
//! release builds of C, C++ and Rust): walking `rbp` there loses callers or reads garbage.
//! What such code always has is `.eh_frame`, the call frame information (CFI) that C++
//! exceptions and Rust panics unwind with. It is a bytecode per function (an FDE) that a
//! debugger interprets; a BPF program cannot. So, as Parca Agent and the OpenTelemetry eBPF
//! profiler do, user space interprets it ahead of time into a flat [`UnwindTable`] per
//! binary: one [`UnwindRow`] per address range, saying where the canonical frame address
//! (CFA: the stack pointer before the call) is and where the caller's `rbp` was saved. The
//! return address is at CFA − 8 on x86-64. Rows are sorted and compacted (a row equal to
//! the one before is dropped), so the kernel side finds a pc's row with a binary search and
//! unwinds a frame with two reads of user memory.
//!
//! [`table::compile`] builds a table from an ELF file's bytes. [`walk`] is the unwinder the
//! BPF program runs (`src/bpf/sampler.bpf.c`, `step`), in user space over a live process's
//! tables: the reference its tests hold the kernel side to. `loader` keeps the tables of
//! the sampled processes in the program's maps, once per build id and shared by every
//! process mapping the file.

pub(crate) mod loader;
pub mod table;
pub mod walk;

pub use loader::TableStats;
pub use table::{Cfa, SavedRbp, UnwindRow, UnwindStats, UnwindTable, compile};
pub use walk::{End, ProcessTables, Registers, Unwound};
