//! Decoding pprof: gzip or raw protobuf, bounded in memory, then checked field by field so
//! that everything downstream can index without checking again.

pub(crate) mod charge;
mod flat;
mod wire;

use std::io::Read;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::proto::Profile;

pub(crate) use flat::{Flat, SampleRef, Stack};

/// Bounds on what a decoded profile may hold.
///
/// # Defaults
/// | limit | default |
/// |---|---|
/// | `max_decompressed_bytes` | 256 MiB |
/// | `max_samples` | 4 Mi |
/// | `max_locations` | 4 Mi |
/// | `max_functions` | 4 Mi |
/// | `max_stack_depth` | 4 096 frames (inlined ones counted) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest protobuf accepted, after decompression.
    pub max_decompressed_bytes: usize,
    /// Most samples.
    pub max_samples: usize,
    /// Most locations.
    pub max_locations: usize,
    /// Most functions.
    pub max_functions: usize,
    /// Deepest stack, in frames: each location counts its lines (the calls inlined at
    /// it), at least one. Reports cut stacks deeper than
    /// [`report::MAX_STACK_DEPTH`](crate::report::MAX_STACK_DEPTH) (this limit's default),
    /// stored with a larger limit or before this one counted inlined frames.
    pub max_stack_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_decompressed_bytes: 256 << 20,
            max_samples: 4 << 20,
            max_locations: 4 << 20,
            max_functions: 4 << 20,
            max_stack_depth: 4096,
        }
    }
}

impl Limits {
    /// Whether these limits are each at most `other`'s: what passed them passes `other`.
    pub fn within(&self, other: &Limits) -> bool {
        self.max_decompressed_bytes <= other.max_decompressed_bytes
            && self.max_samples <= other.max_samples
            && self.max_locations <= other.max_locations
            && self.max_functions <= other.max_functions
            && self.max_stack_depth <= other.max_stack_depth
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field,
        reason: reason.into(),
    }
}

/// The raw protobuf of `bytes`: gunzipped when they start with the gzip magic, never more
/// than `limit` bytes.
///
/// Under [`charging`](crate::charging), what it makes is charged before it is made: the
/// size the gzip trailer states, then (when that is not all: several members, or a lie)
/// each further MiB as it is inflated.
pub fn inflate(bytes: &[u8], limit: usize) -> Result<std::borrow::Cow<'_, [u8]>> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return raw(bytes, limit).map(std::borrow::Cow::Borrowed);
    }
    let stated = stated_size(bytes, limit);
    charge::charge(stated, "gunzipping")?;
    let mut out = Vec::new();
    if let Some(n) = inflate_whole(bytes, limit, &mut out) {
        out.truncate(n);
        return Ok(std::borrow::Cow::Owned(out));
    }
    inflate_stream(bytes, limit, stated).map(std::borrow::Cow::Owned)
}

/// What the last gzip trailer of `bytes` says they inflate to, at most `limit`.
fn stated_size(bytes: &[u8], limit: usize) -> usize {
    bytes
        .len()
        .checked_sub(4)
        .and_then(|at| <[u8; 4]>::try_from(&bytes[at..]).ok())
        .map_or(0, |t| u32::from_le_bytes(t) as usize)
        .min(limit)
}

/// `bytes`, a raw protobuf, if within `limit`.
fn raw(bytes: &[u8], limit: usize) -> Result<&[u8]> {
    if bytes.len() > limit {
        return Err(Error::TooLarge {
            what: "profile",
            limit,
        });
    }
    Ok(bytes)
}

