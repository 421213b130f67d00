//! The plumbing of DataFusion plans spread over processes with [datafusion-distributed]
//! (gRPC, Arrow Flight data), whatever the plans compute: workers by URL ([`WorkerUrls`]),
//! channels that carry a cluster's secret to them ([`Channels`]), and a worker's gRPC
//! service that requires it ([`serve_worker`]). What a distributed plan reads and computes
//! is its caller's, given as the codec of its own plan nodes (frostdb-profile's merges).
//!
//! [datafusion-distributed]: https://github.com/datafusion-contrib/datafusion-distributed

use std::net::SocketAddr;

use async_trait::async_trait;
use datafusion::error::Result as DfResult;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerResolver};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use crate::{Error, Result};

/// Workers given by URL.
#[derive(Debug, Clone)]
pub struct WorkerUrls(pub Vec<url::Url>);

impl WorkerUrls {
    /// The workers at `workers` (`http://host:port`); an error names one that is not a URL.
    pub fn parse(workers: &[String]) -> Result<Self> {
        let urls = workers
            .iter()
            .map(|w| {
                url::Url::parse(w)
                    .map_err(|e| Error::Config(format!("worker address {w:?} is not a URL: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        if urls.is_empty() {
            return Err(Error::Config("a cluster needs at least one worker".into()));
        }
        Ok(Self(urls))
    }
}

impl WorkerResolver for WorkerUrls {
    fn get_urls(&self) -> DfResult<Vec<url::Url>> {
        Ok(self.0.clone())
    }
}

/// The header a coordinator sends its cluster's secret in, and a worker checks.
const AUTHORIZATION: &str = "authorization";

/// `Bearer <secret>` as a header value, or an error naming what is wrong with it.
fn bearer(secret: &str) -> Result<http::HeaderValue> {
    if secret.is_empty() {
        return Err(Error::Config("the cluster's secret is empty".into()));
    }
    http::HeaderValue::from_str(&format!("Bearer {secret}"))
        .map_err(|_| Error::Config("the cluster's secret must be printable ASCII".into()))
}

/// Channels to workers that carry the cluster's secret in every request.
#[derive(Clone)]
pub struct Channels {
    channels: datafusion_distributed::grpc::DefaultChannelResolver,
    header: Option<http::HeaderValue>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels")
            .field("authenticated", &self.header.is_some())
            .finish_non_exhaustive()
    }
}

impl Channels {
    /// Channels sending `secret` (if any) as `authorization: Bearer <secret>`.
    pub fn new(secret: Option<&str>) -> Result<Self> {
        Ok(Self {
            channels: Default::default(),
            header: secret.map(bearer).transpose()?,
        })
    }
}

#[async_trait]
impl datafusion_distributed::ChannelResolver for Channels {
    async fn get_worker_client_for_url(
        &self,
        url: &url::Url,
    ) -> DfResult<Box<dyn datafusion_distributed::WorkerChannel>> {
        let channel = self.channels.get_channel(url).await?;
        let channel = match self.header.clone() {
            None => channel,
            Some(header) => datafusion_distributed::grpc::BoxCloneSyncChannel::new(
                tower::ServiceBuilder::new()
                    .map_request(move |mut r: http::Request<tonic::body::Body>| {
                        r.headers_mut().insert(AUTHORIZATION, header.clone());
                        r
                    })
                    .service(channel),
            ),
        };
        Ok(datafusion_distributed::grpc::create_worker_client(channel))
    }
}

/// Serves this process as a worker of distributed plans on `listener` (gRPC), decoding
/// their own nodes with `codec`, until `shutdown` completes. With `secret`, it refuses
/// (`unauthenticated`) every request not carrying it as `authorization: Bearer <secret>`,
/// as [`Channels`] send it; the plans a worker takes read the tenants' data, so nobody
/// else may send them. It sends the secret itself to the workers it asks in turn. Without
/// one it takes plans from anyone who can reach it: a trusted network only.
pub async fn serve_worker<C>(
    listener: tokio::net::TcpListener,
    codec: C,
    secret: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::result::Result<(), String>
where
    C: PhysicalExtensionCodec + Clone + Send + Sync + 'static,
{
    let listen: Option<SocketAddr> = listener.local_addr().ok();
    let channels = Channels::new(secret).map_err(|e| e.to_string())?;
    let header = channels.header.clone();
    let worker = Worker::from_session_builder(move |ctx: WorkerQueryContext| {
        let (codec, channels) = (codec.clone(), channels.clone());
        async move {
            Ok(ctx
                .builder
                .with_distributed_user_codec(codec)
                .with_distributed_channel_resolver(channels)
                .build())
        }
    });
    let check = move |request: tonic::Request<()>| -> std::result::Result<_, tonic::Status> {
        let Some(expected) = &header else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get(AUTHORIZATION)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if constant_time_eq(given, expected.as_bytes()) {
            Ok(request)
        } else {
            Err(tonic::Status::unauthenticated(
                "this worker takes plans only from its cluster: the request lacks the cluster's secret ([cluster] secret)",
            ))
        }
    };
    tonic::transport::Server::builder()
        .add_service(tonic::service::interceptor::InterceptedService::new(
            worker.into_worker_server(),
            check,
        ))
        .serve_with_incoming_shutdown(
            // Without NODELAY small answers wait out the peer's delayed ACK: 40 ms a hop.
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
        .map_err(|e| format!("query worker on {listen:?}: {e}"))
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}
