//! The profiles `go tool pprof` still reads beside protobuf, as C++ programs write them:
//! gperftools' binary CPU profile (`-lprofiler`, `CPUPROFILE=`), and the text heap
//! (`HEAPPROFILE=` dumps, `@ heapprofile`; Go's old `@ heap/…` and `heap_v2/…`; `@ growth`)
//! and contention (`--- contentionz`, `--- mutex:`) profiles, each followed by the
//! process's memory map. The profiles hold addresses only (they are symbolized later, from
//! their mappings); values, address adjustments and mappings follow google/pprof's
//! `profile/legacy_profile.go` (described in our words, the code is our own):
//!
//! - CPU: native-endian words (32 or 64 bits, either byte order: the first that reads the
//!   header `0, 3, 0, period_us, 0`), records `count, depth, pc…` until `0, 1, 0`, then the
//!   maps text. Types `samples/count` and `cpu/nanoseconds` (`count × period`); every frame
//!   but the leaf is a return address and points one byte back; the signal handler's frame
//!   that almost every sample shares is dropped, as pprof drops it.
//! - Heap: `heap profile: in_use_n: in_use_bytes [alloc_n: alloc_bytes] @ kind[/rate]`, then
//!   one such line per stack ending in `@ 0x… 0x…`. `alloc_*` types come first when the
//!   header's alloc totals differ from the in-use ones; sampled kinds (`heap`, `heap_v2`) are
//!   scaled up by the Poisson estimate pprof applies.
//! - Contention: `key = value` attributes (`cycles/second`, `sampling period`), then
//!   `delay_cycles count @ 0x…` lines: `contentions/count`, `delay/nanoseconds`.
//!
//! [`parse`] answers `None` for bytes in none of these formats, so a caller tries them after
//! protobuf fails. Every count and length is checked: a record that claims more words than
//! are left, a line that is not a sample, too many samples or frames is an error naming it.

use std::collections::HashMap;

use crate::proto::{Label, Location, Mapping, Profile, Sample, ValueType};
use crate::string_table::StringTable;
use crate::{Error, Limits, Result};

/// The profile `data` holds if it is a legacy CPU, heap or contention profile; `None` if it
/// is none of them (its first bytes say).
pub fn parse(data: &[u8], limits: &Limits) -> Result<Option<Profile>> {
    if let Some(words) = cpu_words(data) {
        return cpu(data, words, limits).map(Some);
    }
    let Some(first) = data.split(|&b| b == b'\n').next() else {
        return Ok(None);
    };
    // What the first line starts with is all that is asked: a prefix, not a copy of a line
    // that may be the whole body.
    let first = String::from_utf8_lossy(&first[..first.len().min(64)]);
    let first = first.trim();
    if first.starts_with("heap profile:") {
        return heap(data, limits).map(Some);
    }
    if first.starts_with("--- contentionz ")
        || first.starts_with("--- mutex:")
        || first.starts_with("--- contention:")
    {
        return contention(data, limits).map(Some);
    }
    Ok(None)
}

/// `bytes` as text: borrowed when it is UTF-8, else a copy with the invalid bytes replaced
/// (up to three times as many bytes), charged before it is made.
fn text(bytes: &[u8]) -> Result<std::borrow::Cow<'_, str>> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return Ok(std::borrow::Cow::Borrowed(s));
    }
    crate::decode::charge::take(
        bytes.len().saturating_mul(3),
        "reading a gperftools profile's text",
    )?;
    Ok(String::from_utf8_lossy(bytes))
}

fn invalid(format: &'static str, at: String, reason: String) -> Error {
    Error::Convert { format, at, reason }
}

/// How a CPU profile's words read: their size in bytes and byte order.
#[derive(Clone, Copy)]
struct Words {
    size: usize,
    big_endian: bool,
}

impl Words {
    fn get(self, data: &[u8], i: usize) -> Option<u64> {
        let b = data.get(i * self.size..(i + 1) * self.size)?;
        Some(match (self.size, self.big_endian) {
            (4, false) => u64::from(u32::from_le_bytes(b.try_into().ok()?)),
            (4, true) => u64::from(u32::from_be_bytes(b.try_into().ok()?)),
            (_, false) => u64::from_le_bytes(b.try_into().ok()?),
            (_, true) => u64::from_be_bytes(b.try_into().ok()?),
        })
    }
}

/// The word size and order whose first five words are a CPU profile's header (pprof tries
/// 32-bit little-endian, 32-bit big-endian, 64-bit little-endian, 64-bit big-endian).
fn cpu_words(data: &[u8]) -> Option<Words> {
    [(4, false), (4, true), (8, false), (8, true)]
        .into_iter()
        .map(|(size, big_endian)| Words { size, big_endian })
        .find(|&w| {
            let h: Vec<Option<u64>> = (0..5).map(|i| w.get(data, i)).collect();
            h == [Some(0), Some(3), Some(0), h[3], Some(0)] && h[3].is_some_and(|p| p > 0)
        })
}

