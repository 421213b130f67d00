//! The transports of the query and settings services: Connect unary (binary protobuf or
//! proto3 JSON) and gRPC / gRPC-Web through tonic, on the same paths; each request is
//! decoded, checked and handed to [`super::methods`].

use super::*;

/// The enum fields of the query API's requests that change an answer's meaning, as proto3
/// JSON sends them (a name or a number), at the top level or in a diff's `left` and
/// `right`; every other field is skipped without being read into memory. `format` is not
/// among them: a format the protos lack is answered with the flame graph, as Pyroscope
/// (protojson discarding unknown names) does, and Grafana's Drilldown relies on it.
#[derive(serde::Deserialize)]
pub(super) struct JsonEnums {
    #[serde(default)]
    pub(super) aggregation: Option<JsonEnum>,
    #[serde(default)]
    pub(super) left: Option<Box<JsonEnums>>,
    #[serde(default)]
    pub(super) right: Option<Box<JsonEnums>>,
}

/// An enum field as proto3 JSON sends it, read without building what it is not: a name
/// (kept up to 64 bytes, longer ones shown cut), a number, null, or anything else skipped
/// as it is read (an array of millions of values is walked, not materialised).
#[derive(Debug)]
pub(super) enum JsonEnum {
    Null,
    Name(String),
    Number(i64),
    /// What was sent instead, as shown in the refusal.
    Other(String),
}

