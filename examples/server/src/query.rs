//! The query API under `/api/v1/`: JSON unless a `format` asks otherwise.
//!
//! | route | answers |
//! |---|---|
//! | `GET profile_types` | the stored profile type ids |
//! | `GET labels?selector=` | label names |
//! | `GET label/{name}/values?selector=` | a label's values |
//! | `GET series?selector=` | each profile type and label set once |
//! | `GET timestamps?selector=` | the profile timestamps of the selected series |
//! | `GET query?selector=&format=flamegraph\|top\|top-text\|folded\|pprof\|svg\|dot&aggregation=sum\|average\|latest` | the merged profile (gauges averaged unless told) |
//! | `GET query_range?selector=&step=&aggregation=sum\|average` | the value per series per step (gauges averaged unless told) |
//! | `GET diff?base=&compare=&aggregation=sum\|average\|latest` | two merges as one tree, each side merged as `query` would (gauges averaged unless told) |
//! | `GET/POST sql?q=` | rows of a read-only SQL query |
//!
//! Every route takes `from` and `to` (RFC 3339, Unix ms, `now-1h`; default: all of time);
//! `diff` also `base_from`/`base_to`/`compare_from`/`compare_to`.
//!
//! A query that cannot read a block it needs fails (500, naming the block). With
//! `lenient=true` it skips such blocks instead and the answer carries the header
//! `X-Frostdb-Blocks-Failed: <n>` (and `blocks_failed` in the SQL answer): a partial answer
//! always says it is partial.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::Query;
use arrow::array::RecordBatch;
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use datafusion::prelude::SessionContext;
use frostdb_pprof::report::{self, Format, RenderOptions, tree};
use frostdb_pprof::{Aggregation, MergeOptions, ReadOptions};
use frostdb_profile::TimeRange;
use frostdb_profile::{Selector, TypedSelector};
use frostdb_query::BlocksFailed;
use futures::TryStreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::tenants::Tenant;
use super::{Shared, TenantId};

/// Rows a SQL answer may hold; more are cut off and the answer says so.
pub const MAX_SQL_ROWS: usize = 100_000;
/// Bytes (in Arrow) a SQL answer may hold; more rows are cut off and the answer says so.
pub const MAX_SQL_ANSWER_BYTES: usize = 64 << 20;
/// Bytes of JSON a SQL answer may take; rows past it are cut off and the answer says so
/// (column names repeat in every row: a short query's rows can be far larger in JSON than
/// in Arrow).
pub const MAX_SQL_JSON_BYTES: usize = 64 << 20;

/// The most bytes of one JSON answer of the API (series, labels, flame graphs, ranges,
/// regressions): a flame graph of 2^20 nodes is tens of megabytes.
pub const MAX_JSON_ANSWER_BYTES: usize = 256 << 20;
/// The longest SQL text taken.
pub const MAX_SQL_BYTES: usize = 256 << 10;

/// The header of a lenient answer: how many blocks it could not read.
pub const BLOCKS_FAILED_HEADER: &str = "x-frostdb-blocks-failed";
/// How a merged profile combined each series' profiles over the range (`sum`, `average`,
/// `latest`): a gauge's answer says it was averaged.
pub const AGGREGATION_HEADER: &str = "x-frostdb-aggregation";

/// The query routes.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/v1/profile_types", get(profile_types))
        .route("/api/v1/labels", get(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/series", get(series))
        .route("/api/v1/timestamps", get(timestamps))
        .route("/api/v1/query", get(query))
        .route("/api/v1/query_range", get(query_range))
        .route("/api/v1/diff", get(diff))
        .route("/api/v1/sql", get(sql_get).post(sql_post))
}

/// The parameters the routes share.
#[derive(Debug, Default, Deserialize)]
pub struct Params {
    /// A label selector with an optional profile type prefix.
    #[serde(default, alias = "query")]
    pub selector: Option<String>,
    /// Start of the range.
    pub from: Option<String>,
    /// End of the range (excluded).
    pub to: Option<String>,
    /// Output format of `query`.
    pub format: Option<String>,
    /// How `query` and each side of `diff` combine each series' profiles over the range:
    /// `sum`, `average` or `latest` (default: average for gauges such as memory in use, else
    /// sum).
    pub aggregation: Option<String>,
    /// Step of `query_range` (`15s`, `1m`, or milliseconds).
    pub step: Option<String>,
    /// Top table: leave out nodes below this fraction of the total (default pprof's 0.005).
    pub node_fraction: Option<f64>,
    /// Diff: the base selector.
    pub base: Option<String>,
    /// Diff: the compared selector.
    pub compare: Option<String>,
    /// Diff: base range start.
    pub base_from: Option<String>,
    /// Diff: base range end.
    pub base_to: Option<String>,
    /// Diff: compared range start.
    pub compare_from: Option<String>,
    /// Diff: compared range end.
    pub compare_to: Option<String>,
    /// SQL text.
    pub q: Option<String>,
    /// Skip blocks that cannot be read (counted in [`BLOCKS_FAILED_HEADER`]) instead of
    /// failing.
    #[serde(default)]
    pub lenient: bool,
    /// `query`: only the samples of these spans (comma-separated `span_id` values).
    pub span_id: Option<String>,
    /// Flame graphs (`flamegraph`, `svg`): the most nodes shown, the rest summed into
    /// `other` per parent (default 8,192, as Pyroscope).
    pub max_nodes: Option<usize>,
}

/// `body`, with the count of skipped blocks when the query was lenient.
fn answer(body: impl IntoResponse, blocks_failed: Option<usize>) -> Response {
    let mut response = body.into_response();
    if let Some(n) = blocks_failed {
        response
            .headers_mut()
            .insert(BLOCKS_FAILED_HEADER, header::HeaderValue::from(n));
    }
    response
}

fn time(value: Option<&String>, what: &str, default: i64) -> ApiResult<i64> {
    match value.map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(default),
        Some(s) => crate::time::parse_time(s, crate::time::now_ms())
            .map_err(|e| ApiError::bad_request(format!("{what}: {e}"))),
    }
}

