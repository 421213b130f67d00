//! Reading a block: its footer (cached, with page indexes), pruning of row groups by their
//! statistics and of pages by the column index, and a stream of the projected columns of
//! what is left.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, UInt64Array};
use arrow::datatypes::SchemaRef;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowReaderBuilder, ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
    RowSelection, RowSelector,
};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};

use super::Storage;
use super::keys::RowGroupKeys;
use super::pages::Chunks;
use crate::error::{Error, Result};
use crate::manifest::BlockMeta;
use crate::predicate::ColumnStats;
use crate::predicate::bound::Bound;
use crate::scalar::Scalar;
use crate::schema::FieldIndex;

/// A block's object as Parquet's async reader wants it: ranged reads from the store, the
/// footer read with its known size.
#[derive(Debug, Clone)]
struct BlockFile {
    store: Arc<dyn object_store::ObjectStore>,
    path: ObjectPath,
    size: u64,
    /// The footer's column chunks, once it is read: every range fetched for pages is
    /// checked against them ([`super::pages`]).
    chunks: Option<Arc<Chunks>>,
}

fn external(e: object_store::Error) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(e))
}

impl AsyncFileReader for BlockFile {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<bytes::Bytes>> {
        use futures::{FutureExt, TryFutureExt};
        use object_store::ObjectStoreExt;
        self.store
            .get_range(&self.path, range)
            .map_err(external)
            .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<Vec<bytes::Bytes>>> {
        use futures::FutureExt;
        async move {
            if let Some(chunks) = &self.chunks {
                // Page reads lie within a column chunk: sized by the offset index, which
                // says where pages are, not what they may be.
                for range in &ranges {
                    chunks
                        .check_within(range.start, range.end - range.start)
                        .map_err(parquet::errors::ParquetError::General)?;
                }
            }
            let fetched = self
                .store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(external)?;
            if let Some(chunks) = &self.chunks {
                for (range, bytes) in ranges.iter().zip(&fetched) {
                    chunks
                        .check_pages(range.start, bytes)
                        .map_err(parquet::errors::ParquetError::General)?;
                }
            }
            Ok(fetched)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> futures::future::BoxFuture<
        'a,
        parquet::errors::Result<Arc<parquet::file::metadata::ParquetMetaData>>,
    > {
        use futures::FutureExt;
        use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
        async move {
            let size = self.size;
            let (tail, footer_start) = checked_tail(self).await?;
            let start = size - tail.len() as u64;
            // The footer first, without the page indexes: their ranges are checked, and
            // their bytes, before Parquet decodes them.
            let footer = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .with_page_index_policy(PageIndexPolicy::Skip)
                .with_prefetch_hint(Some(tail.len()))
                .load_and_finish(
                    Checked {
                        start,
                        bytes: tail,
                        what: "the footer",
                    },
                    size,
                )
                .await?;
            let region = checked_indexes(self, &footer, footer_start).await?;
            let mut reader =
                ParquetMetaDataReader::new_with_metadata(footer).with_arrow_reader_options(options);
            reader
                .load_page_index(Checked {
                    start: region.0,
                    bytes: region.1,
                    what: "page indexes",
                })
                .await?;
            Ok(Arc::new(reader.finish()?))
        }
        .boxed()
    }
}

/// The most bytes a block's footer (Parquet's `FileMetaData`) may take. The writer's are a
/// few hundred bytes a row group; a larger one is damage, or not ours.
const MAX_FOOTER_BYTES: u64 = 64 << 20;

/// What of a block's tail is read in the first request: the footer of a usual block whole.
const TAIL_PREFETCH: u64 = 64 << 10;

/// The tail of `file` holding its footer, checked before Parquet decodes it: a length
/// within the object and [`MAX_FOOTER_BYTES`], and a well-formed struct whose every list
/// fits in the footer's bytes ([`super::thrift::check_struct`]). Parquet itself reserves a
/// vector by the row-group list's declared count before reading one: a 30-byte footer
/// would ask for about 200 GB, which aborts the process where memory is not overcommitted.
/// Returns the tail, and where the footer starts.
async fn checked_tail(file: &mut BlockFile) -> parquet::errors::Result<(bytes::Bytes, u64)> {
    use parquet::errors::ParquetError;
    let size = file.size;
    if size < 12 {
        return Err(ParquetError::General(format!(
            "the object is {size} bytes, too short for a Parquet file"
        )));
    }
    let mut tail = file.get_bytes(size - TAIL_PREFETCH.min(size)..size).await?;
    let n = tail.len();
    if n < 8 || &tail[n - 4..] != b"PAR1" {
        return Err(ParquetError::General(
            "the object does not end in Parquet's magic bytes".into(),
        ));
    }
    let footer_len = u64::from(u32::from_le_bytes(
        tail[n - 8..n - 4].try_into().expect("4 bytes"),
    ));
    if footer_len > MAX_FOOTER_BYTES || footer_len + 12 > size {
        return Err(ParquetError::General(format!(
            "the footer declares {footer_len} bytes, in an object of {size} bytes (at most {MAX_FOOTER_BYTES} are read)"
        )));
    }
    if footer_len + 8 > n as u64 {
        tail = file.get_bytes(size - footer_len - 8..size).await?;
        if (tail.len() as u64) < footer_len + 8 {
            return Err(ParquetError::General(format!(
                "the object is shorter than the {size} bytes the manifest says"
            )));
        }
    }
    let footer = &tail[tail.len() - 8 - footer_len as usize..tail.len() - 8];
    super::thrift::check_struct(footer, &super::thrift::FILE_META_DATA, |_, _| {})
        .map_err(|e| ParquetError::General(format!("a malformed footer: {e}")))?;
    Ok((tail, size - 8 - footer_len))
}

/// The values of a decoded footer that Parquet trusts and the read relies on, checked
/// before anything uses them (Parquet asserts on some, and a panic on the planning thread
/// could not be skipped by a lenient scan): each row group's rows not negative; each
/// column chunk's offsets and sizes not negative and within the object of `size` bytes,
/// compressed with a codec this store writes (legacy LZ4's decoder ignores the size a page
/// declares); each offset index's pages from row 0, in order, within its row group (an
/// index of no page, which Parquet's reader reads as fewer rows, is found short by the
/// read, [`read_short`]).
fn check_footer_values(
    parquet: &parquet::file::metadata::ParquetMetaData,
    size: u64,
) -> std::result::Result<(), String> {
    use parquet::basic::Compression as C;
    let offsets = parquet.offset_index();
    for (r, rg) in parquet.row_groups().iter().enumerate() {
        if rg.num_rows() < 0 {
            return Err(format!("row group {r} declares {} rows", rg.num_rows()));
        }
        for (c, column) in rg.columns().iter().enumerate() {
            let at = || format!("row group {r}, column {c}");
            match column.compression() {
                C::UNCOMPRESSED | C::SNAPPY | C::ZSTD(_) | C::LZ4_RAW => {}
                other => {
                    return Err(format!(
                        "{}: codec {other} is not one this store writes",
                        at()
                    ));
                }
            }
            let start = column
                .dictionary_page_offset()
                .unwrap_or(column.data_page_offset());
            let (data, compressed) = (column.data_page_offset(), column.compressed_size());
            let end = u64::try_from(start)
                .ok()
                .zip(u64::try_from(compressed).ok())
                .and_then(|(start, len)| start.checked_add(len));
            if data < 0 || column.uncompressed_size() < 0 || end.is_none_or(|end| end > size) {
                return Err(format!(
                    "{}: bytes {start} to {start}+{compressed} (data at {data}) are not within \
                     the object's {size}",
                    at()
                ));
            }
            let Some(index) = offsets.and_then(|o| o.get(r)?.get(c)) else {
                continue;
            };
            let pages = index.page_locations();
            let mut next = 0;
            for (i, page) in pages.iter().enumerate() {
                let ok = if i == 0 {
                    page.first_row_index == 0
                } else {
                    page.first_row_index >= next && page.first_row_index < rg.num_rows()
                };
                if !ok || page.offset < 0 || page.compressed_page_size < 0 {
                    return Err(format!(
                        "{}: its offset index's page {i} is out of order",
                        at()
                    ));
                }
                next = page.first_row_index + 1;
            }
        }
    }
    Ok(())
}

/// Most bytes of a block's page indexes (column and offset indexes) together: the writer's
/// are tens of bytes a page.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The page indexes `footer` names, checked before Parquet decodes them: each range within
/// the object before the footer (at `footer_start`), no two overlapping (Parquet decodes
/// each chunk's index again, so one region named by every chunk would cost their number
/// times its size), [`MAX_INDEX_BYTES`] in all, and each a well-formed index
/// ([`super::thrift::OFFSET_INDEX`], [`super::thrift::COLUMN_INDEX`]: Parquet reserves an
/// offset index's pages by their declared count). Returns the region holding them, read,
/// and where it starts.
async fn checked_indexes(
    file: &mut BlockFile,
    footer: &parquet::file::metadata::ParquetMetaData,
    footer_start: u64,
) -> parquet::errors::Result<(u64, bytes::Bytes)> {
    use super::thrift::{COLUMN_INDEX, OFFSET_INDEX, Spec, check_struct};
    use parquet::errors::ParquetError;
    let mut ranges: Vec<(u64, u64, &'static Spec)> = Vec::new();
    for rg in footer.row_groups() {
        for column in rg.columns() {
            let named = [
                (
                    column.offset_index_offset(),
                    column.offset_index_length(),
                    &OFFSET_INDEX,
                ),
                (
                    column.column_index_offset(),
                    column.column_index_length(),
                    &COLUMN_INDEX,
                ),
            ];
            for (offset, length, spec) in named {
                let (Some(offset), Some(length)) = (offset, length) else {
                    continue;
                };
                let (Ok(offset), Ok(length)) = (u64::try_from(offset), u64::try_from(length))
                else {
                    return Err(ParquetError::General(format!(
                        "a page index at {offset} of {length} bytes"
                    )));
                };
                if offset < 4 || offset.saturating_add(length) > footer_start {
                    return Err(ParquetError::General(format!(
                        "a page index at bytes {offset}..{} lies outside the data before the footer at {footer_start}",
                        offset.saturating_add(length)
                    )));
                }
                ranges.push((offset, offset + length, spec));
            }
        }
    }
    if ranges.is_empty() {
        return Ok((0, bytes::Bytes::new()));
    }
    ranges.sort_by_key(|&(start, end, _)| (start, end));
    let mut total = 0u64;
    for pair in ranges.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(ParquetError::General(format!(
                "page indexes at bytes {}..{} and {}..{} overlap",
                pair[0].0, pair[0].1, pair[1].0, pair[1].1
            )));
        }
    }
    for &(start, end, _) in &ranges {
        total += end - start;
    }
    if total > MAX_INDEX_BYTES {
        return Err(ParquetError::General(format!(
            "the page indexes take {total} bytes, more than {MAX_INDEX_BYTES}"
        )));
    }
    let (first, last) = (ranges[0].0, ranges.iter().map(|r| r.1).max().unwrap_or(0));
    if last - first > 2 * MAX_INDEX_BYTES {
        return Err(ParquetError::General(format!(
            "the page indexes spread over bytes {first}..{last}"
        )));
    }
    let region = file.get_bytes(first..last).await?;
    if region.len() as u64 != last - first {
        return Err(ParquetError::General(format!(
            "the page indexes at bytes {first}..{last} were read as {} bytes",
            region.len()
        )));
    }
    for (start, end, spec) in ranges {
        let bytes = &region[(start - first) as usize..(end - first) as usize];
        check_struct(bytes, spec, |_, _| {}).map_err(|e| {
            ParquetError::General(format!("a malformed page index at byte {start}: {e}"))
        })?;
    }
    Ok((first, region))
}

/// Checked bytes of a block from `start` (its tail with the footer, or the region of its
/// page indexes): all Parquet's metadata reader is given to read; anything else it asks for
/// is refused, naming `what`.
struct Checked {
    start: u64,
    bytes: bytes::Bytes,
    what: &'static str,
}

impl parquet::arrow::async_reader::MetadataFetch for Checked {
    fn fetch(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> futures::future::BoxFuture<'_, parquet::errors::Result<bytes::Bytes>> {
        use futures::FutureExt;
        let end = self.start + self.bytes.len() as u64;
        let got = if range.start >= self.start && range.end <= end {
            Ok(self
                .bytes
                .slice((range.start - self.start) as usize..(range.end - self.start) as usize))
        } else {
            Err(parquet::errors::ParquetError::General(format!(
                "{} asked for at bytes {range:?}, outside those checked",
                self.what
            )))
        };
        async move { got }.boxed()
    }
}

/// A block's footer as cached: Parquet's metadata with page indexes, the row groups' key
/// ranges when the block has them, and statistics per column as plans check them,
/// converted from the footer when first asked for rather than once per query.
#[derive(Debug, Clone)]
pub(crate) struct Footer {
    arrow: ArrowReaderMetadata,
    /// The column chunks, for checking the page headers a read meets.
    chunks: Arc<Chunks>,
    keys: Option<Arc<RowGroupKeys>>,
    stats: Arc<parking_lot::Mutex<HashMap<String, Arc<ColumnStatistics>>>>,
    /// Statistics of the block that could not be read: logged once, then the block is read
    /// without pruning by them.
    unreadable: Arc<Unreadable>,
}

/// A block whose statistics (row group or page) cannot be converted: scans of it read every
/// row group and page those would have pruned, and the first failure is logged, once per
/// block, naming it.
#[derive(Debug)]
struct Unreadable {
    block: String,
    logged: std::sync::atomic::AtomicBool,
}

impl Unreadable {
    /// Logs `error` (of `column`'s statistics) unless one was logged for this block.
    fn log(&self, column: &str, error: &dyn std::fmt::Display) {
        if !self.logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(block = %self.block, column, %error, "a block's statistics cannot be read; it is read without pruning by them");
        }
    }
}

/// A block's statistics of one column.
#[derive(Debug)]
struct ColumnStatistics {
    column: String,
    unreadable: Arc<Unreadable>,
    /// Per row group; `None` when the file keeps none for the column (or lacks it).
    groups: Option<GroupStats>,
    /// Per row group, its pages' (`None` without a page index), converted when first used.
    pages: Vec<std::sync::OnceLock<Option<PageStats>>>,
}

/// A column's statistics per row group (`None`: unknown), and whether both bounds are exact.
#[derive(Debug)]
struct GroupStats {
    stats: Vec<Option<ColumnStats>>,
    exact: Vec<bool>,
}

impl GroupStats {
    fn get(&self, i: usize, exact: bool) -> Option<ColumnStats> {
        if exact && !self.exact.get(i).copied().unwrap_or(false) {
            return None;
        }
        self.stats.get(i)?.clone()
    }
}

/// What pruning did inside blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BlockScanMetrics {
    pub(crate) row_groups: usize,
    pub(crate) row_groups_pruned: usize,
    pub(crate) row_groups_proven: usize,
    pub(crate) row_groups_partly_proven: usize,
    pub(crate) row_groups_pruned_by_keys: usize,
    pub(crate) columns_from_statistics: usize,
    pub(crate) rows_skipped_by_pages: usize,
}

