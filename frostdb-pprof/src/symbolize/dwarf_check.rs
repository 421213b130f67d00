//! A debug file's DWARF, checked before blazesym reads it.
//!
//! blazesym parses a function's inlined calls recursively, a pair of stack frames for
//! each `DW_TAG_inlined_subroutine` nested in another: a file of a hundred thousand nested
//! one-byte entries (uploaded by anyone with the API token, or served by a debuginfod) would
//! overflow the stack of the thread reading it, which aborts the process, and again after
//! each restart, when the resolver takes the same locations up again. Real programs nest
//! inlined calls a few dozen deep; a file nesting them deeper than [`MAX_INLINED_NESTING`]
//! is not read, its addresses stay unnamed. The walk is gimli's raw entry reader, which
//! skips attributes without reading them (a loop, never recursion), over `.debug_info`
//! and `.debug_abbrev` only; the file a `.gnu_debuglink` names beside it (which blazesym
//! would read instead) is walked too.
//!
//! The walk is bounded in work as in depth: an abbreviation holds at most
//! [`MAX_ABBREVIATION_ATTRIBUTES`] attributes (checked before gimli parses the table, which
//! takes 16 bytes for each 2-byte attribute), a table at most [`MAX_ABBREV_TABLE_BYTES`],
//! and the walk takes at most [`STEPS_PER_BYTE`] steps (an attribute skipped, a byte of a
//! table parsed) for each byte of the two sections: a small file of one abbreviation of
//! millions of zero-size attributes, used by millions of one-byte entries, was hours of
//! work. Files that name another file blazesym would read unchecked (a debug link with a
//! path, `.gnu_debugaltlink`, `.debug_sup`), and files whose section headers would make
//! parsing them copy many times their bytes, are not read either.

use std::borrow::Cow;

use gimli::Section as _;
use std::io::Read;
use std::path::Path;

use object::{Object, ObjectSection};

/// Most `DW_TAG_inlined_subroutine` entries nested in one another that a file may hold.
pub(crate) const MAX_INLINED_NESTING: usize = 256;

/// Largest DWARF section decompressed for the walk.
const MAX_SECTION_BYTES: u64 = 1 << 30;

/// Most attributes one abbreviation may declare (compilers write a few dozen at most).
pub(crate) const MAX_ABBREVIATION_ATTRIBUTES: usize = 256;

/// Largest abbreviation table (a unit's), in bytes: real ones are a few kilobytes, and
/// gimli's parse of one takes some 20 times its bytes.
pub(crate) const MAX_ABBREV_TABLE_BYTES: usize = 1 << 20;

/// Steps the walk may take for each byte of `.debug_info` and `.debug_abbrev` (real DWARF
/// takes about one: an entry is a byte or more, and most of its attributes are too).
pub(crate) const STEPS_PER_BYTE: u64 = 8;

/// Bytes blazesym keeps for each row of a line program (a `LineRow`, rounded up), and
/// for each file entry besides its path.
const LINE_ROW_BYTES: u64 = 32;
const FILE_ENTRY_BYTES: u64 = 64;

/// Most bytes the line tables of a file may make, for each byte of the file, besides
/// [`LINE_TABLES_SLACK`]: real files make a fraction of their size.
const LINE_TABLES_PER_BYTE: u64 = 64;
const LINE_TABLES_SLACK: u64 = 256 << 20;

/// Most section headers a debug file may have (real ones have a few dozen).
const MAX_SECTIONS: usize = 1 << 16;

/// Most note sections (or, in a file without sections, note segments) a file may have, and
/// the most bytes of each: reading a build id reads every one whole, and `object`'s read
/// cache keeps each range it reads, so thousands of notes overlapping one range of a small
/// file were hundreds of gigabytes. Real files have a handful of notes of a few dozen bytes.
const MAX_NOTES: usize = 64;
const MAX_NOTE_BYTES: u64 = 1 << 20;