fn range_of(from: Option<&String>, to: Option<&String>, prefix: &str) -> ApiResult<TimeRange> {
    let start_ms = time(from, &format!("{prefix}from"), i64::MIN)?;
    let end_ms = time(to, &format!("{prefix}to"), i64::MAX)?;
    if start_ms >= end_ms {
        return Err(ApiError::bad_request(format!(
            "{prefix}from ({start_ms}) must be before {prefix}to ({end_ms})"
        )));
    }
    Ok(TimeRange { start_ms, end_ms })
}

/// Runs `parse` (selectors, whose regex matchers compile as they are parsed: about 80 ms
/// of CPU for a selector of 16 large ones, optimised) without holding up the threads that
/// accept requests: when `text` may hold a regex matcher (`=~`, `!~`) and this is a worker
/// of the server's runtime, that worker's other tasks move to another thread meanwhile
/// ([`tokio::task::block_in_place`]). Elsewhere (a plain thread, a test's runtime) it runs
/// as it is.
pub(crate) fn parsing<T>(text: &[&str], parse: impl FnOnce() -> T) -> T {
    if text.iter().any(|t| t.contains('~')) {
        crate::work::off_the_async_thread(parse)
    } else {
        parse()
    }
}

impl Params {
    fn range(&self) -> ApiResult<TimeRange> {
        range_of(self.from.as_ref(), self.to.as_ref(), "")
    }

    fn selector(&self) -> ApiResult<Option<Selector>> {
        match self
            .selector
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            None => Ok(None),
            Some(s) => Ok(Some(parsing(&[s], || {
                Selector::parse(s).map_err(|e| ApiError::from(e).context("selector"))
            })?)),
        }
    }

    fn typed_selector(&self) -> ApiResult<TypedSelector> {
        let s = self.selector()?.ok_or_else(|| {
            ApiError::bad_request(
                "the parameter \"selector\" is required, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"api\"}",
            )
        })?;
        s.typed().ok_or_else(|| {
            ApiError::bad_request(
                "the selector needs a profile type (name:sample_type:sample_unit:period_type:period_unit{...}); see /api/v1/profile_types",
            )
        })
    }
}

/// A session over a tenant's tables: strict, or lenient with its count of skipped blocks.
struct Reading {
    ctx: SessionContext,
    failed: Option<BlocksFailed>,
    /// Held until the query ends: a tenant a session reads is in use, not idle (closed
    /// meanwhile, its database would outlive its entry and refuse the next open).
    tenant: Arc<Tenant>,
}

/// Runs `f` over a fresh session of the tenant's tables on the query runtime (see
/// [`super::work`]): its answer, and with `lenient` the count of blocks it skipped; `empty`
/// for a tenant that stored nothing yet.
async fn read_tables<T, F>(
    state: &Shared,
    tenant: &str,
    lenient: bool,
    empty: T,
    f: impl FnOnce(SessionContext, frostdb_query::Cancel) -> F,
) -> ApiResult<(T, Option<usize>)>
where
    T: Send + 'static,
    F: std::future::Future<Output = ApiResult<T>> + Send + 'static,
{
    let Some(r) = open(state, tenant, lenient).await? else {
        return Ok((empty, lenient.then_some(0)));
    };
    let failed = r.failed.clone();
    let Reading { ctx, tenant, .. } = r;
    let value = state
        .work
        .query(move |cancel| {
            let answer = f(ctx, cancel);
            async move {
                let answer = answer.await;
                drop(tenant);
                answer
            }
        })
        .await?;
    Ok((value, failed.as_ref().map(BlocksFailed::get)))
}

/// A fresh session over the tenant's tables, or `None` when it stored nothing yet.
async fn open(state: &Shared, tenant: &str, lenient: bool) -> ApiResult<Option<Reading>> {
    match state.tenants.for_read(tenant).await? {
        None => Ok(None),
        Some(t) if lenient => {
            let (ctx, failed) = t.store.lenient_session()?;
            Ok(Some(Reading {
                ctx,
                failed: Some(failed),
                tenant: t,
            }))
        }
        Some(t) => Ok(Some(Reading {
            ctx: t.store.session()?,
            failed: None,
            tenant: t,
        })),
    }
}

/// A value a job of the query lane built, with the memory reserved for it: a request that
/// keeps it for a later job (one side of a diff while the other merges, a flame graph while
/// its timelines are read and its JSON written) keeps it counted in the budget until it
/// drops it. Given up between jobs, 40 renders waiting for the lane held 3.9 GB of flame
/// graphs under a 1 GiB budget, with 357 MiB reserved.
pub(crate) struct Held<T> {
    pub(crate) value: T,
    pub(crate) reserved: Vec<frostdb_core::Reservation>,
}

