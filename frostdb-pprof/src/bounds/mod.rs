//! Request messages checked on their bytes before they are decoded: sizes and counts are
//! read off the wire, so a small body cannot make a large message.
//!
//! prost and serde materialise a whole message before anyone can look at it, and a message
//! costs far more decoded than sent: an empty `LabelPair` is 2 bytes of protobuf and 48 of
//! Rust, so 20 M of them are a 117 KB gzip body that decodes to 5 GB. A per-element limit
//! checked after decoding comes too late.
//!
//! Each request message has a [`Shape`], a static description of its fields (which numbers
//! are nested messages, strings, bytes or scalars, what each costs decoded, and which have
//! a [`Limit`] on their count). One pass over the bytes ([`check_protobuf`], or
//! [`check_json`] for proto3 JSON) walks the message iteratively (no recursion, no
//! allocation), counts every repeated field against its limit, refuses nesting deeper than
//! [`RequestLimits::max_depth`], and adds up what the decoded message will take (elements
//! times the `size_of` of their Rust struct, plus string and byte lengths) against
//! [`RequestLimits::max_decoded_bytes`]. Only a message that passes is decoded
//! ([`decode_protobuf`], [`decode_json`]): its memory is then at most that estimate (twice
//! it while vectors grow by doubling) besides the body itself.
//!
//! Over a limit is [`Error::TooLarge`] naming the field path and the limit
//! (`series[].labels exceeds the limit of 64`); bytes that are not the message are
//! [`Error::Convert`] naming where (`series[2].labels[0]`).

mod json;
mod protobuf;
mod shapes;

#[cfg(test)]
mod tests;

use crate::{Error, Result};

pub use shapes::Bounded;

/// Bounds on a request message, checked on its bytes before it is decoded (see the module).
///
/// Counts marked "in all" add up over the whole request; the others are per element of
/// the field named (per series, say).
///
/// # Defaults
/// | limit | default | field |
/// |---|---|---|
/// | `max_decoded_bytes` | 256 MiB | every request: what its decoded message takes |
/// | `max_depth` | 32 | every request: messages within messages |
/// | `max_push_series` | 10,000 | push `series` |
/// | `max_labels_per_series` | 64 | push `series[].labels` (Pyroscope allows 30 label names a series; `__name__` and its friends need room) |
/// | `max_samples_per_series` | 10,000 | push `series[].samples` |
/// | `max_matchers` | 100 | query API `matchers`, in all |
/// | `max_span_ids` | 10,000 | query API `span_selector`, in all |
/// | `max_label_names` | 1,000 | query API `label_names`, `group_by`, in all |
/// | `max_call_site` | 4,096 | query API `stack_trace_selector.call_site`, in all |
/// | `max_settings_bytes` | 64 KiB | a `settings.v1` request, whole |
/// | `max_resource_profiles` | 10,000 | OTLP `resource_profiles` |
/// | `max_scope_profiles` | 10,000 | OTLP `scope_profiles`, in all |
/// | `max_profiles` | 10,000 | OTLP `profiles`, in all |
/// | `max_samples` | 4 Mi | OTLP `samples`, in all |
/// | `max_dictionary_entries` | 4 Mi | each OTLP dictionary table, in all |
/// | `max_stack_frames` | 16 Mi | OTLP: every sample's stack depth, summed over the request |
///
/// `max_stack_frames` is checked after decoding, before converting: a sample names its
/// stack by index, so a few bytes a sample can stand for thousands of frames, which the
/// conversion does not copy (samples of one stack share it) but the store walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most bytes the decoded message may take, estimated from its elements.
    pub max_decoded_bytes: usize,
    /// Deepest nesting of messages (the request itself is depth 1); at most 64.
    pub max_depth: usize,
    /// Most series in a push request.
    pub max_push_series: usize,
    /// Most labels in one series of a push request.
    pub max_labels_per_series: usize,
    /// Most samples (profiles) in one series of a push request.
    pub max_samples_per_series: usize,
    /// Most label matchers in a query API request.
    pub max_matchers: usize,
    /// Most span ids in a query API request.
    pub max_span_ids: usize,
    /// Most label names (`label_names`, `group_by`) in a query API request.
    pub max_label_names: usize,
    /// Most call site frames (`stack_trace_selector.call_site`) in a query API request.
    pub max_call_site: usize,
    /// Largest `settings.v1` request, in bytes as received (decompressed).
    pub max_settings_bytes: usize,
    /// Most `resource_profiles` in an OTLP export.
    pub max_resource_profiles: usize,
    /// Most `scope_profiles` in an OTLP export, in all.
    pub max_scope_profiles: usize,
    /// Most profiles in an OTLP export, in all.
    pub max_profiles: usize,
    /// Most samples in an OTLP export, in all.
    pub max_samples: usize,
    /// Most entries in each table of an OTLP export's dictionary.
    pub max_dictionary_entries: usize,
    /// Most stack frames of an OTLP export: every sample's stack depth, summed.
    pub max_stack_frames: usize,
    /// Longest label name, in bytes, of a push series or an OTLP attribute: checked before
    /// labels are copied to each profile or sample (the store's
    /// [`LabelLimits::max_label_name_length`](crate::LabelLimits) checks them again).
    pub max_label_name_bytes: usize,
    /// Longest label value, in bytes (as [`Self::max_label_name_bytes`]).
    pub max_label_value_bytes: usize,
}

