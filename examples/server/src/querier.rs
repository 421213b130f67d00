//! Grafana Pyroscope's query API, so Grafana's Pyroscope data source, the Profiles Drilldown
//! app and `profilecli` read from frostdb-rs unchanged.
//!
//! `GET /pyroscope/render` and `/pyroscope/render-diff` answer the legacy flamebearer JSON.
//!
//! Every merge here (flame graphs, pprof, each side of a diff) combines each series'
//! profiles over the range as `/api/v1/query` does: gauges such as memory in use averaged,
//! the rest summed ([`Aggregation::default_for`]); the same selection totals the same
//! everywhere. `render-diff` takes `aggregation=sum|average|latest` to say otherwise.
//!
//! `POST /querier.v1.QuerierService/<Method>` and `POST /settings.v1.SettingsService/<Method>`
//! over Connect unary: the body is the request message as binary protobuf
//! (`application/proto`) or proto3 JSON (`application/json`: int64 as strings, lowerCamel or
//! original field names), the answer is the response message in the same encoding, and an
//! error is Connect's JSON `{"code", "message"}` with the matching HTTP status. The messages
//! are `frostdb_pprof::api`'s; the answers are the library's results
//! ([`frostdb_pprof::report::pyroscope`] for flame graphs), which this module only maps.
//!
//! The same paths speak gRPC and gRPC-Web (a `Content-Type` of `application/grpc…`, as
//! `profilecli --protocol grpc|grpc-web` sends) through tonic, with the same answers; the
//! tenant is the `x-scope-orgid` metadata there.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use frostdb_pprof::api::google::v1 as google;
use frostdb_pprof::api::querier::v1 as querier;
use frostdb_pprof::api::settings::v1 as settings;
use frostdb_pprof::api::types::v1 as types;
use frostdb_pprof::bounds::{self, Bounded};
use frostdb_pprof::report::dot;
use frostdb_pprof::report::pyroscope::{
    Flamebearer, Levels, Timeline, timeline_step_s, tree_bytes,
};
use frostdb_pprof::report::tree::{self, FlameGraph};
use frostdb_profile::{Aggregation, TimeRange};
use frostdb_profile::{Matcher, Selector, TypedSelector};

use super::error::{ApiError, ApiResult};
use super::{Shared, TenantId};

/// The most nodes a flame graph may ask for (Pyroscope's cap).
pub const MAX_NODES_CAP: i64 = 1 << 20;

/// The routes of the query and settings services, and of the legacy render API.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/querier.v1.QuerierService/{method}", post(querier_call))
        .route("/settings.v1.SettingsService/{method}", post(settings_call))
        .route("/pyroscope/render", get(render))
        .route(
            "/settings.v1.RecordingRulesService/{method}",
            post(not_served),
        )
        .route(
            "/adhocprofiles.v1.AdHocProfileService/{method}",
            post(not_served),
        )
        .route("/vcs.v1.VCSService/{method}", post(not_served))
        .route("/pyroscope/render-diff", get(render_diff))
}

/// Pyroscope services Grafana's Profiles Drilldown calls for optional features (recording
/// rules, ad hoc uploads, source code from GitHub), which this server does not have: a
/// Connect `unimplemented` error naming the service, which the app shows as the feature
/// being off.
async fn not_served(uri: axum::http::Uri) -> ApiError {
    let service = uri.path().trim_start_matches('/');
    unimplemented(&format!("{service} (this server has no such service)"))
}

/// A render parameter.
fn param<'a>(params: &'a [(String, String)], names: &[&str]) -> Option<&'a str> {
    params
        .iter()
        .find(|(n, _)| names.contains(&n.as_str()))
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.trim().is_empty())
}

/// A render time: `now-1h` and the like, RFC 3339, or a Unix time in seconds (milliseconds
/// when it is that large).
fn render_time(value: Option<&str>, what: &str, default: i64) -> ApiResult<i64> {
    let Some(v) = value.map(str::trim) else {
        return Ok(default);
    };
    if let Ok(n) = v.parse::<i64>() {
        let ms = if n.unsigned_abs() < 100_000_000_000 {
            n * 1000
        } else {
            n
        };
        return crate::time::checked_ms(ms, what).map_err(ApiError::bad_request);
    }
    crate::time::parse_time(v, crate::time::now_ms())
        .map_err(|e| ApiError::bad_request(format!("{what}: {e}")))
}

