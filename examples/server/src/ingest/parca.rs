//! Parca Agent's gRPC services, on the server's port as Parca serves them (gRPC and
//! gRPC-Web): `parca.profilestore.v1alpha1.ProfileStoreService` (`WriteRaw`, `Write`
//! and `WriteArrow`, converted by
//! [`frostdb_pprof::convert::parca`]) and `parca.debuginfo.v1alpha1.DebuginfoService`
//! (uploads kept by [`frostdb_pprof::debuginfo`] in the tenant's object store). The tenant
//! is the `x-scope-orgid` metadata, as on every gRPC route.

use std::time::Duration;

use axum::extract::State;
use axum::response::Response;
use frostdb_pprof::convert::parca::{self, proto};
use frostdb_pprof::debuginfo::{self, DebugInfoStore, proto as di};
use futures::StreamExt;

use super::store;
use crate::Shared;
use crate::edge::RequestMemory;
use crate::querier::{grpc_tenant, serve_grpc, status};

/// The generated gRPC glue of the two services.
#[allow(missing_docs, clippy::all, unreachable_pub, rust_2018_idioms)]
pub mod grpc {
    include!(concat!(
        env!("OUT_DIR"),
        "/server/parca.profilestore.v1alpha1.rs"
    ));
    include!(concat!(
        env!("OUT_DIR"),
        "/server/parca.debuginfo.v1alpha1.rs"
    ));
    /// Clients, for tests.
    pub mod client {
        include!(concat!(
            env!("OUT_DIR"),
            "/client/parca.profilestore.v1alpha1.rs"
        ));
        include!(concat!(
            env!("OUT_DIR"),
            "/client/parca.debuginfo.v1alpha1.rs"
        ));
    }
}

/// The routes' path prefixes.
pub const PROFILE_STORE: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/{method}";
/// See [`PROFILE_STORE`].
pub const DEBUGINFO: &str = "/parca.debuginfo.v1alpha1.DebuginfoService/{method}";

/// The largest debug info file taken (Parca's default `--debuginfo-upload-max-size`).
pub const MAX_DEBUGINFO_BYTES: u64 = 1_000_000_000;
/// How long an upload may take before another may begin (Parca's default).
pub const MAX_UPLOAD_DURATION: Duration = Duration::from_secs(15 * 60);

/// Both services, answering a gRPC or gRPC-Web request.
pub async fn handle(State(state): State<Shared>, request: axum::extract::Request) -> Response {
    let limit = state.config.limits.max_body_bytes;
    let largest = crate::codec::largest_grpc_message(&state.config);
    crate::codec::set_grpc_limits(&state.config);
    let routes = tonic::service::Routes::new(
        grpc::profile_store_service_server::ProfileStoreServiceServer::new(Agent {
            state: state.clone(),
        })
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .max_decoding_message_size(limit),
    )
    .add_service(
        grpc::debuginfo_service_server::DebuginfoServiceServer::new(Agent { state })
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
            // An upload's chunks are 8 MiB (Parca Agent's); a file is streamed, not held.
            .max_decoding_message_size(largest),
    );
    serve_grpc(routes, request).await
}

#[derive(Debug, Clone)]
struct Agent {
    state: Shared,
}

/// [`debuginfo_store`] to upload to: within the tenant's quota (`limits.max_debuginfo_bytes`).
pub fn debuginfo_uploads(
    store: &frostdb_pprof::ProfileStore,
    limits: &crate::config::Limits,
) -> Option<DebugInfoStore> {
    debuginfo_store(store).map(|s| s.with_quota(limits.max_debuginfo_bytes))
}

/// The debug info files uploaded to a tenant, in its database's object store; `None` for a
/// database kept in memory.
pub fn debuginfo_store(store: &frostdb_pprof::ProfileStore) -> Option<DebugInfoStore> {
    let (objects, prefix) = store.db().object_store()?;
    Some(DebugInfoStore::new(
        objects,
        prefix,
        MAX_DEBUGINFO_BYTES,
        MAX_UPLOAD_DURATION,
    ))
}

