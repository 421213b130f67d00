//! The shapes of the request messages this crate decodes (and of the messages within
//! them), written from the `.proto` files in `proto/`; a test checks each against the
//! compiled descriptors, field by field.

use std::mem::size_of;

use super::{Field, Kind, Limit, Per, RequestLimits, Shape};
use crate::api::querier::v1 as querier;
use crate::api::settings::v1 as settings;
use crate::api::types::v1 as types;
use crate::convert::otlp::proto as otlp;
use crate::convert::parca::proto as parca;
use crate::convert::push::proto as push;
use crate::debuginfo::proto as di;

/// A message a request can be: what [`super::decode_protobuf`] and
/// [`super::decode_json`] check before decoding it.
pub trait Bounded {
    /// The message's shape.
    fn shape() -> &'static Shape;
}

const I32: Kind = Kind::Varint(4);
const I64: Kind = Kind::Varint(8);
const BOOL: Kind = Kind::Varint(1);
const STR: Kind = Kind::String;

const fn f(number: u32, name: &'static str, json: &'static str, kind: Kind) -> Field {
    Field::new(number, name, json, kind)
}

const fn limit(what: &'static str, per: Per, max: fn(&RequestLimits) -> usize) -> Limit {
    Limit { what, per, max }
}

macro_rules! bounded {
    ($($ty:ty => $shape:ident,)*) => {
        $(impl Bounded for $ty {
            fn shape() -> &'static Shape {
                &$shape
            }
        })*
    };
}

// Pyroscope's push request.

static PUSH_SERIES: Limit = limit("series", Per::Request, |l| l.max_push_series);
static PUSH_LABELS: Limit = limit("series[].labels", Per::Parent, |l| l.max_labels_per_series);
static PUSH_SAMPLES: Limit = limit("series[].samples", Per::Parent, |l| {
    l.max_samples_per_series
});

pub(crate) static PUSH_REQUEST: Shape = Shape {
    name: "PushRequest",
    size: size_of::<push::PushRequest>(),
    fields: &[f(1, "series", "series", Kind::Message(&RAW_PROFILE_SERIES))
        .repeated()
        .limited(&PUSH_SERIES)],
    max_bytes: None,
};

static RAW_PROFILE_SERIES: Shape = Shape {
    name: "RawProfileSeries",
    size: size_of::<push::RawProfileSeries>(),
    fields: &[
        f(1, "labels", "labels", Kind::Message(&PUSH_LABEL_PAIR))
            .repeated()
            .limited(&PUSH_LABELS),
        f(2, "samples", "samples", Kind::Message(&RAW_SAMPLE))
            .repeated()
            .limited(&PUSH_SAMPLES),
    ],
    max_bytes: None,
};

static PUSH_LABEL_PAIR: Shape = Shape {
    name: "LabelPair",
    size: size_of::<push::LabelPair>(),
    fields: &[f(1, "name", "name", STR), f(2, "value", "value", STR)],
    max_bytes: None,
};

static RAW_SAMPLE: Shape = Shape {
    name: "RawSample",
    size: size_of::<push::RawSample>(),
    // The push JSON reader takes `ID` and `id` (proto3 JSON's name of `ID` is `ID`).
    fields: &[
        f(1, "raw_profile", "rawProfile", Kind::Bytes),
        f(2, "ID", "id", STR),
    ],
    max_bytes: None,
};

bounded! {
    push::PushRequest => PUSH_REQUEST,
}

// Parca Agent's profile store and debug info requests.

static PARCA_LABELS: Limit = limit("series[].labels.labels", Per::Parent, |l| {
    l.max_labels_per_series
});
static PARCA_EXECUTABLES: Limit = limit("series[].samples[].executable_info", Per::Parent, |l| {
    l.max_dictionary_entries
});

pub(crate) static PARCA_WRITE_RAW: Shape = Shape {
    name: "WriteRawRequest",
    size: size_of::<parca::WriteRawRequest>(),
    fields: &[
        f(1, "tenant", "tenant", STR),
        f(2, "series", "series", Kind::Message(&PARCA_SERIES))
            .repeated()
            .limited(&PUSH_SERIES),
        f(3, "normalized", "normalized", BOOL),
    ],
    max_bytes: None,
};

