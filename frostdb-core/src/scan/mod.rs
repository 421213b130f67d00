//! Reading a snapshot: projection, predicates with pruning by chunk statistics, limits, and
//! sort-ordered output.

pub(crate) mod bound;
pub(crate) mod predicate;

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{FieldRef, Schema as ArrowSchema, SchemaRef};

use crate::error::{Error, Result};
use crate::index::chunk::Chunk;
use crate::index::merge::{BatchStream, Input, Merge, SortKey, align_batch};
use crate::index::version::Version;
use crate::schema::{ColumnName, TableSchema, field_for};
use bound::Bound;
pub use predicate::{CmpOp, Col, Predicate, col};

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
    limit: Option<usize>,
    sorted: bool,
    batch_rows: Option<usize>,
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
    /// L0 parts and granules in the snapshot.
    pub chunks: usize,
    /// Of those, skipped by their statistics without reading a row.
    pub chunks_pruned: usize,
    /// Rows in the chunks that were read.
    pub rows_read: usize,
}

/// A consistent, immutable view of a table: every transaction up to [`Snapshot::watermark`]
/// and none after.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) version: Arc<Version>,
    pub(crate) granule_rows: usize,
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

    /// Starts a scan.
    pub fn scan(&self, request: &ScanRequest) -> Result<Scan> {
        let schema = self.schema();
        let output = resolve_projection(&request.projection, schema)?;
        let filter = match &request.filter {
            Some(p) => bound::bind(p, schema)?,
            None => Bound::Const(true),
        };
        let filter = Arc::new(filter);

        let mut metrics = ScanMetrics::default();
        let mut keep = |chunk: &Arc<Chunk>| {
            metrics.chunks += 1;
            let stats = |name: &str| chunk.stats_of(name);
            if filter.may_match(&stats, chunk.rows()) {
                metrics.rows_read += chunk.rows();
                true
            } else {
                metrics.chunks_pruned += 1;
                false
            }
        };
        let parts: Vec<Arc<Chunk>> = self
            .version
            .l0
            .iter()
            .map(|p| p.chunk.clone())
            .filter(&mut keep)
            .collect();
        let runs: Vec<Vec<Arc<Chunk>>> = self
            .version
            .levels
            .iter()
            .flatten()
            .map(|r| r.granules.iter().filter(|g| keep(g)).cloned().collect())
            .collect();

        let limit = request.limit;
        let inner: BatchStream = if request.sorted {
            let key = SortKey::new(schema)
                .with_ranks(parts.iter().chain(runs.iter().flatten()).map(|c| c.batch()));
            let work = with_columns(&output, key.names(), schema);
            let mut inputs: Vec<Input> = parts
                .iter()
                .map(|part| Input::unsorted_batch(read_chunk(part, &filter, &work)))
                .collect();
            for run in runs.into_iter().filter(|r| !r.is_empty()) {
                let (filter, work) = (filter.clone(), work.clone());
                inputs
                    .push(Input::sorted(Box::new(run.into_iter().filter_map(
                        move |g| read_chunk(&g, &filter, &work).transpose(),
                    ))));
            }
            let batch_rows = request.batch_rows.unwrap_or(self.granule_rows);
            let merge = Merge::new(key, inputs, work, batch_rows, limit)?;
            let output = output.clone();
            Box::new(merge.map(move |b| b.and_then(|b| align_batch(&b, &output))))
        } else {
            let work = output.clone();
            let chunks = parts.into_iter().chain(runs.into_iter().flatten());
            let batches = chunks.filter_map(move |c| read_chunk(&c, &filter, &work).transpose());
            Box::new(Limited {
                inner: batches,
                remaining: limit.unwrap_or(usize::MAX),
            })
        };
        Ok(Scan {
            schema: output,
            inner,
            metrics,
        })
    }

    /// Runs a scan and collects its batches.
    pub fn collect(&self, request: &ScanRequest) -> Result<Vec<RecordBatch>> {
        self.scan(request)?.collect()
    }
}

/// Filters one chunk and aligns it onto `schema`; `None` when no row is left.
fn read_chunk(chunk: &Chunk, filter: &Bound, schema: &SchemaRef) -> Result<Option<RecordBatch>> {
    let aligned = align_batch(chunk.batch(), schema)?;
    let batch = if filter.is_true() {
        aligned
    } else {
        let mask = filter.evaluate(chunk.batch())?;
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

    /// What the scan reads and skips.
    pub fn metrics(&self) -> ScanMetrics {
        self.metrics
    }
}

impl Iterator for Scan {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
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
    for name in names {
        if output.index_of(name).is_ok() {
            continue;
        }
        if let Some(i) = schema.index_of(name) {
            fields.push(schema.arrow_schema().fields()[i].clone());
        }
    }
    Arc::new(ArrowSchema::new(fields))
}
