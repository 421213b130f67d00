//! The execution plan of a frostdb table scan: partitions of an engine scan, each streamed
//! from a blocking thread through a small channel.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use frostdb_core::{Scan, ScanMetrics, ScanRequest, Snapshot};
use parking_lot::Mutex;

use crate::provider::BlocksFailed;

/// Scans a snapshot of a frostdb table with the request the provider built from the query:
/// projection, converted filters, limit. Pruning happens when the plan is made, so `EXPLAIN`
/// shows what was pruned.
pub struct FrostScanExec {
    table: String,
    snapshot: Snapshot,
    request: ScanRequest,
    schema: SchemaRef,
    /// The planned partitions; a partition executed a second time is planned again.
    scans: Mutex<Vec<Option<Scan>>>,
    pruning: ScanMetrics,
    pushed: Vec<String>,
    limit: Option<usize>,
    /// Where a lenient scan counts the blocks it skipped (`None`: strict).
    lenient: Option<BlocksFailed>,
    metrics: ExecutionPlanMetricsSet,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for FrostScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrostScanExec")
            .field("table", &self.table)
            .field("pruning", &self.pruning)
            .finish_non_exhaustive()
    }
}

impl FrostScanExec {
    pub(crate) fn try_new(
        table: String,
        snapshot: Snapshot,
        request: ScanRequest,
        partitions: usize,
        pushed: Vec<String>,
        limit: Option<usize>,
        lenient: Option<BlocksFailed>,
    ) -> Result<Self> {
        let (scans, pruning) = snapshot
            .scan_partitions(&request, partitions)
            .map_err(crate::to_datafusion)?;
        let schema = scans
            .first()
            .map(|s| s.schema().clone())
            .ok_or_else(|| DataFusionError::Internal("a scan has no partition".into()))?;
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(scans.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        let metrics = ExecutionPlanMetricsSet::new();
        if let Some(failed) = &lenient {
            // Blocks skipped at planning; those whose read fails are added as they stop.
            failed.add(pruning.blocks_failed);
            MetricBuilder::new(&metrics)
                .global_counter("blocks_failed")
                .add(pruning.blocks_failed);
        }
        Ok(Self {
            table,
            snapshot,
            request,
            schema,
            scans: Mutex::new(scans.into_iter().map(Some).collect()),
            pruning,
            pushed,
            limit,
            lenient,
            metrics,
            properties: Arc::new(properties),
        })
    }

    /// What pruning skipped when the plan was made.
    pub fn pruning(&self) -> ScanMetrics {
        self.pruning
    }

    /// The table scanned.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl DisplayAs for FrostScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.pruning;
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "FrostScanExec: table={}, projection=[{}], filters=[{}], limit={:?}, partitions={}, \
                 pruned: granules {}/{}, blocks {}/{}, row_groups {}/{} ({} by key ranges), rows skipped by pages {}, row groups proven {} (partly {}), columns from statistics {}, rows to read {}{}",
                self.table,
                columns.join(", "),
                self.pushed.join(", "),
                self.limit,
                self.properties.output_partitioning().partition_count(),
                p.chunks_pruned,
                p.chunks,
                p.blocks_pruned,
                p.blocks,
                p.row_groups_pruned,
                p.row_groups,
                p.row_groups_pruned_by_keys,
                p.rows_skipped_by_pages,
                p.row_groups_proven,
                p.row_groups_partly_proven,
                p.columns_from_statistics,
                p.rows_read,
                match self.lenient {
                    Some(_) => format!(", lenient: blocks failed {}", p.blocks_failed),
                    None => String::new(),
                },
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "table={}", self.table)?;
                writeln!(f, "filters=[{}]", self.pushed.join(", "))?;
                write!(
                    f,
                    "pruned: granules {}/{}, blocks {}/{}, row_groups {}/{}",
                    p.chunks_pruned,
                    p.chunks,
                    p.blocks_pruned,
                    p.blocks,
                    p.row_groups_pruned,
                    p.row_groups
                )
            }
        }
    }
}