/// Refuses a file whose section headers would make `object`'s parse copy many times its
/// bytes, before it is parsed: the parse reads (and keeps, through its read cache) every
/// symbol-index section linked to the symbol table, so thousands of them overlapping one
/// range of a 1 MiB file were gigabytes.
pub(crate) fn sections_fit<'d>(data: impl object::ReadRef<'d>) -> Result<(), String> {
    use object::read::elf::{FileHeader, SectionHeader};
    fn of<'d, Elf: FileHeader<Endian = object::Endianness>>(
        data: impl object::ReadRef<'d>,
    ) -> Result<(), String> {
        let header = Elf::parse(data).map_err(|e| format!("not an object file: {e}"))?;
        let endian = header.endian().map_err(|e| e.to_string())?;
        // blazesym reads every header, and the DWARF, as little-endian, whatever the file
        // says, and ignores `e_shentsize`: a file this check reads otherwise could show it
        // one section table and blazesym another.
        if endian != object::Endianness::Little {
            return Err("a big-endian file (blazesym reads files as little-endian)".into());
        }
        let entry = std::mem::size_of::<Elf::SectionHeader>();
        if usize::from(header.e_shentsize(endian)) != entry && header.e_shnum(endian) != 0 {
            return Err(format!(
                "section headers of {} bytes, not {entry}",
                header.e_shentsize(endian)
            ));
        }
        let sections = header
            .sections(endian, data)
            .map_err(|e| format!("not an object file: {e}"))?;
        let notes: Vec<u64> = if sections.is_empty() {
            use object::read::elf::ProgramHeader;
            header
                .program_headers(endian, data)
                .map_err(|e| format!("not an object file: {e}"))?
                .iter()
                .filter(|p| p.p_type(endian) == object::elf::PT_NOTE)
                .map(|p| p.p_filesz(endian).into())
                .collect()
        } else {
            sections
                .iter()
                .filter(|s| s.sh_type(endian) == object::elf::SHT_NOTE)
                .map(|s| s.sh_size(endian).into())
                .collect()
        };
        if notes.len() > MAX_NOTES {
            return Err(format!(
                "{} notes (at most {MAX_NOTES} are read)",
                notes.len()
            ));
        }
        if let Some(size) = notes.iter().find(|&&size| size > MAX_NOTE_BYTES) {
            return Err(format!(
                "a note of {size} bytes (at most {MAX_NOTE_BYTES} are read)"
            ));
        }
        if sections.len() > MAX_SECTIONS {
            return Err(format!(
                "{} sections (at most {MAX_SECTIONS} are read)",
                sections.len()
            ));
        }
        // Section 0 is the null section: `object` finds a section by name from index 0,
        // blazesym from 1, so a named section 0 was what this check read in place of the
        // section of that name blazesym reads. (Its size and link may hold the section
        // count and string table index of a file of very many sections.)
        if let Some(null) = sections.iter().next()
            && (null.sh_name(endian) != 0
                || null.sh_type(endian) != object::elf::SHT_NULL
                || null.sh_flags(endian).into() != 0
                || null.sh_offset(endian).into() != 0)
        {
            return Err("section 0 is not the null section".into());
        }
        // One section of each name blazesym reads, as this check reads one.
        let mut names = std::collections::HashSet::new();
        for section in sections.iter().skip(1) {
            let name = sections
                .section_name(endian, section)
                .map_err(|e| format!("a section name: {e}"))?;
            let read = [
                &b".debug"[..],
                b".zdebug",
                b".gnu_debug",
                b".note",
                b".symtab",
                b".strtab",
            ]
            .iter()
            .any(|p| name.starts_with(p));
            if read && !names.insert(name) {
                return Err(format!(
                    "two sections named {}",
                    String::from_utf8_lossy(name)
                ));
            }
            // blazesym inflates a compressed note by its stated size before anything
            // checks it (reading a build id); real notes are never compressed.
            if section.sh_type(endian) == object::elf::SHT_NOTE
                && section.sh_flags(endian).into() & u64::from(object::elf::SHF_COMPRESSED) != 0
            {
                return Err("a compressed note section".into());
            }
        }
        let indices = sections
            .iter()
            .filter(|s| s.sh_type(endian) == object::elf::SHT_SYMTAB_SHNDX)
            .count();
        if indices > 1 {
            return Err(format!(
                "{indices} symbol-index sections (SHT_SYMTAB_SHNDX; a file has one at most)"
            ));
        }
        Ok(())
    }
    match object::FileKind::parse(data) {
        Ok(object::FileKind::Elf32) => of::<object::elf::FileHeader32<object::Endianness>>(data),
        Ok(object::FileKind::Elf64) => of::<object::elf::FileHeader64<object::Endianness>>(data),
        _ => Err("not an object file: not ELF".into()),
    }
}

/// Whether blazesym may read `path` (and the file its debug link names beside it): an
/// error says why not.
pub(crate) fn check(path: &Path) -> Result<(), String> {
    if let Some(linked) = check_file(path)? {
        let linked = path.with_file_name(linked);
        if linked.is_file() {
            check_file(&linked).map_err(|e| format!("{}: {e}", linked.display()))?;
        }
    }
    Ok(())
}

/// Bytes reading `path` may make, which a reservation must cover before it is read: the
/// file, and the file its debug link names beside it, each with what its compressed
/// sections state they inflate to (a file of a few hundred bytes can state a gibibyte a
/// section) and what its line tables make ([`line_tables_bytes`], when its sections are
/// stored uncompressed). A file that is not an object file counts its size ([`check`]
/// refuses it).
pub(crate) fn read_bytes(path: &Path) -> u64 {
    /// The file's size plus its sections' stated inflated sizes, and its debug link.
    fn of(path: &Path) -> (u64, Option<String>) {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        let Ok(file) = std::fs::File::open(path) else {
            return (size, None);
        };
        let cache = object::ReadCache::new(file);
        if sections_fit(&cache).is_err() {
            return (size, None); // refused by `check`
        }
        let Ok(elf) = object::File::parse(&cache) else {
            return (size, None);
        };
        let inflated = elf
            .sections()
            .filter_map(|s| s.compressed_file_range().ok())
            .filter(|r| r.format != object::CompressionFormat::None)
            .fold(size, |sum, r| sum.saturating_add(r.uncompressed_size));
        // Of sections as stored (a compressed one is inflated only once reserved for):
        // an error counts nothing here, and `check` refuses what it must.
        let lines = dwarf_sections(&elf, false)
            .and_then(|sections| line_tables_bytes(&sections, endian_of(&elf)))
            .unwrap_or(0);
        (
            inflated.saturating_add(lines),
            debuglink(&elf).ok().flatten(),
        )
    }
    let (bytes, linked) = of(path);
    match linked.map(|name| path.with_file_name(name)) {
        Some(linked) if linked.is_file() => bytes.saturating_add(of(&linked).0),
        _ => bytes,
    }
}

