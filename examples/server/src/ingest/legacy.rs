//! Pyroscope's legacy `POST /ingest` (and `/pyroscope/ingest`): the query string names the
//! application and its labels (`name=app.cpu{env=prod}`), the time (`from`, `until`), the
//! body's `format`, `sampleRate`, `spyName`, `units` and `aggregationType`. Bodies: pprof
//! (raw or gzip), the multipart form with `profile` / `prev_profile` / `sample_type_config`,
//! folded stacks (the default), lines, Pyroscope's trie and tree, and speedscope files (a
//! profile per profile in the file, under `profile_name`), and JFR recordings as
//! `pyroscope-java` sends them (the raw recording, or a multipart form of a `jfr` part and
//! an optional `labels` part, each gzip or not).
//! The query string's meaning is [`frostdb_pprof::convert::legacy`]'s; this is the HTTP
//! around it. The body is read here and decoded in the ingest lane.

use std::collections::HashMap;

use crate::Query;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Request, State};
use frostdb_pprof::convert::legacy::Params;

use super::{Incoming, body_bytes, content_type, store};
use crate::edge::RequestMemory;
use crate::error::{ApiError, ApiResult};
use crate::{Shared, TenantId};

/// `POST /ingest`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    memory: RequestMemory,
    Query(query): Query<HashMap<String, String>>,
    request: Request,
) -> ApiResult<Json<serde_json::Value>> {
    let params = Params::parse(&query, crate::time::now_ms())?;
    let headers = request.headers().clone();
    let kind = content_type(&headers);
    let format = query.get("format").map(|f| f.to_ascii_lowercase());
    // Pyroscope's order: a trie or tree by format or content type first, then the formats
    // by name, then a multipart pprof form, else folded stacks.
    let body = match (format.as_deref(), kind.as_str()) {
        (Some("trie"), _) | (_, "binary/octet-stream+trie") => Body::Trie {
            bytes: read(&state, request).await?,
            tree: false,
        },
        (Some("tree"), _) | (_, "binary/octet-stream+tree") => Body::Trie {
            bytes: read(&state, request).await?,
            tree: true,
        },
        (Some("jfr"), "multipart/form-data") => {
            let form = Multipart::from_request(request, &state)
                .await
                .map_err(|e| ApiError::bad_request(format!("multipart form: {e}")))?;
            read_jfr_form(form).await?
        }
        (Some("jfr"), _) => Body::Jfr {
            recording: read(&state, request).await?,
            labels: None,
            raw: true,
        },
        (Some("speedscope"), _) => Body::Speedscope(read(&state, request).await?),
        (None | Some("pprof"), "multipart/form-data") => {
            let form = Multipart::from_request(request, &state)
                .await
                .map_err(|e| ApiError::bad_request(format!("multipart form: {e}")))?;
            read_form(form).await?
        }
        (Some("pprof"), _) => Body::Pprof(read(&state, request).await?),
        (None | Some("folded") | Some("groups") | Some("lines"), _) => Body::Folded {
            bytes: read(&state, request).await?,
            lines: format.as_deref() == Some("lines"),
        },
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "unknown format {other:?} (pprof, folded, lines, trie, tree, speedscope, jfr)"
            )));
        }
    };
    // The series labels stored, as the decoding made them (a JFR recording adds its event).
    let stored_labels = std::sync::Arc::new(std::sync::OnceLock::new());
    let labels_out = stored_labels.clone();
    let decoding = state.clone();
    let charged = memory.clone();
    let summaries = store(&state, &tenant, Some(charged), move || {
        let incoming = decode_body(&decoding, &params, &headers, &memory, body)?;
        if let Some(first) = incoming.first() {
            let _ = labels_out
                .set(frostdb_pprof::convert::series_labels(&first.labels).unwrap_or_default());
        }
        Ok(incoming)
    })
    .await?;
    let series = stored_labels.get().cloned().unwrap_or_default();

    let rows: usize = summaries.iter().map(|s| s.rows).sum();
    let duplicates = summaries.iter().filter(|s| s.duplicate).count();
    // Each type once, in the order stored.
    let mut profile_types: Vec<String> = Vec::new();
    for t in summaries.iter().flat_map(|s| &s.profile_types) {
        if !profile_types.contains(t) {
            profile_types.push(t.clone());
        }
    }
    let timestamp_ms = summaries.first().map(|s| s.timestamp_ms);
    // What was stored, so that a client (or a person with curl) sees it landed, and where.
    let labels: serde_json::Map<String, serde_json::Value> =
        series.into_iter().map(|(k, v)| (k, v.into())).collect();
    Ok(Json(serde_json::json!({
        "profiles": summaries.len() - duplicates,
        "duplicates": duplicates,
        "samples": rows,
        "profile_types": profile_types,
        "series_labels": labels,
        "timestamp_ms": timestamp_ms,
    })))
}

