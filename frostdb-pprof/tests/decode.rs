//! Decoding real profiles, and refusing malformed ones with errors that name what is wrong.

mod common;

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
