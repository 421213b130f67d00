//! Compaction: a pure decision ([`choose`]) over a [`Version`], carried out by [`execute`]
//! outside any lock, and [`apply`]d to whatever version is current by then.
//!
//! Levels: L0 holds parts as inserted; a *flush* sorts all of L0 into one run of granules in
//! L1; when a level holds `fanout` runs they are merged into one run of the next level (the
//! last level merges into itself). Runs hold the same rows as their inputs, so readers never
//! see a difference, and inputs stay valid for readers that still hold them.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::datatypes::{Schema as ArrowSchema, SchemaRef};
use arrow::record_batch::RecordBatch;

use super::chunk::Chunk;
use super::merge::{Input, Merge, SortKey};
use super::version::{Part, Run, Version};
use crate::error::Result;
use crate::events::{CompactionJob, CompactionOutcome};
use crate::options::TableOptions;

/// What compaction decided to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice {
    DoNothing,
    /// Sort-merge these L0 parts and these runs (`(level index, run id)`, `levels[0]` being
    /// L1) into one run appended to `levels[target]`.
    Merge {
        parts: Vec<u64>,
        runs: Vec<(usize, u64)>,
        target: usize,
    },
    /// Move a run to a deeper level without rewriting it.
    Move {
        level: usize,
        run: u64,
        target: usize,
    },
}

/// How eagerly to compact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Only what the thresholds of the options ask for.
    Policy,
    /// Everything into a single run of the last level, in one pass.
    Full,
}

/// Decides the next compaction step for `v`.
pub(crate) fn choose(v: &Version, options: &TableOptions, mode: Mode) -> Choice {
    let last = v.levels.len() - 1;
    let all_parts = || v.l0.iter().map(|p| p.id).collect::<Vec<_>>();
    let runs_of = |level: usize| v.levels[level].iter().map(move |r| (level, r.id));
    match mode {
        Mode::Policy => {
            if v.l0.len() >= options.l0_max_parts || v.l0_rows() >= options.l0_max_rows {
                return Choice::Merge {
                    parts: all_parts(),
                    runs: Vec::new(),
                    target: 0,
                };
            }
            for (level, runs) in v.levels.iter().enumerate().take(last) {
                if runs.len() >= options.level_fanout {
                    return Choice::Merge {
                        parts: Vec::new(),
                        runs: runs_of(level).collect(),
                        target: level + 1,
                    };
                }
            }
            // The last level merges into itself by size tiers: `level_fanout` runs of one
            // size class (rows within a factor of `level_fanout`) become one run of the next
            // class. Merging every run each time would rewrite the largest run again and
            // again as the block grows (a write amplification linear in the block's rows);
            // tiers rewrite a row once per class, log(rows) times in all.
            let class = |rows: usize| rows.max(1).ilog(options.level_fanout.max(2));
            let mut by_class: std::collections::BTreeMap<u32, Vec<(usize, u64)>> =
                std::collections::BTreeMap::new();
            for run in &v.levels[last] {
                by_class
                    .entry(class(run.rows()))
                    .or_default()
                    .push((last, run.id));
            }
            match by_class
                .into_values()
                .find(|runs| runs.len() >= options.level_fanout)
            {
                Some(runs) => Choice::Merge {
                    parts: Vec::new(),
                    runs,
                    target: last,
                },
                None => Choice::DoNothing,
            }
        }
        Mode::Full => {
            let runs: Vec<(usize, u64)> = (0..=last).flat_map(runs_of).collect();
            match (v.l0.is_empty(), runs.as_slice()) {
                (true, []) => Choice::DoNothing,
                (true, [(level, _)]) if *level == last => Choice::DoNothing,
                (true, [(level, run)]) => Choice::Move {
                    level: *level,
                    run: *run,
                    target: last,
                },
                _ => Choice::Merge {
                    parts: all_parts(),
                    runs,
                    target: last,
                },
            }
        }
    }
}

/// The result of executing a choice, ready to [`apply`].
#[derive(Debug)]
pub(crate) struct Output {
    remove_parts: HashSet<u64>,
    remove_runs: HashSet<(usize, u64)>,
    add: (usize, Arc<Run>),
    pub(crate) outcome: CompactionOutcome,
}