/// One row group to read: its index, the rows its pages narrowed it to (`None`: all), and
/// how many rows that is.
#[derive(Debug, Clone)]
struct RowGroupPlan {
    index: usize,
    pages: Option<Vec<RowSelector>>,
    rows: usize,
    total: usize,
}

/// What to read of one block.
#[derive(Debug, Clone)]
pub(crate) struct BlockPlan {
    pub(crate) table: String,
    pub(crate) block: Arc<super::Block>,
    metadata: ArrowReaderMetadata,
    chunks: Arc<Chunks>,
    row_groups: Vec<RowGroupPlan>,
    projection: Vec<usize>,
    /// What the planned rows are still filtered by: the scan's filter less the conjuncts
    /// their row groups' statistics prove (read without the columns only those need).
    pub(crate) filter: Arc<Bound>,
    /// Columns whose exact statistics show one value in every planned row group (a sampling
    /// period, say): not decoded, but filled in.
    constants: Vec<(String, Scalar)>,
}

impl BlockPlan {
    /// Rows the plan reads.
    pub(crate) fn rows(&self) -> usize {
        self.row_groups.iter().map(|r| r.rows).sum()
    }

    /// Splits the plan into up to `n` plans of whole row groups with similar row counts
    /// (for parallel reads).
    pub(crate) fn split(self, n: usize) -> Vec<BlockPlan> {
        if n <= 1 || self.row_groups.len() <= 1 {
            return vec![self];
        }
        let total = self.rows();
        let per = total.div_ceil(n).max(1);
        let mut out: Vec<BlockPlan> = Vec::new();
        let mut current: Vec<RowGroupPlan> = Vec::new();
        let mut rows = 0;
        for rg in self.row_groups.iter().cloned() {
            rows += rg.rows;
            current.push(rg);
            if rows >= per && out.len() + 1 < n {
                out.push(BlockPlan {
                    row_groups: std::mem::take(&mut current),
                    ..self.clone()
                });
                rows = 0;
            }
        }
        if !current.is_empty() {
            out.push(BlockPlan {
                row_groups: current,
                ..self
            });
        }
        out
    }
}

