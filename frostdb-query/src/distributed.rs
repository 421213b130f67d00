//! The plumbing of DataFusion plans spread over processes with [datafusion-distributed]
//! (gRPC, Arrow Flight data), whatever the plans compute: workers by URL ([`WorkerUrls`]),
//! channels that carry a cluster's secret to them ([`Channels`]), and a worker's gRPC
//! service that requires it ([`serve_worker`]). What a distributed plan reads and computes
//! is its caller's, given as the codec of its own plan nodes (frostdb-profile's merges).
//!
//! [datafusion-distributed]: https://github.com/datafusion-contrib/datafusion-distributed

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{DistributedExt, Worker, WorkerQueryContext, WorkerResolver};
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use crate::{Error, Result};

mod frames;
mod port;
pub use port::WorkerConnections;

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

/// Channels to workers that carry the cluster's secret in every request. A worker that
/// cannot be reached fails a call within [`CONNECT_TIMEOUT`]; one whose connection went
/// silent (its host gone without a reset, a peer that accepts and never answers) within
/// [`KEEPALIVE_INTERVAL`] plus [`KEEPALIVE_TIMEOUT`] (HTTP/2 pings unanswered), rather
/// than holding its merge and query slot until the request's deadline.
#[derive(Clone)]
pub struct Channels {
    /// One lazily connecting channel per worker (reconnecting after a failure).
    channels:
        Arc<parking_lot::Mutex<std::collections::HashMap<url::Url, tonic::transport::Channel>>>,
    header: Option<http::HeaderValue>,
}

/// Longest a connection to a worker may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How often an HTTP/2 ping goes to a worker (idle or not).
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Longest a worker may take to answer a ping before its connection is closed, failing the
/// calls on it.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Workers' channels kept at most (they come from the configuration: a few).
const MAX_CHANNELS: usize = 1024;

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

    /// The channel to the worker at `url`, made on first use (connecting when a call needs
    /// it, within the bounds above).
    fn channel(&self, url: &url::Url) -> DfResult<tonic::transport::Channel> {
        let mut channels = self.channels.lock();
        if let Some(channel) = channels.get(url) {
            return Ok(channel.clone());
        }
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| {
                DataFusionError::Configuration(format!("worker address {url} is not usable: {e}"))
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(Some(KEEPALIVE_INTERVAL * 3))
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_lazy();
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        channels.insert(url.clone(), channel.clone());
        Ok(channel)
    }
}

#[async_trait]
impl datafusion_distributed::ChannelResolver for Channels {
    async fn get_worker_client_for_url(
        &self,
        url: &url::Url,
    ) -> DfResult<Box<dyn datafusion_distributed::WorkerChannel>> {
        let channel = self.channel(url)?;
        let header = self.header.clone();
        let channel = datafusion_distributed::grpc::BoxCloneSyncChannel::new(
            tower::ServiceBuilder::new()
                .map_request(move |mut r: http::Request<tonic::body::Body>| {
                    if let Some(header) = &header {
                        r.headers_mut().insert(AUTHORIZATION, header.clone());
                    }
                    r
                })
                // Each message of the answer within a bound before tonic reserves it.
                .map_response(|r: http::Response<tonic::body::Body>| {
                    r.map(|body| {
                        tonic::body::Body::new(frames::MessagesAtMost::new(
                            body,
                            MAX_WORKER_MESSAGE_BYTES,
                        ))
                    })
                })
                .service(channel),
        );
        Ok(datafusion_distributed::grpc::create_worker_client(channel))
    }
}

/// Largest request a worker decodes: a plan (with the blocks its tasks read) or a batch of
/// work units. A merge's plan is a few KiB plus each block's manifest entry.
pub const MAX_WORKER_REQUEST_BYTES: usize = 64 << 20;

/// Largest message of a worker's answer a coordinator (or another worker) takes: a worker
/// splits its Arrow Flight data into messages of at most half of it.
pub const MAX_WORKER_MESSAGE_BYTES: usize = 64 << 20;

/// An object store registry that has none: a worker's plans read only through their
/// codec's own nodes, so a plan naming files (`file://`, a bucket) reads nothing.
#[derive(Debug)]
struct NoObjectStores;

impl ObjectStoreRegistry for NoObjectStores {
    fn register_store(
        &self,
        _url: &url::Url,
        _store: Arc<dyn datafusion::object_store::ObjectStore>,
    ) -> Option<Arc<dyn datafusion::object_store::ObjectStore>> {
        None
    }

    fn get_store(
        &self,
        url: &url::Url,
    ) -> DfResult<Arc<dyn datafusion::object_store::ObjectStore>> {
        Err(DataFusionError::Plan(format!(
            "a worker reads no object store: {url} is not read"
        )))
    }
}

/// What a worker's plans run in: no object store ([`NoObjectStores`]), no spilling to
/// disk, and `memory` for every operator's reservations (a plan past it fails, naming the
/// limit, instead of taking the process's memory).
fn worker_runtime(memory: Arc<dyn MemoryPool>) -> Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(NoObjectStores))
        .with_disk_manager_builder(
            DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
        )
        .with_memory_pool(memory)
        .build_arc()
        .map_err(|e| Error::Config(format!("a worker's runtime: {e}")))
}

/// The nodes of datafusion-distributed a worker's plan reads other stages through.
const NETWORK_LEAVES: [&str; 3] = [
    "NetworkShuffleExec",
    "NetworkCoalesceExec",
    "NetworkBroadcastExec",
];

