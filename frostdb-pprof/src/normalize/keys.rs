//! Step 2: content keys of a profile's stacks, locations, functions and mappings, and its
//! content fingerprint.

use super::*;

/// A mapping's has_functions, has_filenames, has_line_numbers and has_inline_frames as bits
/// 0 to 3.
pub(super) fn mapping_flags(m: &crate::proto::Mapping) -> u8 {
    u8::from(m.has_functions)
        | (u8::from(m.has_filenames) << 1)
        | (u8::from(m.has_line_numbers) << 2)
        | (u8::from(m.has_inline_frames) << 3)
}

/// Appends `s` to `buf`, length first, so that consecutive strings cannot run together.
pub(crate) fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// The content key of a function (`buf`: scratch): what a stack's locations refer to.
pub(crate) fn function_key(
    buf: &mut Vec<u8>,
    name: &str,
    system_name: &str,
    filename: &str,
    start_line: i64,
) -> StackKey {
    buf.clear();
    put_str(buf, name);
    put_str(buf, system_name);
    put_str(buf, filename);
    buf.extend_from_slice(&start_line.to_le_bytes());
    content_key(buf)
}

/// Starts a location's key bytes in `location`: its mapping's key (0: none), address and
/// whether it is folded; [`location_line`] appends each line, and [`content_key`] of the
/// bytes is the location's key.
pub(crate) fn location_start(
    location: &mut Vec<u8>,
    mapping: StackKey,
    address: u64,
    folded: bool,
) {
    location.clear();
    location.extend_from_slice(&mapping.to_le_bytes());
    location.extend_from_slice(&address.to_le_bytes());
    location.push(u8::from(folded));
}

/// Appends a line (its function's key and line number) to a location's key bytes.
pub(crate) fn location_line(location: &mut Vec<u8>, function: StackKey, line: i64) {
    location.extend_from_slice(&function.to_le_bytes());
    location.extend_from_slice(&line.to_le_bytes());
}

pub(crate) fn content_key(buf: &[u8]) -> StackKey {
    twox_hash::XxHash3_128::oneshot(buf)
}

/// A [`StackKey`] in two words: half the room of a `u128` (which is aligned to 16 bytes),
/// and room that needs no aligned allocation.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Key([u64; 2]);

impl Key {
    pub(super) fn of(key: StackKey) -> Self {
        Self([key as u64, (key >> 64) as u64])
    }

    pub(super) fn get(self) -> StackKey {
        u128::from(self.0[0]) | (u128::from(self.0[1]) << 64)
    }
}

/// What [`Prepared::stack_keys`] works in, kept per thread from one profile to the next:
/// the keys of a profile's functions and mappings by position, and the bytes being hashed.
/// (The locations' keys are the profile's: intern reads them later.)
#[derive(Default)]
pub(super) struct KeyScratch {
    functions: Vec<Key>,
    mappings: Vec<Key>,
    buf: Vec<u8>,
    location: Vec<u8>,
    stack: Vec<u8>,
}

thread_local! {
    static KEY_SCRATCH: std::cell::RefCell<KeyScratch> = std::cell::RefCell::default();
}

