//! How the server is: `/healthz` (alive, and what is degraded) and `/metrics` (the
//! Prometheus text exposition format, behind the server's token like the API). Both answer
//! from memory, on the async threads, without touching a tenant's data. `/healthz` names
//! the tenants at fault only to a caller with the token (or where the server has none).
//!
//! Degraded, per open tenant: its database stopped accepting writes (a failed fsync or WAL
//! upload; reopening it, by restarting, writes again), or its manifest's mirror in the
//! object store is behind (a database reopened from the bucket alone would miss what was
//! persisted since the last good mirror). And the server's: a write failed for lack of
//! storage in the last few minutes, or its eBPF sampler (`--ebpf`) no longer samples.

use std::fmt::Write;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::Shared;

/// The health route, open to all.
pub fn routes() -> Router<Shared> {
    Router::new().route("/healthz", get(healthz))
}

/// The metrics route (to mount behind the token).
pub fn metrics_routes() -> Router<Shared> {
    Router::new().route("/metrics", get(metrics))
}

/// `GET /healthz`: 200 while the server answers; `ok`, or `degraded` and a line per
/// problem.
async fn healthz(
    State(state): State<Shared>,
    request: axum::extract::Request,
) -> impl IntoResponse {
    // Named to the server's token (every tenant's) or a tenant's (its own); counted
    // otherwise, and to a page of another origin where no token is asked (a rebound DNS
    // name reaching a server on loopback).
    let caller = crate::same_origin(&state, &request)
        .ok()
        .and_then(|()| crate::caller(&state, request.headers()));
    let mut problems = String::new();
    let mut elsewhere = 0;
    for tenant in state.tenants.open_tenants() {
        let db = tenant.store.db();
        if !sees(caller.as_ref(), &tenant.id) {
            elsewhere += usize::from(db.stopped().is_some())
                + usize::from(db.mirror_health().is_some_and(|h| h.behind.is_some()));
            continue;
        }
        if let Some(why) = db.stopped() {
            let _ = writeln!(
                problems,
                "tenant {:?}: stopped accepting writes: {why}",
                tenant.id
            );
        }
        if let Some(health) = db.mirror_health()
            && let Some(why) = health.behind
        {
            let _ = writeln!(
                problems,
                "tenant {:?}: the manifest's mirror in the object store is behind after {} failed mirrors: {why}",
                tenant.id, health.failures
            );
        }
    }
    // The server's storage: every tenant's concern, and it names no tenant's data.
    if let Some(ago) = crate::error::storage_full_lately() {
        let _ = writeln!(
            problems,
            "a write failed {ago} s ago: the server's storage is full (writes are refused with \
             503 until space is freed)"
        );
    }
    // The server's own sampler: every tenant's concern (its tenant's is named above).
    if let Some(health) = state.ebpf.get().map(|h| h.get())
        && !health.running
    {
        let why = health.last_error.as_deref().unwrap_or("it stopped");
        let _ = writeln!(
            problems,
            "the eBPF sampler (--ebpf) no longer samples: {why}"
        );
    }
    if problems.is_empty() && elsewhere == 0 {
        "ok\n".to_owned()
    } else if elsewhere == 0 {
        format!("degraded\n{problems}")
    } else {
        format!(
            "degraded\n{problems}{elsewhere} problems (GET /metrics, or /healthz with the token, says which)\n"
        )
    }
}

/// Whether `caller` may see tenant `id`'s state: the server's token sees every tenant's, a
/// tenant's token its own, no token (where one is required) none.
fn sees(caller: Option<&crate::Caller>, id: &str) -> bool {
    match caller {
        Some(crate::Caller::Operator) => true,
        Some(crate::Caller::Tenant(own)) => own == id,
        None => false,
    }
}

/// `GET /metrics`: with the server's token, the server's families and every tenant's
/// series; with a tenant's token, that tenant's series only (its rules', its
/// regressions', its database's state), nothing of other tenants, not even their names.
///
/// Written off the async thread. The recording rules' series of every tenant in view (megabytes
/// each, at their limits) are charged to the memory budget past their first few megabytes
/// ([`crate::rules::exposition`]): past the budget it is a 503, as any request's work is.
async fn metrics(
    State(state): State<Shared>,
    axum::Extension(caller): axum::Extension<crate::Caller>,
) -> Result<impl IntoResponse, crate::error::ApiError> {
    let out = crate::work::off_the_async_thread(|| exposition(&state, &caller))
        .map_err(crate::error::ApiError::over_budget)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    ))
}