/// The plain file name the `.gnu_debuglink` of `elf` names, if any (blazesym looks for it
/// beside the file and in debug dirs). A name with a path is refused: blazesym would read
/// the file it names (resolved from the cache directory: another upload, unchecked), and
/// so is a supplementary file (`.gnu_debugaltlink`, `.debug_sup`), which it reads by path
/// too; an upload is a whole debug file.
fn debuglink<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
) -> Result<Option<String>, String> {
    for supplementary in [".gnu_debugaltlink", ".debug_sup"] {
        if elf.section_by_name(supplementary).is_some() {
            return Err(format!(
                "it names a supplementary file ({supplementary}), which is not read"
            ));
        }
    }
    let Some((name, _)) = elf.gnu_debuglink().ok().flatten() else {
        return Ok(None);
    };
    let name = String::from_utf8_lossy(name).into_owned();
    if name.contains('/') || name == ".." || name == "." {
        return Err(format!(
            "its .gnu_debuglink names {name:?}, not a file beside it"
        ));
    }
    Ok((!name.is_empty()).then_some(name))
}

/// Walks the DWARF of the ELF file at `path`; returns the file name its
/// `.gnu_debuglink` names, if any.
fn check_file(path: &Path) -> Result<Option<String>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let cache = object::ReadCache::new(file);
    sections_fit(&cache)?;
    let elf = object::File::parse(&cache).map_err(|e| format!("not an object file: {e}"))?;
    let linked = debuglink(&elf)?;
    symbols_apart(&elf)?;
    compressed_as_stated(&elf)?;
    // Read (and inflated) once, for the walk and the line tables both.
    let sections = dwarf_sections(&elf, true)?;
    let endian = endian_of(&elf);
    let slices = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
    walk(
        slices.debug_info.reader().slice(),
        slices.debug_abbrev.reader().slice(),
        endian,
    )
    .map_err(|e| format!("DWARF: {e}"))?;
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let most = LINE_TABLES_PER_BYTE
        .saturating_mul(size)
        .saturating_add(LINE_TABLES_SLACK);
    let lines =
        line_tables_bytes(&sections, endian).map_err(|e| format!("DWARF line tables: {e}"))?;
    if lines > most {
        return Err(format!(
            "its line tables would make {lines} bytes, over {most} \
             ({LINE_TABLES_PER_BYTE} a byte of the file and {LINE_TABLES_SLACK})"
        ));
    }
    Ok(linked)
}

/// Most symbols of a file's symbol tables at one address. blazesym's lookup of an address
/// walks every symbol at the address it lands on, before and after: a million symbols at
/// one address (a 24 MB upload) took 4 ms an address, minutes for a profile, holding one of
/// the symbolizer's few workers that every tenant shares, and no deadline stops it. Real
/// programs give an address a few names (a function, its aliases and versioned names).
pub(crate) const MAX_SYMBOLS_AT_ONE_ADDRESS: usize = 256;

/// Refuses a file with more than [`MAX_SYMBOLS_AT_ONE_ADDRESS`] symbols at one address (in
/// `.symtab` or `.dynsym`).
fn symbols_apart<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Result<(), String> {
    use object::ObjectSymbol;
    let mut addresses: Vec<u64> = elf
        .symbols()
        .chain(elf.dynamic_symbols())
        .filter(|s| s.address() != 0)
        .map(|s| s.address())
        .collect();
    addresses.sort_unstable();
    let most = addresses
        .chunk_by(|a, b| a == b)
        .map(|run| (run.len(), run[0]))
        .max();
    match most {
        Some((n, at)) if n > MAX_SYMBOLS_AT_ONE_ADDRESS => Err(format!(
            "{n} symbols at address {at:#x}, over {MAX_SYMBOLS_AT_ONE_ADDRESS}: looking an \
             address up would walk them all"
        )),
        _ => Ok(()),
    }
}

/// Whether `elf` is little- or big-endian, as gimli reads it.
fn endian_of<'d>(
    elf: &object::File<'d, &'d object::ReadCache<std::fs::File>>,
) -> gimli::RunTimeEndian {
    if elf.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    }
}

/// The sections the checks read: `.debug_info`, `.debug_abbrev`, `.debug_line` and the
/// string sections (the others empty). With `inflate` false a compressed one is an error,
/// none is inflated: for [`read_bytes`], which runs before anything is reserved.
/// The DWARF sections the check reads (and inflates, checking what they state).
const READ: [gimli::SectionId; 6] = [
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugStrOffsets,
];

fn dwarf_sections<'d>(
    elf: &object::File<'d, &'d object::ReadCache<std::fs::File>>,
    inflate: bool,
) -> Result<gimli::DwarfSections<Cow<'d, [u8]>>, String> {
    gimli::DwarfSections::load(|id| {
        if !READ.contains(&id) {
            return Ok(Cow::Borrowed(&[][..]));
        }
        let compressed = elf
            .section_by_name(id.name())
            .and_then(|s| s.compressed_file_range().ok())
            .is_some_and(|r| r.format != object::CompressionFormat::None);
        match compressed && !inflate {
            true => Err(format!("{} is compressed", id.name())),
            false => section(elf, id.name()),
        }
    })
}

