//! Merges spread over processes with [datafusion-distributed]: a coordinator splits the
//! persisted blocks a merge reads among workers (other processes reading the same bucket),
//! each of which sums the values per stack of its blocks ([`merge_stacks`], the same
//! code a single process runs); DataFusion's two-stage aggregate adds the workers' sums by
//! stack id, across the network. Sums of integers in any order are the same sums: the
//! answer is the single process's, exactly.
//!
//! ```text
//!  coordinator                                  workers (N tasks)
//!  ProfileStore::merge ─ memory part: here      StackScanExec(blocks of task i)
//!        └─ blocks: Cluster::merge_stacks ───►    merge_stacks -> (stack, sum) rows
//!              SUM(value) GROUP BY stack   ◄───   partial aggregate, shuffled by stack
//! ```
//!
//! A worker opens nothing of its own: [`StackSource`] gives it the table a task names (in
//! the server, a read-only follower of the tenant's bucket), and the task carries the
//! blocks themselves (their manifest entries), so a worker whose view of the bucket is a
//! refresh behind still reads exactly the blocks the coordinator chose. A worker that dies
//! mid-query fails the query with an error naming the worker; nothing is answered from the
//! tasks that finished.
//!
//! [datafusion-distributed]: https://github.com/datafusion-contrib/datafusion-distributed

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::functions_aggregate::expr_fn::{max, sum};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion::prelude::{SessionConfig, SessionContext, col};
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt, DistributedMetricsFormat,
    ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse, SessionStateBuilderExt,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use frostdb_core::{BlockMeta, BlockSlice};
use serde::{Deserialize, Serialize};

pub use frostdb_query::distributed::WorkerConnections;
use frostdb_query::distributed::{Channels, WorkerUrls};

use crate::native::{StackTotals, merge_stacks};
use crate::schema::column::{PERIOD, STACKTRACE_ID, VALUE};
use crate::{Error, Result, Selector, TimeRange};

/// Where a process finds the tables the tasks it runs name.
pub trait StackSource: Send + Sync + fmt::Debug {
    /// Table `table` of tenant `tenant`'s profile store, as this process sees the bucket.
    fn table(&self, tenant: &str, table: &str) -> Result<frostdb_core::Table>;

    /// Threads one task reads its blocks with.
    fn threads(&self) -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    }
}

/// What the tasks of one merge read: the merge's selector and range, and per task the
/// blocks it sums (before the plan is split: one task with every block).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StackScan {
    tenant: String,
    table: String,
    /// The selector, as [`Selector::parse`] reads it.
    selector: String,
    start_ms: i64,
    end_ms: i64,
    lenient: bool,
    /// Checked against statistics only (see [`merge_stacks`]): the selected series.
    narrow: Option<frostdb_core::Predicate>,
    /// Per task, the blocks (or runs of row groups of blocks) it reads.
    tasks: Vec<Vec<BlockSlice>>,
    /// Columns of [`schema`] the plan reads (`None`: all).
    projection: Option<Vec<usize>>,
}

/// A task's answer: a row per stack with its sum, and one row without a stack holding the
/// total, the largest period, the rows read and the blocks a lenient read skipped.
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(STACKTRACE_ID, DataType::UInt64, true),
        Field::new(VALUE, DataType::Int64, false),
        Field::new(PERIOD, DataType::Int64, false),
        Field::new("rows", DataType::Int64, false),
        Field::new("blocks_failed", DataType::Int64, false),
    ]))
}

impl StackScan {
    fn schema(&self) -> DfResult<SchemaRef> {
        let all = schema();
        Ok(match &self.projection {
            Some(columns) => Arc::new(all.project(columns)?),
            None => all,
        })
    }

