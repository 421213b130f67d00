//! Arrow IPC messages measured before arrow decodes them. arrow's reader trusts what a
//! message states: it reserves the length a compressed buffer's prefix states, inflates an
//! LZ4 frame to its end whatever length was stated, slices buffers without checking them
//! against their body, and extends a dictionary by a delta by copying it whole. Whoever
//! decodes IPC from another party (a client's record, a peer's answer) counts each message
//! here first.

use std::collections::HashMap;

use arrow::ipc::{CompressionType, Message, MessageHeader};

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpcFault {
    /// It would inflate past the room it was given.
    TooLarge,
    /// It is not what it claims to be (the reason).
    Invalid(String),
}

/// The bytes the messages of one IPC stream inflate to, counted message by message.
#[derive(Debug, Default)]
pub struct IpcBytes {
    /// Each dictionary's size so far, by id.
    dictionaries: HashMap<i64, usize>,
}

impl IpcBytes {
    /// What decoding `message` (its body `body`) allocates, at most `room` bytes: its
    /// buffers at the lengths they state (a compressed buffer's prefix; an LZ4 frame is
    /// inflated into nothing first, to check it states its length truly), a dictionary
    /// batch at the size of the whole dictionary it makes (a delta is a copy of all of it,
    /// and the batches decoded before keep theirs). Every buffer must lie in its body.
    pub fn message(
        &mut self,
        message: &Message<'_>,
        body: &[u8],
        room: usize,
    ) -> Result<usize, IpcFault> {
        let (batch, dictionary) = match message.header_type() {
            MessageHeader::RecordBatch => (message.header_as_record_batch(), None),
            MessageHeader::DictionaryBatch => match message.header_as_dictionary_batch() {
                Some(d) => (d.data(), Some((d.id(), d.isDelta()))),
                None => (None, None),
            },
            _ => (None, None),
        };
        let Some(batch) = batch else {
            return Ok(0);
        };
        let codec = batch.compression().map(|c| c.codec());
        let mut bytes = 0usize;
        for buffer in batch.buffers().into_iter().flatten() {
            let (offset, length) = (buffer.offset(), buffer.length());
            let range = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(length).ok())
                .and_then(|(start, length)| Some(start..start.checked_add(length)?))
                .filter(|r| r.end <= body.len());
            let Some(range) = range else {
                return Err(IpcFault::Invalid(format!(
                    "a buffer at {offset} of {length} bytes is outside its body of {}",
                    body.len()
                )));
            };
            let stated = match codec {
                Some(codec) if range.len() >= 8 => {
                    let data = &body[range];
                    let n = i64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
                    match usize::try_from(n) {
                        // -1: stored uncompressed.
                        Err(_) => data.len(),
                        Ok(n) => {
                            if bytes.saturating_add(n) > room {
                                return Err(IpcFault::TooLarge);
                            }
                            // Stating 0, the buffer is empty, whatever follows.
                            if codec == CompressionType::LZ4_FRAME && n > 0 {
                                lz4_fits(&data[8..], n as u64).map_err(IpcFault::Invalid)?;
                            }
                            n
                        }
                    }
                }
                _ => range.len(),
            };
            bytes = bytes.saturating_add(stated);
        }
        if let Some((id, delta)) = dictionary {
            let size = self.dictionaries.entry(id).or_insert(0);
            *size = if delta {
                size.saturating_add(bytes)
            } else {
                bytes
            };
            bytes = *size;
        }
        if bytes > room {
            return Err(IpcFault::TooLarge);
        }
        Ok(bytes)
    }
}

/// Whether the LZ4 frame `frame` inflates to exactly `stated` bytes, read through into
/// nothing and stopped one byte past: the reason if not.
fn lz4_fits(frame: &[u8], stated: u64) -> Result<(), String> {
    use std::io::Read;
    let mut inflated = lz4_flex::frame::FrameDecoder::new(frame).take(stated.saturating_add(1));
    match std::io::copy(&mut inflated, &mut std::io::sink()) {
        Ok(n) if n == stated => Ok(()),
        Ok(n) if n > stated => Err(format!(
            "an LZ4 buffer inflates past the {stated} bytes it states"
        )),
        Ok(n) => Err(format!(
            "an LZ4 buffer inflates to {n} bytes, not the {stated} it states"
        )),
        Err(e) => Err(format!("an LZ4 buffer is not a valid frame: {e}")),
    }
}