/// The selector and range of a render query (`query`, `from`, `until`, or their prefixed
/// names in a diff).
fn render_query(
    params: &[(String, String)],
    query: &str,
    from: &str,
    until: &str,
) -> ApiResult<(TypedSelector, TimeRange)> {
    let text = param(params, &[query]).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{query} is required: a profile type and labels, e.g. {}{{service_name=\"api\"}}",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        ))
    })?;
    let selector = Selector::from_parts("", text)
        .map_err(|e| ApiError::from(e).context(query))?
        .typed()
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{query} needs a profile type (name:sample_type:sample_unit:period_type:period_unit{{…}})"
            ))
        })?;
    let now = crate::time::now_ms();
    let start = render_time(param(params, &[from]), from, now - 3_600_000)?;
    let end = render_time(param(params, &[until]), until, now)?;
    if start >= end {
        return Err(ApiError::bad_request(format!(
            "{from} ({start} ms) must be before {until} ({end} ms)"
        )));
    }
    Ok((
        selector,
        TimeRange {
            start_ms: start,
            end_ms: end,
        },
    ))
}

/// `max-nodes` or `maxNodes` of a render.
fn render_max_nodes(params: &[(String, String)]) -> ApiResult<usize> {
    match param(params, &["max-nodes", "maxNodes"]) {
        None => Ok(tree::DEFAULT_MAX_NODES),
        Some(v) => max_nodes(Some(v.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!("max-nodes: {v:?} is not a number"))
        })?)),
    }
}

/// `GET /pyroscope/render`: the merged flame graph with its timeline (and one per value of
/// the first `groupBy` label), as flamebearer JSON.
async fn render(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (selector, range) = render_query(&params, "query", "from", "until")?;
    let max_nodes = render_max_nodes(&params)?;
    let q = Querier {
        state,
        tenant,
        utf8_names: allows_utf8_names(&headers),
    };
    match param(&params, &["format"]) {
        None | Some("json") => {}
        // The call graph, as Pyroscope answers it (100 nodes unless `max-nodes` says).
        Some("dot") => {
            let nodes = param(&params, &["max-nodes", "maxNodes"])
                .map_or(dot::DEFAULT_MAX_NODES, |_| max_nodes);
            let merged = q.merge(selector, range).await?;
            let body = if merged.samples.is_empty() {
                String::new()
            } else {
                dot::render(&merged, nodes)
            };
            return Ok(([(header::CONTENT_TYPE, "text/plain")], body).into_response());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "format {other:?} (json or dot)"
            )));
        }
    }
    let group_by: Vec<String> = params
        .iter()
        .filter(|(n, v)| n == "groupBy" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    let average = match param(&params, &["aggregation"]) {
        None | Some("sum") => false,
        Some("avg") | Some("average") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "aggregation {other:?} (sum or avg)"
            )));
        }
    };
    let profile_type = selector.profile_type().clone();
    // As Pyroscope's render: `aggregation` shapes the timeline; the flame graph merges as
    // every merge here does (gauges averaged, the rest summed).
    let merged = q.merge(selector.clone(), range).await?;
    let graph = FlameGraph::build_truncated(&merged, max_nodes);
    let mut fb = Flamebearer::new(
        Levels::of(&graph),
        &profile_type.sample_type,
        &profile_type.sample_unit,
        None,
    );
    let step_s = timeline_step_s(range.start_ms, range.end_ms);
    if (range.end_ms - range.start_ms) / (step_s * 1000)
        > frostdb_pprof::report::pyroscope::MAX_TIMELINE
    {
        return Err(ApiError::bad_request(
            "the range is too long for a timeline",
        ));
    }
    let by = group_by.first().cloned();
    let series = q
        .read(Vec::new(), move |store| {
            let group: Vec<String> = by.into_iter().collect();
            Ok(store.range(&selector, range, step_s * 1000, Some(&group))?)
        })
        .await?;
    let timeline = |s: &frostdb_profile::native::Series| {
        let points: Vec<(i64, f64)> = s.values(average).collect();
        Timeline::new(&points, range.start_ms, range.end_ms, step_s)
    };
    let all: Vec<(i64, f64)> = series.iter().flat_map(|s| s.values(false)).collect();
    fb.timeline = Some(Timeline::new(&all, range.start_ms, range.end_ms, step_s));
    if let Some(label) = group_by.first() {
        fb.groups = Some(
            series
                .iter()
                .map(|s| {
                    let key = s
                        .labels
                        .iter()
                        .find(|(n, _)| n == label)
                        .map_or("*".to_owned(), |(_, v)| v.clone());
                    (key, timeline(s))
                })
                .collect(),
        );
    } else if average {
        fb.timeline = series.first().map(timeline);
    }
    Ok(axum::Json(fb).into_response())
}