fn unreadable(table: &str, block: &BlockMeta, reason: impl Into<String>) -> Error {
    Error::BlockUnreadable {
        table: table.to_owned(),
        block: block.id,
        path: block.path.clone(),
        reason: reason.into(),
    }
}

/// Statistics of one column over row groups or pages, as Arrow arrays.
struct ColumnStatsArrays {
    mins: ArrayRef,
    maxes: ArrayRef,
    nulls: UInt64Array,
}

impl ColumnStatsArrays {
    /// Statistics of entry `i` covering `rows` rows; `None` when unknown.
    fn get(&self, i: usize, rows: usize) -> Option<ColumnStats> {
        if self.nulls.is_null(i) {
            return None;
        }
        let null_count = self.nulls.value(i) as usize;
        let scalar = |a: &ArrayRef| match Scalar::from_array(a.as_ref(), i) {
            Scalar::Null => None,
            s => Some(s),
        };
        let (min, max) = (scalar(&self.mins), scalar(&self.maxes));
        // Missing bounds with non-null values: the writer kept no statistics; unknown.
        if (min.is_none() || max.is_none()) && null_count < rows {
            return None;
        }
        Some(ColumnStats {
            min,
            max,
            null_count,
        })
    }
}

impl Storage {
    /// The footer of `block`: read, and cached while it is among the most recently read
    /// ([`super::FOOTER_CACHE_BYTES`]).
    pub(crate) fn metadata(&self, table: &str, block: &BlockMeta) -> Result<Footer> {
        if let Some(m) = self.metadata.lock().get(&block.path) {
            return Ok(m);
        }
        let mut reader = BlockFile {
            store: self.store.clone(),
            path: ObjectPath::from(block.path.as_str()),
            size: block.size,
            chunks: None,
        };
        let loaded = self.io.run(async move {
            let options = ArrowReaderOptions::new()
                .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
            ArrowReaderMetadata::load_async(&mut reader, options).await
        });
        // arrow-ipc 59 panics on some malformed schemas (the footer's `ARROW:schema`, as in
        // a WAL record): that block is unreadable, named, not the database closed.
        let metadata = match loaded {
            Ok(loaded) => loaded.map_err(|e| unreadable(table, block, e.to_string()))?,
            Err(Error::Internal(panicked)) => {
                return Err(unreadable(
                    table,
                    block,
                    format!("decoding its footer failed: {panicked}"),
                ));
            }
            Err(e) => return Err(e),
        };
        let rows = metadata
            .metadata()
            .row_groups()
            .iter()
            .try_fold(0i64, |sum, rg| sum.checked_add(rg.num_rows()))
            .unwrap_or(-1);
        if rows as u64 != block.rows {
            return Err(unreadable(
                table,
                block,
                format!("holds {rows} rows, the manifest says {}", block.rows),
            ));
        }
        let parquet = metadata.metadata();
        check_footer_values(parquet, block.size).map_err(|e| unreadable(table, block, e))?;
        let keys = RowGroupKeys::from_footer(
            parquet.file_metadata().key_value_metadata(),
            parquet.num_row_groups(),
        )
        .map(Arc::new);
        let footer = Footer {
            chunks: Arc::new(Chunks::new(parquet)),
            arrow: metadata,
            keys,
            stats: Arc::default(),
            unreadable: Arc::new(Unreadable {
                block: block.path.clone(),
                logged: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        let bytes = footer.arrow.metadata().memory_size() + footer.chunks.memory_size();
        self.metadata
            .lock()
            .insert(block.path.clone(), footer.clone(), bytes);
        Ok(footer)
    }

    /// Plans the read of `columns` of `block` (and the columns `filter` reads, where
    /// statistics do not prove every row satisfies it) for rows that may satisfy `filter`
    /// and `prune` (`filter` and what else the selected rows satisfy, only ever checked
    /// against statistics): one plan per run of row groups that are proven or not; none when
    /// statistics prove no row does.
    pub(crate) fn plan(
        &self,
        table: &str,
        block: Arc<super::Block>,
        filter: &Bound,
        prune: &Bound,
        columns: &[String],
        expected: &SchemaRef,
    ) -> Result<(Vec<BlockPlan>, BlockScanMetrics)> {
        let footer = self.metadata(table, &block)?;
        let Footer {
            arrow: metadata,
            keys,
            chunks,
            ..
        } = &footer;
        // Key ranges are checked where the prune bound fixes a prefix of the sort key.
        let key_check = keys.as_ref().and_then(|k| Some((k, k.checker(prune)?)));
        let file_schema = metadata.schema().clone();
        let parquet = metadata.metadata().clone();
        // Columns are looked up by name many times below: once indexed, not scanned each time.
        let in_file = FieldIndex::new(&file_schema);
        let in_table = FieldIndex::new(expected);
        for field in file_schema.fields() {
            if let Some(want) = in_table.get(field.name()).map(|i| expected.field(i))
                && want.data_type() != field.data_type()
            {
                return Err(unreadable(
                    table,
                    &block,
                    format!(
                        "column {:?} is {} in the file, the table has {}",
                        field.name(),
                        field.data_type(),
                        want.data_type()
                    ),
                ));
            }
        }
        // A column the manifest says holds values must be in the file: read as absent (all
        // null), its rows would be pruned from every answer that asks for a value of it,
        // and the answer given without them.
        if let Some(name) = block
            .columns
            .iter()
            .find(|(name, stats)| stats.null_count < block.rows as usize && !in_file.contains(name))
            .map(|(name, _)| name)
        {
            return Err(unreadable(
                table,
                &block,
                format!("column {name:?} holds values by the manifest, and the file lacks it"),
            ));
        }
        let row_groups = parquet.row_groups();
        if let Some(slice) = block.row_groups()
            && slice.end as usize > row_groups.len()
        {
            return Err(unreadable(
                table,
                &block,
                format!(
                    "row groups {}..{} were asked for, the block has {}",
                    slice.start,
                    slice.end,
                    row_groups.len()
                ),
            ));
        }
        let mut metrics = BlockScanMetrics {
            row_groups: (0..row_groups.len())
                .filter(|&i| block.reads_row_group(i))
                .count(),
            ..Default::default()
        };
        // Read columns that may hold one value per row group: primitive ones.
        let candidates: Vec<&String> = columns
            .iter()
            .filter(|c| {
                in_file
                    .get(c)
                    .is_some_and(|i| file_schema.field(i).data_type().is_primitive())
            })
            .collect();
        let mut stats_columns: Vec<String> = candidates.iter().map(|c| (*c).clone()).collect();
        filter.columns(&mut stats_columns);
        prune.columns(&mut stats_columns);
        stats_columns.sort();
        stats_columns.dedup();
        let rg_stats: Vec<Arc<ColumnStatistics>> =
            stats_columns.iter().map(|c| footer.column(c)).collect();

        // The row groups whose key ranges may hold the bound's series, by binary search
        // where it applies; the rest are skipped without a look at their statistics.
        let in_range: Vec<usize> = match key_check
            .as_ref()
            .and_then(|(keys, check)| keys.candidates(check))
        {
            Some(found) => {
                let skipped = row_groups.len() - found.len();
                metrics.row_groups_pruned += skipped;
                metrics.row_groups_pruned_by_keys += skipped;
                found
            }
            None => (0..row_groups.len()).collect(),
        };
        // A slice of the block: only its row groups (the others are other tasks').
        let in_range: Vec<usize> = in_range
            .into_iter()
            .filter(|&i| block.reads_row_group(i))
            .collect();
        let mut selected = Vec::new();
        for i in in_range {
            let rg = &row_groups[i];
            let rows = rg.num_rows() as usize;
            // Statistics of a column in this row group (`exact`: only bounds not truncated);
            // a column the file lacks is all null.
            let of = |name: &str, exact: bool| -> Option<ColumnStats> {
                match rg_stats
                    .iter()
                    .find(|s| s.column == name)
                    .map(|s| &s.groups)
                {
                    Some(Some(stats)) => stats.get(i, exact),
                    Some(None) if !in_file.contains(name) => Some(ColumnStats::all_null(rows)),
                    _ => None,
                }
            };
            if !prune.may_match(&|name: &str| of(name, false), rows) {
                metrics.row_groups_pruned += 1;
                continue;
            }
            if let Some((keys, check)) = &key_check
                && keys.excludes(check, i)
            {
                metrics.row_groups_pruned += 1;
                metrics.row_groups_pruned_by_keys += 1;
                continue;
            }
            let mut proof = Vec::new();
            let residual = filter.residual(&|name: &str| of(name, true), rows, &mut proof);
            let constants: Vec<(String, Scalar)> = candidates
                .iter()
                .filter_map(|c| match of(c, true)? {
                    ColumnStats {
                        min: Some(min),
                        max: Some(max),
                        null_count: 0,
                    } if min == max => Some(((*c).clone(), min)),
                    _ => None,
                })
                .collect();
            let pages = page_selection(prune, rows, &|name: &str| {
                rg_stats
                    .iter()
                    .find(|s| s.column == name)?
                    .pages(i, metadata)
            });
            let plan = match pages {
                Some(selection) if !selection.selects_any() => {
                    metrics.row_groups_pruned += 1;
                    continue;
                }
                Some(selection) => {
                    let kept = selection.row_count();
                    metrics.rows_skipped_by_pages += rows - kept;
                    RowGroupPlan {
                        index: i,
                        pages: Some(selection.into()),
                        rows: kept,
                        total: rows,
                    }
                }
                None => RowGroupPlan {
                    index: i,
                    pages: None,
                    rows,
                    total: rows,
                },
            };
            if residual.is_true() {
                metrics.row_groups_proven += 1;
            } else if proof.contains(&true) {
                metrics.row_groups_partly_proven += 1;
            }
            selected.push(((proof, constants), residual, plan));
        }
        // Runs of row groups with the same conjuncts proven share a plan: read without the
        // columns only the proven conjuncts need, and filtered by the rest.
        // Constant columns are filled in rather than read, but one column is always read: a
        // read of none would yield no rows.
        let projection = |residual: &Bound, constants: &mut Vec<(String, Scalar)>| {
            let mut needed = Vec::new();
            residual.columns(&mut needed);
            let read = |constants: &[(String, Scalar)]| -> Vec<usize> {
                let constant: std::collections::HashSet<&str> =
                    constants.iter().map(|(k, _)| k.as_str()).collect();
                columns
                    .iter()
                    .filter(|c| !constant.contains(c.as_str()))
                    .chain(&needed)
                    .filter_map(|c| in_file.get(c))
                    .collect::<std::collections::BTreeSet<usize>>()
                    .into_iter()
                    .collect()
            };
            let mut projection = read(constants);
            if projection.is_empty() && !constants.is_empty() {
                constants.remove(0);
                projection = read(constants);
            }
            projection
        };
        let mut plans: Vec<(_, BlockPlan)> = Vec::new();
        for (key, residual, rg) in selected {
            match plans.last_mut() {
                Some((last, plan)) if *last == key => plan.row_groups.push(rg),
                _ => {
                    let mut constants = key.1.clone();
                    plans.push((
                        key,
                        BlockPlan {
                            table: table.to_owned(),
                            block: block.clone(),
                            metadata: metadata.clone(),
                            chunks: chunks.clone(),
                            projection: projection(&residual, &mut constants),
                            filter: Arc::new(residual),
                            constants,
                            row_groups: vec![rg],
                        },
                    ))
                }
            }
        }
        let plans: Vec<BlockPlan> = plans.into_iter().map(|(_, plan)| plan).collect();
        metrics.columns_from_statistics = plans
            .iter()
            .map(|p| p.constants.len() * p.row_groups.len())
            .sum();
        Ok((plans, metrics))
    }

    /// Streams the planned rows, `batch_rows` at a time. A block in a local directory is
    /// read from its file and decoded on the calling thread as batches are asked for: page
    /// reads of a file are cheaper than handing each one to another thread. Otherwise the
    /// read starts when the first batch is asked for, runs on the I/O runtime and hands
    /// batches over through a channel of two, so a slow consumer holds back the read
    /// instead of buffering the block (and no runtime thread ever blocks on it).
    pub(crate) fn read(
        &self,
        plan: BlockPlan,
        batch_rows: usize,
    ) -> impl Iterator<Item = Result<RecordBatch>> + Send + 'static {
        let file = self.local.as_ref().and_then(|local| {
            local
                .path_to_filesystem(&ObjectPath::from(plan.block.path.as_str()))
                .ok()
        });
        BlockStream::Pending {
            plan,
            batch_rows,
            store: self.store.clone(),
            io: self.io.clone(),
            file,
        }
    }
}

/// A block's batches; see [`Storage::read`].
enum BlockStream {
    Pending {
        plan: BlockPlan,
        batch_rows: usize,
        store: Arc<dyn object_store::ObjectStore>,
        io: crate::io::Io,
        /// The block's file, when the store is a local directory.
        file: Option<std::path::PathBuf>,
    },
    /// Read on the I/O runtime: its batches, then `Ok(None)` at the block's end. A channel
    /// closed before that (the read's task ended otherwise: a decoder that panicked) is
    /// an error, never the block's end: what was not read is not an answer.
    Remote {
        rx: tokio::sync::mpsc::Receiver<Result<Option<RecordBatch>>>,
        table: String,
        block: Arc<super::Block>,
    },
    /// Read here from the local file.
    Local {
        reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
        fill: Constants,
        table: String,
        block: Arc<super::Block>,
        /// Rows read, of those planned.
        read: usize,
        planned: usize,
    },
    Done,
}

impl Iterator for BlockStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if matches!(self, BlockStream::Pending { .. }) {
            let BlockStream::Pending {
                plan,
                batch_rows,
                store,
                io,
                file,
            } = std::mem::replace(self, BlockStream::Done)
            else {
                unreachable!("matched above")
            };
            match file {
                Some(file) => match open_local(plan, batch_rows, &file) {
                    Ok(local) => *self = local,
                    Err(e) => return Some(Err(e)),
                },
                None => {
                    let (tx, rx) = tokio::sync::mpsc::channel(2);
                    let (table, block) = (plan.table.clone(), plan.block.clone());
                    io.spawn(read_block(plan, batch_rows, store, tx));
                    *self = BlockStream::Remote { rx, table, block };
                }
            }
        }
        match self {
            // Waits without a runtime of its own, so it may be called from any thread.
            BlockStream::Remote { rx, table, block } => {
                let next = match futures::executor::block_on(rx.recv()) {
                    Some(Ok(Some(batch))) => return Some(Ok(batch)),
                    Some(Ok(None)) => None,
                    Some(Err(e)) => Some(Err(e)),
                    None => Some(Err(unreadable(
                        table,
                        block,
                        "its read stopped before the block's end (the reader failed)",
                    ))),
                };
                *self = BlockStream::Done;
                next
            }
            BlockStream::Local {
                reader,
                fill,
                table,
                block,
                read,
                planned,
            } => {
                let Some(batch) = reader.next() else {
                    let short =
                        (*read != *planned).then(|| read_short(table, block, *read, *planned));
                    *self = BlockStream::Done;
                    return short.map(Err);
                };
                let batch = batch
                    .map_err(|e| e.to_string())
                    .and_then(|b| fill.add(b).map_err(|e| e.to_string()));
                match batch {
                    Ok(batch) => {
                        *read += batch.num_rows();
                        Some(Ok(batch))
                    }
                    Err(e) => {
                        let e = unreadable(table, block, e);
                        *self = BlockStream::Done;
                        Some(Err(e))
                    }
                }
            }
            BlockStream::Pending { .. } | BlockStream::Done => None,
        }
    }
}

