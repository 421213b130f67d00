//! Compaction steps on a table's active block: choose (pure), execute outside every lock,
//! apply under the swap lock unless the block rotated meanwhile.

use std::sync::Arc;

use super::TableInner;
use crate::error::Result;
use crate::index::compaction::{self, Mode};

impl TableInner {
    pub(crate) fn compact(&self, mode: Mode) -> Result<usize> {
        let _one_at_a_time = self.compaction.lock();
        let mut steps = 0;
        loop {
            let version = self.current.read().clone();
            let choice = compaction::choose(&version, &self.options, mode);
            let Some(job) = choice.job(&version) else {
                break;
            };
            self.listener.on_compaction_begin(&self.name, &job);
            let Some(output) = compaction::execute(&version, &choice, &self.options, &self.ids)?
            else {
                break;
            };
            {
                let _swap = self.swap.lock();
                let current = self.current.read().clone();
                if current.generation != version.generation {
                    // The active block rotated meanwhile: the inputs now belong to a frozen
                    // block, and the output would duplicate them. Drop the work.
                    break;
                }
                let next = compaction::apply(&current, &output);
                *self.current.write() = Arc::new(next);
            }
            tracing::debug!(
                table = %self.name,
                from = output.outcome.job.from_level,
                to = output.outcome.job.to_level,
                rows = output.outcome.job.rows,
                granules = output.outcome.granules,
                "compacted"
            );
            self.listener.on_compaction_end(&self.name, &output.outcome);
            steps += 1;
        }
        Ok(steps)
    }
}