impl Agent {
    /// The tenant's debug info store (its database's object store).
    async fn debuginfo(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<DebugInfoStore, tonic::Status> {
        let tenant = self.tenant(metadata).await?;
        debuginfo_uploads(&tenant.store, &self.state.config.limits).ok_or_else(|| {
            tonic::Status::failed_precondition("this server keeps no object store (in memory)")
        })
    }
}

impl Agent {
    /// The tenant a call's metadata names, opened for writing.
    async fn tenant(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<std::sync::Arc<crate::tenants::Tenant>, tonic::Status> {
        let tenant = grpc_tenant(metadata)?;
        self.state.tenants.for_write(&tenant).await.map_err(status)
    }
}

fn debuginfo_status(e: debuginfo::Error) -> tonic::Status {
    use debuginfo::Error as E;
    match e {
        E::Invalid(m) => tonic::Status::invalid_argument(m),
        E::Exists(m) => tonic::Status::already_exists(m),
        E::Precondition(m) => tonic::Status::failed_precondition(m),
        E::NotFound(m) => tonic::Status::not_found(m),
        E::Quota(m) => {
            tonic::Status::resource_exhausted(format!("{m} (limits.max_debuginfo_bytes)"))
        }
        E::Store(e) => {
            tracing::error!(error = %e, "debug info store");
            tonic::Status::unavailable(format!("debug info store: {e}"))
        }
    }
}

#[tonic::async_trait]
impl grpc::profile_store_service_server::ProfileStoreService for Agent {
    async fn write_raw(
        &self,
        request: tonic::Request<proto::WriteRawRequest>,
    ) -> Result<tonic::Response<proto::WriteRawResponse>, tonic::Status> {
        let tenant = grpc_tenant(request.metadata())?;
        let memory = request.extensions().get::<RequestMemory>().cloned();
        let request = request.into_inner();
        let converting = self.state.clone();
        let stored = store(&self.state, &tenant, memory, move || {
            let limits = converting.tenants.pprof_limits();
            Ok(parca::write_raw(&request, &limits)?)
        })
        .await
        .map_err(status)?;
        tracing::debug!(%tenant, profiles = stored.len(), "parca WriteRaw");
        Ok(tonic::Response::new(proto::WriteRawResponse {}))
    }

    type WriteStream =
        futures::channel::mpsc::Receiver<Result<proto::WriteResponse, tonic::Status>>;

    /// The two-phase stream of agents v0.32 to v0.47: the samples record; the server's
    /// answer naming every stack trace id in it; the agent's record of their locations;
    /// then the profiles are stored and the stream ends (an error if they were not).
    async fn write(
        &self,
        request: tonic::Request<tonic::Streaming<proto::WriteRequest>>,
    ) -> Result<tonic::Response<Self::WriteStream>, tonic::Status> {
        let tenant = grpc_tenant(request.metadata())?;
        let memory = request.extensions().get::<RequestMemory>().cloned();
        // The whole exchange is one request: its locations must come within the request's
        // deadline, counted from now (the deadline layer stops at the answer's head, and
        // the stream outlives it). Until then the task holds the samples record, and the
        // request body its share of the memory budget.
        let secs = self.state.config.limits.request_timeout_secs;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut inbound = request.into_inner();
        let samples = inbound
            .message()
            .await?
            .ok_or_else(|| tonic::Status::invalid_argument("the Write stream sent no record"))?
            .record;
        let limits = self.state.tenants.pprof_limits();
        let charged = memory.clone();
        // In the ingest lane, as every other decode: at most its slots at once, whatever
        // the streams of a connection.
        let (samples, wanted) = self
            .state
            .work
            .ingest
            .blocking(move |cancel| {
                let ids = crate::work::until_cancelled(cancel, || {
                    super::charged(charged, || parca::write_v1_wanted(&samples, &limits))
                })?;
                let wanted = parca::write_v1_request(&ids)?;
                Ok((samples, wanted))
            })
            .await
            .map_err(status)?;
        let (mut tx, rx) = futures::channel::mpsc::channel(2);
        tx.try_send(Ok(proto::WriteResponse { record: wanted }))
            .map_err(|e| tonic::Status::internal(e.to_string()))?;
        let state = self.state.clone();
        // The second record and its storing, under the request's deadline and memory: the
        // answer has begun, but the work is still the request's (before, it ran to its end
        // after the deadline and after the client left, and its record was charged to
        // nothing).
        let charged_to = memory.clone();
        tokio::spawn(crate::edge::charging_to(charged_to, async move {
            let locations = match tokio::time::timeout_at(deadline, inbound.message()).await {
                Err(_) => {
                    tracing::info!(%tenant, "parca Write: no locations record within the deadline");
                    let _ = tx.try_send(Err(tonic::Status::deadline_exceeded(format!(
                        "the record of locations did not come within {secs} s of the samples \
                         (limits.request_timeout_secs)"
                    ))));
                    return;
                }
                Ok(Ok(Some(m))) => m.record,
                Ok(Ok(None)) => {
                    let _ = tx.try_send(Err(tonic::Status::invalid_argument(
                        "the Write stream ended before the record of locations",
                    )));
                    return;
                }
                Ok(Err(e)) => {
                    let _ = tx.try_send(Err(e));
                    return;
                }
            };
            let converting = state.clone();
            let stored = crate::edge::until(
                deadline,
                store(&state, &tenant, memory, move || {
                    let limits = converting.tenants.pprof_limits();
                    Ok(parca::write_v1(&samples, &locations, &limits)?)
                }),
            )
            .await;
            match stored {
                Some(Ok(stored)) => {
                    tracing::debug!(%tenant, profiles = stored.len(), "parca Write");
                }
                Some(Err(e)) => {
                    let _ = tx.try_send(Err(status(e)));
                }
                None => {
                    tracing::info!(%tenant, "parca Write: cancelled at the deadline");
                    let _ = tx.try_send(Err(tonic::Status::deadline_exceeded(format!(
                        "the profiles were not stored within {secs} s of the samples \
                         (limits.request_timeout_secs): none was"
                    ))));
                }
            }
        }));
        Ok(tonic::Response::new(rx))
    }

