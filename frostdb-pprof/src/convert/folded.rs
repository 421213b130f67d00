//! Folded stacks (`root;caller;leaf 12` per line, Brendan Gregg's format and Pyroscope's
//! default `/ingest` body) and "lines" (one stack per line, one sample each) as pprof.

use std::collections::HashMap;

use crate::proto::{Function, Line, Location, Profile, Sample, ValueType};
use crate::string_table::StringTable;
use crate::{Error, Result};

/// What the values of a folded profile measure.
#[derive(Debug, Clone)]
pub struct Units {
    /// Sample type and unit, e.g. `cpu` / `nanoseconds`.
    pub sample: (String, String),
    /// Period type and unit.
    pub period: (String, String),
    /// The period (e.g. 10 ms of CPU at 100 Hz).
    pub period_value: i64,
    /// Each count is multiplied by this (samples at 100 Hz → 10 ms of CPU each).
    pub scale: i64,
}

/// Builds a profile from folded text; `lines` reads one stack per line without counts.
/// [`Limits::max_samples`](crate::Limits) bounds the distinct stacks,
/// [`Limits::max_locations`](crate::Limits) the distinct frames (each a function and a
/// location, some 300 bytes made of a name of a few bytes), checked as each is made.
///
/// A bad line is [`Error::Convert`] naming it (`line 3`); more distinct stacks or frames
/// than the limits is [`Error::TooLarge`].
pub fn to_profile(
    text: &str,
    lines: bool,
    units: &Units,
    limits: &crate::Limits,
) -> Result<Profile> {
    let format = if lines { "lines" } else { "folded" };
    let bad = |n: usize, reason: String| Error::Convert {
        format,
        at: format!("line {}", n + 1),
        reason,
    };
    let mut stacks = Stacks::new(units, limits, usize::MAX);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let (stack, count) = if lines {
            (line, 1)
        } else {
            let (stack, count) = line
                .rsplit_once(' ')
                .ok_or_else(|| bad(n, "expected `frame;frame;... <count>`".into()))?;
            let count: i64 = count.trim().parse().map_err(|_| {
                bad(
                    n,
                    format!("the count {:?} is not a whole number", count.trim()),
                )
            })?;
            if count < 0 {
                return Err(bad(n, format!("negative count {count}")));
            }
            (stack, count)
        };
        // Frames are made as they are read, the line's depth checked as it grows: a line
        // of millions of frames is refused at the limit, not split into millions first.
        let mut ids: Vec<u64> = Vec::new();
        for f in stack.split(';').filter(|f| !f.is_empty()) {
            if ids.len() == limits.max_stack_depth {
                return Err(Error::TooLarge {
                    what: "stack depth",
                    limit: limits.max_stack_depth,
                });
            }
            ids.push(stacks.frame(f)?);
        }
        if ids.is_empty() {
            return Err(bad(n, "no frames".into()));
        }
        stacks.add(&ids, count).map_err(|e| match e {
            Error::Convert { reason, .. } => bad(n, reason),
            other => other,
        })?;
    }
    stacks.finish()
}

/// Stacks of named frames and their counts, gathered into a pprof profile of one value
/// type: what folded stacks, lines, Pyroscope's trie and tree bodies and speedscope files
/// all become. A frame is a location with one line in a function of its name.
///
/// What it builds is charged as it is built ([`take`](crate::decode::charge::take)): a
/// compact body (an evented speedscope file's groups, a trie) names a frame or a stack once
/// and has it copied many times.
pub(crate) struct Stacks<'u> {
    units: &'u Units,
    strings: StringTable,
    functions: Vec<Function>,
    locations: Vec<Location>,
    location_ids: HashMap<String, u64>,
    samples: HashMap<Vec<u64>, i64>,
    max_samples: usize,
    max_locations: usize,
    /// Frames the stacks added may still hold, summed over every add (repeats too): what
    /// bounds a compact body (a trie, a tree, an evented speedscope file) that names a deep
    /// stack once and adds it, or stacks below it, many times.
    frames_left: usize,
    max_frames: usize,
    pace: crate::decode::charge::Pace,
}