impl<T> Held<T> {
    /// A value that holds nothing worth counting (the answer of a tenant that stored nothing).
    pub(crate) fn unreserved(value: T) -> Self {
        Self {
            value,
            reserved: Vec::new(),
        }
    }
}

/// Merges in the query lane (off the async threads; a merge reads with its own threads),
/// each series' profiles combined by `aggregation` (series summed together); the merge
/// stays reserved while held.
pub(super) async fn merge(
    state: &Shared,
    t: Arc<Tenant>,
    selector: TypedSelector,
    range: TimeRange,
    aggregation: Aggregation,
    lenient: bool,
) -> ApiResult<Held<frostdb_pprof::Merged>> {
    let options = MergeOptions {
        aggregation,
        lenient,
        ..MergeOptions::default()
    };
    merge_held(state, t, selector, range, options, Ok).await
}

/// [`merge`] as `options` say (aggregation, series kept apart), then `then` of the merge
/// (a report built from it), in the same job of the query lane; the report's reservation
/// kept with what `then` made of the merge, for as long as it is held.
pub(super) async fn merge_held<T: Send + 'static>(
    state: &Shared,
    t: Arc<Tenant>,
    selector: TypedSelector,
    range: TimeRange,
    options: MergeOptions,
    then: impl FnOnce(frostdb_pprof::Merged) -> ApiResult<T> + Send + 'static,
) -> ApiResult<Held<T>> {
    let budget = state.budget.clone();
    let naming = state
        .symbolizer
        .is_some()
        .then_some(state.config.symbolizer.query_budget);
    state
        .work
        .queries
        .blocking(move |cancel| {
            let merged = t.store.merge_with(&selector, range, &options)?;
            // A request that ended meanwhile (its time limit passed, or its client left)
            // gets no names and no report: nobody would read them.
            let ended = || {
                cancel
                    .is_cancelled()
                    .then(|| ApiError::busy("the request ended before its report was built", 1))
            };
            if let Some(e) = ended() {
                return Err(e);
            }
            // Every report of a merge (this API's, Pyroscope's and Grafana's, diffs) shows
            // the names of frames stored as addresses that the symbolizer can find.
            if let Some(naming_budget) = naming {
                name_frames(&t, &merged, naming_budget);
            }
            if let Some(e) = ended() {
                return Err(e);
            }
            // What a report of it holds, about: a node or a line per stack.
            let report = budget
                .try_reserve(report_bytes(&merged), "building the report")
                .map_err(ApiError::over_budget)?;
            Ok(Held {
                value: then(merged)?,
                reserved: vec![report],
            })
        })
        .await
}

/// `then` of the diff tree of `base` and `compare` (at most `max_nodes` nodes, the rest
/// summed into `other` callees: [`tree::diff_truncated`]), built in the query lane, unless
/// the request ended meanwhile; the two sides' reservations (their reports', as a flame
/// graph's) stay with what `then` made.
pub(crate) async fn diff_then<T: Send + 'static>(
    state: &Shared,
    base: Held<frostdb_pprof::Merged>,
    compare: Held<frostdb_pprof::Merged>,
    max_nodes: usize,
    then: impl FnOnce(tree::DiffTree) -> T + Send + 'static,
) -> ApiResult<Held<T>> {
    state
        .work
        .queries
        .blocking(move |cancel| {
            if cancel.is_cancelled() {
                return Err(ApiError::busy(
                    "the request ended before its diff was built",
                    1,
                ));
            }
            let value = then(tree::diff_truncated(&base.value, &compare.value, max_nodes));
            let mut reserved = base.reserved;
            reserved.extend(compare.reserved);
            Ok(Held { value, reserved })
        })
        .await
}

/// Reserves what a pprof export of `merged` holds besides its report's reservation
/// ([`frostdb_pprof::Merged::export_bytes`]: a location id per location of every stack,
/// which no node cap bounds), until the guard is dropped.
pub(crate) fn reserve_export(
    budget: &frostdb_core::MemoryBudget,
    merged: &frostdb_pprof::Merged,
) -> ApiResult<frostdb_core::Reservation> {
    budget
        .try_reserve(merged.export_bytes(), "the pprof export")
        .map_err(ApiError::over_budget)
}

/// About what a report (flame graph, top table, pprof) of `merged` holds while it is built:
/// a line per stack, and a call tree of a node per frame at most, each written with its
/// names ([`frostdb_pprof::Merged::frame_bytes`], up to the most a tree is built with): a
/// merge of few stacks of many frames (deep, or a location of thousands of inlined lines)
/// is charged its tree, not its stack count, and a name of a megabyte down a deep stack
/// the megabyte at every node. Series kept apart are charged their stacks' copies
/// ([`frostdb_pprof::Merged::series_bytes`]): a deep stack in thousands of series is
/// thousands of copies in a pprof export.
fn report_bytes(merged: &frostdb_pprof::Merged) -> usize {
    let series: usize = merged.series.iter().map(|(_, s)| s.len()).sum();
    let lines = (merged.samples.len() + series).saturating_mul(256);
    lines
        .max(merged.frame_bytes())
        .saturating_add(merged.series_bytes())
        .saturating_add(merged.symbols.walk_bytes())
}

/// A profile type as the API lists it.
fn profile_type_json(t: &frostdb_profile::ProfileType) -> Value {
    json!({
        "id": t.to_string(),
        "name": t.name,
        "sample_type": t.sample_type,
        "sample_unit": t.sample_unit,
        "period_type": t.period_type,
        "period_unit": t.period_unit,
    })
}