/// `GET /pyroscope/render-diff`: `leftQuery`/`leftFrom`/`leftUntil` against the `right…`
/// ones, as flamebearer JSON of format `double`; each side merged as `/api/v1/query` merges
/// it (gauges averaged) unless `aggregation=sum|average|latest` says otherwise, the header
/// `X-Frostdb-Aggregation` saying which.
async fn render_diff(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let left = render_query(&params, "leftQuery", "leftFrom", "leftUntil")?;
    let right = render_query(&params, "rightQuery", "rightFrom", "rightUntil")?;
    let max_nodes = render_max_nodes(&params)?;
    let profile_type = left.0.profile_type().clone();
    let aggregation = match param(&params, &["aggregation"]) {
        Some(a) => Aggregation::parse(a).map_err(ApiError::bad_request)?,
        None => Aggregation::default_for(&profile_type),
    };
    let q = Querier {
        state,
        tenant,
        utf8_names: false,
    };
    let (levels, left_ticks, right_ticks) =
        q.diff_levels(left, right, max_nodes, aggregation).await?;
    let fb = Flamebearer::new(
        levels,
        &profile_type.sample_type,
        &profile_type.sample_unit,
        Some((left_ticks, right_ticks)),
    );
    let said = [(
        super::query::AGGREGATION_HEADER,
        header::HeaderValue::from_static(aggregation.name()),
    )];
    Ok((said, axum::Json(fb)).into_response())
}

/// The enum fields of the query API's requests that change an answer's meaning, as proto3
/// JSON sends them (a name or a number), at the top level or in a diff's `left` and
/// `right`; every other field is skipped without being read into memory. `format` is not
/// among them: a format the protos lack is answered with the flame graph, as Pyroscope
/// (protojson discarding unknown names) does, and Grafana's Drilldown relies on it.
#[derive(serde::Deserialize)]
struct JsonEnums {
    #[serde(default)]
    aggregation: Option<serde_json::Value>,
    #[serde(default)]
    left: Option<Box<JsonEnums>>,
    #[serde(default)]
    right: Option<Box<JsonEnums>>,
}