static PARCA_SERIES: Shape = Shape {
    name: "RawProfileSeries",
    size: size_of::<parca::RawProfileSeries>(),
    fields: &[
        f(1, "labels", "labels", Kind::Message(&PARCA_LABEL_SET)),
        f(2, "samples", "samples", Kind::Message(&PARCA_RAW_SAMPLE))
            .repeated()
            .limited(&PUSH_SAMPLES),
    ],
    max_bytes: None,
};

static PARCA_LABEL_SET: Shape = Shape {
    name: "LabelSet",
    size: size_of::<parca::LabelSet>(),
    fields: &[f(1, "labels", "labels", Kind::Message(&PARCA_LABEL))
        .repeated()
        .limited(&PARCA_LABELS)],
    max_bytes: None,
};

static PARCA_LABEL: Shape = Shape {
    name: "Label",
    size: size_of::<parca::Label>(),
    fields: &[f(1, "name", "name", STR), f(2, "value", "value", STR)],
    max_bytes: None,
};

static PARCA_RAW_SAMPLE: Shape = Shape {
    name: "RawSample",
    size: size_of::<parca::RawSample>(),
    fields: &[
        f(1, "raw_profile", "rawProfile", Kind::Bytes),
        f(
            2,
            "executable_info",
            "executableInfo",
            Kind::Message(&PARCA_EXECUTABLE_INFO),
        )
        .repeated()
        .limited(&PARCA_EXECUTABLES),
    ],
    max_bytes: None,
};

static PARCA_EXECUTABLE_INFO: Shape = Shape {
    name: "ExecutableInfo",
    size: size_of::<parca::ExecutableInfo>(),
    fields: &[
        f(1, "elf_type", "elfType", I32),
        f(
            2,
            "load_segment",
            "loadSegment",
            Kind::Message(&PARCA_LOAD_SEGMENT),
        ),
    ],
    max_bytes: None,
};

static PARCA_LOAD_SEGMENT: Shape = Shape {
    name: "LoadSegment",
    size: size_of::<parca::LoadSegment>(),
    fields: &[f(1, "offset", "offset", I64), f(2, "vaddr", "vaddr", I64)],
    max_bytes: None,
};

pub(crate) static PARCA_WRITE: Shape = Shape {
    name: "WriteRequest",
    size: size_of::<parca::WriteRequest>(),
    fields: &[f(1, "record", "record", Kind::Bytes)],
    max_bytes: None,
};

pub(crate) static PARCA_WRITE_ARROW: Shape = Shape {
    name: "WriteArrowRequest",
    size: size_of::<parca::WriteArrowRequest>(),
    fields: &[f(1, "ipc_buffer", "ipcBuffer", Kind::Bytes)],
    max_bytes: None,
};

pub(crate) static SHOULD_INITIATE_UPLOAD: Shape = Shape {
    name: "ShouldInitiateUploadRequest",
    size: size_of::<di::ShouldInitiateUploadRequest>(),
    fields: &[
        f(1, "build_id", "buildId", STR),
        f(2, "hash", "hash", STR),
        f(3, "force", "force", BOOL),
        f(4, "type", "type", I32),
        f(5, "build_id_type", "buildIdType", I32),
    ],
    max_bytes: None,
};

pub(crate) static INITIATE_UPLOAD: Shape = Shape {
    name: "InitiateUploadRequest",
    size: size_of::<di::InitiateUploadRequest>(),
    fields: &[
        f(1, "build_id", "buildId", STR),
        f(2, "size", "size", I64),
        f(3, "hash", "hash", STR),
        f(4, "force", "force", BOOL),
        f(5, "type", "type", I32),
        f(6, "build_id_type", "buildIdType", I32),
    ],
    max_bytes: None,
};

pub(crate) static MARK_UPLOAD_FINISHED: Shape = Shape {
    name: "MarkUploadFinishedRequest",
    size: size_of::<di::MarkUploadFinishedRequest>(),
    fields: &[
        f(1, "build_id", "buildId", STR),
        f(2, "upload_id", "uploadId", STR),
        f(3, "type", "type", I32),
    ],
    max_bytes: None,
};

pub(crate) static UPLOAD: Shape = Shape {
    name: "UploadRequest",
    size: size_of::<di::UploadRequest>(),
    fields: &[
        f(1, "info", "info", Kind::Message(&UPLOAD_INFO)),
        f(2, "chunk_data", "chunkData", Kind::Bytes),
    ],
    max_bytes: None,
};