/// What blazesym makes of the line programs of the units of `sections`, at most: each
/// unit parses the program its `DW_AT_stmt_list` names, on its own (units sharing one
/// parse it once each), keeping a row for each byte of the program at most, and for each
/// file entry a path of the unit's directory, the entry's directory and its name. Only the
/// units' root entries and the programs' headers are read, once the abbreviation tables
/// they are parsed with are bounded ([`abbrev_tables`]). Before, a file of 1 MiB of
/// `DW_AT_comp_dir` and 16 units naming one program of 4,096 file entries made 64 GiB of
/// paths, against a reservation of its size.
fn line_tables_bytes(
    sections: &gimli::DwarfSections<Cow<'_, [u8]>>,
    endian: gimli::RunTimeEndian,
) -> Result<u64, String> {
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
    abbrev_tables(dwarf.debug_abbrev.reader().slice())?;
    let length = |unit: &gimli::Unit<_>, value| {
        dwarf
            .attr_string(unit, value)
            .map_or(0, |s: gimli::EndianSlice<'_, _>| s.len() as u64)
    };
    let mut total = 0u64;
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(|e| e.to_string())? {
        let unit = dwarf.unit(header).map_err(|e| e.to_string())?;
        let Some(program) = &unit.line_program else {
            continue;
        };
        let header = program.header();
        let directory = unit.comp_dir.map_or(0, |d| d.len() as u64);
        let longest_directory = header
            .include_directories()
            .iter()
            .map(|d| length(&unit, *d))
            .max()
            .unwrap_or(0);
        let longest_name = header
            .file_names()
            .iter()
            .map(|f| length(&unit, f.path_name()))
            .max()
            .unwrap_or(0);
        let per_file = directory + longest_directory + longest_name + FILE_ENTRY_BYTES;
        total = total
            .saturating_add((header.file_names().len() as u64).saturating_mul(per_file))
            .saturating_add(LINE_ROW_BYTES.saturating_mul(header.raw_program_buf().len() as u64));
    }
    Ok(total)
}

/// Checks that every compressed section inflates to the size it states, no more and no
/// less, without keeping what it inflates to. blazesym inflates a section to the end of its
/// stream, whatever it states, and loads every DWARF section it knows: what a reservation
/// counted by the stated sizes (and this check's reads of a few sections, each taken up to
/// its size) said nothing of a megabyte stating 16 bytes and inflating to a gigabyte.
fn compressed_as_stated<'d>(
    elf: &object::File<'d, &'d object::ReadCache<std::fs::File>>,
) -> Result<(), String> {
    for section in elf.sections() {
        let name = section.name().unwrap_or("?");
        // Those the walk reads are checked as it inflates them ([`section`]).
        if READ.iter().any(|id| id.name() == name) {
            continue;
        }
        let compressed = section
            .compressed_data()
            .map_err(|e| format!("{name}: {e}"))?;
        inflated(name, compressed, false)?;
    }
    Ok(())
}

/// The section's bytes, decompressed; empty when the file has none.
fn section<'d>(
    elf: &object::File<'d, &'d object::ReadCache<std::fs::File>>,
    name: &str,
) -> Result<Cow<'d, [u8]>, String> {
    let Some(section) = elf.section_by_name(name) else {
        return Ok(Cow::Borrowed(&[]));
    };
    let compressed = section
        .compressed_data()
        .map_err(|e| format!("{name}: {e}"))?;
    inflated(name, compressed, true)
}

/// Section `name`'s bytes: as stored when they are not compressed, else inflated to the
/// size it states, no more and no less (an error otherwise), and kept when `keep` (else
/// only counted: empty). A stored section is read whole only when kept, and at most
/// [`MAX_SECTION_BYTES`].
fn inflated<'d>(
    name: &str,
    compressed: object::CompressedData<'d>,
    keep: bool,
) -> Result<Cow<'d, [u8]>, String> {
    let size = compressed.uncompressed_size;
    let stored = compressed.format == object::CompressionFormat::None;
    if size > MAX_SECTION_BYTES && (keep || !stored) {
        return Err(format!(
            "{name} inflates to {size} bytes (at most {MAX_SECTION_BYTES} are read)"
        ));
    }
    let reader: Box<dyn Read + 'd> = match compressed.format {
        object::CompressionFormat::None => return Ok(Cow::Borrowed(compressed.data)),
        object::CompressionFormat::Zlib => {
            Box::new(flate2::read::ZlibDecoder::new(compressed.data))
        }
        object::CompressionFormat::Zstandard => Box::new(
            zstd::stream::read::Decoder::new(compressed.data)
                .map_err(|e| format!("{name}: {e}"))?,
        ),
        other => return Err(format!("{name}: compressed as {other:?}")),
    };
    // One byte past the size stated tells a stream that goes on.
    let mut reader = reader.take(size + 1);
    let mut out = Vec::new();
    let made = match keep {
        true => {
            out.reserve_exact(size as usize);
            reader.read_to_end(&mut out).map(|n| n as u64)
        }
        false => std::io::copy(&mut reader, &mut std::io::sink()),
    }
    .map_err(|e| format!("{name}: {e}"))?;
    if made != size {
        return Err(format!(
            "{name} states {size} bytes inflated, and inflates to {}",
            if made > size {
                "more".to_owned()
            } else {
                made.to_string()
            }
        ));
    }
    Ok(Cow::Owned(out))
}

