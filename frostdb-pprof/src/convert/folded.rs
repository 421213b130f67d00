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
/// `max_samples` bounds the distinct stacks.
///
/// A bad line is [`Error::Convert`] naming it (`line 3`); more than `max_samples` distinct
/// stacks is [`Error::TooLarge`].
pub fn to_profile(text: &str, lines: bool, units: &Units, max_samples: usize) -> Result<Profile> {
    let format = if lines { "lines" } else { "folded" };
    let bad = |n: usize, reason: String| Error::Convert {
        format,
        at: format!("line {}", n + 1),
        reason,
    };
    let mut b = Builder {
        strings: StringTable::new(),
        functions: Vec::new(),
        locations: Vec::new(),
        location_ids: HashMap::new(),
    };
    let sample_type = ValueType {
        r#type: b.strings.get(&units.sample.0),
        unit: b.strings.get(&units.sample.1),
    };
    let period_type = ValueType {
        r#type: b.strings.get(&units.period.0),
        unit: b.strings.get(&units.period.1),
    };
    let mut stacks: HashMap<Vec<u64>, i64> = HashMap::new();
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
        let frames: Vec<&str> = stack.split(';').filter(|f| !f.is_empty()).collect();
        if frames.is_empty() {
            return Err(bad(n, "no frames".into()));
        }
        // pprof lists the leaf first.
        let ids: Vec<u64> = frames.iter().rev().map(|f| b.location(f)).collect();
        let value = count
            .checked_mul(units.scale)
            .ok_or_else(|| bad(n, format!("the count {count} overflows")))?;
        if !stacks.contains_key(&ids) && stacks.len() >= max_samples {
            return Err(Error::TooLarge {
                what: "number of distinct stacks",
                limit: max_samples,
            });
        }
        let total = stacks.entry(ids).or_default();
        *total = total.saturating_add(value);
    }
    let mut samples: Vec<(Vec<u64>, i64)> = stacks.into_iter().collect();
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
        location: b.locations,
        function: b.functions,
        string_table: b.strings.into_table(),
        period_type: Some(period_type),
        period: units.period_value,
        ..Profile::default()
    })
}

struct Builder {
    strings: StringTable,
    functions: Vec<Function>,
    locations: Vec<Location>,
    location_ids: HashMap<String, u64>,
}

impl Builder {
    /// A location with one line in a function named `frame`.
    fn location(&mut self, frame: &str) -> u64 {
        if let Some(&id) = self.location_ids.get(frame) {
            return id;
        }
        let name = self.strings.get(frame);
        let id = self.locations.len() as u64 + 1;
        self.functions.push(Function {
            id,
            name,
            system_name: name,
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
        self.location_ids.insert(frame.to_owned(), id);
        id
    }
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

    #[test]
    fn folded_lines_become_leaf_first_samples() {
        let p = to_profile(
            "main;work;hash 3\nmain;work 2\nmain;work;hash 1\n",
            false,
            &cpu(),
            100,
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
        let p = to_profile("a;b\na;b\na\n", true, &cpu(), 100).unwrap();
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total, 30_000_000);
        let e = to_profile("a;b 1\na;b x\n", false, &cpu(), 100).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = to_profile("a 1\nb 1\nc 1\n", false, &cpu(), 2).unwrap_err();
        assert!(
            matches!(e, Error::TooLarge { limit: 2, .. }),
            "{e}: {:?}",
            e.kind()
        );
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded);
    }

    #[test]
    fn a_bad_line_is_a_convert_error_naming_the_line() {
        let e = to_profile("a;b 1\n\nmain;work\n", false, &cpu(), 100).unwrap_err();
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
        let e = to_profile("a;b 1\nx -4\n", false, &cpu(), 100).unwrap_err();
        assert_eq!(e.to_string(), "invalid folded: line 2: negative count -4");
        let e = to_profile("a;b\n;;\n", true, &cpu(), 100).unwrap_err();
        assert_eq!(e.to_string(), "invalid lines: line 2: no frames");
    }
}
