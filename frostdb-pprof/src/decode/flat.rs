//! A pprof profile in flat arrays: every string in one buffer, every sample's location ids,
//! values and labels in one array each, every location's lines in one array. Decoding a
//! profile this way allocates a few growing arrays instead of a `String` per string table
//! entry and three `Vec`s per sample (what prost's generated types cost), and reading it
//! walks contiguous memory. The store ingests from this form; the prost [`Profile`] is
//! built from it only when someone asks for it.

use crate::error::{Error, Result};
use crate::proto::{Function, Label, Line, Mapping, Profile, ValueType};

use super::wire;

/// Most sample types a profile may have (real ones have one to a few).
pub(crate) const MAX_SAMPLE_TYPES: usize = 1 << 16;

/// Most labels a sample may have (real ones have a few; series keep at most
/// `max_label_names_per_series` of them).
pub(crate) const MAX_SAMPLE_LABELS: usize = 1024;

/// A sample: ranges of [`Flat`]'s location id, value and label arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlatSample {
    locations: (usize, usize),
    values: (usize, usize),
    labels: (usize, usize),
}

/// A location; its lines are a range of [`Flat`]'s line array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlatLocation {
    id: u64,
    mapping_id: u64,
    address: u64,
    lines: (usize, usize),
    is_folded: bool,
}

/// A stack of a [`Flat`] profile being built: a range of its location ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stack((usize, usize));

/// A sample of a [`Flat`] profile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleRef<'a> {
    pub(crate) location_id: &'a [u64],
    pub(crate) value: &'a [i64],
    pub(crate) label: &'a [Label],
}

/// A location of a [`Flat`] profile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocationRef<'a> {
    pub(crate) id: u64,
    pub(crate) mapping_id: u64,
    pub(crate) address: u64,
    pub(crate) line: &'a [Line],
    pub(crate) is_folded: bool,
}

/// A profile in flat arrays (see the module's documentation). Fields keep pprof's names.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Flat {
    /// Every string of the string table, one after the other.
    text: String,
    /// Where each string table entry is in `text`.
    strings: Vec<(usize, usize)>,
    pub(crate) sample_type: Vec<ValueType>,
    samples: Vec<FlatSample>,
    location_ids: Vec<u64>,
    values: Vec<i64>,
    labels: Vec<Label>,
    pub(crate) mapping: Vec<Mapping>,
    locations: Vec<FlatLocation>,
    lines: Vec<Line>,
    pub(crate) function: Vec<Function>,
    pub(crate) drop_frames: i64,
    pub(crate) keep_frames: i64,
    pub(crate) time_nanos: i64,
    pub(crate) duration_nanos: i64,
    pub(crate) period_type: Option<ValueType>,
    pub(crate) period: i64,
    pub(crate) comment: Vec<i64>,
    pub(crate) default_sample_type: i64,
    pub(crate) doc_url: i64,
}

fn int(v: u64) -> i64 {
    v as i64
}

/// A message without repeated or string fields (value types, labels, mappings): prost
/// decodes these without allocating.
fn message<M: prost::Message + Default>(buf: &[u8]) -> Result<M> {
    M::decode(buf).map_err(|e| Error::Protobuf(e.to_string()))
}

/// Bits of field numbers, for [`wire::scalars`].
const fn numbered(numbers: &[u32]) -> u32 {
    let mut bits = 0;
    let mut i = 0;
    while i < numbers.len() {
        bits |= 1 << numbers[i];
        i += 1;
    }
    bits
}

/// The varint fields of a `Line`, a `Function` and a `Location` (its field 4 is a `Line`).
const LINE_VARINTS: u32 = numbered(&[1, 2, 3]);
const FUNCTION_VARINTS: u32 = numbered(&[1, 2, 3, 4, 5]);
const LOCATION_VARINTS: u32 = numbered(&[1, 2, 3, 5]);