/// Builds the profile: locations by address (adjusted), mappings from the maps text.
struct Builder {
    strings: StringTable,
    locations: Vec<Location>,
    by_address: HashMap<u64, u64>,
    samples: Vec<Sample>,
    frames: usize,
    limits: Limits,
}

/// What a sample or record takes besides its words, in words: its vectors' headers.
const RECORD_SLOTS: usize = 8;
/// What a distinct address takes: a location and its map slot.
const LOCATION_BYTES: usize = std::mem::size_of::<Location>() + 32;

impl Builder {
    fn new(limits: &Limits) -> Self {
        Self {
            strings: StringTable::new(),
            locations: Vec::new(),
            by_address: HashMap::new(),
            samples: Vec::new(),
            frames: 0,
            limits: *limits,
        }
    }

    fn location(&mut self, address: u64) -> Result<u64> {
        if let Some(&id) = self.by_address.get(&address) {
            return Ok(id);
        }
        crate::decode::charge::take(LOCATION_BYTES, "converting a gperftools profile")?;
        self.locations.push(Location {
            id: self.locations.len() as u64 + 1,
            address,
            ..Location::default()
        });
        let id = self.locations.len() as u64;
        self.by_address.insert(address, id);
        Ok(id)
    }

    /// Adds a sample of `addresses` (leaf first, already adjusted).
    fn sample(&mut self, addresses: &[u64], value: Vec<i64>, label: Vec<Label>) -> Result<()> {
        if self.samples.len() >= self.limits.max_samples {
            return Err(Error::TooLarge {
                what: "number of samples",
                limit: self.limits.max_samples,
            });
        }
        self.frames += addresses.len();
        if self.frames > self.limits.max_decompressed_bytes / 8 {
            return Err(Error::TooLarge {
                what: "frames of all samples (the decompressed-size limit)",
                limit: self.limits.max_decompressed_bytes / 8,
            });
        }
        crate::decode::charge::take(
            (addresses.len() + value.len() + RECORD_SLOTS) * std::mem::size_of::<u64>()
                + label.len() * std::mem::size_of::<Label>(),
            "converting a gperftools profile",
        )?;
        let location_id = addresses
            .iter()
            .map(|&a| self.location(a))
            .collect::<Result<_>>()?;
        self.samples.push(Sample {
            location_id,
            value,
            label,
        });
        Ok(())
    }

    fn value_type(&mut self, t: &str, u: &str) -> Result<ValueType> {
        Ok(ValueType {
            r#type: self.strings.get(t)?,
            unit: self.strings.get(u)?,
        })
    }

    /// The profile, its locations in the mappings of `maps` (a process's memory map).
    fn finish(
        mut self,
        sample_type: Vec<ValueType>,
        period_type: ValueType,
        period: i64,
        maps: &[u8],
    ) -> Result<Profile> {
        let mut mappings = parse_maps(maps, &self.limits)?;
        massage(&mut mappings);
        // Each location in the first mapping holding its address, else one spanning all.
        // A process's mappings do not overlap: an address is found by binary search among
        // them by start. Overlapping ones (no real map) are searched in order, if that is
        // few enough probes.
        let mut by_start: Vec<(u64, u64, usize)> = mappings
            .iter()
            .enumerate()
            .map(|(i, m)| (m.start, m.limit, i))
            .collect();
        by_start.sort_unstable();
        let disjoint = by_start.windows(2).all(|w| w[0].1 <= w[1].0);
        let probes = self.locations.len().saturating_mul(mappings.len());
        if !disjoint && probes > MAX_MAP_PROBES {
            return Err(invalid(
                "gperftools",
                "the memory map".into(),
                format!(
                    "{} overlapping mappings for {} addresses: more than {MAX_MAP_PROBES} \
                     probes to place them (a process's mappings do not overlap)",
                    mappings.len(),
                    self.locations.len()
                ),
            ));
        }
        let mut fake = None;
        for l in &mut self.locations {
            if l.address == 0 {
                continue;
            }
            let found = if disjoint {
                let k = by_start.partition_point(|&(start, _, _)| start <= l.address);
                k.checked_sub(1)
                    .map(|k| by_start[k])
                    .filter(|&(_, limit, _)| l.address < limit)
                    .map(|(_, _, i)| i)
            } else {
                mappings
                    .iter()
                    .position(|m| m.start <= l.address && l.address < m.limit)
            };
            l.mapping_id = match found {
                Some(i) => i as u64 + 1,
                None => *fake.get_or_insert_with(|| {
                    mappings.push(Map {
                        start: 0,
                        limit: u64::MAX,
                        offset: 0,
                        file: String::new(),
                    });
                    mappings.len() as u64
                }),
            };
        }
        let mapping = mappings
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Ok(Mapping {
                    id: i as u64 + 1,
                    memory_start: m.start,
                    memory_limit: m.limit,
                    file_offset: m.offset,
                    filename: self.strings.get(&m.file)?,
                    ..Mapping::default()
                })
            })
            .collect::<Result<_>>()?;
        Ok(Profile {
            sample_type,
            sample: self.samples,
            mapping,
            location: self.locations,
            string_table: self.strings.into_table(),
            period_type: Some(period_type),
            period,
            ..Profile::default()
        })
    }
}

