//! A worker's answer held to bounds per gRPC message before it is decoded.
//!
//! The worker client of datafusion-distributed decodes messages of any size (it sets
//! `max_decoding_message_size(usize::MAX)`), and tonic reserves a message's declared length
//! from its 5-byte prefix before any of it arrives: whatever answers at a worker's address
//! (a misconfigured peer, anything on a plain-text network) could have the coordinator
//! reserve 4 GiB with five bytes. [`MessagesAtMost`] reads the prefixes as the frames pass
//! and fails the body at one declaring more than its bound, before tonic reads it. And
//! arrow inflates an Arrow Flight message's buffers to what they state (an LZ4 frame to
//! its end): each whole message is measured ([`frostdb_core::ipc::IpcBytes`]) before the
//! frame that ends it passes, so one stating 2^62 bytes, or an LZ4 frame of 255 times its
//! size, fails the body rather than abort the process or hold gigabytes.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A gRPC body whose messages may declare at most `most` bytes each, and inflate (as Arrow
/// Flight data) to at most [`MAX_INFLATED`] bytes each.
pub(crate) struct MessagesAtMost<B> {
    inner: B,
    most: usize,
    messages: crate::grpc_frames::MessagePrefixes,
    /// The bytes of the message being read (a copy: tonic holds them too, until decoded).
    message: Vec<u8>,
    inflated: frostdb_core::ipc::IpcBytes,
}

/// Most bytes one message of a worker's answer may inflate to: eight times what it may
/// hold (Arrow's LZ4 of profile rows is a few times smaller than they are).
pub(crate) const MAX_INFLATED: usize = 8 * super::MAX_WORKER_MESSAGE_BYTES;

impl<B> MessagesAtMost<B> {
    pub(crate) fn new(inner: B, most: usize) -> Self {
        Self {
            inner,
            most,
            messages: Default::default(),
            message: Vec::new(),
            inflated: Default::default(),
        }
    }

    /// Follows `data` through the messages; an error at a prefix declaring too much, or at
    /// the end of a message that would inflate past its bound or is not Arrow Flight data.
    fn check(&mut self, data: &[u8]) -> Result<(), BoxError> {
        use crate::grpc_frames::Passing;
        let Self {
            most,
            messages,
            message,
            inflated,
            ..
        } = self;
        messages.follow_messages(data, |passing| -> Result<(), BoxError> {
            match passing {
                Passing::Begun(_) => message.clear(),
                Passing::Stated { len, .. } if len > *most => {
                    return Err(format!(
                        "a worker's answer holds a message of {len} bytes, over the {most} one \
                         may hold"
                    )
                    .into());
                }
                Passing::Stated {
                    compressed: true, ..
                } => {
                    return Err(
                        "a worker's answer holds a compressed message, not asked for".into(),
                    );
                }
                Passing::Stated { .. } => {}
                Passing::Bytes(bytes) => message.extend_from_slice(bytes),
                Passing::Ended => {
                    measure(inflated, message)?;
                    *message = Vec::new();
                }
            }
            Ok(())
        })
    }
}

/// Measures `message`, a whole message of a worker's answer, as Arrow Flight data.
fn measure(inflated: &mut frostdb_core::ipc::IpcBytes, message: &[u8]) -> Result<(), BoxError> {
    use frostdb_core::ipc::IpcFault;
    let (header, body) = flight_data(message)
        .map_err(|e| format!("a worker's answer is not Arrow Flight data: {e}"))?;
    if header.is_empty() {
        return Ok(());
    }
    let header = arrow::ipc::root_as_message(header)
        .map_err(|e| format!("a worker's answer holds an invalid Arrow message: {e}"))?;
    match inflated.message(&header, body, MAX_INFLATED) {
        Ok(_) => Ok(()),
        Err(IpcFault::TooLarge) => Err(format!(
            "a worker's answer holds a message inflating past the {MAX_INFLATED} bytes one \
             may inflate to"
        )
        .into()),
        Err(IpcFault::Invalid(reason)) => {
            Err(format!("a worker's answer holds an invalid Arrow message: {reason}").into())
        }
    }
}

/// The IPC header (field 2) and body (field 1000) of an encoded `FlightData`.
fn flight_data(mut m: &[u8]) -> Result<(&[u8], &[u8]), String> {
    fn varint(m: &mut &[u8]) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = m.split_first().ok_or("a varint cut short")?;
            *m = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint over 10 bytes".into())
    }
    let (mut header, mut body): (&[u8], &[u8]) = (&[], &[]);
    while !m.is_empty() {
        let key = varint(&mut m)?;
        let skip = match key & 7 {
            0 => {
                varint(&mut m)?;
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let len = usize::try_from(varint(&mut m)?).map_err(|_| "a length")?;
                let field = m.get(..len).ok_or("a field runs past the message")?;
                match key >> 3 {
                    2 => header = field,
                    1000 => body = field,
                    _ => {}
                }
                len
            }
            wire => return Err(format!("wire type {wire}")),
        };
        m = m.get(skip..).ok_or("a field runs past the message")?;
    }
    Ok((header, body))
}

