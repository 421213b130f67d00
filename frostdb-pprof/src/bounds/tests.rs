//! The scans on hand-made bytes: nesting, packed and unpacked fields, unknown fields,
//! malformed input, each limit at and just over its value; and the shapes against the
//! compiled `.proto` descriptors.

use std::mem::size_of;

use frostdb_core::ErrorKind;
use prost::Message;

use super::*;
use crate::api::querier::v1 as querier;
use crate::api::settings::v1 as settings;
use crate::api::types::v1 as types;
use crate::convert::otlp::proto as otlp;
use crate::convert::push::proto as push;

fn label(name: &str, value: &str) -> push::LabelPair {
    push::LabelPair {
        name: name.into(),
        value: value.into(),
    }
}

/// A push request of `series` series of `labels` empty labels each.
fn push_request(series: usize, labels: usize) -> push::PushRequest {
    push::PushRequest {
        series: vec![
            push::RawProfileSeries {
                labels: vec![push::LabelPair::default(); labels],
                samples: Vec::new(),
            };
            series
        ],
    }
}

fn scan_push(bytes: &[u8], limits: &RequestLimits) -> Result<Scanned> {
    check_protobuf("push", &shapes::PUSH_REQUEST, bytes, limits)
}

/// The error's limit, when it is over one: what and how much.
fn over(e: &Error) -> Option<(&'static str, usize)> {
    match e {
        Error::TooLarge { what, limit } => Some((what, *limit)),
        _ => None,
    }
}

/// Where and why a malformed input was refused.
fn malformed(e: Error) -> (String, String) {
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    match e {
        Error::Convert { at, reason, .. } => (at, reason),
        other => panic!("not Convert: {other:?}"),
    }
}

#[test]
fn a_nested_request_is_estimated_by_its_elements_and_text() {
    let request = push::PushRequest {
        series: vec![
            push::RawProfileSeries {
                labels: vec![label("__name__", "process_cpu"), label("pod", "a")],
                samples: vec![push::RawSample {
                    raw_profile: vec![7; 100],
                    id: "id".into(),
                }],
            },
            push::RawProfileSeries {
                labels: vec![label("__name__", "memory")],
                samples: Vec::new(),
            },
        ],
    };
    let bytes = request.encode_to_vec();
    let scanned = scan_push(&bytes, &RequestLimits::default()).unwrap();
    let text = "__name__process_cpupoda__name__memory".len() + 100 + "id".len();
    assert_eq!(
        scanned.decoded_bytes,
        size_of::<push::PushRequest>()
            + 2 * size_of::<push::RawProfileSeries>()
            + 3 * size_of::<push::LabelPair>()
            + size_of::<push::RawSample>()
            + text
    );
    let decoded: push::PushRequest =
        decode_protobuf("push", &bytes, &RequestLimits::default()).unwrap();
    assert_eq!(decoded, request);
}

#[test]
fn packed_and_unpacked_repeated_scalars_count_alike() {
    let sample = otlp::Sample {
        values: vec![1, 300, -1],
        timestamps_unix_nano: vec![5, 6],
        attribute_indices: vec![1, 2, 3, 4],
        ..Default::default()
    };
    let packed = sample.encode_to_vec();
    // The same values one field each (unpacked, as proto2 writers send them).
    let mut unpacked = Vec::new();
    for v in &sample.values {
        prost::encoding::int64::encode(4, v, &mut unpacked);
    }
    for t in &sample.timestamps_unix_nano {
        prost::encoding::fixed64::encode(5, t, &mut unpacked);
    }
    for a in &sample.attribute_indices {
        prost::encoding::int32::encode(2, a, &mut unpacked);
    }
    let limits = RequestLimits::default();
    let a = check_protobuf("OTLP", &shapes::SAMPLE, &packed, &limits).unwrap();
    let b = check_protobuf("OTLP", &shapes::SAMPLE, &unpacked, &limits).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a.decoded_bytes,
        size_of::<otlp::Sample>() + 3 * 8 + 2 * 8 + 4 * 4
    );
    assert_eq!(otlp::Sample::decode(unpacked.as_slice()).unwrap(), sample);
}