/// Most address-in-mapping tests a profile whose mappings overlap may take (see
/// `Builder::finish`): a few tenths of a second.
const MAX_MAP_PROBES: usize = 1 << 26;

/// One executable mapping of a memory map.
struct Map {
    start: u64,
    limit: u64,
    offset: u64,
    file: String,
}

/// Most executable mappings a memory map may list: a process has at most
/// `vm.max_map_count` mappings of any kind (65,530 by default, 262,144 where databases
/// raise it), and few executable ones.
const MAX_MAPS: usize = 1 << 18;

/// What an executable mapping takes besides its file's name, charged as it is read: its
/// [`Map`] (twice while [`massage`] merges), its place in `finish`'s search, and the
/// profile's [`Mapping`] (validation charges its own copy when it makes it).
const MAP_BYTES: usize = 2 * std::mem::size_of::<Map>()
    + std::mem::size_of::<(u64, u64, usize)>()
    + std::mem::size_of::<Mapping>();

/// The executable mappings of `/proc/self/maps` lines (`start-end perms offset dev inode
/// path`); other lines are skipped. At most [`MAX_MAPS`], and no more than a profile may
/// have locations (each location is in one; the protobuf path bounds mappings the same
/// way), each charged as it is read: six bytes of map (`0-1 x\n`) are some 300 bytes of
/// mapping once made.
fn parse_maps(maps: &[u8], limits: &Limits) -> Result<Vec<Map>> {
    let limit = limits.max_locations.clamp(1, MAX_MAPS);
    let mut out = Vec::new();
    for line in maps.split(|&b| b == b'\n') {
        let line = text(line)?;
        let mut parts = line.split_whitespace();
        let Some((start, end)) = parts.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        let (Some(start), Some(end)) = (hex(start), hex(end)) else {
            continue;
        };
        let perms = parts.next().unwrap_or("");
        if !perms.contains('x') {
            continue;
        }
        let offset = parts.next().and_then(hex).unwrap_or(0);
        let _device = parts.next();
        let _inode = parts.next();
        let file = parts.next().unwrap_or("");
        if start < end {
            if out.len() == limit {
                return Err(Error::TooLarge {
                    what: "executable mappings of a gperftools profile's memory map",
                    limit,
                });
            }
            crate::decode::charge::take(
                MAP_BYTES + 2 * file.len(),
                "reading a gperftools memory map",
            )?;
            out.push(Map {
                start,
                limit: end,
                offset,
                file: file.to_owned(),
            });
        }
    }
    Ok(out)
}

/// pprof's clean-up of a memory map: adjacent pieces of one file become one mapping, the
/// main binary (the first file that is not a shared library) comes first, and a binary
/// mapped at 0x400000 starts there at offset 0.
fn massage(maps: &mut Vec<Map>) {
    let mut merged: Vec<Map> = Vec::with_capacity(maps.len());
    for m in maps.drain(..) {
        if let Some(last) = merged.last_mut() {
            let adjacent = (last.file == m.file || last.file.is_empty() || m.file.is_empty())
                && last.limit == m.start
                && (last.offset == 0
                    || m.offset == 0
                    || last.offset.checked_add(last.limit - last.start) == Some(m.offset));
            if adjacent {
                last.limit = m.limit;
                if !m.file.is_empty() {
                    last.file = m.file;
                }
                continue;
            }
        }
        merged.push(m);
    }
    let is_library = |f: &str| {
        let f = f.trim_end_matches("(deleted)").trim();
        f.is_empty()
            || f.starts_with('[')
            || f.ends_with(".so")
            || f.contains(".so.")
            || f.contains(".so_")
    };
    if let Some(main) = merged.iter().position(|m| !is_library(&m.file)) {
        merged.swap(0, main);
    }
    if let Some(first) = merged.first_mut()
        && first.start.wrapping_sub(first.offset) == 0x40_0000
    {
        first.start = 0x40_0000;
        first.offset = 0;
    }
    *maps = merged;
}