impl RequestLimits {
    /// Refuses a label longer than the limits before it is copied anywhere: one long value
    /// named by every profile or sample of a request would otherwise be copied for each.
    pub(crate) fn check_label(&self, name: &str, value: &str) -> crate::Result<()> {
        // The store's own check, with these lengths (it formats a message only on failure).
        crate::LabelLimits {
            max_label_names_per_series: usize::MAX,
            max_label_name_length: self.max_label_name_bytes,
            max_label_value_length: self.max_label_value_bytes,
        }
        .check_label(name, value)
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_decoded_bytes: 256 << 20,
            max_depth: 32,
            max_push_series: 10_000,
            max_labels_per_series: 64,
            max_samples_per_series: 10_000,
            max_matchers: 100,
            max_span_ids: 10_000,
            max_label_names: 1_000,
            max_call_site: 4_096,
            max_settings_bytes: 64 << 10,
            max_resource_profiles: 10_000,
            max_scope_profiles: 10_000,
            max_profiles: 10_000,
            max_samples: 4 << 20,
            max_dictionary_entries: 4 << 20,
            max_stack_frames: 16 << 20,
            max_label_name_bytes: crate::LabelLimits::default().max_label_name_length,
            max_label_value_bytes: crate::LabelLimits::default().max_label_value_length,
        }
    }
}

/// What a message's field holds, as the wire says and as decoding costs.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A nested message.
    Message(&'static Shape),
    /// Text (`String`).
    String,
    /// Bytes (`Vec<u8>`).
    Bytes,
    /// A varint (integers, `bool`, enums) of this many bytes in Rust.
    Varint(usize),
    /// Four bytes on the wire (`fixed32`, `sfixed32`, `float`).
    Fixed32,
    /// Eight bytes on the wire (`fixed64`, `sfixed64`, `double`).
    Fixed64,
}

/// One field of a [`Shape`].
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its number.
    pub number: u32,
    /// Its name in the `.proto` (proto3 JSON accepts it too).
    pub name: &'static str,
    /// Its proto3 JSON name (lowerCamelCase).
    pub json: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// Whether it is `repeated`.
    pub repeated: bool,
    /// The limit on its count, if any.
    pub limit: Option<&'static Limit>,
}

impl Field {
    /// A singular field.
    pub const fn new(number: u32, name: &'static str, json: &'static str, kind: Kind) -> Self {
        Self {
            number,
            name,
            json,
            kind,
            repeated: false,
            limit: None,
        }
    }

    /// The field, `repeated`.
    pub const fn repeated(mut self) -> Self {
        self.repeated = true;
        self
    }