/// `parse` of the raw protobuf of `bytes` (see [`inflate`]), gunzipped into a buffer reused
/// from one profile to the next: the protobuf is only read while parsing into flat arrays,
/// and a fresh buffer each time (zeroed, then filled) was cold memory for every profile.
/// The last buffer given back is the first taken, still warm; a few small ones are kept.
fn with_raw<T>(bytes: &[u8], limit: usize, parse: impl Fn(&[u8]) -> Result<T>) -> Result<T> {
    /// Buffers kept, and the largest kept: at most 8 MiB held between profiles.
    const KEPT: usize = 8;
    const KEPT_BYTES: usize = 1 << 20;
    static SCRATCH: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
    let pool = || {
        SCRATCH
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };

    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return parse(raw(bytes, limit)?);
    }
    // What the trailer says the profile inflates to, charged before it is made (what is
    // over, when it lies or there are several members, as it is made).
    let stated = stated_size(bytes, limit);
    charge::charge(stated, "gunzipping a profile")?;
    let mut buffer = pool().pop().unwrap_or_default();
    let parsed = inflate_whole(bytes, limit, &mut buffer).map(|n| parse(&buffer[..n]));
    if buffer.capacity() <= KEPT_BYTES {
        let mut pool = pool();
        if pool.len() < KEPT {
            pool.push(buffer);
        }
    }
    match parsed {
        Some(parsed) => parsed,
        None => parse(&inflate_stream(bytes, limit, stated)?),
    }
}

/// A gzip stream of any number of members, inflated by streaming: stops at `limit` and
/// names what is wrong.
/// `charged`: bytes already charged for it; past them, each MiB is charged before it is
/// inflated.
fn inflate_stream(bytes: &[u8], limit: usize, charged: usize) -> Result<Vec<u8>> {
    const STEP: usize = 1 << 20;
    let mut charged = charged;
    // pprof compresses about 4:1.
    let mut out = Vec::with_capacity(
        bytes
            .len()
            .saturating_mul(4)
            .min(limit)
            .min(charged.max(STEP)),
    );
    let mut decoder =
        flate2::read::MultiGzDecoder::new(bytes).take((limit as u64).saturating_add(1));
    loop {
        if out.len() + STEP > charged {
            charge::charge(STEP, "gunzipping")?;
            charged += STEP;
        }
        let before = out.len();
        (&mut decoder)
            .take(STEP as u64)
            .read_to_end(&mut out)
            .map_err(|e| Error::Gzip(e.to_string()))?;
        if out.len() == before {
            break;
        }
    }
    if out.len() > limit {
        return Err(Error::TooLarge {
            what: "decompressed profile",
            limit,
        });
    }
    Ok(out)
}

/// A gzip stream of one member (what Go's and Python's writers produce) inflated by
/// libdeflate (whole-buffer inflate, about 1.6 times zlib-rs's speed on real profiles) into
/// the first bytes of `out`, as many as its trailer states (`out` grows to hold them; what
/// it held past them is left), with a per-thread decompressor. The size, or `None`, for
/// the caller to stream instead, when that size is over `limit`, the data is damaged, or
/// the file may hold more than one member.
///
/// libdeflate stops at the end of the first member and checks that member's own trailer:
/// it never says where the member ended. A file of several members is caught by looking for
/// the first member's trailer (its checksum and size, which libdeflate checked) anywhere
/// before the file's last eight bytes: in a file of several members it is there, so such a
/// file, and the rare single member whose data happens to hold those eight bytes, are
/// streamed, which reads every member.
fn inflate_whole(bytes: &[u8], limit: usize, out: &mut Vec<u8>) -> Option<usize> {
    thread_local! {
        static INFLATER: std::cell::RefCell<libdeflater::Decompressor> =
            std::cell::RefCell::new(libdeflater::Decompressor::new());
    }
    // Magic and deflate, a header of at least 10 bytes and the trailer.
    if bytes.len() < 18 || bytes[..3] != [0x1f, 0x8b, 8] {
        return None;
    }
    let trailer = &bytes[bytes.len() - 8..];
    let size = u32::from_le_bytes(trailer[4..].try_into().ok()?) as usize;
    if size > limit {
        return None;
    }
    if out.len() < size {
        out.resize(size, 0);
    }
    let out = &mut out[..size];
    let n = INFLATER
        .with(|inflater| inflater.borrow_mut().gzip_decompress(bytes, out))
        .ok()?;
    if n != size {
        return None;
    }
    // libdeflate checked that the first member's trailer is this checksum and size: unless
    // the only place those bytes are is the file's end, the first member may not be all.
    let mut first = [0u8; 8];
    first[..4].copy_from_slice(&libdeflater::crc32(out).to_le_bytes());
    first[4..].copy_from_slice(&(size as u32).to_le_bytes());
    let one_member =
        first == *trailer && memchr::memmem::find(&bytes[..bytes.len() - 1], &first).is_none();
    one_member.then_some(size)
}