/// The length of each abbreviation table in `abbrev` (a unit's, from its offset to the
/// null code that ends it), read with a loop of our own before gimli parses any: an
/// abbreviation of more than [`MAX_ABBREVIATION_ATTRIBUTES`] attributes, or a table of more
/// than [`MAX_ABBREV_TABLE_BYTES`], is refused.
fn abbrev_tables(abbrev: &[u8]) -> Result<std::collections::HashMap<usize, usize>, String> {
    fn uleb(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = *bytes.get(*at).ok_or(".debug_abbrev ends inside a number")?;
            *at += 1;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(".debug_abbrev holds a number of more than 10 bytes".into())
    }
    let mut tables = std::collections::HashMap::new();
    let mut at = 0;
    while at < abbrev.len() {
        let start = at;
        // Declarations until a null code.
        while uleb(abbrev, &mut at)? != 0 {
            uleb(abbrev, &mut at)?; // tag
            at += 1; // has children
            let mut attributes = 0usize;
            loop {
                let (name, form) = (uleb(abbrev, &mut at)?, uleb(abbrev, &mut at)?);
                if (name, form) == (0, 0) {
                    break;
                }
                if form == u64::from(gimli::DW_FORM_implicit_const.0) {
                    uleb(abbrev, &mut at)?; // its value (signed; the length is the same)
                }
                attributes += 1;
                if attributes > MAX_ABBREVIATION_ATTRIBUTES {
                    return Err(format!(
                        "an abbreviation at {start} declares more than \
                         {MAX_ABBREVIATION_ATTRIBUTES} attributes"
                    ));
                }
            }
            if at - start > MAX_ABBREV_TABLE_BYTES {
                return Err(format!(
                    "the abbreviation table at {start} is over {MAX_ABBREV_TABLE_BYTES} bytes"
                ));
            }
        }
        tables.insert(start, at - start);
    }
    Ok(tables)
}

