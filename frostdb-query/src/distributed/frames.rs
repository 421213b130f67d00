//! A worker's answer held to a bound per gRPC message before it is decoded.
//!
//! The worker client of datafusion-distributed decodes messages of any size (it sets
//! `max_decoding_message_size(usize::MAX)`), and tonic reserves a message's declared length
//! from its 5-byte prefix before any of it arrives: whatever answers at a worker's address
//! (a misconfigured peer, anything on a plain-text network) could have the coordinator
//! reserve 4 GiB with five bytes. [`MessagesAtMost`] reads the prefixes as the frames pass
//! and fails the body at one declaring more than its bound, before tonic reads it.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A gRPC body whose messages may declare at most `most` bytes each.
pub(crate) struct MessagesAtMost<B> {
    inner: B,
    most: usize,
    messages: crate::grpc_frames::MessagePrefixes,
}

impl<B> MessagesAtMost<B> {
    pub(crate) fn new(inner: B, most: usize) -> Self {
        Self {
            inner,
            most,
            messages: Default::default(),
        }
    }

    /// Follows `data` through the messages; an error at a prefix declaring too much.
    fn check(&mut self, data: &[u8]) -> Result<(), BoxError> {
        let most = self.most;
        self.messages.follow(data, |_, len| match len {
            Some(len) if len > most => Err(format!(
                "a worker's answer holds a message of {len} bytes, over the {most} one may hold"
            )
            .into()),
            _ => Ok(()),
        })
    }
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

    /// `parts` as one body's frames.
    fn body(parts: Vec<Vec<u8>>) -> MessagesAtMost<http_body_util::StreamBody<Frames>> {
        let frames: Vec<_> = parts
            .into_iter()
            .map(|p| Ok(Frame::data(Bytes::from(p))))
            .collect();
        MessagesAtMost::new(
            http_body_util::StreamBody::new(futures::stream::iter(frames)),
            100,
        )
    }

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0];
        m.extend(len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
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
}
