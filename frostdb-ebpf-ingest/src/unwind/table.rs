//! `.eh_frame` → [`UnwindTable`]: the CFI of every function of one ELF file, interpreted
//! into sorted, compacted rows (see the [module](super) documentation).

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use object::{Object, ObjectSection};

use crate::error::{Error, Result};

/// Where the canonical frame address (the caller's stack pointer before its call) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cfa {
    /// `rsp + offset`: most code.
    Rsp(i32),
    /// `rbp + offset`: functions that set up a frame pointer (and `alloca` users).
    Rbp(i32),
    /// A procedure linkage table entry: `rsp + 8`, plus 8 more once the entry has pushed its
    /// relocation index (at or past byte 11 of its 16). The DWARF expression every linker
    /// emits for `.plt` says exactly this.
    Plt,
    /// A signal trampoline (`__restore_rt`): the interrupted frame's registers are in the
    /// `ucontext` on the stack.
    Signal,
    /// The outermost frame (`_start`, a thread's entry): its CFI says the return address
    /// is undefined, so the stack is whole here.
    Outermost,
    /// No CFI covers this address (a gap between functions): the unwinder falls back to
    /// the frame pointer, if the code has one.
    None,
    /// CFI the unwinder does not follow (another expression, another register): unwinding
    /// stops here, and the stop is counted.
    Unsupported,
}

/// Where the caller's `rbp` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SavedRbp {
    /// Still in `rbp` (not saved, or not yet clobbered).
    Unchanged,
    /// Saved at `CFA + offset`.
    AtCfa(i16),
    /// Somewhere the unwinder does not follow: frames above this one cannot use `rbp`.
    Unsupported,
}

/// From `pc` (an ELF virtual address of the file) up to the next row's `pc`: how to find
/// the caller's frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// The first address the row covers.
    pub pc: u64,
    /// The canonical frame address.
    pub cfa: Cfa,
    /// The caller's `rbp`.
    pub rbp: SavedRbp,
}

impl UnwindRow {
    /// Bytes of a row as the kernel side stores it: pc (8), CFA offset (4), rbp offset
    /// (2), CFA kind (1), rbp kind (1).
    pub const ENCODED_BYTES: usize = 16;

    /// The row as the kernel side stores it (little-endian, [`Self::ENCODED_BYTES`]).
    pub fn encode(&self) -> [u8; Self::ENCODED_BYTES] {
        let (cfa_kind, cfa_offset) = match self.cfa {
            Cfa::None => (0u8, 0i32),
            Cfa::Rsp(o) => (1, o),
            Cfa::Rbp(o) => (2, o),
            Cfa::Plt => (3, 0),
            Cfa::Signal => (4, 0),
            Cfa::Unsupported => (5, 0),
            Cfa::Outermost => (6, 0),
        };
        let (rbp_kind, rbp_offset) = match self.rbp {
            SavedRbp::Unchanged => (0u8, 0i16),
            SavedRbp::AtCfa(o) => (1, o),
            SavedRbp::Unsupported => (2, 0),
        };
        let mut out = [0u8; Self::ENCODED_BYTES];
        out[..8].copy_from_slice(&self.pc.to_le_bytes());
        out[8..12].copy_from_slice(&cfa_offset.to_le_bytes());
        out[12..14].copy_from_slice(&rbp_offset.to_le_bytes());
        out[14] = cfa_kind;
        out[15] = rbp_kind;
        out
    }
}

/// What compiling a file's CFI found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Functions (FDEs) read.
    pub functions: usize,
    /// Rows the CFI describes, before compaction.
    pub rows_read: usize,
    /// Rows whose CFA the unwinder does not follow ([`Cfa::Unsupported`]).
    pub unsupported_cfa: usize,
    /// Rows whose saved `rbp` it does not follow ([`SavedRbp::Unsupported`]).
    pub unsupported_rbp: usize,
}

/// The unwind rows of one ELF file, sorted by `pc`, no two neighbours alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnwindTable {
    rows: Vec<UnwindRow>,
    stats: UnwindStats,
}

impl UnwindTable {
    /// The rows, sorted by `pc`.
    pub fn rows(&self) -> &[UnwindRow] {
        &self.rows
    }

    /// What compiling found.
    pub fn stats(&self) -> UnwindStats {
        self.stats
    }