/// A profile whose every reference has been checked (by [`validate`] or [`decode`]): the
/// only kind the store takes, so nothing downstream indexes out of range.
///
/// It is held in flat arrays, which the store reads; the prost [`Profile`] it dereferences
/// to is built on first use (for a decoded profile), or is the one given to [`validate`].
#[derive(Debug, Clone)]
pub struct ValidProfile {
    flat: Flat,
    full: OnceLock<Profile>,
    /// Where each mapping, function and location id is, found while checking them.
    pub(crate) ids: Ids,
}

impl ValidProfile {
    /// The profile.
    pub fn into_inner(mut self) -> Profile {
        match self.full.take() {
            Some(p) => p,
            None => self.flat.to_profile(),
        }
    }

    /// The profile in flat arrays, as the store reads it.
    pub(crate) fn flat(&self) -> &Flat {
        &self.flat
    }

    /// When the profile was taken (`time_nanos`), without building the prost form.
    pub fn time_nanos(&self) -> i64 {
        self.flat.time_nanos
    }

    /// String table entry `i` (`""` when out of range), without building the prost form.
    pub fn string(&self, i: i64) -> &str {
        self.flat.string(i)
    }

    /// The sample types, without building the prost form.
    pub fn sample_types(&self) -> &[crate::proto::ValueType] {
        &self.flat.sample_type
    }

    /// The period type, without building the prost form.
    pub fn period_type(&self) -> Option<&crate::proto::ValueType> {
        self.flat.period_type.as_ref()
    }
}

impl Drop for ValidProfile {
    fn drop(&mut self) {
        std::mem::take(&mut self.flat).recycle();
    }
}

impl PartialEq for ValidProfile {
    fn eq(&self, other: &Self) -> bool {
        self.flat == other.flat
    }
}

impl std::ops::Deref for ValidProfile {
    type Target = Profile;

    fn deref(&self) -> &Profile {
        self.full.get_or_init(|| self.flat.to_profile())
    }
}

/// Positions of a profile's messages by id. Ids are usually 1..=n in order (Go's writer):
/// the position is the id minus one and nothing is built. Ids that are small but out of
/// order or with gaps (a writer numbering functions by a global index) get a table indexed
/// by id, at most [`Positions::DENSE_SLACK`] times the message count plus a constant; only
/// larger ids (addresses, hashes) pay for a hash map.
#[derive(Debug, Clone)]
pub(crate) struct Positions {
    len: usize,
    lookup: Lookup,
}

#[derive(Debug, Clone)]
enum Lookup {
    /// Id `i + 1` is at position `i`.
    InOrder,
    Table(Stamped),
    Map(std::collections::HashMap<u64, usize, foldhash::fast::RandomState>),
}

/// Positions by id in a table that is not cleared between profiles: a slot holds the stamp
/// of the profile that wrote it above the position, and only slots bearing this table's
/// stamp are set. Tables are kept per thread for the next profile decoded there: filling a
/// fresh one (tens of KiB for a few hundred ids numbered by a global index) cost more than
/// everything else about it.
#[derive(Debug, Clone, Default)]
struct Stamped {
    stamp: u32,
    slots: Vec<u64>,
}

/// Values a thread keeps from one profile to the next (last given back, first taken).
type Kept<T> = std::thread::LocalKey<std::cell::RefCell<Vec<T>>>;

