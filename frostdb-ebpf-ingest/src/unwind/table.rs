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
    let data = section.data().map_err(|e| bad(format!(".eh_frame: {e}")))?;
    let eh_frame = EhFrame::new(data, LittleEndian);
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

    #[test]
    fn what_is_not_an_x86_64_elf_file_is_an_error() {
        assert!(matches!(compile(b"not elf"), Err(Error::Unwind(_))));
    }
}