/// A `Line`, the message a profile has most of, decoded by hand (prost's generic decoding
/// costs several times more for three varints).
fn line(buf: &[u8]) -> Result<Line> {
    let mut v = [0u64; 4];
    wire::scalars(buf, LINE_VARINTS, &mut v, |_, _| Ok(()))?;
    Ok(Line {
        function_id: v[1],
        line: int(v[2]),
        column: int(v[3]),
    })
}

/// A `Function`, decoded by hand as [`line`] is.
fn function(buf: &[u8]) -> Result<Function> {
    let mut v = [0u64; 6];
    wire::scalars(buf, FUNCTION_VARINTS, &mut v, |_, _| Ok(()))?;
    Ok(Function {
        id: v[1],
        name: int(v[2]),
        system_name: int(v[3]),
        filename: int(v[4]),
        start_line: int(v[5]),
    })
}

thread_local! {
    /// Arrays of profiles dropped on this thread, emptied, for the next ones parsed here
    /// (see [`Flat::recycle`]).
    static KEPT: std::cell::RefCell<Vec<Flat>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Flat {
    /// Profiles whose arrays a thread keeps (one: a thread drops a profile before it
    /// parses the next), and the most bytes of arrays one may have.
    const KEPT: usize = 1;
    const KEPT_BYTES: usize = 512 << 10;

    /// Hands this profile's arrays, emptied, to the next profile parsed on this thread,
    /// unless they are large. A profile's dozen arrays were each fresh memory to allocate
    /// and fill before; a thread ingesting profiles one after another now reuses warm ones.
    pub(crate) fn recycle(mut self) {
        if self.bytes() > Self::KEPT_BYTES {
            return;
        }
        self.clear();
        super::keep(&KEPT, self, Self::KEPT);
    }

    /// An empty profile, with the arrays of one recycled on this thread if there is one.
    fn reused() -> Self {
        super::take_kept(&KEPT).unwrap_or_default()
    }

    /// The bytes this profile's arrays hold room for.
    fn bytes(&self) -> usize {
        fn of<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        self.text.capacity()
            + of(&self.strings)
            + of(&self.sample_type)
            + of(&self.samples)
            + of(&self.location_ids)
            + of(&self.values)
            + of(&self.labels)
            + of(&self.mapping)
            + of(&self.locations)
            + of(&self.lines)
            + of(&self.function)
            + of(&self.comment)
    }

    /// Empties the profile, keeping its arrays' room.
    fn clear(&mut self) {
        let Flat {
            text,
            strings,
            sample_type,
            samples,
            location_ids,
            values,
            labels,
            mapping,
            locations,
            lines,
            function,
            drop_frames,
            keep_frames,
            time_nanos,
            duration_nanos,
            period_type,
            period,
            comment,
            default_sample_type,
            doc_url,
        } = self;
        text.clear();
        strings.clear();
        sample_type.clear();
        samples.clear();
        location_ids.clear();
        values.clear();
        labels.clear();
        mapping.clear();
        locations.clear();
        lines.clear();
        function.clear();
        comment.clear();
        *period_type = None;
        for scalar in [
            drop_frames,
            keep_frames,
            time_nanos,
            duration_nanos,
            period,
            default_sample_type,
            doc_url,
        ] {
            *scalar = 0;
        }
    }

    /// Decodes a raw (not gzipped) pprof protobuf. Counts over `limits` are refused by the
    /// first pass, before anything is made: a message of two bytes (an empty sample or
    /// mapping) would otherwise become tens of bytes of arrays, for millions of them.
    pub(crate) fn parse(buf: &[u8], limits: &super::Limits) -> Result<Self> {
        let mut p = Flat::reused();
        // The strings' bytes, checked to be UTF-8 once, whole, at the end.
        let mut text = std::mem::take(&mut p.text).into_bytes();
        p.reserve(buf, &mut text, limits)?;
        wire::fields(buf, |n, v| {
            match n {
                1 => p.sample_type.push(message(wire::bytes(n, v)?)?),
                2 => p.parse_sample(wire::bytes(n, v)?)?,
                3 => p.mapping.push(message(wire::bytes(n, v)?)?),
                4 => p.parse_location(wire::bytes(n, v)?)?,
                5 => p.function.push(function(wire::bytes(n, v)?)?),
                6 => {
                    let start = text.len();
                    text.extend_from_slice(wire::bytes(n, v)?);
                    p.strings.push((start, text.len()));
                }
                7 => p.drop_frames = int(wire::scalar(n, v)?),
                8 => p.keep_frames = int(wire::scalar(n, v)?),
                9 => p.time_nanos = int(wire::scalar(n, v)?),
                10 => p.duration_nanos = int(wire::scalar(n, v)?),
                // A message field seen twice is merged, as protobuf says.
                11 => {
                    prost::Message::merge(p.period_type.get_or_insert_default(), wire::bytes(n, v)?)
                        .map_err(|e| Error::Protobuf(e.to_string()))?
                }
                12 => p.period = int(wire::scalar(n, v)?),
                13 => wire::repeated(n, v, &mut p.comment, int)?,
                14 => p.default_sample_type = int(wire::scalar(n, v)?),
                15 => p.doc_url = int(wire::scalar(n, v)?),
                _ => {}
            }
            Ok(())
        })?;
        p.text = p.checked_text(text)?;
        Ok(p)
    }

    /// The strings' bytes as text. Checking them whole is checking each: text that is
    /// UTF-8 cut where every string starts, each a character boundary, is UTF-8 in every
    /// piece. Where it is not, the first string that is not UTF-8 is named.
    fn checked_text(&self, text: Vec<u8>) -> Result<String> {
        let text = match String::from_utf8(text) {
            Ok(text) => text,
            Err(e) => {
                let text = e.into_bytes();
                return Err(self.bad_string(&text));
            }
        };
        if self.strings.iter().all(|&(s, _)| text.is_char_boundary(s)) {
            Ok(text)
        } else {
            Err(self.bad_string(text.as_bytes()))
        }
    }

    fn bad_string(&self, text: &[u8]) -> Error {
        for (i, &(s, e)) in self.strings.iter().enumerate() {
            if let Err(error) = std::str::from_utf8(&text[s..e]) {
                return Error::Protobuf(format!("string_table[{i}] is not UTF-8: {error}"));
            }
        }
        Error::Protobuf("the string table is not UTF-8".into())
    }

    /// Sizes the arrays for the profile in `buf` from one pass over its top-level fields
    /// (counts and string bytes are exact; a sample's location ids are at most its bytes),
    /// so that parsing does not grow them step by step.
    fn reserve(
        &mut self,
        buf: &[u8],
        text_bytes: &mut Vec<u8>,
        limits: &super::Limits,
    ) -> Result<()> {
        let (mut samples, mut sample_bytes, mut locations, mut functions) =
            (0usize, 0usize, 0usize, 0usize);
        let (mut strings, mut text, mut mappings, mut types) = (0usize, 0usize, 0usize, 0usize);
        let mut comments = 0usize;
        wire::fields(buf, |n, v| {
            match v {
                wire::Value::Bytes(b) => match n {
                    1 => types += 1,
                    2 => (samples, sample_bytes) = (samples + 1, sample_bytes + b.len()),
                    3 => mappings += 1,
                    4 => locations += 1,
                    5 => functions += 1,
                    6 => (strings, text) = (strings + 1, text + b.len()),
                    // Packed: a value a byte at most, 8 bytes of the array each.
                    13 => comments += b.len(),
                    _ => {}
                },
                _ if n == 13 => comments += 1,
                _ => {}
            }
            Ok(())
        })?;
        // What the arrays will take, about, charged before they are made: a sample's
        // location ids and values are at most 8 bytes per byte of it, its labels 16 (an
        // empty label is 2 bytes of it and 32 of the labels array; charged at 8, two
        // million empty labels made twice what was charged).
        let arrays = sample_bytes
            .saturating_mul(16)
            .saturating_add(samples.saturating_mul(std::mem::size_of::<FlatSample>()))
            .saturating_add(locations.saturating_mul(64))
            .saturating_add(functions.saturating_mul(std::mem::size_of::<Function>()))
            .saturating_add(mappings.saturating_mul(std::mem::size_of::<Mapping>()))
            .saturating_add(strings.saturating_mul(16))
            .saturating_add(comments.saturating_mul(8))
            .saturating_add(text);
        // What `check` refuses later, refused before it is made. Mappings have no limit of
        // their own: a profile has fewer than it has locations (each location names one).
        for (what, count, limit) in [
            ("sample count", samples, limits.max_samples),
            ("location count", locations, limits.max_locations),
            ("function count", functions, limits.max_functions),
            (
                "mapping count",
                mappings,
                limits.max_locations.max(MAX_SAMPLE_TYPES),
            ),
            ("sample type count", types, MAX_SAMPLE_TYPES),
        ] {
            if count > limit {
                return Err(Error::TooLarge { what, limit });
            }
        }
        super::charge::charge(arrays, "decoding a profile")?;
        self.samples.reserve_exact(samples);
        self.location_ids.reserve(sample_bytes);
        self.values.reserve(samples * 2);
        self.locations.reserve_exact(locations);
        self.lines.reserve(locations);
        self.function.reserve_exact(functions);
        self.strings.reserve_exact(strings);
        text_bytes.reserve_exact(text);
        Ok(())
    }

    /// Appends a string. Like every `push_` method it charges what it copies first
    /// ([`take`](super::charge::take)): a converter may copy what its body names once
    /// into every profile it builds.
    pub(crate) fn push_string(&mut self, s: &str) -> Result<()> {
        super::charge::take(s.len() + 16, "building a profile")?;
        self.push_text(s);
        Ok(())
    }

    fn push_text(&mut self, s: &str) {
        let start = self.text.len();
        self.text.push_str(s);
        self.strings.push((start, self.text.len()));
    }

    /// An empty profile to build (with arrays a profile dropped on this thread left).
    pub(crate) fn building() -> Self {
        Self::reused()
    }

    /// Appends a location.
    pub(crate) fn push_location(
        &mut self,
        id: u64,
        mapping_id: u64,
        address: u64,
        lines: &[Line],
        is_folded: bool,
    ) -> Result<()> {
        super::charge::take(
            std::mem::size_of_val(lines) + std::mem::size_of::<FlatLocation>(),
            "building a profile",
        )?;
        let first = self.lines.len();
        self.lines.extend_from_slice(lines);
        self.locations.push(FlatLocation {
            id,
            mapping_id,
            address,
            lines: (first, self.lines.len()),
            is_folded,
        });
        Ok(())
    }

    /// Appends a stack's location ids, for samples to share ([`Flat::push_sample`]).
    pub(crate) fn push_stack(&mut self, location_ids: &[u64]) -> Result<Stack> {
        super::charge::take(std::mem::size_of_val(location_ids), "building a profile")?;
        let first = self.location_ids.len();
        self.location_ids.extend_from_slice(location_ids);
        Ok(Stack((first, self.location_ids.len())))
    }

    /// Appends a sample of `stack`: a stack pushed once serves every sample on it, so a
    /// profile's samples cost their stacks once, not once a sample.
    pub(crate) fn push_sample(
        &mut self,
        stack: Stack,
        values: &[i64],
        labels: &[Label],
    ) -> Result<()> {
        super::charge::take(
            std::mem::size_of_val(values)
                + std::mem::size_of_val(labels)
                + std::mem::size_of::<FlatSample>(),
            "building a profile",
        )?;
        let (v0, b0) = (self.values.len(), self.labels.len());
        self.values.extend_from_slice(values);
        self.labels.extend_from_slice(labels);
        self.samples.push(FlatSample {
            locations: stack.0,
            values: (v0, self.values.len()),
            labels: (b0, self.labels.len()),
        });
        Ok(())
    }

    /// The location ids the samples' stacks hold, each stack counted once however many
    /// samples share it.
    #[cfg(test)]
    pub(crate) fn stack_frames(&self) -> usize {
        self.location_ids.len()
    }

    /// Where the next sample's location ids, values and labels start.
    fn sample_start(&self) -> (usize, usize, usize) {
        (
            self.location_ids.len(),
            self.values.len(),
            self.labels.len(),
        )
    }

    /// Ends a sample that began at `start` (see [`Flat::sample_start`]).
    fn end_sample(&mut self, (l0, v0, b0): (usize, usize, usize)) {
        self.samples.push(FlatSample {
            locations: (l0, self.location_ids.len()),
            values: (v0, self.values.len()),
            labels: (b0, self.labels.len()),
        });
    }

    fn parse_sample(&mut self, buf: &[u8]) -> Result<()> {
        let start = self.sample_start();
        wire::fields(buf, |n, v| {
            match n {
                1 => wire::repeated(n, v, &mut self.location_ids, |x| x)?,
                2 => wire::repeated(n, v, &mut self.values, int)?,
                3 => {
                    // An empty label is two bytes and 32 of the array: bounded per sample.
                    if self.labels.len() - start.2 >= MAX_SAMPLE_LABELS {
                        return Err(Error::TooLarge {
                            what: "labels of a sample",
                            limit: MAX_SAMPLE_LABELS,
                        });
                    }
                    self.labels.push(message(wire::bytes(n, v)?)?)
                }
                _ => {}
            }
            Ok(())
        })?;
        self.end_sample(start);
        Ok(())
    }

    fn parse_location(&mut self, buf: &[u8]) -> Result<()> {
        let first_line = self.lines.len();
        let mut v = [0u64; 6];
        wire::scalars(buf, LOCATION_VARINTS, &mut v, |n, value| {
            if n == 4 {
                // One line a location is charged with the arrays ([`Flat::reserve`]); a
                // location may hold many more (2 bytes each, 24 in the array), each
                // doubling of the array charged before it is made.
                if self.lines.len() == self.lines.capacity() {
                    super::charge::charge(
                        self.lines.capacity().max(64) * std::mem::size_of::<Line>(),
                        "decoding a profile's lines",
                    )?;
                }
                self.lines.push(line(wire::bytes(n, value)?)?);
            }
            Ok(())
        })?;
        self.locations.push(FlatLocation {
            id: v[1],
            mapping_id: v[2],
            address: v[3],
            lines: (first_line, self.lines.len()),
            is_folded: v[5] != 0,
        });
        Ok(())
    }

    /// The flat form of `p`, a copy of it charged before it is made
    /// ([`charge`](super::charge::charge)).
    pub(crate) fn from_profile(p: &Profile) -> Result<Self> {
        let words: usize = p
            .sample
            .iter()
            .map(|s| s.location_id.len() + s.value.len())
            .sum();
        let copy = p.string_table.iter().map(|s| s.len() + 16).sum::<usize>()
            + words * 8
            + p.sample.len() * std::mem::size_of::<FlatSample>()
            + p.location.len() * std::mem::size_of::<FlatLocation>()
            + p.location
                .iter()
                .map(|l| std::mem::size_of_val(&l.line[..]))
                .sum::<usize>()
            + p.sample
                .iter()
                .map(|s| std::mem::size_of_val(&s.label[..]))
                .sum::<usize>()
            + std::mem::size_of_val(&p.mapping[..])
            + std::mem::size_of_val(&p.function[..]);
        super::charge::charge(copy, "validating a converted profile")?;
        let mut f = Flat {
            text: String::with_capacity(p.string_table.iter().map(String::len).sum()),
            strings: Vec::with_capacity(p.string_table.len()),
            sample_type: p.sample_type.clone(),
            samples: Vec::with_capacity(p.sample.len()),
            mapping: p.mapping.clone(),
            locations: Vec::with_capacity(p.location.len()),
            function: p.function.clone(),
            drop_frames: p.drop_frames,
            keep_frames: p.keep_frames,
            time_nanos: p.time_nanos,
            duration_nanos: p.duration_nanos,
            period_type: p.period_type,
            period: p.period,
            comment: p.comment.clone(),
            default_sample_type: p.default_sample_type,
            doc_url: p.doc_url,
            ..Flat::default()
        };
        for s in &p.string_table {
            f.push_text(s);
        }
        for s in &p.sample {
            let start = f.sample_start();
            f.location_ids.extend_from_slice(&s.location_id);
            f.values.extend_from_slice(&s.value);
            f.labels.extend_from_slice(&s.label);
            f.end_sample(start);
        }
        for l in &p.location {
            let l0 = f.lines.len();
            f.lines.extend_from_slice(&l.line);
            f.locations.push(FlatLocation {
                id: l.id,
                mapping_id: l.mapping_id,
                address: l.address,
                lines: (l0, f.lines.len()),
                is_folded: l.is_folded,
            });
        }
        Ok(f)
    }

    /// The prost form of this profile.
    pub(crate) fn to_profile(&self) -> Profile {
        Profile {
            sample_type: self.sample_type.clone(),
            sample: self
                .samples()
                .map(|s| crate::proto::Sample {
                    location_id: s.location_id.to_vec(),
                    value: s.value.to_vec(),
                    label: s.label.to_vec(),
                })
                .collect(),
            mapping: self.mapping.clone(),
            location: self
                .locations()
                .map(|l| crate::proto::Location {
                    id: l.id,
                    mapping_id: l.mapping_id,
                    address: l.address,
                    line: l.line.to_vec(),
                    is_folded: l.is_folded,
                })
                .collect(),
            function: self.function.clone(),
            string_table: (0..self.strings.len())
                .map(|i| self.string(i as i64).to_owned())
                .collect(),
            drop_frames: self.drop_frames,
            keep_frames: self.keep_frames,
            time_nanos: self.time_nanos,
            duration_nanos: self.duration_nanos,
            period_type: self.period_type,
            period: self.period,
            comment: self.comment.clone(),
            default_sample_type: self.default_sample_type,
            doc_url: self.doc_url,
        }
    }

    /// String table entry `i`; `""` when there is none.
    pub(crate) fn string(&self, i: i64) -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.strings.get(i))
            .map_or("", |&(start, end)| &self.text[start..end])
    }

    /// Entries of the string table.
    pub(crate) fn strings_len(&self) -> usize {
        self.strings.len()
    }

    /// Sample `i`.
    pub(crate) fn sample(&self, i: usize) -> SampleRef<'_> {
        let s = &self.samples[i];
        SampleRef {
            location_id: &self.location_ids[s.locations.0..s.locations.1],
            value: &self.values[s.values.0..s.values.1],
            label: &self.labels[s.labels.0..s.labels.1],
        }
    }

    /// The samples.
    pub(crate) fn samples(&self) -> impl ExactSizeIterator<Item = SampleRef<'_>> + Clone {
        (0..self.samples.len()).map(|i| self.sample(i))
    }

    /// Location `i`.
    pub(crate) fn location(&self, i: usize) -> LocationRef<'_> {
        let l = &self.locations[i];
        LocationRef {
            id: l.id,
            mapping_id: l.mapping_id,
            address: l.address,
            line: &self.lines[l.lines.0..l.lines.1],
            is_folded: l.is_folded,
        }
    }

    /// The locations.
    pub(crate) fn locations(&self) -> impl ExactSizeIterator<Item = LocationRef<'_>> + Clone {
        (0..self.locations.len()).map(|i| self.location(i))
    }
}
