//! One process's samples of one interval as a pprof profile.

use std::collections::HashMap;
use std::sync::Arc;

use frostdb_pprof::proto;

use crate::symbolize::{Module, Resolved};

/// A location's identity: module and address, and the name of a placeholder (address 0 in
/// no module), so placeholders with different names stay apart.
type LocationKey = (Arc<Module>, u64, Option<Arc<str>>);

/// Builds a pprof profile with two sample types, `samples/count` and `cpu/nanoseconds`.
#[derive(Debug)]
pub(crate) struct ProfileBuilder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<Arc<Module>, u64>,
    functions: HashMap<(Arc<str>, Arc<str>), u64>,
    locations: HashMap<LocationKey, u64>,
    period_ns: i64,
}

impl ProfileBuilder {
    pub(crate) fn new(time_ns: i64, duration_ns: i64, period_ns: i64) -> Self {
        let mut b = Self {
            profile: proto::Profile {
                time_nanos: time_ns,
                duration_nanos: duration_ns,
                period: period_ns,
                ..Default::default()
            },
            strings: HashMap::new(),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            period_ns,
        };
        b.string(""); // index 0 is the empty string
        let samples = b.value_type("samples", "count");
        let cpu = b.value_type("cpu", "nanoseconds");
        b.profile.sample_type = vec![samples, cpu];
        b.profile.period_type = Some(cpu);
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn mapping(&mut self, module: &Arc<Module>) -> u64 {
        if let Some(&id) = self.mappings.get(module) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(&module.path);
        let build_id = self.string(&module.build_id);
        // User locations carry file offsets as their addresses: a mapping from 0 with no
        // offset makes `address - memory_start + file_offset` the file offset, which is
        // what a later symbolization by build id needs.
        self.profile.mapping.push(proto::Mapping {
            id,
            memory_start: 0,
            memory_limit: u64::MAX,
            file_offset: 0,
            filename,
            build_id,
            ..Default::default()
        });
        self.mappings.insert(module.clone(), id);
        id
    }

    fn function(&mut self, name: &Arc<str>, file: &Arc<str>) -> u64 {
        let key = (name.clone(), file.clone());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name_index = self.string(name);
        let file_index = self.string(file);
        self.profile.function.push(proto::Function {
            id,
            name: name_index,
            system_name: name_index,
            filename: file_index,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    /// The location id of a resolved address, added on first use.
    pub(crate) fn location(&mut self, r: &Resolved) -> u64 {
        let placeholder = (r.address == 0)
            .then(|| r.lines.first().map(|l| l.function.clone()))
            .flatten();
        let key = (r.module.clone(), r.address, placeholder);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let mapping_id = self.mapping(&r.module);
        let line = r
            .lines
            .iter()
            .map(|l| proto::Line {
                function_id: self.function(&l.function, &l.file),
                line: i64::from(l.line),
                column: 0,
            })
            .collect();
        if !r.lines.is_empty() {
            let m = &mut self.profile.mapping[mapping_id as usize - 1];
            m.has_functions = true;
            m.has_inline_frames |= r.lines.len() > 1;
            m.has_line_numbers |= r.lines.iter().any(|l| l.line > 0);
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(proto::Location {
            id,
            mapping_id,
            address: r.address,
            line,
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// Adds `count` samples of a stack (location ids, leaf first).
    pub(crate) fn sample(&mut self, location_id: Vec<u64>, count: u64) {
        let count = count as i64;
        self.profile.sample.push(proto::Sample {
            location_id,
            value: vec![count, count.saturating_mul(self.period_ns)],
            label: Vec::new(),
        });
    }

    pub(crate) fn finish(self) -> proto::Profile {
        self.profile
    }
}