/// Whether every leaf of `plan` (what its rows come from) is one of `leaves` or reads
/// another stage of the plan ([`NETWORK_LEAVES`]): a plan of DataFusion's own sources (files,
/// generated rows, values in the plan) is refused before it runs. Walked with a stack of
/// its own, never recursion: the plan is what a client sent.
fn check_leaves(plan: &Arc<dyn ExecutionPlan>, leaves: &[&str]) -> DfResult<()> {
    let mut open = vec![plan];
    while let Some(node) = open.pop() {
        let children = node.children();
        let name = node.name();
        if children.is_empty() && !leaves.contains(&name) && !NETWORK_LEAVES.contains(&name) {
            return Err(DataFusionError::Plan(format!(
                "a worker runs only plans that read through {}: this one reads through {name}",
                leaves.join(", ")
            )));
        }
        open.extend(children);
    }
    Ok(())
}

/// Serves this process as a worker of distributed plans on `listener` (gRPC), decoding
/// their own nodes with `codec`, until `shutdown` completes. With `secret`, it refuses
/// (`unauthenticated`) every request not carrying it as `authorization: Bearer <secret>`,
/// as [`Channels`] send it; the plans a worker takes read the tenants' data, so nobody
/// else may send them. It sends the secret itself to the workers it asks in turn. Without
/// one it takes plans from anyone who can reach it: a trusted network only.
///
/// Whoever sends plans, they run in [`worker_runtime`]: reservations from `memory`, no
/// file or bucket read but through `codec`'s nodes, nothing spilled. A plan whose rows come
/// from anything but `leaves` (the names of `codec`'s nodes that read data) and the stages
/// of the plan itself is refused before it runs, and a request larger than
/// [`MAX_WORKER_REQUEST_BYTES`] before it is decoded. Its connections are bounded as
/// `connections` says, before any request is read ([`port`]).
pub async fn serve_worker<C>(
    listener: tokio::net::TcpListener,
    codec: C,
    leaves: &'static [&'static str],
    secret: Option<&str>,
    memory: Arc<dyn MemoryPool>,
    connections: &WorkerConnections,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::result::Result<(), String>
where
    C: PhysicalExtensionCodec + Clone + Send + Sync + 'static,
{
    let listen: Option<SocketAddr> = listener.local_addr().ok();
    let channels = Channels::new(secret).map_err(|e| e.to_string())?;
    let header = channels.header.clone();
    let runtime = worker_runtime(memory).map_err(|e| e.to_string())?;
    let worker = Worker::from_session_builder(move |ctx: WorkerQueryContext| {
        let (codec, channels) = (codec.clone(), channels.clone());
        async move {
            Ok(ctx
                .builder
                .with_distributed_user_codec(codec)
                .with_distributed_channel_resolver(channels)
                .with_distributed_worker_plan_rewrite_handler(
                    move |ev: datafusion_distributed::WorkerPlanRewriteEvent<'_>| {
                        check_leaves(&ev.plan, leaves)?;
                        Ok(datafusion_distributed::WorkerPlanRewriteEventResponse::new(
                            ev.plan,
                        ))
                    },
                )
                .build())
        }
    })
    .with_runtime_env(runtime)
    .with_max_message_size(MAX_WORKER_MESSAGE_BYTES / 2);
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
        .http2_keepalive_interval(Some(connections.keepalive))
        .http2_keepalive_timeout(Some(connections.keepalive))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            worker
                .into_worker_server()
                .max_decoding_message_size(MAX_WORKER_REQUEST_BYTES),
            check,
        ))
        .serve_with_incoming_shutdown(port::incoming(listener, connections), shutdown)
        .await
        .map_err(|e| format!("query worker on {listen:?}: {e}"))
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion_distributed::ChannelResolver;

    /// A worker that accepts connections and never answers fails the call (its pings go
    /// unanswered) instead of holding it: the coordinator's channels had no keepalive, so a
    /// merge waited for such a worker until the request's deadline, holding a query slot.
    #[tokio::test]
    async fn a_worker_that_accepts_and_never_answers_fails_the_call() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let _silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let channels = Channels::new(Some("secret")).unwrap();
        let mut worker = channels.get_worker_client_for_url(&url).await.unwrap();
        // A bound far past the keepalive's, for a test that would otherwise hang.
        let bound = (CONNECT_TIMEOUT + KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT) * 10;
        let answer = tokio::time::timeout(
            bound,
            worker.get_worker_info(datafusion_distributed::GetWorkerInfoRequest {}),
        )
        .await;
        assert!(
            matches!(answer, Ok(Err(_))),
            "the call failed rather than waited: {:?}",
            answer.map(|a| a.map(|_| ()))
        );
    }
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
    use datafusion::physical_plan::union::UnionExec;

    /// A worker's plan may read only through the leaves it is given (and other stages): a
    /// plan of DataFusion's own sources is refused, naming the source, wherever it sits.
    #[test]
    fn a_plan_reading_anything_but_the_given_leaves_is_refused() {
        let schema = Arc::new(Schema::empty());
        let empty: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(schema.clone()));
        let row: Arc<dyn ExecutionPlan> = Arc::new(PlaceholderRowExec::new(schema));
        check_leaves(&empty, &["EmptyExec"]).unwrap();
        let e = check_leaves(&empty, &["StackScanExec"]).unwrap_err();
        assert!(e.to_string().contains("reads through EmptyExec"), "{e}");
        // Below a node that is allowed, beside a leaf that is.
        let union = UnionExec::try_new(vec![empty.clone(), row]).unwrap();
        let e = check_leaves(&union, &["EmptyExec"]).unwrap_err();
        assert!(
            e.to_string().contains("reads through PlaceholderRowExec"),
            "{e}"
        );
        let both = UnionExec::try_new(vec![empty.clone(), empty]).unwrap();
        check_leaves(&both, &["EmptyExec"]).unwrap();
    }
}