/// The request's profiles, decoded (in the ingest lane) from its body.
fn decode_body(
    decoding: &Shared,
    params: &Params,
    headers: &axum::http::HeaderMap,
    memory: &RequestMemory,
    body: Body,
) -> ApiResult<Vec<Incoming>> {
    let limits = decoding.tenants.pprof_limits();
    let pprof = |bytes: &[u8], what: &str| {
        frostdb_pprof::decode(bytes, &limits).map_err(|e| ApiError::from(e).context(what))
    };
    let incoming = match body {
        Body::Pprof(bytes) => {
            let bytes = body_bytes(decoding, headers, bytes, memory)?;
            params.pprof(pprof(&bytes, "pprof body")?, None)
        }
        Body::Form {
            profile,
            previous,
            kind,
        } => {
            let previous = previous
                .map(|p| pprof(&p, "multipart part \"prev_profile\""))
                .transpose()?;
            let params = Params {
                kind: params.kind.clone().or(kind),
                ..params.clone()
            };
            params.pprof(pprof(&profile, "multipart part \"profile\"")?, previous)
        }
        Body::Folded { bytes, lines } => {
            let bytes = body_bytes(decoding, headers, bytes, memory)?;
            let text = std::str::from_utf8(&bytes)
                .map_err(|e| ApiError::bad_request(format!("the folded body is not UTF-8: {e}")))?;
            params
                .folded(text, lines, &limits)
                .map_err(|e| ApiError::from(e).context("folded body"))?
        }
        Body::Trie { bytes, tree } => {
            let bytes = body_bytes(decoding, headers, bytes, memory)?;
            let what = if tree { "tree body" } else { "trie body" };
            params
                .trie(&bytes, tree, &limits)
                .map_err(|e| ApiError::from(e).context(what))?
        }
        Body::Speedscope(bytes) => {
            let bytes = body_bytes(decoding, headers, bytes, memory)?;
            return params
                .speedscope(&bytes, &limits)
                .map_err(|e| ApiError::from(e).context("speedscope body"));
        }
        Body::Jfr {
            recording,
            labels,
            raw,
        } => {
            // A raw body may come with a Content-Encoding; a form's parts are gzip or
            // not by their bytes (the converter looks).
            let recording = if raw {
                body_bytes(decoding, headers, recording, memory)?
            } else {
                recording
            };
            return params
                .jfr(&recording, labels.as_deref(), &limits)
                .map_err(|e| ApiError::from(e).context("JFR recording"));
        }
    };
    Ok(vec![incoming])
}

/// A request body as it arrived, decoded in the ingest lane.
enum Body {
    /// pprof, raw or gzip (`Content-Encoding` or the bytes themselves).
    Pprof(Bytes),
    /// The multipart form's `profile` and `prev_profile` parts, and the profile name its
    /// `sample_type_config` gives (see [`form_kind`]).
    Form {
        profile: Bytes,
        previous: Option<Bytes>,
        kind: Option<String>,
    },
    /// Folded stacks, or with `lines` one stack per line.
    Folded { bytes: Bytes, lines: bool },
    /// Pyroscope's transport trie or, with `tree`, its tree.
    Trie { bytes: Bytes, tree: bool },
    /// A speedscope file.
    Speedscope(Bytes),
    /// A JFR recording and its labels part; `raw` when it is the whole body.
    Jfr {
        recording: Bytes,
        labels: Option<Bytes>,
        raw: bool,
    },
}

async fn read(state: &Shared, request: Request) -> ApiResult<Bytes> {
    Bytes::from_request(request, state)
        .await
        .map_err(|e| ApiError::new(e.status(), format!("request body: {}", e.body_text())))
}

/// Most parts of a push's multipart form: Pyroscope's clients send three at most
/// (`profile`, `prev_profile`, `sample_type_config`), pyroscope-java two (`jfr`, `labels`).
pub const MAX_FORM_PARTS: usize = 16;

/// The multipart form's parts, by name, in order: at most [`MAX_FORM_PARTS`] (a body of
/// 16 MiB held a million empty parts, each kept, uncharged, and parsed on an async thread).
async fn form_parts(mut form: Multipart) -> ApiResult<Vec<(String, Bytes)>> {
    let mut parts = Vec::new();
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| ApiError::bad_request(format!("multipart form: {e}")))?
    {
        if parts.len() == MAX_FORM_PARTS {
            return Err(ApiError::too_large(format!(
                "the multipart form has more than {MAX_FORM_PARTS} parts"
            )));
        }
        let name = field.name().unwrap_or("").to_owned();
        let bytes = field
            .bytes()
            .await
            .map_err(|e| ApiError::bad_request(format!("multipart part {name:?}: {e}")))?;
        parts.push((name, bytes));
    }
    Ok(parts)
}