    /// The rows of [`schema`] for what a task summed.
    fn batch(&self, totals: &StackTotals) -> DfResult<RecordBatch> {
        let n = totals.stacks.len() + 1;
        let mut ids: Vec<Option<u64>> = totals.stacks.iter().map(|s| Some(s.0)).collect();
        ids.push(None);
        let mut values: Vec<i64> = totals.stacks.iter().map(|s| s.1).collect();
        values.push(totals.total);
        let summary = |v: i64| {
            let mut column = vec![0; n];
            column[n - 1] = v;
            Arc::new(Int64Array::from(column))
        };
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(UInt64Array::from(ids)),
                Arc::new(Int64Array::from(values)),
                summary(totals.period),
                summary(totals.rows as i64),
                summary(totals.metrics.blocks_failed as i64),
            ],
        )?;
        Ok(match &self.projection {
            Some(columns) => batch.project(columns)?,
            None => batch,
        })
    }
}

/// The leaf of a distributed merge: task `i` sums the values per stack of `tasks[i]`.
#[derive(Debug)]
pub struct StackScanExec {
    scan: StackScan,
    source: Option<Arc<dyn StackSource>>,
    properties: Arc<PlanProperties>,
}

impl StackScanExec {
    fn new(scan: StackScan, source: Option<Arc<dyn StackSource>>) -> DfResult<Self> {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(scan.schema()?),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            scan,
            source,
            properties,
        })
    }

    /// What every task reads.
    fn slices(&self) -> impl Iterator<Item = &BlockSlice> {
        self.scan.tasks.iter().flatten()
    }
}

impl DisplayAs for StackScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StackScanExec: tenant={}, table={}, selector={}, tasks=[",
            self.scan.tenant, self.scan.table, self.scan.selector
        )?;
        for (i, slices) in self.scan.tasks.iter().enumerate() {
            let rows: u64 = slices.iter().map(slice_rows).sum();
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} slices/~{rows} rows", slices.len())?;
        }
        f.write_str("]")
    }
}

impl ExecutionPlan for StackScanExec {
    fn name(&self) -> &str {
        "StackScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let task = datafusion_distributed::DistributedTaskContext::from_ctx(&context).task_index;
        // A task past the runs (a stage of more tasks than the merge has row groups) reads
        // nothing: every row group is in a run (`split`), so its answer is no stacks.
        let Some(blocks) = self.scan.tasks.get(task).cloned() else {
            let batch = self.scan.batch(&StackTotals::default())?;
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                batch.schema(),
                futures::stream::once(async move { Ok(batch) }),
            )));
        };
        let source = self.source.clone().ok_or_else(|| {
            DataFusionError::Execution(
                "this process has no profile stores to read blocks from (it only coordinates)"
                    .into(),
            )
        })?;
        let scan = self.scan.clone();
        let schema = scan.schema()?;
        // The session's pool: on a worker, the budget it serves tasks within.
        let memory = context.memory_pool().clone();
        // Held by the stream's future: once the coordinator drops the stream (its request
        // ended, or it failed), the merge's scans stop at their next batch.
        let wanted = Arc::new(());
        let still_wanted = Arc::downgrade(&wanted);
        let work = async move {
            let _wanted = wanted;
            tokio::task::spawn_blocking(move || -> DfResult<RecordBatch> {
                let selector = Selector::parse(&scan.selector)
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                let range = TimeRange {
                    start_ms: scan.start_ms,
                    end_ms: scan.end_ms,
                };
                let totals = (|| -> Result<StackTotals> {
                    let table = source.table(&scan.tenant, &scan.table)?;
                    let snapshot = table.snapshot_of_blocks(blocks)?;
                    let unwanted = move || {
                        (still_wanted.strong_count() == 0)
                            .then(|| "the merge's coordinator no longer reads it".to_owned())
                    };
                    frostdb_core::stop_scans_when(unwanted, || {
                        merge_stacks(
                            &snapshot,
                            &selector,
                            range,
                            source.threads(),
                            scan.lenient,
                            &memory,
                            scan.narrow.clone(),
                        )
                    })
                })()
                .map_err(|e| {
                    DataFusionError::External(
                        format!("tenant {:?}, table {:?}: {e}", scan.tenant, scan.table).into(),
                    )
                })?;
                scan.batch(&totals)
            })
            .await
            .map_err(|e| DataFusionError::Execution(format!("a merge task failed: {e}")))?
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(work),
        )))
    }
}

