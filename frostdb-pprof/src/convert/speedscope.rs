//! speedscope's JSON file format (`format=speedscope` on Pyroscope's `/ingest`; what py-spy
//! `--format speedscope`, rbspy and speedscope's own exports write) as pprof: one profile
//! per distinct `(name, unit)` of the file's `profiles`, each stack a path of
//! `shared.frames` names (root first), each value its weight in the profile's unit.
//!
//! Sampled profiles: `samples[i]` (frame indexes, root first) weighs `weights[i]`. Evented
//! profiles: `O` (open) and `C` (close) events of a frame at a time; the time between two
//! events counts for the frames open then. Time units become nanoseconds of CPU
//! (`process_cpu`), `none` a count of samples at the request's sample rate (as folded
//! stacks are) and `bytes` allocated bytes (`memory`). The format is
//! <https://www.speedscope.app/file-format-schema.json> (jlfwong/speedscope,
//! `src/lib/file-format-spec.ts`).
//!
//! Stricter than Pyroscope where it would store something else than the file says: a frame
//! index out of range, events out of order, a close of a frame not open, frames left open at
//! the end, a negative or non-finite weight and an unknown unit are errors naming the
//! profile and the sample or event. Weights are rounded to the nearest unit of the stored
//! value, not truncated to whole units of the file's (half a second is 500 ms, not 0).

use std::collections::HashMap;

use serde::Deserialize;

use super::folded::{Stacks, Units};
use crate::proto::Profile;
use crate::{Error, Limits, Result};

/// The `$schema` a speedscope file names.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// One profile of a file: its name (empty when the file gives none), what its values
/// measure, and the profile.
#[derive(Debug)]
pub struct Converted {
    /// The profile's `name` in the file.
    pub name: String,
    /// The store's profile name: `process_cpu` or `memory`.
    pub profile_name: &'static str,
    /// The profile.
    pub profile: Profile,
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "$schema")]
    schema: Option<String>,
    shared: SharedFrames,
    profiles: Vec<FileProfile>,
}

#[derive(Deserialize)]
struct SharedFrames {
    frames: Vec<FileFrame>,
}

#[derive(Deserialize)]
struct FileFrame {
    name: String,
}

/// A profile of the file, by its `type`. Read through [`RawProfile`], a plain struct: an
/// enum tagged by a field (`#[serde(tag)]`) is read by buffering each profile whole as
/// untyped values first, about 16 bytes of memory a byte of JSON.
#[derive(Deserialize)]
#[serde(try_from = "RawProfile")]
enum FileProfile {
    Sampled {
        name: String,
        unit: String,
        samples: Vec<Vec<u64>>,
        weights: Vec<f64>,
    },
    Evented {
        name: String,
        unit: String,
        start_value: f64,
        events: Vec<Event>,
    },
}

/// A profile's fields as they come, in any order.
#[derive(Deserialize)]
struct RawProfile {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: String,
    unit: String,
    samples: Option<Vec<Vec<u64>>>,
    weights: Option<Vec<f64>>,
    #[serde(rename = "startValue")]
    start_value: Option<f64>,
    events: Option<Vec<Event>>,
}

impl TryFrom<RawProfile> for FileProfile {
    type Error = String;

    fn try_from(p: RawProfile) -> std::result::Result<Self, String> {
        let missing = |field: &str| format!("a {} profile has no `{field}`", p.kind);
        match p.kind.as_str() {
            "sampled" => Ok(Self::Sampled {
                samples: p.samples.ok_or_else(|| missing("samples"))?,
                weights: p.weights.ok_or_else(|| missing("weights"))?,
                name: p.name,
                unit: p.unit,
            }),
            "evented" => Ok(Self::Evented {
                start_value: p.start_value.ok_or_else(|| missing("startValue"))?,
                events: p.events.ok_or_else(|| missing("events"))?,
                name: p.name,
                unit: p.unit,
            }),
            other => Err(format!(
                "unknown profile type {other:?} (sampled or evented)"
            )),
        }
    }
}

/// Bytes of memory the parsed file may take a byte of its JSON, at most: an empty sample
/// (`[],`, 3 bytes) is a 24-byte vector, a number (`0,`, 2 bytes) 8 bytes, and a vector
/// growing by doubling holds up to twice what it keeps.
const PARSED_BYTES_PER_BYTE: usize = 16;