/// The value `kept` was last given on this thread, if any.
fn take_kept<T>(kept: &'static Kept<T>) -> Option<T> {
    // A thread being torn down has nothing.
    kept.try_with(|kept| kept.borrow_mut().pop()).ok().flatten()
}

/// Gives `value` to `kept` for a later profile on this thread, unless it holds `most`.
fn keep<T>(kept: &'static Kept<T>, value: T, most: usize) {
    // A thread being torn down keeps nothing.
    let _ = kept.try_with(|kept| {
        let mut kept = kept.borrow_mut();
        if kept.len() < most {
            kept.push(value);
        }
    });
}

thread_local! {
    /// Tables of profiles dropped on this thread, for the next ones decoded here.
    static TABLES: std::cell::RefCell<Vec<Stamped>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Stamped {
    /// Tables kept per thread (a profile has up to three), and the largest kept (8 bytes a
    /// slot): at most 768 KiB a thread.
    const KEPT: usize = 3;
    const KEPT_SLOTS: usize = 1 << 15;

    /// A table with no position set and room for ids up to `max`.
    fn take(max: usize) -> Self {
        let mut table = take_kept(&TABLES).unwrap_or_default();
        table.stamp = table.stamp.wrapping_add(1);
        if table.stamp == 0 {
            // Stamps came round again: the old ones would read as set.
            table.slots.fill(0);
            table.stamp = 1;
        }
        if table.slots.len() <= max {
            // Stamp 0 is never a table's: new slots are unset.
            table.slots.resize(max + 1, 0);
        }
        table
    }

    /// Sets `id` at `position`; false when it is set already.
    fn set(&mut self, id: usize, position: u32) -> bool {
        let stamp = u64::from(self.stamp) << 32;
        let slot = &mut self.slots[id];
        if *slot & !u64::from(u32::MAX) == stamp {
            return false;
        }
        *slot = stamp | u64::from(position);
        true
    }

    #[inline]
    fn get(&self, id: usize) -> Option<usize> {
        let slot = *self.slots.get(id)?;
        (slot >> 32 == u64::from(self.stamp)).then_some(slot as u32 as usize)
    }
}

impl Drop for Positions {
    fn drop(&mut self) {
        let Lookup::Table(table) = &mut self.lookup else {
            return;
        };
        if table.slots.capacity() <= Stamped::KEPT_SLOTS {
            keep(&TABLES, std::mem::take(table), Stamped::KEPT);
        }
    }
}

impl Positions {
    /// A table indexed by id is used while the largest id is at most this many times the
    /// message count plus [`Positions::DENSE_BASE`]: a slot costs less than hashing, and
    /// tables are reused without clearing ([`Stamped`]), so a table of 128 KiB for a few
    /// hundred ids (a writer numbering functions by a global index of some thousands) is
    /// still the cheaper.
    const DENSE_SLACK: u64 = 16;
    const DENSE_BASE: u64 = 16 * 1024;
    /// About what a map holds an id in.
    const MAP_BYTES: usize = 34;

    /// The positions of `ids`, or `repeated` of the first id that is zero or repeated. Its
    /// lookup is charged before it is made: held with the profile until it is stored, a
    /// request's profiles all at once (one location of id 16,400 was a table of 131 KiB,
    /// and a push of 40,000 such 20-byte profiles held 15 GB, charged 176 bytes each), and
    /// three tables of 512 MiB were made and zero-filled before their charge was refused.
    fn new(
        ids: impl ExactSizeIterator<Item = u64> + Clone,
        repeated: impl Fn(u64) -> Error,
    ) -> Result<Self> {
        let len = ids.len();
        let (mut in_order, mut max) = (true, 0);
        for (i, id) in ids.clone().enumerate() {
            in_order &= id == i as u64 + 1;
            max = max.max(id);
        }
        if in_order {
            return Ok(Self {
                len,
                lookup: Lookup::InOrder,
            });
        }
        let lookup = if max <= Self::DENSE_SLACK * len as u64 + Self::DENSE_BASE
            && len < u32::MAX as usize
        {
            charge::take((max as usize + 1) * 8, "a profile's id tables")?;
            let mut table = Stamped::take(max as usize);
            for (i, id) in ids.enumerate() {
                if id == 0 || !table.set(id as usize, i as u32) {
                    return Err(repeated(id));
                }
            }
            Lookup::Table(table)
        } else {
            charge::take(len.saturating_mul(Self::MAP_BYTES), "a profile's id tables")?;
            let mut map =
                std::collections::HashMap::with_capacity_and_hasher(len, Default::default());
            for (i, id) in ids.enumerate() {
                if id == 0 || map.insert(id, i).is_some() {
                    return Err(repeated(id));
                }
            }
            Lookup::Map(map)
        };
        Ok(Self { len, lookup })
    }

    /// The position of `id`.
    #[inline]
    pub(crate) fn get(&self, id: u64) -> Option<usize> {
        match &self.lookup {
            Lookup::InOrder => id
                .checked_sub(1)
                .map(|i| i as usize)
                .filter(|i| *i < self.len),
            Lookup::Table(table) => usize::try_from(id).ok().and_then(|id| table.get(id)),
            Lookup::Map(map) => map.get(&id).copied(),
        }
    }

    fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }
}