/// A gperftools CPU profile.
fn cpu(data: &[u8], w: Words, limits: &Limits) -> Result<Profile> {
    let bad = |word: usize, reason: String| invalid("cpu profile", format!("word {word}"), reason);
    let period_us = w.get(data, 3).unwrap_or(0);
    let period = i64::try_from(period_us)
        .ok()
        .and_then(|p| p.checked_mul(1000))
        .ok_or_else(|| bad(3, format!("the period {period_us} us overflows")))?;
    let mut b = Builder::new(limits);
    let words = data.len() / w.size;
    let mut at = 5;
    let mut stacks: Vec<(u64, Vec<u64>)> = Vec::new();
    let mut pace = crate::decode::charge::Pace::new();
    let maps_from = loop {
        if at >= words {
            break data.len();
        }
        pace.tick()?;
        // Each record is a sample: refused past the limit before it is read, not after
        // all are (16 M empty records are 128 MB of words, a gigabyte read).
        if stacks.len() >= limits.max_samples {
            return Err(Error::TooLarge {
                what: "number of samples",
                limit: limits.max_samples,
            });
        }
        let (Some(count), Some(depth)) = (w.get(data, at), w.get(data, at + 1)) else {
            return Err(bad(at, "the profile ends inside a record".into()));
        };
        let left = words.saturating_sub(at + 2) as u64;
        if depth > left {
            return Err(bad(
                at,
                format!("a record of {depth} frames, but {left} words are left"),
            ));
        }
        let depth = depth as usize;
        crate::decode::charge::take(
            (depth * 2 + RECORD_SLOTS) * std::mem::size_of::<u64>(),
            "reading a gperftools profile",
        )?;
        let pcs: Vec<u64> = (0..depth)
            .map(|i| w.get(data, at + 2 + i).unwrap_or(0))
            .collect();
        at += 2 + depth;
        if count == 0 && depth == 1 && pcs[0] == 0 {
            break at * w.size;
        }
        if depth > limits.max_stack_depth {
            return Err(bad(
                at,
                format!(
                    "a stack of {depth} frames (the limit is {})",
                    limits.max_stack_depth
                ),
            ));
        }
        // Return addresses point one byte back, into the call.
        let addresses: Vec<u64> = pcs
            .iter()
            .enumerate()
            .map(|(i, &a)| if i > 0 { a.wrapping_sub(1) } else { a })
            .collect();
        stacks.push((count, addresses));
    };
    strip_signal_frame(&mut stacks);
    for (count, mut addresses) in stacks {
        pace.tick()?;
        // A leaf the unwinder reported again as its caller.
        if addresses.len() > 1 && addresses[0] == addresses[1].wrapping_add(1) {
            addresses.remove(1);
        }
        let count = i64::try_from(count)
            .map_err(|_| invalid("cpu profile", String::new(), format!("a count of {count}")))?;
        let cpu = count.saturating_mul(period);
        b.sample(&addresses, vec![count, cpu], Vec::new())?;
    }
    let sample_type = vec![
        b.value_type("samples", "count")?,
        b.value_type("cpu", "nanoseconds")?,
    ];
    let period_type = b.value_type("cpu", "nanoseconds")?;
    b.finish(
        sample_type,
        period_type,
        period,
        &data[maps_from.min(data.len())..],
    )
}

/// Drops the frame almost every sample has second (the profiler's signal handler), at most
/// twice, as pprof does.
fn strip_signal_frame(stacks: &mut [(u64, Vec<u64>)]) {
    let margin = stacks.len() / 32;
    for _ in 0..2 {
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for (_, a) in stacks.iter() {
            if a.len() > 1 {
                *counts.entry(a[1]).or_default() += 1;
            }
        }
        let Some((&address, _)) = counts
            .iter()
            .find(|(_, n)| **n >= stacks.len().saturating_sub(margin))
        else {
            return;
        };
        for (_, a) in stacks.iter_mut() {
            if a.len() > 1 && a[1] == address {
                a.remove(1);
            }
        }
    }
}

/// The text after `@` of a sample line: its addresses, each adjusted one byte back; past
/// `most` of them, an error (before, a line of millions was split whole before its depth
/// was checked: 256 MiB of addresses from a body of 128).
fn addresses(text: &str, format: &'static str, line: usize, most: usize) -> Result<Vec<u64>> {
    text.split_whitespace()
        .enumerate()
        .map(|(i, a)| {
            if i >= most {
                return Err(invalid(
                    format,
                    format!("line {line}"),
                    format!("a stack of more than {most} frames"),
                ));
            }
            a.strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .map(|a| a.wrapping_sub(1))
                .ok_or_else(|| {
                    invalid(
                        format,
                        format!("line {line}"),
                        format!("{a:?} is not an address"),
                    )
                })
        })
        .collect()
}

/// Reads `n: m` (two decimal numbers around a colon).
fn pair(s: &str) -> Option<Pair> {
    let (a, b) = s.split_once(':')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// A count of objects (or contentions) and their bytes (or delay).
type Pair = (i64, i64);

/// `n: m [n2: m2] @ rest`: the two pairs and what follows `@`.
fn counts_line(line: &str) -> Option<(Pair, Pair, &str)> {
    let (counts, rest) = line.split_once('@')?;
    let (first, second) = counts.split_once('[')?;
    let second = second.trim().strip_suffix(']')?;
    Some((pair(first)?, pair(second)?, rest))
}

fn is_maps_sentinel(line: &str) -> bool {
    line.contains("--- Memory map: ---") || line.contains("MAPPED_LIBRARIES:")
}

/// The lines after a text profile's header (trimmed, numbered from 2, blank and `#` lines
/// left out) up to its memory map, read one at a time (a parse stops at the first bad one,
/// and never holds them all); then where the map's text starts ([`BodyLines::maps_from`]).
fn body_lines(data: &[u8]) -> BodyLines<'_> {
    fn newline(b: &u8) -> bool {
        *b == b'\n'
    }
    BodyLines {
        lines: data.split_inclusive(newline as fn(&u8) -> bool).enumerate(),
        end: 0,
        maps_from: None,
        len: data.len(),
    }
}

