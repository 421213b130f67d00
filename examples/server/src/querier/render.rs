//! The legacy render API: `GET /pyroscope/render` and `/pyroscope/render-diff`, flamebearer
//! JSON with timelines.

use super::*;
use crate::query::Held;

/// A render parameter.
pub(super) fn param<'a>(params: &'a [(String, String)], names: &[&str]) -> Option<&'a str> {
    params
        .iter()
        .find(|(n, _)| names.contains(&n.as_str()))
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.trim().is_empty())
}

/// A render time: `now-1h` and the like, RFC 3339, or a Unix time in seconds (milliseconds
/// when it is that large).
pub(super) fn render_time(value: Option<&str>, what: &str, default: i64) -> ApiResult<i64> {
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
pub(super) fn render_query(
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
    let selector = crate::query::parsing(&[text], || Selector::from_parts("", text))
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
pub(super) fn render_max_nodes(params: &[(String, String)]) -> ApiResult<usize> {
    match param(params, &["max-nodes", "maxNodes"]) {
        None => Ok(tree::DEFAULT_MAX_NODES),
        Some(v) => max_nodes(Some(v.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!("max-nodes: {v:?} is not a number"))
        })?)),
    }
}

/// `GET /pyroscope/render`: the merged flame graph with its timeline (and one per value of
/// the first `groupBy` label), as flamebearer JSON.
pub(super) async fn render(
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
            // Rendered in the query lane, with the merge and its reservation.
            let body = q
                .merge_then(selector, range, move |merged| {
                    Ok(if merged.samples.is_empty() {
                        String::new()
                    } else {
                        dot::render(&merged, nodes)
                    })
                })
                .await?;
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
    // Built in the query lane, with the merge and its reservation, which the flame graph
    // keeps until its JSON is written (the request waits for the lane meanwhile).
    let Held {
        value: levels,
        reserved,
    } = q
        .merge_held(
            selector.clone(),
            range,
            Aggregation::default_for(selector.profile_type()),
            move |merged| Ok(Levels::of(&FlameGraph::build_truncated(&merged, max_nodes))),
        )
        .await?;
    let mut fb = Flamebearer::new(
        levels,
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
    // The timelines are built in the query lane with the read, within their cap, and the
    // answer is written there with them: a flame graph of up to 2^20 nodes is tens of
    // megabytes of JSON, no work for the async threads that take connections.
    let by = group_by.first().cloned();
    let empty = timelines(
        &[],
        range,
        step_s,
        average,
        by.as_deref(),
        MAX_TIMELINE_CELLS,
    )?;
    let body = q
        .read(None, move |store| {
            let _flame_graph = reserved;
            let group: Vec<String> = by.iter().cloned().collect();
            let series = store
                .range(
                    &selector,
                    range,
                    step_s * 1000,
                    Some(&group),
                    ReadOptions::STRICT,
                )?
                .value;
            (fb.timeline, fb.groups) = timelines(
                &series,
                range,
                step_s,
                average,
                by.as_deref(),
                MAX_TIMELINE_CELLS,
            )?;
            crate::query::json_bytes(&fb).map(Some)
        })
        .await?;
    let body = match body {
        Some(body) => body,
        // A tenant that stored nothing: no flame graph, and its timelines empty.
        None => {
            let mut fb = Flamebearer::new(
                Levels::default(),
                &profile_type.sample_type,
                &profile_type.sample_unit,
                None,
            );
            (fb.timeline, fb.groups) = empty;
            crate::query::json_bytes(&fb)?
        }
    };
    Ok(crate::query::json_response(body))
}

/// `fb` as a JSON response, written in the query lane: a flame graph of up to 2^20 nodes is
/// tens of megabytes of JSON, and no work for the async threads that take connections.
async fn json_in_the_lane(
    q: &Querier,
    fb: Flamebearer,
    reserved: Vec<frostdb_core::Reservation>,
) -> ApiResult<Response> {
    let body = q
        .state
        .work
        .queries
        .blocking(move |_| {
            let _flame_graph = reserved;
            crate::query::json_bytes(&fb)
        })
        .await?;
    Ok(crate::query::json_response(body))
}

/// Samples a render answer's timelines may hold over all its groups; more is refused
/// (400), naming the limit: a timeline has up to about 1,500 samples, and a `groupBy` label
/// of many values would make one each.
const MAX_TIMELINE_CELLS: usize = 1 << 22;

/// The flamebearer's timelines of `series` over `range` at `step_s`: the total of them all
/// and, with `group_by`, one per value of that label (`*` for series without it); without
/// one, with `average`, the first series' averaged (the total is that series then). Refused
/// when the groups' timelines would hold more than `max_cells` samples.
#[allow(clippy::type_complexity)]
fn timelines(
    series: &[frostdb_profile::native::Series],
    range: TimeRange,
    step_s: i64,
    average: bool,
    group_by: Option<&str>,
    max_cells: usize,
) -> ApiResult<(
    Option<Timeline>,
    Option<std::collections::BTreeMap<String, Timeline>>,
)> {
    let timeline = |s: &frostdb_profile::native::Series| {
        let points: Vec<(i64, f64)> = s.values(average).collect();
        Timeline::new(&points, range.start_ms, range.end_ms, step_s)
    };
    let total = || {
        let all: Vec<(i64, f64)> = series.iter().flat_map(|s| s.values(false)).collect();
        Timeline::new(&all, range.start_ms, range.end_ms, step_s)
    };
    let Some(label) = group_by else {
        // Averaged, the first series stands for the total (which is not built then).
        return Ok((
            if average {
                series.first().map(timeline)
            } else {
                Some(total())
            },
            None,
        ));
    };
    let total = total();
    let cells = series.len().saturating_mul(total.samples.len());
    if cells > max_cells {
        return Err(ApiError::bad_request(format!(
            "groupBy {label:?} has {} series over {} timeline samples each: {cells} samples, \
             over the limit of {max_cells}; group by a label of fewer values, or ask a shorter range",
            series.len(),
            total.samples.len()
        )));
    }
    let groups = series
        .iter()
        .map(|s| {
            let key = s
                .labels
                .iter()
                .find(|(n, _)| n == label)
                .map_or("*".to_owned(), |(_, v)| v.clone());
            (key, timeline(s))
        })
        .collect();
    Ok((Some(total), Some(groups)))
}

/// `GET /pyroscope/render-diff`: `leftQuery`/`leftFrom`/`leftUntil` against the `right…`
/// ones, as flamebearer JSON of format `double`; each side merged as `/api/v1/query` merges
/// it (gauges averaged) unless `aggregation=sum|average|latest` says otherwise, the header
/// `X-Frostdb-Aggregation` saying which.
pub(super) async fn render_diff(
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
    let whole = |(selector, range)| (selector, range, Vec::new());
    let Held {
        value: (levels, left_ticks, right_ticks),
        reserved,
    } = q
        .diff_levels(whole(left), whole(right), max_nodes, aggregation)
        .await?;
    let fb = Flamebearer::new(
        levels,
        &profile_type.sample_type,
        &profile_type.sample_unit,
        Some((left_ticks, right_ticks)),
    );
    let said = [(
        crate::query::AGGREGATION_HEADER,
        header::HeaderValue::from_static(aggregation.name()),
    )];
    Ok((said, json_in_the_lane(&q, fb, reserved).await?).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(pod: &str, points: &[(i64, i64)]) -> frostdb_profile::native::Series {
        frostdb_profile::native::Series {
            labels: vec![("pod".into(), pod.into())],
            points: points.to_vec(),
            rows: vec![1; points.len()],
        }
    }

    /// A render's timelines: the total, one per `groupBy` value; past their cap of samples
    /// over all groups, refused naming the limit rather than built.
    #[test]
    fn timelines_are_one_per_group_and_no_more_than_their_cap() {
        let range = TimeRange {
            start_ms: 0,
            end_ms: 60_000,
        };
        let all = [
            series("a", &[(0, 2), (15_000, 3)]),
            series("b", &[(30_000, 5)]),
        ];
        let (total, groups) = timelines(&all, range, 15, false, Some("pod"), 8).unwrap();
        assert_eq!(total.unwrap().samples, [2, 3, 5, 0]);
        let groups = groups.unwrap();
        assert_eq!(groups["a"].samples, [2, 3, 0, 0]);
        assert_eq!(groups["b"].samples, [0, 0, 5, 0]);
        // Two groups of four samples are 8: one less is refused, naming the limit.
        let e = timelines(&all, range, 15, false, Some("pod"), 7).unwrap_err();
        assert!(
            e.to_string().contains("8 samples, over the limit of 7"),
            "{e}"
        );
        // Without groupBy there is no cap to meet: one timeline.
        let (total, groups) = timelines(&all, range, 15, false, None, 0).unwrap();
        assert_eq!((total.unwrap().samples.len(), groups), (4, None));
    }
}
