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
use super::merge::{BatchStream, Merge, SortKey, sort_batch};
use super::version::{Run, Version};
use crate::error::Result;
use crate::options::TableOptions;

/// What compaction decided to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice {
    DoNothing,
    /// Sort these L0 parts into one new L1 run.
    Flush {
        parts: Vec<u64>,
    },
    /// Merge these runs of `levels[level]` into one run appended to `levels[target]`.
    Merge {
        level: usize,
        runs: Vec<u64>,
        target: usize,
    },
}

/// How eagerly to compact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Only what the thresholds of the options ask for.
    Policy,
    /// Everything into a single run of the last level.
    Full,
}

/// Decides the next compaction step for `v`.
pub(crate) fn choose(v: &Version, options: &TableOptions, mode: Mode) -> Choice {
    let flush = match mode {
        Mode::Policy => v.l0.len() >= options.l0_max_parts || v.l0_rows() >= options.l0_max_rows,
        Mode::Full => !v.l0.is_empty(),
    };
    if flush {
        return Choice::Flush {
            parts: v.l0.iter().map(|p| p.id).collect(),
        };
    }
    let last = v.levels.len() - 1;
    for (level, runs) in v.levels.iter().enumerate() {
        let due = match mode {
            Mode::Policy => runs.len() >= options.level_fanout,
            Mode::Full if level < last => !runs.is_empty(),
            Mode::Full => runs.len() > 1,
        };
        if due {
            return Choice::Merge {
                level,
                runs: runs.iter().map(|r| r.id).collect(),
                target: (level + 1).min(last),
            };
        }
    }
    Choice::DoNothing
}

/// A public description of a compaction step, for listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionJob {
    /// Level the inputs come from (0 = L0).
    pub from_level: usize,
    /// Level the output run goes to.
    pub to_level: usize,
    /// Number of parts or runs merged.
    pub inputs: usize,
    /// Rows in the inputs.
    pub rows: usize,
}

/// What a finished compaction step produced.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionOutcome {
    /// The step.
    pub job: CompactionJob,
    /// Granules in the output run.
    pub granules: usize,
    /// Arrow memory of the inputs.
    pub bytes_before: usize,
    /// Arrow memory of the output.
    pub bytes_after: usize,
}

/// The result of executing a choice, ready to [`apply`].
#[derive(Debug)]
pub(crate) struct Output {
    remove_parts: HashSet<u64>,
    remove_runs: (usize, HashSet<u64>),
    add: (usize, Arc<Run>),
    pub(crate) outcome: CompactionOutcome,
}

impl Choice {
    pub(crate) fn job(&self, v: &Version) -> Option<CompactionJob> {
        match self {
            Choice::DoNothing => None,
            Choice::Flush { parts } => {
                let ids: HashSet<_> = parts.iter().collect();
                Some(CompactionJob {
                    from_level: 0,
                    to_level: 1,
                    inputs: parts.len(),
                    rows: v
                        .l0
                        .iter()
                        .filter(|p| ids.contains(&p.id))
                        .map(|p| p.chunk.rows())
                        .sum(),
                })
            }
            Choice::Merge {
                level,
                runs,
                target,
            } => {
                let ids: HashSet<_> = runs.iter().collect();
                Some(CompactionJob {
                    from_level: level + 1,
                    to_level: target + 1,
                    inputs: runs.len(),
                    rows: v.levels[*level]
                        .iter()
                        .filter(|r| ids.contains(&r.id))
                        .map(|r| r.rows())
                        .sum(),
                })
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
    let Some(job) = choice.job(v) else {
        return Ok(None);
    };
    let key = SortKey::new(&v.schema);
    let (inputs, names, bytes_before, max_tx, remove_parts, remove_runs, target) = match choice {
        Choice::DoNothing => return Ok(None),
        Choice::Flush { parts } => {
            let wanted: HashSet<u64> = parts.iter().copied().collect();
            let parts: Vec<_> = v.l0.iter().filter(|p| wanted.contains(&p.id)).collect();
            let mut inputs: Vec<BatchStream> = Vec::with_capacity(parts.len());
            let mut names = HashSet::new();
            for p in &parts {
                names.extend(
                    p.chunk
                        .batch()
                        .schema()
                        .fields()
                        .iter()
                        .map(|f| f.name().clone()),
                );
                let sorted = sort_batch(p.chunk.batch(), &key)?;
                inputs.push(Box::new(std::iter::once(Ok(sorted))));
            }
            let bytes = parts.iter().map(|p| p.chunk.memory_size()).sum();
            let max_tx = parts.iter().map(|p| p.tx).max().unwrap_or(0);
            (inputs, names, bytes, max_tx, wanted, (0, HashSet::new()), 0)
        }
        Choice::Merge {
            level,
            runs,
            target,
        } => {
            let wanted: HashSet<u64> = runs.iter().copied().collect();
            let runs: Vec<Arc<Run>> = v.levels[*level]
                .iter()
                .filter(|r| wanted.contains(&r.id))
                .cloned()
                .collect();
            let mut names = HashSet::new();
            for g in runs.iter().flat_map(|r| &r.granules) {
                names.extend(g.batch().schema().fields().iter().map(|f| f.name().clone()));
            }
            let bytes = runs.iter().map(|r| r.memory_size()).sum();
            let max_tx = runs.iter().map(|r| r.max_tx).max().unwrap_or(0);
            let inputs: Vec<BatchStream> = runs
                .into_iter()
                .map(|run| -> BatchStream {
                    let granules = run.granules.clone();
                    Box::new(granules.into_iter().map(|g| Ok(g.batch().clone())))
                })
                .collect();
            (
                inputs,
                names,
                bytes,
                max_tx,
                HashSet::new(),
                (*level, wanted),
                *target,
            )
        }
    };
    let output = union_schema(&v.schema.arrow_schema().clone(), &names);
    let merge = Merge::new(key, inputs, output, options.granule_rows, None)?;
    let granules = merge
        .map(|batch| batch.and_then(|b| Chunk::new(drop_null_columns(b)?).map(Arc::new)))
        .collect::<Result<Vec<_>>>()?;
    let run = Run {
        id: ids.fetch_add(1, Ordering::Relaxed),
        max_tx,
        granules,
    };
    let outcome = CompactionOutcome {
        job,
        granules: run.granules.len(),
        bytes_before,
        bytes_after: run.memory_size(),
    };
    Ok(Some(Output {
        remove_parts,
        remove_runs,
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
    let (level, ids) = &output.remove_runs;
    if !ids.is_empty() {
        levels[*level].retain(|r| !ids.contains(&r.id));
    }
    let (target, run) = &output.add;
    levels[*target].push(run.clone());
    Version {
        watermark: current.watermark,
        schema: current.schema.clone(),
        l0,
        levels: Arc::new(levels),
    }
}
