//! Writing a block: the merge of a rotated block's granules, streamed into Parquet.
//!
//! Memory: the merge holds one batch per input (slices of granules already in memory) and
//! one output batch; the Parquet writer holds the encoded pages of the row group in
//! progress and hands each finished row group to a buffered multipart upload of bounded
//! size. Nothing grows with the block.

use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use object_store::path::Path as ObjectPath;
use parquet::arrow::AsyncArrowWriter;
use parquet::basic::{Compression as ParquetCompression, Encoding as ParquetEncoding, ZstdLevel};
use parquet::file::metadata::{KeyValue, SortingColumn as ParquetSortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::Storage;
use super::keys::{FOOTER_KEY, KeyColumn, Recorder};
use super::upload::Upload;
use crate::error::{Error, Result};
use crate::options::TableOptions;
use crate::schema::{ColumnName, Compression, Encoding, Schema};

/// What writing a block produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) size: u64,
    pub(crate) rows: u64,
    pub(crate) row_groups: u32,
}

fn parquet_compression(c: Compression) -> Result<ParquetCompression> {
    Ok(match c {
        Compression::Uncompressed => ParquetCompression::UNCOMPRESSED,
        Compression::Snappy => ParquetCompression::SNAPPY,
        Compression::Lz4Raw => ParquetCompression::LZ4_RAW,
        Compression::Zstd { level } => ParquetCompression::ZSTD(
            ZstdLevel::try_new(level)
                .map_err(|e| Error::InvalidSchema(format!("zstd level {level}: {e}")))?,
        ),
        Compression::ZstdDefault => ParquetCompression::ZSTD(ZstdLevel::default()),
    })
}

/// Writer properties for a block of `schema` (the block's own columns), following the table
/// definition's hints, with `sort_key` (column names, in order) recorded as sorting columns.
pub(crate) fn properties(
    definition: &Schema,
    options: &TableOptions,
    schema: &SchemaRef,
    sort_key: &[(String, bool, bool)],
) -> Result<WriterProperties> {
    let mut builder = WriterProperties::builder()
        .set_max_row_group_row_count(Some(options.row_group_rows))
        .set_data_page_row_count_limit(options.granule_rows)
        .set_write_batch_size(options.granule_rows.min(8192))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_compression(ParquetCompression::ZSTD(ZstdLevel::default()));
    for field in schema.fields() {
        let name = ColumnName::resolve(definition, field.name())?;
        let def = &definition.columns()[name.def];
        let path = ColumnPath::new(vec![field.name().clone()]);
        builder = builder
            .set_column_compression(path.clone(), parquet_compression(def.compression_hint())?);
        let dictionary = matches!(field.data_type(), DataType::Dictionary(_, _))
            || def.encoding_hint() == Encoding::RleDictionary;
        builder = builder.set_column_dictionary_enabled(path.clone(), dictionary);
        let encoding = match def.encoding_hint() {
            Encoding::DeltaBinaryPacked => Some(ParquetEncoding::DELTA_BINARY_PACKED),
            Encoding::DeltaLengthByteArray => Some(ParquetEncoding::DELTA_LENGTH_BYTE_ARRAY),
            Encoding::DeltaByteArray => Some(ParquetEncoding::DELTA_BYTE_ARRAY),
            Encoding::Plain | Encoding::RleDictionary => None,
        };
        if let Some(encoding) = encoding {
            builder = builder.set_column_encoding(path, encoding);
        }
    }
    let fields = crate::schema::FieldIndex::new(schema);
    let sorting: Vec<ParquetSortingColumn> = sort_key
        .iter()
        .filter_map(|(name, descending, nulls_first)| {
            let idx = fields.get(name)?;
            Some(ParquetSortingColumn {
                column_idx: idx as i32,
                descending: *descending,
                nulls_first: *nulls_first,
            })
        })
        .collect();
    if !sorting.is_empty() {
        builder = builder.set_sorting_columns(Some(sorting));
    }
    Ok(builder.build())
}

