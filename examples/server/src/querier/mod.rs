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

use crate::Query;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use frostdb_pprof::ReadOptions;
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

mod methods;
mod render;
pub(crate) mod transport;

use methods::*;
use render::*;
use transport::*;
pub use transport::{Codec, grpc};
pub(crate) use transport::{grpc_tenant, is_grpc, serve_grpc, status};