/// The text of `/metrics` for `caller`.
fn exposition(state: &Shared, caller: &crate::Caller) -> Result<String, frostdb_core::OverBudget> {
    let only = match caller {
        crate::Caller::Operator => None,
        crate::Caller::Tenant(id) => Some(id.as_str()),
    };
    let mut tenants = state.tenants.open_tenants();
    tenants.retain(|t| only.is_none_or(|id| t.id == id));
    let mut out = String::new();
    if only.is_none() {
        family(
            &mut out,
            "frostdb_open_tenants",
            "gauge",
            "Tenants open now.",
        );
        let _ = writeln!(out, "frostdb_open_tenants {}", tenants.len());
        single(
            &mut out,
            "frostdb_memory_budget_bytes",
            "gauge",
            "The server's memory budget (limits.memory).",
            state.budget.limit() as u64,
        );
        single(
            &mut out,
            "frostdb_memory_reserved_bytes",
            "gauge",
            "Of the budget, what requests hold now: bodies, decodes, queries, and answers \
             not yet sent.",
            state.budget.reserved() as u64,
        );
        for (lane, family) in [
            (&state.work.queries, "frostdb_query_jobs"),
            (&state.work.ingest, "frostdb_ingest_jobs"),
        ] {
            single(
                &mut out,
                &format!("{family}_running"),
                "gauge",
                &format!(
                    "Jobs running in the {} lane now, of its {} slots ({}); one tenant runs in \
                     at most {} of them.",
                    lane.name(),
                    lane.slots(),
                    lane.key(),
                    crate::work::Lane::tenant_slots(lane.slots()),
                ),
                lane.running() as u64,
            );
            single(
                &mut out,
                &format!("{family}_waiting"),
                "gauge",
                &format!(
                    "Jobs waiting for a slot of the {} lane now, or for one of their tenant's.",
                    lane.name()
                ),
                lane.waiting() as u64,
            );
        }
        single(
            &mut out,
            "frostdb_memory_standing_bytes",
            "gauge",
            "Of the budget, what the tenants' in-memory blocks hold.",
            state.budget.standing() as u64,
        );
    }
    let mut shares = state.budget.shares();
    // The connections' share is no tenant's: shown on its own, to the operator.
    let connections = shares
        .iter()
        .position(|(id, _)| id == crate::connections::CONNECTIONS_SHARE)
        .map(|at| shares.remove(at).1);
    if only.is_none() {
        single(
            &mut out,
            "frostdb_connections_memory_reserved_bytes",
            "gauge",
            "Of the memory budget, what connections hold outside requests: bytes read before \
             a request is made of them, and answers not yet written to their sockets (at most \
             a quarter of it, split between client addresses; past its address's part, a \
             connection is closed).",
            connections.unwrap_or(0) as u64,
        );
        single(
            &mut out,
            "frostdb_connections_closed_over_budget_total",
            "counter",
            "Connections closed because the bytes they sent did not fit their client \
             address's part of the memory budget (see frostdb_connections_memory_reserved_bytes).",
            crate::connections::closed_over_budget(),
        );
    }
    shares.retain(|(id, _)| only.is_none_or(|only| id == only));
    per_tenant(
        &mut out,
        ("frostdb_tenant_memory_reserved_bytes", "gauge"),
        "Of the memory budget, what the tenant's requests and queries hold now (one tenant \
         holds at most three quarters of it; past that, 429).",
        shares.iter().map(|(id, bytes)| (id, *bytes as u64)),
    );
    if let Some(rates) = &state.ingest_rates {
        let mut refused = rates.refused();
        refused.retain(|(id, _)| only.is_none_or(|only| id == only));
        per_tenant(
            &mut out,
            ("frostdb_tenant_ingest_refused_total", "counter"),
            "Pushes refused by the tenant's ingest rate (limits.ingest_rate_per_tenant, or \
             its own), 429 or 413, since the server started.",
            refused.iter().map(|(id, r)| (id, r.pushes)),
        );
        per_tenant(
            &mut out,
            ("frostdb_tenant_ingest_refused_bytes_total", "counter"),
            "Bytes of those pushes, as sent.",
            refused.iter().map(|(id, r)| (id, r.bytes)),
        );
    }
    per_tenant(
        &mut out,
        ("frostdb_writes_stopped", "gauge"),
        "1 while a tenant's database refuses writes (a failed fsync or WAL upload).",
        tenants
            .iter()
            .map(|t| (&t.id, u64::from(t.store.db().stopped().is_some()))),
    );
    let mirrors: Vec<_> = tenants
        .iter()
        .filter_map(|t| Some((&t.id, t.store.db().mirror_health()?)))
        .collect();
    per_tenant(
        &mut out,
        ("frostdb_manifest_mirror_failures_total", "counter"),
        "Mirrors of a tenant's manifest to the object store that failed since it opened.",
        mirrors.iter().map(|(id, h)| (*id, h.failures)),
    );
    per_tenant(
        &mut out,
        ("frostdb_manifest_mirror_behind", "gauge"),
        "1 while the object store's copy of a tenant's manifest is behind the local one.",
        mirrors
            .iter()
            .map(|(id, h)| (*id, u64::from(h.behind.is_some()))),
    );
    if let Some(symbolizer) = &state.symbolizer
        && only.is_none()
    {
        symbolizer_metrics(&mut out, &symbolizer.stats());
    }
    if let Some(health) = state.ebpf.get().map(|h| h.get())
        && only.is_none()
    {
        single(
            &mut out,
            "frostdb_ebpf_sampler_running",
            "gauge",
            "1 while the eBPF sampler (--ebpf) samples.",
            u64::from(health.running),
        );
        single(
            &mut out,
            "frostdb_ebpf_intervals_failed_total",
            "counter",
            "eBPF sampling intervals lost whole: a failed drain of the kernel's buffers, or a \
             panic building or storing their profiles.",
            health.failed_intervals,
        );
    }
    let mut charge = state.budget.empty();
    crate::rules::exposition(&state.rules, only, &mut out, &mut charge)?;
    crate::regressions::exposition(&state.regressions, only, &mut out, &mut charge)?;
    Ok(out)
}