/// Most profiles (of distinct names and units) a file may hold: each is stored as a
/// profile of its own, with its own copy of the request's labels (a thread each, in the
/// files speedscope's exporters write: tens, rarely hundreds).
pub const MAX_PROFILES: usize = 1_024;

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    at: f64,
    frame: u64,
}

/// The profile made of a file's profiles of one name and unit.
struct Group<'u> {
    name: String,
    profile_name: &'static str,
    stacks: Stacks<'u>,
    /// The location of each file frame index its stacks used.
    frames: HashMap<u64, u64>,
}

/// What a unit's values become: the store's profile name, the units, and how many of the
/// stored value one unit of the file is.
fn units_of(unit: &str, sample_rate: i64) -> Option<(&'static str, Units, f64)> {
    let cpu = |each_ns: f64| {
        let period = 1_000_000_000 / sample_rate.max(1);
        Some((
            "process_cpu",
            Units {
                sample: ("cpu".into(), "nanoseconds".into()),
                period: ("cpu".into(), "nanoseconds".into()),
                period_value: period,
                scale: 1,
            },
            each_ns,
        ))
    };
    match unit {
        "nanoseconds" => cpu(1.0),
        "microseconds" => cpu(1e3),
        "milliseconds" => cpu(1e6),
        "seconds" => cpu(1e9),
        // A sample at the request's rate.
        "none" => cpu((1_000_000_000 / sample_rate.max(1)) as f64),
        "bytes" => Some((
            "memory",
            Units {
                sample: ("alloc_space".into(), "bytes".into()),
                period: ("space".into(), "bytes".into()),
                period_value: 0,
                scale: 1,
            },
            1.0,
        )),
        _ => None,
    }
}

