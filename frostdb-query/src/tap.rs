//! An operator's output passed on unchanged, with a hook at each batch: the one plan node
//! behind [`crate::cancellable`] (a check before each batch) and the window charging of
//! [`crate::window_input`] (a reservation grown by each batch).
//!
//! A [`Tap`] says what the node is called and opens a [`TapStream`] per partition; the
//! node itself keeps its input's schema, properties and order, and has no metrics.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, RecordBatchStream,
    SendableRecordBatchStream,
};
use futures::Stream;

/// What a [`TapExec`] does to the batches passing through it.
pub(crate) trait Tap: Send + Sync + 'static {
    /// The node's name in plans (`ExecutionPlan::name`).
    const NAME: &'static str;
    /// Per-partition state, seeing each batch.
    type Stream: TapStream;

    /// The node's line in `EXPLAIN`.
    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// The state of one partition's stream, made when the partition starts; an error
    /// stops the partition before its input starts.
    fn open(&self, partition: usize, context: &TaskContext) -> Result<Self::Stream>;
}

/// One partition's hooks; an error from either ends the stream with it.
pub(crate) trait TapStream: Send + Unpin + 'static {
    /// Before the input is asked for its next batch.
    fn before_poll(&mut self) -> Result<()> {
        Ok(())
    }

    /// When the input gives a batch, before it is passed on.
    fn on_batch(&mut self, _batch: &RecordBatch) -> Result<()> {
        Ok(())
    }
}

/// `input`'s output, passed through `tap`.
pub(crate) struct TapExec<T> {
    input: Arc<dyn ExecutionPlan>,
    tap: Arc<T>,
}

/// `input`'s output, passed through `tap`: a [`TapExec`] over `input`.
pub(crate) fn tapped<T: Tap>(input: Arc<dyn ExecutionPlan>, tap: Arc<T>) -> Arc<dyn ExecutionPlan> {
    Arc::new(TapExec { input, tap })
}

impl<T: Tap> fmt::Debug for TapExec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(T::NAME)
            .field("input", &self.input.name())
            .finish_non_exhaustive()
    }
}

impl<T: Tap> DisplayAs for TapExec<T> {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.tap.describe(f)
    }
}

impl<T: Tap> ExecutionPlan for TapExec<T> {
    fn name(&self) -> &str {
        T::NAME
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(tapped(input, self.tap.clone())),
            _ => Err(DataFusionError::Internal(format!(
                "{} has one child",
                T::NAME
            ))),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let tap = self.tap.open(partition, &context)?;
        Ok(Box::pin(Tapped {
            input: self.input.execute(partition, context)?,
            tap,
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        None
    }
}

struct Tapped<S> {
    input: SendableRecordBatchStream,
    tap: S,
}

impl<S: TapStream> Stream for Tapped<S> {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Err(e) = self.tap.before_poll() {
            return Poll::Ready(Some(Err(e)));
        }
        let polled = self.input.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(batch))) = &polled
            && let Err(e) = self.tap.on_batch(batch)
        {
            return Poll::Ready(Some(Err(e)));
        }
        polled
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.input.size_hint()
    }
}

impl<S: TapStream> RecordBatchStream for Tapped<S> {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}
