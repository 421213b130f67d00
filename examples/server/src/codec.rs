//! Request messages decoded within the request limits: every message a client sends (a
//! push, an OTLP export, a query or settings call) has its sizes and counts checked on its
//! bytes before it is decoded ([`frostdb_pprof::bounds`]), over Connect and plain HTTP by
//! the handlers, over gRPC and gRPC-Web by [`BoundedCodec`], the codec of the generated
//! tonic services (`build.rs`).

use std::marker::PhantomData;
use std::sync::OnceLock;

use frostdb_pprof::RequestLimits;
use frostdb_pprof::bounds::{self, Bounded};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::Config;
use super::error::ApiError;

/// Labels a push series may carry beyond `limits.max_label_names_per_series` before its
/// bytes are refused unread: `__name__`, and span labels, which the limit does not count.
const RESERVED_LABELS: usize = 8;

/// The request limits of a server with `config`: the library's defaults, with a decoded
/// request allowed twice the decompressed body limit, a push series as many labels as the
/// label limit allows (and the reserved ones), a settings call `limits.max_settings_bytes`.
pub fn request_limits(config: &Config) -> RequestLimits {
    RequestLimits {
        max_decoded_bytes: config.limits.max_decompressed_bytes.saturating_mul(2),
        max_labels_per_series: config
            .limits
            .max_label_names_per_series
            .saturating_add(RESERVED_LABELS),
        max_settings_bytes: config.limits.max_settings_bytes,
        max_label_name_bytes: config.limits.max_label_name_length,
        max_label_value_bytes: config.limits.max_label_value_length,
        ..RequestLimits::default()
    }
}

/// A push refused on its bytes, its message naming the configured limit that set the
/// request limit it broke.
pub fn push_refusal(e: frostdb_pprof::Error, config: &Config) -> ApiError {
    match e {
        frostdb_pprof::Error::TooLarge {
            what: "series[].labels",
            limit,
        } => ApiError::too_large(format!(
            "a series of the push has more than {limit} labels: over the label limit max_label_names_per_series = {} (limits.max_label_names_per_series, {RESERVED_LABELS} more allowed for __name__ and span labels)",
            config.limits.max_label_names_per_series
        )),
        e => e.into(),
    }
}

/// The limits [`BoundedCodec`] checks: tonic makes a codec for each call with `Default`,
/// so they cannot travel with it. Set from the configuration before a gRPC call is served
/// ([`set_grpc_limits`]); a process serves one configuration.
static GRPC_LIMITS: OnceLock<RequestLimits> = OnceLock::new();

/// Sets the limits of gRPC requests, once (later calls, with the same configuration, are
/// no-ops).
pub fn set_grpc_limits(config: &Config) {
    GRPC_LIMITS.get_or_init(|| request_limits(config));
}

/// The largest gRPC message a route inflates and decodes: the body limit, or a debug-file
/// upload's chunk (Parca Agent's are 8 MiB) when that is larger.
pub fn largest_grpc_message(config: &Config) -> usize {
    config.limits.max_body_bytes.max(9 << 20)
}

/// tonic's prost codec, but a request's bytes are checked within the request limits
/// before it is decoded: `T` is what the service answers, `U` what it is asked.
#[derive(Debug)]
pub struct BoundedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Bounded + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = AnswerEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        AnswerEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(PhantomData)
    }
}

/// Messages of at least this many bytes are decoded, and answers encoded, off the thread
/// that polls them.
pub(crate) const OFF_THE_ASYNC_THREAD_BYTES: usize = 256 << 10;

/// Encodes an answer as tonic's prost encoder does, a large one (a flame graph of a million
/// nodes is tens of megabytes) off the async thread that polls the call.
#[derive(Debug)]
pub struct AnswerEncoder<T>(PhantomData<T>);

impl<T: prost::Message> Encoder for AnswerEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // Measured once here; tonic's buffer grows as it is written (what `encode` would
        // measure again is its room). At most what a Connect answer may be.
        let len = item.encoded_len();
        if len > crate::query::MAX_JSON_ANSWER_BYTES {
            return Err(Status::resource_exhausted(
                crate::querier::transport::too_large_answer().message,
            ));
        }
        let mut encode = || item.encode_raw(buf);
        if len >= OFF_THE_ASYNC_THREAD_BYTES {
            crate::work::off_the_async_thread(encode)
        } else {
            encode()
        }
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Decodes a `U` once its bytes are within the request limits.
#[derive(Debug)]
pub struct BoundedDecoder<U>(PhantomData<U>);

impl<U> Decoder for BoundedDecoder<U>
where
    U: prost::Message + Default + Bounded,
{
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        use prost::bytes::Buf;
        let limits = GRPC_LIMITS.get().copied().unwrap_or_default();
        // tonic hands over a whole message, usually in one piece.
        let len = buf.remaining();
        // What the decoded message takes is charged to the request's memory before it is
        // made (`bounds::decode_protobuf`): the request is refused when the budget has no
        // room for it now (unavailable) or ever (resource exhausted).
        let memory = crate::edge::request_memory();
        if let Some(memory) = &memory {
            memory.inflated(len);
        }
        let decode = |bytes: &[u8]| {
            // Decoding runs where tonic polls the request: a message of megabytes (an
            // OTLP export, a Parca write) takes the thread for its whole decode, so its
            // runtime's other tasks move to another thread meanwhile.
            let decode = || {
                crate::ingest::charged(memory.clone(), || {
                    bounds::decode_protobuf("request", bytes, &limits)
                })
            };
            if len >= OFF_THE_ASYNC_THREAD_BYTES {
                crate::work::off_the_async_thread(decode)
            } else {
                decode()
            }
        };
        let decoded = if buf.chunk().len() == len {
            let decoded = decode(buf.chunk());
            buf.advance(len);
            decoded
        } else {
            decode(&buf.copy_to_bytes(len))
        };
        decoded
            .map(Some)
            .map_err(|e| super::querier::status(ApiError::from(e)))
    }
}