/// The inputs a choice names, looked up in `v`.
struct Inputs {
    parts: Vec<Arc<Part>>,
    runs: Vec<(usize, Arc<Run>)>,
}

impl Inputs {
    fn resolve(v: &Version, parts: &[u64], runs: &[(usize, u64)]) -> Self {
        let parts: HashSet<u64> = parts.iter().copied().collect();
        let runs: HashSet<(usize, u64)> = runs.iter().copied().collect();
        Self {
            parts: v
                .l0
                .iter()
                .filter(|p| parts.contains(&p.id))
                .cloned()
                .collect(),
            runs: v
                .levels
                .iter()
                .enumerate()
                .flat_map(|(level, rs)| rs.iter().map(move |r| (level, r)))
                .filter(|(level, r)| runs.contains(&(*level, r.id)))
                .map(|(level, r)| (level, r.clone()))
                .collect(),
        }
    }

    fn job(&self, target: usize, moved: bool) -> CompactionJob {
        let from_level = if self.parts.is_empty() {
            self.runs.iter().map(|(l, _)| l + 1).min().unwrap_or(0)
        } else {
            0
        };
        CompactionJob {
            from_level,
            to_level: target + 1,
            inputs: self.parts.len() + self.runs.len(),
            rows: self.parts.iter().map(|p| p.chunk.rows()).sum::<usize>()
                + self.runs.iter().map(|(_, r)| r.rows()).sum::<usize>(),
            moved,
        }
    }

    fn chunks(&self) -> impl Iterator<Item = &Arc<Chunk>> {
        let parts = self.parts.iter().map(|p| &p.chunk);
        parts.chain(self.runs.iter().flat_map(|(_, r)| &r.granules))
    }
}

impl Choice {
    pub(crate) fn job(&self, v: &Version) -> Option<CompactionJob> {
        match self {
            Choice::DoNothing => None,
            Choice::Merge {
                parts,
                runs,
                target,
            } => Some(Inputs::resolve(v, parts, runs).job(*target, false)),
            Choice::Move { level, run, target } => {
                Some(Inputs::resolve(v, &[], &[(*level, *run)]).job(*target, true))
            }
        }
    }
}

/// Carries out `choice` against `v`. Pure with respect to the table: nothing is published.
pub(crate) fn execute(
    v: &Version,
    choice: &Choice,
    options: &TableOptions,
    ids: &AtomicU64,
) -> Result<Option<Output>> {
    let (parts, runs, target) = match choice {
        Choice::DoNothing => return Ok(None),
        Choice::Move { level, run, target } => {
            let inputs = Inputs::resolve(v, &[], &[(*level, *run)]);
            let Some((_, run)) = inputs.runs.first().cloned() else {
                return Ok(None);
            };
            let bytes = run.memory_size();
            return Ok(Some(Output {
                remove_parts: HashSet::new(),
                remove_runs: HashSet::from([(*level, run.id)]),
                outcome: CompactionOutcome {
                    job: inputs.job(*target, true),
                    granules: run.granules.len(),
                    bytes_before: bytes,
                    bytes_after: bytes,
                },
                add: (*target, run),
            }));
        }
        Choice::Merge {
            parts,
            runs,
            target,
        } => (parts, runs, *target),
    };
    let inputs = Inputs::resolve(v, parts, runs);
    let names: HashSet<String> = inputs
        .chunks()
        .flat_map(|c| {
            c.batch()
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        })
        .collect();
    let bytes_before = inputs.chunks().map(|c| c.memory_size()).sum();
    let max_tx = inputs
        .parts
        .iter()
        .map(|p| p.tx)
        .chain(inputs.runs.iter().map(|(_, r)| r.max_tx))
        .max()
        .unwrap_or(0);
    let mut merge_inputs: Vec<Input> = inputs
        .parts
        .iter()
        .map(|p| Input::unsorted_batch(Ok(Some(p.chunk.batch().clone()))))
        .collect();
    merge_inputs.extend(inputs.runs.iter().map(|(_, run)| {
        let granules = run.granules.clone();
        Input::sorted(Box::new(
            granules.into_iter().map(|g| Ok(g.batch().clone())),
        ))
    }));
    let output = union_schema(v.schema.arrow_schema(), &names);
    let key = SortKey::new(&v.schema).with_ranks(inputs.chunks().map(|c| c.batch()));
    let merge = Merge::new(key, merge_inputs, output, options.granule_rows, None)?;
    let granules = merge
        .map(|batch| batch.and_then(|b| Chunk::new(drop_null_columns(b)?).map(Arc::new)))
        .collect::<Result<Vec<_>>>()?;
    let run = Run {
        id: ids.fetch_add(1, Ordering::Relaxed),
        max_tx,
        granules,
    };
    let outcome = CompactionOutcome {
        job: inputs.job(target, false),
        granules: run.granules.len(),
        bytes_before,
        bytes_after: run.memory_size(),
    };
    Ok(Some(Output {
        remove_parts: inputs.parts.iter().map(|p| p.id).collect(),
        remove_runs: inputs.runs.iter().map(|(l, r)| (*l, r.id)).collect(),
        add: (target, Arc::new(run)),
        outcome,
    }))
}

