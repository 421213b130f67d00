//! Cancelling a running query from outside: a [`Cancel`] set by whoever gave up on the
//! query (a timeout, a client gone), seen by every operator of a plan made
//! [`cancellable`] at its next batch.
//!
//! Dropping a query's stream stops it only at the stream's next poll, and an operator that
//! produces many batches from one input batch (a cross join, a generator) is polled by its
//! parent in a loop that may not return to the runtime for minutes. Wrapping every
//! operator's output makes each of those batches a point where the query stops.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;

use crate::tap::{Tap, TapStream, tapped};

/// A query's cancellation, shared by everything that runs it. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<State>);

#[derive(Debug, Default)]
struct State {
    cancelled: AtomicBool,
    reason: OnceLock<String>,
    deadline: OnceLock<Instant>,
}

impl Cancel {
    /// A query not cancelled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the query; the first reason given is the one its error names.
    pub fn cancel(&self, reason: impl Into<String>) {
        let _ = self.0.reason.set(reason.into());
        self.0.cancelled.store(true, Ordering::Release);
    }

    /// A query cancelled once `at` has passed (as well as by [`Cancel::cancel`]).
    pub fn with_deadline(at: Instant) -> Self {
        let cancel = Self::default();
        let _ = cancel.0.deadline.set(at);
        cancel
    }

    /// Whether the query was cancelled, or its deadline has passed.
    pub fn is_cancelled(&self) -> bool {
        if self.0.cancelled.load(Ordering::Acquire) {
            return true;
        }
        if self
            .0
            .deadline
            .get()
            .is_some_and(|at| Instant::now() >= *at)
        {
            self.cancel("it ran past its deadline");
            return true;
        }
        false
    }

    /// Why the query was cancelled (the first reason given), or a placeholder.
    pub fn reason(&self) -> String {
        self.0
            .reason
            .get()
            .map_or("no reason given", String::as_str)
            .to_owned()
    }

    /// An error when the query was cancelled.
    pub fn check(&self) -> Result<()> {
        if !self.is_cancelled() {
            return Ok(());
        }
        Err(DataFusionError::Execution(format!(
            "the query was cancelled: {}",
            self.0
                .reason
                .get()
                .map_or("no reason given", String::as_str)
        )))
    }
}

/// `plan` with the output of every operator checked against `cancel` before each batch.
/// Apply it to the physical plan about to run (after `EXPLAIN` text is made, which it does
/// not change).
pub fn cancellable(
    plan: Arc<dyn ExecutionPlan>,
    cancel: &Cancel,
) -> Result<Arc<dyn ExecutionPlan>> {
    let tap = Arc::new(CancellableExec(cancel.clone()));
    plan.transform_up(|node| Ok(Transformed::yes(tapped(node, tap.clone()))))
        .map(|t| t.data)
}

/// An operator's output, stopped at the next batch once [`Cancel`] is set.
struct CancellableExec(Cancel);

impl Tap for CancellableExec {
    const NAME: &'static str = "CancellableExec";
    type Stream = Cancel;

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancellableExec")
    }

    fn open(&self, _partition: usize, _context: &TaskContext) -> Result<Cancel> {
        self.0.check()?;
        Ok(self.0.clone())
    }
}

impl TapStream for Cancel {
    fn before_poll(&mut self) -> Result<()> {
        self.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::record_batch::RecordBatch;
    use futures::TryStreamExt;

    /// A cross join of two generated series, counted: billions of rows, which the count
    /// pulls from the join in a loop that never waits on anything.
    const ENDLESS: &str =
        "SELECT count(*) FROM generate_series(1, 100000) a CROSS JOIN generate_series(1, 100000) b";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cross_join_past_its_deadline_stops_at_its_next_batch() {
        let ctx = datafusion::prelude::SessionContext::new();
        let plan = ctx
            .sql(ENDLESS)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        // Hours of work, given a fraction of a second: it stops in the middle.
        let cancel = Cancel::with_deadline(Instant::now() + std::time::Duration::from_millis(300));
        let plan = cancellable(plan, &cancel).unwrap();
        let stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx()).unwrap();
        let e = stream.try_collect::<Vec<_>>().await.unwrap_err();
        assert!(e.to_string().contains("past its deadline"), "{e}");
        assert!(cancel.is_cancelled());
    }

    #[tokio::test]
    async fn a_cancelled_query_does_not_start() {
        let ctx = datafusion::prelude::SessionContext::new();
        let plan = ctx
            .sql(ENDLESS)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let cancel = Cancel::new();
        cancel.cancel("the client went away");
        let e =
            datafusion::physical_plan::collect(cancellable(plan, &cancel).unwrap(), ctx.task_ctx())
                .await
                .unwrap_err();
        assert!(e.to_string().contains("the client went away"), "{e}");
    }

    #[test]
    fn a_plan_made_cancellable_keeps_its_schema_and_partitions() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let ctx = datafusion::prelude::SessionContext::new();
            let plan = ctx
                .sql("SELECT a FROM (VALUES (1), (2)) t(a)")
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let wrapped = cancellable(plan.clone(), &Cancel::new()).unwrap();
            assert_eq!(wrapped.schema(), plan.schema());
            let rows: usize = datafusion::physical_plan::collect(wrapped, ctx.task_ctx())
                .await
                .unwrap()
                .iter()
                .map(RecordBatch::num_rows)
                .sum();
            assert_eq!(rows, 2);
        });
    }
}