static UPLOAD_INFO: Shape = Shape {
    name: "UploadInfo",
    size: size_of::<di::UploadInfo>(),
    fields: &[
        f(1, "build_id", "buildId", STR),
        f(2, "upload_id", "uploadId", STR),
        f(3, "type", "type", I32),
    ],
    max_bytes: None,
};

bounded! {
    parca::WriteRawRequest => PARCA_WRITE_RAW,
    parca::WriteRequest => PARCA_WRITE,
    parca::WriteArrowRequest => PARCA_WRITE_ARROW,
    di::ShouldInitiateUploadRequest => SHOULD_INITIATE_UPLOAD,
    di::InitiateUploadRequest => INITIATE_UPLOAD,
    di::MarkUploadFinishedRequest => MARK_UPLOAD_FINISHED,
    di::UploadRequest => UPLOAD,
}

// OTLP's export request.

static RESOURCE_PROFILES: Limit = limit("resource_profiles", Per::Request, |l| {
    l.max_resource_profiles
});
static SCOPE_PROFILES: Limit = limit("resource_profiles[].scope_profiles", Per::Request, |l| {
    l.max_scope_profiles
});
static PROFILES: Limit = limit(
    "resource_profiles[].scope_profiles[].profiles",
    Per::Request,
    |l| l.max_profiles,
);
static SAMPLES: Limit = limit(
    "resource_profiles[].scope_profiles[].profiles[].samples",
    Per::Request,
    |l| l.max_samples,
);
static MAPPING_TABLE: Limit = limit("dictionary.mapping_table", Per::Request, |l| {
    l.max_dictionary_entries
});
static LOCATION_TABLE: Limit = limit("dictionary.location_table", Per::Request, |l| {
    l.max_dictionary_entries
});
static FUNCTION_TABLE: Limit = limit("dictionary.function_table", Per::Request, |l| {
    l.max_dictionary_entries
});
static LINK_TABLE: Limit = limit("dictionary.link_table", Per::Request, |l| {
    l.max_dictionary_entries
});
static STRING_TABLE: Limit = limit("dictionary.string_table", Per::Request, |l| {
    l.max_dictionary_entries
});
static ATTRIBUTE_TABLE: Limit = limit("dictionary.attribute_table", Per::Request, |l| {
    l.max_dictionary_entries
});
static STACK_TABLE: Limit = limit("dictionary.stack_table", Per::Request, |l| {
    l.max_dictionary_entries
});

pub(crate) static EXPORT_REQUEST: Shape = Shape {
    name: "ExportProfilesServiceRequest",
    size: size_of::<otlp::ExportProfilesServiceRequest>(),
    fields: &[
        f(
            1,
            "resource_profiles",
            "resourceProfiles",
            Kind::Message(&OTLP_RESOURCE_PROFILES),
        )
        .repeated()
        .limited(&RESOURCE_PROFILES),
        f(2, "dictionary", "dictionary", Kind::Message(&DICTIONARY)),
    ],
    max_bytes: None,
};

static DICTIONARY: Shape = Shape {
    name: "ProfilesDictionary",
    size: size_of::<otlp::ProfilesDictionary>(),
    fields: &[
        f(1, "mapping_table", "mappingTable", Kind::Message(&MAPPING))
            .repeated()
            .limited(&MAPPING_TABLE),
        f(
            2,
            "location_table",
            "locationTable",
            Kind::Message(&LOCATION),
        )
        .repeated()
        .limited(&LOCATION_TABLE),
        f(
            3,
            "function_table",
            "functionTable",
            Kind::Message(&FUNCTION),
        )
        .repeated()
        .limited(&FUNCTION_TABLE),
        f(4, "link_table", "linkTable", Kind::Message(&LINK))
            .repeated()
            .limited(&LINK_TABLE),
        f(5, "string_table", "stringTable", STR)
            .repeated()
            .limited(&STRING_TABLE),
        f(
            6,
            "attribute_table",
            "attributeTable",
            Kind::Message(&KEY_VALUE_AND_UNIT),
        )
        .repeated()
        .limited(&ATTRIBUTE_TABLE),
        f(7, "stack_table", "stackTable", Kind::Message(&STACK))
            .repeated()
            .limited(&STACK_TABLE),
    ],
    max_bytes: None,
};

