//! The querier's methods (`querier.v1.QuerierService`): each request read through the
//! tenant's store and mapped to Pyroscope's messages.

use super::*;
use crate::query::Held;

/// The call site of a stack trace selector, function names root first (none: every stack).
/// Go PGO's location truncation is not supported.
pub(super) fn call_site(s: Option<&types::StackTraceSelector>) -> ApiResult<Vec<&str>> {
    match s {
        Some(s) if s.go_pgo.is_some() => Err(unimplemented("stack_trace_selector.go_pgo")),
        Some(s) => {
            let names: Vec<&str> = s.call_site.iter().map(|l| l.name.as_str()).collect();
            list_bytes("stack_trace_selector.call_site", &names)?;
            Ok(names)
        }
        None => Ok(Vec::new()),
    }
}

/// Refuses a request's list of names (a call site, label names to keep or group by) of
/// more than [`Selector::MAX_BYTES`] in all: the decoder bounds how many there are, not how
/// long, and each is copied into the read that uses it.
pub(super) fn list_bytes<S: AsRef<str>>(what: &str, names: &[S]) -> ApiResult<()> {
    let bytes: usize = names.iter().map(|n| n.as_ref().len()).sum();
    if bytes > Selector::MAX_BYTES {
        return Err(ApiError::bad_request(format!(
            "{what}: {} names of {bytes} bytes in all, more than {} in one request",
            names.len(),
            Selector::MAX_BYTES
        )));
    }
    Ok(())
}

pub(super) fn unimplemented(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("not implemented: {what}"),
    )
}

/// Whether the client takes label names beyond Prometheus' `[a-zA-Z_][a-zA-Z0-9_]*`
/// (`Accept: …;allow-utf8-labelnames=true`, as profilecli sends).
pub(super) fn allows_utf8_names(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("allow-utf8-labelnames=true"))
}