/// What a read of a plan needs, however it reads: the block, its footer, the constant
/// columns to fill in, and what to read of it.
struct Prepared {
    table: String,
    block: Arc<super::Block>,
    metadata: ArrowReaderMetadata,
    chunks: Arc<Chunks>,
    fill: Constants,
    read: Selected,
    /// The rows the read yields: fewer (pages that hold fewer rows than the footer says)
    /// is an error, never a short answer.
    rows: usize,
}

/// The error of a block whose read ended after `read` of the `planned` rows.
fn read_short(table: &str, block: &super::Block, read: usize, planned: usize) -> Error {
    unreadable(
        table,
        block,
        format!("its read ended after {read} of the {planned} rows its footer plans"),
    )
}

/// The row groups, the rows of their pages and the columns a plan reads.
struct Selected {
    row_groups: Vec<usize>,
    selection: Option<RowSelection>,
    mask: ProjectionMask,
    batch_rows: usize,
}

impl Selected {
    /// `builder` (the sync or the async reader's) set to read these.
    fn apply<T>(self, builder: ArrowReaderBuilder<T>) -> ArrowReaderBuilder<T> {
        let builder = builder
            .with_row_groups(self.row_groups)
            .with_projection(self.mask)
            .with_batch_size(self.batch_rows);
        match self.selection {
            Some(selection) => builder.with_row_selection(selection),
            None => builder,
        }
    }
}