/// Serialises [`StackScanExec`] for the workers (JSON of what it reads), and gives the
/// decoded one this process's [`StackSource`].
#[derive(Debug, Clone)]
pub struct StackScanCodec {
    source: Option<Arc<dyn StackSource>>,
}

impl PhysicalExtensionCodec for StackScanCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return Err(DataFusionError::Internal(format!(
                "StackScanExec has no inputs, got {}",
                inputs.len()
            )));
        }
        let scan: StackScan = serde_json::from_slice(buf)
            .map_err(|e| DataFusionError::Internal(format!("decoding a StackScanExec: {e}")))?;
        Ok(Arc::new(StackScanExec::new(scan, self.source.clone())?))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let Some(exec) = node.downcast_ref::<StackScanExec>() else {
            return Err(DataFusionError::Internal(format!(
                "expected StackScanExec, got {}",
                node.name()
            )));
        };
        serde_json::to_writer(buf, &exec.scan)
            .map_err(|e| DataFusionError::Internal(format!("encoding a StackScanExec: {e}")))
    }
}

/// The leaf as a table, so that DataFusion plans the aggregate over it.
#[derive(Debug)]
struct StackScanTable {
    scan: StackScan,
    source: Option<Arc<dyn StackSource>>,
}

#[async_trait]
impl TableProvider for StackScanTable {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let scan = StackScan {
            projection: projection.cloned(),
            ..self.scan.clone()
        };
        Ok(Arc::new(StackScanExec::new(scan, self.source.clone())?))
    }
}

/// Rows of a slice, about (row groups are of about equal size within a block).
fn slice_rows(slice: &BlockSlice) -> u64 {
    match &slice.row_groups {
        None => slice.block.rows,
        Some(r) => {
            let groups = u64::from(slice.block.row_groups.max(1));
            slice.block.rows * u64::from(r.end - r.start) / groups
        }
    }
}

/// As many tasks as row groups (the planner caps them at the workers).
fn desired_tasks(ev: DesiredTaskCountEvent<'_>) -> Option<DfResult<DesiredTaskCountEventResponse>> {
    let exec = ev.plan.downcast_ref::<StackScanExec>()?;
    let groups: u64 = exec
        .slices()
        .map(|s| match &s.row_groups {
            None => u64::from(s.block.row_groups.max(1)),
            Some(r) => u64::from(r.end - r.start),
        })
        .sum();
    Some(Ok(DesiredTaskCountEventResponse::desired(
        groups.max(1) as usize
    )))
}

/// Splits what the merge reads into `task_count` runs of about as many rows: the blocks in
/// order, cut between row groups, so each task reads whole row groups of one or more
/// blocks.
fn scale_up(ev: ScaleUpLeafNodeEvent<'_>) -> Option<DfResult<ScaleUpLeafNodeEventResponse>> {
    let exec = ev.plan.downcast_ref::<StackScanExec>()?;
    let slices: Vec<BlockSlice> = exec.slices().cloned().collect();
    let scan = StackScan {
        tasks: split(&slices, ev.task_count.max(1)),
        ..exec.scan.clone()
    };
    Some(
        StackScanExec::new(scan, exec.source.clone())
            .map(|e| ScaleUpLeafNodeEventResponse::new(Arc::new(e))),
    )
}

