//! Decoding real profiles, and refusing malformed ones with errors that name what is wrong.

use crate::common;

use std::io::Write;

use frostdb_pprof::proto::{Function, Location, Profile, Sample, ValueType};
use frostdb_pprof::{Error, Limits, decode};
use prost::Message;

#[test]
fn every_real_profile_decodes() {
    let files = common::testdata();
    assert!(files.len() >= 40, "testdata found: {}", files.len());
    for (name, bytes) in &files {
        let p = decode(bytes, &Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!p.string_table.is_empty(), "{name}");
    }
}

#[test]
fn a_profile_gunzipped_after_a_larger_one_reads_only_its_own_bytes() {
    // Gunzipped profiles are parsed from buffers reused from one profile to the next: each
    // must be read from its own bytes, none of an earlier, larger one's.
    let limits = Limits::default();
    let mut files: Vec<(String, Vec<u8>, Vec<u8>)> = common::testdata()
        .into_iter()
        .filter(|(_, bytes)| bytes.starts_with(&[0x1f, 0x8b]))
        .map(|(name, bytes)| {
            let raw = frostdb_pprof::inflate(&bytes, usize::MAX)
                .unwrap()
                .into_owned();
            (name, bytes, raw)
        })
        .collect();
    files.sort_by_key(|(_, _, raw)| std::cmp::Reverse(raw.len()));
    assert!(files.len() >= 10, "gzipped testdata found: {}", files.len());
    for (name, gz, raw) in &files {
        assert_eq!(
            decode(gz, &limits).unwrap_or_else(|e| panic!("{name}: {e}")),
            decode(raw, &limits).unwrap(),
            "{name}"
        );
    }
}

fn minimal() -> Profile {
    Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample: vec![Sample {
            location_id: vec![1],
            value: vec![5],
            label: vec![],
        }],
        location: vec![Location {
            id: 1,
            line: vec![frostdb_pprof::proto::Line {
                function_id: 1,
                line: 3,
                column: 0,
            }],
            ..Default::default()
        }],
        function: vec![Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        string_table: vec!["".into(), "cpu".into(), "nanoseconds".into(), "main".into()],
        ..Default::default()
    }
}

/// `minimal()` with its location and function numbered `id` (out of order for the
/// decoder: ids not 1..=n are looked up in a table), and its sample pointing at `refers`.
fn numbered(id: u64, refers: u64) -> Vec<u8> {
    let mut p = minimal();
    p.location[0].id = id;
    p.location[0].line[0].function_id = id;
    p.function[0].id = id;
    p.sample[0].location_id = vec![refers];
    p.encode_to_vec()
}

