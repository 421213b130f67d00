//! Reading a snapshot: projection, predicates with pruning by chunk statistics, limits, and
//! sort-ordered output.

pub(crate) mod stop;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::array::{Array, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{FieldRef, Schema as ArrowSchema, SchemaRef};

use crate::error::{Error, Result};
use crate::index::chunk::Chunk;
use crate::index::merge::{BatchStream, Input, Merge, SortKey, align_batch};
use crate::index::version::Version;
use crate::manifest::BlockMeta;
use crate::predicate::ColumnStats;
use crate::predicate::Predicate;
use crate::predicate::bound::{self, Bound};
use crate::schema::{ColumnName, TableSchema, field_for};
use crate::storage::{BlockPlan, Storage};

/// Which columns a scan returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Projection {
    /// Every column of the snapshot's effective schema.
    #[default]
    All,
    /// These columns, in this order. A name is a concrete column (`timestamp`,
    /// `labels.pod`), or a dynamic family as a whole (`labels.*` or `labels`), which expands
    /// to its concrete columns in label order. A label never seen reads as all null.
    Columns(Vec<String>),
}

/// What to read from a table.
///
/// ```
/// use frostdb_core::{ScanRequest, col};
/// let request = ScanRequest::new()
///     .project(["labels.*", "value"])
///     .filter(col("value").gt(10))
///     .sorted(true)
///     .limit(100);
/// # let _ = request;
/// ```
#[derive(Debug, Clone, Default)]
pub struct ScanRequest {
    projection: Projection,
    filter: Option<Predicate>,
    prune: Option<Predicate>,
    limit: Option<usize>,
    sorted: bool,
    batch_rows: Option<usize>,
    lenient: bool,
}

impl ScanRequest {
    /// All columns, all rows, any order.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns only these columns (see [`Projection::Columns`]).
    pub fn project<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.projection = Projection::Columns(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the projection.
    pub fn projection(mut self, projection: Projection) -> Self {
        self.projection = projection;
        self
    }

    /// Returns only rows for which `predicate` is true (ANDed with any earlier filter).
    pub fn filter(mut self, predicate: Predicate) -> Self {
        self.filter = Some(match self.filter.take() {
            Some(p) => p.and(predicate),
            None => predicate,
        });
        self
    }

    /// Skips chunks, blocks, row groups and pages whose statistics show no row satisfies
    /// `predicate` (ANDed with any earlier one), which must hold for every row the filter
    /// selects: it is never evaluated on rows, so it narrows what is read at no cost per
    /// row (the full label sets of the series a selector selects, say).
    pub fn prune(mut self, predicate: Predicate) -> Self {
        self.prune = Some(match self.prune.take() {
            Some(p) => p.and(predicate),
            None => predicate,
        });
        self
    }

    /// Returns at most `rows` rows (the first ones in sort order when sorted).
    pub fn limit(mut self, rows: usize) -> Self {
        self.limit = Some(rows);
        self
    }

    /// Returns rows in the table's sort order.
    pub fn sorted(mut self, sorted: bool) -> Self {
        self.sorted = sorted;
        self
    }

    /// Skips a persisted block that cannot be read (or whose read fails midway) instead of
    /// failing the scan: the answer is then partial, and says so in
    /// [`ScanMetrics::blocks_failed`] and a logged error. Off by default: a scan that cannot
    /// read a block it needs fails with an error naming the block and the reason.
    pub fn lenient(mut self, lenient: bool) -> Self {
        self.lenient = lenient;
        self
    }

    /// Sets the rows per output batch of a sorted scan (default: the table's granule size).
    pub fn batch_rows(mut self, rows: usize) -> Self {
        self.batch_rows = Some(rows);
        self
    }
}

/// What a scan read and skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScanMetrics {
    /// L0 parts and granules in memory (active and rotated blocks).
    pub chunks: usize,
    /// Of those, skipped by their statistics without reading a row.
    pub chunks_pruned: usize,
    /// Persisted blocks in the snapshot.
    pub blocks: usize,
    /// Of those, skipped by the manifest's statistics before any object was fetched.
    pub blocks_pruned: usize,
    /// Of those, unreadable and skipped, wholly or from the failure on (lenient scans only:
    /// a scan is otherwise an error). Counts failures at planning, and at reading once the
    /// scan has been read to its end.
    pub blocks_failed: usize,
    /// Row groups of the blocks that were opened.
    pub row_groups: usize,
    /// Of those, skipped by row group or page statistics or by their key ranges.
    pub row_groups_pruned: usize,
    /// Of `row_groups_pruned`, those whose columns' statistics admitted the filter but whose
    /// range of sort keys (first and last row, in the block's footer) cannot hold a row
    /// satisfying it: a series whose labels each fall within a row group's bounds without
    /// the series being in it.
    pub row_groups_pruned_by_keys: usize,
    /// Rows of read row groups skipped by page statistics.
    pub rows_skipped_by_pages: usize,
    /// Rows in the chunks, row groups and pages that were read.
    pub rows_read: usize,
    /// Of the row groups read, those whose statistics prove every row satisfies the filter:
    /// read without the columns only the filter needs, and not filtered.
    pub row_groups_proven: usize,
    /// Of the row groups read, those whose statistics prove some of the filter's conjuncts
    /// but not all: read without the columns only the proven ones need, and filtered by
    /// the rest.
    pub row_groups_partly_proven: usize,
    /// Columns of read row groups filled in from exact statistics that show one value
    /// (counted per row group) rather than decoded.
    pub columns_from_statistics: usize,
}