/// `slices` cut into `tasks` runs of row groups of about equal rows: exactly as many runs
/// as tasks (the stage runs that many, each reading its run), fewer only when there are
/// fewer row groups. A run is cut once it holds its share of the rows, or when the row
/// groups left are as many as the runs still to make (a small block before a big one made
/// one run for two tasks, and the second task failed the merge).
fn split(slices: &[BlockSlice], tasks: usize) -> Vec<Vec<BlockSlice>> {
    // Every row group, with its slice and its rows.
    let units: Vec<(usize, u32, u64)> = slices
        .iter()
        .enumerate()
        .flat_map(|(i, slice)| {
            let per_group = slice.block.rows / u64::from(slice.block.row_groups.max(1));
            slice
                .row_groups
                .clone()
                .unwrap_or(0..slice.block.row_groups.max(1))
                .map(move |g| (i, g, per_group.max(1)))
        })
        .collect();
    let runs = tasks.min(units.len()).max(1);
    let total: u64 = units.iter().map(|u| u.2).sum();
    let target = total.div_ceil(runs as u64).max(1);
    let mut out: Vec<Vec<BlockSlice>> = Vec::with_capacity(runs);
    let mut run: Vec<BlockSlice> = Vec::new();
    let mut filled = 0u64;
    for (k, &(i, g, rows)) in units.iter().enumerate() {
        let slice = &slices[i];
        // Consecutive row groups of one slice make one range.
        match run.last_mut() {
            Some(last)
                if last.block.id == slice.block.id
                    && last.block.path == slice.block.path
                    && last.row_groups.as_ref().is_some_and(|r| r.end == g) =>
            {
                if let Some(r) = &mut last.row_groups {
                    r.end = g + 1;
                }
            }
            _ => run.push(BlockSlice {
                block: slice.block.clone(),
                row_groups: Some(g..g + 1),
            }),
        }
        filled += rows;
        let (left, to_make) = (units.len() - k - 1, runs - out.len() - 1);
        if to_make > 0 && (filled >= target || left == to_make) {
            out.push(std::mem::take(&mut run));
            filled = 0;
        }
    }
    if !run.is_empty() {
        out.push(run);
    }
    // A slice of a block's every row group reads the block whole.
    for slice in out.iter_mut().flatten() {
        if slice
            .row_groups
            .as_ref()
            .is_some_and(|r| r.start == 0 && r.end == slice.block.row_groups.max(1))
        {
            slice.row_groups = None;
        }
    }
    out
}

