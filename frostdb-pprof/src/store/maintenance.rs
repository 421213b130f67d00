//! Background upkeep: expiring symbol partitions no retained sample uses, rotating the
//! symbol partition, rolling samples up into hours and days.

use super::*;

/// Deletes symbol partitions no retained sample refers to (run after retention).
pub(super) struct SymbolExpiry {
    /// The tables whose rows refer to stacks: samples, spans and rollups.
    pub(super) stack_users: Vec<Table>,
    pub(super) symbols: Arc<SymbolStore>,
}

/// The oldest and newest symbol partitions the rows of `tables` refer to (`None`: no rows).
pub(super) fn partitions_used(tables: &[Table]) -> Option<(u32, u32)> {
    tables
        .iter()
        .filter_map(|t| {
            let stats = t.snapshot().column_stats(STACKTRACE_ID)?;
            match (stats.min, stats.max) {
                (Some(Scalar::UInt(min)), Some(Scalar::UInt(max))) => {
                    Some((split_id(min).0, split_id(max).0))
                }
                _ => None,
            }
        })
        .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
}

impl SymbolExpiry {
    pub(super) fn run_once(&self) -> Result<usize> {
        let current = self.symbols.current().id();
        let oldest_used =
            partitions_used(&self.stack_users).map_or(current, |(oldest, _)| oldest.min(current));
        let tables = self.symbols.tables();
        let mut deleted = 0;
        for (table, column) in [
            (Some(&tables.stacktraces), STACKTRACE_ID),
            (Some(&tables.locations), "location_id"),
            (Some(&tables.functions), "function_id"),
            (Some(&tables.mappings), "mapping_id"),
            (tables.names.as_ref(), "location_id"),
        ] {
            let Some(table) = table else {
                continue;
            };
            deleted += table
                .delete_blocks(|b| match b.stats_of(column).max {
                    Some(Scalar::UInt(max)) => split_id(max).0 < oldest_used,
                    _ => false,
                })?
                .len();
        }
        self.symbols.forget_below(oldest_used);
        if deleted > 0 {
            tracing::info!(
                blocks = deleted,
                oldest_partition_kept = oldest_used,
                "symbols no retained sample refers to deleted"
            );
        }
        Ok(deleted)
    }
}

impl Maintenance for SymbolExpiry {
    fn run(&self, _now_ms: i64) {
        if let Err(error) = self.run_once() {
            tracing::warn!(%error, "expiring symbols failed; retried at the next pass");
        }
    }
}

impl ProfileStore {
    /// Rolls up, now, every closed hour and day not rolled up yet (the database's
    /// maintenance pass does it every retention interval).
    pub fn roll_up(&self) -> Result<RollupSummary> {
        self.roll_up_at(now_ms())
    }

    /// [`ProfileStore::roll_up`] as if the time were `now_ms` (hours that ended
    /// [`RollupOptions::delay`] before it are closed).
    pub fn roll_up_at(&self, now_ms: i64) -> Result<RollupSummary> {
        self.rollups.run_pass(now_ms)
    }

    /// Deletes the symbols no retained sample refers to any more, now (the database does it
    /// after each retention pass). Returns the symbol blocks deleted.
    pub fn expire_symbols(&self) -> Result<usize> {
        self.expiry.run_once()
    }

    /// Closes the current symbol partition (the next ingest starts a new one).
    pub fn rotate_symbols(&self) {
        let id = self.symbols.current().id();
        self.symbols.rotate(id);
    }
}