/// A profile's lines, numbered from 0.
type Lines<'a> = std::iter::Enumerate<std::slice::SplitInclusive<'a, u8, fn(&u8) -> bool>>;

struct BodyLines<'a> {
    lines: Lines<'a>,
    /// Bytes of the lines read so far.
    end: usize,
    maps_from: Option<usize>,
    len: usize,
}

impl BodyLines<'_> {
    /// Where the memory map's text starts, once the lines are read (the end when none).
    fn maps_from(&self) -> usize {
        self.maps_from.unwrap_or(self.len)
    }
}

impl Iterator for BodyLines<'_> {
    type Item = (usize, String);

    fn next(&mut self) -> Option<(usize, String)> {
        if self.maps_from.is_some() {
            return None;
        }
        loop {
            let (n, line) = self.lines.next()?;
            self.end += line.len();
            if n == 0 {
                continue;
            }
            // Nothing in a profile's lines is other than ASCII: a line that is not text is
            // named as such (its copy, invalid bytes replaced, would be up to three times
            // its bytes, and a line may be the whole body).
            let Ok(line) = std::str::from_utf8(line) else {
                return Some((n + 1, "(a line that is not UTF-8 text)".to_owned()));
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if is_maps_sentinel(line) {
                self.maps_from = Some(self.end);
                return None;
            }
            return Some((n + 1, line.to_owned()));
        }
    }
}

/// A text heap profile.
fn heap(data: &[u8], limits: &Limits) -> Result<Profile> {
    const F: &str = "heap profile";
    let header = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let header = text(header)?;
    let bad_header = || {
        invalid(
            F,
            "line 1".into(),
            format!("{:?} is not a heap profile header", header.trim()),
        )
    };
    let body = header
        .trim()
        .strip_prefix("heap profile:")
        .ok_or_else(bad_header)?;
    let (inuse, alloc, kind) = counts_line(body).ok_or_else(bad_header)?;
    let kind = kind.trim();
    let (name, rate) = match kind.split_once('/') {
        Some((n, r)) if !r.is_empty() => (n, r.parse::<i64>().map_err(|_| bad_header())?),
        Some((n, _)) => (n, 0),
        None => (kind, 0),
    };
    // (whether alloc pairs are kept, the period, the Poisson rate if sampled)
    let (mut has_alloc, period, sampled) = match name {
        "heap_v2" | "heapz_v2" => (true, rate, Some(rate)),
        "heap" => (true, rate / 2, Some(rate / 2)),
        "heapprofile" => (true, 1, None),
        "growth" | "growthz" | "fragmentation" | "fragmentationz" => (false, 1, None),
        _ => return Err(bad_header()),
    };
    has_alloc &= (alloc.0 != inuse.0 && alloc.0 != 0) || (alloc.1 != inuse.1 && alloc.1 != 0);
    let mut b = Builder::new(limits);
    let bytes_key = b.strings.get("bytes")?;
    let mut lines = body_lines(data);
    for (at, line) in lines.by_ref() {
        let line = line.as_str();
        let bad = |reason: String| invalid(F, format!("line {at}"), reason);
        let (inuse, alloc, stack) = counts_line(line)
            .ok_or_else(|| bad(format!("{line:?} is not `n: bytes [n: bytes] @ 0x…`")))?;
        let mut value = Vec::with_capacity(4);
        let mut block = 0;
        let mut add = |(count, size): Pair| -> Result<()> {
            if count == 0 && size != 0 {
                return Err(bad(format!("{size} bytes in 0 objects")));
            }
            if count < 0 || size < 0 {
                // Nothing allocates a negative amount (and i64::MIN / -1 overflows).
                return Err(bad(format!("a negative count or size ({count}: {size})")));
            }
            let (mut c, mut s) = (count, size);
            if count != 0 {
                block = size / count;
                if let Some(rate) = sampled {
                    (c, s) = scale_heap_sample(count, size, rate);
                }
            }
            value.extend([c, s]);
            Ok(())
        };
        if has_alloc {
            add(alloc)?;
        }
        add(inuse)?;
        let stack = addresses(stack, F, at, limits.max_stack_depth)?;
        let label = vec![Label {
            key: bytes_key,
            num: block,
            ..Label::default()
        }];
        b.sample(&stack, value, label)?;
    }
    let sample_type = if has_alloc {
        vec![
            b.value_type("alloc_objects", "count")?,
            b.value_type("alloc_space", "bytes")?,
            b.value_type("inuse_objects", "count")?,
            b.value_type("inuse_space", "bytes")?,
        ]
    } else {
        vec![
            b.value_type("objects", "count")?,
            b.value_type("space", "bytes")?,
        ]
    };
    let period_type = b.value_type("space", "bytes")?;
    b.finish(sample_type, period_type, period, &data[lines.maps_from()..])
}

