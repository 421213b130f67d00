//! The execution plan of a frostdb table scan: partitions of an engine scan, each batch
//! made on a blocking thread only while it is made.

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
        // runtime): each batch is made on a blocking thread.
        let what = format!("the scan of partition {partition} of {}", self.table);
        Ok(on_blocking_threads(
            self.schema.clone(),
            what,
            move |gone| {
                let mut scan = scan;
                // A reader that leaves (the query ended: its answer was complete, a LIMIT was
                // met, the request was cancelled) stops the scan at its next source batch, not
                // at its next batch with rows (a filter matching nothing read the whole table
                // after its request had ended, on the threads other queries wait for).
                scan.stop_when(move || gone().then(|| "the query reading it has ended".to_owned()));
                PartitionScan {
                    scan,
                    output_rows,
                    failures,
                }
            },
        ))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// A partition's scan, counting the rows it yields and, at its end, the blocks whose
/// read failed midway (a lenient scan's).
struct PartitionScan {
    scan: Scan,
    output_rows: datafusion::physical_plan::metrics::Count,
    failures: Option<(BlocksFailed, datafusion::physical_plan::metrics::Count)>,
}

impl Iterator for PartitionScan {
    type Item = Result<arrow::array::RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.scan.next() {
            Some(batch) => {
                let batch = batch.map_err(crate::to_datafusion);
                if let Ok(b) = &batch {
                    self.output_rows.add(b.num_rows());
                }
                Some(batch)
            }
            None => {
                if let Some((failed, metric)) = self.failures.take() {
                    let midway = self.scan.metrics().blocks_failed;
                    failed.add(midway);
                    metric.add(midway);
                }
                None
            }
        }
    }
}

/// Whether the reader of a stream has left.
type Gone = Box<dyn Fn() -> bool + Send + Sync>;

/// The batches of the source `make` builds (given whether the stream's reader has left),
/// each made by a task on the blocking pool that holds its thread only while it makes that
/// batch; the next is made while the reader uses the last. A partition waiting for its
/// reader holds no thread: before, each held one for its whole life, and a query whose
/// plan executes more scans than the pool has threads (a join's probe sides, filled and
/// waiting for their build sides) took every thread, its own build sides and every other
/// query's scans queued behind them until its deadline. If the source panics, the stream
/// ends with an error naming `what` (not as if it had read everything); after an error it
/// ends.
fn on_blocking_threads<S>(
    schema: SchemaRef,
    what: String,
    make: impl FnOnce(Gone) -> S,
) -> SendableRecordBatchStream
where
    S: Iterator<Item = Result<arrow::array::RecordBatch>> + Send + 'static,
{
    type Made<S> = (Option<S>, Option<Result<arrow::array::RecordBatch>>);
    fn step<S>(mut source: S, what: Arc<str>) -> tokio::task::JoinHandle<Made<S>>
    where
        S: Iterator<Item = Result<arrow::array::RecordBatch>> + Send + 'static,
    {
        tokio::task::spawn_blocking(move || {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.next())) {
                Ok(Some(Ok(batch))) => (Some(source), Some(Ok(batch))),
                Ok(Some(Err(e))) => (None, Some(Err(e))),
                Ok(None) => (None, None),
                Err(panic) => {
                    let message = frostdb_core::panic_message(panic.as_ref()).to_owned();
                    let e = DataFusionError::Execution(format!(
                        "{what} failed (it panicked: {message}); the answer would lack its rows"
                    ));
                    (None, Some(Err(e)))
                }
            }
        })
    }
    // Held by the stream: dropped with it, which the source sees as its reader gone.
    let reader = Arc::new(());
    let watched = Arc::downgrade(&reader);
    let source = make(Box::new(move || watched.strong_count() == 0));
    let what: Arc<str> = what.into();
    let first = step(source, what.clone());
    let stream = futures::stream::unfold((Some(first), reader), move |(pending, reader)| {
        let what = what.clone();
        async move {
            let (source, made) = pending?.await.unwrap_or_else(|e| {
                let e = DataFusionError::Execution(format!("{what} failed: {e}"));
                (None, Some(Err(e)))
            });
            let made = made?;
            let next = source.map(|source| step(source, what));
            Some((made, (next, reader)))
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    fn batch() -> (SchemaRef, arrow::array::RecordBatch) {
        let schema: SchemaRef = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("v", arrow::datatypes::DataType::Int64, false),
        ]));
        let batch = arrow::array::RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::Int64Array::from(vec![1, 2]))],
        )
        .unwrap();
        (schema, batch)
    }

    /// A source that panics ends its partition with an error naming it, not as if it had
    /// read everything; one that ends, ends the stream cleanly.
    #[tokio::test]
    async fn a_scan_that_panics_fails_its_stream() {
        let (schema, batch) = batch();
        let one = batch.clone();
        let mut left = 2;
        let panics = on_blocking_threads(schema.clone(), "the scan of t".into(), move |_| {
            std::iter::from_fn(move || {
                left -= 1;
                assert!(left > 0, "a page it could not decode");
                Some(Ok(one.clone()))
            })
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
        let ends = on_blocking_threads(schema, "the scan of t".into(), move |_| {
            std::iter::once(Ok(batch))
        });
        assert_eq!(ends.try_collect::<Vec<_>>().await.unwrap().len(), 1);
    }

    /// Partitions whose reader has not come back for their next batch hold no thread of
    /// the blocking pool: with a pool of one thread, eight streams each read once and left
    /// waiting do not stop a ninth from being read to its end (before, the first of them
    /// held the one thread, blocked on its full channel, and the ninth never ran). A
    /// stream dropped is seen by its source as its reader gone.
    #[test]
    fn partitions_waiting_for_their_reader_hold_no_thread() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let (schema, batch) = batch();
        let stream = |n: usize| {
            let batch = batch.clone();
            on_blocking_threads(schema.clone(), "the scan of t".into(), move |_| {
                let mut left = n;
                std::iter::from_fn(move || {
                    left = left.checked_sub(1)?;
                    Some(Ok(batch.clone()))
                })
            })
        };
        let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen_by_source = seen.clone();
        let last = batch.clone();
        runtime.block_on(async {
            let mut waiting = Vec::new();
            for _ in 0..8 {
                let mut s = stream(100);
                s.try_next().await.unwrap().unwrap();
                waiting.push(s);
            }
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                stream(50).try_collect::<Vec<_>>(),
            )
            .await
            .expect("a stream waited for threads its neighbours held")
            .unwrap();
            assert_eq!(read.len(), 50);
            drop(waiting);
            // A source making its second batch until its reader leaves (a filter matching
            // nothing): the stream dropped, it sees the reader gone and ends.
            let mut s = on_blocking_threads(schema.clone(), "the scan of t".into(), move |gone| {
                let mut first = Some(last);
                std::iter::from_fn(move || {
                    if let Some(b) = first.take() {
                        return Some(Ok(b));
                    }
                    while !gone() {
                        std::thread::yield_now();
                    }
                    seen_by_source.store(true, std::sync::atomic::Ordering::SeqCst);
                    None
                })
            });
            s.try_next().await.unwrap().unwrap();
            drop(s);
        });
        // Shutting the runtime down waits for its blocking tasks: the one reading ahead
        // ends only once it sees its reader gone.
        drop(runtime);
        assert!(seen.load(std::sync::atomic::Ordering::SeqCst));
    }
}