    /// Bytes the table takes in the kernel ([`UnwindRow::ENCODED_BYTES`] a row).
    pub fn encoded_bytes(&self) -> usize {
        self.rows.len() * UnwindRow::ENCODED_BYTES
    }

    /// The row covering `pc` (an ELF virtual address of the file): the last row starting at
    /// or before it. `None` below the first row. What the kernel side's binary search does.
    pub fn lookup(&self, pc: u64) -> Option<&UnwindRow> {
        let after = self.rows.partition_point(|r| r.pc <= pc);
        after.checked_sub(1).map(|i| &self.rows[i])
    }

    /// Sorts `rows`, lets a function's rows run on to where the next function starts (an end
    /// marker, [`Cfa::None`], only where code without CFI may follow: not alignment
    /// padding), and drops every row equal to the one before it.
    fn from_ranges(mut ranges: Vec<(u64, u64, Vec<UnwindRow>)>, stats: UnwindStats) -> Self {
        ranges.sort_by_key(|r| r.0);
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(stats.rows_read);
        let push = |row: UnwindRow, rows: &mut Vec<UnwindRow>| match rows.last_mut() {
            // Same start (an empty range before it): the later row wins.
            Some(last) if last.pc == row.pc => *last = row,
            Some(last) if (last.cfa, last.rbp) == (row.cfa, row.rbp) => {}
            _ => rows.push(row),
        };
        for (i, (_, end, fde_rows)) in ranges.iter().enumerate() {
            for row in fde_rows {
                push(*row, &mut rows);
            }
            let next_start = ranges.get(i + 1).map(|r| r.0);
            if !next_start.is_some_and(|next| is_padding(*end, next)) {
                push(
                    UnwindRow {
                        pc: *end,
                        cfa: Cfa::None,
                        rbp: SavedRbp::Unchanged,
                    },
                    &mut rows,
                );
            }
        }
        // Leading "no CFI" rows say nothing a failed lookup would not.
        let first = rows
            .iter()
            .position(|r| r.cfa != Cfa::None)
            .unwrap_or(rows.len());
        rows.drain(..first);
        Self { rows, stats }
    }
}

/// Whether the bytes from `end` (where a function's CFI ends) to `next` (where the next
/// function's starts) can only be the padding that aligns `next` to 16 bytes: never
/// executed, so never sampled, and not worth a row (one per function otherwise).
pub(crate) fn is_padding(end: u64, next: u64) -> bool {
    next >= end && next - end < 16 && next.is_multiple_of(16)
}

/// Whether `expression` is the CFA expression linkers emit for `.plt` entries:
/// `rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)`, i.e. `DW_OP_breg7 8; DW_OP_breg16 0;
/// DW_OP_lit15; DW_OP_and; DW_OP_lit11 (or lit10); DW_OP_ge; DW_OP_lit3; DW_OP_shl;
/// DW_OP_plus`.
fn is_plt_expression(expression: &[u8]) -> bool {
    matches!(
        expression,
        [
            0x77,
            0x08,
            0x80,
            0x00,
            0x3f,
            0x1a,
            0x3b | 0x3a,
            0x2a,
            0x33,
            0x24,
            0x22
        ]
    )
}

/// Largest `.eh_frame` read: it is read whole, and each byte may make a row (24 bytes
/// while the table is built). The largest real binaries have tens of megabytes.
const MAX_EH_FRAME_BYTES: u64 = 64 << 20;

/// Most rows read from one `.eh_frame`, far more than an unwind table holds.
const MAX_ROWS_READ: usize = 8 << 20;

/// Largest CIE (its initial instructions run again for each of its functions; real ones
/// are a few dozen bytes).
const MAX_CIE_BYTES: u64 = 1 << 10;

/// Bytes of instructions evaluated for each byte of `.eh_frame`: a function's CIE is read
/// again for each, so one CIE of megabytes of no-ops shared by many small functions was
/// hours of work. Real files evaluate about two.
const CFI_READS_PER_BYTE: u64 = 8;

/// Interprets the `.eh_frame` of the ELF file `elf` into its unwind table. A file without
/// `.eh_frame` has an empty table (the unwinder then relies on frame pointers); one whose
/// CFI cannot be read is an error naming what is wrong.
pub fn compile(elf: &[u8]) -> Result<UnwindTable> {
    let file =
        object::File::parse(elf).map_err(|e| Error::Unwind(format!("not an ELF file: {e}")))?;
    compile_file(&file)
}

