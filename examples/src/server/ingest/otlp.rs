//! OpenTelemetry profiles (`POST /v1development/profiles`, protobuf
//! `ExportProfilesServiceRequest` of opentelemetry-proto profiles/v1development). Each OTLP
//! `Profile` becomes a pprof profile with its own compact string table; its series labels are
//! the resource's and the profile's string attributes (`service.name` → `service_name`,
//! falling back to `process.executable.name`). CPU samples counted at a period
//! (`samples`/`count`, period `cpu`/`nanoseconds`) are stored as `process_cpu` nanoseconds;
//! other sample types keep their names. Samples that carry only timestamps count one per
//! timestamp.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use frostdb_pprof::proto as pprof;
use prost::Message;

use super::{Incoming, body_bytes, content_type, store};
use crate::server::error::{ApiError, ApiResult};
use crate::server::{Shared, TenantId};

/// The generated OTLP profile messages.
#[allow(missing_docs, clippy::all, unreachable_pub)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/otlp.profiles.rs"));
}

use proto::any_value::Value;

/// `POST /v1development/profiles`.
pub async fn handle(
    State(state): State<Shared>,
    TenantId(tenant): TenantId,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let kind = content_type(&headers);
    if !matches!(
        kind.as_str(),
        "application/x-protobuf" | "application/protobuf" | "application/proto" | ""
    ) {
        return Err(ApiError::unsupported(format!(
            "Content-Type {kind:?}: OTLP profiles are accepted as application/x-protobuf"
        )));
    }
    let body = body_bytes(&state, &headers, &body)?;
    let request = proto::ExportProfilesServiceRequest::decode(body.as_slice())
        .map_err(|e| ApiError::bad_request(format!("ExportProfilesServiceRequest: {e}")))?;
    let incoming =
        convert(&request, &state.tenants.pprof_limits()).map_err(ApiError::bad_request)?;
    let profiles = incoming.len();
    for i in incoming {
        store(&state, &tenant, i).await?;
    }
    tracing::debug!(%tenant, profiles, "otlp export");
    Ok((
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        proto::ExportProfilesServiceResponse::default().encode_to_vec(),
    )
        .into_response())
}

/// Every profile of the request as a pprof profile with its series labels.
pub fn convert(
    request: &proto::ExportProfilesServiceRequest,
    limits: &frostdb_pprof::Limits,
) -> Result<Vec<Incoming>, String> {
    let empty = proto::ProfilesDictionary::default();
    let dict = request.dictionary.as_ref().unwrap_or(&empty);
    let string = |i: i32, what: &str| -> Result<&str, String> {
        dict.string_table
            .get(usize::try_from(i).map_err(|_| format!("{what}: negative string index {i}"))?)
            .map(String::as_str)
            .ok_or_else(|| {
                format!(
                    "{what}: string index {i} is out of range ({} strings)",
                    dict.string_table.len()
                )
            })
    };
    let mut out = Vec::new();
    let mut total_samples = 0usize;
    for (r, rp) in request.resource_profiles.iter().enumerate() {
        let mut labels: Vec<(String, String)> = Vec::new();
        if let Some(resource) = &rp.resource {
            for kv in &resource.attributes {
                if let Some(Value::StringValue(v)) =
                    kv.value.as_ref().and_then(|v| v.value.as_ref())
                {
                    labels.push((kv.key.replace('.', "_"), v.clone()));
                }
            }
        }
        if !labels.iter().any(|(k, _)| k == "service_name") {
            let exe = labels
                .iter()
                .find(|(k, _)| k == "process_executable_name")
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| "unknown_service".into());
            labels.push(("service_name".into(), exe));
        }
        for (s, sp) in rp.scope_profiles.iter().enumerate() {
            for (p, profile) in sp.profiles.iter().enumerate() {
                let at = format!("resource_profiles[{r}].scope_profiles[{s}].profiles[{p}]");
                total_samples += profile.samples.len();
                if total_samples > limits.max_samples {
                    return Err(format!(
                        "more than {} samples in one request",
                        limits.max_samples
                    ));
                }
                let mut series = labels.clone();
                for &a in &profile.attribute_indices {
                    if let Some((k, v)) = attribute(dict, a, &string)? {
                        series.push((k.replace('.', "_"), v));
                    }
                }
                let (name, pprof) =
                    to_pprof(dict, profile, &string).map_err(|e| format!("{at}: {e}"))?;
                let pprof =
                    frostdb_pprof::validate(pprof, limits).map_err(|e| format!("{at}: {e}"))?;
                out.push(Incoming {
                    profile: pprof,
                    previous: None,
                    name,
                    labels: series,
                    delta: false,
                    timestamp_ms: None,
                });
            }
        }
    }
    Ok(out)
}