#[test]
fn unknown_fields_of_every_wire_type_are_skipped_uncounted() {
    let known = push_request(1, 2).encode_to_vec();
    let mut bytes = known.clone();
    // Field 9: a varint, 8 bytes, a million bytes of payload, 4 bytes.
    bytes.extend([9 << 3, 0x96, 0x01]);
    bytes.extend([(9 << 3) | 1, 1, 2, 3, 4, 5, 6, 7, 8]);
    bytes.extend([(9 << 3) | 2, 0x80, 0x89, 0x7a]);
    bytes.extend(vec![0u8; 2_000_000]);
    bytes.extend([(9 << 3) | 5, 1, 2, 3, 4]);
    let limits = RequestLimits::default();
    assert_eq!(
        scan_push(&bytes, &limits).unwrap(),
        scan_push(&known, &limits).unwrap()
    );
    let decoded: push::PushRequest = decode_protobuf("push", &bytes, &limits).unwrap();
    assert_eq!(decoded, push_request(1, 2));
}

#[test]
fn wrong_wire_types_are_refused_naming_the_field() {
    let limits = RequestLimits::default();
    // `series` (a message) as a varint.
    let (at, reason) = malformed(scan_push(&[0x08, 1], &limits).unwrap_err());
    assert_eq!(at, "series");
    assert!(
        reason.contains("field 1 is a varint, which a message cannot be"),
        "{reason}"
    );
    // `series[0].labels[0].name` (a string) as four fixed bytes.
    let bytes = [0x0a, 7, 0x0a, 5, 0x0d, 1, 2, 3, 4];
    let (at, reason) = malformed(scan_push(&bytes, &limits).unwrap_err());
    assert_eq!(at, "series[0].labels[0].name");
    assert!(
        reason.starts_with("not a PushRequest protobuf: field 1 is a fixed 32-bit"),
        "{reason}"
    );
    // A packed fixed64 field whose length is no multiple of 8.
    let bytes = [0x2a, 3, 1, 2, 3];
    let e = check_protobuf("OTLP", &shapes::SAMPLE, &bytes, &limits).unwrap_err();
    assert_eq!(malformed(e).0, "timestamps_unix_nano");
    // A singular scalar sent packed.
    let e = check_protobuf("OTLP", &shapes::SAMPLE, &[0x0a, 1, 1], &limits).unwrap_err();
    assert!(malformed(e).1.contains("field 1 is length-delimited"));
    // Groups, and wire types that do not exist.
    for bytes in [&[0x0b, 0x0c][..], &[0x0e, 0], &[0x0f, 0]] {
        let (at, _) = malformed(scan_push(bytes, &limits).unwrap_err());
        assert_eq!(at, "series");
    }
    // Field number 0.
    assert_eq!(
        malformed(scan_push(&[0x00, 0], &limits).unwrap_err()).0,
        "body"
    );
}

#[test]
fn truncated_varints_are_refused() {
    let limits = RequestLimits::default();
    for bytes in [
        // A key cut short, at the top and within a label.
        &[0x8a][..],
        &[0x0a, 3, 0x0a, 1, 0x8a],
        // A length cut short.
        &[0x0a, 0x80],
        // A varint value cut short, of an unknown field.
        &[0x48, 0xff, 0xff],
    ] {
        let (_, reason) = malformed(scan_push(bytes, &limits).unwrap_err());
        assert!(
            reason.contains("ends inside a varint"),
            "{bytes:?}: {reason}"
        );
    }
    // Eleven bytes, and ten that overflow 64 bits.
    let mut long = vec![0x48];
    long.extend([0xff; 10]);
    long.push(0);
    assert!(
        malformed(scan_push(&long, &limits).unwrap_err())
            .1
            .contains("longer than 10")
    );
    let mut overflow = vec![0x48];
    overflow.extend([0xff; 9]);
    overflow.push(0x02);
    assert!(
        malformed(scan_push(&overflow, &limits).unwrap_err())
            .1
            .contains("overflows")
    );
    // A packed varint field ending inside a varint.
    let e = check_protobuf("OTLP", &shapes::SAMPLE, &[0x22, 2, 1, 0x80], &limits).unwrap_err();
    assert!(malformed(e).1.contains("ends inside a varint"));
}