    /// The field, repeated at most as `limit` says.
    pub const fn limited(mut self, limit: &'static Limit) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The bytes one element of this repeated field takes decoded, besides the text or
    /// bytes it holds.
    fn element_size(&self) -> usize {
        match self.kind {
            Kind::Message(shape) => shape.size,
            Kind::String => std::mem::size_of::<String>(),
            Kind::Bytes => std::mem::size_of::<Vec<u8>>(),
            Kind::Varint(size) => size,
            Kind::Fixed32 => 4,
            Kind::Fixed64 => 8,
        }
    }
}

/// A message: the fields a scan knows (others are skipped, as decoding skips them).
#[derive(Debug)]
pub struct Shape {
    /// The message's name (`PushRequest`), for errors.
    pub name: &'static str,
    /// `size_of` its decoded Rust struct.
    pub size: usize,
    /// Its fields (at most [`MAX_FIELDS`]).
    pub fields: &'static [Field],
    /// A limit on the whole message's bytes, when it is the request.
    pub max_bytes: Option<&'static Limit>,
}

impl Shape {
    /// The position of field `number`.
    fn field(&self, number: u64) -> Option<usize> {
        self.fields
            .iter()
            .position(|f| u64::from(f.number) == number)
    }
}

/// Most fields a [`Shape`] may have: a scan keeps a count of each in a fixed array.
pub const MAX_FIELDS: usize = 16;

/// Deepest nesting a scan can follow (its frames are a fixed array):
/// [`RequestLimits::max_depth`] is capped at this.
pub const MAX_DEPTH: usize = 64;

/// Most [`Per::Request`] limits one request's shapes may hold (their counts are a fixed
/// array).
pub const MAX_REQUEST_LIMITS: usize = 16;

/// A limit on a repeated field's count (or on a request's bytes).
#[derive(Debug)]
pub struct Limit {
    /// What is counted, as errors name it: the field path (`series[].labels`).
    pub what: &'static str,
    /// What the count adds up over.
    pub per: Per,
    /// The limit, from the request limits.
    pub max: fn(&RequestLimits) -> usize,
}

/// What a [`Limit`] counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    /// Each message holding the field. Only for messages that are elements of a repeated
    /// field (or the request): a singular message field sent twice is merged into one by
    /// decoding, and its counts would add up.
    Parent,
    /// The whole request.
    Request,
}

/// What a scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// The bytes the decoded message will take, estimated: every element's `size_of`, and
    /// every string's and bytes field's length.
    pub decoded_bytes: usize,
}

/// Checks the protobuf `bytes` of a message of `shape` against `limits`, without decoding
/// it; `format` names the request in errors (`push`, `OTLP`).
pub fn check_protobuf(
    format: &'static str,
    shape: &'static Shape,
    bytes: &[u8],
    limits: &RequestLimits,
) -> Result<Scanned> {
    protobuf::scan(format, shape, bytes, limits)
}

/// Checks the proto3 JSON `text` of a message of `shape` against `limits`, without
/// decoding it; `format` names the request in errors. Its syntax must be JSON; a value of
/// the wrong type for its field is left for decoding to refuse.
pub fn check_json(
    format: &'static str,
    shape: &'static Shape,
    text: &[u8],
    limits: &RequestLimits,
) -> Result<Scanned> {
    json::scan(format, shape, text, limits)
}

/// Charges what the decoded message will take ([`crate::charging`]) before it is made:
/// within the request limits, a message still costs many times its bytes (an empty label 2
/// bytes sent, 48 decoded), and several at once must fit the budget they share.
pub(crate) fn charge_decoded(scanned: &Scanned) -> Result<()> {
    crate::decode::charge::charge(scanned.decoded_bytes, "the decoded request message")
}

