//! The WAL's on-disk format.
//!
//! A segment file starts with the 8-byte magic `FDBWAL\0\x02`, then holds records, one per
//! transaction:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | payload length `n`, u32 little-endian |
//! | 8 | transaction id, u64 little-endian |
//! | 4 | CRC-32C of the 12 bytes above, u32 little-endian |
//! | 4 | CRC-32C of the payload, u32 little-endian |
//! | n | payload |
//!
//! The payload is one byte of flags (bit 0: the rest is one zstd frame), then the
//! transaction's writes: a u16 count, and for each a u16 table-name length, the name (UTF-8),
//! a u32 length and the table's batch (normalised) as Arrow IPC streams: one, or for a
//! batch of more than [`STREAM_COLUMNS`] columns one per run of that many, their columns side
//! by side making the batch (see [`write_batch`]). Payloads over
//! [`COMPRESS_ABOVE`] bytes are compressed; small ones, the common case of one profile, are
//! cheaper to write plain.
//!
//! The header has its own checksum so that a damaged length is never trusted. A damaged
//! record is a *torn tail* (a crash during an unacknowledged write; dropped with a warning)
//! when no valid record follows it in the segment, and *corruption* (an error naming segment
//! and offset) when one does: skipping it would silently lose acknowledged writes.
//!
//! A segment is named after the first transaction it may hold: `<tx:020>.wal`.

use std::io::Read;

use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;

use crate::error::{Error, Result};

pub(crate) const MAGIC: &[u8; 8] = b"FDBWAL\0\x02";
/// Payloads larger than this are zstd-compressed.
pub(crate) const COMPRESS_ABOVE: usize = 16 << 10;
const FLAG_ZSTD: u8 = 1;
pub(crate) const HEADER: usize = 20;
/// Largest payload accepted when reading; a larger length field means a damaged record.
pub(crate) const MAX_PAYLOAD: usize = 1 << 30;
/// Largest transaction body, before compression: larger writes are refused, and a payload
/// that inflates past it is damaged. A byte below [`MAX_PAYLOAD`]: a body stored as it is
/// (its flag byte first) is a payload replay accepts.
pub(crate) const MAX_BODY: usize = MAX_PAYLOAD - 1;

/// Most columns one IPC stream of a batch holds. arrow-ipc's reader finds the field of each
/// dictionary it reads by scanning the whole schema, so one stream of `n` dictionary columns
/// decodes in `n²`: a batch of 10,000 label columns (one push of that many label names) took
/// minutes to replay. Batches this narrow, all but such ones, are one stream as before.
pub(crate) const STREAM_COLUMNS: usize = 64;

/// The 8 bytes that end an Arrow IPC stream: the continuation marker and a zero length.
const END_OF_STREAM: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// Appends `batch` to `out` as Arrow IPC streams of at most [`STREAM_COLUMNS`] columns each,
/// in column order.
fn write_batch(out: &mut Vec<u8>, batch: &RecordBatch) -> Result<()> {
    let columns = batch.num_columns();
    if columns <= STREAM_COLUMNS {
        return write_stream(out, batch);
    }
    for start in (0..columns).step_by(STREAM_COLUMNS) {
        let run: Vec<usize> = (start..columns.min(start + STREAM_COLUMNS)).collect();
        write_stream(out, &batch.project(&run)?)?;
    }
    Ok(())
}

fn write_stream(out: &mut Vec<u8>, batch: &RecordBatch) -> Result<()> {
    let mut writer = StreamWriter::try_new(out, batch.schema_ref())?;
    writer.write(batch)?;
    writer.finish()?;
    Ok(())
}