/// Refuses an aggregation the protos lack in a JSON request: decoded, it would read as the
/// default (a sum), where a client asking for another should hear it is not there. Unknown
/// fields stay skipped.
fn check_json_enums(body: &[u8]) -> ApiResult<()> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    // A body that is not a JSON object is the decoder's to report.
    let Ok(enums) = serde_json::from_slice::<JsonEnums>(body) else {
        return Ok(());
    };
    fn known(
        value: &Option<serde_json::Value>,
        field: &str,
        by_name: fn(&str) -> bool,
        by_number: fn(i32) -> bool,
        names: &str,
    ) -> ApiResult<()> {
        let ok = match value {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::String(name)) => by_name(name),
            Some(serde_json::Value::Number(n)) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .is_some_and(by_number),
            Some(_) => false,
        };
        if ok {
            return Ok(());
        }
        let shown: String = value
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_default()
            .chars()
            .take(64)
            .collect();
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
        let content_type = super::ingest::content_type(headers);
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

    /// Decodes a request message, once its bytes show it within `limits`.
    pub fn decode<M>(self, body: &[u8], limits: &frostdb_pprof::RequestLimits) -> ApiResult<M>
    where
        M: prost::Message + Default + serde::de::DeserializeOwned + Bounded,
    {
        let decoded = match self {
            Codec::Proto => bounds::decode_protobuf("binary protobuf", body, limits),
            Codec::Json if body.iter().all(u8::is_ascii_whitespace) => Ok(M::default()),
            Codec::Json => bounds::decode_json("proto3 JSON", body, limits),
        };
        Ok(decoded?)
    }

    /// Encodes an answer.
    pub fn encode<M: prost::Message + serde::Serialize>(self, message: &M) -> Response {
        match self {
            Codec::Proto => (
                [(header::CONTENT_TYPE, "application/proto")],
                message.encode_to_vec(),
            )
                .into_response(),
            Codec::Json => match serde_json::to_vec(message) {
                Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
                Err(e) => ApiError::internal(format!("answer to JSON: {e}")).into_response(),
            },
        }
    }
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
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Answers a gRPC or gRPC-Web request with tonic.
async fn grpc_call(state: Shared, request: axum::extract::Request) -> Response {
    use tonic::codec::CompressionEncoding::Gzip;
    super::codec::set_grpc_limits(&state.config);
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
async fn request_body(
    state: &Shared,
    request: axum::extract::Request,
    memory: &super::edge::RequestMemory,
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
    super::ingest::body_bytes(state, &parts.headers, body, memory)
}

async fn querier_call(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: super::edge::RequestMemory,
    Path(method): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<Response> {
    if is_grpc(request.headers()) {
        return Ok(grpc_call(state, request).await);
    }
    let headers = request.headers().clone();
    let codec = Codec::of(&headers)?;
    let body = request_body(&state, request, &memory).await?;
    let limits = super::codec::request_limits(&state.config);
    let q = Querier {
        state,
        tenant: tenant.clone(),
        utf8_names: allows_utf8_names(&headers),
    };
    macro_rules! unary {
        ($method:ident) => {{
            let request = codec.decode(&body, &limits)?;
            // After the decode's pre-scan has bounded the body.
            if codec == Codec::Json {
                check_json_enums(&body)?;
            }
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

async fn settings_call(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: super::edge::RequestMemory,
    Path(method): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<Response> {
    if is_grpc(request.headers()) {
        return Ok(grpc_call(state, request).await);
    }
    let codec = Codec::of(request.headers())?;
    let body = request_body(&state, request, &memory).await?;
    let limits = super::codec::request_limits(&state.config);
    let store = &state.settings;
    match method.as_str() {
        "Get" => {
            let _: settings::GetSettingsRequest = codec.decode(&body, &limits)?;
            let settings = store.get(&tenant).await?;
            Ok(codec.encode(&settings::GetSettingsResponse { settings }))
        }
        "Set" => {
            let r: settings::SetSettingsRequest = codec.decode(&body, &limits)?;
            let setting = r
                .setting
                .ok_or_else(|| ApiError::bad_request("no setting values provided"))?;
            // Settings are a tenant's state: a new tenant counts against max_tenants.
            state.tenants.admit(&tenant).await?;
            let setting = Some(store.set(&tenant, setting).await?);
            Ok(codec.encode(&settings::SetSettingsResponse { setting }))
        }
        "Delete" => {
            let r: settings::DeleteSettingsRequest = codec.decode(&body, &limits)?;
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
struct GrpcQuerier {
    state: Shared,
}

/// The settings service over gRPC: the tenant's [`super::settings::Settings`].
#[derive(Debug)]
struct GrpcSettings {
    state: Shared,
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
    fn querier<T>(&self, request: &tonic::Request<T>) -> Result<Querier, tonic::Status> {
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
    super::tenants::tenant_from_header(value).map_err(tonic::Status::invalid_argument)
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
        self.state.tenants.admit(&tenant).await.map_err(status)?;
        let setting = self.state.settings.set(&tenant, setting).await;
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

/// The call site of a stack trace selector, function names root first (none: every stack).
/// Go PGO's location truncation is not supported.
fn call_site(s: Option<&types::StackTraceSelector>) -> ApiResult<Vec<&str>> {
    match s {
        Some(s) if s.go_pgo.is_some() => Err(unimplemented("stack_trace_selector.go_pgo")),
        Some(s) => Ok(s.call_site.iter().map(|l| l.name.as_str()).collect()),
        None => Ok(Vec::new()),
    }
}

fn unimplemented(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("not implemented: {what}"),
    )
}

/// Whether the client takes label names beyond Prometheus' `[a-zA-Z_][a-zA-Z0-9_]*`
/// (`Accept: …;allow-utf8-labelnames=true`, as profilecli sends).
fn allows_utf8_names(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("allow-utf8-labelnames=true"))
}

/// Whether `name` is a Prometheus label name.
fn is_legacy_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A range of Unix milliseconds as the API sends it: 0 leaves that end open.
fn range(start: i64, end: i64) -> ApiResult<TimeRange> {
    crate::time::checked_ms(start, "start").map_err(ApiError::bad_request)?;
    crate::time::checked_ms(end, "end").map_err(ApiError::bad_request)?;
    let range = TimeRange {
        start_ms: if start == 0 { i64::MIN } else { start },
        end_ms: if end == 0 { i64::MAX } else { end },
    };
    if range.start_ms >= range.end_ms {
        return Err(ApiError::bad_request(format!(
            "start ({start}) must be before end ({end})"
        )));
    }
    Ok(range)
}

/// A typed selector from a request's profile type id and label selector.
fn typed(profile_type: &str, label_selector: &str) -> ApiResult<TypedSelector> {
    Selector::from_parts(profile_type, label_selector)
        .map_err(|e| ApiError::from(e).context("label_selector"))?
        .typed()
        .ok_or_else(|| {
            ApiError::bad_request(
                "profile_typeID is required (name:sample_type:sample_unit:period_type:period_unit)",
            )
        })
}

/// Selectors of the `matchers` of a request (any of them selects; none selects all).
fn matchers(matchers: &[String]) -> ApiResult<Vec<Selector>> {
    if matchers.is_empty() {
        return Ok(vec![Selector::default()]);
    }
    matchers
        .iter()
        .map(|m| Selector::from_parts("", m).map_err(|e| ApiError::from(e).context("matchers")))
        .collect()
}

/// `max_nodes` as sent: unset or 0 takes the default, negative is refused.
fn max_nodes(max_nodes: Option<i64>) -> ApiResult<usize> {
    match max_nodes.unwrap_or(0) {
        0 => Ok(tree::DEFAULT_MAX_NODES),
        n if n < 0 => Err(ApiError::bad_request("max_nodes must not be negative")),
        n => Ok(n.min(MAX_NODES_CAP) as usize),
    }
}

/// One request's view of its tenant.
struct Querier {
    state: Shared,
    tenant: String,
    utf8_names: bool,
}

impl Querier {
    /// Runs `read` on the tenant's store off the async threads; `empty` for a tenant that
    /// stored nothing.
    async fn read<T: Send + 'static>(
        &self,
        empty: T,
        read: impl FnOnce(&frostdb_pprof::ProfileStore) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        super::query::on_store(&self.state, &self.tenant, empty, read).await
    }

    /// The merge of `selector` in `range`, empty for a tenant that stored nothing.
    async fn merge(
        &self,
        selector: TypedSelector,
        range: TimeRange,
    ) -> ApiResult<frostdb_pprof::Merged> {
        self.merge_then(selector, range, Ok).await
    }

    /// `then` of the merge of `selector` in `range` (a report built from it), in the same
    /// job of the query lane; each series' profiles combined as `/api/v1/query` combines
    /// them unless told (gauges averaged, the rest summed).
    async fn merge_then<T: Send + 'static>(
        &self,
        selector: TypedSelector,
        range: TimeRange,
        then: impl FnOnce(frostdb_pprof::Merged) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let aggregation = Aggregation::default_for(selector.profile_type());
        self.merge_as(selector, range, aggregation, then).await
    }

    /// [`Self::merge_then`] with each series' profiles combined by `aggregation`.
    async fn merge_as<T: Send + 'static>(
        &self,
        selector: TypedSelector,
        range: TimeRange,
        aggregation: Aggregation,
        then: impl FnOnce(frostdb_pprof::Merged) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        match self.state.tenants.for_read(&self.tenant).await? {
            Some(t) => {
                let options = frostdb_pprof::MergeOptions {
                    aggregation,
                    ..frostdb_pprof::MergeOptions::default()
                };
                super::query::merge_then(&self.state, t, selector, range, options, then).await
            }
            None => then(frostdb_pprof::Merged::empty(
                selector.profile_type().clone(),
            )),
        }
    }

    /// The diff of two typed selections as Pyroscope's levels, with the left and right
    /// totals, each side merged by `aggregation`: an error when their profile types differ.
    async fn diff_levels(
        &self,
        (left, left_range): (TypedSelector, TimeRange),
        (right, right_range): (TypedSelector, TimeRange),
        max_nodes: usize,
        aggregation: Aggregation,
    ) -> ApiResult<(Levels, i64, i64)> {
        if left.profile_type != right.profile_type {
            return Err(ApiError::bad_request(
                "left and right must have the same profile type",
            ));
        }
        let l = self.merge_as(left, left_range, aggregation, Ok).await?;
        let r = self.merge_as(right, right_range, aggregation, Ok).await?;
        let diff = tree::diff(&l, &r);
        let root = diff.root();
        Ok((
            Levels::of_diff(&diff, max_nodes),
            root.base(),
            root.compare(),
        ))
    }

    async fn profile_types(
        &self,
        r: querier::ProfileTypesRequest,
    ) -> ApiResult<querier::ProfileTypesResponse> {
        let range = range(r.start, r.end)?;
        let types = self
            .read(Vec::new(), move |store| Ok(store.profile_types(range)?))
            .await?;
        Ok(querier::ProfileTypesResponse {
            profile_types: types.iter().map(profile_type).collect(),
        })
    }

    async fn label_names(
        &self,
        r: types::LabelNamesRequest,
    ) -> ApiResult<types::LabelNamesResponse> {
        let range = range(r.start, r.end)?;
        let selectors = matchers(&r.matchers)?;
        let mut names = self
            .read(Vec::new(), move |store| {
                let mut names = std::collections::BTreeSet::new();
                for s in &selectors {
                    names.extend(store.label_names(Some(s), range)?);
                }
                if !store.profile_types(range)?.is_empty() {
                    names.extend(PSEUDO_LABELS.iter().map(|l| (*l).to_owned()));
                }
                Ok(names.into_iter().collect::<Vec<_>>())
            })
            .await?;
        if !self.utf8_names {
            names.retain(|n| is_legacy_name(n));
        }
        Ok(types::LabelNamesResponse { names })
    }

    async fn label_values(
        &self,
        r: types::LabelValuesRequest,
    ) -> ApiResult<types::LabelValuesResponse> {
        let range = range(r.start, r.end)?;
        let selectors = matchers(&r.matchers)?;
        let name = r.name;
        let names = self
            .read(Vec::new(), move |store| {
                let mut values = std::collections::BTreeSet::new();
                for s in &selectors {
                    match pseudo_label(&name) {
                        Some(part) => {
                            for series in store.series(s, range, Some(&[]))? {
                                values.insert(part(&series.profile_type));
                            }
                        }
                        None => values.extend(store.label_values(&name, Some(s), range)?),
                    }
                }
                Ok(values.into_iter().collect::<Vec<_>>())
            })
            .await?;
        Ok(types::LabelValuesResponse { names })
    }

    async fn series(&self, r: querier::SeriesRequest) -> ApiResult<querier::SeriesResponse> {
        let range = range(r.start, r.end)?;
        let selectors = matchers(&r.matchers)?;
        let wanted = r.label_names;
        let utf8 = self.utf8_names;
        let labels_set = self
            .read(Vec::new(), move |store| {
                let only: Option<Vec<String>> = (!wanted.is_empty()).then(|| wanted.clone());
                let mut sets = std::collections::BTreeSet::new();
                for s in &selectors {
                    for series in store.series(s, range, only.as_deref())? {
                        let mut labels: Vec<(String, String)> = series
                            .labels
                            .into_iter()
                            .filter(|(n, _)| utf8 || is_legacy_name(n))
                            .collect();
                        for pseudo in PSEUDO_LABELS {
                            if wanted.is_empty() || wanted.iter().any(|w| w == pseudo) {
                                let part = pseudo_label(pseudo).expect("a pseudo label");
                                labels.push(((*pseudo).to_owned(), part(&series.profile_type)));
                            }
                        }
                        labels.sort();
                        sets.insert(labels);
                    }
                }
                Ok(sets.into_iter().collect::<Vec<_>>())
            })
            .await?;
        Ok(querier::SeriesResponse {
            labels_set: labels_set
                .into_iter()
                .map(|labels| types::Labels {
                    labels: label_pairs(labels),
                })
                .collect(),
        })
    }

    /// The merge a flame graph request asks for, with its spans when it names some.
    fn merge_selector(
        profile_type: &str,
        label_selector: &str,
        spans: &[String],
    ) -> ApiResult<TypedSelector> {
        let mut selector = typed(profile_type, label_selector)?;
        if !spans.is_empty() {
            let ids: Vec<&str> = spans.iter().map(String::as_str).collect();
            selector = selector.with(
                Matcher::any_of("span_id", &ids)
                    .map_err(|e| ApiError::bad_request(format!("span_selector: {e}")))?,
            );
        }
        Ok(selector)
    }

    async fn select_merge_stacktraces(
        &self,
        r: querier::SelectMergeStacktracesRequest,
    ) -> ApiResult<querier::SelectMergeStacktracesResponse> {
        let call_site = call_site(r.stack_trace_selector.as_ref())?;
        if !r.profile_id_selector.is_empty() || !r.trace_id_selector.is_empty() {
            return Err(unimplemented("profile_id_selector and trace_id_selector"));
        }
        let selector =
            Self::merge_selector(&r.profile_type_id, &r.label_selector, &r.span_selector)?;
        let max_nodes = max_nodes(r.max_nodes)?;
        let format = querier::ProfileFormat::try_from(r.format).map_err(|_| {
            ApiError::bad_request(format!(
                "format {} (FLAMEGRAPH, TREE, PPROF or DOT)",
                r.format
            ))
        })?;
        let dot_nodes = r.max_nodes.map_or(dot::DEFAULT_MAX_NODES, |_| max_nodes);
        let call_site: Vec<String> = call_site.into_iter().map(str::to_owned).collect();
        let range = range(r.start, r.end)?;
        self.merge_then(selector, range, move |merged| {
            let call_site: Vec<&str> = call_site.iter().map(String::as_str).collect();
            let merged = tree::select_call_site(merged, &call_site);
            let mut response = querier::SelectMergeStacktracesResponse::default();
            match format {
                querier::ProfileFormat::Unspecified | querier::ProfileFormat::Flamegraph => {
                    let graph = FlameGraph::build_truncated(&merged, max_nodes);
                    response.flamegraph = Some(Levels::of(&graph).to_proto());
                }
                querier::ProfileFormat::Tree => {
                    let graph = FlameGraph::build_truncated(&merged, max_nodes);
                    response.tree = tree_bytes(&graph);
                }
                querier::ProfileFormat::Pprof => {
                    response.pprof = Some(querier::PprofProfile {
                        profile: Some(pprof_of(&merged)?),
                    });
                }
                querier::ProfileFormat::Dot => {
                    response.dot = dot::render(&merged, dot_nodes);
                }
            }
            Ok(response)
        })
        .await
    }

    async fn select_merge_span_profile(
        &self,
        r: querier::SelectMergeSpanProfileRequest,
    ) -> ApiResult<querier::SelectMergeSpanProfileResponse> {
        let answer = self
            .select_merge_stacktraces(querier::SelectMergeStacktracesRequest {
                profile_type_id: r.profile_type_id,
                label_selector: r.label_selector,
                start: r.start,
                end: r.end,
                max_nodes: r.max_nodes,
                format: r.format,
                span_selector: r.span_selector,
                ..Default::default()
            })
            .await?;
        Ok(querier::SelectMergeSpanProfileResponse {
            flamegraph: answer.flamegraph,
            tree: answer.tree,
        })
    }

    async fn select_merge_profile(
        &self,
        r: querier::SelectMergeProfileRequest,
    ) -> ApiResult<google::Profile> {
        let call_site: Vec<String> = call_site(r.stack_trace_selector.as_ref())?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let selector = typed(&r.profile_type_id, &r.label_selector)?;
        self.merge_then(selector, range(r.start, r.end)?, move |merged| {
            let call_site: Vec<&str> = call_site.iter().map(String::as_str).collect();
            pprof_of(&tree::select_call_site(merged, &call_site))
        })
        .await
    }

    async fn select_series(
        &self,
        r: querier::SelectSeriesRequest,
    ) -> ApiResult<querier::SelectSeriesResponse> {
        if r.stack_trace_selector.is_some() {
            return Err(unimplemented("stack_trace_selector"));
        }
        let selector = typed(&r.profile_type_id, &r.label_selector)?;
        let range = range(r.start, r.end)?;
        if !(r.step.is_finite() && r.step > 0.0) {
            return Err(ApiError::bad_request(format!(
                "step must be a positive number of seconds, not {}",
                r.step
            )));
        }
        let step_ms = ((r.step * 1e3).round() as i64).max(1);
        let average = match r.aggregation {
            None => false,
            Some(a) => match types::TimeSeriesAggregationType::try_from(a) {
                Ok(types::TimeSeriesAggregationType::Sum) => false,
                Ok(types::TimeSeriesAggregationType::Average) => true,
                Err(_) => {
                    return Err(ApiError::bad_request(format!(
                        "aggregation {a} (SUM or AVERAGE)"
                    )));
                }
            },
        };
        let limit = match r.limit {
            Some(n) if n < 0 => return Err(ApiError::bad_request("limit must not be negative")),
            Some(0) | None => None,
            Some(n) => Some(n as usize),
        };
        let group_by = r.group_by;
        let mut series = self
            .read(Vec::new(), move |store| {
                let group_by = (!group_by.is_empty()).then_some(group_by.as_slice());
                Ok(store.range(&selector, range, step_ms, group_by)?)
            })
            .await?;
        if let Some(limit) = limit {
            // The largest totals first, ties by labels; then back to label order.
            let total = |s: &frostdb_profile::native::Series| -> i128 {
                s.points.iter().map(|(_, v)| i128::from(*v)).sum()
            };
            series.sort_by(|a, b| {
                total(b)
                    .cmp(&total(a))
                    .then_with(|| a.labels.cmp(&b.labels))
            });
            series.truncate(limit);
            series.sort_by(|a, b| a.labels.cmp(&b.labels));
        }
        Ok(querier::SelectSeriesResponse {
            series: series
                .into_iter()
                .map(|s| types::Series {
                    points: s
                        .values(average)
                        .map(|(timestamp, value)| types::Point {
                            value,
                            timestamp,
                            ..Default::default()
                        })
                        .collect(),
                    labels: label_pairs(s.labels),
                })
                .collect(),
        })
    }

    async fn diff(&self, r: querier::DiffRequest) -> ApiResult<querier::DiffResponse> {
        let side = |s: Option<querier::SelectMergeStacktracesRequest>, what: &str| {
            let s = s.ok_or_else(|| ApiError::bad_request(format!("{what} is required")))?;
            let selector =
                Self::merge_selector(&s.profile_type_id, &s.label_selector, &s.span_selector)
                    .map_err(|e| e.context(what))?;
            let range = range(s.start, s.end).map_err(|e| e.context(what))?;
            Ok::<_, ApiError>((selector, range, s.max_nodes))
        };
        let (left, left_range, left_nodes) = side(r.left, "left")?;
        let (right, right_range, _) = side(r.right, "right")?;
        // Each side merged as its SelectMergeStacktraces would be (a gauge averaged).
        let aggregation = Aggregation::default_for(left.profile_type());
        let (levels, left_ticks, right_ticks) = self
            .diff_levels(
                (left, left_range),
                (right, right_range),
                max_nodes(left_nodes)?,
                aggregation,
            )
            .await?;
        Ok(querier::DiffResponse {
            flamegraph: Some(levels.to_proto_diff(left_ticks, right_ticks)),
        })
    }

    async fn get_profile_stats(
        &self,
        _: types::GetProfileStatsRequest,
    ) -> ApiResult<types::GetProfileStatsResponse> {
        let span = self.read(None, move |store| Ok(store.time_span()?)).await?;
        Ok(match span {
            Some((oldest, newest)) => types::GetProfileStatsResponse {
                data_ingested: true,
                oldest_profile_time: oldest,
                newest_profile_time: newest,
            },
            None => types::GetProfileStatsResponse {
                data_ingested: false,
                oldest_profile_time: i64::MAX,
                newest_profile_time: i64::MIN,
            },
        })
    }

    async fn analyze_query(
        &self,
        r: querier::AnalyzeQueryRequest,
    ) -> ApiResult<querier::AnalyzeQueryResponse> {
        let selector = Selector::parse(&r.query).map_err(|e| ApiError::from(e).context("query"))?;
        let range = range(r.start, r.end)?;
        let (series, blocks, bytes) = self
            .read((0, 0, 0), move |store| {
                let series = store.series(&selector, range, Some(&[]))?.len() as u64;
                let blocks = store.samples().blocks();
                let bytes = blocks.iter().map(|b| b.size).sum::<u64>();
                Ok((series, blocks.len() as u64, bytes))
            })
            .await?;
        Ok(querier::AnalyzeQueryResponse {
            query_scopes: vec![querier::QueryScope {
                component_type: "frostdb".into(),
                component_count: 1,
                block_count: blocks,
                series_count: series,
                ..Default::default()
            }],
            query_impact: Some(querier::QueryImpact {
                total_bytes_in_time_range: bytes,
                total_queried_series: series,
                deduplication_needed: false,
            }),
        })
    }
}

/// Labels Pyroscope derives from the profile type, listed and matched like labels.
const PSEUDO_LABELS: &[&str] = &["__name__", frostdb_profile::PROFILE_TYPE_LABEL];

/// The part of a profile type a pseudo label stands for.
fn pseudo_label(name: &str) -> Option<fn(&frostdb_profile::ProfileType) -> String> {
    match name {
        "__name__" => Some(|t| t.name.clone()),
        frostdb_profile::PROFILE_TYPE_LABEL => Some(|t| t.to_string()),
        _ => None,
    }
}

fn profile_type(t: &frostdb_profile::ProfileType) -> types::ProfileType {
    types::ProfileType {
        id: t.to_string(),
        name: t.name.clone(),
        sample_type: t.sample_type.clone(),
        sample_unit: t.sample_unit.clone(),
        period_type: t.period_type.clone(),
        period_unit: t.period_unit.clone(),
    }
}

fn label_pairs(labels: Vec<(String, String)>) -> Vec<types::LabelPair> {
    labels
        .into_iter()
        .map(|(name, value)| types::LabelPair { name, value })
        .collect()
}

/// The merged profile as `google.v1.Profile` (pprof's messages under Pyroscope's package).
fn pprof_of(merged: &frostdb_pprof::Merged) -> ApiResult<google::Profile> {
    Ok(frostdb_pprof::report::pprof::to_profile(merged)?)
}