fn prepare(plan: BlockPlan, batch_rows: usize) -> std::result::Result<Prepared, Error> {
    let rows = plan.rows();
    let BlockPlan {
        table,
        block,
        metadata,
        chunks,
        row_groups,
        projection,
        constants,
        ..
    } = plan;
    let selection = row_groups.iter().any(|r| r.pages.is_some()).then(|| {
        let selectors: Vec<RowSelector> = row_groups
            .iter()
            .flat_map(|r| match &r.pages {
                Some(pages) => pages.clone(),
                None => vec![RowSelector::select(r.total)],
            })
            .collect();
        RowSelection::from(selectors)
    });
    let row_groups: Vec<usize> = row_groups.iter().map(|r| r.index).collect();
    let fill = Constants::new(constants, metadata.schema(), batch_rows)
        .map_err(|e| unreadable(&table, &block, e.to_string()))?;
    let mask = ProjectionMask::roots(
        metadata.metadata().file_metadata().schema_descr(),
        projection,
    );
    Ok(Prepared {
        table,
        block,
        metadata,
        chunks,
        fill,
        read: Selected {
            row_groups,
            selection,
            mask,
            batch_rows,
        },
        rows,
    })
}

/// Starts reading `plan` from the block's local file.
fn open_local(plan: BlockPlan, batch_rows: usize, path: &std::path::Path) -> Result<BlockStream> {
    let Prepared {
        table,
        block,
        metadata,
        chunks,
        fill,
        read,
        rows,
    } = prepare(plan, batch_rows)?;
    let fail = |e: &dyn std::fmt::Display| unreadable(&table, &block, e.to_string());
    let file = std::fs::File::open(path)
        .map_err(|e| fail(&format_args!("opening {}: {e}", path.display())))?;
    let file = LocalFile {
        file: Arc::new(file),
        size: block.size,
        chunks,
    };
    let reader = read
        .apply(ParquetRecordBatchReaderBuilder::new_with_metadata(
            file, metadata,
        ))
        .build()
        .map_err(|e| fail(&e))?;
    Ok(BlockStream::Local {
        reader,
        fill,
        table,
        block,
        read: 0,
        planned: rows,
    })
}

