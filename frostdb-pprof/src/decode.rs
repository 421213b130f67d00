//! Decoding pprof: gzip or raw protobuf, bounded in memory, then checked field by field so
//! that everything downstream can index without checking again.

use std::collections::HashSet;
use std::io::Read;

use prost::Message;

use crate::error::{Error, Result};
use crate::proto::Profile;

/// Bounds on what a decoded profile may hold.
///
/// # Defaults
/// | limit | default |
/// |---|---|
/// | `max_decompressed_bytes` | 256 MiB |
/// | `max_samples` | 4 Mi |
/// | `max_locations` | 4 Mi |
/// | `max_functions` | 4 Mi |
/// | `max_stack_depth` | 4 096 |
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
    /// Deepest stack.
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

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field,
        reason: reason.into(),
    }
}

/// The raw protobuf of `bytes`: gunzipped when they start with the gzip magic, never more
/// than `limit` bytes.
pub fn inflate(bytes: &[u8], limit: usize) -> Result<std::borrow::Cow<'_, [u8]>> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        if bytes.len() > limit {
            return Err(Error::TooLarge {
                what: "profile",
                limit,
            });
        }
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    // pprof compresses about 4:1; one allocation is usually enough.
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(4).min(limit));
    let mut decoder =
        flate2::read::MultiGzDecoder::new(bytes).take((limit as u64).saturating_add(1));
    decoder
        .read_to_end(&mut out)
        .map_err(|e| Error::Gzip(e.to_string()))?;
    if out.len() > limit {
        return Err(Error::TooLarge {
            what: "decompressed profile",
            limit,
        });
    }
    Ok(std::borrow::Cow::Owned(out))
}

/// A profile whose every reference has been checked (by [`validate`] or [`decode`]): the
/// only kind the store takes, so nothing downstream indexes out of range.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidProfile(Profile);

impl ValidProfile {
    /// The profile.
    pub fn into_inner(self) -> Profile {
        self.0
    }
}

impl std::ops::Deref for ValidProfile {
    type Target = Profile;

    fn deref(&self) -> &Profile {
        &self.0
    }
}

/// Decodes and validates a profile (gzip or raw).
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<ValidProfile> {
    let raw = inflate(bytes, limits.max_decompressed_bytes)?;
    let profile = Profile::decode(raw.as_ref()).map_err(|e| Error::Protobuf(e.to_string()))?;
    validate(profile, limits)
}

/// Fixes known writer bugs that lose no information: .NET profiles whose functions all have
/// id 0 while locations refer to them by position (as Pyroscope repairs them).
fn repair(p: &mut Profile) {
    if p.function.len() > 1 && p.function.iter().all(|f| f.id == 0) {
        for (i, f) in p.function.iter_mut().enumerate() {
            f.id = i as u64 + 1;
        }
    }
}

/// Checks every reference of `p`: string indices in range, ids that exist and are unique,
/// one value per sample type, and the limits. Known writer bugs that lose nothing are
/// repaired first.
pub fn validate(mut p: Profile, limits: &Limits) -> Result<ValidProfile> {
    repair(&mut p);
    check(&p, limits)?;
    Ok(ValidProfile(p))
}

fn check(p: &Profile, limits: &Limits) -> Result<()> {
    let strings = p.string_table.len();
    if strings == 0 || !p.string_table[0].is_empty() {
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
    if p.sample.len() > limits.max_samples {
        return Err(Error::TooLarge {
            what: "sample count",
            limit: limits.max_samples,
        });
    }
    if p.location.len() > limits.max_locations {
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

    let mut mappings = HashSet::with_capacity(p.mapping.len());
    for m in &p.mapping {
        if m.id == 0 || !mappings.insert(m.id) {
            return Err(invalid(
                "mapping.id",
                format!("id {} is zero or repeated", m.id),
            ));
        }
        string("mapping.filename", m.filename)?;
        string("mapping.build_id", m.build_id)?;
    }
    let mut functions = HashSet::with_capacity(p.function.len());
    for f in &p.function {
        if f.id == 0 || !functions.insert(f.id) {
            return Err(invalid(
                "function.id",
                format!("id {} is zero or repeated", f.id),
            ));
        }
        string("function.name", f.name)?;
        string("function.system_name", f.system_name)?;
        string("function.filename", f.filename)?;
    }
    let mut locations = HashSet::with_capacity(p.location.len());
    for l in &p.location {
        if l.id == 0 || !locations.insert(l.id) {
            return Err(invalid(
                "location.id",
                format!("id {} is zero or repeated", l.id),
            ));
        }
        if l.mapping_id != 0 && !mappings.contains(&l.mapping_id) {
            return Err(invalid(
                "location.mapping_id",
                format!(
                    "location {} refers to mapping {}, which does not exist",
                    l.id, l.mapping_id
                ),
            ));
        }
        for line in &l.line {
            if !functions.contains(&line.function_id) {
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
    for (i, s) in p.sample.iter().enumerate() {
        if s.value.len() != types {
            return Err(invalid(
                "sample.value",
                format!(
                    "sample {i} has {} values for {types} sample types",
                    s.value.len()
                ),
            ));
        }
        if s.location_id.len() > limits.max_stack_depth {
            return Err(Error::TooLarge {
                what: "stack depth",
                limit: limits.max_stack_depth,
            });
        }
        for id in &s.location_id {
            if !locations.contains(id) {
                return Err(invalid(
                    "sample.location_id",
                    format!("sample {i} refers to location {id}, which does not exist"),
                ));
            }
        }
        for l in &s.label {
            string("label.key", l.key)?;
            string("label.str", l.str)?;
            string("label.num_unit", l.num_unit)?;
        }
    }
    Ok(())
}