/// The positions of a profile's mappings, functions and locations by id.
#[derive(Debug, Clone)]
pub(crate) struct Ids {
    pub(crate) mappings: Positions,
    pub(crate) functions: Positions,
    pub(crate) locations: Positions,
}

impl Ids {
    /// The position of mapping `id`.
    #[inline]
    pub(crate) fn mapping(&self, id: u64) -> Result<usize> {
        self.mappings.get(id).ok_or_else(|| dangling("mapping", id))
    }

    /// The position of function `id`.
    #[inline]
    pub(crate) fn function(&self, id: u64) -> Result<usize> {
        self.functions
            .get(id)
            .ok_or_else(|| dangling("function", id))
    }

    /// The position of location `id`.
    #[inline]
    pub(crate) fn location(&self, id: u64) -> Result<usize> {
        self.locations
            .get(id)
            .ok_or_else(|| dangling("location", id))
    }
}

/// An id [`check`] should have refused: a bug, not bad input.
fn dangling(what: &str, id: u64) -> Error {
    Error::Corrupt(format!(
        "a validated profile refers to {what} {id}, which it lacks"
    ))
}

/// Decodes and validates a profile (gzip or raw), into flat arrays ([`Flat`]). Bytes that
/// are not protobuf are read as the formats before it that `go tool pprof` still reads
/// (gperftools' CPU profile, the text heap and contention profiles:
/// [`crate::convert::gperftools`]).
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<ValidProfile> {
    // Not protobuf: one of the formats before it, as `go tool pprof` reads them, from the
    // same inflated bytes.
    with_raw(
        bytes,
        limits.max_decompressed_bytes,
        |raw| match Flat::parse(raw, limits) {
            Ok(flat) => validate_flat(flat, limits),
            Err(e) => match crate::convert::gperftools::parse(raw, limits)? {
                Some(profile) => validate(profile, limits),
                None => Err(e),
            },
        },
    )
}

/// Validates a profile built in flat arrays (by a converter) as [`decode`] validates what
/// it parsed. Its prost form is built only if asked for.
pub(crate) fn validate_flat(mut flat: Flat, limits: &Limits) -> Result<ValidProfile> {
    repair(&mut flat.function);
    let ids = check(&flat, limits)?;
    Ok(ValidProfile {
        flat,
        full: OnceLock::new(),
        ids,
    })
}