/// Most bytes of a form's `sample_type_config` part: a map of a few sample types (Pyroscope's
/// clients send a few hundred bytes).
const MAX_SAMPLE_TYPE_CONFIG_BYTES: usize = 64 << 10;

/// The profile name a form's `sample_type_config` gives by its display names, as Pyroscope
/// names it (`block_count` and `block_duration`, `mutex_count` and `mutex_duration`): Go's
/// block and mutex profiles have the same sample types, and pyroscope-go sends both under
/// one application name; only these tell them apart (both were stored as `mutex`). Read
/// without building the document: only display names are kept.
fn form_kind(config: &[u8]) -> ApiResult<Option<String>> {
    let SampleTypes(names) = serde_json::from_slice(config).map_err(|e| {
        ApiError::bad_request(format!("sample_type_config is not a JSON object: {e}"))
    })?;
    Ok(names.iter().find_map(|name| {
        ["block", "mutex"]
            .into_iter()
            .find(|kind| {
                name.strip_prefix(kind)
                    .is_some_and(|rest| rest.starts_with('_'))
            })
            .map(str::to_owned)
    }))
}

/// The display names of a `sample_type_config` object's members.
struct SampleTypes(Vec<String>);

/// A member's display name (`display-name`), if it is an object that has one.
struct DisplayName(Option<String>);

impl<'de> serde::Deserialize<'de> for SampleTypes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = SampleTypes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SampleTypes, A::Error> {
                let mut names = Vec::new();
                while let Some((serde::de::IgnoredAny, DisplayName(name))) = map.next_entry()? {
                    names.extend(name);
                }
                Ok(SampleTypes(names))
            }
        }
        d.deserialize_map(Members)
    }
}

impl<'de> serde::Deserialize<'de> for DisplayName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Any;
        impl<'de> serde::de::Visitor<'de> for Any {
            type Value = DisplayName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<DisplayName, A::Error> {
                let mut name = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "display-name" {
                        name = map.next_value::<Option<String>>()?;
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(DisplayName(name))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<DisplayName, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(DisplayName(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<DisplayName, E> {
                Ok(DisplayName(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<DisplayName, E> {
                Ok(DisplayName(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<DisplayName, E> {
                Ok(DisplayName(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<DisplayName, E> {
                Ok(DisplayName(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<DisplayName, E> {
                Ok(DisplayName(None))
            }
            fn visit_unit<E>(self) -> Result<DisplayName, E> {
                Ok(DisplayName(None))
            }
        }
        d.deserialize_any(Any)
    }
}

/// The multipart form's parts (of `sample_type_config`, only the profile name its display
/// names give: sample types keep their pprof names and units).
async fn read_form(form: Multipart) -> ApiResult<Body> {
    let (mut profile, mut previous, mut kind) = (None, None, None);
    for (name, bytes) in form_parts(form).await? {
        match name.as_str() {
            "profile" => profile = Some(bytes),
            "prev_profile" => previous = Some(bytes),
            "sample_type_config" => {
                if bytes.len() > MAX_SAMPLE_TYPE_CONFIG_BYTES {
                    return Err(ApiError::too_large(format!(
                        "the sample_type_config part has {} bytes, over the limit of \
                         {MAX_SAMPLE_TYPE_CONFIG_BYTES}",
                        bytes.len()
                    )));
                }
                kind = form_kind(&bytes)?;
            }
            other => {
                tracing::debug!(part = other, "ignoring an unknown multipart part");
            }
        }
    }
    let profile = profile
        .ok_or_else(|| ApiError::bad_request("the multipart form has no \"profile\" part"))?;
    Ok(Body::Form {
        profile,
        previous,
        kind,
    })
}

/// `pyroscope-java`'s form: the recording in part `jfr`, its context labels in `labels`.
async fn read_jfr_form(form: Multipart) -> ApiResult<Body> {
    let (mut recording, mut labels) = (None, None);
    for (name, bytes) in form_parts(form).await? {
        match name.as_str() {
            "jfr" => recording = Some(bytes),
            "labels" => labels = Some(bytes),
            other => tracing::debug!(part = other, "ignoring an unknown multipart part"),
        }
    }
    let recording =
        recording.ok_or_else(|| ApiError::bad_request("the multipart form has no \"jfr\" part"))?;
    Ok(Body::Jfr {
        recording,
        labels,
        raw: false,
    })
}