#[test]
fn lengths_past_their_message_are_refused() {
    let limits = RequestLimits::default();
    // More than the body has, and the largest length a varint holds.
    let (at, reason) = malformed(scan_push(&[0x0a, 5, 0, 0], &limits).unwrap_err());
    assert_eq!(at, "series");
    assert!(
        reason.contains("needs 5 bytes, its message has 2 left"),
        "{reason}"
    );
    let mut huge = vec![0x0a];
    huge.extend([0xff; 9]);
    huge.push(0x01);
    assert!(
        malformed(scan_push(&huge, &limits).unwrap_err())
            .1
            .contains("needs")
    );
    // A label longer than its series, though the body has the bytes.
    let bytes = [0x0a, 2, 0x0a, 4, 0x0a, 0, 0x0a, 0];
    let (at, _) = malformed(scan_push(&bytes, &limits).unwrap_err());
    assert_eq!(at, "series[0].labels");
    // A fixed64 field cut short.
    let e = check_protobuf("OTLP", &shapes::SAMPLE, &[0x29, 1, 2, 3], &limits).unwrap_err();
    assert!(malformed(e).1.contains("needs 8 bytes"));
}

/// A message holding itself, which no request has, for the nesting limit.
static NODE: Shape = Shape {
    name: "Node",
    size: 24,
    fields: &[Field::new(1, "child", "child", Kind::Message(&NODE)).repeated()],
    max_bytes: None,
};

/// `levels` nodes each inside the one before.
fn nested(levels: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 1..levels {
        let mut outer = vec![0x0a];
        prost::encoding::encode_varint(bytes.len() as u64, &mut outer);
        outer.extend(bytes);
        bytes = outer;
    }
    bytes
}

