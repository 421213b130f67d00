//! Pyroscope's Connect push API, `POST /push.v1.PusherService/Push`: binary protobuf
//! (`application/proto`) or proto JSON (`application/json`, `rawProfile` in base64), gzip
//! or not. Series labels carry `__name__` (the profile name) and `service_name`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use prost::Message;
use serde::Deserialize;

use super::{Incoming, body_bytes, content_type, store};
use crate::server::error::{ApiError, ApiResult};
use crate::server::{Shared, TenantId};

/// The generated push messages.
#[allow(missing_docs, clippy::all, unreachable_pub)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonRequest {
    #[serde(default)]
    series: Vec<JsonSeries>,
}

#[derive(Deserialize)]
struct JsonSeries {
    #[serde(default)]
    labels: Vec<JsonLabel>,
    #[serde(default)]
    samples: Vec<JsonSample>,
}

#[derive(Deserialize)]
struct JsonLabel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct JsonSample {
    #[serde(default, rename = "rawProfile", alias = "raw_profile")]
    raw_profile: String,
}

/// Decodes the request (either encoding) into push messages.
fn parse(kind: &str, body: &[u8]) -> ApiResult<proto::PushRequest> {
    match kind {
        "application/proto" | "application/protobuf" | "application/x-protobuf" | "" => {
            proto::PushRequest::decode(body)
                .map_err(|e| ApiError::bad_request(format!("PushRequest protobuf: {e}")))
        }
        "application/json" => {
            let json: JsonRequest = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("PushRequest JSON: {e}")))?;
            let mut request = proto::PushRequest::default();
            for (i, s) in json.series.into_iter().enumerate() {
                let mut series = proto::RawProfileSeries {
                    labels: s
                        .labels
                        .into_iter()
                        .map(|l| proto::LabelPair {
                            name: l.name,
                            value: l.value,
                        })
                        .collect(),
                    samples: Vec::new(),
                };
                for (j, sample) in s.samples.into_iter().enumerate() {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(sample.raw_profile.trim())
                        .map_err(|e| {
                            ApiError::bad_request(format!(
                                "series[{i}].samples[{j}].rawProfile is not base64: {e}"
                            ))
                        })?;
                    series.samples.push(proto::RawSample {
                        raw_profile: raw,
                        id: String::new(),
                    });
                }
                request.series.push(series);
            }
            Ok(request)
        }
        other => Err(ApiError::unsupported(format!(
            "Content-Type {other:?}: send application/proto or application/json"
        ))),
    }
}

/// `POST /push.v1.PusherService/Push`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = content_type(&headers);
    let body = body_bytes(&state, &headers, &body)?;
    let request = parse(&kind, &body)?;
    let limits = state.tenants.pprof_limits();
    let mut profiles = 0;
    for (i, series) in request.series.into_iter().enumerate() {
        let mut name = None;
        let mut delta = false;
        let mut labels = Vec::new();
        for l in series.labels {
            match l.name.as_str() {
                "__name__" => name = Some(l.value),
                "__delta__" => delta = l.value != "false",
                _ => labels.push((l.name, l.value)),
            }
        }
        let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
            ApiError::bad_request(format!(
                "series[{i}] has no __name__ label (the profile name, e.g. process_cpu)"
            ))
        })?;
        for (j, sample) in series.samples.into_iter().enumerate() {
            let context = || format!("series[{i}].samples[{j}] ({name})");
            let profile = frostdb_pprof::decode(&sample.raw_profile, &limits)
                .map_err(|e| ApiError::from(e).context(context()))?;
            store(
                &state,
                &tenant,
                Incoming {
                    profile,
                    previous: None,
                    name: name.clone(),
                    labels: labels.clone(),
                    delta,
                    timestamp_ms: None,
                },
            )
            .await
            .map_err(|e| e.context(context()))?;
            profiles += 1;
        }
    }
    tracing::debug!(%tenant, profiles, "push");
    Ok(if kind == "application/json" {
        ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
    } else {
        (
            [(header::CONTENT_TYPE, "application/proto")],
            proto::PushResponse::default().encode_to_vec(),
        )
            .into_response()
    })
}
