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

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use object::{Object, ObjectSection};

/// Most `DW_TAG_inlined_subroutine` entries nested in one another that a file may hold.
pub(crate) const MAX_INLINED_NESTING: usize = 256;

/// Largest DWARF section decompressed for the walk.
const MAX_SECTION_BYTES: u64 = 1 << 30;

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
/// section). A file that is not an object file counts its size ([`check`] refuses it).
pub(crate) fn read_bytes(path: &Path) -> u64 {
    /// The file's size plus its sections' stated inflated sizes, and its debug link.
    fn of(path: &Path) -> (u64, Option<String>) {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        let Ok(file) = std::fs::File::open(path) else {
            return (size, None);
        };
        let cache = object::ReadCache::new(file);
        let Ok(elf) = object::File::parse(&cache) else {
            return (size, None);
        };
        let inflated = elf
            .sections()
            .filter_map(|s| s.compressed_file_range().ok())
            .filter(|r| r.format != object::CompressionFormat::None)
            .fold(size, |sum, r| sum.saturating_add(r.uncompressed_size));
        (inflated, debuglink(&elf))
    }
    let (bytes, linked) = of(path);
    match linked.map(|name| path.with_file_name(name)) {
        Some(linked) if linked.is_file() => bytes.saturating_add(of(&linked).0),
        _ => bytes,
    }
}

/// The plain file name the `.gnu_debuglink` of `elf` names, if any (blazesym looks for it
/// beside the file and in debug dirs).
fn debuglink<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<String> {
    elf.gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _)| String::from_utf8_lossy(name).into_owned())
        .filter(|name| !name.is_empty() && !name.contains('/'))
}

/// Walks the DWARF of the ELF file at `path`; returns the file name its
/// `.gnu_debuglink` names, if any.
fn check_file(path: &Path) -> Result<Option<String>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| format!("not an object file: {e}"))?;
    let linked = debuglink(&elf);
    let info = section(&elf, ".debug_info")?;
    let abbrev = section(&elf, ".debug_abbrev")?;
    let endian = if elf.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    walk(
        gimli::DebugInfo::new(&info, endian),
        gimli::DebugAbbrev::new(&abbrev, endian),
    )
    .map_err(|e| format!("DWARF: {e}"))?;
    Ok(linked)
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
    let size = compressed.uncompressed_size;
    if size > MAX_SECTION_BYTES {
        return Err(format!(
            "{name} inflates to {size} bytes (at most {MAX_SECTION_BYTES} are read)"
        ));
    }
    let inflate = |reader: &mut dyn Read| -> Result<Cow<'d, [u8]>, String> {
        let mut out = Vec::with_capacity(size as usize);
        reader
            .take(size)
            .read_to_end(&mut out)
            .map_err(|e| format!("{name}: {e}"))?;
        if out.len() as u64 != size {
            return Err(format!(
                "{name}: {} bytes inflated, {size} declared",
                out.len()
            ));
        }
        Ok(Cow::Owned(out))
    };
    match compressed.format {
        object::CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
        object::CompressionFormat::Zlib => {
            inflate(&mut flate2::read::ZlibDecoder::new(compressed.data))
        }
        object::CompressionFormat::Zstandard => inflate(
            &mut zstd::stream::read::Decoder::new(compressed.data)
                .map_err(|e| format!("{name}: {e}"))?,
        ),
        other => Err(format!("{name}: compressed as {other:?}")),
    }
}

/// Walks every unit's entries, counting the inlined calls open around each.
fn walk<R: gimli::Reader>(
    info: gimli::DebugInfo<R>,
    abbrev: gimli::DebugAbbrev<R>,
) -> Result<(), String> {
    let mut units = info.units();
    // The depths of the inlined calls open around the entry being read.
    let mut open: Vec<isize> = Vec::new();
    while let Some(header) = units.next().map_err(|e| e.to_string())? {
        let abbreviations = header.abbreviations(&abbrev).map_err(|e| e.to_string())?;
        let mut entries = header
            .entries_raw(&abbreviations, None)
            .map_err(|e| e.to_string())?;
        open.clear();
        while !entries.is_empty() {
            let depth = entries.next_depth();
            let Some(abbreviation) = entries.read_abbreviation().map_err(|e| e.to_string())? else {
                continue; // the end of a list of children
            };
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
        let endian = gimli::RunTimeEndian::Little;
        walk(
            gimli::DebugInfo::new(&info, endian),
            gimli::DebugAbbrev::new(&abbrev, endian),
        )
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

    /// An ELF64 relocatable file with a `.debug_info` compressed (zlib) that states it
    /// inflates to `stated` bytes: what a bomb's headers say, however few bytes follow.
    fn stating(stated: u64) -> Vec<u8> {
        let names = b"\0.debug_info\0.shstrtab\0";
        let mut info = Vec::new();
        info.extend(1u32.to_le_bytes()); // ELFCOMPRESS_ZLIB
        info.extend(0u32.to_le_bytes());
        info.extend(stated.to_le_bytes());
        info.extend(1u64.to_le_bytes());
        info.extend([0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]); // zlib of nothing
        let (info_at, names_at) = (64u64, 64 + info.len() as u64);
        let headers_at = names_at + names.len() as u64;
        let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
        elf.resize(16, 0);
        elf.extend(1u16.to_le_bytes()); // relocatable
        elf.extend(62u16.to_le_bytes()); // x86-64
        elf.extend(1u32.to_le_bytes());
        elf.extend([0u8; 16]); // entry, program headers
        elf.extend(headers_at.to_le_bytes());
        elf.extend(0u32.to_le_bytes());
        for half in [64u16, 0, 0, 64, 3, 2] {
            elf.extend(half.to_le_bytes()); // sizes, counts, the names' section
        }
        elf.extend(&info);
        elf.extend(names);
        let mut section = |name: u32, kind: u32, flags: u64, at: u64, size: u64| {
            elf.extend(name.to_le_bytes());
            elf.extend(kind.to_le_bytes());
            elf.extend(flags.to_le_bytes());
            elf.extend(0u64.to_le_bytes());
            elf.extend(at.to_le_bytes());
            elf.extend(size.to_le_bytes());
            elf.extend([0u8; 8]); // link, info
            elf.extend(1u64.to_le_bytes());
            elf.extend(0u64.to_le_bytes());
        };
        section(0, 0, 0, 0, 0);
        section(1, 1, 0x800, info_at, info.len() as u64); // SHF_COMPRESSED
        section(13, 3, 0, names_at, names.len() as u64);
        elf
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
                .contains("0 bytes inflated, 64 declared")
        );
        // Not an object file: its size (check refuses it).
        std::fs::write(&path, b"not an ELF file").unwrap();
        assert_eq!(read_bytes(&path), 15);
    }

    #[test]
    fn a_file_that_is_not_an_object_file_is_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.debug");
        std::fs::write(&path, b"not an ELF file").unwrap();
        let e = check(&path).unwrap_err();
        assert!(e.contains("not an object file"), "{e}");
    }
}