static OTLP_RESOURCE_PROFILES: Shape = Shape {
    name: "ResourceProfiles",
    size: size_of::<otlp::ResourceProfiles>(),
    fields: &[
        f(1, "resource", "resource", Kind::Message(&RESOURCE)),
        f(2, "scope_profiles", "scopeProfiles", Kind::Message(&SCOPE))
            .repeated()
            .limited(&SCOPE_PROFILES),
        f(3, "schema_url", "schemaUrl", STR),
    ],
    max_bytes: None,
};

static RESOURCE: Shape = Shape {
    name: "Resource",
    size: size_of::<otlp::Resource>(),
    fields: &[f(1, "attributes", "attributes", Kind::Message(&KEY_VALUE)).repeated()],
    max_bytes: None,
};

static SCOPE: Shape = Shape {
    name: "ScopeProfiles",
    size: size_of::<otlp::ScopeProfiles>(),
    fields: &[
        f(2, "profiles", "profiles", Kind::Message(&PROFILE))
            .repeated()
            .limited(&PROFILES),
        f(3, "schema_url", "schemaUrl", STR),
    ],
    max_bytes: None,
};

static PROFILE: Shape = Shape {
    name: "Profile",
    size: size_of::<otlp::Profile>(),
    fields: &[
        f(1, "sample_type", "sampleType", Kind::Message(&VALUE_TYPE)),
        f(2, "samples", "samples", Kind::Message(&SAMPLE))
            .repeated()
            .limited(&SAMPLES),
        f(3, "time_unix_nano", "timeUnixNano", Kind::Fixed64),
        f(4, "duration_nano", "durationNano", I64),
        f(5, "period_type", "periodType", Kind::Message(&VALUE_TYPE)),
        f(6, "period", "period", I64),
        f(7, "profile_id", "profileId", Kind::Bytes),
        f(8, "dropped_attributes_count", "droppedAttributesCount", I32),
        f(9, "original_payload_format", "originalPayloadFormat", STR),
        f(10, "original_payload", "originalPayload", Kind::Bytes),
        f(11, "attribute_indices", "attributeIndices", I32).repeated(),
    ],
    max_bytes: None,
};

static VALUE_TYPE: Shape = Shape {
    name: "ValueType",
    size: size_of::<otlp::ValueType>(),
    fields: &[
        f(1, "type_strindex", "typeStrindex", I32),
        f(2, "unit_strindex", "unitStrindex", I32),
    ],
    max_bytes: None,
};

pub(crate) static SAMPLE: Shape = Shape {
    name: "Sample",
    size: size_of::<otlp::Sample>(),
    fields: &[
        f(1, "stack_index", "stackIndex", I32),
        f(2, "attribute_indices", "attributeIndices", I32).repeated(),
        f(3, "link_index", "linkIndex", I32),
        f(4, "values", "values", I64).repeated(),
        f(
            5,
            "timestamps_unix_nano",
            "timestampsUnixNano",
            Kind::Fixed64,
        )
        .repeated(),
    ],
    max_bytes: None,
};

static STACK: Shape = Shape {
    name: "Stack",
    size: size_of::<otlp::Stack>(),
    fields: &[f(1, "location_indices", "locationIndices", I32).repeated()],
    max_bytes: None,
};

static MAPPING: Shape = Shape {
    name: "Mapping",
    size: size_of::<otlp::Mapping>(),
    fields: &[
        f(1, "memory_start", "memoryStart", I64),
        f(2, "memory_limit", "memoryLimit", I64),
        f(3, "file_offset", "fileOffset", I64),
        f(4, "filename_strindex", "filenameStrindex", I32),
        f(5, "attribute_indices", "attributeIndices", I32).repeated(),
    ],
    max_bytes: None,
};

static LOCATION: Shape = Shape {
    name: "Location",
    size: size_of::<otlp::Location>(),
    fields: &[
        f(1, "mapping_index", "mappingIndex", I32),
        f(2, "address", "address", I64),
        f(3, "lines", "lines", Kind::Message(&LINE)).repeated(),
        f(4, "attribute_indices", "attributeIndices", I32).repeated(),
    ],
    max_bytes: None,
};