/// What a distinct frame takes besides its name: a function, a location, a line and a map
/// slot (the name's first two copies are the string table's).
const FRAME_SLOTS: usize = 300;
/// What a distinct stack takes besides its frames, in frame ids: the map slot, the value
/// and the sample built from it.
const SAMPLE_SLOTS: usize = 16;

impl<'u> Stacks<'u> {
    /// At most `limits.max_samples` distinct stacks and `limits.max_locations` distinct
    /// frames, and at most `max_frames` frames added in all.
    pub(crate) fn new(units: &'u Units, limits: &crate::Limits, max_frames: usize) -> Self {
        Self {
            units,
            strings: StringTable::new(),
            functions: Vec::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            samples: HashMap::new(),
            max_samples: limits.max_samples,
            max_locations: limits.max_locations,
            frames_left: max_frames,
            max_frames,
            pace: crate::decode::charge::Pace::new(),
        }
    }

    /// The location id of the frame named `name`; [`Error::TooLarge`] when it would be one
    /// distinct frame more than the location limit (each a function and a location, some
    /// 300 bytes, of a name of a few bytes), refused before it is made.
    pub(crate) fn frame(&mut self, name: &str) -> Result<u64> {
        self.pace.tick()?;
        if let Some(&id) = self.location_ids.get(name) {
            return Ok(id);
        }
        if self.locations.len() >= self.max_locations {
            return Err(Error::TooLarge {
                what: "location count (distinct frames)",
                limit: self.max_locations,
            });
        }
        if name.len() > crate::convert::trie::MAX_FRAME_BYTES {
            return Err(Error::TooLarge {
                what: "bytes of a frame name",
                limit: crate::convert::trie::MAX_FRAME_BYTES,
            });
        }
        // The name's third copy (the id map's) and the function, location and line.
        crate::decode::charge::take(name.len() + FRAME_SLOTS, "converting stacks")?;
        let name_index = self.strings.get(name)?;
        let id = self.locations.len() as u64 + 1;
        self.functions.push(Function {
            id,
            name: name_index,
            system_name: name_index,
            ..Function::default()
        });
        self.locations.push(Location {
            id,
            line: vec![Line {
                function_id: id,
                ..Line::default()
            }],
            ..Location::default()
        });
        self.location_ids.insert(name.to_owned(), id);
        Ok(id)
    }

    /// Adds `count` samples (scaled by the units) of the stack of `root_first` frames (ids
    /// from [`Stacks::frame`]). A count that overflows is [`Error::Convert`] (its `at` left
    /// for the caller to fill); too many stacks or frames is [`Error::TooLarge`].
    pub(crate) fn add(&mut self, root_first: &[u64], count: i64) -> Result<()> {
        self.pace.tick()?;
        let value = count
            .checked_mul(self.units.scale)
            .ok_or_else(|| Error::Convert {
                format: "stacks",
                at: String::new(),
                reason: format!("the count {count} overflows"),
            })?;
        // Every stack added costs its frames, a repeat too (it is copied and hashed): what
        // a body naming one deep stack many times makes of it is bounded.
        self.frames_left = self.frames_left.checked_sub(root_first.len()).ok_or(
            Error::TooLarge {
                what: "frames of all stacks (the body expands past the decompressed-size limit)",
                limit: self.max_frames,
            },
        )?;
        // pprof lists the leaf first.
        let ids: Vec<u64> = root_first.iter().rev().copied().collect();
        if let Some(total) = self.samples.get_mut(&ids) {
            *total = total.saturating_add(value);
            return Ok(());
        }
        if self.samples.len() >= self.max_samples {
            return Err(Error::TooLarge {
                what: "number of distinct stacks",
                limit: self.max_samples,
            });
        }
        crate::decode::charge::take(
            (ids.len() + SAMPLE_SLOTS) * std::mem::size_of::<u64>(),
            "converting stacks",
        )?;
        self.samples.insert(ids, value);
        Ok(())
    }