/// Fixes known writer bugs that lose no information: .NET profiles whose functions all have
/// id 0 while locations refer to them by position (as Pyroscope repairs them).
fn repair(functions: &mut [crate::proto::Function]) {
    if functions.len() > 1 && functions.iter().all(|f| f.id == 0) {
        for (i, f) in functions.iter_mut().enumerate() {
            f.id = i as u64 + 1;
        }
    }
}

/// Checks every reference of `p`: string indices in range, ids that exist and are unique,
/// one value per sample type, and the limits. Known writer bugs that lose nothing are
/// repaired first.
pub fn validate(mut p: Profile, limits: &Limits) -> Result<ValidProfile> {
    repair(&mut p.function);
    let flat = Flat::from_profile(&p)?;
    let ids = check(&flat, limits)?;
    Ok(ValidProfile {
        flat,
        full: OnceLock::from(p),
        ids,
    })
}

/// The largest magnitude of a sample value taken: 2^53, far past any one sample's CPU time
/// or bytes, and exact as f64 (as JSON readers take it). A thousand of them sum within
/// i64, and reports add with saturation past that; i64::MIN, stored once, had no magnitude
/// at all and made every report of its profile type overflow.
pub(crate) const MAX_SAMPLE_VALUE: u64 = 1 << 53;