static LINE: Shape = Shape {
    name: "Line",
    size: size_of::<otlp::Line>(),
    fields: &[
        f(1, "function_index", "functionIndex", I32),
        f(2, "line", "line", I64),
        f(3, "column", "column", I64),
    ],
    max_bytes: None,
};

static FUNCTION: Shape = Shape {
    name: "Function",
    size: size_of::<otlp::Function>(),
    fields: &[
        f(1, "name_strindex", "nameStrindex", I32),
        f(2, "system_name_strindex", "systemNameStrindex", I32),
        f(3, "filename_strindex", "filenameStrindex", I32),
        f(4, "start_line", "startLine", I64),
    ],
    max_bytes: None,
};

static LINK: Shape = Shape {
    name: "Link",
    size: size_of::<otlp::Link>(),
    fields: &[
        f(1, "trace_id", "traceId", Kind::Bytes),
        f(2, "span_id", "spanId", Kind::Bytes),
    ],
    max_bytes: None,
};

static KEY_VALUE_AND_UNIT: Shape = Shape {
    name: "KeyValueAndUnit",
    size: size_of::<otlp::KeyValueAndUnit>(),
    fields: &[
        f(1, "key_strindex", "keyStrindex", I32),
        f(2, "value", "value", Kind::Message(&ANY_VALUE)),
        f(3, "unit_strindex", "unitStrindex", I32),
    ],
    max_bytes: None,
};

static KEY_VALUE: Shape = Shape {
    name: "KeyValue",
    size: size_of::<otlp::KeyValue>(),
    fields: &[
        f(1, "key", "key", STR),
        f(2, "value", "value", Kind::Message(&ANY_VALUE)),
    ],
    max_bytes: None,
};

static ANY_VALUE: Shape = Shape {
    name: "AnyValue",
    size: size_of::<otlp::AnyValue>(),
    fields: &[
        f(1, "string_value", "stringValue", STR),
        f(2, "bool_value", "boolValue", BOOL),
        f(3, "int_value", "intValue", I64),
        f(4, "double_value", "doubleValue", Kind::Fixed64),
        f(7, "bytes_value", "bytesValue", Kind::Bytes),
    ],
    max_bytes: None,
};

bounded! {
    otlp::ExportProfilesServiceRequest => EXPORT_REQUEST,
}

// Grafana Pyroscope's query API.

static MATCHERS: Limit = limit("matchers", Per::Request, |l| l.max_matchers);
static SPAN_SELECTOR: Limit = limit("span_selector", Per::Request, |l| l.max_span_ids);
static PROFILE_ID_SELECTOR: Limit = limit("profile_id_selector", Per::Request, |l| l.max_span_ids);
static TRACE_ID_SELECTOR: Limit = limit("trace_id_selector", Per::Request, |l| l.max_span_ids);
static LABEL_NAMES: Limit = limit("label_names", Per::Request, |l| l.max_label_names);
static GROUP_BY: Limit = limit("group_by", Per::Request, |l| l.max_label_names);
static CALL_SITE: Limit = limit("stack_trace_selector.call_site", Per::Request, |l| {
    l.max_call_site
});

/// `start` and `end` at these numbers.
const fn range(start: u32, end: u32) -> [Field; 2] {
    [f(start, "start", "start", I64), f(end, "end", "end", I64)]
}

static PROFILE_TYPES_REQUEST: Shape = Shape {
    name: "ProfileTypesRequest",
    size: size_of::<querier::ProfileTypesRequest>(),
    fields: &range(1, 2),
    max_bytes: None,
};

static LABEL_VALUES_REQUEST: Shape = Shape {
    name: "LabelValuesRequest",
    size: size_of::<types::LabelValuesRequest>(),
    fields: &[
        f(1, "name", "name", STR),
        f(2, "matchers", "matchers", STR)
            .repeated()
            .limited(&MATCHERS),
        range(3, 4)[0],
        range(3, 4)[1],
    ],
    max_bytes: None,
};

static LABEL_NAMES_REQUEST: Shape = Shape {
    name: "LabelNamesRequest",
    size: size_of::<types::LabelNamesRequest>(),
    fields: &[
        f(1, "matchers", "matchers", STR)
            .repeated()
            .limited(&MATCHERS),
        range(2, 3)[0],
        range(2, 3)[1],
    ],
    max_bytes: None,
};