/// A coordinator of distributed merges over a fixed list of workers.
pub struct Cluster {
    workers: WorkerUrls,
    source: Option<Arc<dyn StackSource>>,
    /// How requests to workers carry the cluster's secret.
    channels: Channels,
    runtime: tokio::runtime::Runtime,
    /// Bytes of Arrow data the workers sent (network boundaries' `bytes_transferred`).
    bytes_moved: AtomicU64,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A coordinator sending the blocks of merges to `workers` (`http://host:port` of
    /// processes serving [`serve_worker_with`]); `source` lets it run a task itself when a
    /// merge is too small to spread (`None`: it never does).
    pub fn new(workers: &[String], source: Option<Arc<dyn StackSource>>) -> Result<Self> {
        let workers = WorkerUrls::parse(workers)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("frostdb-coordinator")
            .enable_all()
            .build()
            .map_err(|e| Error::Cluster(format!("starting a runtime: {e}")))?;
        Ok(Self {
            workers,
            source,
            channels: Channels::new(None)?,
            runtime,
            bytes_moved: AtomicU64::new(0),
        })
    }

    /// The same coordinator sending `secret` to its workers, which [`serve_worker_with`]
    /// requires when given one.
    pub fn with_secret(mut self, secret: Option<&str>) -> Result<Self> {
        self.channels = Channels::new(secret)?;
        Ok(self)
    }

    /// The workers.
    pub fn workers(&self) -> &[url::Url] {
        &self.workers.0
    }

    /// Bytes the workers have sent since the cluster was made.
    pub fn bytes_moved(&self) -> u64 {
        self.bytes_moved.load(Ordering::Relaxed)
    }

    /// A session of the coordinator whose operators (the final aggregate of every stack the
    /// workers send) reserve from `pool`: the store's query memory, as a merge on this node
    /// does. (DataFusion's default pool has no limit.)
    fn context(&self, pool: &Arc<dyn MemoryPool>) -> DfResult<SessionContext> {
        let codec = StackScanCodec {
            source: self.source.clone(),
        };
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .build_arc()?;
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_runtime_env(runtime)
            .with_config(SessionConfig::new().with_target_partitions(2))
            .with_distributed_worker_resolver(self.workers.clone())
            .with_distributed_channel_resolver(self.channels.clone())
            .with_distributed_planner()
            .with_distributed_user_codec(codec)
            .with_distributed_desired_task_count_handler(desired_tasks)
            .with_distributed_scale_up_leaf_node_handler(scale_up)
            .build();
        Ok(SessionContext::from(state))
    }

    /// The values summed per stack over `blocks` of tenant `tenant`'s table `table`, for
    /// the rows `selector` selects in `range`, read by the workers: what
    /// [`merge_stacks`] of a snapshot of those blocks answers (`narrow`: a predicate every
    /// selected row satisfies, checked against statistics only). Blocks until done.
    #[allow(clippy::too_many_arguments)]
    pub fn merge_stacks(
        &self,
        tenant: &str,
        table: &str,
        blocks: Vec<BlockMeta>,
        selector: &Selector,
        range: TimeRange,
        lenient: bool,
        narrow: Option<frostdb_core::Predicate>,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<StackTotals> {
        if blocks.is_empty() {
            return Ok(StackTotals::default());
        }
        let scan = StackScan {
            tenant: tenant.to_owned(),
            table: table.to_owned(),
            selector: selector.to_string(),
            start_ms: range.start_ms,
            end_ms: range.end_ms,
            lenient,
            narrow,
            tasks: vec![
                blocks
                    .into_iter()
                    .map(|block| BlockSlice {
                        block,
                        row_groups: None,
                    })
                    .collect(),
            ],
            projection: None,
        };
        let provider = Arc::new(StackScanTable {
            scan,
            source: self.source.clone(),
        });
        let ctx = self.context(pool)?;
        // The request's stop condition (its time limit, its client gone), checked while
        // the workers work: a merge for nobody is dropped, which ends its streams to them.
        let stopped = frostdb_core::stopped_now();
        if let Some(e) = stopped() {
            return Err(e.into());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let running = self.runtime.spawn(async move {
            let run = async {
                let df = ctx.read_table(provider)?.aggregate(
                    vec![col(STACKTRACE_ID)],
                    vec![
                        // Summed wide and clamped (`totals_of`): a stack's values saturate
                        // at i64's range, as one process's merge does, where the sum of
                        // two tasks' 2^62 wrapped to a negative total.
                        sum(datafusion::prelude::cast(
                            col(VALUE),
                            DataType::Decimal128(38, 0),
                        ))
                        .alias(VALUE),
                        max(col(PERIOD)).alias(PERIOD),
                        sum(col("rows")).alias("rows"),
                        sum(col("blocks_failed")).alias("blocks_failed"),
                    ],
                )?;
                let plan = df.create_physical_plan().await?;
                let batches =
                    datafusion::physical_plan::collect(plan.clone(), ctx.task_ctx()).await?;
                let plan = datafusion_distributed::rewrite_distributed_plan_with_metrics(
                    plan,
                    DistributedMetricsFormat::Aggregated,
                )
                .await?;
                if std::env::var("FROSTDB_DEBUG_PLAN").is_ok() {
                    eprintln!(
                        "{}",
                        datafusion_distributed::display_plan_ascii(plan.as_ref(), true)
                    );
                }
                Ok::<_, DataFusionError>((batches, bytes_transferred(&plan)))
            };
            let _ = tx.send(run.await);
        });
        let answer = loop {
            match rx.recv_timeout(STOP_CHECK_EVERY) {
                Ok(answer) => break answer,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(e) = stopped() {
                        running.abort();
                        return Err(e.into());
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Cluster("the coordinator's runtime stopped".into()));
                }
            }
        };
        let (batches, moved) = answer.map_err(|e| {
            let workers: Vec<&str> = self.workers.0.iter().map(|u| u.as_str()).collect();
            Error::Cluster(format!(
                "a merge spread over workers {} failed (no partial answer is given): {e}",
                workers.join(", ")
            ))
        })?;
        self.bytes_moved.fetch_add(moved, Ordering::Relaxed);
        // The answer (a row per stack) and its totals, held until the totals are made.
        let held = MemoryConsumer::new("the cluster's merged stacks").register(pool);
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        held.try_grow(
            batches
                .iter()
                .map(RecordBatch::get_array_memory_size)
                .sum::<usize>()
                .saturating_add(rows.saturating_mul(16)),
        )?;
        totals_of(&batches)
    }
}

/// How often a merge waiting on its workers checks whether its request still wants it.
const STOP_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// A cluster's merges for one tenant: what a profile store of that tenant reads its
/// persisted blocks with ([`crate::native::BlockMerger`]).
#[derive(Debug, Clone)]
pub struct TenantMerger {
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// The tenant the store holds.
    pub tenant: String,
}

impl crate::native::BlockMerger for TenantMerger {
    fn merge_stacks(
        &self,
        table: &str,
        blocks: Vec<BlockMeta>,
        selector: &Selector,
        range: TimeRange,
        lenient: bool,
        narrow: Option<frostdb_core::Predicate>,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<StackTotals> {
        self.cluster.merge_stacks(
            &self.tenant,
            table,
            blocks,
            selector,
            range,
            lenient,
            narrow,
            pool,
        )
    }
}

impl Cluster {
    /// Tenant `tenant`'s merges over this cluster: what its profile store reads persisted
    /// blocks with.
    pub fn merger(self: &Arc<Self>, tenant: &str) -> Arc<dyn crate::native::BlockMerger> {
        Arc::new(TenantMerger {
            cluster: self.clone(),
            tenant: tenant.to_owned(),
        })
    }
}

/// How a process takes part in a cluster of merges: the workers its merges spread over,
/// the address it serves merge tasks on, and the secret both sides require. Every program
/// that takes part (the server, the bench's `worker` and `--workers`) wires it through
/// [`Node::start`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// `http://host:port` of the workers this process's merges spread over; none: its
    /// merges run here.
    pub workers: Vec<String>,
    /// Where this process serves merge tasks (gRPC), if it does.
    pub listen: Option<SocketAddr>,
    /// The shared secret: sent to the workers, and required of whoever sends tasks here.
    pub secret: Option<String>,
    /// The process's memory budget, which the tasks served here reserve from (none: they
    /// are bounded only by the machine).
    pub memory_budget: Option<frostdb_core::MemoryBudget>,
    /// How the port serving merge tasks bounds its connections.
    pub connections: WorkerConnections,
}

impl ClusterOptions {
    /// Sets [`Self::workers`].
    pub fn workers(mut self, value: Vec<String>) -> Self {
        self.workers = value;
        self
    }

    /// Sets [`Self::listen`].
    pub fn listen(mut self, value: impl Into<Option<SocketAddr>>) -> Self {
        self.listen = value.into();
        self
    }

    /// Sets [`Self::secret`].
    pub fn secret(mut self, value: impl Into<Option<String>>) -> Self {
        self.secret = value.into();
        self
    }

    /// Sets [`Self::connections`].
    pub fn connections(mut self, value: WorkerConnections) -> Self {
        self.connections = value;
        self
    }

    /// Sets [`Self::memory_budget`].
    pub fn memory_budget(mut self, value: impl Into<Option<frostdb_core::MemoryBudget>>) -> Self {
        self.memory_budget = value.into();
        self
    }
}

/// A process's part in a cluster ([`ClusterOptions`]): a coordinator when it has workers,
/// a worker while it serves merge tasks.
#[derive(Debug)]
pub struct Node {
    cluster: Option<Arc<Cluster>>,
    listening: Option<SocketAddr>,
    worker: Option<tokio::task::JoinHandle<std::result::Result<(), String>>>,
}

impl Node {
    /// Wires `options` over `source`, the tables of this process's tenants: the merge
    /// tasks it serves read them, and a merge too small to spread runs on them here. Runs
    /// within a tokio runtime, on which the worker serves.
    pub async fn start(options: &ClusterOptions, source: Arc<dyn StackSource>) -> Result<Self> {
        let cluster = if options.workers.is_empty() {
            None
        } else {
            let cluster = Cluster::new(&options.workers, Some(source.clone()))?
                .with_secret(options.secret.as_deref())?;
            tracing::info!(workers = ?options.workers, "merges spread over workers");
            Some(Arc::new(cluster))
        };
        let (listening, worker) = match options.listen {
            Some(listen) => {
                let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
                    Error::Cluster(format!("cannot listen for merge tasks on {listen}: {e}"))
                })?;
                let at = listener.local_addr().ok();
                let secret = options.secret.clone();
                let connections = options.connections.clone();
                let memory =
                    frostdb_query::budgeted_memory_pool(None, options.memory_budget.as_ref());
                tracing::info!(
                    listen = ?at,
                    authenticated = secret.is_some(),
                    "serving merge tasks to the cluster (gRPC)"
                );
                let worker = tokio::spawn(async move {
                    let served = serve_worker_with(
                        listener,
                        source,
                        secret.as_deref(),
                        memory,
                        &connections,
                        std::future::pending(),
                    )
                    .await;
                    if let Err(e) = &served {
                        tracing::error!("merge worker stopped: {e}");
                    }
                    served
                });
                (at, Some(worker))
            }
            None => (None, None),
        };
        Ok(Self {
            cluster,
            listening,
            worker,
        })
    }