/// Walks every unit's entries, counting the inlined calls open around each, in at most
/// [`STEPS_PER_BYTE`] steps a byte of the two sections.
fn walk(info: &[u8], abbrev: &[u8], endian: gimli::RunTimeEndian) -> Result<(), String> {
    let tables = abbrev_tables(abbrev)?;
    let budget = STEPS_PER_BYTE
        .saturating_mul((info.len() + abbrev.len()) as u64)
        .saturating_add(1 << 20);
    let mut steps = 0u64;
    let mut step = |n: usize| {
        steps = steps.saturating_add(n as u64 + 1);
        match steps > budget {
            true => Err(format!(
                "more than {budget} steps to walk ({STEPS_PER_BYTE} a byte of its DWARF)"
            )),
            false => Ok(()),
        }
    };
    let (info, abbrev) = (
        gimli::DebugInfo::new(info, endian),
        gimli::DebugAbbrev::new(abbrev, endian),
    );
    let mut units = info.units();
    // The depths of the inlined calls open around the entry being read.
    let mut open: Vec<isize> = Vec::new();
    while let Some(header) = units.next().map_err(|e| e.to_string())? {
        let offset = header.debug_abbrev_offset().0;
        let table = *tables
            .get(&offset)
            .ok_or_else(|| format!("a unit's abbreviations at {offset} begin no table"))?;
        step(table)?;
        let abbreviations = header.abbreviations(&abbrev).map_err(|e| e.to_string())?;
        let mut entries = header
            .entries_raw(&abbreviations, None)
            .map_err(|e| e.to_string())?;
        open.clear();
        while !entries.is_empty() {
            let depth = entries.next_depth();
            let Some(abbreviation) = entries.read_abbreviation().map_err(|e| e.to_string())? else {
                step(0)?;
                continue; // the end of a list of children
            };
            step(abbreviation.attributes().len())?;
            while open.last().is_some_and(|&d| d >= depth) {
                open.pop();
            }
            if abbreviation.tag() == gimli::DW_TAG_inlined_subroutine {
                open.push(depth);
                if open.len() > MAX_INLINED_NESTING {
                    return Err(format!(
                        "inlined calls nested {} deep (at most {MAX_INLINED_NESTING} are read)",
                        open.len()
                    ));
                }
            }
            entries
                .skip_attributes(abbreviation.attributes())
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.debug_info` of one DWARF 4 unit (64-bit addresses): a compile unit, a subprogram,
    /// and `nesting` inlined subroutines each inside the one before; `.debug_abbrev` its
    /// abbreviations (attribute-less, with children).
    fn nested(nesting: usize) -> (Vec<u8>, Vec<u8>) {
        // code, tag, has children, no attributes (0, 0).
        let mut abbrev = Vec::new();
        for (code, tag) in [
            (1u8, gimli::DW_TAG_compile_unit.0 as u8),
            (2, gimli::DW_TAG_subprogram.0 as u8),
            (3, gimli::DW_TAG_inlined_subroutine.0 as u8),
        ] {
            abbrev.extend([code, tag, 1, 0, 0]);
        }
        abbrev.push(0);
        let mut entries = vec![1u8, 2];
        entries.extend(std::iter::repeat_n(3u8, nesting));
        // Each open entry's children end with a null entry.
        entries.extend(std::iter::repeat_n(0u8, nesting + 2));
        let mut info = Vec::new();
        let length = (2 + 4 + 1 + entries.len()) as u32; // version, abbrev offset, size
        info.extend(length.to_le_bytes());
        info.extend(4u16.to_le_bytes());
        info.extend(0u32.to_le_bytes());
        info.push(8);
        info.extend(entries);
        (info, abbrev)
    }

    fn walked(nesting: usize) -> Result<(), String> {
        let (info, abbrev) = nested(nesting);
        walk(&info, &abbrev, gimli::RunTimeEndian::Little)
    }

    #[test]
    fn inlined_calls_nested_past_the_limit_are_refused_and_within_it_read() {
        walked(MAX_INLINED_NESTING).unwrap();
        let e = walked(MAX_INLINED_NESTING + 1).unwrap_err();
        assert!(e.contains("nested 257 deep"), "{e}");
        // A hundred thousand levels (what overflowed the reader's stack): refused, in a
        // loop of our own.
        let e = walked(100_000).unwrap_err();
        assert!(e.contains("nested"), "{e}");
    }

    /// An ELF64 relocatable file of `sections`: name, type, flags, bytes, link.
    fn elf(sections: &[(&str, u32, u64, &[u8], u32)]) -> Vec<u8> {
        let mut names = b"\0.shstrtab\0".to_vec();
        let mut name_at = Vec::new();
        for (name, ..) in sections {
            name_at.push(names.len() as u32);
            names.extend(name.as_bytes());
            names.push(0);
        }
        let mut body = Vec::new();
        let mut data_at = Vec::new();
        for (_, _, _, bytes, _) in sections {
            data_at.push(64 + body.len() as u64);
            body.extend(*bytes);
        }
        let names_at = 64 + body.len() as u64;
        body.extend(&names);
        let headers_at = 64 + body.len() as u64;
        let count = sections.len() as u16 + 2;
        let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
        elf.resize(16, 0);
        elf.extend(1u16.to_le_bytes()); // relocatable
        elf.extend(62u16.to_le_bytes()); // x86-64
        elf.extend(1u32.to_le_bytes());
        elf.extend([0u8; 16]); // entry, program headers
        elf.extend(headers_at.to_le_bytes());
        elf.extend(0u32.to_le_bytes());
        for half in [64u16, 0, 0, 64, count, 1] {
            elf.extend(half.to_le_bytes()); // sizes, counts, the names' section
        }
        elf.extend(&body);
        let mut header = |name: u32, kind: u32, flags: u64, at: u64, size: u64, link: u32| {
            elf.extend(name.to_le_bytes());
            elf.extend(kind.to_le_bytes());
            elf.extend(flags.to_le_bytes());
            elf.extend(0u64.to_le_bytes());
            elf.extend(at.to_le_bytes());
            elf.extend(size.to_le_bytes());
            elf.extend(link.to_le_bytes());
            elf.extend(0u32.to_le_bytes()); // info
            elf.extend(1u64.to_le_bytes());
            elf.extend(0u64.to_le_bytes());
        };
        header(0, 0, 0, 0, 0, 0);
        header(1, 3, 0, names_at, names.len() as u64, 0);
        for (i, (_, kind, flags, bytes, link)) in sections.iter().enumerate() {
            header(
                name_at[i],
                *kind,
                *flags,
                data_at[i],
                bytes.len() as u64,
                *link,
            );
        }
        elf
    }

    /// Notes are read whole, each kept by the read cache, when a build id is read: more
    /// than a few, or one of megabytes, is refused before any is read; a file's usual
    /// notes are read.
    #[test]
    fn a_file_of_many_or_large_notes_is_refused_before_they_are_read() {
        let build_id = b"\x04\0\0\0\x14\0\0\0\x03\0\0\0GNU\0aaaaaaaaaaaaaaaaaaaa";
        let usual = [
            (
                ".note.gnu.build-id",
                object::elf::SHT_NOTE,
                0,
                &build_id[..],
                0,
            ),
            (".note.ABI-tag", object::elf::SHT_NOTE, 0, &[0u8; 32][..], 0),
        ];
        sections_fit(elf(&usual).as_slice()).unwrap();
        let zeros = vec![0u8; 4096];
        let many: Vec<_> = (0..=MAX_NOTES)
            .map(|_| (".a", object::elf::SHT_NOTE, 0, &zeros[..], 0))
            .collect();
        let e = sections_fit(elf(&many).as_slice()).unwrap_err();
        assert!(e.contains("65 notes"), "{e}");
        let large = vec![0u8; MAX_NOTE_BYTES as usize + 12];
        let e = sections_fit(elf(&[(".a", object::elf::SHT_NOTE, 0, &large[..], 0)]).as_slice())
            .unwrap_err();
        assert!(e.contains("a note of"), "{e}");
    }

    /// An ELF64 relocatable file with a `.debug_info` compressed (zlib) that states it
    /// inflates to `stated` bytes: what a bomb's headers say, however few bytes follow.
    fn stating(stated: u64) -> Vec<u8> {
        let mut info = Vec::new();
        info.extend(1u32.to_le_bytes()); // ELFCOMPRESS_ZLIB
        info.extend(0u32.to_le_bytes());
        info.extend(stated.to_le_bytes());
        info.extend(1u64.to_le_bytes());
        info.extend([0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]); // zlib of nothing
        elf(&[(".debug_info", 1, 0x800, &info, 0)]) // SHF_COMPRESSED
    }

    #[test]
    fn what_compressed_sections_inflate_to_is_known_before_they_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bomb.debug");
        // A file of 300 bytes stating a tebibyte: a reservation covers that first.
        let bomb = stating(1 << 40);
        std::fs::write(&path, &bomb).unwrap();
        assert_eq!(read_bytes(&path), (1 << 40) + bomb.len() as u64);
        let e = check(&path).unwrap_err();
        assert!(e.contains("inflates to 1099511627776 bytes"), "{e}");
        // Stating a few bytes: that is what it takes (and its stream holds fewer).
        let small = stating(64);
        std::fs::write(&path, &small).unwrap();
        assert_eq!(read_bytes(&path), 64 + small.len() as u64);
        assert!(
            check(&path)
                .unwrap_err()
                .contains("states 64 bytes inflated, and inflates to 0")
        );
        // Not an object file: its size (check refuses it).
        std::fs::write(&path, b"not an ELF file").unwrap();
        assert_eq!(read_bytes(&path), 15);
    }

    /// Files blazesym would read otherwise than this check reads them are refused: a named
    /// section 0 (`object` finds sections by name from index 0, blazesym from 1: the check
    /// read an empty decoy), a big-endian file (blazesym reads every file as
    /// little-endian), two sections of one name, a compressed note (blazesym inflates it by
    /// its stated size when it reads a build id, before any check), and a compressed
    /// section whose stream inflates past what it states (blazesym inflates to the
    /// stream's end).
    #[test]
    fn files_blazesym_would_read_otherwise_are_refused() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.debug");
        let refused = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            check(&path).unwrap_err()
        };
        let plain = elf(&[(".debug_info", 1, 0, b"", 0)]);
        std::fs::write(&path, &plain).unwrap();
        check(&path).unwrap();
        // Section 0 named `.debug_info` (its name's offset in `.shstrtab` is 11).
        let mut named = plain.clone();
        let headers = u64::from_le_bytes(named[40..48].try_into().unwrap()) as usize;
        named[headers..headers + 4].copy_from_slice(&11u32.to_le_bytes());
        assert!(refused(&named).contains("section 0 is not the null section"));
        let mut big = plain.clone();
        big[5] = 2;
        assert!(refused(&big).contains("big-endian"));
        let twice = elf(&[(".debug_info", 1, 0, b"", 0), (".debug_info", 1, 0, b"", 0)]);
        assert!(refused(&twice).contains("two sections named .debug_info"));
        // Compressed: a header, then the zlib stream of `inflated` zero bytes.
        let compressed = |stated: u64, inflated: usize| {
            let mut bytes = Vec::new();
            bytes.extend(1u32.to_le_bytes());
            bytes.extend(0u32.to_le_bytes());
            bytes.extend(stated.to_le_bytes());
            bytes.extend(1u64.to_le_bytes());
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(&vec![0u8; inflated]).unwrap();
            bytes.extend(z.finish().unwrap());
            bytes
        };
        let note = compressed(36, 36);
        assert!(
            refused(&elf(&[(".note.gnu.build-id", 7, 0x800, &note, 0)]))
                .contains("a compressed note section")
        );
        let bomb = compressed(16, 1 << 20);
        let e = refused(&elf(&[(".debug_aranges", 1, 0x800, &bomb, 0)]));
        assert!(
            e.contains(".debug_aranges states 16 bytes inflated, and inflates to more"),
            "{e}"
        );
        let honest = compressed(1 << 20, 1 << 20);
        std::fs::write(&path, elf(&[(".debug_aranges", 1, 0x800, &honest, 0)])).unwrap();
        check(&path).unwrap();
    }

    /// An ELF64 file of `units` DWARF 4 compile units, each naming one line program (at
    /// offset 0) and a directory (`DW_AT_comp_dir`) of `directory` bytes; the program has
    /// `files` file entries and no rows.
    fn sharing_a_line_program(units: usize, directory: usize, files: usize) -> Vec<u8> {
        let mut strings = vec![b'/'];
        strings.resize(directory, b'a');
        strings.push(0);
        // Code 1: a compile unit without children; DW_AT_stmt_list as a section offset,
        // DW_AT_comp_dir as a string of .debug_str.
        let abbrev = [1u8, 0x11, 0, 0x10, 0x17, 0x1b, 0x0e, 0, 0, 0];
        let mut info = Vec::new();
        for _ in 0..units {
            info.extend(16u32.to_le_bytes());
            info.extend(4u16.to_le_bytes());
            info.extend(0u32.to_le_bytes()); // abbreviations at 0
            info.push(8);
            info.push(1);
            info.extend(0u32.to_le_bytes()); // the line program at 0
            info.extend(0u32.to_le_bytes()); // the directory at 0
        }
        let mut header = vec![1u8, 1, 1, 0xfb, 14, 13, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1];
        header.extend(b"b\0\0");
        for _ in 0..files {
            header.extend(b"x\0\x01\x00\x00");
        }
        header.push(0);
        let mut line = Vec::new();
        line.extend(((2 + 4 + header.len()) as u32).to_le_bytes());
        line.extend(4u16.to_le_bytes());
        line.extend((header.len() as u32).to_le_bytes());
        line.extend(header);
        elf(&[
            (".debug_abbrev", 1, 0, &abbrev, 0),
            (".debug_info", 1, 0, &info, 0),
            (".debug_line", 1, 0, &line, 0),
            (".debug_str", 1, 0, &strings, 0),
        ])
    }

    /// Line tables making many times a file's bytes are refused, and what they make is
    /// reserved first: 16 units sharing a program of 4,096 file entries under a 64 KiB
    /// directory are 4 GiB of paths from a file of 150 KB. Before, nothing looked at
    /// `.debug_line`: the same with a 1 MiB directory was 64 GiB. One unit of 16 entries
    /// is read.
    #[test]
    fn line_tables_making_many_times_the_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.debug");
        let file = sharing_a_line_program(16, 64 << 10, 4_096);
        std::fs::write(&path, &file).unwrap();
        let e = check(&path).unwrap_err();
        assert!(e.contains("line tables would make"), "{e}");
        assert!(
            read_bytes(&path) > 16 * 4_096 * (64 << 10),
            "reserved first"
        );
        let file = sharing_a_line_program(1, 64, 16);
        std::fs::write(&path, &file).unwrap();
        check(&path).unwrap();
        let bytes = read_bytes(&path);
        assert!(bytes > file.len() as u64 + 16 * 64, "{bytes}");
    }

    #[test]
    fn a_file_that_is_not_an_object_file_is_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.debug");
        std::fs::write(&path, b"not an ELF file").unwrap();
        let e = check(&path).unwrap_err();
        assert!(e.contains("not an object file"), "{e}");
    }

    /// Files naming another file blazesym would read unchecked, or whose section headers
    /// would make parsing them copy many times their bytes, are refused and sized as
    /// their bytes alone.
    #[test]
    fn files_that_would_be_read_around_the_check_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.debug");
        let refused = |file: &[u8], why: &str| {
            std::fs::write(&path, file).unwrap();
            let e = check(&path).unwrap_err();
            assert!(e.contains(why), "{e}");
            assert_eq!(read_bytes(&path), file.len() as u64, "{why}");
        };
        // Two symbol-index sections over one 64 KiB range, linked to the symbol table
        // (section 2): each was read and kept whole as the file was parsed.
        let range = vec![0u8; 64 << 10];
        let shndx = |link| (".x", object::elf::SHT_SYMTAB_SHNDX, 0, &range[..], link);
        refused(
            &elf(&[
                (".symtab", object::elf::SHT_SYMTAB, 0, &[], 0),
                shndx(2),
                shndx(2),
            ]),
            "2 symbol-index sections",
        );
        // A debug link with a path: blazesym resolves it from the cache directory.
        let mut link = b"../tenants/t/blocks/debuginfo/b1/debuginfo\0\0\0".to_vec();
        link.extend(0u32.to_le_bytes());
        refused(
            &elf(&[(".gnu_debuglink", 1, 0, &link, 0)]),
            "not a file beside it",
        );
        // A supplementary file, by either section.
        for name in [".gnu_debugaltlink", ".debug_sup"] {
            refused(&elf(&[(name, 1, 0, b"/x\0\x01", 0)]), name);
        }
        // A plain link beside the file is still followed, and one section of each kind
        // read.
        let mut beside = b"x.debug.real\0\0\0\0".to_vec();
        beside.extend(0u32.to_le_bytes());
        std::fs::write(&path, elf(&[(".gnu_debuglink", 1, 0, &beside, 0)])).unwrap();
        check(&path).unwrap();
    }

    /// The walk is bounded in work: an abbreviation of more attributes than any compiler
    /// writes is refused before gimli parses it, and entries whose attributes take more
    /// steps than their bytes allow stop the walk; real DWARF (this test's own) is read.
    #[test]
    fn the_walk_is_bounded_in_work_and_real_dwarf_is_read() {
        let unit = |abbrev_attributes: usize, entries: usize| {
            // Abbreviation 1: a compile unit without children, of flag attributes (no
            // bytes in an entry).
            let mut abbrev = vec![1u8, gimli::DW_TAG_compile_unit.0 as u8, 0];
            for _ in 0..abbrev_attributes {
                abbrev.extend([0x03, 0x19]); // DW_AT_name, DW_FORM_flag_present
            }
            abbrev.extend([0, 0, 0]);
            let mut info = Vec::new();
            info.extend(((2 + 4 + 1 + entries) as u32).to_le_bytes());
            info.extend(4u16.to_le_bytes());
            info.extend(0u32.to_le_bytes());
            info.push(8);
            info.extend(std::iter::repeat_n(1u8, entries));
            walk(&info, &abbrev, gimli::RunTimeEndian::Little)
        };
        unit(MAX_ABBREVIATION_ATTRIBUTES, 1000).unwrap();
        let e = unit(MAX_ABBREVIATION_ATTRIBUTES + 1, 1).unwrap_err();
        assert!(e.contains("more than 256 attributes"), "{e}");
        // 100,000 one-byte entries of 256 attributes: 25.7 M steps for 100 KB.
        let e = unit(MAX_ABBREVIATION_ATTRIBUTES, 100_000).unwrap_err();
        assert!(e.contains("steps to walk"), "{e}");
        let real = std::env::current_exe().unwrap();
        check(&real).unwrap_or_else(|e| panic!("{}: {e}", real.display()));
    }
}