/// The fields of `schema` that some input has, in schema order.
fn union_schema(schema: &SchemaRef, names: &HashSet<String>) -> SchemaRef {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| names.contains(f.name()))
        .cloned()
        .collect();
    Arc::new(ArrowSchema::new(fields))
}

/// Drops nullable columns that are null in every row: absent columns read as null anyway,
/// and a granule should not pay for a label only other granules have.
fn drop_null_columns(batch: RecordBatch) -> Result<RecordBatch> {
    let keep: Vec<usize> = (0..batch.num_columns())
        .filter(|&i| {
            let c = batch.column(i);
            !(batch.schema().field(i).is_nullable() && c.logical_null_count() == c.len())
        })
        .collect();
    if keep.len() == batch.num_columns() {
        return Ok(batch);
    }
    Ok(batch.project(&keep)?)
}

/// `current` with `output`'s inputs replaced by its run. Inputs are matched by id, so parts
/// committed and runs added since the choice are kept.
pub(crate) fn apply(current: &Version, output: &Output) -> Version {
    let l0 = if output.remove_parts.is_empty() {
        current.l0.clone()
    } else {
        Arc::new(
            current
                .l0
                .iter()
                .filter(|p| !output.remove_parts.contains(&p.id))
                .cloned()
                .collect(),
        )
    };
    let mut levels = (*current.levels).clone();
    if !output.remove_runs.is_empty() {
        for (level, runs) in levels.iter_mut().enumerate() {
            runs.retain(|r| !output.remove_runs.contains(&(level, r.id)));
        }
    }
    let (target, run) = &output.add;
    levels[*target].push(run.clone());
    let mut next = Version {
        l0,
        levels: Arc::new(levels),
        ..current.clone()
    };
    next.active_bytes = next.count_active_bytes();
    next
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field};

    use super::*;
    use crate::schema::{ColumnDef, Schema, SortingColumn, TableSchema};

    fn chunk(values: &[i64]) -> Arc<Chunk> {
        let schema = Arc::new(ArrowSchema::new(vec![Field::new(
            "k",
            DataType::Int64,
            false,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))])
            .unwrap();
        Arc::new(Chunk::new(batch).unwrap())
    }

    fn version(parts: usize, runs_per_level: &[usize]) -> Version {
        let def = Schema::builder("t")
            .column(ColumnDef::new("k", DataType::Int64))
            .sort_by(SortingColumn::asc("k"))
            .build()
            .unwrap();
        let mut v = Version::empty(
            Arc::new(TableSchema::new(Arc::new(def))),
            runs_per_level.len(),
        );
        let mut id = 0;
        v.l0 = Arc::new(
            (0..parts)
                .map(|i| {
                    id += 1;
                    Arc::new(Part {
                        id,
                        tx: i as u64 + 1,
                        chunk: chunk(&[3, 1, 2]),
                    })
                })
                .collect(),
        );
        v.levels = Arc::new(
            runs_per_level
                .iter()
                .map(|&n| {
                    (0..n)
                        .map(|_| {
                            id += 1;
                            Arc::new(Run {
                                id,
                                granules: vec![chunk(&[1, 2]), chunk(&[5])],
                                max_tx: 0,
                            })
                        })
                        .collect()
                })
                .collect(),
        );
        v
    }

    fn options() -> TableOptions {
        TableOptions::default().l0_max_parts(3).level_fanout(2)
    }

    #[test]
    fn policy_flushes_then_merges_level_by_level() {
        let flush = choose(&version(3, &[0, 0]), &options(), Mode::Policy);
        assert!(matches!(flush, Choice::Merge { ref parts, target: 0, .. } if parts.len() == 3));
        assert_eq!(
            choose(&version(2, &[1, 5]), &options(), Mode::Policy),
            Choice::Merge {
                parts: vec![],
                runs: vec![(1, 4), (1, 5), (1, 6), (1, 7), (1, 8)],
                target: 1,
            }
        );
        let l1 = choose(&version(0, &[2, 0]), &options(), Mode::Policy);
        assert!(matches!(l1, Choice::Merge { target: 1, ref runs, .. } if runs.len() == 2));
        assert_eq!(
            choose(&version(2, &[1, 1]), &options(), Mode::Policy),
            Choice::DoNothing
        );
    }

    #[test]
    fn the_last_level_merges_by_size_tiers_so_rows_are_rewritten_log_times() {
        let options = options();
        let mut v = version(0, &[0, 0]);
        let ids = AtomicU64::new(1000);
        let (mut inserted, mut rewritten) = (0usize, 0usize);
        for _ in 0..512 {
            // One L1 run arrives (an L0 flush), then the policy runs to a fixed point.
            let mut levels = (*v.levels).clone();
            levels[0].push(Arc::new(Run {
                id: ids.fetch_add(1, Ordering::Relaxed),
                granules: vec![chunk(&[1, 2, 3])],
                max_tx: 0,
            }));
            v.levels = Arc::new(levels);
            inserted += 3;
            loop {
                let choice = choose(&v, &options, Mode::Policy);
                let Some(output) = execute(&v, &choice, &options, &ids).unwrap() else {
                    break;
                };
                rewritten += output.outcome.job.rows;
                v = apply(&v, &output);
            }
        }
        assert_eq!(v.rows(), inserted);
        // Fanout 2: each row is rewritten once into L2 and then once per doubling
        // (log2(512) = 9); merging the whole last level each time would rewrite ~N/2 times.
        let amplification = rewritten as f64 / inserted as f64;
        assert!(amplification <= 11.0, "write amplification {amplification}");
        assert!(
            v.levels[1].len() <= 10,
            "runs stay few: {}",
            v.levels[1].len()
        );
    }

    #[test]
    fn full_mode_merges_everything_once_or_moves_a_lone_run() {
        let v = version(2, &[1, 1]);
        let choice = choose(&v, &options(), Mode::Full);
        assert!(
            matches!(choice, Choice::Merge { ref parts, ref runs, target: 1 }
            if parts.len() == 2 && runs.len() == 2)
        );
        let output = execute(&v, &choice, &options(), &AtomicU64::new(100))
            .unwrap()
            .unwrap();
        let next = apply(&v, &output);
        assert!(next.l0.is_empty() && next.levels[0].is_empty());
        assert_eq!(next.levels[1].len(), 1);
        assert_eq!(next.rows(), v.rows());
        assert_eq!(choose(&next, &options(), Mode::Full), Choice::DoNothing);

        let lone = version(0, &[1, 0]);
        let moved = choose(&lone, &options(), Mode::Full);
        assert_eq!(
            moved,
            Choice::Move {
                level: 0,
                run: 1,
                target: 1
            }
        );
        let output = execute(&lone, &moved, &options(), &AtomicU64::new(100))
            .unwrap()
            .unwrap();
        assert!(output.outcome.job.moved);
        let next = apply(&lone, &output);
        assert!(
            Arc::ptr_eq(&next.levels[1][0], &lone.levels[0][0]),
            "moved, not rewritten"
        );
    }
}