/// A block's local file as Parquet's reader wants it: positioned reads (`pread`), so
/// readers of its column chunks share one descriptor without seeking it.
struct LocalFile {
    file: Arc<std::fs::File>,
    size: u64,
    chunks: Arc<Chunks>,
}

impl LocalFile {
    /// Checks the page header Parquet is about to read at `start` ([`super::pages`]): the
    /// writer's fit in a short read; a longer one is read once more, whole.
    fn check_header_at(&self, start: u64) -> parquet::errors::Result<()> {
        use std::os::unix::fs::FileExt;
        let left = usize::try_from(self.chunks.left_in_chunk(start)).unwrap_or(usize::MAX);
        let mut n = super::pages::HEADER_PREFETCH.min(left);
        loop {
            let mut header = vec![0; n];
            self.file.read_exact_at(&mut header, start)?;
            match self.chunks.check_header(start, &header) {
                Ok(_) => return Ok(()),
                Err(_) if n < left.min(super::pages::MAX_HEADER_BYTES) => {
                    n = left.min(super::pages::MAX_HEADER_BYTES);
                }
                Err(e) => return Err(parquet::errors::ParquetError::General(e)),
            }
        }
    }
}

impl parquet::file::reader::Length for LocalFile {
    fn len(&self) -> u64 {
        self.size
    }
}

impl parquet::file::reader::ChunkReader for LocalFile {
    type T = std::io::BufReader<ReadAt>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        // Parquet's page reader reads from here only at a page's header.
        self.check_header_at(start)?;
        Ok(std::io::BufReader::new(ReadAt {
            file: self.file.clone(),
            at: start,
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        use std::os::unix::fs::FileExt;
        // Sized by the offset index, which says where pages are: within their chunk, or
        // refused before anything is allocated.
        self.chunks
            .check_within(start, length as u64)
            .map_err(parquet::errors::ParquetError::General)?;
        let mut buffer = vec![0; length];
        self.file.read_exact_at(&mut buffer, start)?;
        if self.chunks.is_page_start(start) {
            // A page read whole, by the offset index: its header first.
            self.chunks
                .check_header(start, &buffer)
                .map_err(parquet::errors::ParquetError::General)?;
        }
        Ok(buffer.into())
    }
}

/// A reader of a file from an offset on, by positioned reads.
struct ReadAt {
    file: Arc<std::fs::File>,
    at: u64,
}

impl std::io::Read for ReadAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

async fn read_block(
    plan: BlockPlan,
    batch_rows: usize,
    store: Arc<dyn object_store::ObjectStore>,
    tx: tokio::sync::mpsc::Sender<Result<Option<RecordBatch>>>,
) {
    let Prepared {
        table,
        block,
        metadata,
        chunks,
        mut fill,
        read,
        rows,
    } = match prepare(plan, batch_rows) {
        Ok(prepared) => prepared,
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            return;
        }
    };
    let fail = |e: &dyn std::fmt::Display| unreadable(&table, &block, e.to_string());
    let reader = BlockFile {
        store,
        path: ObjectPath::from(block.path.as_str()),
        size: block.size,
        chunks: Some(chunks),
    };
    let builder = read.apply(ParquetRecordBatchStreamBuilder::new_with_metadata(
        reader, metadata,
    ));
    let mut stream = match builder.build() {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.send(Err(fail(&e))).await;
            return;
        }
    };
    let mut yielded = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch
            .map_err(|e| fail(&e))
            .and_then(|b| fill.add(b).map_err(|e| fail(&e)));
        yielded += batch.as_ref().map_or(0, |b| b.num_rows());
        let stop = batch.is_err();
        if tx.send(batch.map(Some)).await.is_err() || stop {
            return;
        }
    }
    if yielded != rows {
        let _ = tx
            .send(Err(read_short(&table, &block, yielded, rows)))
            .await;
        return;
    }
    // The block's end, said: a read that stops without saying it failed.
    let _ = tx.send(Ok(None)).await;
}