/// The row counts of the row groups `writer` has cut so far.
fn row_group_rows<W: parquet::arrow::async_writer::AsyncFileWriter>(
    writer: &AsyncArrowWriter<W>,
) -> impl Iterator<Item = u64> + '_ {
    writer
        .flushed_row_groups()
        .iter()
        .map(|rg| rg.num_rows() as u64)
}

impl Storage {
    /// Streams `batches` into a new Parquet object at `path`.
    pub(crate) fn write_block(
        &self,
        path: ObjectPath,
        schema: SchemaRef,
        properties: WriterProperties,
        batches: impl Iterator<Item = Result<RecordBatch>> + Send + 'static,
    ) -> Result<Written> {
        let store = self.store.clone();
        let shown = path.to_string();
        let parquet = move |e: parquet::errors::ParquetError| Error::Parquet {
            context: format!("writing block {shown}"),
            source: e,
        };
        let parquet = std::sync::Arc::new(parquet);
        let shown2 = path.to_string();
        // A block in a local directory is made durable before it is named anywhere: the
        // manifest naming it, and the WAL segments it replaces being deleted, are made
        // durable right after this returns.
        let file = self
            .local
            .as_ref()
            .map(|local| local.path_to_filesystem(&path))
            .transpose()
            .map_err(|source| Error::ObjectStore {
                context: format!("the file of block {path}"),
                source,
            })?;
        let written = self.io.run(async move {
            let upload = Upload::new(store.clone(), path.clone());
            let key: Vec<KeyColumn> = properties
                .sorting_columns()
                .into_iter()
                .flatten()
                .map(|c| KeyColumn {
                    name: schema.field(c.column_idx as usize).name().clone(),
                    descending: c.descending,
                    nulls_first: c.nulls_first,
                })
                .collect();
            let mut keys = Recorder::new(key);
            let mut writer = AsyncArrowWriter::try_new(upload, schema, Some(properties))
                .map_err(|e| parquet(e))?;
            let mut rows = 0u64;
            let wrote = async {
                for batch in batches {
                    let batch = batch?;
                    rows += batch.num_rows() as u64;
                    keys.batch(&batch);
                    writer.write(&batch).await.map_err(|e| parquet(e))?;
                    keys.flushed(row_group_rows(&writer));
                }
                // The last row group is cut at close: the rows after the last cut.
                if let Some(ranges) = keys.finish(row_group_rows(&writer)) {
                    writer.append_key_value_metadata(KeyValue::new(FOOTER_KEY.to_owned(), ranges));
                }
                writer.finish().await.map_err(|e| parquet(e))
            }
            .await;
            let upload = writer.into_inner();
            let metadata = match wrote {
                Ok(metadata) => metadata,
                Err(e) => {
                    upload.abort().await;
                    return Err(e);
                }
            };
            upload.finish().await.map_err(|source| Error::ObjectStore {
                context: format!("uploading block {shown2}"),
                source,
            })?;
            let head = {
                use object_store::ObjectStoreExt;
                store
                    .head(&path)
                    .await
                    .map_err(|source| Error::ObjectStore {
                        context: format!("checking block {shown2} after upload"),
                        source,
                    })?
            };
            Ok::<_, Error>(Written {
                size: head.size,
                rows,
                row_groups: metadata.num_row_groups() as u32,
            })
        })??;
        if let Some(file) = file {
            sync_new_file(&file).map_err(|e| Error::Io {
                context: format!("syncing block {}", file.display()),
                source: e,
            })?;
        }
        Ok(written)
    }
}

/// Makes a file just renamed into place durable: its bytes, and its name in its directory
/// and in the directory above (where the table's directory may just have been made). A
/// rename of a new file that is never synced can come back empty or missing after a crash
/// (ext4's delayed allocation covers only a rename over an existing file).
fn sync_new_file(file: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(file)?.sync_all()?;
    for dir in file.ancestors().skip(1).take(2) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