fn check(p: &Flat, limits: &Limits) -> Result<Ids> {
    let strings = p.strings_len();
    if strings == 0 || !p.string(0).is_empty() {
        return Err(invalid("string_table", "must start with the empty string"));
    }
    let string = |field: &'static str, i: i64| -> Result<()> {
        if i < 0 || i as usize >= strings {
            return Err(invalid(
                field,
                format!("string index {i} is outside the table of {strings}"),
            ));
        }
        Ok(())
    };
    for t in &p.sample_type {
        string("sample_type.type", t.r#type)?;
        string("sample_type.unit", t.unit)?;
    }
    if let Some(t) = &p.period_type {
        string("period_type.type", t.r#type)?;
        string("period_type.unit", t.unit)?;
    }
    for (field, i) in [
        ("drop_frames", p.drop_frames),
        ("keep_frames", p.keep_frames),
        ("default_sample_type", p.default_sample_type),
        ("doc_url", p.doc_url),
    ] {
        string(field, i)?;
    }
    for c in &p.comment {
        string("comment", *c)?;
    }
    if p.samples().len() > limits.max_samples {
        return Err(Error::TooLarge {
            what: "sample count",
            limit: limits.max_samples,
        });
    }
    // A sample is a row for each of its types: 1,900 samples of 65,536 types were 124
    // million rows, built (uncharged) before the table refused a batch past its rows.
    if p.samples().len().saturating_mul(p.sample_type.len().max(1)) > limits.max_samples {
        return Err(Error::TooLarge {
            what: "sample values (samples times sample types)",
            limit: limits.max_samples,
        });
    }
    if p.locations().len() > limits.max_locations {
        return Err(Error::TooLarge {
            what: "location count",
            limit: limits.max_locations,
        });
    }
    if p.function.len() > limits.max_functions {
        return Err(Error::TooLarge {
            what: "function count",
            limit: limits.max_functions,
        });
    }

    let repeated =
        |field: &'static str| move |id: u64| invalid(field, format!("id {id} is zero or repeated"));
    let mappings = Positions::new(p.mapping.iter().map(|m| m.id), repeated("mapping.id"))?;
    // A symbol's strings are a frame's name, bounded as every other format bounds it: each
    // is hashed, stored and kept whole in the statistics of the blocks it is in (a 120 MiB
    // function name was 720 MiB of the database's manifest, escaped as JSON).
    let symbol = |field: &'static str, i: i64| -> Result<usize> {
        string(field, i)?;
        let len = p.string(i).len();
        if len > crate::convert::trie::MAX_FRAME_BYTES {
            return Err(invalid(
                field,
                format!(
                    "a string of {len} bytes, over the {} a frame's may have",
                    crate::convert::trie::MAX_FRAME_BYTES
                ),
            ));
        }
        Ok(len)
    };
    // A string is interned once, but stored once per row that names it: 32,769 functions
    // sharing one 64 KiB name (each of its own start line) were a 2 GiB column, past what
    // an Arrow string column holds (a panic storing the group).
    let mut stored = 0usize;
    for m in &p.mapping {
        let row = symbol("mapping.filename", m.filename)? + symbol("mapping.build_id", m.build_id)?;
        stored = stored.saturating_add(row);
    }
    let functions = Positions::new(p.function.iter().map(|f| f.id), repeated("function.id"))?;
    for f in &p.function {
        let row = symbol("function.name", f.name)?
            + symbol("function.system_name", f.system_name)?
            + symbol("function.filename", f.filename)?;
        stored = stored.saturating_add(row);
    }
    if stored > limits.max_decompressed_bytes {
        return Err(Error::TooLarge {
            what: "symbol strings as stored (each function's and mapping's, once per row)",
            limit: limits.max_decompressed_bytes,
        });
    }
    let locations = Positions::new(p.locations().map(|l| l.id), repeated("location.id"))?;
    // A stack's depth is its frames: a location's lines (inlined calls), at least one. The
    // most lines a location has bounds the frames of a stack of n locations, so only a
    // stack that may be over the limit counts them.
    let mut most_lines = 1;
    for l in p.locations() {
        most_lines = most_lines.max(l.line.len());
        if l.mapping_id != 0 && !mappings.contains(l.mapping_id) {
            return Err(invalid(
                "location.mapping_id",
                format!(
                    "location {} refers to mapping {}, which does not exist",
                    l.id, l.mapping_id
                ),
            ));
        }
        for line in l.line {
            if !functions.contains(line.function_id) {
                return Err(invalid(
                    "line.function_id",
                    format!(
                        "location {} refers to function {}, which does not exist",
                        l.id, line.function_id
                    ),
                ));
            }
        }
    }
    let types = p.sample_type.len();
    for (i, s) in p.samples().enumerate() {
        if s.value.len() != types {
            return Err(invalid(
                "sample.value",
                format!(
                    "sample {i} has {} values for {types} sample types",
                    s.value.len()
                ),
            ));
        }
        if let Some(v) = s.value.iter().find(|v| v.unsigned_abs() > MAX_SAMPLE_VALUE) {
            return Err(invalid(
                "sample.value",
                format!(
                    "sample {i} has the value {v}, beyond ±2^53 (no profiler measures that \
                     much in one sample: 104 days in nanoseconds, 9 PB in bytes)"
                ),
            ));
        }
        let too_deep = || Error::TooLarge {
            what: "stack depth",
            limit: limits.max_stack_depth,
        };
        if s.location_id.len() > limits.max_stack_depth {
            return Err(too_deep());
        }
        let count = s.location_id.len().saturating_mul(most_lines) > limits.max_stack_depth;
        let mut frames = 0;
        for &id in s.location_id {
            let Some(at) = locations.get(id) else {
                return Err(invalid(
                    "sample.location_id",
                    format!("sample {i} refers to location {id}, which does not exist"),
                ));
            };
            if count {
                frames += p.location(at).line.len().max(1);
            }
        }
        if frames > limits.max_stack_depth {
            return Err(too_deep());
        }
        for l in s.label {
            string("label.key", l.key)?;
            string("label.str", l.str)?;
            string("label.num_unit", l.num_unit)?;
        }
    }
    Ok(Ids {
        mappings,
        functions,
        locations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile's id tables are charged before they are made: 20 bytes naming one
    /// mapping, function and location of id 16,400 make three tables of 16,401 slots.
    #[test]
    fn a_profiles_id_tables_are_charged() {
        let raw = [
            0x32, 0x00, 0x1a, 0x04, 0x08, 0x90, 0x80, 0x01, 0x2a, 0x04, 0x08, 0x90, 0x80, 0x01,
            0x22, 0x04, 0x08, 0x90, 0x80, 0x01,
        ];
        let (got, asked) = charge::under_budget(usize::MAX, || decode(&raw, &Limits::default()));
        got.unwrap();
        assert!(asked >= 3 * 16_401 * 8, "{asked} bytes asked");
        let (got, _) = charge::under_budget(64 << 10, || decode(&raw, &Limits::default()));
        assert!(got.unwrap_err().to_string().contains("id tables"));
    }

    #[test]
    fn a_reused_table_whose_stamps_come_round_again_starts_empty() {
        let mut table = Stamped::take(8);
        assert!(table.set(3, 0));
        assert!(!table.set(3, 1), "set twice");
        // About to wrap, with a slot left by a profile stamped 1, the stamp that comes next.
        table.stamp = u32::MAX;
        table.slots[5] = (1 << 32) | 7;
        drop(Positions {
            len: 1,
            lookup: Lookup::Table(table),
        });
        let table = Stamped::take(8);
        assert_eq!(table.stamp, 1, "the table dropped last is taken first");
        assert_eq!(table.get(5), None);
        assert_eq!(table.get(3), None);
    }

    fn varint(mut n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while n >= 0x80 {
            out.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out
    }

    /// A sample's empty labels (2 bytes on the wire, 32 in the labels array) are charged
    /// 16 bytes a byte of the sample: 1,000 samples of 1,000 empty labels ask for 32 MB
    /// (before, half of it).
    #[test]
    fn a_samples_labels_are_charged_as_they_take() {
        // string_table [""], then 1,000 samples of 1,000 empty labels (`1a 00`).
        let mut raw = vec![0x32, 0x00];
        for _ in 0..1_000 {
            raw.push(0x12);
            raw.extend(varint(2_000));
            raw.extend([0x1a, 0x00].repeat(1_000));
        }
        let (got, asked) = charge::under_budget(usize::MAX, || decode(&raw, &Limits::default()));
        got.unwrap();
        assert!(asked >= 1_000_000 * 32, "{asked} bytes asked");
    }

    /// Comments (a byte each on the wire, 8 in the array) and a location's lines (4 bytes,
    /// 24) are charged before they are made: each alone is within the decompressed-size
    /// limit and names nothing out of range, so only the charge refuses them.
    #[test]
    fn comments_and_a_locations_lines_are_charged_before_they_are_made() {
        let (n, budget) = (2 << 20, 8 << 20);
        // string_table [""], then n packed zero comments: 16 MiB of array.
        let mut comments = vec![0x32, 0x00, 0x6a];
        comments.extend(varint(n));
        comments.resize(comments.len() + n, 0);
        // string_table [""], function 1, then one location (id 1) of n / 4 lines in
        // function 1 (4 bytes each): 12 MiB of array.
        let mut lines = vec![0x32, 0x00, 0x2a, 0x02, 0x08, 0x01, 0x22];
        lines.extend(varint(n + 2));
        lines.extend([0x08, 0x01]);
        lines.extend([0x22, 0x02, 0x08, 0x01].repeat(n / 4));
        for (what, raw) in [("comments", &comments), ("lines", &lines)] {
            let limits = Limits::default();
            decode(raw, &limits).unwrap_or_else(|e| panic!("{what}: {e}"));
            let (got, asked) = charge::under_budget(budget, || decode(raw, &limits));
            let e = got
                .err()
                .unwrap_or_else(|| panic!("{what} were made uncharged"));
            assert!(e.to_string().contains("over the budget"), "{what}: {e}");
            assert!(asked > budget, "{what}: {asked} bytes asked");
        }
        // A real profile fits a budget of a few times its bytes.
        let real = std::fs::read(
            crate::testing::shared_dir().join("testdata/pprof/goapp__go119-cpu-2s.pb.gz"),
        )
        .unwrap();
        let (got, _) = charge::under_budget(64 << 20, || decode(&real, &Limits::default()));
        got.unwrap();
    }
}