impl ExecutionPlan for FrostScanExec {
    fn name(&self) -> &str {
        "FrostScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "FrostScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let taken = self.scans.lock().get_mut(partition).and_then(Option::take);
        let scan = match taken {
            Some(scan) => scan,
            None => {
                let count = self.properties.output_partitioning().partition_count();
                let (mut scans, _) = self
                    .snapshot
                    .scan_partitions(&self.request, count)
                    .map_err(crate::to_datafusion)?;
                if partition >= scans.len() {
                    return Err(DataFusionError::Internal(format!(
                        "partition {partition} of a scan with {} partitions",
                        scans.len()
                    )));
                }
                scans.swap_remove(partition)
            }
        };
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let failures = self.lenient.clone().map(|failed| {
            let metric = MetricBuilder::new(&self.metrics).global_counter("blocks_failed");
            (failed, metric)
        });
        // The engine's scan is synchronous (its block reads wait on the engine's own I/O
        // runtime): run it on a blocking thread and hand batches over two at a time.
        let what = format!("the scan of partition {partition} of {}", self.table);
        Ok(on_blocking_thread(
            self.schema.clone(),
            what,
            move |send, gone| {
                let mut scan = scan;
                // A reader that leaves (the query ended: its answer was complete, a LIMIT was
                // met, the request was cancelled) stops the scan at its next source batch, not
                // at its next batch with rows (a filter matching nothing read the whole table
                // after its request had ended, on the threads other queries wait for).
                scan.stop_when(move || gone().then(|| "the query reading it has ended".to_owned()));
                for batch in scan.by_ref() {
                    let batch = batch.map_err(crate::to_datafusion);
                    if let Ok(b) = &batch {
                        output_rows.add(b.num_rows());
                    }
                    if !send(batch) {
                        return; // the consumer is gone: the query finished or was cancelled
                    }
                }
                // A partition's scan counts only the blocks whose read failed midway.
                if let Some((failed, metric)) = failures {
                    let midway = scan.metrics().blocks_failed;
                    failed.add(midway);
                    metric.add(midway);
                }
            },
        ))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Whether the reader of a stream has left.
type Gone = Box<dyn Fn() -> bool + Send + Sync>;

/// The batches `produce` sends (`send` answers false once the stream is dropped, and
/// `gone` tells whether it is), made on a blocking thread. If `produce` panics, the
/// stream ends with an error naming `what`: before, the partition just ended, as if it had
/// read everything, and the query answered without the rest of its rows.
fn on_blocking_thread(
    schema: SchemaRef,
    what: String,
    produce: impl FnOnce(&dyn Fn(Result<arrow::array::RecordBatch>) -> bool, Gone) + Send + 'static,
) -> SendableRecordBatchStream {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let send = |batch| tx.blocking_send(batch).is_ok();
        let watched = tx.clone();
        let gone: Gone = Box::new(move || watched.is_closed());
        let produced =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| produce(&send, gone)));
        if let Err(panic) = produced {
            let message = frostdb_core::panic_message(panic.as_ref()).to_owned();
            let _ = tx.blocking_send(Err(DataFusionError::Execution(format!(
                "{what} failed (it panicked: {message}); the answer would lack its rows"
            ))));
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|batch| (batch, rx))
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    /// A scan thread that panics ends its partition with an error naming it, not as if it
    /// had read everything; one that ends, ends the stream cleanly.
    #[tokio::test]
    async fn a_scan_thread_that_panics_fails_its_stream() {
        let schema: SchemaRef = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("v", arrow::datatypes::DataType::Int64, false),
        ]));
        let batch = arrow::array::RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::Int64Array::from(vec![1, 2]))],
        )
        .unwrap();
        let (one, two) = (batch.clone(), batch.clone());
        let panics = on_blocking_thread(schema.clone(), "the scan of t".into(), move |send, _| {
            send(Ok(one));
            panic!("a page it could not decode");
        });
        let e = panics
            .try_collect::<Vec<_>>()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the scan of t") && e.contains("could not decode"),
            "{e}"
        );
        let ends = on_blocking_thread(schema, "the scan of t".into(), move |send, _| {
            send(Ok(two));
        });
        assert_eq!(ends.try_collect::<Vec<_>>().await.unwrap().len(), 1);
    }
}