impl Prepared<'_> {
    /// The profile's content fingerprint ([`crate::dedup`]): a 128-bit hash of what its
    /// rows hold, equal for two profiles exactly when (up to hash collisions) they would
    /// store the same rows. The profile name, series labels, timestamp, period type and
    /// unit, period, duration and sample types, whether deltas are taken, and the merged
    /// samples (per stack content key and sample label set, its value of each type, as
    /// sampled: before deltas), those labelled with spans apart.
    ///
    /// The samples are hashed one by one and the hashes added up: the order of a profile's
    /// samples does not matter (a profile encoded again, its samples in another order, is
    /// the same profile), and hashing takes one pass, no sort.
    pub(crate) fn fingerprint(&self) -> crate::dedup::ContentFingerprint {
        self.fingerprint
    }

    /// Computes [`Prepared::fingerprint`] from the merged values of the groups
    /// (`values`) and of the span groups (`span_values`), `types` a group.
    pub(super) fn content_fingerprint(
        &self,
        values: &[i64],
        span_values: &[i64],
        delta: bool,
    ) -> u128 {
        let p = self.profile.flat();
        let types = p.sample_type.len();
        let mut buf: Vec<u8> = Vec::new();
        let set_keys: Vec<u128> = self
            .label_sets
            .iter()
            .map(|set| {
                buf.clear();
                for (k, v) in set {
                    put_str(&mut buf, k);
                    put_str(&mut buf, v);
                }
                content_key(&buf)
            })
            .collect();
        // Per sample (a group, or a span group), a hash of its stack, label set and values;
        // their wrapping sum, and their count.
        let mut sample = |kind: u8, stack: StackKey, set: u32, values: &[i64]| -> Option<u128> {
            if values.iter().all(|&v| v == 0) {
                return None; // nothing of it is stored
            }
            buf.clear();
            buf.push(kind);
            buf.extend_from_slice(&stack.to_le_bytes());
            buf.extend_from_slice(&set_keys[set as usize].to_le_bytes());
            for v in values {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            Some(content_key(&buf))
        };
        let (mut sum, mut count) = (0u128, 0u64);
        for (g, (group, &stack)) in self.groups.iter().zip(&self.keys).enumerate() {
            let row = &values[g * types..(g + 1) * types];
            if let Some(h) = sample(0, stack, group.labels, row) {
                sum = sum.wrapping_add(h);
                count += 1;
            }
        }
        for (sg, &(g, set)) in self.span_groups.iter().enumerate() {
            let row = &span_values[sg * types..(sg + 1) * types];
            if let Some(h) = sample(1, self.keys[g as usize], set, row) {
                sum = sum.wrapping_add(h);
                count += 1;
            }
        }
        buf.clear();
        put_str(&mut buf, &self.name);
        buf.extend_from_slice(&(self.series.len() as u64).to_le_bytes());
        for (k, v) in &self.series {
            put_str(&mut buf, k);
            put_str(&mut buf, v);
        }
        buf.extend_from_slice(&self.timestamp.to_le_bytes());
        buf.push(u8::from(delta));
        let (period_type, period_unit) = p
            .period_type
            .as_ref()
            .map_or(("", ""), |t| (text(p, t.r#type), text(p, t.unit)));
        put_str(&mut buf, period_type);
        put_str(&mut buf, period_unit);
        buf.extend_from_slice(&p.period.to_le_bytes());
        buf.extend_from_slice(&p.duration_nanos.to_le_bytes());
        buf.extend_from_slice(&(types as u64).to_le_bytes());
        for t in &p.sample_type {
            put_str(&mut buf, text(p, t.r#type));
            put_str(&mut buf, text(p, t.unit));
        }
        buf.extend_from_slice(&sum.to_le_bytes());
        buf.extend_from_slice(&count.to_le_bytes());
        content_key(&buf)
    }

    /// Content fingerprints of the groups: their stacks' keys and their labels.
    pub(super) fn fingerprints(&self) -> Vec<Fingerprint> {
        let mut buf = Vec::new();
        self.groups
            .iter()
            .zip(&self.keys)
            .map(|(g, key)| {
                buf.clear();
                buf.extend_from_slice(&key.to_le_bytes());
                for (k, v) in &self.label_sets[g.labels as usize] {
                    put_str(&mut buf, k);
                    put_str(&mut buf, v);
                }
                content_key(&buf)
            })
            .collect()
    }

    /// The content key of each group's stack: a 128-bit hash
    /// of every field the symbol tables store for its frames (each location's mapping,
    /// address, folding and lines, each line's function and number, each function's
    /// strings and start line), so equal stacks have equal keys whatever ids and string
    /// indices their profiles gave them. Functions, mappings and locations are hashed once
    /// per profile; a stack's key hashes its locations' keys.
    ///
    /// The store finds a known stack by its key alone. Two different stacks of one
    /// partition sharing a key (odds about n²/2¹²⁹ for n stacks) would be stored as one.
    pub(super) fn stack_keys(&self) -> Result<(Vec<StackKey>, Vec<Key>)> {
        KEY_SCRATCH.with_borrow_mut(|scratch| {
            let keys = self.stack_keys_in(scratch);
            // A thread keeps room for a usual profile (up to 8,192 functions, under 200 KiB),
            // not for the largest it met.
            if scratch.functions.capacity() > 1 << 13 {
                *scratch = KeyScratch::default();
            }
            keys
        })
    }

    /// The stacks' keys, and the locations' by position (the profile's, for intern).
    pub(super) fn stack_keys_in(
        &self,
        scratch: &mut KeyScratch,
    ) -> Result<(Vec<StackKey>, Vec<Key>)> {
        let p = self.profile.flat();
        let ids = &self.profile.ids;
        let KeyScratch {
            functions: function_keys,
            mappings: mapping_keys,
            buf,
            location,
            stack,
        } = scratch;
        // Every function, mapping and location is hashed once, in the order the profile
        // holds them: each pass reads its array and the strings front to back, and a stack
        // is then its locations' keys.
        function_keys.clear();
        for function in &p.function {
            function_keys.push(Key::of(function_key(
                buf,
                text(p, function.name),
                text(p, function.system_name),
                text(p, function.filename),
                function.start_line,
            )));
        }
        mapping_keys.clear();
        for m in &p.mapping {
            buf.clear();
            buf.extend_from_slice(&m.memory_start.to_le_bytes());
            buf.extend_from_slice(&m.memory_limit.to_le_bytes());
            buf.extend_from_slice(&m.file_offset.to_le_bytes());
            put_str(buf, text(p, m.filename));
            put_str(buf, text(p, m.build_id));
            buf.push(mapping_flags(m));
            // Never 0, the key of "no mapping".
            mapping_keys.push(Key::of(content_key(buf) | 1));
        }
        let mut location_keys = Vec::with_capacity(p.locations().len());
        for l in p.locations() {
            let mapping = if l.mapping_id == 0 {
                0
            } else {
                mapping_keys[ids.mapping(l.mapping_id)?].get()
            };
            location_start(location, mapping, l.address, l.is_folded);
            for line in l.line {
                let f = function_keys[ids.function(line.function_id)?].get();
                location_line(location, f, line.line);
            }
            location_keys.push(Key::of(content_key(location)));
        }
        let mut keys = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            stack.clear();
            for &id in p.sample(group.sample).location_id {
                stack.extend_from_slice(&location_keys[ids.location(id)?].get().to_le_bytes());
            }
            keys.push(content_key(stack));
        }
        Ok((keys, location_keys))
    }
}