async fn profile_types(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let range = p.range()?;
    listed(&state, &tenant, p.lenient, move |store, read| {
        let types = store.profile_types(range, read)?;
        Ok(frostdb_pprof::Read {
            value: types.value.iter().map(profile_type_json).collect(),
            blocks_failed: types.blocks_failed,
        })
    })
    .await
}

/// Label names, label values or profile types, read through the tenant's store: strict,
/// from its series index (no sample row is read); lenient, from the sample rows, counting
/// the blocks it could not read. An empty list for a tenant that does not exist.
async fn listed<T: serde::Serialize + Send + 'static>(
    state: &Shared,
    tenant: &str,
    lenient: bool,
    read: impl FnOnce(
        &frostdb_pprof::ProfileStore,
        ReadOptions,
    ) -> frostdb_pprof::Result<frostdb_pprof::Read<Vec<T>>>
    + Send
    + 'static,
) -> ApiResult<Response> {
    // Written in the lane, straight from the values (no tree of them, and no serializing
    // on an async thread).
    let (body, failed) = on_store(state, tenant, (b"[]".to_vec(), 0), move |store| {
        let read = read(store, ReadOptions::lenient(lenient))?;
        Ok((json_bytes(&read.value)?, read.blocks_failed))
    })
    .await?;
    Ok(answer(json_response(body), lenient.then_some(failed)))
}

async fn labels(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let (range, selector) = (p.range()?, p.selector()?);
    listed(&state, &tenant, p.lenient, move |store, read| {
        store.label_names(selector.as_ref(), range, read)
    })
    .await
}

async fn label_values(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Path(name): Path<String>,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let (range, selector) = (p.range()?, p.selector()?);
    listed(&state, &tenant, p.lenient, move |store, read| {
        store.label_values(&name, selector.as_ref(), range, read)
    })
    .await
}

async fn series(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let (range, selector) = (p.range()?, p.selector()?.unwrap_or_default());
    let lenient = p.lenient;
    let budget = state.budget.clone();
    let read = move |store: &frostdb_pprof::ProfileStore| {
        // Strict: from the series index; lenient: from the sample rows, counting what it
        // could not read.
        let read = store.series(&selector, range, None, ReadOptions::lenient(lenient))?;
        let (series, failed) = (read.value, read.blocks_failed);
        // The read's reservation ended with it: its labels, and their copies in the
        // answer, are held again until the answer is written.
        let labels = listed_label_bytes(&series);
        let _held = budget
            .try_reserve(labels.saturating_mul(2), "the listed series")
            .map_err(ApiError::over_budget)?;
        // Written here, in the lane, straight from the series (no tree of values, and no
        // serializing on an async thread).
        #[derive(serde::Serialize)]
        struct Listed {
            profile_type: String,
            labels: BTreeMap<String, String>,
        }
        let listed: Vec<Listed> = series
            .into_iter()
            .map(|s| Listed {
                profile_type: s.profile_type.to_string(),
                labels: s.labels.into_iter().collect(),
            })
            .collect();
        let body = json_bytes(&listed)?;
        Ok((body, failed))
    };
    let (body, failed) = on_store(&state, &tenant, (b"[]".to_vec(), 0), read).await?;
    Ok(answer(json_response(body), lenient.then_some(failed)))
}

/// Runs `read` on the tenant's store off the async threads; `empty` for a tenant that
/// stored nothing.
pub(super) async fn on_store<T: Send + 'static>(
    state: &Shared,
    tenant: &str,
    empty: T,
    read: impl FnOnce(&frostdb_pprof::ProfileStore) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let Some(t) = state.tenants.for_read(tenant).await? else {
        return Ok(empty);
    };
    state.work.queries.blocking(move |_| read(&t.store)).await
}

async fn timestamps(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let (range, selector) = (p.range()?, p.typed_selector()?);
    let lenient = p.lenient;
    // Written in the lane, at most as many as a range's points (before, the times were
    // handed to an async thread to serialize once their reservation was given back).
    let read = move |store: &frostdb_pprof::ProfileStore| {
        let read = store.timestamps(&selector, range, ReadOptions::lenient(lenient))?;
        if read.value.len() > MAX_RANGE_POINTS {
            return Err(ApiError::bad_request(format!(
                "the answer would hold {} times, over the limit of {MAX_RANGE_POINTS}: ask \
                 with a shorter range or a narrower selector",
                read.value.len()
            )));
        }
        let body = json_bytes(&read.value)?;
        Ok((body, read.blocks_failed))
    };
    let (body, failed) = on_store(&state, &tenant, (b"[]".to_vec(), 0), read).await?;
    Ok(answer(json_response(body), lenient.then_some(failed)))
}

