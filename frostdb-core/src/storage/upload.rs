//! Writing one object to an object store from a stream of bytes: [`Upload`].

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload};

/// The upload of one object from bytes written in order: parts of [`Upload::PART`] bytes
/// of a multipart upload, at most [`Upload::IN_FLIGHT`] at once, or one put for an object
/// smaller than a part.
///
/// An upload either completes or leaves nothing behind: a failure (a part, the
/// completion) aborts the parts sent so far, and so does dropping it unfinished (its
/// caller's error, a request's deadline, a future dropped midway through
/// [`Upload::finish`]), on the Tokio runtime it is dropped on. S3 keeps, and bills, the
/// parts of a multipart upload neither completed nor aborted, and they are no objects:
/// no listing or orphan sweep ever finds them. object_store's `WriteMultipart` and
/// `BufWriter` leave them when a part fails, or when dropped.
///
/// Memory: at most `IN_FLIGHT` parts in flight and one filling, besides what the caller's
/// last write holds (a part may be a slice of it).
#[derive(Debug)]
pub struct Upload {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    /// Bytes not yet sent, and how many.
    pending: Vec<Bytes>,
    pending_bytes: usize,
    /// The multipart upload, once the object is past one part, until completed or
    /// aborted; and its parts in flight.
    multipart: Option<Box<dyn MultipartUpload>>,
    parts: tokio::task::JoinSet<object_store::Result<()>>,
    /// Given up (a failure): finishing it would put whatever is pending as the object.
    aborted: bool,
}

impl Upload {
    /// Bytes of a part (S3 takes parts of 5 MiB to 5 GiB, the last one smaller).
    pub const PART: usize = 8 << 20;
    /// Parts in flight at once.
    pub const IN_FLIGHT: usize = 2;

    /// An upload of the object at `path`: nothing is sent until a part's worth is written.
    pub fn new(store: Arc<dyn ObjectStore>, path: ObjectPath) -> Self {
        Self {
            store,
            path,
            pending: Vec::new(),
            pending_bytes: 0,
            multipart: None,
            parts: tokio::task::JoinSet::new(),
            aborted: false,
        }
    }

    /// Writes `bytes` after those written before: each part's worth is sent as it is
    /// pending, after waiting for room among the parts in flight (every part but the
    /// last is `PART` bytes, sliced from what is written without copying). A failure
    /// aborts the upload.
    pub async fn write(&mut self, mut bytes: Bytes) -> object_store::Result<()> {
        while self.pending_bytes + bytes.len() >= Self::PART {
            let part = bytes.split_to(Self::PART - self.pending_bytes);
            self.pending.push(part);
            self.pending_bytes = Self::PART;
            let sent = self.send(Self::IN_FLIGHT).await;
            self.aborted_if_failed(sent).await?;
        }
        if !bytes.is_empty() {
            self.pending_bytes += bytes.len();
            self.pending.push(bytes);
        }
        Ok(())
    }

    /// Sends the last bytes and completes the upload (or puts the object, smaller than a
    /// part). A failure aborts the upload.
    pub async fn finish(mut self) -> object_store::Result<()> {
        if self.aborted {
            return Err(object_store::Error::Generic {
                store: "upload",
                source: format!("the upload of {} failed before it was finished", self.path).into(),
            });
        }
        if self.multipart.is_none() {
            let payload: PutPayload = std::mem::take(&mut self.pending).into_iter().collect();
            self.pending_bytes = 0;
            return self.store.put(&self.path, payload).await.map(|_| ());
        }
        let completed = async {
            if self.pending_bytes > 0 {
                self.send(Self::IN_FLIGHT).await?;
            }
            while !self.parts.is_empty() {
                self.joined().await?;
            }
            if let Some(multipart) = &mut self.multipart {
                multipart.complete().await?;
            }
            self.multipart = None;
            Ok(())
        }
        .await;
        self.aborted_if_failed(completed).await
    }

    /// Gives up the upload: its parts in flight are stopped and those sent aborted (an
    /// error aborting them is logged: the store keeps them, and only its own expiry of
    /// unfinished uploads removes them).
    pub async fn abort(mut self) {
        self.give_up().await;
    }

    async fn give_up(&mut self) {
        self.aborted = true;
        self.pending.clear();
        self.pending_bytes = 0;
        self.parts.shutdown().await;
        if let Some(mut multipart) = self.multipart.take()
            && let Err(error) = multipart.abort().await
        {
            tracing::warn!(path = %self.path, %error, "aborting a failed upload failed; the store keeps its parts");
        }
    }

    async fn aborted_if_failed(
        &mut self,
        result: object_store::Result<()>,
    ) -> object_store::Result<()> {
        if result.is_err() {
            self.give_up().await;
        }
        result
    }

    /// Sends the pending bytes as a part, the multipart upload begun if it was not, once
    /// fewer than `in_flight` parts are in flight.
    async fn send(&mut self, in_flight: usize) -> object_store::Result<()> {
        while self.parts.len() >= in_flight.max(1) {
            self.joined().await?;
        }
        let payload: PutPayload = std::mem::take(&mut self.pending).into_iter().collect();
        self.pending_bytes = 0;
        let mut multipart = match self.multipart.take() {
            Some(multipart) => multipart,
            None => self.store.put_multipart(&self.path).await?,
        };
        self.parts.spawn(multipart.put_part(payload));
        self.multipart = Some(multipart);
        Ok(())
    }

    /// Waits for a part in flight.
    async fn joined(&mut self) -> object_store::Result<()> {
        match self.parts.join_next().await {
            Some(Ok(part)) => part,
            Some(Err(e)) => Err(object_store::Error::Generic {
                store: "upload",
                source: Box::new(e),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        // Dropped unfinished: the parts in flight stop with the JoinSet, and those sent
        // are aborted on the runtime (without one, nothing can be sent: the store keeps
        // them, and says so).
        let Some(mut multipart) = self.multipart.take() else {
            return;
        };
        // Before the abort: a part landing after it would be kept.
        self.parts.abort_all();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let path = self.path.clone();
                runtime.spawn(async move {
                    if let Err(error) = multipart.abort().await {
                        tracing::warn!(%path, %error, "aborting an upload dropped unfinished failed; the store keeps its parts");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(path = %self.path, "an upload dropped unfinished outside a runtime cannot be aborted; the store keeps its parts");
            }
        }
    }
}

impl parquet::arrow::async_writer::AsyncFileWriter for Upload {
    fn write(&mut self, bs: Bytes) -> futures::future::BoxFuture<'_, parquet::errors::Result<()>> {
        Box::pin(async move {
            Upload::write(self, bs)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn complete(&mut self) -> futures::future::BoxFuture<'_, parquet::errors::Result<()>> {
        // The writer's owner finishes the upload itself ([`Upload::finish`]), so that a
        // failure before (a batch that could not be read) aborts it.
        Box::pin(async { Ok(()) })
    }
}