/// Decodes a protobuf message once [`check_protobuf`] found it within `limits`, and its
/// decoded size is charged (where a charge is set, [`crate::charging`]). Errors name
/// `format` and the message; a decoding error is at `body`.
pub fn decode_protobuf<M>(format: &'static str, bytes: &[u8], limits: &RequestLimits) -> Result<M>
where
    M: prost::Message + Default + Bounded,
{
    let scanned = check_protobuf(format, M::shape(), bytes, limits)?;
    charge_decoded(&scanned)?;
    M::decode(bytes).map_err(|e| Error::Convert {
        format,
        at: "body".into(),
        reason: format!("not a {} protobuf: {e}", M::shape().name),
    })
}

/// Decodes a proto3 JSON message once [`check_json`] found it within `limits`, and its
/// decoded size is charged (as [`decode_protobuf`]). Errors name `format` and the message;
/// a decoding error is at `body`.
pub fn decode_json<M>(format: &'static str, text: &[u8], limits: &RequestLimits) -> Result<M>
where
    M: serde::de::DeserializeOwned + Bounded,
{
    let scanned = check_json(format, M::shape(), text, limits)?;
    charge_decoded(&scanned)?;
    serde_json::from_slice(text).map_err(|e| Error::Convert {
        format,
        at: "body".into(),
        reason: format!("not {} JSON: {e}", M::shape().name),
    })
}

/// Counts of the [`Per::Request`] limits of one scan, by limit (compared by address).
#[derive(Debug)]
struct RequestCounts {
    counts: [(usize, usize); MAX_REQUEST_LIMITS],
    len: usize,
}

impl RequestCounts {
    fn new() -> Self {
        Self {
            counts: [(0, 0); MAX_REQUEST_LIMITS],
            len: 0,
        }
    }

    /// Adds `n` to the count of `limit`; the new count.
    fn add(&mut self, limit: &'static Limit, n: usize) -> usize {
        let key = std::ptr::from_ref(limit) as usize;
        let slot = match self.counts[..self.len].iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                // The shapes test checks that no request has more.
                let i = self.len.min(MAX_REQUEST_LIMITS - 1);
                self.counts[i] = (key, 0);
                self.len = (self.len + 1).min(MAX_REQUEST_LIMITS);
                i
            }
        };
        let count = &mut self.counts[slot].1;
        *count = count.saturating_add(n);
        *count
    }
}

/// What both scans keep besides their frames: the estimate, the request-wide counts.
#[derive(Debug)]
struct Tally<'l> {
    limits: &'l RequestLimits,
    decoded: usize,
    request: RequestCounts,
}

impl<'l> Tally<'l> {
    /// A tally for a request of `shape`, `len` bytes long.
    fn new(shape: &'static Shape, len: usize, limits: &'l RequestLimits) -> Result<Self> {
        if let Some(limit) = shape.max_bytes {
            let max = (limit.max)(limits);
            if len > max {
                return Err(Error::TooLarge {
                    what: limit.what,
                    limit: max,
                });
            }
        }
        let mut tally = Self {
            limits,
            decoded: 0,
            request: RequestCounts::new(),
        };
        tally.decoded(shape.size)?;
        Ok(tally)
    }

    /// Adds `bytes` to the decoded size.
    fn decoded(&mut self, bytes: usize) -> Result<()> {
        self.decoded = self.decoded.saturating_add(bytes);
        if self.decoded > self.limits.max_decoded_bytes {
            return Err(Error::TooLarge {
                what: "decoded request bytes",
                limit: self.limits.max_decoded_bytes,
            });
        }
        Ok(())
    }

    /// The deepest nesting allowed.
    fn max_depth(&self) -> usize {
        self.limits.max_depth.min(MAX_DEPTH)
    }

    /// Checks the nesting of a message about to open at `depth` (the request is 1).
    fn depth(&self, depth: usize) -> Result<()> {
        if depth > self.max_depth() {
            return Err(Error::TooLarge {
                what: "message nesting depth",
                limit: self.max_depth(),
            });
        }
        Ok(())
    }

    /// Counts `n` more elements of `field`, which its parent holds `in_parent` of now.
    fn count(&mut self, field: &Field, in_parent: usize, n: usize) -> Result<()> {
        let Some(limit) = field.limit else {
            return Ok(());
        };
        let count = match limit.per {
            Per::Parent => in_parent,
            Per::Request => self.request.add(limit, n),
        };
        let max = (limit.max)(self.limits);
        if count > max {
            return Err(Error::TooLarge {
                what: limit.what,
                limit: max,
            });
        }
        Ok(())
    }
}

/// Where a frame of a scan was entered from: the field of its parent, and the element's
/// position when that field is repeated.
#[derive(Debug, Clone, Copy)]
struct Via {
    field: &'static Field,
    index: Option<u32>,
}

/// The field path of the frames entered through `vias` (and `last`, the field being read):
/// `series[2].labels[0]`, or `body` at the top.
fn path(vias: impl Iterator<Item = Via>, last: Option<Via>) -> String {
    let mut out = String::new();
    for via in vias.chain(last) {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(via.field.name);
        if let Some(i) = via.index {
            out.push_str(&format!("[{i}]"));
        }
    }
    if out.is_empty() {
        out.push_str("body");
    }
    out
}