#[test]
fn nesting_deeper_than_the_limit_is_refused() {
    let limits = RequestLimits {
        max_depth: 10,
        ..RequestLimits::default()
    };
    check_protobuf("test", &NODE, &nested(10), &limits).unwrap();
    let e = check_protobuf("test", &NODE, &nested(11), &limits).unwrap_err();
    assert_eq!(over(&e), Some(("message nesting depth", 10)), "{e}");
    assert_eq!(e.kind(), ErrorKind::LimitExceeded);
    // The frames are a fixed array: a larger limit is capped, not followed.
    let limits = RequestLimits {
        max_depth: 1000,
        ..RequestLimits::default()
    };
    check_protobuf("test", &NODE, &nested(MAX_DEPTH), &limits).unwrap();
    let e = check_protobuf("test", &NODE, &nested(1000), &limits).unwrap_err();
    assert_eq!(over(&e), Some(("message nesting depth", MAX_DEPTH)));
    // JSON alike.
    let json = |levels: usize| {
        let mut text = "{".to_owned();
        for _ in 1..levels {
            text.push_str(r#""child":[{"#);
        }
        for _ in 1..levels {
            text.push_str("}]");
        }
        text.push('}');
        text
    };
    let limits = RequestLimits {
        max_depth: 10,
        ..RequestLimits::default()
    };
    check_json("test", &NODE, json(10).as_bytes(), &limits).unwrap();
    let e = check_json("test", &NODE, json(11).as_bytes(), &limits).unwrap_err();
    assert_eq!(over(&e), Some(("message nesting depth", 10)));
}

/// Scans `bytes` with `limits` changed by `set` to `at`, then to `at - 1`: the first must
/// pass, the second be over the limit named `what`.
fn at_and_over(
    shape: &'static Shape,
    bytes: &[u8],
    json: Option<&[u8]>,
    at: usize,
    set: fn(&mut RequestLimits, usize),
    what: &str,
) {
    let mut limits = RequestLimits::default();
    set(&mut limits, at);
    check_protobuf("test", shape, bytes, &limits).unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Some(json) = json {
        check_json("test", shape, json, &limits).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    set(&mut limits, at - 1);
    let e = check_protobuf("test", shape, bytes, &limits).unwrap_err();
    assert_eq!(over(&e), Some((what, at - 1)), "{e}");
    assert_eq!(
        e.to_string(),
        format!("{what} exceeds the limit of {}", at - 1)
    );
    if let Some(json) = json {
        let e = check_json("test", shape, json, &limits).unwrap_err();
        assert_eq!(over(&e), Some((what, at - 1)), "JSON: {e}");
    }
}

#[test]
fn each_push_limit_holds_at_its_value_and_refuses_one_more() {
    let empty_series = |n: usize| format!(r#"{{"series":[{}]}}"#, vec!["{}"; n].join(","));
    at_and_over(
        &shapes::PUSH_REQUEST,
        &push_request(5, 0).encode_to_vec(),
        Some(empty_series(5).as_bytes()),
        5,
        |l, n| l.max_push_series = n,
        "series",
    );
    // Labels are counted per series: three series of 4 pass a limit of 4.
    let labels = |n: usize| {
        format!(
            r#"{{"series":[{0},{0},{0}]}}"#,
            format!(r#"{{"labels":[{}]}}"#, vec!["{}"; n].join(","))
        )
    };
    at_and_over(
        &shapes::PUSH_REQUEST,
        &push_request(3, 4).encode_to_vec(),
        Some(labels(4).as_bytes()),
        4,
        |l, n| l.max_labels_per_series = n,
        "series[].labels",
    );
    let samples = push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels: Vec::new(),
            samples: vec![push::RawSample::default(); 3],
        }],
    };
    at_and_over(
        &shapes::PUSH_REQUEST,
        &samples.encode_to_vec(),
        Some(br#"{"series":[{"samples":[{},{"rawProfile":"AAAA"},{"ID":"x"}]}]}"#),
        3,
        |l, n| l.max_samples_per_series = n,
        "series[].samples",
    );
}

#[test]
fn each_query_limit_holds_at_its_value_and_refuses_one_more() {
    let names = types::LabelNamesRequest {
        matchers: vec!["{a=\"b\"}".into(); 7],
        ..Default::default()
    };
    at_and_over(
        <types::LabelNamesRequest as Bounded>::shape(),
        &names.encode_to_vec(),
        Some(serde_json::to_string(&names).unwrap().as_bytes()),
        7,
        |l, n| l.max_matchers = n,
        "matchers",
    );
    // Span ids add up over the request: both sides of a diff.
    let side = |spans: usize| querier::SelectMergeStacktracesRequest {
        span_selector: vec!["0123456789abcdef".into(); spans],
        ..Default::default()
    };
    let diff = querier::DiffRequest {
        left: Some(side(3)),
        right: Some(side(2)),
    };
    at_and_over(
        <querier::DiffRequest as Bounded>::shape(),
        &diff.encode_to_vec(),
        Some(serde_json::to_string(&diff).unwrap().as_bytes()),
        5,
        |l, n| l.max_span_ids = n,
        "span_selector",
    );
    // A singular message sent twice is merged by decoding: still counted together.
    let mut twice = querier::SelectMergeStacktracesRequest {
        stack_trace_selector: Some(types::StackTraceSelector {
            call_site: vec![types::Location { name: "f".into() }; 3],
            go_pgo: None,
        }),
        ..Default::default()
    }
    .encode_to_vec();
    twice.extend(twice.clone());
    at_and_over(
        <querier::SelectMergeStacktracesRequest as Bounded>::shape(),
        &twice,
        None,
        6,
        |l, n| l.max_call_site = n,
        "stack_trace_selector.call_site",
    );
    let series = querier::SeriesRequest {
        label_names: vec!["pod".into(); 3],
        ..Default::default()
    };
    at_and_over(
        <querier::SeriesRequest as Bounded>::shape(),
        &series.encode_to_vec(),
        Some(serde_json::to_string(&series).unwrap().as_bytes()),
        3,
        |l, n| l.max_label_names = n,
        "label_names",
    );
    for (profiles, traces, what) in [(2, 0, "profile_id_selector"), (0, 2, "trace_id_selector")] {
        let merge = querier::SelectMergeProfileRequest {
            profile_id_selector: vec!["p".into(); profiles],
            trace_id_selector: vec!["t".into(); traces],
            ..Default::default()
        };
        at_and_over(
            <querier::SelectMergeProfileRequest as Bounded>::shape(),
            &merge.encode_to_vec(),
            Some(serde_json::to_string(&merge).unwrap().as_bytes()),
            2,
            |l, n| l.max_span_ids = n,
            what,
        );
    }
    let series = querier::SelectSeriesRequest {
        group_by: vec!["pod".into(); 4],
        ..Default::default()
    };
    at_and_over(
        <querier::SelectSeriesRequest as Bounded>::shape(),
        &series.encode_to_vec(),
        Some(serde_json::to_string(&series).unwrap().as_bytes()),
        4,
        |l, n| l.max_label_names = n,
        "group_by",
    );
    let set = settings::SetSettingsRequest {
        setting: Some(settings::Setting {
            name: "n".into(),
            value: "v".repeat(100),
            modified_at: 1,
        }),
    };
    let bytes = set.encode_to_vec();
    at_and_over(
        <settings::SetSettingsRequest as Bounded>::shape(),
        &bytes,
        None,
        bytes.len(),
        |l, n| l.max_settings_bytes = n,
        "settings request bytes",
    );
}

#[test]
fn each_otlp_limit_holds_at_its_value_and_refuses_one_more() {
    let profiles = |samples: usize| otlp::ScopeProfiles {
        profiles: vec![otlp::Profile {
            samples: vec![otlp::Sample::default(); samples],
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = otlp::ExportProfilesServiceRequest {
        resource_profiles: vec![
            otlp::ResourceProfiles {
                scope_profiles: vec![profiles(2), profiles(3)],
                ..Default::default()
            },
            otlp::ResourceProfiles::default(),
        ],
        dictionary: Some(otlp::ProfilesDictionary {
            string_table: vec![String::new(); 4],
            ..Default::default()
        }),
    };
    let bytes = request.encode_to_vec();
    let shape = &shapes::EXPORT_REQUEST;
    at_and_over(
        shape,
        &bytes,
        None,
        2,
        |l, n| l.max_resource_profiles = n,
        "resource_profiles",
    );
    at_and_over(
        shape,
        &bytes,
        None,
        2,
        |l, n| l.max_profiles = n,
        "resource_profiles[].scope_profiles[].profiles",
    );
    // Samples of every profile together.
    at_and_over(
        shape,
        &bytes,
        None,
        5,
        |l, n| l.max_samples = n,
        "resource_profiles[].scope_profiles[].profiles[].samples",
    );
    at_and_over(
        shape,
        &bytes,
        None,
        4,
        |l, n| l.max_dictionary_entries = n,
        "dictionary.string_table",
    );
    // Scopes of every resource together.
    let mut scopes = request.clone();
    scopes.resource_profiles[1].scope_profiles = vec![otlp::ScopeProfiles::default(); 2];
    at_and_over(
        shape,
        &scopes.encode_to_vec(),
        None,
        4,
        |l, n| l.max_scope_profiles = n,
        "resource_profiles[].scope_profiles",
    );
    // Each dictionary table, in a dictionary sent twice (decoding merges the two).
    type Fill = fn(&mut otlp::ProfilesDictionary);
    let tables: [(&str, Fill); 6] = [
        ("dictionary.mapping_table", |d| {
            d.mapping_table = vec![Default::default(); 3]
        }),
        ("dictionary.location_table", |d| {
            d.location_table = vec![Default::default(); 3]
        }),
        ("dictionary.function_table", |d| {
            d.function_table = vec![Default::default(); 3]
        }),
        ("dictionary.link_table", |d| {
            d.link_table = vec![Default::default(); 3]
        }),
        ("dictionary.attribute_table", |d| {
            d.attribute_table = vec![Default::default(); 3]
        }),
        ("dictionary.stack_table", |d| {
            d.stack_table = vec![Default::default(); 3]
        }),
    ];
    for (what, fill) in tables {
        let mut dictionary = otlp::ProfilesDictionary::default();
        fill(&mut dictionary);
        let mut twice = otlp::ExportProfilesServiceRequest {
            resource_profiles: Vec::new(),
            dictionary: Some(dictionary),
        }
        .encode_to_vec();
        twice.extend(twice.clone());
        at_and_over(
            shape,
            &twice,
            None,
            6,
            |l, n| l.max_dictionary_entries = n,
            what,
        );
    }
}

#[test]
fn the_decoded_size_is_held_to_its_budget() {
    // 100,000 empty labels: 2 bytes each on the wire, a `LabelPair` each decoded.
    let bytes = push_request(1, 100_000).encode_to_vec();
    let limits = RequestLimits {
        max_labels_per_series: usize::MAX,
        ..RequestLimits::default()
    };
    let scanned = scan_push(&bytes, &limits).unwrap();
    let each = size_of::<push::LabelPair>();
    assert!(scanned.decoded_bytes >= 100_000 * each);
    assert!(scanned.decoded_bytes > 10 * bytes.len(), "amplified");
    let limits = RequestLimits {
        max_decoded_bytes: scanned.decoded_bytes - 1,
        ..limits
    };
    let e = scan_push(&bytes, &limits).unwrap_err();
    assert_eq!(
        over(&e),
        Some(("decoded request bytes", scanned.decoded_bytes - 1))
    );
}

#[test]
fn json_keys_are_read_as_decoding_reads_them() {
    let limits = RequestLimits {
        max_push_series: 1,
        ..RequestLimits::default()
    };
    // Escaped, and by the field's proto name as well as its JSON name.
    for text in [
        r#"{"\u0073eries":[{},{}]}"#,
        r#"{"ser\u0069es":[{},{}]}"#,
        r#"{"series":[{},{}]}"#,
    ] {
        let e = check_json("push", &shapes::PUSH_REQUEST, text.as_bytes(), &limits).unwrap_err();
        assert_eq!(over(&e), Some(("series", 1)), "{text}");
    }
    let text = r#"{"series":[{"samples":[{"raw_profile":"AAAA"},{"rawProfile":"AAAA"}]}]}"#;
    let scanned = check_json("push", &shapes::PUSH_REQUEST, text.as_bytes(), &limits).unwrap();
    assert!(scanned.decoded_bytes >= 2 * 2 * 6, "{scanned:?}");
    // Unknown keys are skipped, whatever they hold, however deep.
    let text = r#"{"other":{"a":[1,2,{"b":[[],{}]}],"series":[{},{}]},"series":[{}]}"#;
    check_json("push", &shapes::PUSH_REQUEST, text.as_bytes(), &limits).unwrap();
    // Surrogate pairs and other escapes decode (to no field).
    let text = r#"{"\ud83d\ude00\n\"\\\/":1,"series":[]}"#;
    check_json("push", &shapes::PUSH_REQUEST, text.as_bytes(), &limits).unwrap();
}

#[test]
fn json_that_is_not_json_is_refused_before_decoding() {
    let limits = RequestLimits::default();
    for (text, why) in [
        (r#"{"series":[{},{}"#, "expected , or ]"),
        (r#"{"series":[{} {}]}"#, "expected , or ]"),
        (r#"{"series":"abc}"#, "unterminated string"),
        (r#"{"series" []}"#, "expected :"),
        (r#"{"series":[]} x"#, "text after the object"),
        (r#"[{}]"#, "expected an object"),
        (r#"{"x":[1,}"#, "expected a value"),
        (r#"{"x":{"a" 1}}"#, "expected :"),
        (r#"{"x":nul}"#, "expected a value"),
    ] {
        let e = check_json("push", &shapes::PUSH_REQUEST, text.as_bytes(), &limits).unwrap_err();
        let (_, reason) = malformed(e);
        assert!(reason.contains(why), "{text}: {reason}");
    }
    // Unknown values nested past serde_json's own limit.
    let deep = format!(r#"{{"x":{}{}}}"#, "[".repeat(200), "]".repeat(200));
    let e = check_json("push", &shapes::PUSH_REQUEST, deep.as_bytes(), &limits).unwrap_err();
    assert!(malformed(e).1.contains("nested too deep"));
}

#[test]
fn json_values_of_the_wrong_type_are_left_to_decoding() {
    let limits = RequestLimits::default();
    let text = br#"{"matchers":"not a list","start":"1"}"#;
    check_json(
        "query",
        <types::LabelNamesRequest as Bounded>::shape(),
        text,
        &limits,
    )
    .unwrap();
    let e = decode_json::<types::LabelNamesRequest>("query", text, &limits).unwrap_err();
    let (at, reason) = malformed(e);
    assert_eq!(at, "body");
    assert!(reason.starts_with("not LabelNamesRequest JSON"), "{reason}");
    // And a body that is fine decodes.
    let text = br#"{"matchers":["{a=\"b\"}"],"start":"1","end":2}"#;
    let r = decode_json::<types::LabelNamesRequest>("query", text, &limits).unwrap();
    assert_eq!((r.matchers.len(), r.start, r.end), (1, 1, 2));
}

/// The few descriptor messages the shapes test reads (prost-types' names and numbers).
mod descriptor {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct FileDescriptorSet {
        #[prost(message, repeated, tag = "1")]
        pub(super) file: Vec<FileDescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct FileDescriptorProto {
        #[prost(string, tag = "2")]
        pub(super) package: String,
        #[prost(message, repeated, tag = "4")]
        pub(super) message_type: Vec<DescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct DescriptorProto {
        #[prost(string, tag = "1")]
        pub(super) name: String,
        #[prost(message, repeated, tag = "2")]
        pub(super) field: Vec<FieldDescriptorProto>,
        #[prost(message, repeated, tag = "3")]
        pub(super) nested_type: Vec<DescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct FieldDescriptorProto {
        #[prost(string, tag = "1")]
        pub(super) name: String,
        #[prost(int32, tag = "3")]
        pub(super) number: i32,
        #[prost(int32, tag = "4")]
        pub(super) label: i32,
        #[prost(int32, tag = "5")]
        pub(super) r#type: i32,
        #[prost(string, tag = "6")]
        pub(super) type_name: String,
        #[prost(string, tag = "10")]
        pub(super) json_name: String,
    }
}

/// Checks `shape` (and the shapes within it) against message `name` of the descriptors:
/// the same fields, numbers, kinds and repetition; the JSON names of the protos.
fn check_shape(
    messages: &std::collections::HashMap<String, descriptor::DescriptorProto>,
    name: &str,
    shape: &'static Shape,
    request_limits: &mut Vec<*const Limit>,
    seen: &mut Vec<String>,
) {
    if seen.iter().any(|s| s == name) {
        return;
    }
    seen.push(name.to_owned());
    let message = messages
        .get(name)
        .unwrap_or_else(|| panic!("no message {name}"));
    assert!(
        name.ends_with(shape.name),
        "{name} is shaped as {}",
        shape.name
    );
    assert!(
        shape.fields.len() <= MAX_FIELDS,
        "{name} has too many fields"
    );
    assert_eq!(
        message.field.len(),
        shape.fields.len(),
        "{name}: the shape has other fields than the proto"
    );
    for d in &message.field {
        let field = shape
            .fields
            .iter()
            .find(|f| i64::from(f.number) == i64::from(d.number))
            .unwrap_or_else(|| panic!("{name}.{} ({}) is not in the shape", d.name, d.number));
        let at = format!("{name}.{}", d.name);
        assert_eq!(field.name, d.name, "{at}");
        // The push JSON reader's own name of `ID` is `id` (see RAW_SAMPLE).
        if at != "push.v1.RawSample.ID" {
            assert_eq!(field.json, d.json_name, "{at}");
        }
        assert_eq!(field.repeated, d.label == 3, "{at}: repeated");
        // Descriptor types: 1 double, 2 float, 3 int64, 4 uint64, 5 int32, 6 fixed64,
        // 7 fixed32, 8 bool, 9 string, 11 message, 12 bytes, 13 uint32, 14 enum, 15
        // sfixed32, 16 sfixed64, 17 sint32, 18 sint64.
        match (field.kind, d.r#type) {
            (Kind::Message(nested), 11) => {
                check_shape(
                    messages,
                    d.type_name.trim_start_matches('.'),
                    nested,
                    request_limits,
                    seen,
                );
            }
            (Kind::String, 9) | (Kind::Bytes, 12) | (Kind::Fixed64, 1 | 6 | 16) => {}
            (Kind::Fixed32, 2 | 7 | 15) => {}
            (Kind::Varint(8), 3 | 4 | 18)
            | (Kind::Varint(4), 5 | 13 | 14 | 17)
            | (Kind::Varint(1), 8) => {}
            (kind, t) => panic!("{at}: {kind:?} for descriptor type {t}"),
        }
        if let Some(limit) = field.limit {
            assert!(field.repeated, "{at}: a count limit on a singular field");
            if limit.per == Per::Request && !request_limits.contains(&std::ptr::from_ref(limit)) {
                request_limits.push(std::ptr::from_ref(limit));
            }
        }
    }
}

#[test]
fn every_shape_is_its_proto() {
    let bytes = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
    let set = descriptor::FileDescriptorSet::decode(&bytes[..]).unwrap();
    let mut messages = std::collections::HashMap::new();
    fn add(
        prefix: &str,
        m: &descriptor::DescriptorProto,
        out: &mut std::collections::HashMap<String, descriptor::DescriptorProto>,
    ) {
        let name = format!("{prefix}.{}", m.name);
        for nested in &m.nested_type {
            add(&name, nested, out);
        }
        out.insert(name, m.clone());
    }
    for file in &set.file {
        for m in &file.message_type {
            add(&file.package, m, &mut messages);
        }
    }
    for (name, shape) in shapes::all() {
        let mut request_limits = Vec::new();
        check_shape(&messages, name, shape, &mut request_limits, &mut Vec::new());
        assert!(
            request_limits.len() <= MAX_REQUEST_LIMITS,
            "{name}: {} request-wide limits",
            request_limits.len()
        );
    }
}