static SERIES_REQUEST: Shape = Shape {
    name: "SeriesRequest",
    size: size_of::<querier::SeriesRequest>(),
    fields: &[
        f(1, "matchers", "matchers", STR)
            .repeated()
            .limited(&MATCHERS),
        f(2, "label_names", "labelNames", STR)
            .repeated()
            .limited(&LABEL_NAMES),
        range(3, 4)[0],
        range(3, 4)[1],
    ],
    max_bytes: None,
};

static STACK_TRACE_SELECTOR: Shape = Shape {
    name: "StackTraceSelector",
    size: size_of::<types::StackTraceSelector>(),
    fields: &[
        f(
            1,
            "call_site",
            "callSite",
            Kind::Message(&CALL_SITE_LOCATION),
        )
        .repeated()
        .limited(&CALL_SITE),
        f(2, "go_pgo", "goPgo", Kind::Message(&GO_PGO)),
    ],
    max_bytes: None,
};

static CALL_SITE_LOCATION: Shape = Shape {
    name: "Location",
    size: size_of::<types::Location>(),
    fields: &[f(1, "name", "name", STR)],
    max_bytes: None,
};

static GO_PGO: Shape = Shape {
    name: "GoPGO",
    size: size_of::<types::GoPgo>(),
    fields: &[
        f(1, "keep_locations", "keepLocations", I32),
        f(2, "aggregate_callees", "aggregateCallees", BOOL),
    ],
    max_bytes: None,
};

static ASYNC_QUERY_REQUEST: Shape = Shape {
    name: "AsyncQueryRequest",
    size: size_of::<querier::AsyncQueryRequest>(),
    fields: &[
        f(1, "request_id", "requestId", STR),
        f(2, "type", "type", I32),
    ],
    max_bytes: None,
};

static SELECT_MERGE_STACKTRACES_REQUEST: Shape = Shape {
    name: "SelectMergeStacktracesRequest",
    size: size_of::<querier::SelectMergeStacktracesRequest>(),
    fields: &[
        f(1, "profile_typeID", "profileTypeID", STR),
        f(2, "label_selector", "labelSelector", STR),
        range(3, 4)[0],
        range(3, 4)[1],
        f(5, "max_nodes", "maxNodes", I64),
        f(6, "format", "format", I32),
        f(
            7,
            "stack_trace_selector",
            "stackTraceSelector",
            Kind::Message(&STACK_TRACE_SELECTOR),
        ),
        f(8, "profile_id_selector", "profileIdSelector", STR)
            .repeated()
            .limited(&PROFILE_ID_SELECTOR),
        f(9, "async", "async", Kind::Message(&ASYNC_QUERY_REQUEST)),
        f(10, "trace_id_selector", "traceIdSelector", STR)
            .repeated()
            .limited(&TRACE_ID_SELECTOR),
        f(11, "span_selector", "spanSelector", STR)
            .repeated()
            .limited(&SPAN_SELECTOR),
    ],
    max_bytes: None,
};

static SELECT_MERGE_SPAN_PROFILE_REQUEST: Shape = Shape {
    name: "SelectMergeSpanProfileRequest",
    size: size_of::<querier::SelectMergeSpanProfileRequest>(),
    fields: &[
        f(1, "profile_typeID", "profileTypeID", STR),
        f(2, "label_selector", "labelSelector", STR),
        f(3, "span_selector", "spanSelector", STR)
            .repeated()
            .limited(&SPAN_SELECTOR),
        range(4, 5)[0],
        range(4, 5)[1],
        f(6, "max_nodes", "maxNodes", I64),
        f(7, "format", "format", I32),
    ],
    max_bytes: None,
};

static SELECT_MERGE_PROFILE_REQUEST: Shape = Shape {
    name: "SelectMergeProfileRequest",
    size: size_of::<querier::SelectMergeProfileRequest>(),
    fields: &[
        f(1, "profile_typeID", "profileTypeID", STR),
        f(2, "label_selector", "labelSelector", STR),
        range(3, 4)[0],
        range(3, 4)[1],
        f(5, "max_nodes", "maxNodes", I64),
        f(
            6,
            "stack_trace_selector",
            "stackTraceSelector",
            Kind::Message(&STACK_TRACE_SELECTOR),
        ),
        f(7, "profile_id_selector", "profileIdSelector", STR)
            .repeated()
            .limited(&PROFILE_ID_SELECTOR),
        f(8, "trace_id_selector", "traceIdSelector", STR)
            .repeated()
            .limited(&TRACE_ID_SELECTOR),
    ],
    max_bytes: None,
};