async fn query(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let (range, mut selector) = (p.range()?, p.typed_selector()?);
    if let Some(ids) = p.span_id.as_deref() {
        let ids: Vec<&str> = ids.split(',').map(str::trim).collect();
        selector = selector.with(
            frostdb_profile::Matcher::any_of("span_id", &ids)
                .map_err(|e| ApiError::bad_request(format!("span_id: {e}")))?,
        );
    }
    let format = Format::parse(p.format.as_deref().unwrap_or("flamegraph"))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let profile_type = selector.profile_type().clone();
    let aggregation = aggregation_of(p.aggregation.as_deref(), &profile_type)?;
    let options = MergeOptions {
        aggregation,
        by_series: format.keeps_series(),
        lenient: p.lenient,
    };
    let fraction = p.node_fraction.unwrap_or(report::top::NODE_FRACTION);
    if !(0.0..=1.0).contains(&fraction) {
        return Err(ApiError::bad_request("node_fraction must be within 0..1"));
    }
    checked_max_nodes(p.max_nodes)?;
    let render = RenderOptions {
        max_nodes: p.max_nodes,
        node_fraction: fraction,
        title: p.selector.clone().unwrap_or_default(),
    };
    let budget = state.budget.clone();
    let draw = move |merged: frostdb_pprof::Merged| {
        let failed = merged.blocks_failed;
        let _export = (format == Format::Pprof)
            .then(|| reserve_export(&budget, &merged))
            .transpose()?;
        Ok((report::render(&merged, format, &render)?, failed))
    };
    let (bytes, failed) = match state.tenants.for_read(&tenant).await? {
        Some(t) => {
            // An empty answer is checked: a selector that can never match (a type or label
            // nobody stored) is a 400 listing what is stored, never an empty flame graph.
            let (tenant, checked) = (t.clone(), selector.clone());
            let check_then_draw = move |merged: frostdb_pprof::Merged| {
                // (A lenient answer that skipped blocks says so instead.)
                if merged.samples.is_empty() && merged.blocks_failed == 0 {
                    tenant.store.check_selection(&checked, range)?;
                }
                draw(merged)
            };
            merge_held(&state, t, selector, range, options, check_then_draw)
                .await?
                .value
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "no profile type {profile_type} is stored: tenant {tenant:?} has stored nothing yet"
            )));
        }
    };
    let failed = p.lenient.then_some(failed);
    let mut response = ([(header::CONTENT_TYPE, format.content_type())], bytes).into_response();
    if format == Format::Pprof {
        response.headers_mut().insert(
            header::CONTENT_DISPOSITION,
            header::HeaderValue::from_static("attachment; filename=\"profile.pb.gz\""),
        );
    }
    response.headers_mut().insert(
        AGGREGATION_HEADER,
        header::HeaderValue::from_static(aggregation.name()),
    );
    Ok(answer(response, failed))
}

/// Names the frames of `merged` stored as addresses (a mapping with a build id, no lines)
/// from the tenant's uploads and the debuginfod servers, within `budget`
/// (`[symbolizer] query_budget`), in their symbol partitions and the names table: the
/// report drawn next shows them, and later queries find them named. Runs on the query's
/// lane (it holds the query's slot for at most the budget); frames it does not reach stay
/// addresses, for the background resolver.
fn name_frames(
    tenant: &crate::tenants::Tenant,
    merged: &frostdb_pprof::Merged,
    budget: std::time::Duration,
) {
    let named =
        tokio::runtime::Handle::current().block_on(tenant.store.name_merged(merged, budget));
    match named {
        Ok(summary) if summary.unsymbolized > 0 => tracing::info!(
            tenant = %tenant.id,
            unsymbolized = summary.unsymbolized,
            resolved = summary.resolved,
            missing = summary.missing.len(),
            too_large = summary.too_large.len(),
            out_of_budget = summary.out_of_budget,
            "named frames stored as addresses"
        ),
        Ok(_) => {}
        // The report still shows them: storing them failed, the next query names again.
        Err(error) => tracing::warn!(tenant = %tenant.id, %error, "storing symbol names failed"),
    }
}

/// The `aggregation` asked for, else what suits `profile_type` (gauges average): one rule
/// for `query` and `diff`, so a diff's side totals what the query of it totals.
fn aggregation_of(
    asked: Option<&str>,
    profile_type: &frostdb_profile::ProfileType,
) -> ApiResult<Aggregation> {
    match asked.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) => Aggregation::parse(a).map_err(ApiError::bad_request),
        None => Ok(Aggregation::default_for(profile_type)),
    }
}

/// Parses a step: a duration (`15s`, `1m`) or milliseconds.
fn step_ms(step: Option<&str>, range: TimeRange) -> ApiResult<i64> {
    match step.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => {
            let ms = match s.parse::<i64>() {
                Ok(ms) => ms,
                Err(_) => crate::time::parse_duration_ms(s)
                    .map_err(|e| ApiError::bad_request(format!("step: {e}")))?,
            };
            if ms <= 0 {
                return Err(ApiError::bad_request("step must be positive"));
            }
            Ok(ms)
        }
        // About 200 points over a bounded range, 15 s otherwise.
        None if range.start_ms != i64::MIN && range.end_ms != i64::MAX => {
            Ok(((range.end_ms - range.start_ms) / 200).max(1_000))
        }
        None => Ok(15_000),
    }
}

