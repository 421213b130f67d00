//! What a window operator keeps, charged to the query's memory pool.
//!
//! DataFusion's window operators buffer their input outside every memory pool:
//! `WindowAggExec` keeps each whole partition, and `BoundedWindowAggExec` keeps the rows its
//! frames may still reach (back to the oldest frame's start, ahead to its end, and every
//! peer of a `RANGE` frame). How many that is cannot be told from the plan: a frame of
//! `ROWS BETWEEN 100000000 PRECEDING AND CURRENT ROW`, a `RANGE` offset in the order key's
//! units, or a running total ordered by a column with one value each keep the whole input.
//! Over 3 million generated rows, a frame reaching 100 million rows back kept all of them
//! (24 MB of values) under a 16 MiB query memory limit and answered, the limit never
//! seeing them.
//!
//! [`ChargeWindowInputs`], a physical optimizer rule of every session, puts
//! [`ChargedInput`] under each window operator: the window's input is reserved from the
//! query's pool as the window reads it, whole, until the query ends. A window over more
//! input than the limit fails, naming the limit (with spilling, its input's sort may still
//! be larger than memory; the window's buffer is not). This is conservative: a window with
//! a short frame keeps far less than its input, and is refused all the same once its input
//! passes the limit.

use std::fmt;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};

use crate::tap::{Tap, TapStream, tapped};

/// The operators whose input [`ChargeWindowInputs`] charges.
const WINDOWS: [&str; 2] = ["BoundedWindowAggExec", "WindowAggExec"];

/// Puts [`ChargedInput`] under every window operator (see the module's documentation). It
/// runs after DataFusion's own rules, which would not know the operator it adds.
#[derive(Debug, Default)]
pub(crate) struct ChargeWindowInputs;

impl PhysicalOptimizerRule for ChargeWindowInputs {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !WINDOWS.contains(&node.name()) {
                return Ok(Transformed::no(node));
            }
            let tap = Arc::new(ChargedInput {
                window: node.name().to_owned(),
            });
            let inputs = node
                .children()
                .into_iter()
                .map(|input| tapped(input.clone(), tap.clone()))
                .collect();
            // The inputs' properties are the same: the window's stay.
            let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep);
            Ok(Transformed::yes(node.replace_children(inputs, keep)?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "charge_window_inputs"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A window operator's input, reserved from the query's pool as it is read.
struct ChargedInput {
    /// The window operator above it, for the reservation's name.
    window: String,
}

impl Tap for ChargedInput {
    const NAME: &'static str = "ChargedInput";
    /// Every batch read so far, released when the window drops its input (the query ends).
    type Stream = MemoryReservation;

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChargedInput: kept by {}", self.window)
    }

    fn open(&self, partition: usize, context: &TaskContext) -> Result<MemoryReservation> {
        Ok(
            MemoryConsumer::new(format!("{}[{partition}] (the rows it keeps)", self.window))
                .register(context.memory_pool()),
        )
    }
}

impl TapStream for MemoryReservation {
    fn on_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        self.try_grow(rows_bytes(batch)?)
    }
}

/// The bytes of a batch's rows, not of the buffers it slices: a window copies what it
/// keeps, and a scan's slices of one large buffer would each count it all.
fn rows_bytes(batch: &RecordBatch) -> Result<usize> {
    let mut bytes = 0;
    for column in batch.columns() {
        bytes += column.to_data().get_slice_memory_size()?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    /// A session of the crate's (the rule included) under a 16 MiB query memory limit,
    /// spilling as the server's do (so that the operators that can spill do, and the one
    /// that cannot is the one refused).
    fn session() -> (datafusion::prelude::SessionContext, tempfile::TempDir) {
        let spill = tempfile::tempdir().unwrap();
        let pool = crate::memory_pool(Some(16 << 20));
        let ctx = crate::provider::context(pool, &crate::Spill::to(spill.path(), 1 << 30).unwrap());
        (ctx.unwrap(), spill)
    }

    async fn one_value(sql: &str) -> Result<i64> {
        let (ctx, _spill) = session();
        let batches = ctx.sql(sql).await?.collect().await?;
        let column = batches[0].column(0);
        Ok(column
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("an Int64 answer")
            .value(0))
    }

    /// A window whose frame reaches back 100 million rows keeps every row it has read (its
    /// input is ordered already, so no sort comes first to be charged): over 3 million rows
    /// it kept over 24 MB under the 16 MiB limit, and answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_keeping_more_than_the_limit_fails_naming_it() {
        let e = one_value(
            "SELECT max(s) FROM (SELECT sum(x) OVER (ORDER BY x ROWS BETWEEN 100000000 \
             PRECEDING AND CURRENT ROW) AS s FROM generate_series(1, 3000000) AS t(x))",
        )
        .await
        .unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains("query memory limit of 16777216 bytes"),
            "{message}"
        );
        assert!(message.contains("BoundedWindowAggExec"), "{message}");
    }

    /// Windows within the limit answer as before, and what their input held is given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_within_the_limit_answers_and_gives_its_memory_back() {
        let (ctx, _spill) = session();
        let sql = "SELECT max(s) FROM (SELECT sum(x) OVER (ORDER BY x ROWS BETWEEN 2 \
                   PRECEDING AND CURRENT ROW) AS s FROM generate_series(1, 100000) AS t(x))";
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        assert!(
            shown.contains("ChargedInput: kept by BoundedWindowAggExec"),
            "{shown}"
        );
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx())
            .await
            .unwrap();
        let max = batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .value(0);
        // The last three numbers' sum.
        assert_eq!(max, 99_998 + 99_999 + 100_000);
        assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
        // A window over a whole partition is charged too.
        assert_eq!(
            one_value(
                "SELECT max(c) FROM (SELECT count(*) OVER () AS c FROM generate_series(1, 1000))"
            )
            .await
            .unwrap(),
            1000
        );
    }
}