/// Reads a stream written by [`write_batch`]. Push-based: lengths declared inside the
/// bytes are never allocated ahead of the bytes themselves (`StreamReader` resizes a buffer to
/// a declared metadata length, so four damaged bytes could cost gigabytes of zeroing).
///
/// The batch gets a copy of its own bytes (its arrays point into them): a table keeping the
/// batch must not keep the rest of the record alive.
pub(crate) fn decode_batch(bytes: &[u8]) -> Result<RecordBatch> {
    let mut payload = Buffer::from(bytes);
    // arrow-ipc 59 panics, rather than erroring, on some malformed schema messages
    // (apache/arrow-rs#10575 and #10437, fixed for arrow 60 by #10647). A record that passes
    // its checksum was written by us, so only crafted bytes get here; they get an error.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let mut parts = Vec::new();
        loop {
            let mut decoder = StreamDecoder::new();
            let batch = decoder
                .decode(&mut payload)?
                .ok_or_else(|| Error::Internal("WAL record holds no whole batch".into()))?;
            parts.push(batch);
            if payload.starts_with(&END_OF_STREAM) && payload.len() > END_OF_STREAM.len() {
                // Another stream follows: the batch's next columns.
                payload = payload.slice(END_OF_STREAM.len());
                decoder.finish()?;
                continue;
            }
            if !payload.is_empty() {
                // An end-of-stream marker is all that may follow the last batch.
                decoder.decode(&mut payload)?;
            }
            decoder.finish()?;
            break;
        }
        side_by_side(parts)
    }))
    .unwrap_or_else(|panic| {
        let reason = crate::panic_message(panic.as_ref());
        Err(Error::Internal(format!(
            "malformed Arrow IPC stream (the decoder panicked: {reason})"
        )))
    })
}