impl<'de> serde::Deserialize<'de> for JsonEnum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = JsonEnum;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an enum name or number")
            }
            fn visit_unit<E>(self) -> Result<JsonEnum, E> {
                Ok(JsonEnum::Null)
            }
            fn visit_none<E>(self) -> Result<JsonEnum, E> {
                Ok(JsonEnum::Null)
            }
            fn visit_str<E>(self, v: &str) -> Result<JsonEnum, E> {
                Ok(if v.len() <= 64 {
                    JsonEnum::Name(v.to_owned())
                } else {
                    let cut: String = v.chars().take(64).collect();
                    JsonEnum::Other(format!("{cut:?}..."))
                })
            }
            fn visit_i64<E>(self, v: i64) -> Result<JsonEnum, E> {
                Ok(JsonEnum::Number(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<JsonEnum, E> {
                Ok(i64::try_from(v)
                    .map_or_else(|_| JsonEnum::Other(v.to_string()), JsonEnum::Number))
            }
            fn visit_f64<E>(self, v: f64) -> Result<JsonEnum, E> {
                Ok(JsonEnum::Other(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<JsonEnum, E> {
                Ok(JsonEnum::Other(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<JsonEnum, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(JsonEnum::Other("an array".into()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<JsonEnum, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(JsonEnum::Other("an object".into()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Refuses an aggregation the protos lack in a JSON request: decoded, it would read as the
/// default (a sum), where a client asking for another should hear it is not there. Unknown
/// fields stay skipped.
pub(super) fn check_json_enums(body: &[u8]) -> ApiResult<()> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    // A body that is not a JSON object is the decoder's to report.
    let Ok(enums) = serde_json::from_slice::<JsonEnums>(body) else {
        return Ok(());
    };
    fn known(
        value: &Option<JsonEnum>,
        field: &str,
        by_name: fn(&str) -> bool,
        by_number: fn(i32) -> bool,
        names: &str,
    ) -> ApiResult<()> {
        let shown = match value {
            None | Some(JsonEnum::Null) => return Ok(()),
            Some(JsonEnum::Name(name)) if by_name(name) => return Ok(()),
            Some(JsonEnum::Number(n)) if i32::try_from(*n).is_ok_and(by_number) => return Ok(()),
            Some(JsonEnum::Name(name)) => format!("{name:?}"),
            Some(JsonEnum::Number(n)) => n.to_string(),
            Some(JsonEnum::Other(shown)) => shown.clone(),
        };
        Err(ApiError::bad_request(format!(
            "{field} {shown} is not one of {names}"
        )))
    }
    let mut all = vec![&enums];
    all.extend(enums.left.as_deref());
    all.extend(enums.right.as_deref());
    for e in all {
        known(
            &e.aggregation,
            "aggregation",
            |n| types::TimeSeriesAggregationType::from_str_name(n).is_some(),
            |n| types::TimeSeriesAggregationType::try_from(n).is_ok(),
            "TIME_SERIES_AGGREGATION_TYPE_SUM, TIME_SERIES_AGGREGATION_TYPE_AVERAGE",
        )?;
    }
    Ok(())
}

/// The encoding of a Connect unary request and its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// `application/proto`: binary protobuf.
    Proto,
    /// `application/json`: proto3 JSON.
    Json,
}

impl Codec {
    /// The codec a request's `Content-Type` names.
    pub fn of(headers: &HeaderMap) -> ApiResult<Self> {
        let content_type = crate::ingest::content_type(headers);
        match content_type.as_str() {
            "application/proto" | "application/protobuf" | "application/x-protobuf" => {
                Ok(Codec::Proto)
            }
            "application/json" | "" => Ok(Codec::Json),
            other => Err(ApiError::unsupported(format!(
                "content type {other:?}: Connect unary takes application/proto or application/json"
            ))),
        }
    }

    /// Decodes a request message, once its bytes show it within `limits`, what it takes
    /// decoded charged to the request's `memory` first.
    pub fn decode<M>(
        self,
        body: &[u8],
        limits: &frostdb_pprof::RequestLimits,
        memory: &crate::edge::RequestMemory,
    ) -> ApiResult<M>
    where
        M: prost::Message + Default + serde::de::DeserializeOwned + Bounded,
    {
        let decoded = crate::ingest::charged(Some(memory.clone()), || match self {
            Codec::Proto => bounds::decode_protobuf("binary protobuf", body, limits),
            Codec::Json if body.iter().all(u8::is_ascii_whitespace) => Ok(M::default()),
            Codec::Json => bounds::decode_json("proto3 JSON", body, limits),
        });
        Ok(decoded?)
    }

    /// Encodes an answer, at most [`crate::query::MAX_JSON_ANSWER_BYTES`] of it (413 past
    /// that), its body reserved from its request's memory before it is made: the answers
    /// of labels and series were encoded whole, unreserved, gigabytes of JSON (a control
    /// character of a label value is six bytes of it) found only once made.
    pub fn encode<M: prost::Message + serde::Serialize>(self, message: &M) -> Response {
        // A large answer (a flame graph of a million nodes) is encoded off the async
        // thread; its protobuf size stands for its JSON's, which is larger.
        let len = message.encoded_len();
        if len > crate::query::MAX_JSON_ANSWER_BYTES {
            return too_large_answer().into_response();
        }
        if let Some(memory) = crate::edge::request_memory()
            && let Err(e) = memory.try_grow(len, "the answer")
        {
            return e.into_response();
        }
        if len >= crate::codec::OFF_THE_ASYNC_THREAD_BYTES {
            crate::work::off_the_async_thread(|| self.encode_here(message, len))
        } else {
            self.encode_here(message, len)
        }
    }

    /// Encodes `message`, of `len` bytes as protobuf (measured once, by the caller).
    fn encode_here<M: prost::Message + serde::Serialize>(
        self,
        message: &M,
        len: usize,
    ) -> Response {
        match self {
            Codec::Proto => {
                let mut body = Vec::with_capacity(len);
                message.encode_raw(&mut body);
                ([(header::CONTENT_TYPE, "application/proto")], body).into_response()
            }
            Codec::Json => match crate::query::json_bytes(message) {
                Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
                Err(e) => e.into_response(),
            },
        }
    }
}

/// An answer over [`crate::query::MAX_JSON_ANSWER_BYTES`], refused.
pub(crate) fn too_large_answer() -> ApiError {
    ApiError::too_large(format!(
        "the answer is over the limit of {} bytes (a narrower selector or a shorter range \
         answers with less)",
        crate::query::MAX_JSON_ANSWER_BYTES
    ))
}

/// The generated gRPC glue of the two services (messages: `frostdb_pprof::api`).
#[allow(missing_docs, clippy::all, unreachable_pub, rust_2018_idioms)]
pub mod grpc {
    /// `querier.v1.QuerierService`.
    pub mod querier {
        include!(concat!(env!("OUT_DIR"), "/server/querier.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/client/querier.v1.rs"));
    }
    /// `settings.v1.SettingsService`.
    pub mod settings {
        include!(concat!(env!("OUT_DIR"), "/server/settings.v1.rs"));
        include!(concat!(env!("OUT_DIR"), "/client/settings.v1.rs"));
    }
}

/// Whether a request speaks gRPC or gRPC-Web rather than Connect.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Answers a gRPC or gRPC-Web request with tonic.
pub(super) async fn grpc_call(state: Shared, request: axum::extract::Request) -> Response {
    use tonic::codec::CompressionEncoding::Gzip;
    crate::codec::set_grpc_limits(&state.config);
    let routes = tonic::service::Routes::new(
        grpc::querier::querier_service_server::QuerierServiceServer::new(GrpcQuerier {
            state: state.clone(),
        })
        .accept_compressed(Gzip)
        .send_compressed(Gzip),
    )
    .add_service(
        grpc::settings::settings_service_server::SettingsServiceServer::new(GrpcSettings { state }),
    );
    serve_grpc(routes, request).await
}

/// Answers a gRPC or gRPC-Web request with tonic `routes`.
pub(crate) async fn serve_grpc(
    routes: tonic::service::Routes,
    request: axum::extract::Request,
) -> Response {
    use tower::{Layer, ServiceExt};
    // tonic answers any other content type with a bare 400.
    if !is_grpc(request.headers()) {
        let got = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map_or("none".into(), |v| {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            });
        return ApiError::unsupported(format!(
            "{} is served over gRPC and gRPC-Web (Content-Type application/grpc or \
             application/grpc-web); the request's Content-Type is {got:?}",
            request.uri().path()
        ))
        .into_response();
    }
    match tonic_web::GrpcWebLayer::new()
        .layer(routes)
        .oneshot(request)
        .await
    {
        Ok(response) => response.map(axum::body::Body::new),
        Err(e) => ApiError::internal(format!("gRPC: {e}")).into_response(),
    }
}

/// A Connect request's body, within the body limit, gunzipped when it says so.
pub(super) async fn request_body(
    state: &Shared,
    request: axum::extract::Request,
    memory: &crate::edge::RequestMemory,
) -> ApiResult<axum::body::Bytes> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, state.config.limits.max_body_bytes)
        .await
        .map_err(|e| {
            ApiError::too_large(format!(
                "the body: {e}: over {} bytes (limits.max_body_bytes)",
                state.config.limits.max_body_bytes
            ))
        })?;
    if !parts
        .headers
        .contains_key(axum::http::header::CONTENT_ENCODING)
    {
        return Ok(body);
    }
    // Gunzipping (up to the decompressed limit) is seconds of CPU at worst: in the query
    // lane, not on the threads that accept requests.
    let (decoding, memory) = (state.clone(), memory.clone());
    state
        .work
        .queries
        .blocking(move |_| crate::ingest::body_bytes(&decoding, &parts.headers, body, &memory))
        .await
}

pub(super) async fn querier_call(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: crate::edge::RequestMemory,
    Path(method): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<Response> {
    if is_grpc(request.headers()) {
        return Ok(grpc_call(state, request).await);
    }
    let headers = request.headers().clone();
    let codec = Codec::of(&headers)?;
    let body = request_body(&state, request, &memory).await?;
    let limits = crate::codec::request_limits(&state.config);
    let q = Querier {
        state,
        tenant: tenant.clone(),
        utf8_names: allows_utf8_names(&headers),
    };
    macro_rules! unary {
        ($method:ident) => {{
            // Decoded in the query lane: a body of the largest size is a lot of messages.
            let (body, limits, memory) = (body.clone(), limits.clone(), memory.clone());
            let request = q
                .state
                .work
                .queries
                .blocking(move |_| {
                    let request = codec.decode(&body, &limits, &memory)?;
                    // After the decode's pre-scan has bounded the body.
                    if codec == Codec::Json {
                        check_json_enums(&body)?;
                    }
                    Ok(request)
                })
                .await?;
            Ok(codec.encode(&q.$method(request).await?))
        }};
    }
    match method.as_str() {
        "ProfileTypes" => unary!(profile_types),
        "LabelNames" => unary!(label_names),
        "LabelValues" => unary!(label_values),
        "Series" => unary!(series),
        "SelectMergeStacktraces" => unary!(select_merge_stacktraces),
        "SelectMergeSpanProfile" => unary!(select_merge_span_profile),
        "SelectMergeProfile" => unary!(select_merge_profile),
        "SelectSeries" => unary!(select_series),
        "Diff" => unary!(diff),
        "GetProfileStats" => unary!(get_profile_stats),
        "AnalyzeQuery" => unary!(analyze_query),
        "SelectHeatmap" => Err(unimplemented(
            "SelectHeatmap (individual profiles are not kept)",
        )),
        other => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("querier.v1.QuerierService has no method {other:?}"),
        )),
    }
}

pub(super) async fn settings_call(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: crate::edge::RequestMemory,
    Path(method): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<Response> {
    if is_grpc(request.headers()) {
        return Ok(grpc_call(state, request).await);
    }
    let codec = Codec::of(request.headers())?;
    let body = request_body(&state, request, &memory).await?;
    // A settings request holds one setting, at most a tenant's whole settings: refused
    // past that before any decoding (which runs here, on the async thread).
    let most = state.config.limits.max_settings_bytes + (64 << 10);
    if body.len() > most {
        return Err(ApiError::too_large(format!(
            "a settings request of {} bytes, more than {most} (limits.max_settings_bytes and room for the rest)",
            body.len()
        )));
    }
    let limits = crate::codec::request_limits(&state.config);
    let store = &state.settings;
    match method.as_str() {
        "Get" => {
            let _: settings::GetSettingsRequest = codec.decode(&body, &limits, &memory)?;
            let settings = store.get(&tenant).await?;
            Ok(codec.encode(&settings::GetSettingsResponse { settings }))
        }
        "Set" => {
            let r: settings::SetSettingsRequest = codec.decode(&body, &limits, &memory)?;
            let setting = r
                .setting
                .ok_or_else(|| ApiError::bad_request("no setting values provided"))?;
            // Settings are a tenant's state: a new tenant counts against max_tenants.
            let admitted = state.tenants.admit(&tenant).await?;
            let setting = Some(store.set(&tenant, setting).await?);
            admitted.exists();
            Ok(codec.encode(&settings::SetSettingsResponse { setting }))
        }
        "Delete" => {
            let r: settings::DeleteSettingsRequest = codec.decode(&body, &limits, &memory)?;
            store.delete(&tenant, &r.name).await?;
            Ok(codec.encode(&settings::DeleteSettingsResponse {}))
        }
        other => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("settings.v1.SettingsService has no method {other:?}"),
        )),
    }
}

/// The query service over gRPC: the same [`Querier`] behind tonic.
#[derive(Debug)]
pub(super) struct GrpcQuerier {
    pub(super) state: Shared,
}

/// The settings service over gRPC: the tenant's [`crate::settings::Settings`].
#[derive(Debug)]
pub(super) struct GrpcSettings {
    pub(super) state: Shared,
}

/// An error as a gRPC status of the matching code.
pub(crate) fn status(e: ApiError) -> tonic::Status {
    use tonic::Code;
    let code = match e.status {
        StatusCode::BAD_REQUEST | StatusCode::UNSUPPORTED_MEDIA_TYPE => Code::InvalidArgument,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::CONFLICT => Code::AlreadyExists,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        StatusCode::REQUEST_TIMEOUT => Code::DeadlineExceeded,
        StatusCode::NOT_IMPLEMENTED => Code::Unimplemented,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        _ => Code::Internal,
    };
    tonic::Status::new(code, e.message)
}

impl GrpcQuerier {
    /// The request's [`Querier`]: its tenant from the `x-scope-orgid` metadata.
    pub(super) fn querier<T>(&self, request: &tonic::Request<T>) -> Result<Querier, tonic::Status> {
        let utf8_names = request
            .metadata()
            .get_all("accept")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("allow-utf8-labelnames=true"));
        Ok(Querier {
            state: self.state.clone(),
            tenant: grpc_tenant(request.metadata())?,
            utf8_names,
        })
    }
}

/// The tenant of a gRPC request: its `x-scope-orgid` metadata, or the default tenant when
/// it is absent or empty.
pub(crate) fn grpc_tenant(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<String, tonic::Status> {
    let value = match metadata.get("x-scope-orgid") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| tonic::Status::invalid_argument("x-scope-orgid is not ASCII"))?,
        ),
    };
    crate::tenants::tenant_from_header(value).map_err(tonic::Status::invalid_argument)
}

/// Implements the generated gRPC trait's methods by the [`Querier`] methods of the same
/// names.
macro_rules! grpc_methods {
    ($($method:ident($request:ty) -> $response:ty;)*) => {
        #[tonic::async_trait]
        impl grpc::querier::querier_service_server::QuerierService for GrpcQuerier {
            $(
                async fn $method(
                    &self,
                    request: tonic::Request<$request>,
                ) -> Result<tonic::Response<$response>, tonic::Status> {
                    let q = self.querier(&request)?;
                    q.$method(request.into_inner())
                        .await
                        .map(tonic::Response::new)
                        .map_err(status)
                }
            )*
            async fn select_heatmap(
                &self,
                _: tonic::Request<querier::SelectHeatmapRequest>,
            ) -> Result<tonic::Response<querier::SelectHeatmapResponse>, tonic::Status> {
                Err(status(unimplemented("SelectHeatmap (individual profiles are not kept)")))
            }
        }
    };
}

grpc_methods! {
    profile_types(querier::ProfileTypesRequest) -> querier::ProfileTypesResponse;
    label_names(types::LabelNamesRequest) -> types::LabelNamesResponse;
    label_values(types::LabelValuesRequest) -> types::LabelValuesResponse;
    series(querier::SeriesRequest) -> querier::SeriesResponse;
    select_merge_stacktraces(querier::SelectMergeStacktracesRequest) -> querier::SelectMergeStacktracesResponse;
    select_merge_span_profile(querier::SelectMergeSpanProfileRequest) -> querier::SelectMergeSpanProfileResponse;
    select_merge_profile(querier::SelectMergeProfileRequest) -> google::Profile;
    select_series(querier::SelectSeriesRequest) -> querier::SelectSeriesResponse;
    diff(querier::DiffRequest) -> querier::DiffResponse;
    get_profile_stats(types::GetProfileStatsRequest) -> types::GetProfileStatsResponse;
    analyze_query(querier::AnalyzeQueryRequest) -> querier::AnalyzeQueryResponse;
}

#[tonic::async_trait]
impl grpc::settings::settings_service_server::SettingsService for GrpcSettings {
    async fn get(
        &self,
        request: tonic::Request<settings::GetSettingsRequest>,
    ) -> Result<tonic::Response<settings::GetSettingsResponse>, tonic::Status> {
        let tenant = grpc_tenant(request.metadata())?;
        let settings = self.state.settings.get(&tenant).await.map_err(status)?;
        Ok(tonic::Response::new(settings::GetSettingsResponse {
            settings,
        }))
    }

    async fn set(
        &self,
        request: tonic::Request<settings::SetSettingsRequest>,
    ) -> Result<tonic::Response<settings::SetSettingsResponse>, tonic::Status> {
        let tenant = grpc_tenant(request.metadata())?;
        let setting = request
            .into_inner()
            .setting
            .ok_or_else(|| tonic::Status::invalid_argument("no setting values provided"))?;
        let admitted = self.state.tenants.admit(&tenant).await.map_err(status)?;
        let setting = self.state.settings.set(&tenant, setting).await;
        if setting.is_ok() {
            admitted.exists();
        }
        Ok(tonic::Response::new(settings::SetSettingsResponse {
            setting: Some(setting.map_err(status)?),
        }))
    }

    async fn delete(
        &self,
        request: tonic::Request<settings::DeleteSettingsRequest>,
    ) -> Result<tonic::Response<settings::DeleteSettingsResponse>, tonic::Status> {
        let tenant = grpc_tenant(request.metadata())?;
        let name = request.into_inner().name;
        self.state
            .settings
            .delete(&tenant, &name)
            .await
            .map_err(status)?;
        Ok(tonic::Response::new(settings::DeleteSettingsResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer whose encoding waits for a task spawned after it starts (and says whether
    /// it came), as if it took long; it claims `len` bytes.
    struct SlowAnswer {
        len: usize,
        wait: std::sync::Mutex<Option<Box<dyn FnOnce() -> bool + Send>>>,
        other_ran: std::sync::atomic::AtomicBool,
    }

    impl std::fmt::Debug for SlowAnswer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("SlowAnswer")
        }
    }

    impl Default for SlowAnswer {
        fn default() -> Self {
            unreachable!("never decoded")
        }
    }

    impl prost::Message for SlowAnswer {
        fn encode_raw(&self, _: &mut impl prost::bytes::BufMut) {
            if let Some(wait) = self.wait.lock().unwrap().take() {
                self.other_ran
                    .store(wait(), std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn merge_field(
            &mut self,
            _: u32,
            _: prost::encoding::WireType,
            _: &mut impl prost::bytes::Buf,
            _: prost::encoding::DecodeContext,
        ) -> Result<(), prost::DecodeError> {
            unreachable!("never decoded")
        }
        fn encoded_len(&self) -> usize {
            self.len
        }
        fn clear(&mut self) {}
    }

    impl serde::Serialize for SlowAnswer {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_unit()
        }
    }

    /// Whether a task spawned once `len` bytes' answer began encoding ran meanwhile, on a
    /// runtime of one worker.
    fn others_run_while_encoding(len: usize) -> bool {
        crate::work::others_run_meanwhile(move |wait| {
            let answer = SlowAnswer {
                len,
                wait: std::sync::Mutex::new(Some(wait)),
                other_ran: std::sync::atomic::AtomicBool::new(false),
            };
            let _ = Codec::Proto.encode(&answer);
            answer.other_ran.load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// An answer is refused before it is made when over the answer limit (413) or over
    /// what its request may still hold (503), in JSON and protobuf alike: a series answer
    /// of gigabytes of JSON was encoded whole, unreserved.
    #[test]
    fn an_answer_over_its_limit_or_its_requests_memory_is_refused_before_it_is_made() {
        let answer = |len: usize| SlowAnswer {
            len,
            wait: std::sync::Mutex::new(Some(Box::new(|| panic!("encoded")))),
            other_ran: std::sync::atomic::AtomicBool::new(false),
        };
        for codec in [Codec::Proto, Codec::Json] {
            let over = codec.encode(&answer(crate::query::MAX_JSON_ANSWER_BYTES + 1));
            assert_eq!(over.status(), StatusCode::PAYLOAD_TOO_LARGE);
            // Others hold most of the budget.
            let budget = frostdb_core::MemoryBudget::new(4 << 20);
            let _others = budget.try_reserve(7 << 19, "others").unwrap();
            let memory = crate::edge::RequestMemory::new(&budget);
            let refused =
                crate::edge::as_request(memory.clone(), || codec.encode(&answer(1 << 20)));
            assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
            let small = crate::edge::as_request(memory.clone(), || {
                codec.encode(&SlowAnswer {
                    len: 1000,
                    wait: std::sync::Mutex::new(None),
                    other_ran: std::sync::atomic::AtomicBool::new(false),
                })
            });
            assert_eq!(small.status(), StatusCode::OK);
            assert_eq!(memory.bytes(), 1000, "its body reserved");
        }
    }

    /// A large answer (a flame graph of a million nodes is tens of megabytes) is encoded
    /// off the async thread: a task spawned after it runs meanwhile. (Encoded on the one
    /// worker, as a small answer is, the task would wait for the encoding, which gives up
    /// waiting for it after 30 s.)
    #[test]
    fn a_large_answer_is_encoded_off_the_async_thread() {
        assert!(others_run_while_encoding(
            crate::codec::OFF_THE_ASYNC_THREAD_BYTES
        ));
    }

    /// An enum field sent as an array of millions of values (a few bytes each) is walked
    /// and refused, not built into a JSON tree of tens of bytes a value; a long name is
    /// shown cut; known names and numbers pass.
    #[test]
    fn an_enum_field_of_anything_but_a_name_or_number_is_refused_without_building_it() {
        let mut body = String::from("{\"aggregation\":[");
        body.push_str(&"0,".repeat(1_000_000));
        body.push_str("0]}");
        let e = check_json_enums(body.as_bytes()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains("aggregation an array is not one of"),
            "{}",
            e.message
        );
        let long = format!(
            "{{\"left\":{{\"aggregation\":\"{}\"}}}}",
            "X".repeat(100_000)
        );
        let e = check_json_enums(long.as_bytes()).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
        for ok in [
            "{\"aggregation\":\"TIME_SERIES_AGGREGATION_TYPE_AVERAGE\"}",
            "{\"aggregation\":1}",
            "{\"aggregation\":null,\"other\":[1,2,3]}",
        ] {
            assert!(check_json_enums(ok.as_bytes()).is_ok(), "{ok}");
        }
        let e = check_json_enums(b"{\"aggregation\":{\"a\":[1]}}").unwrap_err();
        assert!(e.message.contains("an object"), "{}", e.message);
    }
}