type Strings<'a> = dyn Fn(i32, &str) -> Result<&'a str, String> + 'a;

/// A string-valued attribute of the dictionary's attribute table.
fn attribute<'a>(
    dict: &'a proto::ProfilesDictionary,
    index: i32,
    string: &Strings<'a>,
) -> Result<Option<(String, String)>, String> {
    let kv = dict
        .attribute_table
        .get(index as usize)
        .ok_or_else(|| format!("attribute index {index} is out of range"))?;
    let key = string(kv.key_strindex, "attribute key")?;
    Ok(match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(v)) if !key.is_empty() => Some((key.to_owned(), v.clone())),
        _ => None,
    })
}

/// A pprof string table built as strings are used.
#[derive(Default)]
struct Table {
    strings: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Table {
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

fn to_pprof<'a>(
    dict: &'a proto::ProfilesDictionary,
    profile: &proto::Profile,
    string: &Strings<'a>,
) -> Result<(String, pprof::Profile), String> {
    let mut t = Table::default();
    t.id("");
    let vt = |v: Option<&proto::ValueType>, what: &str| -> Result<(String, String), String> {
        match v {
            Some(v) => Ok((
                string(v.type_strindex, what)?.to_owned(),
                string(v.unit_strindex, what)?.to_owned(),
            )),
            None => Ok((String::new(), String::new())),
        }
    };
    let (sample_type, sample_unit) = vt(profile.sample_type.as_ref(), "sample_type")?;
    let (mut period_type, mut period_unit) = vt(profile.period_type.as_ref(), "period_type")?;
    // CPU samples counted at a period are CPU time.
    let cpu = sample_type == "samples" && period_type == "cpu" && profile.period > 0;
    let (name, sample_type, sample_unit, scale) = if cpu {
        (
            "process_cpu".to_owned(),
            "cpu".to_owned(),
            period_unit.clone(),
            profile.period,
        )
    } else {
        let name = if sample_type.is_empty() {
            "unknown".to_owned()
        } else {
            sample_type.clone()
        };
        (name, sample_type, sample_unit, 1)
    };
    if period_type.is_empty() {
        period_type = sample_type.clone();
        period_unit = sample_unit.clone();
    }

    let mut locations: HashMap<i32, u64> = HashMap::new();
    let mut functions: HashMap<i32, u64> = HashMap::new();
    let mut mappings: HashMap<i32, u64> = HashMap::new();
    let mut out = pprof::Profile {
        sample_type: vec![pprof::ValueType {
            r#type: t.id(&sample_type),
            unit: t.id(&sample_unit),
        }],
        period_type: Some(pprof::ValueType {
            r#type: t.id(&period_type),
            unit: t.id(&period_unit),
        }),
        period: if cpu {
            profile.period
        } else {
            profile.period.max(0)
        },
        time_nanos: profile.time_unix_nano as i64,
        duration_nanos: profile.duration_nano as i64,
        ..pprof::Profile::default()
    };
    for (i, sample) in profile.samples.iter().enumerate() {
        let stack = dict
            .stack_table
            .get(sample.stack_index as usize)
            .ok_or_else(|| {
                format!(
                    "samples[{i}]: stack index {} is out of range",
                    sample.stack_index
                )
            })?;
        let mut location_id = Vec::with_capacity(stack.location_indices.len());
        for &li in &stack.location_indices {
            if let Some(&id) = locations.get(&li) {
                location_id.push(id);
                continue;
            }
            let loc = dict
                .location_table
                .get(li as usize)
                .ok_or_else(|| format!("samples[{i}]: location index {li} is out of range"))?;
            let mapping_id = if loc.mapping_index > 0 {
                mapping(
                    dict,
                    loc.mapping_index,
                    &mut mappings,
                    &mut out,
                    &mut t,
                    string,
                )?
            } else {
                0
            };
            let mut lines = Vec::with_capacity(loc.lines.len());
            for line in &loc.lines {
                let function_id = match functions.get(&line.function_index) {
                    Some(&id) => id,
                    None => {
                        let f = dict
                            .function_table
                            .get(line.function_index as usize)
                            .ok_or_else(|| {
                                format!(
                                    "location {li}: function index {} is out of range",
                                    line.function_index
                                )
                            })?;
                        let id = out.function.len() as u64 + 1;
                        out.function.push(pprof::Function {
                            id,
                            name: t.id(string(f.name_strindex, "function name")?),
                            system_name: t
                                .id(string(f.system_name_strindex, "function system name")?),
                            filename: t.id(string(f.filename_strindex, "function file")?),
                            start_line: f.start_line,
                        });
                        functions.insert(line.function_index, id);
                        id
                    }
                };
                lines.push(pprof::Line {
                    function_id,
                    line: line.line,
                    column: line.column,
                });
            }
            let id = out.location.len() as u64 + 1;
            out.location.push(pprof::Location {
                id,
                mapping_id,
                address: loc.address,
                line: lines,
                is_folded: false,
            });
            locations.insert(li, id);
            location_id.push(id);
        }
        let count: i64 = if sample.values.is_empty() {
            sample.timestamps_unix_nano.len().max(1) as i64
        } else {
            sample.values.iter().fold(0i64, |a, v| a.saturating_add(*v))
        };
        let mut label = Vec::new();
        for &a in &sample.attribute_indices {
            if let Some((k, v)) = attribute(dict, a, string)? {
                label.push(pprof::Label {
                    key: t.id(&k.replace('.', "_")),
                    str: t.id(&v),
                    ..pprof::Label::default()
                });
            }
        }
        out.sample.push(pprof::Sample {
            location_id,
            value: vec![count.saturating_mul(scale)],
            label,
        });
    }
    out.string_table = t.strings;
    Ok((name, out))
}

fn mapping<'a>(
    dict: &'a proto::ProfilesDictionary,
    index: i32,
    mappings: &mut HashMap<i32, u64>,
    out: &mut pprof::Profile,
    t: &mut Table,
    string: &Strings<'a>,
) -> Result<u64, String> {
    if let Some(&id) = mappings.get(&index) {
        return Ok(id);
    }
    let m = dict
        .mapping_table
        .get(index as usize)
        .ok_or_else(|| format!("mapping index {index} is out of range"))?;
    let mut build_id = String::new();
    for &a in &m.attribute_indices {
        if let Some((k, v)) = attribute(dict, a, string)?
            && k.starts_with("process.executable.build_id")
            && build_id.is_empty()
        {
            build_id = v;
        }
    }
    let id = out.mapping.len() as u64 + 1;
    out.mapping.push(pprof::Mapping {
        id,
        memory_start: m.memory_start,
        memory_limit: m.memory_limit,
        file_offset: m.file_offset,
        filename: t.id(string(m.filename_strindex, "mapping file")?),
        build_id: t.id(&build_id),
        ..pprof::Mapping::default()
    });
    mappings.insert(index, id);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPORT: &str =
        "testdata/otlp/pyroscope__otel-ebpf-profile.ExportProfilesServiceRequest.pb";

    /// shared/ (`FROSTDB_SHARED`, else beside the repository, else /work/shared).
    fn shared() -> std::path::PathBuf {
        if let Ok(dir) = std::env::var("FROSTDB_SHARED") {
            return dir.into();
        }
        let beside = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared");
        if beside.exists() {
            return beside;
        }
        "/work/shared".into()
    }

    #[test]
    fn the_ebpf_profiler_export_converts_to_valid_pprof() {
        let path = shared().join(EXPORT);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let request = proto::ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap();
        let profiles = convert(&request, &frostdb_pprof::Limits::default()).unwrap();
        assert_eq!(profiles.len(), 82);
        for p in &profiles {
            assert!(
                p.labels
                    .iter()
                    .any(|(k, v)| k == "service_name" && !v.is_empty())
            );
        }
        let cpu: Vec<_> = profiles
            .iter()
            .filter(|p| p.name == "process_cpu")
            .collect();
        let off: Vec<_> = profiles.iter().filter(|p| p.name == "off_cpu").collect();
        assert_eq!((cpu.len(), off.len()), (5, 77));
        for p in cpu {
            // Counted samples at 20 Hz: every value is a whole number of 50 ms periods.
            assert!(
                p.profile
                    .sample
                    .iter()
                    .all(|s| s.value[0] % 50_000_000 == 0)
            );
        }
        let timestamps: usize = request
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .flat_map(|s| &s.profiles)
            .flat_map(|p| &p.samples)
            .map(|s| s.timestamps_unix_nano.len())
            .sum();
        assert_eq!(timestamps, 5321);
    }

    #[test]
    fn out_of_range_indices_are_errors_not_panics() {
        let mut request = proto::ExportProfilesServiceRequest {
            dictionary: Some(proto::ProfilesDictionary {
                string_table: vec![String::new()],
                ..Default::default()
            }),
            ..Default::default()
        };
        request.resource_profiles.push(proto::ResourceProfiles {
            scope_profiles: vec![proto::ScopeProfiles {
                profiles: vec![proto::Profile {
                    samples: vec![proto::Sample {
                        stack_index: 7,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
        let e = convert(
            &request,
            &frostdb_pprof::Limits {
                max_samples: 100,
                ..Default::default()
            },
        )
        .err()
        .unwrap();
        assert!(e.contains("stack index 7"), "{e}");
    }
}