/// Whether `name` is a Prometheus label name.
pub(super) fn is_legacy_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A range of Unix milliseconds as the API sends it: 0 leaves that end open.
pub(super) fn range(start: i64, end: i64) -> ApiResult<TimeRange> {
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
pub(super) fn typed(profile_type: &str, label_selector: &str) -> ApiResult<TypedSelector> {
    crate::query::parsing(&[label_selector], || {
        Selector::from_parts(profile_type, label_selector)
    })
    .map_err(|e| ApiError::from(e).context("label_selector"))?
    .typed()
    .ok_or_else(|| {
        ApiError::bad_request(
            "profile_typeID is required (name:sample_type:sample_unit:period_type:period_unit)",
        )
    })
}

/// Most regex matchers all the selectors of one request may compile together (each
/// selector may have [`Selector::MAX_REGEXES`]).
const MAX_REQUEST_REGEXES: usize = 64;

/// Selectors of the `matchers` of a request (any of them selects; none selects all). Their
/// regexes are bounded in all, each parsed selector counted before the next compiles.
pub(super) fn matchers(matchers: &[String]) -> ApiResult<Vec<Selector>> {
    if matchers.is_empty() {
        return Ok(vec![Selector::default()]);
    }
    // One request's selectors are bounded together as one selector is: each value of a
    // list becomes a string, all kept while the request's scans run.
    let bytes: usize = matchers.iter().map(String::len).sum();
    if bytes > Selector::MAX_BYTES {
        return Err(ApiError::bad_request(format!(
            "matchers: {} selectors of {bytes} bytes in all, more than {} in one request",
            matchers.len(),
            Selector::MAX_BYTES
        )));
    }
    let texts: Vec<&str> = matchers.iter().map(String::as_str).collect();
    crate::query::parsing(&texts, || parse_matchers(matchers))
}

/// [`matchers`], parsed here.
fn parse_matchers(matchers: &[String]) -> ApiResult<Vec<Selector>> {
    let mut regexes = 0;
    let mut selectors = Vec::with_capacity(matchers.len());
    for m in matchers {
        let s = Selector::from_parts("", m).map_err(|e| ApiError::from(e).context("matchers"))?;
        regexes += s.matchers.iter().filter(|m| m.compiles_regex()).count();
        if regexes > MAX_REQUEST_REGEXES {
            return Err(ApiError::bad_request(format!(
                "matchers: more than {MAX_REQUEST_REGEXES} regex matchers in one request (a list of values, a|b|c, is not one)"
            )));
        }
        selectors.push(s);
    }
    Ok(selectors)
}

/// `max_nodes` as sent: unset or 0 takes the default, negative is refused.
pub(super) fn max_nodes(max_nodes: Option<i64>) -> ApiResult<usize> {
    match max_nodes.unwrap_or(0) {
        0 => Ok(tree::DEFAULT_MAX_NODES),
        n if n < 0 => Err(ApiError::bad_request("max_nodes must not be negative")),
        n => Ok(n.min(MAX_NODES_CAP) as usize),
    }
}

/// One request's view of its tenant.
pub(super) struct Querier {
    pub(super) state: Shared,
    pub(super) tenant: String,
    pub(super) utf8_names: bool,
}

impl Querier {
    /// Runs `read` on the tenant's store off the async threads; `empty` for a tenant that
    /// stored nothing.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        empty: T,
        read: impl FnOnce(&frostdb_pprof::ProfileStore) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        crate::query::on_store(&self.state, &self.tenant, empty, read).await
    }

    /// `then` of the merge of `selector` in `range` (a report built from it), in the same
    /// job of the query lane; each series' profiles combined as `/api/v1/query` combines
    /// them unless told (gauges averaged, the rest summed).
    pub(super) async fn merge_then<T: Send + 'static>(
        &self,
        selector: TypedSelector,
        range: TimeRange,
        then: impl FnOnce(frostdb_pprof::Merged) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let aggregation = Aggregation::default_for(selector.profile_type());
        Ok(self
            .merge_held(selector, range, aggregation, then)
            .await?
            .value)
    }

    /// [`Self::merge_then`] with each series' profiles combined by `aggregation`, the
    /// report's reservation kept with what `then` made: for a value a later job of the
    /// request uses.
    pub(super) async fn merge_held<T: Send + 'static>(
        &self,
        selector: TypedSelector,
        range: TimeRange,
        aggregation: Aggregation,
        then: impl FnOnce(frostdb_pprof::Merged) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<Held<T>> {
        match self.state.tenants.for_read(&self.tenant).await? {
            Some(t) => {
                let options = frostdb_pprof::MergeOptions {
                    aggregation,
                    ..frostdb_pprof::MergeOptions::default()
                };
                crate::query::merge_held(&self.state, t, selector, range, options, then).await
            }
            None => Ok(Held::unreserved(then(frostdb_pprof::Merged::empty(
                selector.profile_type().clone(),
            ))?)),
        }
    }

    /// The diff of two typed selections as Pyroscope's levels, with the left and right
    /// totals, each side merged by `aggregation` and narrowed to its call site (none: the
    /// whole profiles): an error when their profile types differ.
    pub(super) async fn diff_levels(
        &self,
        (left, left_range, left_site): (TypedSelector, TimeRange, Vec<String>),
        (right, right_range, right_site): (TypedSelector, TimeRange, Vec<String>),
        max_nodes: usize,
        aggregation: Aggregation,
    ) -> ApiResult<Held<(Levels, i64, i64)>> {
        if left.profile_type != right.profile_type {
            return Err(ApiError::bad_request(
                "left and right must have the same profile type",
            ));
        }
        let narrowed = |site: Vec<String>| move |merged| Ok(tree::select_call_site(merged, &site));
        // The left side stays reserved while the right one merges.
        let l = self
            .merge_held(left, left_range, aggregation, narrowed(left_site))
            .await?;
        let r = self
            .merge_held(right, right_range, aggregation, narrowed(right_site))
            .await?;
        // The whole tree: Pyroscope's levels truncate it their way.
        crate::query::diff_then(&self.state, l, r, usize::MAX, move |diff| {
            let root = diff.root();
            (
                Levels::of_diff(&diff, max_nodes),
                root.base(),
                root.compare(),
            )
        })
        .await
    }

    pub(super) async fn profile_types(
        &self,
        r: querier::ProfileTypesRequest,
    ) -> ApiResult<querier::ProfileTypesResponse> {
        let range = range(r.start, r.end)?;
        let types = self
            .read(Vec::new(), move |store| {
                Ok(store.profile_types(range, ReadOptions::STRICT)?.value)
            })
            .await?;
        Ok(querier::ProfileTypesResponse {
            profile_types: types.iter().map(profile_type).collect(),
        })
    }

    pub(super) async fn label_names(
        &self,
        r: types::LabelNamesRequest,
    ) -> ApiResult<types::LabelNamesResponse> {
        let range = range(r.start, r.end)?;
        let selectors = matchers(&r.matchers)?;
        let mut names = self
            .read(Vec::new(), move |store| {
                let mut names = std::collections::BTreeSet::new();
                for s in &selectors {
                    names.extend(
                        store
                            .label_names(Some(s), range, ReadOptions::STRICT)?
                            .value,
                    );
                }
                if !store
                    .profile_types(range, ReadOptions::STRICT)?
                    .value
                    .is_empty()
                {
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

    pub(super) async fn label_values(
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
                            for series in store
                                .series(s, range, Some(&[]), ReadOptions::STRICT)?
                                .value
                            {
                                values.insert(part(&series.profile_type));
                            }
                        }
                        None => values.extend(
                            store
                                .label_values(&name, Some(s), range, ReadOptions::STRICT)?
                                .value,
                        ),
                    }
                }
                Ok(values.into_iter().collect::<Vec<_>>())
            })
            .await?;
        Ok(types::LabelValuesResponse { names })
    }

    pub(super) async fn series(
        &self,
        r: querier::SeriesRequest,
    ) -> ApiResult<querier::SeriesResponse> {
        let range = range(r.start, r.end)?;
        let selectors = matchers(&r.matchers)?;
        list_bytes("label_names", &r.label_names)?;
        let wanted = r.label_names;
        let utf8 = self.utf8_names;
        let budget = self.state.budget.clone();
        let (labels_set, bytes) = self
            .read((Vec::new(), 0), move |store| {
                let only: Option<Vec<String>> = (!wanted.is_empty()).then(|| wanted.clone());
                let mut sets = std::collections::BTreeSet::new();
                // The reads' reservations end with them: their labels, and their copies in
                // the answer, are held again (as `/api/v1/series` holds them).
                let mut held = budget.empty();
                let mut bytes = 0usize;
                for s in &selectors {
                    let series = store
                        .series(s, range, only.as_deref(), ReadOptions::STRICT)?
                        .value;
                    let read = crate::query::listed_label_bytes(&series);
                    held.try_grow(read.saturating_mul(2), "the listed series")
                        .map_err(ApiError::over_budget)?;
                    bytes = bytes.saturating_add(read);
                    for series in series {
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
                Ok((sets.into_iter().collect::<Vec<_>>(), bytes))
            })
            .await?;
        // Held with the request until its answer is encoded (which reserves the body).
        if let Some(memory) = crate::edge::request_memory() {
            memory.try_grow(bytes, "the listed series")?;
        }
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
    pub(super) fn merge_selector(
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

    pub(super) async fn select_merge_stacktraces(
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
        let budget = self.state.budget.clone();
        self.merge_then(selector, range, move |merged| {
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
                        profile: Some(pprof_of(&merged, &budget)?),
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

    pub(super) async fn select_merge_span_profile(
        &self,
        r: querier::SelectMergeSpanProfileRequest,
    ) -> ApiResult<querier::SelectMergeSpanProfileResponse> {
        // Its answer holds a flame graph or a tree: a pprof or a dot asked for was built
        // and dropped, and the answer empty, as if there were no data.
        use querier::ProfileFormat as F;
        if !matches!(
            F::try_from(r.format),
            Ok(F::Unspecified | F::Flamegraph | F::Tree)
        ) {
            return Err(ApiError::bad_request(format!(
                "format {}: a span profile is answered as FLAMEGRAPH or TREE",
                r.format
            )));
        }
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

    pub(super) async fn select_merge_profile(
        &self,
        r: querier::SelectMergeProfileRequest,
    ) -> ApiResult<google::Profile> {
        let call_site: Vec<String> = call_site(r.stack_trace_selector.as_ref())?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let selector = typed(&r.profile_type_id, &r.label_selector)?;
        let budget = self.state.budget.clone();
        self.merge_then(selector, range(r.start, r.end)?, move |merged| {
            pprof_of(&tree::select_call_site(merged, &call_site), &budget)
        })
        .await
    }

    pub(super) async fn select_series(
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
        list_bytes("group_by", &r.group_by)?;
        let group_by = r.group_by;
        // The read, the choice of series and the answer, all in the lane: the answer is
        // refused past the points `query_range` may answer (a step of 1 ms over months was
        // gigabytes, built on an async thread and charged to nothing).
        self.read(querier::SelectSeriesResponse::default(), move |store| {
            let group_by = (!group_by.is_empty()).then_some(group_by.as_slice());
            let mut series = store
                .range(&selector, range, step_ms, group_by, ReadOptions::STRICT)?
                .value;
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
            crate::query::within_points(&series, crate::query::MAX_RANGE_POINTS)?;
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
        })
        .await
    }

    pub(super) async fn diff(&self, r: querier::DiffRequest) -> ApiResult<querier::DiffResponse> {
        let side = |s: Option<querier::SelectMergeStacktracesRequest>, what: &str| {
            let s = s.ok_or_else(|| ApiError::bad_request(format!("{what} is required")))?;
            // Each side as its SelectMergeStacktraces reads it: narrowed to its call site,
            // refusing what that refuses (answered for the whole profiles, it was a diff of
            // what was not asked).
            let site: Vec<String> = call_site(s.stack_trace_selector.as_ref())
                .map_err(|e| e.context(what))?
                .into_iter()
                .map(str::to_owned)
                .collect();
            if !s.profile_id_selector.is_empty() || !s.trace_id_selector.is_empty() {
                return Err(
                    unimplemented("profile_id_selector and trace_id_selector").context(what)
                );
            }
            let selector =
                Self::merge_selector(&s.profile_type_id, &s.label_selector, &s.span_selector)
                    .map_err(|e| e.context(what))?;
            let range = range(s.start, s.end).map_err(|e| e.context(what))?;
            Ok::<_, ApiError>((selector, range, site, s.max_nodes))
        };
        let (left, left_range, left_site, left_nodes) = side(r.left, "left")?;
        let (right, right_range, right_site, _) = side(r.right, "right")?;
        // Each side merged as its SelectMergeStacktraces would be (a gauge averaged).
        let aggregation = Aggregation::default_for(left.profile_type());
        let (levels, left_ticks, right_ticks) = self
            .diff_levels(
                (left, left_range, left_site),
                (right, right_range, right_site),
                max_nodes(left_nodes)?,
                aggregation,
            )
            .await?
            .value;
        Ok(querier::DiffResponse {
            flamegraph: Some(levels.to_proto_diff(left_ticks, right_ticks)),
        })
    }

    pub(super) async fn get_profile_stats(
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

    pub(super) async fn analyze_query(
        &self,
        r: querier::AnalyzeQueryRequest,
    ) -> ApiResult<querier::AnalyzeQueryResponse> {
        let selector = crate::query::parsing(&[&r.query], || Selector::parse(&r.query))
            .map_err(|e| ApiError::from(e).context("query"))?;
        let range = range(r.start, r.end)?;
        let (series, blocks, bytes) = self
            .read((0, 0, 0), move |store| {
                let series = store
                    .series(&selector, range, Some(&[]), ReadOptions::STRICT)?
                    .value
                    .len() as u64;
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
pub(super) const PSEUDO_LABELS: &[&str] = &["__name__", frostdb_profile::PROFILE_TYPE_LABEL];

/// The part of a profile type a pseudo label stands for.
pub(super) fn pseudo_label(name: &str) -> Option<fn(&frostdb_profile::ProfileType) -> String> {
    match name {
        "__name__" => Some(|t| t.name.clone()),
        frostdb_profile::PROFILE_TYPE_LABEL => Some(|t| t.to_string()),
        _ => None,
    }
}

pub(super) fn profile_type(t: &frostdb_profile::ProfileType) -> types::ProfileType {
    types::ProfileType {
        id: t.to_string(),
        name: t.name.clone(),
        sample_type: t.sample_type.clone(),
        sample_unit: t.sample_unit.clone(),
        period_type: t.period_type.clone(),
        period_unit: t.period_unit.clone(),
    }
}

pub(super) fn label_pairs(labels: Vec<(String, String)>) -> Vec<types::LabelPair> {
    labels
        .into_iter()
        .map(|(name, value)| types::LabelPair { name, value })
        .collect()
}

/// The merged profile as `google.v1.Profile` (pprof's messages under Pyroscope's package).
/// What it holds is reserved from `budget` while it is built.
pub(super) fn pprof_of(
    merged: &frostdb_pprof::Merged,
    budget: &frostdb_core::MemoryBudget,
) -> ApiResult<google::Profile> {
    let _export = crate::query::reserve_export(budget, merged)?;
    Ok(frostdb_pprof::report::pprof::to_profile(merged)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The regexes of all the selectors of one request are bounded together, counted
    /// selector by selector before the next compiles; lists of values do not count.
    #[test]
    fn the_regexes_of_a_requests_selectors_are_bounded_in_all() {
        let selector = |i: usize| {
            let m: Vec<String> = (0..16).map(|j| format!("l{j}=~\"a.+{i}\"")).collect();
            format!("{{{}}}", m.join(","))
        };
        let four: Vec<String> = (0..4).map(selector).collect();
        assert_eq!(matchers(&four).unwrap().len(), 4);
        let five: Vec<String> = (0..5).map(selector).collect();
        let e = matchers(&five).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains("more than 64 regex matchers"),
            "{}",
            e.message
        );
        let lists: Vec<String> = (0..100).map(|i| format!("{{l=~\"a|b|{i}\"}}")).collect();
        assert_eq!(matchers(&lists).unwrap().len(), 100);
    }
}