impl std::ops::AddAssign for ScanMetrics {
    /// Adds the counts of another scan (a query made of several).
    fn add_assign(&mut self, o: Self) {
        self.chunks += o.chunks;
        self.chunks_pruned += o.chunks_pruned;
        self.blocks += o.blocks;
        self.blocks_pruned += o.blocks_pruned;
        self.blocks_failed += o.blocks_failed;
        self.row_groups += o.row_groups;
        self.row_groups_pruned += o.row_groups_pruned;
        self.rows_skipped_by_pages += o.rows_skipped_by_pages;
        self.rows_read += o.rows_read;
        self.row_groups_proven += o.row_groups_proven;
        self.row_groups_partly_proven += o.row_groups_partly_proven;
        self.row_groups_pruned_by_keys += o.row_groups_pruned_by_keys;
        self.columns_from_statistics += o.columns_from_statistics;
    }
}

/// A consistent, immutable view of a table: every transaction up to [`Snapshot::watermark`]
/// and none after.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) version: Arc<Version>,
    pub(crate) granule_rows: usize,
    pub(crate) storage: Option<Arc<Storage>>,
    pub(crate) table: String,
}

impl Snapshot {
    /// The highest transaction the snapshot contains.
    pub fn watermark(&self) -> u64 {
        self.version.watermark
    }

    /// The effective schema at this snapshot.
    pub fn schema(&self) -> &TableSchema {
        &self.version.schema
    }

    /// Rows in the snapshot.
    pub fn rows(&self) -> usize {
        self.version.rows()
    }

    /// The name of the table the snapshot is of.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The persisted blocks of the snapshot, oldest first.
    pub fn blocks(&self) -> Vec<BlockMeta> {
        self.version
            .blocks
            .iter()
            .map(|b| b.meta().clone())
            .collect()
    }

    /// The snapshot without its persisted blocks: only what is in memory (active and
    /// rotated blocks), for a query that reads the blocks elsewhere.
    pub fn memory(&self) -> Snapshot {
        Snapshot {
            version: Arc::new(Version {
                blocks: Arc::new(Vec::new()),
                ..(*self.version).clone()
            }),
            ..self.clone()
        }
    }

    /// Starts a scan.
    pub fn scan(&self, request: &ScanRequest) -> Result<Scan> {
        let planned = self.plan(request)?;
        let metrics = planned.metrics;
        let mut scan = self.assemble(planned)?;
        scan.metrics = metrics;
        Ok(scan)
    }

