//! A merged profile written back as pprof, for `go tool pprof` and every tool that reads it.

use super::HashMap;
use std::io::Write;

use prost::Message;

use crate::error::{Error, Result};
use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use crate::store::Merged;
use crate::string_table::StringTable;
use crate::symbols::{location_frames, symbol_id};

/// A location by content: mapping, address, folded, and (function, line) per line.
type LocationContent = (u64, u64, bool, Vec<(u64, i64)>);

/// The pprof profile of `merged`: one sample type, one sample per stack (per series and
/// stack, labelled with the series' labels, when `merged` kept its series apart), the
/// locations, functions and mappings those stacks use (each once, whatever partitions they
/// came from). A stack deeper than [`super::MAX_STACK_DEPTH`] frames keeps its root-most
/// locations and ends in a location of one line in a function named by
/// [`super::truncation_marker`].
pub fn to_profile(merged: &Merged) -> Result<Profile> {
    let mut strings = StringTable::new();
    let t = &merged.profile_type;
    let mut p = Profile {
        sample_type: vec![ValueType {
            r#type: strings.uncharged(&t.sample_type),
            unit: strings.uncharged(&t.sample_unit),
        }],
        period_type: Some(ValueType {
            r#type: strings.uncharged(&t.period_type),
            unit: strings.uncharged(&t.period_unit),
        }),
        period: merged.period,
        ..Default::default()
    };
    let mut mapping_ids: HashMap<crate::symbols::Mapping<'_>, u64> = HashMap::default();
    let mut function_ids: HashMap<crate::symbols::Function<'_>, u64> = HashMap::default();
    let mut location_ids: HashMap<u64, u64> = HashMap::default();
    let mut location_content: HashMap<LocationContent, u64> = HashMap::default();
    // Each stack's pprof locations, built once when a stack may be in many series (kept
    // apart); without series each stack is one sample, and a copy of its ids would be
    // another id per frame of every stack for nothing.
    let keep = !merged.series.is_empty();
    let mut stacks: HashMap<crate::symbols::StackId, Vec<u64>> = HashMap::default();
    // The marker locations ending stacks cut by `MAX_STACK_DEPTH`, by frames left out.
    let mut markers: HashMap<usize, u64> = HashMap::default();
    let mut frames = Vec::new();
    let mut locations_of = |stack: crate::symbols::StackId,
                            p: &mut Profile,
                            strings: &mut StringTable|
     -> Result<Vec<u64>> {
        if let Some(ids) = stacks.get(&stack) {
            return Ok(ids.clone());
        }
        let Some((partition, locations)) = merged.symbols.locations(stack) else {
            return Err(Error::Corrupt(format!(
                "stack {}:{} has no symbols",
                stack.partition(),
                stack.index()
            )));
        };
        // Leaf first: the marker of a cut stack, then the root-most locations shown.
        let (shown, left_out) = super::shown_locations(partition, locations);
        let mut ids = Vec::with_capacity(shown + 1);
        if left_out > 0 {
            ids.push(*markers.entry(left_out).or_insert_with(|| {
                let name = strings.uncharged(&super::truncation_marker(left_out));
                let function_id = p.function.len() as u64 + 1;
                p.function.push(Function {
                    id: function_id,
                    name,
                    system_name: name,
                    ..Default::default()
                });
                let id = p.location.len() as u64 + 1;
                p.location.push(Location {
                    id,
                    line: vec![Line {
                        function_id,
                        ..Default::default()
                    }],
                    ..Default::default()
                });
                id
            }));
        }
        for &l in &locations[locations.len() - shown..] {
            let location = symbol_id(partition.id(), l);
            if let Some(id) = location_ids.get(&location) {
                ids.push(*id);
                continue;
            }
            // Innermost first.
            frames.clear();
            location_frames(partition, l, &mut |f| frames.push(f));
            let Some(&first) = frames.first() else {
                continue; // not stored: no frames, as reports show it
            };
            let mapping_id = match first.mapping() {
                None => 0,
                Some((_, m)) => *mapping_ids.entry(m).or_insert_with(|| {
                    let id = p.mapping.len() as u64 + 1;
                    p.mapping.push(Mapping {
                        id,
                        memory_start: m.memory_start,
                        memory_limit: m.memory_limit,
                        file_offset: m.file_offset,
                        filename: strings.uncharged(m.filename),
                        build_id: strings.uncharged(m.build_id),
                        has_functions: m.flags & 1 != 0,
                        has_filenames: m.flags & 2 != 0,
                        has_line_numbers: m.flags & 4 != 0,
                        has_inline_frames: m.flags & 8 != 0,
                    });
                    id
                }),
            };
            let mut lines = Vec::with_capacity(frames.len());
            for frame in &frames {
                let Some(f) = frame.function() else {
                    continue;
                };
                let function_id = *function_ids.entry(f).or_insert_with(|| {
                    let id = p.function.len() as u64 + 1;
                    p.function.push(Function {
                        id,
                        name: strings.uncharged(f.name),
                        system_name: strings.uncharged(f.system_name),
                        filename: strings.uncharged(f.filename),
                        start_line: f.start_line,
                    });
                    id
                });
                lines.push((function_id, frame.line()));
            }
            let key = (mapping_id, first.address(), first.is_folded(), lines);
            let id = match location_content.get(&key) {
                Some(id) => *id,
                None => {
                    let id = p.location.len() as u64 + 1;
                    p.location.push(Location {
                        id,
                        mapping_id,
                        address: first.address(),
                        line: key
                            .3
                            .iter()
                            .map(|(function_id, line)| Line {
                                function_id: *function_id,
                                line: *line,
                                column: 0,
                            })
                            .collect(),
                        is_folded: first.is_folded(),
                    });
                    location_content.insert(key, id);
                    id
                }
            };
            location_ids.insert(location, id);
            ids.push(id);
        }
        if keep {
            stacks.insert(stack, ids.clone());
        }
        Ok(ids)
    };
    // A request that ended stops the export within a thousand stacks.
    let mut pace = crate::decode::charge::Pace::new();
    if merged.series.is_empty() {
        for (stack, value) in &merged.samples {
            pace.tick()?;
            let location_id = locations_of(*stack, &mut p, &mut strings)?;
            p.sample.push(Sample {
                location_id,
                value: vec![*value],
                ..Default::default()
            });
        }
    } else {
        for (labels, samples) in &merged.series {
            let label: Vec<Label> = labels
                .iter()
                .map(|(k, v)| Label {
                    key: strings.uncharged(k),
                    str: strings.uncharged(v),
                    ..Default::default()
                })
                .collect();
            for (stack, value) in samples {
                pace.tick()?;
                let location_id = locations_of(*stack, &mut p, &mut strings)?;
                p.sample.push(Sample {
                    location_id,
                    value: vec![*value],
                    label: label.clone(),
                });
            }
        }
    }
    p.string_table = strings.into_table();
    Ok(p)
}

/// `profile` as gzipped protobuf, as pprof files are.
pub fn encode_gzip(profile: &Profile) -> Result<Vec<u8>> {
    let raw = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw)
        .and_then(|_| gz.finish())
        .map_err(|e| Error::Gzip(e.to_string()))
}