/// The constant columns of a plan, as arrays long enough for any batch of its read.
struct Constants {
    fields: Vec<arrow::datatypes::FieldRef>,
    arrays: Vec<ArrayRef>,
}

impl Constants {
    fn new(
        constants: Vec<(String, Scalar)>,
        file: &SchemaRef,
        rows: usize,
    ) -> std::result::Result<Self, arrow::error::ArrowError> {
        let mut fields = Vec::new();
        let mut arrays = Vec::new();
        let zeros = arrow::array::UInt32Array::from(vec![0u32; rows]);
        for (name, value) in constants {
            let field = file.field_with_name(&name)?;
            let one = value.to_array(field.data_type());
            arrays.push(arrow::compute::take(one.as_ref(), &zeros, None)?);
            fields.push(Arc::new(field.clone()));
        }
        Ok(Self { fields, arrays })
    }

    /// `batch` with the constant columns appended.
    fn add(
        &mut self,
        batch: RecordBatch,
    ) -> std::result::Result<RecordBatch, arrow::error::ArrowError> {
        if self.fields.is_empty() {
            return Ok(batch);
        }
        let n = batch.num_rows();
        let schema = batch.schema();
        let fields: Vec<arrow::datatypes::FieldRef> = schema
            .fields()
            .iter()
            .cloned()
            .chain(self.fields.iter().cloned())
            .collect();
        let mut columns = batch.columns().to_vec();
        for array in &mut self.arrays {
            if array.len() < n {
                let zeros = arrow::array::UInt32Array::from(vec![0u32; n]);
                *array = arrow::compute::take(array.as_ref(), &zeros, None)?;
            }
            columns.push(array.slice(0, n));
        }
        RecordBatch::try_new_with_options(
            Arc::new(arrow::datatypes::Schema::new(fields)),
            columns,
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(n)),
        )
    }
}

/// A column's pages in one row group: the rows of each and its statistics (`None`:
/// unknown).
type PageStats = Vec<(usize, Option<ColumnStats>)>;

impl Footer {
    /// The block's statistics of `column`, converted when first asked for.
    fn column(&self, column: &str) -> Arc<ColumnStatistics> {
        if let Some(hit) = self.stats.lock().get(column) {
            return hit.clone();
        }
        let parquet = self.arrow.metadata();
        let groups = group_stats(column, self.arrow.schema(), parquet).unwrap_or_else(|e| {
            self.unreadable.log(column, &e);
            None
        });
        let converted = Arc::new(ColumnStatistics {
            column: column.to_owned(),
            unreadable: self.unreadable.clone(),
            groups,
            pages: (0..parquet.num_row_groups())
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        });
        self.stats
            .lock()
            .entry(column.to_owned())
            .or_insert(converted)
            .clone()
    }
}

/// `column`'s statistics per row group; `None` when the file keeps none (or lacks the
/// column), an error when they cannot be read.
fn group_stats(
    column: &str,
    schema: &SchemaRef,
    parquet: &parquet::file::metadata::ParquetMetaData,
) -> std::result::Result<Option<GroupStats>, parquet::errors::ParquetError> {
    let Some(conv) = converter(column, schema, parquet)? else {
        return Ok(None);
    };
    let row_groups = parquet.row_groups();
    let min_exact = conv.row_group_is_min_value_exact(row_groups.iter())?;
    let max_exact = conv.row_group_is_max_value_exact(row_groups.iter())?;
    let arrays = ColumnStatsArrays {
        mins: conv.row_group_mins(row_groups.iter())?,
        maxes: conv.row_group_maxes(row_groups.iter())?,
        nulls: conv.row_group_null_counts(row_groups.iter())?,
    };
    Ok(Some(GroupStats {
        stats: row_groups
            .iter()
            .enumerate()
            .map(|(i, rg)| arrays.get(i, rg.num_rows() as usize))
            .collect(),
        exact: (0..row_groups.len())
            .map(|i| {
                min_exact.is_valid(i)
                    && min_exact.value(i)
                    && max_exact.is_valid(i)
                    && max_exact.value(i)
            })
            .collect(),
    }))
}

impl ColumnStatistics {
    /// The column's page statistics in row group `rg`; `None` without a page index.
    fn pages(&self, rg: usize, metadata: &ArrowReaderMetadata) -> Option<&PageStats> {
        self.pages
            .get(rg)?
            .get_or_init(|| {
                // Parquet asserts on page indexes that disagree (a column index of more
                // pages than the offset index): they only prune, so such stats are none.
                std::panic::catch_unwind(|| {
                    page_stats(rg, &self.column, metadata.schema(), metadata.metadata())
                })
                .unwrap_or_else(|panic| {
                    Err(parquet::errors::ParquetError::General(format!(
                        "its page indexes disagree: {}",
                        crate::panic_message(&*panic)
                    )))
                })
                .unwrap_or_else(|e| {
                    self.unreadable.log(&self.column, &e);
                    None
                })
            })
            .as_ref()
    }
}