    /// The coordinator, when this process has workers.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// Where this process serves merge tasks, when it does.
    pub fn listening(&self) -> Option<SocketAddr> {
        self.listening
    }

    /// Serves merge tasks until the worker fails (never, else); at once without one.
    pub async fn serve(mut self) -> std::result::Result<(), String> {
        match self.worker.take() {
            Some(worker) => worker.await.map_err(|e| format!("merge worker: {e}"))?,
            None => Ok(()),
        }
    }

    /// Stops serving merge tasks; returns once the listener is closed.
    pub async fn stop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.abort();
            let _ = worker.await;
        }
    }
}

/// Bytes the network boundaries of `plan` received (from workers, and between them).
fn bytes_transferred(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    let mut bytes: u64 = plan.metrics().map_or(0, |metrics| {
        metrics
            .iter()
            .filter(|m| m.value().name() == "bytes_transferred")
            .map(|m| m.value().as_usize() as u64)
            .sum()
    });
    for child in plan.children() {
        bytes += bytes_transferred(child);
    }
    bytes
}

/// The merge's totals from the aggregate's rows (see [`schema`]).
fn totals_of(batches: &[RecordBatch]) -> Result<StackTotals> {
    let mut totals = StackTotals::default();
    for batch in batches {
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                Error::Cluster(format!("a distributed merge answered without {name}"))
            })
        };
        let ids = column(STACKTRACE_ID)?.as_primitive::<UInt64Type>();
        let values = column(VALUE)?
            .as_primitive_opt::<arrow::datatypes::Decimal128Type>()
            .ok_or_else(|| {
                Error::Cluster("a distributed merge's values are not decimals".into())
            })?;
        let clamped = |i: usize| {
            let v = values.value(i);
            i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
        };
        let periods = column(PERIOD)?.as_primitive::<Int64Type>();
        let rows = column("rows")?.as_primitive::<Int64Type>();
        let failed = column("blocks_failed")?.as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            if ids.is_null(i) {
                totals.total = totals.total.saturating_add(clamped(i));
                totals.period = totals.period.max(periods.value(i));
                totals.rows += rows.value(i) as usize;
                totals.metrics.blocks_failed += failed.value(i) as usize;
            } else if clamped(i) != 0 {
                totals.stacks.push((ids.value(i), clamped(i)));
            }
        }
    }
    totals.stacks.sort_unstable_by_key(|s| s.0);
    Ok(totals)
}