/// The profiles of a speedscope file; `sample_rate` is what a unit of `none` is a sample
/// at. Profiles of one name and unit are one profile (a file may split a thread's).
pub fn convert(body: &[u8], sample_rate: i64, limits: &Limits) -> Result<Vec<Converted>> {
    let invalid = |at: String, reason: String| Error::Convert {
        format: "speedscope",
        at,
        reason,
    };
    crate::decode::charge::charge(
        body.len().saturating_mul(PARSED_BYTES_PER_BYTE),
        "parsing a speedscope file",
    )?;
    let file: File = serde_json::from_slice(body).map_err(|e| {
        invalid(
            format!("line {} column {}", e.line(), e.column()),
            e.to_string(),
        )
    })?;
    if file.schema.as_deref() != Some(SCHEMA) {
        return Err(invalid(
            "$schema".into(),
            format!("{:?}, not {SCHEMA:?}", file.schema.unwrap_or_default()),
        ));
    }
    let frames = &file.shared.frames;
    let units: Vec<Option<(&'static str, Units, f64)>> = file
        .profiles
        .iter()
        .map(|p| match p {
            FileProfile::Sampled { unit, .. } | FileProfile::Evented { unit, .. } => {
                units_of(unit, sample_rate)
            }
        })
        .collect();
    // A profile per (name, unit), in the file's order; found by key, not by a scan, however
    // many profiles a file names.
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
    // Frames every stack added may still hold, over all the file's profiles: each group's
    // own bound alone would let a file of many profiles expand many times over.
    let max_frames = limits.max_decompressed_bytes / 8;
    let mut frames_left = max_frames;
    for (i, (profile, units)) in file.profiles.iter().zip(&units).enumerate() {
        let (name, unit) = match profile {
            FileProfile::Sampled { name, unit, .. } | FileProfile::Evented { name, unit, .. } => {
                (name, unit)
            }
        };
        let at = |what: String| format!("profiles[{i}]{what}");
        let Some((profile_name, units, each)) = units else {
            return Err(invalid(
                at(".unit".into()),
                format!("{unit:?} (none, nanoseconds, microseconds, milliseconds, seconds, bytes)"),
            ));
        };
        let g = match group_of.get(&(name.as_str(), unit.as_str())) {
            Some(&g) => g,
            None if groups.len() == MAX_PROFILES => {
                return Err(Error::TooLarge {
                    what: "profiles of distinct names and units in a speedscope file",
                    limit: MAX_PROFILES,
                });
            }
            None => {
                groups.push(Group {
                    name: name.clone(),
                    profile_name,
                    stacks: Stacks::new(units, limits, max_frames),
                    frames: HashMap::new(),
                });
                group_of.insert((name, unit), groups.len() - 1);
                groups.len() - 1
            }
        };
        let Group {
            stacks,
            frames: ids,
            ..
        } = &mut groups[g];
        // A file frame index's location in the group, made the first time it is used.
        let mut frame = |index: u64, stacks: &mut Stacks<'_>| -> Result<Option<u64>> {
            let Some(f) = usize::try_from(index).ok().and_then(|i| frames.get(i)) else {
                return Ok(None);
            };
            if let Some(&id) = ids.get(&index) {
                return Ok(Some(id));
            }
            let id = stacks.frame(&f.name)?;
            ids.insert(index, id);
            Ok(Some(id))
        };
        let value = |weight: f64, at: String| -> Result<i64> {
            let v = (weight * each).round();
            if !weight.is_finite() || weight < 0.0 || v >= i64::MAX as f64 {
                return Err(invalid(at, format!("the weight {weight} is not a count")));
            }
            Ok(v as i64)
        };
        let mut add = |stacks: &mut Stacks<'_>, stack: &[u64], v: i64, at: String| -> Result<()> {
            frames_left = frames_left
                .checked_sub(stack.len())
                .ok_or(Error::TooLarge {
                    what: "frames of all the file's stacks (the file expands past the \
                           decompressed-size limit)",
                    limit: max_frames,
                })?;
            if stack.len() > limits.max_stack_depth {
                return Err(invalid(
                    at,
                    format!(
                        "a stack of {} frames (the limit is {})",
                        stack.len(),
                        limits.max_stack_depth
                    ),
                ));
            }
            stacks.add(stack, v).map_err(|e| match e {
                Error::Convert { reason, .. } => invalid(at, reason),
                other => other,
            })
        };
        match profile {
            FileProfile::Sampled {
                samples, weights, ..
            } => {
                if samples.len() != weights.len() {
                    return Err(invalid(
                        at(String::new()),
                        format!("{} samples but {} weights", samples.len(), weights.len()),
                    ));
                }
                let mut stack = Vec::new();
                for (s, (sample, &weight)) in samples.iter().zip(weights).enumerate() {
                    let at_sample = || at(format!(".samples[{s}]"));
                    stack.clear();
                    for &f in sample {
                        stack.push(frame(f, stacks)?.ok_or_else(|| {
                            invalid(
                                at_sample(),
                                format!("frame {f} of {} shared frames", frames.len()),
                            )
                        })?);
                    }
                    let v = value(weight, at(format!(".weights[{s}]")))?;
                    if stack.is_empty() {
                        if v == 0 {
                            continue;
                        }
                        return Err(invalid(at_sample(), "a weight on an empty stack".into()));
                    }
                    add(stacks, &stack, v, at_sample())?;
                }
            }
            FileProfile::Evented {
                start_value,
                events,
                ..
            } => {
                let mut open: Vec<(u64, u64)> = Vec::new();
                let mut stack: Vec<u64> = Vec::new();
                let mut last = *start_value;
                for (e, event) in events.iter().enumerate() {
                    let at_event = || at(format!(".events[{e}]"));
                    if !event.at.is_finite() || event.at < last {
                        return Err(invalid(
                            at_event(),
                            format!("at {} comes before {last}", event.at),
                        ));
                    }
                    if !stack.is_empty() {
                        let v = value(event.at - last, at_event())?;
                        if v > 0 {
                            add(stacks, &stack, v, at_event())?;
                        }
                    }
                    last = event.at;
                    match event.kind.as_str() {
                        "O" => {
                            let id = frame(event.frame, stacks)?.ok_or_else(|| {
                                invalid(
                                    at_event(),
                                    format!(
                                        "frame {} of {} shared frames",
                                        event.frame,
                                        frames.len()
                                    ),
                                )
                            })?;
                            open.push((event.frame, id));
                            stack.push(id);
                        }
                        "C" => match open.last() {
                            Some(&(f, _)) if f == event.frame => {
                                open.pop();
                                stack.pop();
                            }
                            _ => {
                                return Err(invalid(
                                    at_event(),
                                    format!(
                                        "closes frame {}, which is not the innermost open",
                                        event.frame
                                    ),
                                ));
                            }
                        },
                        other => {
                            return Err(invalid(
                                at_event(),
                                format!("event type {other:?} (O or C)"),
                            ));
                        }
                    }
                }
                if let Some(&(f, _)) = open.last() {
                    return Err(invalid(
                        at(".events".into()),
                        format!("frame {f} is still open at the end ({} open)", open.len()),
                    ));
                }
            }
        }
    }
    groups
        .into_iter()
        .map(|g| {
            Ok(Converted {
                name: g.name,
                profile_name: g.profile_name,
                profile: g.stacks.finish()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../testdata/speedscope/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A profile's stacks as sorted `root;…;leaf value` lines, once it validates.
    fn folded(c: &Converted) -> Vec<String> {
        crate::validate(c.profile.clone(), &Limits::default()).unwrap();
        crate::convert::folded::stack_lines(&c.profile)
    }

    /// What parsing makes is charged before it is made: a file of 2 MiB of empty samples
    /// (`[],`: 24 bytes each once parsed) asks for 16 MiB first, and a charge refusing
    /// it fails the conversion naming it; a small real file is charged what it states.
    #[test]
    fn parsing_is_charged_before_the_file_is_parsed() {
        let mut bomb = br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[]},"profiles":[{"type":"sampled","unit":"none","weights":[],"samples":["#.to_vec();
        bomb.extend(b"[],".repeat(700_000));
        bomb.extend(b"[]]}]}");
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = asked.clone();
        let e = crate::charging(
            move |bytes, what| {
                seen.fetch_add(bytes, std::sync::atomic::Ordering::SeqCst);
                match bytes > 8 << 20 {
                    true => Err(crate::Error::Unavailable(format!(
                        "{what}: {bytes} bytes is over the budget"
                    ))),
                    false => Ok(()),
                }
            },
            || convert(&bomb, 100, &Limits::default()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("parsing a speedscope file"), "{e}");
        assert!(asked.load(std::sync::atomic::Ordering::SeqCst) >= 16_000_000);
        // A real file within the charge converts.
        let real = file("0.0.1_simple.speedscope.json");
        let got = crate::charging(|_, _| Ok(()), || convert(&real, 100, &Limits::default()));
        assert!(!got.unwrap().is_empty());
    }

    #[test]
    fn a_profile_of_no_known_type_is_refused_naming_it() {
        let body = br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[]},"profiles":[{"type":"tabulated","unit":"none"}]}"#;
        let e = convert(body, 100, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("\"tabulated\""), "{e}");
        let body = br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[]},"profiles":[{"unit":"none","samples":[],"type":"sampled"}]}"#;
        let e = convert(body, 100, &Limits::default()).unwrap_err();
        assert!(e.to_string().contains("weights"), "{e}");
    }

    /// Profiles of distinct names are a profile each, with a copy of the request's labels:
    /// a file of empty ones (70 bytes each) is refused past [`MAX_PROFILES`], naming it;
    /// that many are taken.
    #[test]
    fn a_file_of_more_profiles_than_the_limit_is_refused() {
        let file = |n: usize| {
            let profiles: Vec<String> = (0..n)
                .map(|i| {
                    format!(
                        r#"{{"type":"sampled","unit":"none","name":"t{i}","samples":[[0]],"weights":[1]}}"#
                    )
                })
                .collect();
            format!(
                r#"{{"$schema":"{SCHEMA}","shared":{{"frames":[{{"name":"f"}}]}},"profiles":[{}]}}"#,
                profiles.join(",")
            )
        };
        let e = convert(file(MAX_PROFILES + 1).as_bytes(), 100, &Limits::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("profiles of distinct names and units in a speedscope file"),
            "{e}"
        );
        let got = convert(file(MAX_PROFILES).as_bytes(), 100, &Limits::default()).unwrap();
        assert_eq!(got.len(), MAX_PROFILES);
    }

    #[test]
    fn speedscopes_own_samples_convert() {
        // Evented, unit none: a unit is a sample at 100 Hz (10 ms).
        for name in [
            "0.0.1_simple.speedscope.json",
            "0.0.1_simple-no-pretty-print.speedscope.json",
        ] {
            let got = convert(&file(name), 100, &Limits::default()).unwrap();
            assert_eq!(got.len(), 1, "{name}");
            assert_eq!(got[0].profile_name, "process_cpu");
            assert_eq!(
                folded(&got[0]),
                ["a;b 50000000", "a;b;c 50000000", "a;b;d 40000000"],
                "{name}"
            );
        }
        // At 1,000 Hz a unit is a millisecond.
        let got = convert(
            &file("0.0.1_simple.speedscope.json"),
            1000,
            &Limits::default(),
        );
        assert_eq!(
            folded(&got.unwrap()[0]),
            ["a;b 5000000", "a;b;c 5000000", "a;b;d 4000000"]
        );
        // Sampled, in seconds.
        let got = convert(
            &file("0.1.2_simple-sampled.speedscope.json"),
            100,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(
            folded(&got[0]),
            ["a;b 5000000000", "a;b;c 5000000000", "a;b;d 4000000000"]
        );
        // Two profiles, each under its name.
        let got = convert(
            &file("0.6.0_two-sampled.speedscope.json"),
            100,
            &Limits::default(),
        )
        .unwrap();
        let names: Vec<&str> = got.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["one", "two"]);
        for c in &got {
            assert_eq!(
                folded(c),
                ["a;b 5000000000", "a;b;c 5000000000", "a;b;d 4000000000"]
            );
        }
    }

    #[test]
    fn a_deep_stack_added_again_and_again_is_bounded() {
        // 500 frames open, then a leaf opened and closed 2,000 times, time passing: a
        // million frames of stacks from 100 kB.
        let mut events = Vec::new();
        for f in 0..500 {
            events.push(format!(r#"{{"type":"O","at":0,"frame":{f}}}"#));
        }
        for i in 0..2_000 {
            events.push(format!(r#"{{"type":"O","at":{},"frame":500}}"#, 2 * i + 1));
            events.push(format!(r#"{{"type":"C","at":{},"frame":500}}"#, 2 * i + 2));
        }
        let frames: Vec<String> = (0..=500).map(|f| format!(r#"{{"name":"f{f}"}}"#)).collect();
        let body = format!(
            r#"{{"$schema":"{SCHEMA}","shared":{{"frames":[{}]}},"profiles":[{{"type":"evented","name":"p","unit":"none","startValue":0,"endValue":1,"events":[{}]}}]}}"#,
            frames.join(","),
            events.join(",")
        );
        let limits = Limits {
            max_decompressed_bytes: 1 << 20,
            ..Limits::default()
        };
        let e = convert(body.as_bytes(), 100, &limits).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    }

    #[test]
    fn the_frames_of_all_a_files_profiles_share_one_bound() {
        // A profile of 100 frames open and a leaf opened and closed 300 times adds about
        // 60,000 frames: under the bound alone, past it four times over under four names.
        let profile = |name: usize| {
            let mut events = Vec::new();
            for f in 0..100 {
                events.push(format!(r#"{{"type":"O","at":0,"frame":{f}}}"#));
            }
            for i in 0..300 {
                events.push(format!(r#"{{"type":"O","at":{},"frame":100}}"#, 2 * i + 1));
                events.push(format!(r#"{{"type":"C","at":{},"frame":100}}"#, 2 * i + 2));
            }
            for f in (0..100).rev() {
                events.push(format!(r#"{{"type":"C","at":600,"frame":{f}}}"#));
            }
            format!(
                r#"{{"type":"evented","name":"p{name}","unit":"none","startValue":0,"endValue":1,"events":[{}]}}"#,
                events.join(",")
            )
        };
        let file = |profiles: usize| {
            let frames: Vec<String> = (0..=100).map(|f| format!(r#"{{"name":"f{f}"}}"#)).collect();
            let profiles: Vec<String> = (0..profiles).map(profile).collect();
            format!(
                r#"{{"$schema":"{SCHEMA}","shared":{{"frames":[{}]}},"profiles":[{}]}}"#,
                frames.join(","),
                profiles.join(",")
            )
        };
        let limits = Limits {
            max_decompressed_bytes: 1 << 20,
            ..Limits::default()
        };
        let one = convert(file(1).as_bytes(), 100, &limits).unwrap();
        assert_eq!(one.len(), 1);
        let e = convert(file(4).as_bytes(), 100, &limits).unwrap_err();
        assert!(
            matches!(e, Error::TooLarge { what, .. } if what.contains("all the file's stacks")),
            "{e}"
        );
    }

    #[test]
    fn files_speedscope_calls_invalid_are_refused_with_the_reason() {
        let e = convert(
            &file("invalid_incomplete-trace.json"),
            100,
            &Limits::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("profiles[0].events: frame"), "{e}");
        assert!(e.contains("still open at the end"), "{e}");
        let e = convert(
            &file("invalid_out-of-order-events.json"),
            100,
            &Limits::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not the innermost open"), "{e}");
    }

    #[test]
    fn bad_files_name_what_is_wrong() {
        let doc = |profile: &str| {
            format!(
                r#"{{"$schema":"{SCHEMA}","shared":{{"frames":[{{"name":"a"}},{{"name":"b"}}]}},"profiles":[{profile}]}}"#
            )
        };
        let sampled = |samples: &str, weights: &str, unit: &str| {
            doc(&format!(
                r#"{{"type":"sampled","name":"p","unit":"{unit}","startValue":0,"endValue":1,"samples":{samples},"weights":{weights}}}"#
            ))
        };
        let cases = [
            (
                sampled("[[0,2]]", "[1]", "seconds"),
                "profiles[0].samples[0]: frame 2 of 2",
            ),
            (
                sampled("[[0,1]]", "[1,2]", "seconds"),
                "1 samples but 2 weights",
            ),
            (
                sampled("[[0,1]]", "[-1]", "seconds"),
                "weights[0]: the weight -1",
            ),
            (
                sampled("[[0,1]]", "[1]", "furlongs"),
                "profiles[0].unit: \"furlongs\"",
            ),
            (
                sampled("[[]]", "[3]", "seconds"),
                "a weight on an empty stack",
            ),
            (
                doc(
                    r#"{"type":"evented","name":"p","unit":"none","startValue":5,"endValue":9,"events":[{"type":"O","at":1,"frame":0}]}"#,
                ),
                "profiles[0].events[0]: at 1 comes before 5",
            ),
            (
                doc(
                    r#"{"type":"evented","name":"p","unit":"none","startValue":0,"endValue":9,"events":[{"type":"X","at":1,"frame":0}]}"#,
                ),
                "event type \"X\"",
            ),
            (
                doc(r#"{"type":"flame","name":"p","unit":"none"}"#),
                "invalid speedscope: line 1",
            ),
            (
                r#"{"$schema":"https://example.com","shared":{"frames":[]},"profiles":[]}"#.into(),
                "$schema",
            ),
            ("[1,2".into(), "invalid speedscope: line 1"),
        ];
        for (body, want) in cases {
            let e = convert(body.as_bytes(), 100, &Limits::default())
                .expect_err(want)
                .to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
        // Half a second is 500 ms, not nothing.
        let got = convert(
            sampled("[[0,1]]", "[0.5]", "seconds").as_bytes(),
            100,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(folded(&got[0]), ["a;b 500000000"]);
    }

    /// A frame name that every profile of a file copies is charged in each (the file's
    /// own charge is in proportion to its bytes, which name it once), and a name past a
    /// trie's frame limit is refused before it is copied at all.
    #[test]
    fn a_shared_frame_name_is_charged_in_every_profile_that_copies_it() {
        let file = |name_bytes: usize, profiles: usize| {
            let profile = |i: usize| {
                format!(
                    r#"{{"type":"evented","name":"p{i}","unit":"none","startValue":0,"endValue":1,"events":[{{"type":"O","frame":0,"at":0}},{{"type":"C","frame":0,"at":1}}]}}"#
                )
            };
            let profiles: Vec<String> = (0..profiles).map(profile).collect();
            format!(
                r#"{{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{{"frames":[{{"name":"{}"}}]}},"profiles":[{}]}}"#,
                "a".repeat(name_bytes),
                profiles.join(",")
            )
        };
        let shared = file(60_000, 200);
        let limits = Limits::default();
        assert_eq!(convert(shared.as_bytes(), 100, &limits).unwrap().len(), 200);
        let budget = 16 << 20;
        assert!(shared.len() * 16 < budget, "the file's own charge fits");
        let (got, asked) = crate::decode::charge::under_budget(budget, || {
            convert(shared.as_bytes(), 100, &limits)
        });
        let e = got
            .err()
            .unwrap_or_else(|| panic!("200 copies of a name, uncharged"));
        assert!(e.to_string().contains("over the budget"), "{e}");
        assert!(asked > budget);
        let long = file(crate::convert::trie::MAX_FRAME_BYTES + 1, 1);
        let e = convert(long.as_bytes(), 100, &limits).err().unwrap();
        assert!(e.to_string().contains("bytes of a frame name"), "{e}");
    }
}