/// [`compile`] for a parsed file, which may be read on demand (an `object::ReadCache`
/// reads only the sections used, not a binary's gigabyte of debug info).
pub(crate) fn compile_file<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
) -> Result<UnwindTable> {
    let bad = |what: String| Error::Unwind(what);
    if file.architecture() != object::Architecture::X86_64 {
        return Err(bad(format!(
            "{:?} code: only x86-64 unwind tables are built",
            file.architecture()
        )));
    }
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Ok(UnwindTable::default());
    };
    if section.size() > MAX_EH_FRAME_BYTES {
        return Err(bad(format!(
            ".eh_frame of {} bytes (at most {MAX_EH_FRAME_BYTES} are read)",
            section.size()
        )));
    }
    let data = section.data().map_err(|e| bad(format!(".eh_frame: {e}")))?;
    let eh_frame = EhFrame::new(data, LittleEndian);
    // What evaluating it may read: each function's instructions after its CIE's, which
    // gimli evaluates again for each function.
    let mut budget = (data.len() as u64).saturating_mul(CFI_READS_PER_BYTE) + (1 << 20);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let mut stats = UnwindStats::default();
    let mut ranges = Vec::new();
    let mut context = Box::new(UnwindContext::new());
    let mut entries = eh_frame.entries(&bases);
    while let Some(entry) = entries.next().map_err(|e| bad(format!(".eh_frame: {e}")))? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial
            .parse(|section, bases, offset| section.cie_from_offset(bases, offset))
            .map_err(|e| bad(format!(".eh_frame FDE: {e}")))?;
        stats.functions += 1;
        let cie = fde.cie().entry_len() as u64;
        if cie > MAX_CIE_BYTES {
            return Err(bad(format!(
                ".eh_frame CIE of {cie} bytes (at most {MAX_CIE_BYTES})"
            )));
        }
        budget = budget
            .checked_sub(cie + fde.entry_len() as u64)
            .ok_or_else(|| {
                bad(format!(
                    ".eh_frame whose evaluation reads more than {CFI_READS_PER_BYTE} times its bytes"
                ))
            })?;
        let signal = fde.is_signal_trampoline();
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start >= end {
            continue;
        }
        let mut rows = Vec::new();
        let mut table = fde
            .rows(&eh_frame, &bases, &mut context)
            .map_err(|e| bad(format!(".eh_frame FDE at {start:#x}: {e}")))?;
        while let Some(row) = table
            .next_row()
            .map_err(|e| bad(format!(".eh_frame FDE at {start:#x}: {e}")))?
        {
            stats.rows_read += 1;
            if stats.rows_read > MAX_ROWS_READ {
                return Err(bad(format!(".eh_frame of more than {MAX_ROWS_READ} rows")));
            }
            let ra = row.register(X86_64::RA);
            let cfa = match row.cfa() {
                _ if signal => Cfa::Signal,
                _ if ra == Some(RegisterRule::Undefined) => Cfa::Outermost,
                _ if ra != Some(RegisterRule::Offset(-8)) => Cfa::Unsupported,
                CfaRule::RegisterAndOffset { register, offset } => {
                    match (*register, i32::try_from(*offset)) {
                        (X86_64::RSP, Ok(o)) => Cfa::Rsp(o),
                        (X86_64::RBP, Ok(o)) => Cfa::Rbp(o),
                        _ => Cfa::Unsupported,
                    }
                }
                CfaRule::Expression(expression) => match expression.get(&eh_frame) {
                    Ok(e) if is_plt_expression(e.0.slice()) => Cfa::Plt,
                    _ => Cfa::Unsupported,
                },
            };
            let rbp = match row.register(X86_64::RBP) {
                None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => {
                    SavedRbp::Unchanged
                }
                Some(RegisterRule::Offset(o)) => {
                    i16::try_from(o).map_or(SavedRbp::Unsupported, SavedRbp::AtCfa)
                }
                Some(_) => SavedRbp::Unsupported,
            };
            stats.unsupported_cfa += usize::from(cfa == Cfa::Unsupported);
            stats.unsupported_rbp += usize::from(rbp == SavedRbp::Unsupported);
            rows.push(UnwindRow {
                pc: row.start_address(),
                cfa,
                rbp,
            });
        }
        ranges.push((start, end, rows));
    }
    Ok(UnwindTable::from_ranges(ranges, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u64, cfa: Cfa) -> UnwindRow {
        UnwindRow {
            pc,
            cfa,
            rbp: SavedRbp::Unchanged,
        }
    }

    #[test]
    fn rows_are_sorted_equal_neighbours_dropped_and_gaps_marked() {
        let table = UnwindTable::from_ranges(
            vec![
                // Out of order, as FDEs may be.
                (
                    0x200,
                    0x210,
                    vec![row(0x200, Cfa::Rsp(8)), row(0x201, Cfa::Rsp(16))],
                ),
                (
                    0x100,
                    0x180,
                    vec![row(0x100, Cfa::Rsp(8)), row(0x104, Cfa::Rsp(8))],
                ),
                // Starts where the one before ends: no end marker between them, and its
                // first row equals the previous function's last one.
                (
                    0x210,
                    0x220,
                    vec![row(0x210, Cfa::Rsp(16)), row(0x211, Cfa::Rbp(16))],
                ),
            ],
            UnwindStats::default(),
        );
        assert_eq!(
            table.rows(),
            [
                row(0x100, Cfa::Rsp(8)),
                row(0x180, Cfa::None),
                row(0x200, Cfa::Rsp(8)),
                row(0x201, Cfa::Rsp(16)),
                row(0x211, Cfa::Rbp(16)),
                row(0x220, Cfa::None),
            ]
        );
        assert_eq!(table.lookup(0x0ff), None);
        assert_eq!(table.lookup(0x17f).unwrap().cfa, Cfa::Rsp(8));
        assert_eq!(table.lookup(0x180).unwrap().cfa, Cfa::None);
        assert_eq!(table.lookup(0x215).unwrap().cfa, Cfa::Rbp(16));
        assert_eq!(table.lookup(u64::MAX).unwrap().cfa, Cfa::None);
    }

    #[test]
    fn alignment_padding_before_the_next_function_gets_no_end_marker() {
        let table = UnwindTable::from_ranges(
            vec![
                (0x100, 0x1f5, vec![row(0x100, Cfa::Rsp(16))]),
                // 11 bytes of padding to a 16-aligned start.
                (0x200, 0x208, vec![row(0x200, Cfa::Rsp(8))]),
                // 8 bytes to an aligned start: padding again.
                (0x210, 0x21c, vec![row(0x210, Cfa::Rsp(16))]),
                // 8 bytes to a start that is not aligned: code without CFI may be there.
                (0x224, 0x230, vec![row(0x224, Cfa::Rsp(8))]),
            ],
            UnwindStats::default(),
        );
        assert_eq!(
            table.rows(),
            [
                row(0x100, Cfa::Rsp(16)),
                row(0x200, Cfa::Rsp(8)),
                row(0x210, Cfa::Rsp(16)),
                row(0x21c, Cfa::None),
                row(0x224, Cfa::Rsp(8)),
                row(0x230, Cfa::None),
            ]
        );
    }

    #[test]
    fn rows_encode_to_sixteen_little_endian_bytes() {
        let r = UnwindRow {
            pc: 0x1122_3344_5566_7788,
            cfa: Cfa::Rbp(-40),
            rbp: SavedRbp::AtCfa(-16),
        };
        let e = r.encode();
        assert_eq!(u64::from_le_bytes(e[..8].try_into().unwrap()), r.pc);
        assert_eq!(i32::from_le_bytes(e[8..12].try_into().unwrap()), -40);
        assert_eq!(i16::from_le_bytes(e[12..14].try_into().unwrap()), -16);
        assert_eq!((e[14], e[15]), (2, 1));
    }

    #[test]
    fn the_plt_expression_is_recognized_and_others_are_not() {
        let plt = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert!(is_plt_expression(&plt));
        let mut other = plt;
        other[1] = 0x10;
        assert!(!is_plt_expression(&other));
        assert!(!is_plt_expression(&plt[..10]));
    }

    /// An x86-64 ELF file of one `.eh_frame` section holding `eh_frame`, stating its size
    /// as `stated` (its length when `None`).
    fn elf_of(eh_frame: &[u8], stated: Option<u64>) -> Vec<u8> {
        let names = b"\0.shstrtab\0.eh_frame\0";
        let data_at = 64u64;
        let names_at = data_at + eh_frame.len() as u64;
        let headers_at = names_at + names.len() as u64;
        let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
        elf.resize(16, 0);
        elf.extend(3u16.to_le_bytes()); // shared object
        elf.extend(62u16.to_le_bytes()); // x86-64
        elf.extend(1u32.to_le_bytes());
        elf.extend([0u8; 16]); // entry, program headers
        elf.extend(headers_at.to_le_bytes());
        elf.extend(0u32.to_le_bytes());
        for half in [64u16, 0, 0, 64, 3, 1] {
            elf.extend(half.to_le_bytes());
        }
        elf.extend(eh_frame);
        elf.extend(names);
        let mut header = |name: u32, kind: u32, addr: u64, at: u64, size: u64| {
            elf.extend(name.to_le_bytes());
            elf.extend(kind.to_le_bytes());
            elf.extend(2u64.to_le_bytes()); // SHF_ALLOC
            elf.extend(addr.to_le_bytes());
            elf.extend(at.to_le_bytes());
            elf.extend(size.to_le_bytes());
            elf.extend([0u8; 8]); // link, info
            elf.extend(1u64.to_le_bytes());
            elf.extend(0u64.to_le_bytes());
        };
        header(0, 0, 0, 0, 0);
        header(1, 3, 0, names_at, names.len() as u64);
        let size = stated.unwrap_or(eh_frame.len() as u64);
        header(11, 1, 0x1000, data_at, size);
        elf
    }

    /// `.eh_frame` of one CIE whose initial instructions are `initial`, and `fdes`
    /// functions of 16 bytes each using it, whose own instructions are `instructions`.
    fn cfi(initial: &[u8], fdes: usize, instructions: &[u8]) -> Vec<u8> {
        let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x03];
        cie.extend(initial);
        while (cie.len() + 4) % 4 != 0 {
            cie.push(0);
        }
        let mut out = (cie.len() as u32).to_le_bytes().to_vec();
        out.extend(&cie);
        for i in 0..fdes {
            let mut fde = Vec::new();
            fde.extend((out.len() as u32 + 4).to_le_bytes()); // back to the CIE
            fde.extend((0x2000 + 16 * i as u32).to_le_bytes());
            fde.extend(16u32.to_le_bytes());
            fde.push(0); // no augmentation data
            fde.extend(instructions);
            while (fde.len() + 4) % 4 != 0 {
                fde.push(0);
            }
            out.extend((fde.len() as u32).to_le_bytes());
            out.extend(fde);
        }
        out
    }

    /// CFI that would take much more work or memory to evaluate than its bytes is refused
    /// before it is, naming why: a CIE of kilobytes (run again for each of its functions),
    /// many functions sharing a long CIE, a row per byte past the rows an unwind table
    /// could hold, and an `.eh_frame` stated larger than any binary's. Before, one CIE of
    /// megabytes of no-ops shared by a quarter of a million functions was an hour of the
    /// sampler's thread, and 400 MB of one-byte rows 10 GB.
    #[test]
    fn cfi_costlier_than_its_bytes_is_refused_before_it_is_evaluated() {
        // def_cfa rsp+8; offset rip at cfa-8: what compilers write.
        let usual = [0x0c, 0x07, 0x08, 0x90, 0x01];
        let table = compile(&elf_of(&cfi(&usual, 3, &[]), None)).unwrap();
        assert_eq!(table.stats.functions, 3);
        assert_eq!(table.lookup(0x2004).unwrap().cfa, Cfa::Rsp(8));
        let refused =
            |eh_frame: &[u8], stated: Option<u64>| match compile(&elf_of(eh_frame, stated)) {
                Err(Error::Unwind(e)) => e,
                other => panic!("{:?}", other.map(|t| t.stats)),
            };
        let mut long = usual.to_vec();
        long.resize(2000, 0); // DW_CFA_nop
        let e = refused(&cfi(&long, 1, &[]), None);
        assert!(e.contains("CIE of"), "{e}");
        long.truncate(1000);
        let e = refused(&cfi(&long, 2000, &[]), None);
        assert!(e.contains("times its bytes"), "{e}");
        let e = refused(&cfi(&usual, 1, &vec![0x40; MAX_ROWS_READ + 1]), None);
        assert!(e.contains("rows"), "{e}");
        let e = refused(&cfi(&usual, 1, &[]), Some(MAX_EH_FRAME_BYTES + 1));
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn what_is_not_an_x86_64_elf_file_is_an_error() {
        assert!(matches!(compile(b"not elf"), Err(Error::Unwind(_))));
    }
}
