//! A merged profile written back as pprof, for `go tool pprof` and every tool that reads it.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use crate::error::{Error, Result};
use crate::proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};
use crate::store::Merged;
use crate::symbols::{Id, Symbols};

struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Self {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// The pprof profile of `merged`: one sample type, one sample per stack, the locations,
/// functions and mappings those stacks use.
pub fn to_profile(merged: &Merged, symbols: &Symbols) -> Result<Profile> {
    let mut strings = Strings::new();
    let t = &merged.profile_type;
    let mut p = Profile {
        sample_type: vec![ValueType {
            r#type: strings.get(&t.sample_type),
            unit: strings.get(&t.sample_unit),
        }],
        period_type: Some(ValueType {
            r#type: strings.get(&t.period_type),
            unit: strings.get(&t.period_unit),
        }),
        period: merged.period,
        ..Default::default()
    };
    let mut mapping_ids: HashMap<Id, u64> = HashMap::new();
    let mut function_ids: HashMap<Id, u64> = HashMap::new();
    let mut location_ids: HashMap<Id, u64> = HashMap::new();
    for (stack, value) in &merged.samples {
        let locations = symbols
            .stacks
            .get(stack)
            .ok_or_else(|| Error::Corrupt(format!("stack {} has no symbols", hex(stack))))?;
        let mut sample = Sample {
            value: vec![*value],
            ..Default::default()
        };
        for lid in locations.iter() {
            if let Some(id) = location_ids.get(lid) {
                sample.location_id.push(*id);
                continue;
            }
            let loc = symbols
                .locations
                .get(lid)
                .ok_or_else(|| Error::Corrupt(format!("location {} is unknown", hex(lid))))?;
            let mapping_id = match &loc.mapping {
                None => 0,
                Some(m) => match mapping_ids.get(m) {
                    Some(id) => *id,
                    None => {
                        let mapping = symbols.mappings.get(m).ok_or_else(|| {
                            Error::Corrupt(format!("mapping {} is unknown", hex(m)))
                        })?;
                        let id = p.mapping.len() as u64 + 1;
                        p.mapping.push(Mapping {
                            id,
                            memory_start: mapping.memory_start,
                            memory_limit: mapping.memory_limit,
                            file_offset: mapping.file_offset,
                            filename: strings.get(&mapping.filename),
                            build_id: strings.get(&mapping.build_id),
                            has_functions: mapping.flags & 1 != 0,
                            has_filenames: mapping.flags & 2 != 0,
                            has_line_numbers: mapping.flags & 4 != 0,
                            has_inline_frames: mapping.flags & 8 != 0,
                        });
                        mapping_ids.insert(*m, id);
                        id
                    }
                },
            };
            let mut lines = Vec::with_capacity(loc.lines.len());
            for (fid, line) in &loc.lines {
                let function_id = match function_ids.get(fid) {
                    Some(id) => *id,
                    None => {
                        let f = symbols.functions.get(fid).ok_or_else(|| {
                            Error::Corrupt(format!("function {} is unknown", hex(fid)))
                        })?;
                        let id = p.function.len() as u64 + 1;
                        p.function.push(Function {
                            id,
                            name: strings.get(&f.name),
                            system_name: strings.get(&f.system_name),
                            filename: strings.get(&f.filename),
                            start_line: f.start_line,
                        });
                        function_ids.insert(*fid, id);
                        id
                    }
                };
                lines.push(Line {
                    function_id,
                    line: *line,
                    column: 0,
                });
            }
            let id = p.location.len() as u64 + 1;
            p.location.push(Location {
                id,
                mapping_id,
                address: loc.address,
                line: lines,
                is_folded: loc.is_folded,
            });
            location_ids.insert(*lid, id);
            sample.location_id.push(id);
        }
        p.sample.push(sample);
    }
    p.string_table = strings.table;
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

fn hex(id: &Id) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
