//! Retention: persisted blocks wholly older than the table's ttl are deleted; so are blocks a
//! caller names (a profile store expiring symbols no sample refers to any more).

use std::sync::Arc;

use super::TableInner;
use crate::error::{Error, Result};
use crate::index::version::Version;
use crate::manifest::BlockMeta;

/// Checks that `column` of `schema` can carry a ttl: Int64 milliseconds, not dynamic.
pub(crate) fn check_time_column(schema: &crate::schema::Schema, column: &str) -> Result<()> {
    let time = schema.column(column);
    if matches!(time, Some((_, c)) if *c.data_type() == arrow::datatypes::DataType::Int64 && !c.is_dynamic())
    {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option: "time_column",
        reason: format!("ttl needs an Int64 column of milliseconds, and {column:?} is not one"),
    })
}

impl TableInner {
    /// Deletes blocks whose newest row is older than the ttl, relative to `now_ms`.
    pub(crate) fn enforce_retention(&self, now_ms: i64) -> Result<Vec<BlockMeta>> {
        if let Some(durable) = &self.durable {
            // Retired blocks the snapshots of earlier passes held, and failed deletions.
            durable.storage.reap();
        }
        let Some(ttl) = *self.ttl.read() else {
            return Ok(Vec::new());
        };
        let cutoff = now_ms.saturating_sub(ttl.as_millis() as i64);
        let time = &self.options.time_column;
        self.delete_blocks(
            &|b: &BlockMeta| match b.stats_of(time).max {
                Some(crate::Scalar::Int(max)) => max < cutoff,
                _ => false,
            },
            "retention deleted expired blocks",
        )
    }

    /// Deletes the persisted blocks `doomed` picks: out of the manifest first (so a crash
    /// after it leaves at worst an orphaned object), then out of the current version, then
    /// their objects.
    pub(crate) fn delete_blocks(
        &self,
        doomed: &dyn Fn(&BlockMeta) -> bool,
        why: &str,
    ) -> Result<Vec<BlockMeta>> {
        let Some(durable) = &self.durable else {
            return Ok(Vec::new());
        };
        let expired: Vec<BlockMeta> = self
            .current
            .read()
            .blocks
            .iter()
            .filter(|b| doomed(b))
            .map(|b| b.meta().clone())
            .collect();
        if expired.is_empty() {
            return Ok(expired);
        }
        self.log
            .refuse(|| format!("deleting blocks of table {:?}", self.name))?;
        let ids: std::collections::HashSet<u64> = expired.iter().map(|b| b.id).collect();
        durable.manifest.update(|m| {
            if let Some(t) = m.tables.get_mut(&self.name) {
                t.blocks.retain(|b| !ids.contains(&b.id));
            }
            Ok(())
        })?;
        {
            let _swap = self.swap.lock();
            let current = self.current.read().clone();
            let (gone, kept): (Vec<_>, Vec<_>) =
                current.blocks.iter().partition(|b| ids.contains(&b.id));
            *self.current.write() = Arc::new(Version {
                blocks: Arc::new(kept.into_iter().cloned().collect()),
                ..(*current).clone()
            });
            // Their objects go once no snapshot or scan holds them (now, when none does).
            for b in gone {
                b.retire(&durable.storage);
            }
        }
        let deleted = durable.storage.reap();
        let waiting = durable.storage.doomed();
        if waiting > 0 {
            tracing::debug!(table = %self.name, deleted, waiting, "retired blocks still read by snapshots");
        }
        let (rows, bytes): (u64, u64) = expired
            .iter()
            .map(|b| (b.rows, b.size))
            .fold((0, 0), |(r, s), (rows, size)| (r + rows, s + size));
        tracing::info!(table = %self.name, blocks = expired.len(), rows, bytes, "{why}");
        self.listener.on_retention(&self.name, &expired);
        Ok(expired)
    }

    /// Sets the retention period, in the manifest first.
    pub(crate) fn set_ttl(&self, ttl: Option<std::time::Duration>) -> Result<()> {
        if ttl.is_some() {
            check_time_column(&self.schema, &self.options.time_column)?;
        }
        if *self.ttl.read() == ttl {
            return Ok(());
        }
        self.log
            .refuse(|| format!("setting the retention of table {:?}", self.name))?;
        if let Some(durable) = &self.durable {
            durable.manifest.update(|m| {
                let t = m
                    .tables
                    .get_mut(&self.name)
                    .ok_or_else(|| Error::Internal("table vanished from the manifest".into()))?;
                t.options.ttl = ttl;
                Ok(())
            })?;
        }
        *self.ttl.write() = ttl;
        tracing::info!(table = %self.name, ttl_secs = ttl.map(|t| t.as_secs()), "retention period set");
        Ok(())
    }
}