#[test]
fn ids_of_an_earlier_profile_do_not_resolve_in_a_later_one() {
    // Id tables are reused from one profile to the next on a thread, without clearing:
    // a later profile must see only its own ids, however many profiles came before.
    let limits = Limits::default();
    for round in 0..3 {
        let earlier = decode(&numbered(20, 20), &limits).unwrap();
        drop(earlier);
        let err = decode(&numbered(30, 20), &limits).expect_err("location 20 is not in it");
        assert!(err.to_string().contains("20"), "round {round}: {err}");
        let later = decode(&numbered(30, 30), &limits).unwrap();
        assert_eq!(later.into_inner().location[0].id, 30, "round {round}");
        // The same id twice in one profile is still refused after a reuse.
        let mut twice = minimal();
        twice.location[0].id = 20;
        twice.function[0].id = 20;
        twice.location[0].line[0].function_id = 20;
        twice.sample[0].location_id = vec![20];
        twice.location.push(twice.location[0].clone());
        let err = decode(&twice.encode_to_vec(), &limits).expect_err("location 20 twice");
        assert!(err.to_string().contains("20"), "round {round}: {err}");
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn malformed_profiles_get_errors_naming_the_problem() {
    let ok = minimal().encode_to_vec();
    assert!(decode(&ok, &Limits::default()).is_ok());
    assert!(decode(&gzip(&ok), &Limits::default()).is_ok());

    let mut truncated = gzip(&ok);
    truncated.truncate(truncated.len() - 6);
    assert!(matches!(
        decode(&truncated, &Limits::default()),
        Err(Error::Gzip(_))
    ));
    assert!(matches!(
        decode(&[0x1f, 0x8b, 0, 1, 2, 3], &Limits::default()),
        Err(Error::Gzip(_))
    ));
    assert!(matches!(
        decode(b"\xff\xff\xff\xff garbage", &Limits::default()),
        Err(Error::Protobuf(_))
    ));

    type Breakage = Box<dyn Fn(&mut Profile)>;
    let cases: Vec<(Breakage, &str)> = vec![
        (Box::new(|p| p.sample_type[0].unit = 99), "sample_type.unit"),
        (
            Box::new(|p| p.sample[0].location_id = vec![7]),
            "sample.location_id",
        ),
        (Box::new(|p| p.sample[0].value = vec![1, 2]), "sample.value"),
        (
            Box::new(|p| p.location[0].line[0].function_id = 9),
            "line.function_id",
        ),
        (
            Box::new(|p| p.location[0].mapping_id = 4),
            "location.mapping_id",
        ),
        (Box::new(|p| p.function[0].name = -1), "function.name"),
        (Box::new(|p| p.string_table[0] = "x".into()), "string_table"),
        (
            Box::new(|p| p.location.push(p.location[0].clone())),
            "location.id",
        ),
        // Repeated and zero ids are refused whichever lookup the ids get: small ids out of
        // order (a table by id), ids far larger than the count (a map).
        (
            Box::new(|p| {
                let mut f = p.function[0];
                f.id = 0;
                p.function.push(f);
            }),
            "function.id",
        ),
        (
            Box::new(|p| {
                p.location[0].id = 1 << 40;
                p.sample[0].location_id = vec![1 << 40];
                p.location.push(p.location[0].clone());
            }),
            "location.id",
        ),
        (
            Box::new(|p| {
                p.sample[0].label.push(frostdb_pprof::proto::Label {
                    key: 55,
                    ..Default::default()
                })
            }),
            "label.key",
        ),
    ];
    for (break_it, field) in cases {
        let mut p = minimal();
        break_it(&mut p);
        match decode(&p.encode_to_vec(), &Limits::default()) {
            Err(Error::Invalid { field: f, reason }) => {
                assert_eq!(f, field, "{reason}");
            }
            other => panic!("{field}: expected an invalid-field error, got {other:?}"),
        }
    }
}

#[test]
fn several_gzip_members_and_lying_trailers_decode_as_a_stream_would() {
    let ok = minimal().encode_to_vec();
    let limits = Limits::default();
    // A profile split over two gzip members (as `cat a.gz b.gz` makes) is one profile.
    let (a, b) = ok.split_at(ok.len() / 2);
    let mut two = gzip(a);
    two.extend(gzip(b));
    assert_eq!(decode(&two, &limits).unwrap().into_inner(), minimal());
    // The same member twice (`cat a.gz a.gz`): each member's trailer is the file's last
    // eight bytes, so only the search for the first one's tells the members apart. Both
    // are read (and the profile, every id twice, is refused as a stream would refuse it).
    let once = gzip(&ok);
    let twice = [once.as_slice(), once.as_slice()].concat();
    let inflated = frostdb_pprof::inflate(&twice, 1 << 20).unwrap();
    assert_eq!(inflated.as_ref(), [ok.as_slice(), ok.as_slice()].concat());
    assert!(matches!(
        decode(&twice, &limits),
        Err(Error::Invalid { .. })
    ));
    // A trailer stating a wrong size is caught by the stream's own check.
    let mut lying = gzip(&ok);
    let n = lying.len();
    lying[n - 4..].copy_from_slice(&3u32.to_le_bytes());
    assert!(matches!(decode(&lying, &limits), Err(Error::Gzip(_))));
    // A bomb whose trailer claims a few bytes still stops at the limit.
    let mut bomb = gzip(&vec![0u8; 8 << 20]);
    let n = bomb.len();
    bomb[n - 4..].copy_from_slice(&100u32.to_le_bytes());
    let small = Limits {
        max_decompressed_bytes: 1 << 20,
        ..Limits::default()
    };
    assert!(matches!(decode(&bomb, &small), Err(Error::TooLarge { .. })));
}

#[test]
fn bombs_and_huge_profiles_hit_the_limits() {
    // 64 MiB of zeros gzip to about 64 KiB.
    let bomb = gzip(&vec![0u8; 64 << 20]);
    assert!(bomb.len() < 1 << 20);
    let limits = Limits {
        max_decompressed_bytes: 1 << 20,
        ..Limits::default()
    };
    assert!(matches!(
        decode(&bomb, &limits),
        Err(Error::TooLarge {
            what: "decompressed profile",
            ..
        })
    ));

    let mut p = minimal();
    p.sample = vec![p.sample[0].clone(); 11];
    let limits = Limits {
        max_samples: 10,
        ..Limits::default()
    };
    assert!(matches!(
        decode(&p.encode_to_vec(), &limits),
        Err(Error::TooLarge {
            what: "sample count",
            ..
        })
    ));
    let mut p = minimal();
    p.sample[0].location_id = vec![1; 20];
    let limits = Limits {
        max_stack_depth: 10,
        ..Limits::default()
    };
    assert!(matches!(
        decode(&p.encode_to_vec(), &limits),
        Err(Error::TooLarge {
            what: "stack depth",
            ..
        })
    ));
}

/// What prost makes of `raw`, checked and repaired as `validate` does.
fn via_prost(raw: &[u8]) -> Result<Profile, String> {
    let p = Profile::decode(raw).map_err(|e| e.to_string())?;
    Ok(frostdb_pprof::validate(p, &Limits::default())
        .map_err(|e| e.to_string())?
        .into_inner())
}

#[test]
fn the_flat_decoder_reads_every_real_profile_as_prost_does() {
    for (name, bytes) in &common::testdata() {
        let raw = frostdb_pprof::inflate(bytes, 1 << 30).unwrap();
        let want = via_prost(&raw).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = decode(bytes, &Limits::default()).unwrap();
        assert_eq!(got.time_nanos(), want.time_nanos, "{name}");
        assert_eq!(got.sample_types(), want.sample_type.as_slice(), "{name}");
        assert_eq!(got.into_inner(), want, "{name}");
    }
}

#[test]
fn every_truncation_fails_or_reads_as_prost_reads_it() {
    let (_, bytes) = common::testdata()
        .into_iter()
        .min_by_key(|(_, b)| b.len())
        .unwrap();
    let raw = frostdb_pprof::inflate(&bytes, 1 << 30)
        .unwrap()
        .into_owned();
    for cut in 0..raw.len() {
        let prefix = &raw[..cut];
        match (decode(prefix, &Limits::default()), via_prost(prefix)) {
            (Ok(got), Ok(want)) => assert_eq!(got.into_inner(), want, "cut at {cut}"),
            (Err(_), Err(_)) => {}
            (got, want) => panic!(
                "cut at {cut}: flat {:?}, prost {:?}",
                got.map(|_| ()),
                want.map(|_| ())
            ),
        }
    }
}

/// Appends a varint.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[test]
fn unpacked_repeated_fields_and_unknown_fields_read_as_prost_reads_them() {
    let mut raw = minimal().encode_to_vec();
    // A second sample, its location ids one field each (unpacked, as proto2 writers send
    // them), with unknown varint, fixed64, fixed32 and bytes fields.
    let mut sample = Vec::new();
    for (field, v) in [(1u64, 1u64), (2, 7), (1, 1), (99, 5)] {
        varint(&mut sample, field << 3);
        varint(&mut sample, v);
    }
    varint(&mut sample, (98 << 3) | 1);
    sample.extend([1, 0, 0, 0, 0, 0, 0, 0]);
    varint(&mut sample, (97 << 3) | 5);
    sample.extend([1, 0, 0, 0]);
    varint(&mut sample, (96 << 3) | 2);
    sample.extend([2, 0xff, 0xfe]);
    raw.push((2 << 3) | 2);
    varint(&mut raw, sample.len() as u64);
    raw.extend(&sample);
    let want = via_prost(&raw).unwrap();
    assert_eq!(want.sample[1].location_id, vec![1, 1]);
    assert_eq!(want.sample[1].value, vec![7]);
    assert_eq!(decode(&raw, &Limits::default()).unwrap().into_inner(), want);
    // A second value for the one sample type is a validation error in both.
    varint(&mut sample, 2 << 3);
    varint(&mut sample, 8);
    let mut two = minimal().encode_to_vec();
    two.push((2 << 3) | 2);
    varint(&mut two, sample.len() as u64);
    two.extend(&sample);
    assert!(via_prost(&two).is_err());
    let err = decode(&two, &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("sample.value"), "{err}");
}

#[test]
fn strings_that_are_not_utf8_are_refused_naming_the_entry() {
    let mut raw = minimal().encode_to_vec();
    raw.extend([(6 << 3) | 2, 2, 0xc3, 0x28]);
    let err = decode(&raw, &Limits::default()).unwrap_err();
    assert!(matches!(err, Error::Protobuf(_)), "{err}");
    assert!(err.to_string().contains("string_table[4]"), "{err}");
    assert!(Profile::decode(raw.as_slice()).is_err());
}

#[test]
fn a_character_split_across_two_strings_is_refused() {
    // "é" is 0xc3 0xa9: each half alone is not UTF-8, though the two side by side are.
    let mut raw = minimal().encode_to_vec();
    raw.extend([(6 << 3) | 2, 1, 0xc3, (6 << 3) | 2, 1, 0xa9]);
    let err = decode(&raw, &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("string_table[4]"), "{err}");
    assert!(Profile::decode(raw.as_slice()).is_err());
}

mod random {
    use super::*;
    use frostdb_pprof::proto::{Label, Line, Mapping};
    use proptest::prelude::*;

    /// Profiles whose every reference holds, with any values in their fields.
    fn profiles() -> impl Strategy<Value = Profile> {
        (
            prop::collection::vec("\\PC{0,12}", 1..20),
            1usize..4,
            0usize..4,
            1usize..12,
            1usize..16,
            any::<[i64; 6]>(),
            any::<u64>(),
        )
            .prop_flat_map(
                |(strings, types, mappings, functions, locations, scalars, seed)| {
                    let s = strings.len() as i64 + 1;
                    let sample = (
                        prop::collection::vec(1..=locations as u64, 0..8),
                        // Values within ±2^53, the most one sample is taken with.
                        prop::collection::vec(-(1i64 << 53)..=(1 << 53), types),
                        prop::collection::vec((0..s, 0..s, any::<i64>(), 0..s), 0..3),
                    );
                    (
                        Just((strings, types, scalars, seed)),
                        prop::collection::vec((any::<u64>(), 0..s, 0..s, any::<bool>()), mappings),
                        prop::collection::vec((0..s, 0..s, 0..s, any::<i64>()), functions),
                        prop::collection::vec(
                            (
                                0..=mappings as u64,
                                any::<u64>(),
                                prop::collection::vec((1..=functions as u64, any::<i64>()), 0..4),
                                any::<bool>(),
                            ),
                            locations,
                        ),
                        prop::collection::vec(sample, 0..10),
                        prop::collection::vec(0..s, 0..3),
                    )
                },
            )
            .prop_map(
                |(
                    (strings, types, scalars, _),
                    mappings,
                    functions,
                    locations,
                    samples,
                    comment,
                )| {
                    let mut string_table = vec![String::new()];
                    string_table.extend(strings);
                    let s = string_table.len() as i64;
                    Profile {
                        sample_type: (0..types as i64)
                            .map(|t| ValueType {
                                r#type: t % s,
                                unit: (t + 1) % s,
                            })
                            .collect(),
                        sample: samples
                            .into_iter()
                            .map(|(location_id, value, labels)| Sample {
                                location_id,
                                value,
                                label: labels
                                    .into_iter()
                                    .map(|(key, str, num, num_unit)| Label {
                                        key,
                                        str,
                                        num,
                                        num_unit,
                                    })
                                    .collect(),
                            })
                            .collect(),
                        mapping: mappings
                            .into_iter()
                            .enumerate()
                            .map(|(i, (start, filename, build_id, flag))| Mapping {
                                id: i as u64 + 1,
                                memory_start: start,
                                memory_limit: start.wrapping_add(4096),
                                file_offset: start / 2,
                                filename,
                                build_id,
                                has_functions: flag,
                                has_filenames: !flag,
                                has_line_numbers: flag,
                                has_inline_frames: !flag,
                            })
                            .collect(),
                        location: locations
                            .into_iter()
                            .enumerate()
                            .map(|(i, (mapping_id, address, lines, is_folded))| Location {
                                id: i as u64 + 1,
                                mapping_id,
                                address,
                                line: lines
                                    .into_iter()
                                    .map(|(function_id, line)| Line {
                                        function_id,
                                        line,
                                        column: line / 3,
                                    })
                                    .collect(),
                                is_folded,
                            })
                            .collect(),
                        function: functions
                            .into_iter()
                            .enumerate()
                            .map(|(i, (name, system_name, filename, start_line))| Function {
                                id: i as u64 + 1,
                                name,
                                system_name,
                                filename,
                                start_line,
                            })
                            .collect(),
                        string_table,
                        drop_frames: 0,
                        keep_frames: 0,
                        time_nanos: scalars[0],
                        duration_nanos: scalars[1],
                        period_type: (scalars[2] % 2 == 0)
                            .then_some(ValueType { r#type: 1, unit: 0 }),
                        period: scalars[3],
                        comment,
                        default_sample_type: 0,
                        doc_url: 0,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn the_flat_decoder_reads_any_valid_profile_as_prost_does(p in profiles()) {
            let raw = p.encode_to_vec();
            let want = via_prost(&raw).expect("the strategy makes valid profiles");
            let got = decode(&raw, &Limits::default()).unwrap();
            prop_assert_eq!(got.into_inner(), want);
        }
    }
}