impl<B> Body for MessagesAtMost<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.check(data)?;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Frames =
        futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>;

    /// `parts` as one body's frames, of messages of at most `most` bytes.
    fn body_of(
        parts: Vec<Vec<u8>>,
        most: usize,
    ) -> MessagesAtMost<http_body_util::StreamBody<Frames>> {
        let frames: Vec<_> = parts
            .into_iter()
            .map(|p| Ok(Frame::data(Bytes::from(p))))
            .collect();
        MessagesAtMost::new(
            http_body_util::StreamBody::new(futures::stream::iter(frames)),
            most,
        )
    }

    fn body(parts: Vec<Vec<u8>>) -> MessagesAtMost<http_body_util::StreamBody<Frames>> {
        body_of(parts, 100)
    }

    /// A gRPC message of `payload`.
    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend((payload.len() as u32).to_be_bytes());
        m.extend(payload);
        m
    }

    /// A message of `len` bytes (0, or 2 to 129): a `FlightData` of app metadata only.
    fn message(len: u32) -> Vec<u8> {
        let payload: Vec<u8> = match len {
            0 => Vec::new(),
            _ => [0x1a, len as u8 - 2]
                .into_iter()
                .chain(std::iter::repeat_n(7u8, len as usize - 2))
                .collect(),
        };
        framed(&payload)
    }

    /// A protobuf length-delimited field.
    fn field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for mut v in [number << 3 | 2, bytes.len() as u64] {
            while v >= 0x80 {
                out.push(v as u8 | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        out.extend(bytes);
        out
    }

    /// The IPC header and body of a record batch of one LZ4-compressed Int64 column of
    /// `n` values.
    fn lz4_batch(n: i64) -> (Vec<u8>, Vec<u8>) {
        use std::sync::Arc;
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("v", arrow::datatypes::DataType::Int64, false),
        ]));
        let batch = arrow::array::RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::Int64Array::from_iter_values(0..n))],
        )
        .unwrap();
        let options = arrow::ipc::writer::IpcWriteOptions::default()
            .try_with_compression(Some(arrow::ipc::CompressionType::LZ4_FRAME))
            .unwrap();
        let (_, encoded) = arrow::ipc::writer::IpcDataGenerator::default()
            .encode(
                &batch,
                &mut arrow::ipc::writer::DictionaryTracker::new(false),
                &options,
                &mut Default::default(),
            )
            .unwrap();
        (encoded.ipc_message, encoded.arrow_data)
    }

    /// Messages within the bound pass, however the frames cut them (a prefix split over
    /// frames too); a prefix declaring more fails the body there, before its bytes come.
    #[test]
    fn a_message_declaring_more_than_the_bound_fails_the_body() {
        use http_body_util::BodyExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut ok = message(100);
        ok.extend(message(0));
        ok.extend(message(3));
        let cut: Vec<Vec<u8>> = ok.chunks(2).map(<[u8]>::to_vec).collect();
        let passed = runtime.block_on(body(cut).collect()).unwrap().to_bytes();
        assert_eq!(passed.to_vec(), ok);

        let mut bomb = message(5);
        bomb.extend([0, 0xff, 0xff, 0xff, 0xff]);
        let cut: Vec<Vec<u8>> = bomb.chunks(3).map(<[u8]>::to_vec).collect();
        let err = runtime.block_on(body(cut).collect()).err().unwrap();
        assert!(err.to_string().contains("4294967295 bytes"), "{err}");
    }

    /// A message whose Arrow buffers state more than they hold, or whose LZ4 frame
    /// inflates past what it states, fails the body before the frame ending it passes
    /// (arrow reserved the 2^62 bytes stated, and aborted the process).
    #[test]
    fn a_message_inflating_past_its_bound_or_its_statement_fails_the_body() {
        use http_body_util::BodyExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (header, data) = lz4_batch(10_000);
        let flight = |data: &[u8]| {
            let mut payload = field(2, &header);
            payload.extend(field(1000, data));
            framed(&payload)
        };
        let at = data
            .windows(8)
            .position(|w| w == 80_000i64.to_le_bytes())
            .unwrap();
        let run = |message: Vec<u8>| {
            let cut: Vec<Vec<u8>> = message.chunks(1000).map(<[u8]>::to_vec).collect();
            runtime.block_on(body_of(cut, 1 << 20).collect())
        };
        assert!(run(flight(&data)).is_ok(), "an honest batch passes");
        let mut huge = data.clone();
        huge[at..at + 8].copy_from_slice(&(1i64 << 62).to_le_bytes());
        let err = run(flight(&huge)).err().unwrap();
        assert!(err.to_string().contains("inflating past"), "{err}");
        let mut understated = data.clone();
        understated[at..at + 8].copy_from_slice(&8i64.to_le_bytes());
        let err = run(flight(&understated)).err().unwrap();
        assert!(
            err.to_string().contains("inflates past the 8 bytes"),
            "{err}"
        );
    }
}