static SELECT_SERIES_REQUEST: Shape = Shape {
    name: "SelectSeriesRequest",
    size: size_of::<querier::SelectSeriesRequest>(),
    fields: &[
        f(1, "profile_typeID", "profileTypeID", STR),
        f(2, "label_selector", "labelSelector", STR),
        range(3, 4)[0],
        range(3, 4)[1],
        f(5, "group_by", "groupBy", STR)
            .repeated()
            .limited(&GROUP_BY),
        f(6, "step", "step", Kind::Fixed64),
        f(7, "aggregation", "aggregation", I32),
        f(
            8,
            "stack_trace_selector",
            "stackTraceSelector",
            Kind::Message(&STACK_TRACE_SELECTOR),
        ),
        f(9, "limit", "limit", I64),
        f(10, "exemplar_type", "exemplarType", I32),
    ],
    max_bytes: None,
};

static SELECT_HEATMAP_REQUEST: Shape = Shape {
    name: "SelectHeatmapRequest",
    size: size_of::<querier::SelectHeatmapRequest>(),
    fields: &[
        f(1, "profile_typeID", "profileTypeID", STR),
        f(2, "label_selector", "labelSelector", STR),
        range(3, 4)[0],
        range(3, 4)[1],
        f(5, "step", "step", Kind::Fixed64),
        f(6, "group_by", "groupBy", STR)
            .repeated()
            .limited(&GROUP_BY),
        f(7, "query_type", "queryType", I32),
        f(8, "exemplar_type", "exemplarType", I32),
        f(9, "limit", "limit", I64),
    ],
    max_bytes: None,
};

static DIFF_REQUEST: Shape = Shape {
    name: "DiffRequest",
    size: size_of::<querier::DiffRequest>(),
    fields: &[
        f(
            1,
            "left",
            "left",
            Kind::Message(&SELECT_MERGE_STACKTRACES_REQUEST),
        ),
        f(
            2,
            "right",
            "right",
            Kind::Message(&SELECT_MERGE_STACKTRACES_REQUEST),
        ),
    ],
    max_bytes: None,
};

static GET_PROFILE_STATS_REQUEST: Shape = Shape {
    name: "GetProfileStatsRequest",
    size: size_of::<types::GetProfileStatsRequest>(),
    fields: &[],
    max_bytes: None,
};

static ANALYZE_QUERY_REQUEST: Shape = Shape {
    name: "AnalyzeQueryRequest",
    size: size_of::<querier::AnalyzeQueryRequest>(),
    fields: &[range(2, 3)[0], range(2, 3)[1], f(4, "query", "query", STR)],
    max_bytes: None,
};

bounded! {
    querier::ProfileTypesRequest => PROFILE_TYPES_REQUEST,
    types::LabelValuesRequest => LABEL_VALUES_REQUEST,
    types::LabelNamesRequest => LABEL_NAMES_REQUEST,
    querier::SeriesRequest => SERIES_REQUEST,
    querier::SelectMergeStacktracesRequest => SELECT_MERGE_STACKTRACES_REQUEST,
    querier::SelectMergeSpanProfileRequest => SELECT_MERGE_SPAN_PROFILE_REQUEST,
    querier::SelectMergeProfileRequest => SELECT_MERGE_PROFILE_REQUEST,
    querier::SelectSeriesRequest => SELECT_SERIES_REQUEST,
    querier::SelectHeatmapRequest => SELECT_HEATMAP_REQUEST,
    querier::DiffRequest => DIFF_REQUEST,
    types::GetProfileStatsRequest => GET_PROFILE_STATS_REQUEST,
    querier::AnalyzeQueryRequest => ANALYZE_QUERY_REQUEST,
}

// The settings service: its requests are small, and limited whole.

static SETTINGS_BYTES: Limit = limit("settings request bytes", Per::Request, |l| {
    l.max_settings_bytes
});