/// pprof's estimate of what a sampled heap bucket stands for: objects of `size / count`
/// bytes are sampled with probability `1 - exp(-size / rate)`.
fn scale_heap_sample(count: i64, size: i64, rate: i64) -> (i64, i64) {
    if count == 0 || size == 0 {
        return (0, 0);
    }
    if rate <= 1 {
        return (count, size);
    }
    let average = size as f64 / count as f64;
    let scale = 1.0 / (1.0 - (-average / rate as f64).exp());
    ((count as f64 * scale) as i64, (size as f64 * scale) as i64)
}

/// A text contention profile.
fn contention(data: &[u8], limits: &Limits) -> Result<Profile> {
    const F: &str = "contention profile";
    let mut b = Builder::new(limits);
    let (mut cycles_per_second, mut period) = (0i64, 1i64);
    let mut in_samples = false;
    let mut lines = body_lines(data);
    for (at, line) in lines.by_ref() {
        let line = line.as_str();
        if line.starts_with("---") {
            if in_samples {
                continue;
            }
            in_samples = true;
            continue;
        }
        let bad = |reason: String| invalid(F, format!("line {at}"), reason);
        if !in_samples {
            if let Some((key, value)) = line.split_once('=') {
                let value = value.trim();
                let number = || {
                    let v = value.strip_prefix("0x").map_or_else(
                        || value.parse::<i64>().ok(),
                        |h| i64::from_str_radix(h, 16).ok(),
                    );
                    v.ok_or_else(|| bad(format!("{value:?} is not a number")))
                };
                match key.trim() {
                    "cycles/second" => cycles_per_second = number()?,
                    "sampling period" => period = number()?,
                    "ms since reset" | "discarded samples" => {
                        number()?;
                    }
                    other => return Err(bad(format!("unknown attribute {other:?}"))),
                }
                continue;
            }
            in_samples = true;
        }
        let (numbers, stack) = line
            .split_once('@')
            .ok_or_else(|| bad(format!("{line:?} is not `cycles count @ 0x…`")))?;
        let mut numbers = numbers.split_whitespace().map(str::parse::<i64>);
        let (Some(Ok(delay)), Some(Ok(count)), None) =
            (numbers.next(), numbers.next(), numbers.next())
        else {
            return Err(bad(format!("{line:?} is not `cycles count @ 0x…`")));
        };
        let (mut delay, mut count) = (delay, count);
        if period > 0 {
            if cycles_per_second > 0 {
                delay = (delay as f64 * period as f64 / (cycles_per_second as f64 / 1e9)) as i64;
            }
            count = count.saturating_mul(period);
        }
        let stack = addresses(stack, F, at, limits.max_stack_depth)?;
        b.sample(&stack, vec![count, delay], Vec::new())?;
    }
    let sample_type = vec![
        b.value_type("contentions", "count")?,
        b.value_type("delay", "nanoseconds")?,
    ];
    let period_type = b.value_type("contentions", "count")?;
    b.finish(sample_type, period_type, period, &data[lines.maps_from()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(p: &Profile) -> Vec<Vec<i64>> {
        p.sample.iter().map(|s| s.value.clone()).collect()
    }

    /// A sample line's addresses stop at the depth limit: the line is refused before the
    /// rest are split and kept (a line of millions made 2 bytes of addresses of each).
    #[test]
    fn a_stack_past_the_depth_limit_is_refused_as_it_is_read() {
        let limits = Limits {
            max_stack_depth: 100,
            ..Limits::default()
        };
        for head in [
            "heap profile: 1: 1 [1: 1] @ heapprofile\n1: 1 [1: 1] @",
            "--- contention:\ncycles/second=1000\n1 1 @",
        ] {
            let mut text = head.to_owned();
            text.push_str(&" 0x10".repeat(10_000));
            text.push('\n');
            let e = parse(text.as_bytes(), &limits).unwrap_err().to_string();
            assert!(e.contains("more than 100 frames"), "{e}");
            let fits = format!("{head}{}\n", " 0x10".repeat(100));
            parse(fits.as_bytes(), &limits).unwrap().unwrap();
        }
    }

    #[test]
    fn heap_values_scale_as_pprof_scales_them() {
        // google/pprof's testdata/gobench.heap: Go's old `heap/<2 × rate>` header.
        let text = "heap profile: 1: 524288 [3: 1572864] @ heap/1048576\n\
                    1: 524288 [3: 1572864] @ 0x420cef 0x420fa9 0x414b22\n";
        let p = parse(text.as_bytes(), &Limits::default()).unwrap().unwrap();
        assert_eq!(values(&p), [[4, 2488234, 1, 829411]]);
        assert_eq!(p.period, 524288);
        // Every frame of a heap sample is a return address.
        assert_eq!(p.location[0].address, 0x420cee);
        assert_eq!(p.sample[0].label[0].num, 524288);
        // Nothing freed: the in-use pair alone.
        let text = "heap profile: 2: 64 [2: 64] @ heapprofile\n2: 64 [2: 64] @ 0x10\n";
        let p = parse(text.as_bytes(), &Limits::default()).unwrap().unwrap();
        assert_eq!(values(&p), [[2, 64]]);
        assert_eq!(p.sample_type.len(), 2);
    }

    /// A heap profile of `addresses` distinct addresses (0x10 apart from 0x1000_0000, four
    /// to a sample) and `maps` mappings 0x100 long, `step` apart from 0x1000_0000.
    fn heap_over_maps(addresses: u64, maps: u64, step: u64) -> String {
        let mut text = String::from("heap profile: 1: 1 [1: 1] @ heapprofile\n");
        for first in (0..addresses).step_by(4) {
            text.push_str("1: 1 [1: 1] @");
            for a in first..(first + 4).min(addresses) {
                text.push_str(&format!(" {:#x}", 0x1000_0001 + 0x10 * a));
            }
            text.push('\n');
        }
        text.push_str("--- Memory map: ---\n");
        for m in 0..maps {
            let start = 0x1000_0000 + step * m;
            text.push_str(&format!(
                "{start:x}-{:x} r-xp 0 00:00 0 /lib{m}.so\n",
                start + 0x100
            ));
        }
        text
    }

    /// Each address is placed in the mapping holding it by binary search among disjoint
    /// mappings: 40,000 addresses among 40,000 mappings (1.6 billion tests, scanned one by
    /// one) are placed exactly. Overlapping mappings too many to scan are refused naming
    /// them; a map whose offsets overflow when merged is read, not a panic.
    #[test]
    fn addresses_are_placed_among_many_mappings_without_testing_every_one() {
        let p = parse(
            heap_over_maps(40_000, 40_000, 0x1000).as_bytes(),
            &Limits::default(),
        )
        .unwrap()
        .unwrap();
        let mappings: std::collections::HashMap<u64, &Mapping> =
            p.mapping.iter().map(|m| (m.id, m)).collect();
        // Addresses 0x10 apart: the first 16 of every 256 fall in a mapping's 0x100 bytes.
        let mut placed = 0;
        for l in &p.location {
            let m = mappings[&l.mapping_id];
            assert!(m.memory_start <= l.address && l.address < m.memory_limit);
            placed += usize::from(m.memory_limit != u64::MAX);
        }
        assert_eq!(placed, 40_000 / 256 * 16 + 16);
        // Mappings 0x80 apart, each 0x100 long: every one overlaps the next.
        let e = parse(
            heap_over_maps(40_000, 40_000, 0x80).as_bytes(),
            &Limits::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("40000 overlapping mappings"), "{e}");
        let p = parse(heap_over_maps(8, 2, 0x80).as_bytes(), &Limits::default())
            .unwrap()
            .unwrap();
        assert!(p.location.iter().all(|l| l.mapping_id == 1));
        let text = "heap profile: 1: 1 [1: 1] @ heapprofile\n1: 1 [1: 1] @ 0x1\n\
                    --- Memory map: ---\n0-1 r-xp ffffffffffffffff 00:00 0 /a\n\
                    1-2 r-xp 1 00:00 0 /a\n";
        let p = parse(text.as_bytes(), &Limits::default()).unwrap().unwrap();
        assert_eq!(
            p.mapping.len(),
            2,
            "not merged: their offsets are not adjacent"
        );
    }

    #[test]
    fn contention_delays_become_nanoseconds() {
        // google/pprof's testdata/cppbench.contention.
        let text = "--- contentionz 1 ---\ncycles/second = 3201000000\nsampling period = 100\n\
                    ms since reset = 16502830\ndiscarded samples = 0\n\
                    19490304 27 @ 0x7f6c4db7e6c8 0x7f6c4db7e2d8\n--- Memory map: ---\n\
                    00400000-00fcb000 r-xp 00000000 00:00 0 /bin/server\n";
        let p = parse(text.as_bytes(), &Limits::default()).unwrap().unwrap();
        assert_eq!(values(&p), [[2700, 608881724]]);
        assert_eq!(
            p.mapping.len(),
            2,
            "the binary's, and one for addresses outside it"
        );
    }

    #[test]
    fn broken_legacy_profiles_name_what_is_wrong() {
        assert!(
            parse(b"not a profile", &Limits::default())
                .unwrap()
                .is_none()
        );
        assert!(parse(b"", &Limits::default()).unwrap().is_none());
        // A CPU record claiming more frames than the file holds.
        let mut cpu: Vec<u8> = [0u64, 3, 0, 10_000, 0, 1, 1_000_000, 0x400000]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let e = parse(&cpu, &Limits::default()).unwrap_err().to_string();
        assert!(
            e.contains("word 5: a record of 1000000 frames, but 1 words are left"),
            "{e}"
        );
        // Whole: one sample of 1 count, 10 ms.
        cpu.truncate(5 * 8);
        cpu.extend(
            [1u64, 2, 0x401000, 0x402000, 0, 1, 0]
                .iter()
                .flat_map(|w| w.to_le_bytes()),
        );
        let p = parse(&cpu, &Limits::default()).unwrap().unwrap();
        assert_eq!(values(&p), [[1, 10_000_000]]);
        let text = "heap profile: 1: 8 [1: 8] @ heapprofile\n1: 8 [1: 8] @ 0xzz\n";
        let e = parse(text.as_bytes(), &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: \"0xzz\" is not an address"), "{e}");
        let text = "heap profile: 1: 8 [1: 8] @ heapprofile\n0: 8 [1: 8] @ 0x1\n";
        let e = parse(text.as_bytes(), &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("8 bytes in 0 objects"), "{e}");
        // i64::MIN bytes in -1 objects: refused, not divided (which overflows and panics).
        let text = "heap profile: 1: 1 [1: 1] @ heapprofile\n\
                    -1: -9223372036854775808 [0: 0] @ 0x1\n";
        let e = parse(text.as_bytes(), &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("a negative count or size"), "{e}");
        let text = "--- mutex:\ncycles/second = 1\nweird = 2\n";
        let e = parse(text.as_bytes(), &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown attribute \"weird\""), "{e}");
    }

    /// A CPU profile's records are refused past the sample limit as they are read, and
    /// charged as they are read and converted: 16 M empty records were a gigabyte before
    /// the limit was checked.
    #[test]
    fn records_are_charged_and_counted_as_they_are_read() {
        let cpu = |records: usize| {
            let mut data: Vec<u8> = [0u32, 3, 0, 10_000, 0]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            for i in 0..records as u32 {
                data.extend([1u32, 1, 0x1000 + i].iter().flat_map(|w| w.to_le_bytes()));
            }
            data
        };
        let data = cpu(100_000);
        let limits = Limits::default();
        let whole = parse(&data, &limits).unwrap().unwrap();
        assert_eq!(whole.sample.len(), 100_000);
        let budget = 4 << 20;
        let (got, asked) = crate::decode::charge::under_budget(budget, || parse(&data, &limits));
        let e = got.err().unwrap_or_else(|| panic!("converted uncharged"));
        assert!(e.to_string().contains("gperftools profile"), "{e}");
        assert!(asked > budget);
        let few = Limits {
            max_samples: 1000,
            ..Limits::default()
        };
        let e = parse(&cpu(1001), &few).err().unwrap();
        assert!(matches!(e, Error::TooLarge { limit: 1000, .. }), "{e}");
    }

    /// A memory map's lines are counted and charged as they are read: six bytes a line
    /// (`0-1 x`) were some 300 bytes of mappings each, none charged, and 22 M of them (a
    /// 130 KB gzip body) 3 to 5 GB, for a profile of no samples.
    #[test]
    fn memory_map_lines_are_counted_and_charged_as_they_are_read() {
        let cpu = |maps: usize| {
            let mut data: Vec<u8> = [0u32, 3, 0, 10_000, 0, 0, 1, 0]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
            for i in 0..maps as u64 {
                data.extend(format!("{:x}-{:x} r-xp 0 0 0 x\n", 2 * i, 2 * i + 1).bytes());
            }
            data
        };
        let few = Limits {
            max_locations: 1000,
            ..Limits::default()
        };
        assert_eq!(
            parse(&cpu(1000), &few).unwrap().unwrap().mapping.len(),
            1000
        );
        let e = parse(&cpu(1001), &few).err().unwrap();
        assert!(matches!(e, Error::TooLarge { limit: 1000, .. }), "{e}");
        assert!(e.to_string().contains("memory map"), "{e}");
        let data = cpu(50_000);
        let budget = 4 << 20;
        let (got, asked) =
            crate::decode::charge::under_budget(budget, || parse(&data, &Limits::default()));
        let e = got.err().unwrap_or_else(|| panic!("read uncharged"));
        assert!(e.to_string().contains("gperftools memory map"), "{e}");
        assert!(asked > budget);
    }

    /// Text that is not UTF-8 is charged before it is copied, or named: its copy, invalid
    /// bytes replaced, is up to three times its bytes, and one line may be the whole body.
    #[test]
    fn text_that_is_not_utf8_is_charged_or_named() {
        let not_text = vec![0xffu8; 1 << 20];
        let heap = [
            b"heap profile: 1: 8 [1: 8] @ heapprofile".as_slice(),
            &not_text,
        ]
        .concat();
        let (got, _) =
            crate::decode::charge::under_budget(1 << 20, || parse(&heap, &Limits::default()));
        let e = got.err().unwrap_or_else(|| panic!("copied uncharged"));
        assert!(e.to_string().contains("gperftools profile's text"), "{e}");
        let line = [
            b"heap profile: 1: 8 [1: 8] @ heapprofile\n".as_slice(),
            &not_text,
            b"\n",
        ]
        .concat();
        let e = parse(&line, &Limits::default()).err().unwrap().to_string();
        assert!(
            e.contains("line 2: \"(a line that is not UTF-8 text)\""),
            "{e}"
        );
        let mut cpu: Vec<u8> = [0u32, 3, 0, 10_000, 0, 0, 1, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        cpu.extend(b"0-1 r-xp 0 0 0 /");
        cpu.extend(&not_text);
        let (got, _) =
            crate::decode::charge::under_budget(1 << 20, || parse(&cpu, &Limits::default()));
        let e = got.err().unwrap_or_else(|| panic!("copied uncharged"));
        assert!(e.to_string().contains("gperftools profile's text"), "{e}");
    }
}