async fn query_range(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let (range, selector) = (p.range()?, p.typed_selector()?);
    let step = step_ms(p.step.as_deref(), range)?;
    let profile_type = selector.profile_type.as_ref().map(|t| t.to_string());
    // A gauge's point is the average of the series' profiles in the step, unless told.
    let average = match p.aggregation.as_deref().map(Aggregation::parse) {
        None => selector
            .profile_type
            .as_ref()
            .is_some_and(|t| Aggregation::default_for(t) == Aggregation::Average),
        Some(Ok(Aggregation::Sum)) => false,
        Some(Ok(Aggregation::Average)) => true,
        Some(Ok(Aggregation::Latest)) => {
            return Err(ApiError::bad_request(
                "aggregation latest applies to query, not query_range (sum or average)",
            ));
        }
        Some(Err(e)) => return Err(ApiError::bad_request(e)),
    };
    let lenient = p.lenient;
    // Profile totals: a row per profile; one series per label set, points in time order.
    // The answer is written in the lane too, within its cap.
    let empty = range_body(
        Vec::new(),
        average,
        step,
        profile_type.clone(),
        MAX_RANGE_POINTS,
    )?;
    let (body, failed) = on_store(&state, &tenant, (empty, 0), move |store| {
        let read = store.range(&selector, range, step, None, ReadOptions::lenient(lenient))?;
        let (series, failed) = (read.value, read.blocks_failed);
        if series.is_empty() && failed == 0 {
            store.check_selection(&selector, range)?;
        }
        let body = range_body(series, average, step, profile_type, MAX_RANGE_POINTS)?;
        Ok((body, failed))
    })
    .await?;
    Ok(answer(
        ([(header::CONTENT_TYPE, "application/json")], body),
        lenient.then_some(failed),
    ))
}

/// Points a `query_range` answer may hold; more is refused (400), naming the limit.
pub const MAX_RANGE_POINTS: usize = 1 << 20;

/// Refuses `series` holding more than `max_points` points (400, naming the limit).
pub fn within_points(
    series: &[frostdb_profile::native::Series],
    max_points: usize,
) -> ApiResult<()> {
    let points: usize = series.iter().map(|s| s.points.len()).sum();
    if points > max_points {
        return Err(ApiError::bad_request(format!(
            "the answer would hold {points} points, over the limit of {max_points}: \
             ask with a larger step, a shorter range or a narrower selector"
        )));
    }
    Ok(())
}

/// One series of a `query_range` answer.
#[derive(serde::Serialize)]
struct RangeSeries {
    labels: BTreeMap<String, String>,
    points: Vec<(i64, i64)>,
}

/// A `query_range` answer.
#[derive(serde::Serialize)]
struct RangeAnswer {
    profile_type: Option<String>,
    step_ms: i64,
    aggregation: &'static str,
    series: Vec<RangeSeries>,
}

/// The JSON of a `query_range` answer of `series`, refused when it would hold more than
/// `max_points` points (each a JSON array of two numbers: built as a tree of values, a
/// million points took hundreds of megabytes).
fn range_body(
    series: Vec<frostdb_profile::native::Series>,
    average: bool,
    step_ms: i64,
    profile_type: Option<String>,
    max_points: usize,
) -> ApiResult<Vec<u8>> {
    within_points(&series, max_points)?;
    let series = series
        .into_iter()
        .map(|s| RangeSeries {
            points: s
                .values(average)
                .map(|(t, v)| (t, v.round() as i64))
                .collect(),
            labels: s.labels.into_iter().collect(),
        })
        .collect();
    let aggregation = if average {
        Aggregation::Average
    } else {
        Aggregation::Sum
    }
    .name();
    let answer = RangeAnswer {
        profile_type,
        step_ms,
        aggregation,
        series,
    };
    json_bytes(&answer)
}

/// An answer written as JSON bytes (in the query lane, rather than serialized on an async
/// thread by `Json`).
///
/// At most [`MAX_JSON_ANSWER_BYTES`]: past them it stops writing and refuses the request
/// (413, naming the limit). What an answer's values take in memory is not what their JSON
/// takes: a control character in a label or a name is written as six bytes, and an answer
/// built within its reservation could otherwise be written many times larger.
pub(crate) fn json_bytes(answer: &impl serde::Serialize) -> ApiResult<Vec<u8>> {
    /// A `Vec` that refuses to grow past the limit.
    struct Capped(Vec<u8>);
    impl std::io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0.len().saturating_add(buf.len()) > MAX_JSON_ANSWER_BYTES {
                return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, "cap"));
            }
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut out = Capped(Vec::new());
    match serde_json::to_writer(&mut out, answer) {
        Ok(()) => Ok(out.0),
        Err(e) if e.io_error_kind() == Some(std::io::ErrorKind::FileTooLarge) => {
            Err(ApiError::too_large(format!(
                "the answer is over the limit of {MAX_JSON_ANSWER_BYTES} bytes of JSON \
                 (a narrower selector or a shorter range answers with less)"
            )))
        }
        Err(e) => Err(ApiError::internal(format!("the answer to JSON: {e}"))),
    }
}

/// What listed series' labels hold (their strings and about 48 bytes a label beside).
pub(crate) fn listed_label_bytes(series: &[frostdb_profile::native::SeriesLabels]) -> usize {
    series
        .iter()
        .flat_map(|s| &s.labels)
        .map(|(k, v)| k.len() + v.len() + 48)
        .fold(0, usize::saturating_add)
}

/// A response of JSON bytes [`json_bytes`] wrote.
pub(crate) fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `max_nodes` as asked, refused past [`crate::querier::MAX_NODES_CAP`].
fn checked_max_nodes(max_nodes: Option<usize>) -> ApiResult<Option<usize>> {
    let cap = crate::querier::MAX_NODES_CAP as usize;
    if max_nodes.is_some_and(|n| n > cap) {
        return Err(ApiError::bad_request(format!(
            "max_nodes may be at most {cap}"
        )));
    }
    Ok(max_nodes)
}