    /// Starts an unsorted scan split into up to `partitions` scans of similar size, to be
    /// read in parallel; together they return what [`Snapshot::scan`] would (a limit applies
    /// to each). A sorted scan is not split. Also returns what pruning did for the whole.
    pub fn scan_partitions(
        &self,
        request: &ScanRequest,
        partitions: usize,
    ) -> Result<(Vec<Scan>, ScanMetrics)> {
        let planned = self.plan(request)?;
        let metrics = planned.metrics;
        if request.sorted || partitions <= 1 {
            return Ok((vec![self.assemble(planned)?], metrics));
        }
        // Units of work: L0 parts, granules, and block row group ranges; assigned largest
        // first to the least loaded partition.
        enum Unit {
            Chunk(Arc<Chunk>),
            Block(BlockPlan),
        }
        let mut units: Vec<(usize, Unit)> = Vec::new();
        for c in planned.parts.iter().chain(planned.runs.iter().flatten()) {
            units.push((c.rows(), Unit::Chunk(c.clone())));
        }
        for b in planned.blocks.iter().cloned() {
            for piece in b.split(partitions) {
                units.push((piece.rows(), Unit::Block(piece)));
            }
        }
        units.sort_by_key(|u| std::cmp::Reverse(u.0));
        let mut load = vec![0usize; partitions];
        let mut groups: Vec<(Vec<Arc<Chunk>>, Vec<BlockPlan>)> =
            (0..partitions).map(|_| (Vec::new(), Vec::new())).collect();
        for (rows, unit) in units {
            let (i, _) = load
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| **l)
                .expect("at least one partition");
            load[i] += rows;
            match unit {
                Unit::Chunk(c) => groups[i].0.push(c),
                Unit::Block(b) => groups[i].1.push(b),
            }
        }
        let scans = groups
            .into_iter()
            .filter(|(c, b)| !c.is_empty() || !b.is_empty())
            .map(|(chunks, blocks)| {
                self.assemble(Planned {
                    parts: chunks,
                    runs: Vec::new(),
                    blocks,
                    metrics: ScanMetrics::default(),
                    ..planned.clone()
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let scans = if scans.is_empty() {
            vec![self.assemble(Planned {
                parts: Vec::new(),
                runs: Vec::new(),
                blocks: Vec::new(),
                ..planned
            })?]
        } else {
            scans
        };
        Ok((scans, metrics))
    }

    /// Resolves the request and prunes: what a scan will read.
    fn plan(&self, request: &ScanRequest) -> Result<Planned> {
        let schema = self.schema();
        let output = resolve_projection(&request.projection, schema)?;
        let filter = match &request.filter {
            Some(p) => bound::bind(p, schema)?,
            None => Bound::Const(true),
        };
        // What statistics are checked against: the filter and what else its rows satisfy.
        let prune = match &request.prune {
            Some(p) => Bound::And(vec![filter.clone(), bound::bind(p, schema)?]),
            None => filter.clone(),
        };
        let filter = Arc::new(filter);

        let mut metrics = ScanMetrics::default();
        let mut keep = |chunk: &Arc<Chunk>| {
            metrics.chunks += 1;
            let stats = |name: &str| Some(chunk.stats_of(name));
            if prune.may_match(&stats, chunk.rows()) {
                metrics.rows_read += chunk.rows();
                true
            } else {
                metrics.chunks_pruned += 1;
                false
            }
        };
        let (parts, runs) = self.version.memory_chunks();
        let parts: Vec<Arc<Chunk>> = parts.into_iter().filter(&mut keep).collect();
        let runs: Vec<Vec<Arc<Chunk>>> = runs
            .into_iter()
            .map(|r| r.into_iter().filter(|g| keep(g)).collect())
            .collect();

        let key = SortKey::new(schema);
        let work = if request.sorted {
            with_columns(&output, key.names(), schema)
        } else {
            output.clone()
        };
        let blocks = self.plan_blocks(&filter, &prune, &work, request.lenient, &mut metrics)?;
        Ok(Planned {
            output,
            work,
            filter,
            key,
            parts,
            runs,
            blocks,
            metrics,
            batch_rows: request.batch_rows.unwrap_or(self.granule_rows),
            limit: request.limit,
            sorted: request.sorted,
            lenient: request.lenient,
        })
    }

    /// Builds the stream of a planned scan.
    fn assemble(&self, planned: Planned) -> Result<Scan> {
        let Planned {
            output,
            work,
            filter,
            key,
            parts,
            runs,
            blocks,
            batch_rows,
            limit,
            sorted,
            lenient,
            ..
        } = planned;
        let failed = Arc::new(AtomicUsize::new(0));
        let stop = stop::Shared::current();
        let block_streams: Vec<BatchStream> = blocks
            .into_iter()
            .map(|plan| {
                let failed = lenient.then(|| failed.clone());
                self.read_block(plan, &work, batch_rows, failed, stop.clone())
            })
            .collect();
        let inner: BatchStream = if sorted {
            // Ranks need every dictionary value up front, which only in-memory data has.
            let key = if block_streams.is_empty() {
                key.with_ranks(parts.iter().chain(runs.iter().flatten()).map(|c| c.batch()))
            } else {
                key
            };
            let mut inputs: Vec<Input> = parts
                .iter()
                .map(|part| Input::unsorted_batch(filter_batch(part.batch(), &filter, &work)))
                .collect();
            for run in runs.into_iter().filter(|r| !r.is_empty()) {
                let (filter, work, stop) = (filter.clone(), work.clone(), stop.clone());
                inputs.push(Input::sorted(Box::new(run.into_iter().filter_map(
                    move |g| match stop.check() {
                        Some(error) => Some(Err(error)),
                        None => filter_batch(g.batch(), &filter, &work).transpose(),
                    },
                ))));
            }
            inputs.extend(block_streams.into_iter().map(Input::sorted));
            let merge = Merge::new(key, inputs, work, batch_rows, limit)?;
            let output = output.clone();
            Box::new(merge.map(move |b| b.and_then(|b| align_batch(&b, &output))))
        } else {
            let chunks = parts.into_iter().chain(runs.into_iter().flatten());
            let checked = stop.clone();
            let memory = chunks.filter_map(move |c| match checked.check() {
                Some(error) => Some(Err(error)),
                None => filter_batch(c.batch(), &filter, &work).transpose(),
            });
            Box::new(Limited {
                inner: memory.chain(block_streams.into_iter().flatten()),
                remaining: limit.unwrap_or(usize::MAX),
            })
        };
        Ok(Scan {
            schema: output,
            inner,
            metrics: ScanMetrics::default(),
            failed,
            stop: Some(stop),
        })
    }

    /// Exact statistics of `column` over the whole snapshot (memory and blocks); `None` when
    /// the snapshot has no rows.
    pub fn column_stats(&self, column: &str) -> Option<ColumnStats> {
        let (parts, runs) = self.version.memory_chunks();
        let mut acc: Option<ColumnStats> = None;
        let mut fold = |s: ColumnStats| match &mut acc {
            Some(a) => a.merge(&s),
            None => acc = Some(s),
        };
        for c in parts.iter().chain(runs.iter().flatten()) {
            fold(c.stats_of(column));
        }
        for b in self.version.blocks.iter() {
            fold(b.stats_of(column));
        }
        acc
    }

    /// Prunes persisted blocks by the manifest's statistics, then plans the rest (row group
    /// and page pruning from each footer).
    fn plan_blocks(
        &self,
        filter: &Bound,
        prune: &Bound,
        work: &SchemaRef,
        lenient: bool,
        metrics: &mut ScanMetrics,
    ) -> Result<Vec<BlockPlan>> {
        let Some(storage) = &self.storage else {
            return Ok(Vec::new());
        };
        let columns: Vec<String> = work.fields().iter().map(|f| f.name().clone()).collect();
        let mut plans = Vec::new();
        for block in self.version.blocks.iter() {
            metrics.blocks += 1;
            let stats = |name: &str| Some(block.stats_of(name));
            if !prune.may_match(&stats, block.rows as usize) {
                metrics.blocks_pruned += 1;
                continue;
            }
            let expected = self.schema().arrow_schema();
            match storage.plan(
                &self.table,
                block.clone(),
                filter,
                prune,
                &columns,
                expected,
            ) {
                Ok((plan, m)) => {
                    metrics.row_groups += m.row_groups;
                    metrics.row_groups_pruned += m.row_groups_pruned;
                    metrics.rows_skipped_by_pages += m.rows_skipped_by_pages;
                    metrics.row_groups_proven += m.row_groups_proven;
                    metrics.row_groups_partly_proven += m.row_groups_partly_proven;
                    metrics.row_groups_pruned_by_keys += m.row_groups_pruned_by_keys;
                    metrics.columns_from_statistics += m.columns_from_statistics;
                    for plan in plan {
                        metrics.rows_read += plan.rows();
                        plans.push(plan);
                    }
                }
                Err(error) if lenient => {
                    tracing::error!(%error, "lenient scan: skipping an unreadable block");
                    metrics.blocks_failed += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(plans)
    }

    fn read_block(
        &self,
        plan: BlockPlan,
        work: &SchemaRef,
        batch_rows: usize,
        lenient: Option<Arc<AtomicUsize>>,
        stop: stop::Shared,
    ) -> BatchStream {
        let storage = self
            .storage
            .as_ref()
            .expect("blocks are planned only with storage");
        // Filtered by what statistics do not prove of the plan's row groups.
        let filter = plan.filter.clone();
        let work = work.clone();
        let mut failed = false;
        Box::new(storage.read(plan, batch_rows).filter_map(move |batch| {
            if failed {
                return None;
            }
            if let Some(error) = stop.check() {
                failed = true;
                return Some(Err(error));
            }
            match batch {
                Ok(b) => filter_batch(&b, &filter, &work).transpose(),
                Err(error) => {
                    failed = true;
                    match &lenient {
                        Some(count) => {
                            tracing::error!(%error, "lenient scan: stopping the read of a block");
                            count.fetch_add(1, Ordering::Relaxed);
                            None
                        }
                        None => Some(Err(error)),
                    }
                }
            }
        }))
    }

    /// Runs a scan and collects its batches.
    pub fn collect(&self, request: &ScanRequest) -> Result<Vec<RecordBatch>> {
        self.scan(request)?.collect()
    }
}

/// A resolved, pruned scan, not yet started.
#[derive(Clone)]
struct Planned {
    output: SchemaRef,
    work: SchemaRef,
    filter: Arc<Bound>,
    key: SortKey,
    parts: Vec<Arc<Chunk>>,
    runs: Vec<Vec<Arc<Chunk>>>,
    blocks: Vec<BlockPlan>,
    metrics: ScanMetrics,
    batch_rows: usize,
    limit: Option<usize>,
    sorted: bool,
    lenient: bool,
}

/// Filters a batch (holding every column the filter reads) and aligns it onto `schema`;
/// `None` when no row is left.
fn filter_batch(
    source: &RecordBatch,
    filter: &Bound,
    schema: &SchemaRef,
) -> Result<Option<RecordBatch>> {
    let aligned = align_batch(source, schema)?;
    let batch = if filter.is_true() {
        aligned
    } else {
        let mask = filter.evaluate(source)?;
        if mask.true_count() == mask.len() && mask.null_count() == 0 {
            aligned
        } else {
            filter_record_batch(&aligned, &mask)?
        }
    };
    Ok((batch.num_rows() > 0).then_some(batch))
}

/// An iterator cut off after `remaining` rows.
struct Limited<I> {
    inner: I,
    remaining: usize,
}

impl<I: Iterator<Item = Result<RecordBatch>>> Iterator for Limited<I> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        let batch = match self.inner.next()? {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        let take = batch.num_rows().min(self.remaining);
        self.remaining -= take;
        Some(Ok(batch.slice(0, take)))
    }
}

/// A running scan: an iterator of batches that all have [`Scan::schema`].
pub struct Scan {
    schema: SchemaRef,
    inner: BatchStream,
    metrics: ScanMetrics,
    /// Blocks a lenient scan stopped reading midway.
    failed: Arc<AtomicUsize>,
    /// The condition this scan stops on ([`stop::stop_scans_when`], [`Scan::stop_when`]),
    /// checked before each batch it yields and each its sources read; taken once it held,
    /// so the scan then ends.
    stop: Option<stop::Shared>,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("schema", &self.schema)
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

impl Scan {
    /// The schema of every batch.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Stops the scan once `stop` gives a reason (checked before each batch it yields and
    /// each its sources read), as [`crate::stop_scans_when`] does for scans started under
    /// it: for a scan read on a thread of its own, by a reader that may leave.
    pub fn stop_when(&mut self, stop: impl Fn() -> Option<String> + Send + Sync + 'static) {
        if let Some(shared) = &self.stop {
            shared.set(stop);
        }
    }

    /// What the scan reads and skips; blocks whose read failed midway are counted once the
    /// scan has reached them (all of them once it has been read to its end).
    pub fn metrics(&self) -> ScanMetrics {
        let mut m = self.metrics;
        m.blocks_failed += self.failed.load(Ordering::Relaxed);
        m
    }
}

impl Iterator for Scan {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(stop) = &self.stop
            && let Some(error) = stop.check()
        {
            // Once: the scan ends after the error, as after any other.
            self.inner = Box::new(std::iter::empty());
            self.stop = None;
            return Some(Err(error));
        }
        self.inner.next()
    }
}

/// Resolves a projection to the output schema.
fn resolve_projection(projection: &Projection, schema: &TableSchema) -> Result<SchemaRef> {
    let names = match projection {
        Projection::All => return Ok(schema.arrow_schema().clone()),
        Projection::Columns(names) => names,
    };
    let definition = schema.definition();
    let arrow = schema.arrow_schema();
    let mut fields: Vec<FieldRef> = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |f: FieldRef, fields: &mut Vec<FieldRef>| {
        if seen.insert(f.name().clone()) {
            fields.push(f);
        }
    };
    for name in names {
        let family = name.strip_suffix(".*").unwrap_or(name);
        match definition.column(family) {
            Some((def, column)) if column.is_dynamic() => {
                for i in schema.family(def) {
                    push(arrow.fields()[i].clone(), &mut fields);
                }
            }
            _ if family.len() != name.len() => {
                return Err(Error::InvalidColumnName {
                    name: name.clone(),
                    reason: "only a dynamic column family can be projected with '.*'",
                });
            }
            _ => match schema.index_of(name) {
                Some(i) => push(arrow.fields()[i].clone(), &mut fields),
                None => {
                    let resolved = ColumnName::resolve(definition, name)?;
                    push(Arc::new(field_for(definition, &resolved)), &mut fields);
                }
            },
        }
    }
    Ok(Arc::new(ArrowSchema::new(fields)))
}

/// `output` plus the named columns of `schema` it lacks.
fn with_columns<'a>(
    output: &SchemaRef,
    names: impl Iterator<Item = &'a str>,
    schema: &TableSchema,
) -> SchemaRef {
    let mut fields: Vec<FieldRef> = output.fields().iter().cloned().collect();
    let present = crate::schema::FieldIndex::new(output);
    for name in names {
        if present.contains(name) {
            continue;
        }
        if let Some(i) = schema.index_of(name) {
            fields.push(schema.arrow_schema().fields()[i].clone());
        }
    }
    Arc::new(ArrowSchema::new(fields))
}
