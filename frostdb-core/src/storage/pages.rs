//! Page headers checked before Parquet reads a page: Parquet allocates a page by the size
//! its header declares (up to 2 GiB) and decompresses into it, so a damaged or hostile
//! header of a few bytes (or a 60 KB zstd frame behind it) costs gigabytes outside every
//! budget. Every page header a read meets is checked first: a well-formed struct
//! ([`super::thrift::check_struct`]) declaring an uncompressed size no larger than its column
//! chunk's, as the footer gives it, and compressed bytes within the chunk.

use parquet::file::metadata::ParquetMetaData;

use super::thrift;

/// A page header longer than this is refused (the writer's are tens of bytes; Parquet's
/// page statistics, which it does not write, would be the longest part).
pub(super) const MAX_HEADER_BYTES: usize = 1 << 20;

/// What a first read of a page header takes: the writer's whole.
pub(super) const HEADER_PREFETCH: usize = 256;

/// One column chunk of a block: where its bytes lie, what its pages may declare, and where
/// its data pages start (from the offset index, when the block has one).
#[derive(Debug)]
struct Chunk {
    start: u64,
    end: u64,
    uncompressed: u64,
    pages: Vec<u64>,
    /// The fewest bits a value of its column takes in a dictionary page.
    value_bits: u64,
}

/// The fewest bits a value of `column` takes in a dictionary page (a byte array's length
/// prefix, a fixed width's bytes).
fn value_bits(column: &parquet::file::metadata::ColumnChunkMetaData) -> u64 {
    use parquet::basic::Type;
    match column.column_type() {
        Type::BOOLEAN => 1,
        Type::INT32 | Type::FLOAT | Type::BYTE_ARRAY => 32,
        Type::INT64 | Type::DOUBLE => 64,
        Type::INT96 => 96,
        Type::FIXED_LEN_BYTE_ARRAY => 8 * column.column_descr().type_length().max(1) as u64,
    }
}

/// The column chunks of a block's footer, by where they start.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    chunks: Vec<Chunk>,
}

impl Chunks {
    pub(crate) fn new(metadata: &ParquetMetaData) -> Self {
        let offsets = metadata.offset_index();
        let mut chunks = Vec::new();
        for (r, rg) in metadata.row_groups().iter().enumerate() {
            for (c, column) in rg.columns().iter().enumerate() {
                let (start, length) = column.byte_range();
                let pages = offsets
                    .and_then(|o| o.get(r)?.get(c))
                    .map(|index| {
                        index
                            .page_locations()
                            .iter()
                            .map(|p| p.offset as u64)
                            .collect()
                    })
                    .unwrap_or_default();
                chunks.push(Chunk {
                    start,
                    end: start.saturating_add(length),
                    uncompressed: column.uncompressed_size().max(0) as u64,
                    pages,
                    value_bits: value_bits(column),
                });
            }
        }
        chunks.sort_by_key(|c| c.start);
        Self { chunks }
    }

    /// The bytes these take in memory.
    pub(crate) fn memory_size(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| std::mem::size_of::<Chunk>() + std::mem::size_of_val(&c.pages[..]))
            .sum()
    }

    fn chunk(&self, at: u64) -> Option<&Chunk> {
        let i = self.chunks.partition_point(|c| c.start <= at);
        let chunk = self.chunks.get(i.checked_sub(1)?)?;
        (at < chunk.end).then_some(chunk)
    }

    /// Whether a page's header starts at `at`: a chunk's first byte, or a data page the
    /// offset index names.
    pub(super) fn is_page_start(&self, at: u64) -> bool {
        self.chunk(at)
            .is_some_and(|c| c.start == at || c.pages.binary_search(&at).is_ok())
    }

    /// Checks that `length` bytes from `at` lie within one column chunk.
    pub(super) fn check_within(&self, at: u64, length: u64) -> Result<(), String> {
        if length > self.left_in_chunk(at) {
            return Err(format!(
                "a page read of {length} bytes at byte {at}, past its column chunk"
            ));
        }
        Ok(())
    }

    /// The bytes of a chunk from `at` on (0 outside every chunk).
    pub(super) fn left_in_chunk(&self, at: u64) -> u64 {
        self.chunk(at).map_or(0, |c| c.end - at)
    }

    /// Checks the page header at the start of `bytes`, read from `at`. Returns the header's
    /// length and the page's compressed bytes after it.
    pub(super) fn check_header(&self, at: u64, bytes: &[u8]) -> Result<(usize, u64), String> {
        let chunk = self
            .chunk(at)
            .ok_or_else(|| format!("a page read at byte {at}, in no column chunk"))?;
        let bytes = &bytes[..bytes.len().min(MAX_HEADER_BYTES)];
        let (mut uncompressed, mut compressed, mut values) = (None, None, None);
        let header = thrift::check_struct(bytes, &thrift::PAGE_HEADER, |field, v| match field {
            thrift::Field::Top(2) => uncompressed = Some(v),
            thrift::Field::Top(3) => compressed = Some(v),
            thrift::Field::Values => values = Some(v),
            thrift::Field::Top(_) => {}
        })
        .map_err(|e| {
            if bytes.len() == MAX_HEADER_BYTES {
                format!("the page header at byte {at} is longer than {MAX_HEADER_BYTES} bytes")
            } else {
                format!("the page header at byte {at} {e}")
            }
        })?;
        let (Some(uncompressed), Some(compressed)) = (uncompressed, compressed) else {
            return Err(format!("the page header at byte {at} declares no sizes"));
        };
        let after = at + header as u64;
        if uncompressed < 0 || uncompressed as u64 > chunk.uncompressed {
            return Err(format!(
                "the page at byte {at} declares {uncompressed} bytes uncompressed, its column chunk {}",
                chunk.uncompressed
            ));
        }
        // A dictionary page's values are reserved before they are read: no more than its
        // bytes hold (2³¹−1 declared in a 16-byte page zero-filled 16 GiB).
        if let Some(values) = values
            && u64::try_from(values).map_or(true, |n| {
                n.saturating_mul(chunk.value_bits) > (uncompressed as u64).saturating_mul(8)
            })
        {
            return Err(format!(
                "the dictionary page at byte {at} declares {values} values, more than its \
                 {uncompressed} bytes hold"
            ));
        }
        if compressed < 0 || after + compressed as u64 > chunk.end {
            return Err(format!(
                "the page at byte {at} declares {compressed} bytes, past its column chunk's end at {}",
                chunk.end
            ));
        }
        Ok((header, compressed as u64))
    }

    /// Checks every page of `bytes`, read from `at`: whole pages of one column chunk, as
    /// Parquet's async reader fetches them.
    pub(super) fn check_pages(&self, at: u64, bytes: &[u8]) -> Result<(), String> {
        let mut offset = 0usize;
        while offset < bytes.len() {
            let (header, compressed) = self.check_header(at + offset as u64, &bytes[offset..])?;
            offset = offset
                .checked_add(header)
                .and_then(|o| o.checked_add(usize::try_from(compressed).ok()?))
                .filter(|&o| o <= bytes.len())
                .ok_or_else(|| {
                    format!(
                        "the page at byte {} runs past the {} bytes read",
                        at + offset as u64,
                        bytes.len()
                    )
                })?;
        }
        Ok(())
    }
}