/// The symbolizer's account (`[symbolizer]`): what it resolved, from where, and its cache.
fn symbolizer_metrics(out: &mut String, s: &frostdb_pprof::symbolize::SymbolizerStats) {
    for (name, kind, help, value) in [
        (
            "frostdb_symbolizer_resolved_locations_total",
            "counter",
            "Locations stored as addresses given names.",
            s.resolved,
        ),
        (
            "frostdb_symbolizer_files_read_total",
            "counter",
            "Debug files read (parsed) for names.",
            s.files_read,
        ),
        (
            "frostdb_symbolizer_files_checked_total",
            "counter",
            "Debug files walked by the DWARF check before their first read.",
            s.files_checked,
        ),
        (
            "frostdb_symbolizer_files_from_uploads_total",
            "counter",
            "Debug files taken from the tenants' uploads.",
            s.from_uploads,
        ),
        (
            "frostdb_symbolizer_files_from_debuginfod_total",
            "counter",
            "Files fetched from debuginfod servers.",
            s.from_debuginfod,
        ),
        (
            "frostdb_symbolizer_not_found_total",
            "counter",
            "Build ids nobody had (each once per miss TTL).",
            s.not_found,
        ),
        (
            "frostdb_symbolizer_failed_fetches_total",
            "counter",
            "Fetches that failed: timeouts, errors, files over the limit, wrong build ids.",
            s.failed_fetches,
        ),
        (
            "frostdb_symbolizer_cache_hits_total",
            "counter",
            "Debug files found in the on-disk cache.",
            s.cache.hits,
        ),
        (
            "frostdb_symbolizer_cache_evictions_total",
            "counter",
            "Debug files evicted from the cache to stay within cache_bytes.",
            s.cache.evictions,
        ),
        (
            "frostdb_symbolizer_cache_bytes",
            "gauge",
            "Bytes of debug files in the cache.",
            s.cache.bytes,
        ),
        (
            "frostdb_symbolizer_cache_files",
            "gauge",
            "Debug files in the cache.",
            s.cache.files,
        ),
    ] {
        single(out, name, kind, help, value);
    }
}

/// A family of one series without labels, and its value.
pub(crate) fn single(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A family with a series per tenant.
fn per_tenant<'a>(
    out: &mut String,
    (name, kind): (&str, &str),
    help: &str,
    values: impl Iterator<Item = (&'a String, u64)>,
) {
    family(out, name, kind, help);
    for (tenant, value) in values {
        let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {value}", escape(tenant));
    }
}

/// A label value as the exposition format writes it.
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