/// Serves this process as a worker of distributed merges on `listener` (gRPC), reading the
/// tables `source` gives, until `shutdown` completes ([`Node::start`] runs it). With
/// `secret`, it refuses every request not carrying it, as a [`Cluster::with_secret`] sends
/// it (see [`frostdb_query::distributed::serve_worker`]); without one it takes plans from
/// anyone who can reach it: a trusted network only.
pub async fn serve_worker_with(
    listener: tokio::net::TcpListener,
    source: Arc<dyn StackSource>,
    secret: Option<&str>,
    memory: Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
    connections: &WorkerConnections,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::result::Result<(), String> {
    let codec = StackScanCodec {
        source: Some(source),
    };
    frostdb_query::distributed::serve_worker(
        listener,
        codec,
        &["StackScanExec"],
        secret,
        memory,
        connections,
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(id: u64, rows: u64, row_groups: u32) -> BlockSlice {
        // (BlockMeta is non-exhaustive: made as the manifest would read it.)
        let block = serde_json::json!({"id": id, "path": format!("t/{id}.parquet"),
            "size": rows, "rows": rows, "row_groups": row_groups, "min_tx": 0, "max_tx": 0,
            "columns": {}});
        BlockSlice {
            block: serde_json::from_value(block).unwrap(),
            row_groups: None,
        }
    }

    /// Every row group of every block exactly once, in order.
    fn covered(tasks: &[Vec<BlockSlice>]) -> Vec<(u64, u32)> {
        tasks
            .iter()
            .flatten()
            .flat_map(|s| {
                let r = s.row_groups.clone().unwrap_or(0..s.block.row_groups);
                r.map(move |g| (s.block.id, g))
            })
            .collect()
    }

    #[test]
    fn blocks_split_into_runs_of_row_groups_of_similar_rows() {
        // One big block: cut between its row groups.
        let tasks = split(&[block(1, 300, 30)], 3);
        assert_eq!(tasks.len(), 3);
        for t in &tasks {
            assert_eq!(t.iter().map(slice_rows).sum::<u64>(), 100);
        }
        assert_eq!(covered(&tasks), (0..30).map(|g| (1, g)).collect::<Vec<_>>());
        // Small blocks stay whole; more tasks than row groups: one task per row group.
        let blocks = [block(1, 10, 1), block(2, 10, 1), block(3, 10, 1)];
        let tasks = split(&blocks, 8);
        assert_eq!(tasks.len(), 3);
        assert!(tasks.iter().flatten().all(|s| s.row_groups.is_none()));
        // A small block before a big one: still a run per task (one run for two tasks
        // failed the merge's second task).
        let tasks = split(&[block(1, 1, 1), block(2, 1000, 1)], 2);
        assert_eq!(tasks.len(), 2);
        let tasks = split(
            &[
                block(1, 1_000_000, 1),
                block(2, 50_000, 1),
                block(3, 50_000, 1),
                block(4, 50_000, 1),
                block(5, 50_000, 1),
            ],
            4,
        );
        assert_eq!(tasks.len(), 4);
        // Mixed: every row group once, in block order, exactly the tasks asked for.
        let blocks = [block(1, 1000, 10), block(2, 50, 1), block(3, 400, 4)];
        for n in 1..20 {
            let tasks = split(&blocks, n);
            assert_eq!(tasks.len(), n.min(15), "{n} tasks");
            let mut want = Vec::new();
            for b in &blocks {
                want.extend((0..b.block.row_groups).map(|g| (b.block.id, g)));
            }
            assert_eq!(covered(&tasks), want, "{n} tasks");
        }
    }
}
