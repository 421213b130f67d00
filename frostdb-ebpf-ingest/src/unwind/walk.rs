//! The unwinder the BPF program is to run, in user space: the same steps over the same
//! tables, so its tests pin down the algorithm (load bias, row lookup, CFA arithmetic, the
//! reads of user memory) on real processes before it is written in C for the kernel.
//!
//! A frame is unwound in four steps. Find the executable mapping holding `ip` and turn `ip`
//! into the file's ELF virtual address (`ip - bias`); find that address's row (for every
//! frame but the first, `ip - 1`: a return address may point just past the end of a
//! function that ends in a call); compute the CFA from `rsp` or `rbp`; read the return
//! address at CFA − 8 and the caller's `rbp` where the row says it was saved. The caller's
//! `rsp` is the CFA. A signal trampoline's frame instead holds the interrupted registers,
//! and the walk goes on from the interrupted instruction.

use std::collections::HashMap;

use object::{Object, ObjectSegment};

use super::table::{Cfa, SavedRbp, UnwindTable, compile};
use crate::error::{Error, Result};
use crate::procfs::ExecutableMapping;

/// The registers an unwind starts from (what a perf event or `/proc/<pid>/syscall` gives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registers {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer register (whatever it holds in code without frame pointers).
    pub bp: u64,
}

/// Where `uc_mcontext` (the interrupted registers) is in the `ucontext` a signal frame
/// starts with on x86-64: after `uc_flags` (8), `uc_link` (8) and `uc_stack` (24).
const UC_MCONTEXT: u64 = 40;

/// Why an unwind stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// At the outermost frame: the stack is whole.
    Complete,
    /// `ip` is in no executable file mapping (anonymous memory: JIT code, the vDSO).
    NotMapped(u64),
    /// `ip`'s file has CFI the unwinder does not follow there.
    Unsupported(u64),
    /// No CFI covers `ip`, and the frame pointer led nowhere readable.
    NoCfi(u64),
    /// Stack memory could not be read at this address.
    Unreadable(u64),
    /// The frame limit was reached.
    TooDeep,
}

/// A stack: return addresses innermost first (the first is the sampled `ip`), and why the
/// walk ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwound {
    /// Instruction pointers, innermost first.
    pub frames: Vec<u64>,
    /// Why the walk stopped.
    pub end: End,
}

/// An executable file mapping: addresses `start..end` are the file's ELF virtual addresses
/// plus `bias`.
#[derive(Debug, Clone)]
struct Mapping {
    start: u64,
    end: u64,
    bias: u64,
    table: usize,
}

/// A process's executable mappings with the unwind table of each file.
#[derive(Debug, Default)]
pub struct ProcessTables {
    mappings: Vec<Mapping>,
    tables: Vec<UnwindTable>,
}

impl ProcessTables {
    /// Reads `/proc/<pid>/maps` and builds the table of every file mapped executable
    /// (through `/proc/<pid>/root`, so a process in another mount namespace works too).
    pub fn read(pid: u32) -> Result<Self> {
        let mut out = Self::default();
        // Per file: its table and its loadable segments.
        let mut by_path: HashMap<String, (usize, Vec<Segment>)> = HashMap::new();
        for m in crate::procfs::executable_mappings(pid)? {
            if !by_path.contains_key(&m.path) {
                let bytes = if m.path == crate::procfs::VDSO {
                    crate::procfs::read_vdso(pid, &m).ok()
                } else {
                    std::fs::read(format!("/proc/{pid}/root{}", m.path)).ok()
                };
                let Some(bytes) = bytes else {
                    continue; // deleted since it was mapped: its frames end the walk
                };
                let table =
                    compile(&bytes).map_err(|e| Error::Unwind(format!("{}: {e}", m.path)))?;
                out.tables.push(table);
                by_path.insert(m.path.clone(), (out.tables.len() - 1, segments(&bytes)));
            }
            let (table, segments) = &by_path[&m.path];
            let Some(bias) = load_bias(segments, &m) else {
                continue;
            };
            out.mappings.push(Mapping {
                start: m.start,
                end: m.end,
                bias,
                table: *table,
            });
        }
        Ok(out)
    }

