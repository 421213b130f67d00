//! Step 3: a prepared profile's symbols interned into the current symbol partition.

use super::*;

/// What [`Prepared::intern`] has found so far in one partition: the partition's index of
/// each of the profile's strings, mappings, functions and locations, and of each group's
/// stack (`u32::MAX` where not yet known).
#[derive(Debug, Default)]
pub(crate) struct InternState {
    partition: Option<u32>,
    strings: Vec<u32>,
    mappings: Vec<u32>,
    functions: Vec<u32>,
    locations: Vec<u32>,
    stacks: Vec<u32>,
}

impl Prepared<'_> {
    /// The stack of every group that has a row, interned into the writer's
    /// partition (`u32::MAX` for groups without rows); `None` when the profile has symbols
    /// the partition lacks and the writer only looks up. What was found is kept in `state`:
    /// called again with an exclusive writer of the same partition, only the symbols still
    /// missing are looked up and added, so the exclusive hold is short.
    pub(crate) fn intern(
        &self,
        writer: &mut Writer<'_>,
        state: &mut InternState,
    ) -> Result<Option<Vec<u32>>> {
        let p = self.profile.flat();
        let ids = &self.profile.ids;
        const NONE: u32 = u32::MAX;
        let partition = writer.partition_id();
        // A state whose stacks were handed over (the profile was whole) is made again: its
        // symbols are then found, not added.
        if state.partition != Some(partition) || state.stacks.len() != self.groups.len() {
            *state = InternState {
                partition: Some(partition),
                strings: vec![NONE; p.strings_len()],
                mappings: vec![NONE; p.mapping.len()],
                functions: vec![NONE; p.function.len()],
                locations: vec![NONE; p.locations().len()],
                stacks: vec![NONE; self.groups.len()],
            };
        }
        let InternState {
            strings,
            mappings: mapping_ix,
            functions: function_ix,
            locations: location_ix,
            stacks: out,
            ..
        } = state;
        let mut string = |writer: &mut Writer<'_>, i: i64| -> Result<Option<u32>> {
            let slot = strings
                .get_mut(i as usize)
                .ok_or_else(|| Error::Corrupt("a string index out of range".into()))?;
            if *slot == NONE {
                match writer.string(text(p, i))? {
                    Some(id) => *slot = id,
                    None => return Ok(None),
                }
            }
            Ok(Some(*slot))
        };
        // A symbol the writer lacks and may not add: the group's stack waits for an
        // exclusive writer, and the other groups are still looked up.
        let mut missing = false;
        macro_rules! known {
            ($next:lifetime, $lookup:expr) => {
                match $lookup? {
                    Some(id) => id,
                    None => {
                        missing = true;
                        continue $next;
                    }
                }
            };
        }
        let mut lines: Vec<LineRow> = Vec::new();
        let mut stack: Vec<u32> = Vec::new();
        'groups: for &(_, g, _) in &self.rows {
            if out[g as usize] != NONE {
                continue;
            }
            // A stack the partition has is found by its key: its frames are not looked up.
            if let Some(i) = writer.find_stack(self.keys[g as usize]) {
                out[g as usize] = i;
                continue;
            }
            stack.clear();
            for &id in p.sample(self.groups[g as usize].sample).location_id {
                let li = ids.location(id)?;
                if location_ix[li] == NONE
                    && let Some(i) = writer.find_location(self.location_keys[li].get())
                {
                    location_ix[li] = i;
                }
                if location_ix[li] == NONE {
                    let l = p.location(li);
                    let mapping = if l.mapping_id == 0 {
                        0
                    } else {
                        let mi = ids.mapping(l.mapping_id)?;
                        if mapping_ix[mi] == NONE {
                            let m = &p.mapping[mi];
                            let row = MappingRow {
                                memory_start: m.memory_start,
                                memory_limit: m.memory_limit,
                                file_offset: m.file_offset,
                                filename: known!('groups, string(writer, m.filename)),
                                build_id: known!('groups, string(writer, m.build_id)),
                                flags: mapping_flags(m),
                            };
                            mapping_ix[mi] = known!('groups, writer.mapping(row));
                        }
                        mapping_ix[mi] + 1
                    };
                    lines.clear();
                    for line in l.line {
                        let fi = ids.function(line.function_id)?;
                        if function_ix[fi] == NONE {
                            let f = &p.function[fi];
                            let row = FunctionRow {
                                name: known!('groups, string(writer, f.name)),
                                system_name: known!('groups, string(writer, f.system_name)),
                                filename: known!('groups, string(writer, f.filename)),
                                start_line: f.start_line,
                            };
                            function_ix[fi] = known!('groups, writer.function(row));
                        }
                        lines.push((function_ix[fi], line.line));
                    }
                    location_ix[li] = known!(
                        'groups,
                        writer.location(
                            self.location_keys[li].get(),
                            mapping,
                            l.address,
                            l.is_folded,
                            &lines
                        )
                    );
                }
                stack.push(location_ix[li]);
            }
            out[g as usize] = known!('groups, writer.stack(self.keys[g as usize], &stack));
        }
        // Once whole, the stacks are the caller's; the state is not read again.
        Ok((!missing).then(|| std::mem::take(out)))
    }
}