static GET_SETTINGS_REQUEST: Shape = Shape {
    name: "GetSettingsRequest",
    size: size_of::<settings::GetSettingsRequest>(),
    fields: &[],
    max_bytes: Some(&SETTINGS_BYTES),
};

static SET_SETTINGS_REQUEST: Shape = Shape {
    name: "SetSettingsRequest",
    size: size_of::<settings::SetSettingsRequest>(),
    fields: &[f(1, "setting", "setting", Kind::Message(&SETTING))],
    max_bytes: Some(&SETTINGS_BYTES),
};

static SETTING: Shape = Shape {
    name: "Setting",
    size: size_of::<settings::Setting>(),
    fields: &[
        f(1, "name", "name", STR),
        f(2, "value", "value", STR),
        f(3, "modifiedAt", "modifiedAt", I64),
    ],
    max_bytes: None,
};

static DELETE_SETTINGS_REQUEST: Shape = Shape {
    name: "DeleteSettingsRequest",
    size: size_of::<settings::DeleteSettingsRequest>(),
    fields: &[f(1, "name", "name", STR)],
    max_bytes: Some(&SETTINGS_BYTES),
};

bounded! {
    settings::GetSettingsRequest => GET_SETTINGS_REQUEST,
    settings::SetSettingsRequest => SET_SETTINGS_REQUEST,
    settings::DeleteSettingsRequest => DELETE_SETTINGS_REQUEST,
}

/// Every request shape, with the name of its message in the descriptors (for the test
/// that checks them against the `.proto` files).
#[cfg(test)]
pub(super) fn all() -> Vec<(&'static str, &'static Shape)> {
    vec![
        ("push.v1.PushRequest", &PUSH_REQUEST),
        (
            "parca.profilestore.v1alpha1.WriteRawRequest",
            &PARCA_WRITE_RAW,
        ),
        ("parca.profilestore.v1alpha1.WriteRequest", &PARCA_WRITE),
        (
            "parca.profilestore.v1alpha1.WriteArrowRequest",
            &PARCA_WRITE_ARROW,
        ),
        (
            "parca.debuginfo.v1alpha1.ShouldInitiateUploadRequest",
            &SHOULD_INITIATE_UPLOAD,
        ),
        (
            "parca.debuginfo.v1alpha1.InitiateUploadRequest",
            &INITIATE_UPLOAD,
        ),
        (
            "parca.debuginfo.v1alpha1.MarkUploadFinishedRequest",
            &MARK_UPLOAD_FINISHED,
        ),
        ("parca.debuginfo.v1alpha1.UploadRequest", &UPLOAD),
        (
            "otlp.profiles.ExportProfilesServiceRequest",
            &EXPORT_REQUEST,
        ),
        ("querier.v1.ProfileTypesRequest", &PROFILE_TYPES_REQUEST),
        ("types.v1.LabelValuesRequest", &LABEL_VALUES_REQUEST),
        ("types.v1.LabelNamesRequest", &LABEL_NAMES_REQUEST),
        ("querier.v1.SeriesRequest", &SERIES_REQUEST),
        (
            "querier.v1.SelectMergeStacktracesRequest",
            &SELECT_MERGE_STACKTRACES_REQUEST,
        ),
        (
            "querier.v1.SelectMergeSpanProfileRequest",
            &SELECT_MERGE_SPAN_PROFILE_REQUEST,
        ),
        (
            "querier.v1.SelectMergeProfileRequest",
            &SELECT_MERGE_PROFILE_REQUEST,
        ),
        ("querier.v1.SelectSeriesRequest", &SELECT_SERIES_REQUEST),
        ("querier.v1.SelectHeatmapRequest", &SELECT_HEATMAP_REQUEST),
        ("querier.v1.DiffRequest", &DIFF_REQUEST),
        (
            "types.v1.GetProfileStatsRequest",
            &GET_PROFILE_STATS_REQUEST,
        ),
        ("querier.v1.AnalyzeQueryRequest", &ANALYZE_QUERY_REQUEST),
        ("settings.v1.GetSettingsRequest", &GET_SETTINGS_REQUEST),
        ("settings.v1.SetSettingsRequest", &SET_SETTINGS_REQUEST),
        (
            "settings.v1.DeleteSettingsRequest",
            &DELETE_SETTINGS_REQUEST,
        ),
    ]
}