    async fn write_arrow(
        &self,
        request: tonic::Request<proto::WriteArrowRequest>,
    ) -> Result<tonic::Response<proto::WriteArrowResponse>, tonic::Status> {
        let tenant = grpc_tenant(request.metadata())?;
        let memory = request.extensions().get::<RequestMemory>().cloned();
        let request = request.into_inner();
        let converting = self.state.clone();
        let stored = store(&self.state, &tenant, memory, move || {
            let limits = converting.tenants.pprof_limits();
            Ok(parca::write_arrow(&request.ipc_buffer, &limits)?)
        })
        .await
        .map_err(status)?;
        tracing::debug!(%tenant, profiles = stored.len(), "parca WriteArrow");
        Ok(tonic::Response::new(proto::WriteArrowResponse {}))
    }
}

#[tonic::async_trait]
impl grpc::debuginfo_service_server::DebuginfoService for Agent {
    async fn should_initiate_upload(
        &self,
        request: tonic::Request<di::ShouldInitiateUploadRequest>,
    ) -> Result<tonic::Response<di::ShouldInitiateUploadResponse>, tonic::Status> {
        let store = self.debuginfo(request.metadata()).await?;
        let r = request.into_inner();
        let (should, reason) = store
            .should_initiate(&r.build_id, r.force)
            .await
            .map_err(debuginfo_status)?;
        Ok(tonic::Response::new(di::ShouldInitiateUploadResponse {
            should_initiate_upload: should,
            reason: reason.into(),
        }))
    }

    async fn initiate_upload(
        &self,
        request: tonic::Request<di::InitiateUploadRequest>,
    ) -> Result<tonic::Response<di::InitiateUploadResponse>, tonic::Status> {
        let store = self.debuginfo(request.metadata()).await?;
        let r = request.into_inner();
        let upload_id = store
            .initiate(&r.build_id, r.size, &r.hash, r.force)
            .await
            .map_err(debuginfo_status)?;
        Ok(tonic::Response::new(di::InitiateUploadResponse {
            upload_instructions: Some(di::UploadInstructions {
                build_id: r.build_id,
                upload_id,
                upload_strategy: di::upload_instructions::UploadStrategy::Grpc as i32,
                signed_url: String::new(),
                r#type: r.r#type,
            }),
        }))
    }

    async fn upload(
        &self,
        request: tonic::Request<tonic::Streaming<di::UploadRequest>>,
    ) -> Result<tonic::Response<di::UploadResponse>, tonic::Status> {
        let store = self.debuginfo(request.metadata()).await?;
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| tonic::Status::invalid_argument("the upload is empty"))?;
        let Some(di::upload_request::Data::Info(info)) = first.data else {
            return Err(tonic::Status::invalid_argument(
                "an upload begins with its UploadInfo",
            ));
        };
        let chunks = stream.map(|m| match m {
            Ok(di::UploadRequest {
                data: Some(di::upload_request::Data::ChunkData(bytes)),
            }) => Ok(bytes.into()),
            Ok(_) => Err(debuginfo::Error::Invalid(
                "after the UploadInfo, an upload sends only chunk_data".into(),
            )),
            Err(e) => Err(debuginfo::Error::Invalid(format!("the upload stream: {e}"))),
        });
        let size = store
            .upload(&info.build_id, &info.upload_id, Box::pin(chunks))
            .await
            .map_err(debuginfo_status)?;
        Ok(tonic::Response::new(di::UploadResponse {
            build_id: info.build_id,
            size,
        }))
    }

    async fn mark_upload_finished(
        &self,
        request: tonic::Request<di::MarkUploadFinishedRequest>,
    ) -> Result<tonic::Response<di::MarkUploadFinishedResponse>, tonic::Status> {
        let tenant = self.tenant(request.metadata()).await?;
        let store = self.debuginfo(request.metadata()).await?;
        let r = request.into_inner();
        store
            .finish(&r.build_id, &r.upload_id)
            .await
            .map_err(debuginfo_status)?;
        // Its frames named from it, those still addresses and those named from a symbol
        // table only.
        tenant.store.name_again(&r.build_id);
        Ok(tonic::Response::new(di::MarkUploadFinishedResponse {}))
    }
}
