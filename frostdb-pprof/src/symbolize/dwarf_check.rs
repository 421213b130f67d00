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

/// Walks the DWARF of the ELF file at `path`; returns the file name its
/// `.gnu_debuglink` names, if any.
fn check_file(path: &Path) -> Result<Option<String>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).map_err(|e| format!("not an object file: {e}"))?;
    let linked = elf
        .gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, _)| String::from_utf8_lossy(name).into_owned())
        // Only a plain file name: blazesym looks for it beside the file and in debug dirs.
        .filter(|name| !name.is_empty() && !name.contains('/'));
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

    #[test]
    fn a_file_that_is_not_an_object_file_is_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.debug");
        std::fs::write(&path, b"not an ELF file").unwrap();
        let e = check(&path).unwrap_err();
        assert!(e.contains("not an object file"), "{e}");
    }
}