/// The batch whose columns are those of `parts`, in order (the streams of
/// [`write_batch`]); each part must have the same rows.
fn side_by_side(mut parts: Vec<RecordBatch>) -> Result<RecordBatch> {
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    let rows = parts[0].num_rows();
    if parts.iter().any(|p| p.num_rows() != rows) {
        return Err(Error::Internal(
            "the streams of a WAL batch differ in rows".into(),
        ));
    }
    let metadata = parts[0].schema_ref().metadata().clone();
    let fields: Vec<arrow::datatypes::FieldRef> = parts
        .iter()
        .flat_map(|p| p.schema_ref().fields().iter().cloned())
        .collect();
    let columns = parts
        .iter()
        .flat_map(|p| p.columns().iter().cloned())
        .collect();
    Ok(RecordBatch::try_new_with_options(
        std::sync::Arc::new(arrow::datatypes::Schema::new_with_metadata(
            fields, metadata,
        )),
        columns,
        &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// Serialises a transaction's writes, `(table, batch)`, as a record payload.
pub(crate) fn encode_entries(entries: &[(&str, &RecordBatch)]) -> Result<Vec<u8>> {
    // IPC bytes are about the arrays' own plus a few hundred of metadata a batch.
    let estimate: usize = entries
        .iter()
        .map(|(_, b)| b.get_array_memory_size() + 1024)
        .sum();
    let mut body = Vec::with_capacity(estimate.min(MAX_BODY));
    let count = u16::try_from(entries.len())
        .map_err(|_| Error::Internal("a transaction writes more than 65535 batches".into()))?;
    body.extend_from_slice(&count.to_le_bytes());
    for (table, batch) in entries {
        let name = table.as_bytes();
        body.extend_from_slice(&(name.len() as u16).to_le_bytes());
        body.extend_from_slice(name);
        // The stream is written in place, after room for its length.
        let at = body.len();
        body.extend_from_slice(&[0; 4]);
        write_batch(&mut body, batch)?;
        let len = u32::try_from(body.len() - at - 4)
            .map_err(|_| Error::Internal("a batch of over 4 GiB in one write".into()))?;
        body[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
    if body.len() > MAX_BODY {
        let tables: Vec<&str> = entries.iter().map(|(t, _)| *t).collect();
        return Err(Error::BatchTooLarge {
            table: tables.join(", "),
            what: "bytes in one WAL record",
            got: body.len(),
            limit: MAX_BODY,
        });
    }
    if body.len() > COMPRESS_ABOVE {
        let compressed = compress(&body).map_err(|e| Error::Io {
            context: "compressing a WAL record".into(),
            source: e,
        })?;
        // Bytes that do not compress (random values) come out of zstd a little larger: they
        // are stored as they are, so that no payload is larger than its body and its flag,
        // and none is larger than replay accepts (a body of almost MAX_BODY bytes grew past
        // MAX_PAYLOAD, and replay dropped the acknowledged write as a torn tail).
        if compressed.len() < body.len() {
            let mut out = Vec::with_capacity(1 + compressed.len());
            out.push(FLAG_ZSTD);
            out.extend_from_slice(&compressed);
            return Ok(out);
        }
    }
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(0);
    out.extend_from_slice(&body);
    Ok(out)
}

/// `body` as one zstd frame (level 1), by a compression context taken from a pool: making
/// one per record cost more than compressing, and one per thread left each of a group
/// commit's many leaders its own cold context. The pool holds as many as ever compressed at
/// once (about one per database committing).
fn compress(body: &[u8]) -> std::io::Result<Vec<u8>> {
    static POOL: parking_lot::Mutex<Vec<zstd::bulk::Compressor<'static>>> =
        parking_lot::Mutex::new(Vec::new());
    let taken = POOL.lock().pop();
    let mut compressor = match taken {
        Some(c) => c,
        None => zstd::bulk::Compressor::new(1)?,
    };
    let out = compressor.compress(body);
    POOL.lock().push(compressor);
    out
}

/// Reads a payload written by [`encode_entries`]: `(table, batch)` per write, or why it
/// cannot be read.
pub(crate) fn decode_entries(
    payload: &[u8],
) -> std::result::Result<Vec<(String, RecordBatch)>, String> {
    let (&flags, rest) = payload.split_first().ok_or("empty payload")?;
    let inflated;
    let body: &[u8] = if flags & FLAG_ZSTD != 0 {
        inflated = inflate(rest, MAX_BODY)?;
        &inflated
    } else {
        rest
    };
    let mut cursor = body;
    let mut take = |n: usize| -> std::result::Result<&[u8], String> {
        if cursor.len() < n {
            return Err(format!("payload ends {} bytes early", n - cursor.len()));
        }
        let (head, tail) = cursor.split_at(n);
        cursor = tail;
        Ok(head)
    };
    let le16 = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
    let count = le16(take(2)?);
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let n = le16(take(2)?) as usize;
        let name = std::str::from_utf8(take(n)?)
            .map_err(|_| "a table name is not UTF-8".to_owned())?
            .to_owned();
        let len = take(4)?;
        let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let batch = decode_batch(take(n)?).map_err(|e| format!("table {name:?}: {e}"))?;
        out.push((name, batch));
    }
    if !cursor.is_empty() {
        return Err(format!("{} bytes after the last write", cursor.len()));
    }
    Ok(out)
}

/// Inflates a compressed payload, refusing one that inflates past [`MAX_BODY`] (a few
/// damaged bytes can declare gigabytes).
fn inflate(compressed: &[u8], limit: usize) -> std::result::Result<Vec<u8>, String> {
    let decoder = zstd::stream::Decoder::new(compressed).map_err(|e| format!("zstd: {e}"))?;
    let mut out = Vec::new();
    decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zstd: {e}"))?;
    if out.len() > limit {
        return Err(format!("inflates past the {limit}-byte record limit"));
    }
    Ok(out)
}

/// A whole record, header included, ready to append.
pub(crate) fn frame(tx: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&tx.to_le_bytes());
    let header_crc = crc32c::crc32c(&out[..12]);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A parsed header, `(payload length, tx, payload crc)`, if its checksum holds.
fn parse_header(header: &[u8]) -> Option<(usize, u64, u32)> {
    let word = |range: std::ops::Range<usize>| header.get(range);
    let n = u32::from_le_bytes(word(0..4)?.try_into().ok()?) as usize;
    let tx = u64::from_le_bytes(word(4..12)?.try_into().ok()?);
    let header_crc = u32::from_le_bytes(word(12..16)?.try_into().ok()?);
    let payload_crc = u32::from_le_bytes(word(16..20)?.try_into().ok()?);
    let valid = crc32c::crc32c(word(0..12)?) == header_crc && n <= MAX_PAYLOAD;
    valid.then_some((n, tx, payload_crc))
}

/// Whether a whole valid record follows a bad one.
#[derive(Debug, PartialEq, Eq)]
enum Follows {
    No,
    Yes,
    /// The search stopped at its bound of work ([`SEARCH_WORK_PER_BYTE`]).
    Undecided,
}

/// Most bytes the search for a valid record after a bad one may checksum, per byte
/// searched. A tail of headers each claiming the rest as its payload costs its length
/// squared otherwise: 10^14 bytes for 64 MiB, hours, with the database not yet open.
const SEARCH_WORK_PER_BYTE: usize = 8;

/// Whether a whole valid record starts at some offset of `bytes`, searched within a bound
/// of work: past it, [`Follows::Undecided`].
fn valid_record_in(bytes: &[u8]) -> Follows {
    let mut left = bytes
        .len()
        .saturating_mul(SEARCH_WORK_PER_BYTE)
        .max(1 << 20);
    for at in 0..bytes.len().saturating_sub(HEADER - 1) {
        let Some((n, _, crc)) = parse_header(&bytes[at..at + HEADER]) else {
            continue;
        };
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + n) else {
            continue;
        };
        if n > left {
            return Follows::Undecided;
        }
        left -= n;
        if crc32c::crc32c(payload) == crc {
            return Follows::Yes;
        }
    }
    Follows::No
}

/// One record read back.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) tx: u64,
    pub(crate) payload: Vec<u8>,
    /// Offset of the record in its segment.
    pub(crate) offset: u64,
}

/// How reading a segment ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Every byte belonged to a whole, valid record.
    Clean,
    /// The bytes from `offset` on do not form a valid record and nothing valid follows: a
    /// write cut short by a crash (or a zero-filled tail).
    Torn { offset: u64, reason: String },
}

/// Reads the records of one segment in order, one at a time (memory: one record).
pub(crate) struct SegmentReader<R> {
    path: String,
    input: R,
    offset: u64,
    len: u64,
    end: Option<End>,
}

impl<R: Read> SegmentReader<R> {
    /// Starts reading a segment of `len` bytes.
    pub(crate) fn new(path: String, mut input: R, len: u64) -> Result<Self> {
        let mut magic = [0u8; 8];
        if len < MAGIC.len() as u64 {
            // A segment created but never written (crash right after creation).
            return Ok(Self {
                path,
                input,
                offset: len,
                len,
                end: Some(End::Torn {
                    offset: 0,
                    reason: "segment shorter than its header".into(),
                }),
            });
        }
        input.read_exact(&mut magic).map_err(|e| Error::Io {
            context: format!("reading WAL segment {path}"),
            source: e,
        })?;
        if &magic != MAGIC {
            return Err(Error::WalCorrupt {
                segment: path,
                offset: 0,
                reason: "not a WAL segment (bad magic)".into(),
            });
        }
        Ok(Self {
            path,
            input,
            offset: MAGIC.len() as u64,
            len,
            end: None,
        })
    }

    /// How reading ended; `None` until the iterator is exhausted.
    pub(crate) fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    fn read_record(&mut self) -> Result<Option<Record>> {
        let remaining = self.len - self.offset;
        if remaining == 0 {
            self.end = Some(End::Clean);
            return Ok(None);
        }
        let offset = self.offset;
        if remaining < HEADER as u64 {
            let reason = format!("{remaining} bytes, less than a record header");
            return self.damaged(offset, Vec::new(), reason);
        }
        let mut header = [0u8; HEADER];
        self.read_into(&mut header)?;
        let Some((n, tx, payload_crc)) = parse_header(&header) else {
            let reason = if header.iter().all(|b| *b == 0) {
                "zero-filled record header"
            } else {
                "record header checksum mismatch"
            };
            return self.damaged(offset, header.to_vec(), reason.into());
        };
        let body_end = offset + HEADER as u64 + n as u64;
        if body_end > self.len {
            let reason = format!("record of {n} bytes runs past the end of the segment");
            return self.damaged(offset, header.to_vec(), reason);
        }
        let mut payload = vec![0u8; n];
        self.read_into(&mut payload)?;
        let actual = crc32c::crc32c(&payload);
        if actual != payload_crc {
            let mut seen = header.to_vec();
            seen.extend(payload);
            let reason = format!(
                "payload checksum mismatch (stored {payload_crc:#010x}, computed {actual:#010x})"
            );
            return self.damaged(offset, seen, reason);
        }
        Ok(Some(Record {
            tx,
            payload,
            offset,
        }))
    }

    /// A bad record at `offset` (`seen` holds its bytes read so far): a torn tail when no
    /// valid record follows it, corruption otherwise.
    fn damaged(
        &mut self,
        offset: u64,
        mut seen: Vec<u8>,
        reason: String,
    ) -> Result<Option<Record>> {
        self.input.read_to_end(&mut seen).map_err(|e| Error::Io {
            context: format!("reading WAL segment {}", self.path),
            source: e,
        })?;
        self.offset = self.len;
        // From the second byte on: the damaged record itself starts at the first. What
        // cannot be told apart within the search's bound is damage: an error, never a tail
        // cut off silently.
        let reason = match valid_record_in(seen.get(1..).unwrap_or_default()) {
            Follows::No => {
                self.end = Some(End::Torn { offset, reason });
                return Ok(None);
            }
            Follows::Yes => reason,
            Follows::Undecided => format!(
                "{reason}, and whether a valid record follows could not be told within the \
                 search's bound"
            ),
        };
        Err(Error::WalCorrupt {
            segment: self.path.clone(),
            offset,
            reason,
        })
    }

    fn read_into(&mut self, buf: &mut [u8]) -> Result<()> {
        self.input.read_exact(buf).map_err(|e| Error::Io {
            context: format!("reading WAL segment {} at {}", self.path, self.offset),
            source: e,
        })?;
        self.offset += buf.len() as u64;
        Ok(())
    }
}

impl<R: Read> Iterator for SegmentReader<R> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.end.is_some() {
            return None;
        }
        self.read_record().transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use std::io::Cursor;

    use super::*;

    fn segment(records: &[(u64, &[u8])]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for (tx, payload) in records {
            out.extend(frame(*tx, payload));
        }
        out
    }

    fn read(bytes: &[u8]) -> (Result<Vec<Record>>, Option<End>) {
        let mut reader = SegmentReader::new(
            "seg".into(),
            Cursor::new(bytes.to_vec()),
            bytes.len() as u64,
        )
        .unwrap();
        let records: Result<Vec<_>> = reader.by_ref().collect();
        let end = reader.end().map(|e| match e {
            End::Clean => End::Clean,
            End::Torn { offset, reason } => End::Torn {
                offset: *offset,
                reason: reason.clone(),
            },
        });
        (records, end)
    }

    #[test]
    fn round_trips_batches() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Utf8, true),
            Field::new("b", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("x"), None])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let mut payload = Vec::new();
        write_batch(&mut payload, &batch).unwrap();
        assert_eq!(decode_batch(&payload).unwrap(), batch);
        // A transaction's writes, small (plain) and large (compressed).
        let big = arrow::compute::concat_batches(&batch.schema(), vec![&batch; 5000]).unwrap();
        for other in [&batch, &big] {
            let payload = encode_entries(&[("a", &batch), ("table_b", other)]).unwrap();
            assert_eq!(
                payload[0],
                u8::from(other.num_rows() > 2),
                "compressed flag"
            );
            let back = decode_entries(&payload).unwrap();
            assert_eq!(back.len(), 2);
            assert_eq!((back[0].0.as_str(), &back[0].1), ("a", &batch));
            assert_eq!((back[1].0.as_str(), &back[1].1), ("table_b", other));
        }
        let err = decode_entries(&[0, 1]).unwrap_err();
        assert!(err.contains("early"), "{err}");
    }

    /// Bytes that do not compress are stored as they are: a payload is never larger than
    /// its body and flag byte, so a body within [`MAX_BODY`] is a payload within
    /// [`MAX_PAYLOAD`], which replay reads back (zstd's frame made a body of random bytes a
    /// little larger, and one near the limit a record replay took for a torn tail).
    #[test]
    fn a_payload_is_never_larger_than_its_body() {
        use arrow::array::BinaryArray;
        const { assert!(MAX_BODY < MAX_PAYLOAD) };
        // 64 KiB of xorshift bytes: incompressible.
        let random: Vec<u8> = crate::testing::incompressible()
            .take(1 << 16)
            .map(|x| x as u8)
            .collect();
        let batch = RecordBatch::try_from_iter([(
            "blob",
            Arc::new(BinaryArray::from_iter_values([random.as_slice()])) as _,
        )])
        .unwrap();
        let mut body = Vec::new();
        write_batch(&mut body, &batch).unwrap();
        let payload = encode_entries(&[("t", &batch)]).unwrap();
        // The body: a count, the table's name and length, the stream.
        let body_len = 2 + 2 + 1 + 4 + body.len();
        assert_eq!(payload[0], 0, "stored as it is");
        assert_eq!(payload.len(), 1 + body_len);
        let back = decode_entries(&payload).unwrap();
        assert_eq!(back[0].1, batch);
    }

    /// A batch wider than one stream (thousands of dictionary-encoded label columns) is
    /// written as several streams and read back whole: same columns, order, values and
    /// metadata; a stream's rows differing from the others' is refused.
    #[test]
    fn wide_batches_are_several_streams_read_back_whole() {
        use arrow::array::{ArrayRef, DictionaryArray};
        use arrow::datatypes::Int32Type;
        let width = 3 * STREAM_COLUMNS + 5;
        let fields: Vec<Field> = (0..width)
            .map(|i| {
                Field::new(
                    format!("labels.l{i}"),
                    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                    true,
                )
            })
            .collect();
        let columns: Vec<ArrayRef> = (0..width)
            .map(|i| {
                let v = format!("v{i}");
                Arc::new(DictionaryArray::<Int32Type>::from_iter([
                    Some(v.as_str()),
                    None,
                ])) as ArrayRef
            })
            .collect();
        let metadata = std::collections::HashMap::from([("k".to_owned(), "v".to_owned())]);
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new_with_metadata(fields, metadata)),
            columns,
        )
        .unwrap();
        let mut payload = Vec::new();
        write_batch(&mut payload, &batch).unwrap();
        let streams = payload
            .windows(END_OF_STREAM.len())
            .filter(|w| *w == END_OF_STREAM)
            .count();
        assert_eq!(streams, width.div_ceil(STREAM_COLUMNS));
        assert_eq!(decode_batch(&payload).unwrap(), batch);
        let entries = decode_entries(&encode_entries(&[("t", &batch)]).unwrap()).unwrap();
        assert_eq!(entries[0].1, batch);

        // Streams of different lengths are not one batch.
        let mut uneven = Vec::new();
        write_stream(&mut uneven, &batch.project(&[0]).unwrap()).unwrap();
        write_stream(&mut uneven, &batch.project(&[1]).unwrap().slice(0, 1)).unwrap();
        let err = decode_batch(&uneven).unwrap_err();
        assert!(err.to_string().contains("differ in rows"), "{err}");
    }

    /// Lengths declared inside a payload cost what the payload holds, not what it claims: an
    /// IPC message claiming 2 GiB of metadata and a zstd frame inflating to gigabytes are
    /// refused at once (both took seconds and gigabytes before; found by AFL++).
    #[test]
    fn declared_lengths_are_not_trusted() {
        let mut payload = vec![0u8, 1, 0, 1, 0, b't', 12, 0, 0, 0];
        payload.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        payload.extend_from_slice(&[1, 2, 3, 4]);
        let err = decode_entries(&payload).unwrap_err();
        assert!(err.contains("table \"t\""), "{err}");

        let limit = 1 << 20;
        let zeros = std::io::repeat(0).take(limit as u64 + 1);
        let mut bomb = Vec::new();
        zstd::stream::copy_encode(zeros, &mut bomb, 1).unwrap();
        assert!(bomb.len() < 1 << 10, "a small frame: {} bytes", bomb.len());
        let err = inflate(&bomb, limit).unwrap_err();
        assert!(err.contains("record limit"), "{err}");
        assert_eq!(inflate(&bomb[..], limit + 1).unwrap().len(), limit + 1);
    }

    #[test]
    fn reads_clean_segments() {
        let bytes = segment(&[(1, b"one"), (2, b""), (3, b"three")]);
        let (records, end) = read(&bytes);
        let records = records.unwrap();
        assert_eq!(records.iter().map(|r| r.tx).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(records[2].payload, b"three");
        assert_eq!(end, Some(End::Clean));
    }

    #[test]
    fn a_cut_last_record_is_a_torn_tail() {
        let bytes = segment(&[(1, b"one"), (2, b"two")]);
        let second = (MAGIC.len() + HEADER + 3) as u64;
        for cut in [
            bytes.len() - 1,
            bytes.len() - 4,
            second as usize + 3,
            second as usize + 19,
        ] {
            let (records, end) = read(&bytes[..cut]);
            assert_eq!(records.unwrap().len(), 1, "cut at {cut}");
            assert!(matches!(end, Some(End::Torn { offset, .. }) if offset == second));
        }
        // A flipped bit in the last record is indistinguishable from a torn write.
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let (records, end) = read(&flipped);
        assert_eq!(records.unwrap().len(), 1);
        assert!(matches!(end, Some(End::Torn { .. })));
        // Zero-filled preallocated space after the last record.
        let mut zeros = bytes.clone();
        zeros.extend([0u8; 100]);
        let (records, end) = read(&zeros);
        assert_eq!(records.unwrap().len(), 2);
        assert!(matches!(end, Some(End::Torn { reason, .. }) if reason.contains("zero")));
        // Garbage after the last record, as pages of an unfinished write persisted out of order.
        let mut garbage = bytes.clone();
        garbage.extend([0u8; 20]);
        garbage.extend(b"partial payload of a write that never finished");
        let (records, end) = read(&garbage);
        assert_eq!(records.unwrap().len(), 2);
        assert!(matches!(end, Some(End::Torn { .. })));
    }

    /// A bad record followed by headers that each claim the rest of the segment (their
    /// own checksums right, their payloads' wrong) is searched within a bound of work and
    /// reported as corruption. Searched in full, 4 MiB of them was 4 * 10^11 bytes of
    /// checksums; 64 MiB, hours.
    #[test]
    fn a_tail_of_headers_claiming_the_rest_is_searched_within_a_bound() {
        const TAIL: usize = 4 << 20;
        let mut bytes = MAGIC.to_vec();
        let start = bytes.len();
        bytes.resize(start + TAIL, 0);
        for at in (0..TAIL - HEADER).step_by(HEADER) {
            let n = (TAIL - at - HEADER) as u32;
            let mut header = [0u8; HEADER];
            header[0..4].copy_from_slice(&n.to_le_bytes());
            header[4..12].copy_from_slice(&1u64.to_le_bytes());
            let crc = crc32c::crc32c(&header[0..12]);
            header[12..16].copy_from_slice(&crc.to_le_bytes());
            header[16..20].copy_from_slice(&1u32.to_le_bytes());
            bytes[start + at..start + at + HEADER].copy_from_slice(&header);
        }
        let (records, _) = read(&bytes);
        match records.unwrap_err() {
            Error::WalCorrupt { offset, reason, .. } => {
                assert_eq!(offset, start as u64);
                assert!(reason.contains("search's bound"), "{reason}");
            }
            other => panic!("expected corruption, got {other}"),
        }
    }

    #[test]
    fn damage_before_the_end_is_corruption_naming_the_offset() {
        let bytes = segment(&[(1, b"one"), (2, b"two"), (3, b"three")]);
        let second = MAGIC.len() + HEADER + 3;
        for (at, what) in [(second + HEADER, "payload"), (second, "header")] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0xff;
            let (records, _) = read(&damaged);
            match records.unwrap_err() {
                Error::WalCorrupt {
                    segment,
                    offset,
                    reason,
                } => {
                    assert_eq!((segment.as_str(), offset), ("seg", second as u64));
                    assert!(reason.contains(what), "{reason}");
                }
                other => panic!("expected corruption, got {other}"),
            }
        }
        let mut bad_magic = bytes;
        bad_magic[0] = b'X';
        let err = SegmentReader::new("seg".into(), Cursor::new(bad_magic), 100)
            .err()
            .unwrap();
        assert!(matches!(err, Error::WalCorrupt { offset: 0, .. }));
    }
}