    /// The profile, its samples in stack order.
    pub(crate) fn finish(mut self) -> Result<Profile> {
        let sample_type = ValueType {
            r#type: self.strings.get(&self.units.sample.0)?,
            unit: self.strings.get(&self.units.sample.1)?,
        };
        let period_type = ValueType {
            r#type: self.strings.get(&self.units.period.0)?,
            unit: self.strings.get(&self.units.period.1)?,
        };
        let mut samples: Vec<(Vec<u64>, i64)> = self.samples.into_iter().collect();
        samples.sort();
        Ok(Profile {
            sample_type: vec![sample_type],
            sample: samples
                .into_iter()
                .map(|(location_id, v)| Sample {
                    location_id,
                    value: vec![v],
                    label: Vec::new(),
                })
                .collect(),
            location: self.locations,
            function: self.functions,
            string_table: self.strings.into_table(),
            period_type: Some(period_type),
            period: self.units.period_value,
            ..Profile::default()
        })
    }
}

/// A profile's stacks as sorted `root;…;leaf value` lines (its first value), each frame
/// named by its function: what the converters' tests compare.
#[cfg(test)]
pub(crate) fn stack_lines(p: &Profile) -> Vec<String> {
    let name = |id: &u64| {
        let f = &p.function[p.location[*id as usize - 1].line[0].function_id as usize - 1];
        p.string_table[f.name as usize].clone()
    };
    let mut out: Vec<String> = p
        .sample
        .iter()
        .map(|s| {
            let frames: Vec<String> = s.location_id.iter().rev().map(name).collect();
            format!("{} {}", frames.join(";"), s.value[0])
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu() -> Units {
        Units {
            sample: ("cpu".into(), "nanoseconds".into()),
            period: ("cpu".into(), "nanoseconds".into()),
            period_value: 10_000_000,
            scale: 10_000_000,
        }
    }

    fn limits(max_samples: usize) -> crate::Limits {
        crate::Limits {
            max_samples,
            ..crate::Limits::default()
        }
    }

    /// Millions of distinct one-byte frames (each a function and a location) are refused
    /// once past the location limit, as they are made, not after.
    #[test]
    fn distinct_frames_past_the_location_limit_are_refused() {
        let text: String = (0..2_000).map(|i| format!("f{i};")).collect::<String>() + " 1\n";
        let small = crate::Limits {
            max_locations: 1_000,
            ..crate::Limits::default()
        };
        let e = to_profile(&text, false, &cpu(), &small).unwrap_err();
        assert!(e.to_string().contains("distinct frames"), "{e}");
        assert!(to_profile(&text, false, &cpu(), &crate::Limits::default()).is_ok());
    }

    /// A line deeper than the stack depth limit is refused at the limit, as it is read,
    /// not split into all its frames first (a line of 64 M frames is 128 MiB of text
    /// and was 2 GiB split); one at the limit is taken.
    #[test]
    fn a_line_deeper_than_the_limit_is_refused_as_it_is_read() {
        let small = crate::Limits {
            max_stack_depth: 100,
            ..crate::Limits::default()
        };
        let e = to_profile(&("a;".repeat(101) + " 1\n"), false, &cpu(), &small).unwrap_err();
        assert!(
            e.to_string()
                .contains("stack depth exceeds the limit of 100"),
            "{e}"
        );
        let p = to_profile(&("a;".repeat(100) + " 1\n"), false, &cpu(), &small).unwrap();
        assert_eq!(p.sample[0].location_id.len(), 100);
    }

    #[test]
    fn folded_lines_become_leaf_first_samples() {
        let p = to_profile(
            "main;work;hash 3\nmain;work 2\nmain;work;hash 1\n",
            false,
            &cpu(),
            &limits(100),
        )
        .unwrap();
        crate::validate(p.clone(), &crate::Limits::default()).unwrap();
        assert_eq!(p.sample.len(), 2);
        let name = |id: u64| {
            let f = &p.function[p.location[id as usize - 1].line[0].function_id as usize - 1];
            p.string_table[f.name as usize].clone()
        };
        let hash = p.sample.iter().find(|s| s.location_id.len() == 3).unwrap();
        assert_eq!(name(hash.location_id[0]), "hash");
        assert_eq!(name(hash.location_id[2]), "main");
        assert_eq!(hash.value, vec![40_000_000]);
    }

    #[test]
    fn lines_count_one_each_and_bad_lines_are_named() {
        let p = to_profile("a;b\na;b\na\n", true, &cpu(), &limits(100)).unwrap();
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 30_000_000);
        let e = to_profile("a;b 1\na;b x\n", false, &cpu(), &limits(100)).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = to_profile("a 1\nb 1\nc 1\n", false, &cpu(), &limits(2)).unwrap_err();
        assert!(
            matches!(e, Error::TooLarge { limit: 2, .. }),
            "{e}: {:?}",
            e.kind()
        );
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded);
    }

    #[test]
    fn a_bad_line_is_a_convert_error_naming_the_line() {
        let e = to_profile("a;b 1\n\nmain;work\n", false, &cpu(), &limits(100)).unwrap_err();
        match &e {
            Error::Convert { format, at, reason } => {
                assert_eq!(*format, "folded");
                assert_eq!(at, "line 3");
                assert!(reason.contains("frame;frame"), "{reason}");
            }
            other => panic!("not Convert: {other:?}"),
        }
        assert_eq!(e.kind(), frostdb_core::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "invalid folded: line 3: expected `frame;frame;... <count>`"
        );
        let e = to_profile("a;b 1\nx -4\n", false, &cpu(), &limits(100)).unwrap_err();
        assert_eq!(e.to_string(), "invalid folded: line 2: negative count -4");
        let e = to_profile("a;b\n;;\n", true, &cpu(), &limits(100)).unwrap_err();
        assert_eq!(e.to_string(), "invalid lines: line 2: no frames");
    }

    #[test]
    fn conversions_stop_once_the_request_they_are_for_has_ended() {
        let ended = || Some("the request ended".to_owned());
        let stopped = |e: Error| {
            assert_eq!(e.kind(), frostdb_core::ErrorKind::Unavailable, "{e}");
            assert!(e.to_string().contains("the request ended"), "{e}");
        };
        // Folded stacks: 10,000 lines, more than a pace's worth of ticks.
        let text: String = (0..10_000)
            .map(|i| format!("main;work{};leaf{} 1\n", i % 50, i % 7))
            .collect();
        let limits = limits(100_000);
        let whole = to_profile(&text, false, &cpu(), &limits).unwrap();
        assert_eq!(whole.sample.len(), 350);
        stopped(
            frostdb_core::stop_scans_when(ended, || to_profile(&text, false, &cpu(), &limits))
                .unwrap_err(),
        );
        // A JFR recording of thousands of events (async-profiler's, from the testdata).
        let jfr = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/jfr/example.jfr.gz"
        ))
        .unwrap();
        let limits = crate::Limits::default();
        assert!(
            !crate::convert::jfr::convert(&jfr, None, 100, &limits)
                .unwrap()
                .profiles
                .is_empty()
        );
        match frostdb_core::stop_scans_when(ended, || {
            crate::convert::jfr::convert(&jfr, None, 100, &limits)
        }) {
            Ok(_) => panic!("the JFR recording was converted whole"),
            Err(e) => stopped(e),
        }
        // Not asked to stop: converted whole.
        let again =
            frostdb_core::stop_scans_when(|| None, || to_profile(&text, false, &cpu(), &limits));
        assert_eq!(again.unwrap().sample.len(), 350);
    }
}