async fn diff(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let parse = |s: Option<&String>, what: &str| -> ApiResult<TypedSelector> {
        let s = s
            .or(p.selector.as_ref())
            .ok_or_else(|| ApiError::bad_request(format!("{what}: a selector is required")))?;
        parsing(&[s], || Selector::parse(s))
            .map_err(|e| ApiError::from(e).context(what))?
            .typed()
            .ok_or_else(|| {
                ApiError::bad_request(format!("{what}: the selector needs a profile type"))
            })
    };
    let base = parse(p.base.as_ref(), "base")?;
    let compare = parse(p.compare.as_ref(), "compare")?;
    // As a flame graph's: the callees past it summed into `other` (a diff of every node of
    // two 12-hour merges was 235 MB of JSON, at twice what it reserved).
    let max_nodes = checked_max_nodes(p.max_nodes)?.unwrap_or(tree::DEFAULT_MAX_NODES);
    if base.profile_type() != compare.profile_type() {
        return Err(ApiError::bad_request(format!(
            "base and compare must have the same profile type ({} vs {})",
            base.profile_type(),
            compare.profile_type()
        )));
    }
    let base_range = range_of(
        p.base_from.as_ref().or(p.from.as_ref()),
        p.base_to.as_ref().or(p.to.as_ref()),
        "base_",
    )?;
    let compare_range = range_of(
        p.compare_from.as_ref().or(p.from.as_ref()),
        p.compare_to.as_ref().or(p.to.as_ref()),
        "compare_",
    )?;
    // Each side merged as `query` merges it: a gauge's side is its average over the range,
    // so the diff of a selection with itself totals what its flame graph totals.
    let aggregation = aggregation_of(p.aggregation.as_deref(), base.profile_type())?;
    let said = [(
        AGGREGATION_HEADER,
        header::HeaderValue::from_static(aggregation.name()),
    )];
    let Some(t) = state.tenants.for_read(&tenant).await? else {
        return Ok(answer(
            (
                said,
                Json(
                    json!({"name": "total", "base": 0, "compare": 0, "base_self": 0, "compare_self": 0}),
                ),
            ),
            p.lenient.then_some(0),
        ));
    };
    let b = merge(&state, t.clone(), base, base_range, aggregation, p.lenient).await?;
    let c = merge(&state, t, compare, compare_range, aggregation, p.lenient).await?;
    let failed = p
        .lenient
        .then_some(b.value.blocks_failed + c.value.blocks_failed);
    // Written by the tree itself: a deep tree through serde would recurse once per frame.
    let body = diff_then(&state, b, c, max_nodes, |diff| diff.to_json())
        .await?
        .value;
    Ok(answer(
        (said, [(header::CONTENT_TYPE, "application/json")], body),
        failed,
    ))
}

async fn sql_get(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
) -> ApiResult<Response> {
    let q =
        p.q.ok_or_else(|| ApiError::bad_request("the parameter \"q\" (SQL text) is required"))?;
    sql(&state, &tenant, &q, p.lenient).await
}

async fn sql_post(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    Query(p): Query<Params>,
    body: String,
) -> ApiResult<Response> {
    sql(&state, &tenant, &body, p.lenient).await
}

/// Runs read-only SQL on the query runtime, its plan cancelled with its request; rows as
/// JSON objects, at most [`MAX_SQL_ROWS`] and [`MAX_SQL_ANSWER_BYTES`].
async fn sql(state: &Shared, tenant: &str, q: &str, lenient: bool) -> ApiResult<Response> {
    if q.trim().is_empty() {
        return Err(ApiError::bad_request("empty SQL"));
    }
    if q.len() > MAX_SQL_BYTES {
        return Err(ApiError::too_large(format!(
            "the SQL text has {} bytes, over the limit of {MAX_SQL_BYTES}",
            q.len()
        )));
    }
    // Planning is not bounded by the text's size: a statement too large to plan in
    // proportion is refused before it is (on the query runtime, whose threads have room
    // for the parser's trees).
    let text = q.to_owned();
    state
        .work
        .query(move |_| async move {
            frostdb_query::check_sql_shape(&text, &frostdb_query::SqlLimits::default())
                .map_err(|e| ApiError::bad_request(e.to_string()))
        })
        .await?;
    if state.tenants.for_read(tenant).await?.is_none() {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("tenant {tenant:?} has no data yet"),
        ));
    }
    let q = q.to_owned();
    let ((rows, truncated), failed) = read_tables(
        state,
        tenant,
        lenient,
        (b"[]".to_vec(), false),
        move |ctx, cancel| async move {
            let plan = frostdb_query::read_sql(&ctx, &q)
                .await?
                .create_physical_plan()
                .await?;
            frostdb_query::check_sql_physical_plan(&plan)?;
            let plan = frostdb_query::cancellable(plan, &cancel)?;
            let mut stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx())?;
            let mut batches = Vec::new();
            let (mut rows, mut bytes) = (0, 0);
            let mut truncated = false;
            while let Some(batch) = stream.try_next().await? {
                let batch_bytes = batch.get_array_memory_size();
                if rows + batch.num_rows() > MAX_SQL_ROWS
                    || bytes + batch_bytes > MAX_SQL_ANSWER_BYTES
                {
                    // The rows that fit both caps (by their share of the batch's bytes),
                    // not the whole batch that crossed one: a batch of 8,192 wide rows
                    // alone can be hundreds of MB.
                    let room = MAX_SQL_ANSWER_BYTES.saturating_sub(bytes) as u128;
                    let by_bytes = batch.num_rows() as u128 * room / batch_bytes.max(1) as u128;
                    let keep = (MAX_SQL_ROWS - rows)
                        .min(usize::try_from(by_bytes).unwrap_or(usize::MAX))
                        .min(batch.num_rows());
                    batches.push(batch.slice(0, keep));
                    truncated = true;
                    break;
                }
                bytes += batch_bytes;
                rows += batch.num_rows();
                batches.push(batch);
            }
            drop(stream);
            let (json, cut) = rows_json(&batches, MAX_SQL_JSON_BYTES)?;
            Ok((json, truncated || cut))
        },
    )
    .await?;
    // The rows are JSON already: written around, not parsed into a tree again. A stream
    // cut off early has not read every block: its count is a lower bound.
    let mut body = Vec::with_capacity(rows.len() + 64);
    body.extend_from_slice(b"{\"rows\":");
    body.extend_from_slice(&rows);
    body.extend_from_slice(format!(",\"truncated\":{truncated}").as_bytes());
    if let Some(n) = failed {
        body.extend_from_slice(format!(",\"blocks_failed\":{n}").as_bytes());
    }
    body.push(b'}');
    Ok(answer(
        ([(header::CONTENT_TYPE, "application/json")], body),
        failed,
    ))
}