/// `column`'s page statistics in row group `rg`; `None` without a page index, an error
/// when it cannot be read.
fn page_stats(
    rg: usize,
    column: &str,
    schema: &SchemaRef,
    parquet: &parquet::file::metadata::ParquetMetaData,
) -> std::result::Result<Option<PageStats>, parquet::errors::ParquetError> {
    let Some(conv) = converter(column, schema, parquet)? else {
        return Ok(None);
    };
    let (Some(index), Some(offsets)) = (parquet.column_index(), parquet.offset_index()) else {
        return Ok(None);
    };
    let groups = [rg];
    let arrays = ColumnStatsArrays {
        mins: conv.data_page_mins(index, offsets, groups.iter())?,
        maxes: conv.data_page_maxes(index, offsets, groups.iter())?,
        nulls: conv.data_page_null_counts(index, offsets, groups.iter())?,
    };
    let Some(counts) = conv.data_page_row_counts(offsets, parquet.row_groups(), groups.iter())?
    else {
        return Ok(None);
    };
    // Page bounds only prune; no proof rests on them.
    Ok(Some(
        counts
            .values()
            .iter()
            .enumerate()
            .map(|(p, rows)| (*rows as usize, arrays.get(p, *rows as usize)))
            .collect(),
    ))
}

/// The converter of `column`'s statistics to Arrow; `None` when the file lacks the column.
fn converter<'a>(
    column: &str,
    schema: &'a SchemaRef,
    parquet: &'a parquet::file::metadata::ParquetMetaData,
) -> std::result::Result<Option<StatisticsConverter<'a>>, parquet::errors::ParquetError> {
    if schema.field_with_name(column).is_err() {
        return Ok(None);
    }
    StatisticsConverter::try_new(column, schema, parquet.file_metadata().schema_descr()).map(Some)
}

/// Rows of a row group of `rows` rows whose pages may satisfy `filter`, from the page
/// statistics `pages` gives per column; `None` when the index cannot narrow it down.
fn page_selection<'s>(
    filter: &Bound,
    rows: usize,
    pages: &dyn Fn(&str) -> Option<&'s PageStats>,
) -> Option<RowSelection> {
    let all = || RowSelection::from(vec![RowSelector::select(rows)]);
    match filter {
        Bound::Const(true) => None,
        Bound::Const(false) => Some(RowSelection::from(vec![RowSelector::skip(rows)])),
        Bound::And(children) => children
            .iter()
            .filter_map(|c| page_selection(c, rows, pages))
            .reduce(|a, b| a.intersection(&b)),
        Bound::Or(children) => {
            let mut acc: Option<RowSelection> = None;
            for c in children {
                let s = page_selection(c, rows, pages)?;
                acc = Some(match acc {
                    None => s,
                    Some(a) => a.union(&s),
                });
            }
            acc.or_else(|| Some(all()))
        }
        leaf => {
            let mut columns = Vec::new();
            leaf.columns(&mut columns);
            let selectors: Vec<RowSelector> = pages(columns.first()?)?
                .iter()
                .map(|(page_rows, stats)| {
                    let (page_rows, stats) = (*page_rows, |_: &str| stats.clone());
                    if leaf.may_match(&stats, page_rows) {
                        RowSelector::select(page_rows)
                    } else {
                        RowSelector::skip(page_rows)
                    }
                })
                .collect();
            Some(RowSelection::from(selectors))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A footer of one row group of one INT64 column chunk, as `chunk` builds it.
    fn footer_of(
        chunk: impl FnOnce(
            parquet::file::metadata::ColumnChunkMetaDataBuilder,
        ) -> parquet::file::metadata::ColumnChunkMetaDataBuilder,
    ) -> parquet::file::metadata::ParquetMetaData {
        use parquet::file::metadata::{
            ColumnChunkMetaData, FileMetaData, ParquetMetaData, RowGroupMetaData,
        };
        let schema = Arc::new(parquet::schema::types::SchemaDescriptor::new(Arc::new(
            parquet::schema::parser::parse_message_type("message m { required int64 a; }").unwrap(),
        )));
        let column = chunk(
            ColumnChunkMetaData::builder(schema.column(0))
                .set_compression(parquet::basic::Compression::SNAPPY)
                .set_data_page_offset(4)
                .set_total_compressed_size(100)
                .set_total_uncompressed_size(100),
        )
        .build()
        .unwrap();
        let group = RowGroupMetaData::builder(schema.clone())
            .set_num_rows(10)
            .set_column_metadata(vec![column])
            .build()
            .unwrap();
        ParquetMetaData::new(
            FileMetaData::new(1, 10, None, None, schema, None),
            vec![group],
        )
    }

    /// Footer values Parquet trusts (and asserts on) are checked before they are used: a
    /// codec this store never writes (legacy LZ4 inflates past the size a page declares),
    /// negative offsets and sizes, a chunk past the object's end.
    #[test]
    fn footer_values_parquet_trusts_are_checked() {
        use parquet::basic::Compression;
        check_footer_values(&footer_of(|c| c), 200).unwrap();
        let err = check_footer_values(&footer_of(|c| c.set_compression(Compression::LZ4)), 200)
            .unwrap_err();
        assert!(
            err.contains("codec LZ4 is not one this store writes"),
            "{err}"
        );
        for (chunk, size) in [
            (footer_of(|c| c.set_data_page_offset(-1)), 200),
            (footer_of(|c| c.set_dictionary_page_offset(Some(-8))), 200),
            (footer_of(|c| c.set_total_compressed_size(-1)), 200),
            (footer_of(|c| c.set_total_uncompressed_size(-1)), 200),
            (footer_of(|c| c), 100),
        ] {
            let err = check_footer_values(&chunk, size).unwrap_err();
            assert!(err.contains("row group 0, column 0"), "{err}");
        }
    }

    /// A block read on the I/O runtime ends only when its read says so: a read whose task
    /// ends without saying it (a Parquet decoder that panicked drops its sender) is an
    /// error naming the block, not a block with fewer rows.
    #[test]
    fn a_remote_read_that_stops_before_the_blocks_end_is_an_error() {
        let block = Arc::new(super::super::Block::new(BlockMeta {
            id: 7,
            path: "tables/samples/7.parquet".into(),
            size: 100,
            rows: 4,
            row_groups: 1,
            min_tx: 0,
            max_tx: 0,
            columns: Default::default(),
        }));
        let batch = RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty()));
        let stream = |end: bool| {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.try_send(Ok(Some(batch.clone()))).unwrap();
            if end {
                tx.try_send(Ok(None)).unwrap();
            }
            drop(tx);
            BlockStream::Remote {
                rx,
                table: "samples".into(),
                block: block.clone(),
            }
        };
        let read: Vec<_> = stream(true).collect();
        assert!(matches!(read[..], [Ok(_)]), "{read:?}");
        let read: Vec<_> = stream(false).collect();
        match &read[..] {
            [Ok(_), Err(e @ Error::BlockUnreadable { block: 7, .. })] => {
                assert!(e.to_string().contains("before the block's end"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
}