    /// Unwinds from `regs`, reading stack memory with `read` (8 bytes at an address), at
    /// most `max_frames` frames.
    pub fn unwind(
        &self,
        regs: Registers,
        read: impl Fn(u64) -> Option<u64>,
        max_frames: usize,
    ) -> Unwound {
        let Registers {
            mut ip,
            mut sp,
            mut bp,
        } = regs;
        let mut frames = Vec::new();
        // Whether `ip` is where the code was (the sampled instruction, or one a signal
        // interrupted) rather than a return address.
        let mut exact = true;
        let end = loop {
            if frames.len() == max_frames {
                break End::TooDeep;
            }
            frames.push(ip);
            // A return address points after its call; its row is the call's.
            let lookup = if exact { ip } else { ip - 1 };
            exact = false;
            let Some(mapping) = self.mapping(lookup) else {
                break End::NotMapped(ip);
            };
            let table = &self.tables[mapping.table];
            let row = table.lookup(lookup.wrapping_sub(mapping.bias));
            let cfa = match row.map_or(Cfa::None, |r| r.cfa) {
                Cfa::Rsp(o) => sp.wrapping_add_signed(i64::from(o)),
                Cfa::Rbp(o) => bp.wrapping_add_signed(i64::from(o)),
                Cfa::Plt => sp + 8 + if ip & 15 >= 11 { 8 } else { 0 },
                Cfa::Outermost => break End::Complete,
                Cfa::Signal => {
                    // The signal trampoline: rsp is at the `ucontext` the kernel saved, whose
                    // `uc_mcontext` (at 40) holds the interrupted registers in the order
                    // r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
                    let register = |i: u64| read(sp + UC_MCONTEXT + 8 * i);
                    match (register(10), register(15), register(16)) {
                        (Some(b), Some(s), Some(i)) => (bp, sp, ip) = (b, s, i),
                        _ => break End::Unreadable(sp + UC_MCONTEXT),
                    }
                    // The interrupted instruction itself, not a return address.
                    exact = true;
                    continue;
                }
                Cfa::Unsupported => break End::Unsupported(ip),
                Cfa::None => {
                    // No CFI: the frame pointer, if this code keeps one. A zero rbp there
                    // marks the outermost frame (the ABI's convention; `_start` clears it).
                    if bp == 0 {
                        break End::Complete;
                    }
                    match (read(bp), read(bp + 8)) {
                        (Some(caller_bp), Some(ra)) => {
                            (sp, bp, ip) = (bp + 16, caller_bp, ra);
                            if ip == 0 {
                                break End::Complete;
                            }
                            continue;
                        }
                        _ => break End::NoCfi(ip),
                    }
                }
            };
            let Some(ra) = read(cfa - 8) else {
                break End::Unreadable(cfa - 8);
            };
            bp = match row.map_or(SavedRbp::Unchanged, |r| r.rbp) {
                SavedRbp::Unchanged => bp,
                SavedRbp::AtCfa(o) => {
                    let at = cfa.wrapping_add_signed(i64::from(o));
                    match read(at) {
                        Some(v) => v,
                        None => break End::Unreadable(at),
                    }
                }
                // Frames above may not need it; one that does stops on its own.
                SavedRbp::Unsupported => 0,
            };
            (sp, ip) = (cfa, ra);
            if ip == 0 {
                break End::Complete;
            }
        };
        Unwound { frames, end }
    }

    fn mapping(&self, ip: u64) -> Option<&Mapping> {
        let after = self.mappings.partition_point(|m| m.start <= ip);
        let m = &self.mappings[after.checked_sub(1)?];
        (ip < m.end).then_some(m)
    }
}

/// What `mapping`'s addresses minus the file's virtual addresses are: the executable
/// segment holding the mapping's (page-aligned) file offset gives its address. A segment's
/// offset need not be page-aligned (lld puts code at 0x13ab0 of the file and 0x14ab0 of
/// memory), so its first page starts below it, where the segment before may also reach.
pub(crate) fn load_bias(segments: &[Segment], mapping: &ExecutableMapping) -> Option<u64> {
    let m = mapping;
    segments
        .iter()
        .filter(|s| s.executable)
        .find(|s| s.offset & !0xfff <= m.offset && m.offset < s.offset.saturating_add(s.size))
        .map(|s| m.offset.wrapping_add(s.address.wrapping_sub(s.offset)))
        .map(|vaddr| m.start.wrapping_sub(vaddr))
}

/// A loadable segment of an ELF file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    offset: u64,
    size: u64,
    address: u64,
    executable: bool,
}

/// The loadable segments of an ELF file.
pub(crate) fn segments(elf: &[u8]) -> Vec<Segment> {
    let Ok(file) = object::File::parse(elf) else {
        return Vec::new();
    };
    segments_of(&file)
}

/// The loadable segments of a parsed ELF file.
pub(crate) fn segments_of<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> Vec<Segment> {
    file.segments()
        .map(|s| {
            let (offset, size) = s.file_range();
            let executable = matches!(
                s.flags(),
                object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
            );
            Segment {
                offset,
                size,
                address: s.address(),
                executable,
            }
        })
        .collect()
}