/// A buffer that takes whole writes up to `limit` bytes and refuses the write that would
/// cross it (taking none of it).
struct BoundedBuffer {
    bytes: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for BoundedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other("over the answer's byte cap"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rows as a JSON array of objects, of at most `limit` bytes: the rows that fit, and
/// whether any did not. Rows are written as lines (arrow's writer hands its output on in
/// whole rows, and at most 8 KiB more than one row at a time), so the rows kept when the
/// cap is met are whole; the lines' breaks, which JSON text never holds raw, become the
/// array's commas.
fn rows_json(batches: &[RecordBatch], limit: usize) -> ApiResult<(Vec<u8>, bool)> {
    let mut writer = arrow::json::LineDelimitedWriter::new(BoundedBuffer {
        bytes: vec![b'['],
        limit: limit.saturating_sub(1),
        over: false,
    });
    let mut failed = None;
    for batch in batches {
        if let Err(e) = writer.write(batch) {
            failed = Some(e);
            break;
        }
    }
    let buffer = writer.into_inner();
    if let Some(e) = failed.filter(|_| !buffer.over) {
        return Err(ApiError::internal(format!("rows to JSON: {e}")));
    }
    let mut json = buffer.bytes;
    if json.last() == Some(&b'\n') {
        json.pop();
    }
    for b in &mut json {
        if *b == b'\n' {
            *b = b',';
        }
    }
    json.push(b']');
    Ok((json, buffer.over))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON answer stops at its limit, refused naming it, however small the values it is
    /// written from: a control character is six bytes of JSON. Below it, it is written.
    #[test]
    fn a_json_answer_stops_at_its_limit() {
        /// `n` strings of a MiB of U+0001, made as they are written.
        struct Controls(usize);
        impl serde::Serialize for Controls {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeSeq;
                let one = "\u{1}".repeat(1 << 20);
                let mut seq = s.serialize_seq(Some(self.0))?;
                for _ in 0..self.0 {
                    seq.serialize_element(&one)?;
                }
                seq.end()
            }
        }
        // 43 MiB of values, 258 MiB of JSON.
        let err = json_bytes(&Controls(43)).unwrap_err();
        let body = format!("{err:?}");
        assert!(body.contains(&MAX_JSON_ANSWER_BYTES.to_string()), "{body}");
        assert_eq!(
            err.into_response().status(),
            axum::http::StatusCode::PAYLOAD_TOO_LARGE
        );
        let fits = json_bytes(&Controls(2)).unwrap();
        assert_eq!(fits.len(), 2 * 6 * (1 << 20) + 2 * 2 + 3);
    }

    /// A `query_range` answer is the series' points as JSON, averaged when asked; past its
    /// point limit it is refused, naming the limit, rather than built.
    #[test]
    fn a_range_answer_holds_its_points_and_no_more_than_its_limit() {
        let series = || {
            vec![frostdb_profile::native::Series {
                labels: vec![("job".into(), "api".into())],
                points: vec![(0, 10), (15_000, 30)],
                rows: vec![2, 3],
            }]
        };
        let body = range_body(series(), true, 15_000, Some("t".into()), 2).unwrap();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            answer,
            json!({"profile_type": "t", "step_ms": 15_000, "aggregation": "average",
                "series": [{"labels": {"job": "api"}, "points": [[0, 5], [15_000, 10]]}]})
        );
        let e = range_body(series(), false, 15_000, None, 1).unwrap_err();
        assert!(
            e.to_string().contains("2 points, over the limit of 1"),
            "{e}"
        );
    }

    /// While a request's regexes compile, the thread it runs on is not its runtime's: the
    /// runtime's other tasks go on. Here the runtime has one worker, the parse waits for a
    /// task spawned after it, and that task runs; parsing on the worker itself, it never
    /// would, and the parse gives up waiting.
    #[test]
    fn a_regex_parse_leaves_the_runtime_to_other_requests() {
        assert!(
            crate::work::others_run_meanwhile(|wait| parsing(&["{job=~\"api-.*\"}"], wait)),
            "the other task never ran"
        );
        // Without a regex, or off a runtime, the parse runs where it is.
        assert_eq!(parsing(&["{job=\"api\"}"], || 7), 7);
        assert_eq!(parsing(&["{job=~\"a.*\"}"], || 8), 8);
    }
}
