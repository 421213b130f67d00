//! Synthetic profiles for tests and benchmarks: as many distinct stacks as asked for,
//! deterministic, cheap to build.

use crate::proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

/// Functions the synthetic stacks are made of.
pub const FUNCTIONS: u64 = 64;

/// A CPU profile (`cpu/nanoseconds`, period 10 ms) whose samples are the distinct stacks
/// numbered `first..first + count`: stack `x` is `depth` frames spelling `x` in base
/// [`FUNCTIONS`] under a `main` root, so different numbers are different stacks while
/// `depth` digits suffice. Stack `x` has value `(1 + x % 7) * 10_000_000`.
pub fn profile(first: u64, count: usize, depth: usize) -> Profile {
    let mut strings = vec![
        String::new(),
        "cpu".to_owned(),
        "nanoseconds".to_owned(),
        "/usr/bin/synthetic".to_owned(),
        "main".to_owned(),
    ];
    let name_of = |i: u64| strings.len() as i64 + i as i64;
    let function: Vec<Function> = (0..=FUNCTIONS)
        .map(|i| Function {
            id: i + 1,
            name: if i == FUNCTIONS { 4 } else { name_of(i) },
            ..Function::default()
        })
        .collect();
    strings.extend((0..FUNCTIONS).map(|i| format!("synthetic/pkg{}.(*T).f{i}", i % 8)));
    let location: Vec<Location> = (0..=FUNCTIONS)
        .map(|i| Location {
            id: i + 1,
            mapping_id: 1,
            address: 0x1000 + 0x10 * i,
            line: vec![Line {
                function_id: i + 1,
                line: i as i64 + 1,
                column: 0,
            }],
            is_folded: false,
        })
        .collect();
    let sample = (first..first + count as u64)
        .map(|x| {
            let mut location_id = Vec::with_capacity(depth + 1);
            let mut rest = x;
            for _ in 0..depth {
                location_id.push(rest % FUNCTIONS + 1);
                rest /= FUNCTIONS;
            }
            location_id.push(FUNCTIONS + 1); // main, the root
            Sample {
                location_id,
                value: vec![(1 + (x % 7) as i64) * 10_000_000],
                label: Vec::new(),
            }
        })
        .collect();
    Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample,
        mapping: vec![Mapping {
            id: 1,
            memory_start: 0x1000,
            memory_limit: 0x10_0000,
            filename: 3,
            has_functions: true,
            ..Mapping::default()
        }],
        location,
        function,
        string_table: strings,
        duration_nanos: 10_000_000_000,
        period_type: Some(ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        ..Profile::default()
    }
}

/// Labels sample `i` of `profile` with span `s{i % spans}` and trace `t0` (`span_id` and
/// `trace_id`, as `pyroscope-otel` labels a request's samples).
pub fn label_spans(profile: &mut Profile, spans: usize) {
    let mut string = |s: String| {
        profile.string_table.push(s);
        profile.string_table.len() as i64 - 1
    };
    let (span_key, trace_key, trace) = (
        string("span_id".into()),
        string("trace_id".into()),
        string("t0".into()),
    );
    let span: Vec<i64> = (0..spans).map(|s| string(format!("s{s}"))).collect();
    for (i, sample) in profile.sample.iter_mut().enumerate() {
        sample.label = vec![
            crate::proto::Label {
                key: span_key,
                str: span[i % spans],
                ..Default::default()
            },
            crate::proto::Label {
                key: trace_key,
                str: trace,
                ..Default::default()
            },
        ];
    }
}

/// The total of [`profile`]`(first, count, _)`'s samples that [`label_spans`]`(_, spans)`
/// puts in the spans `ids`.
pub fn span_total(first: u64, count: usize, spans: usize, ids: &[usize]) -> i64 {
    (0..count)
        .filter(|i| ids.contains(&(i % spans)))
        .map(|i| (1 + ((first + i as u64) % 7) as i64) * 10_000_000)
        .sum()
}

/// The total [`profile`] gives its stacks `first..first + count`.
pub fn total(first: u64, count: usize) -> i64 {
    (first..first + count as u64)
        .map(|x| (1 + (x % 7) as i64) * 10_000_000)
        .sum()
}

/// The project's shared/ directory of real profiles (`FROSTDB_SHARED`, else beside the
/// repository, else /work/shared).
pub fn shared_dir() -> std::path::PathBuf {
    if let Ok(dir) = std::env::var("FROSTDB_SHARED") {
        return dir.into();
    }
    let beside = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    if beside.exists() {
        return beside;
    }
    "/work/shared".into()
}

/// `profile` (of one sample type, no sample labels) as the samples batch
/// [`ProfileStore::ingest_arrow`](crate::ProfileStore::ingest_arrow) takes: a row per
/// sample with a non-zero value, profile type `name:<type>:<unit>:<period type>:<period
/// unit>`, the `labels`, time `timestamp_ms`, and its stack inline as function names (leaf
/// first, a location's inlined functions innermost first). Its frames keep only function
/// names: what ingest keeps of this profile's but its mapping, addresses and lines.
pub fn arrow_samples(
    profile: &Profile,
    name: &str,
    labels: &[(&str, &str)],
    timestamp_ms: i64,
) -> arrow::array::RecordBatch {
    use crate::schema::column::{
        DURATION, NAME, PERIOD, PERIOD_TYPE, PERIOD_UNIT, SAMPLE_TYPE, SAMPLE_UNIT, TIMESTAMP,
        VALUE, label_column,
    };
    use arrow::array::{ArrayRef, Int64Array, ListBuilder, StringArray, StringBuilder};
    use std::sync::Arc;
    let text = |i: i64| profile.string_table[i as usize].as_str();
    let function = |id: u64| profile.function.iter().find(|f| f.id == id);
    let location = |id: u64| profile.location.iter().find(|l| l.id == id);
    let samples: Vec<&Sample> = profile.sample.iter().filter(|s| s.value[0] != 0).collect();
    let n = samples.len();
    let mut frames = ListBuilder::new(StringBuilder::new());
    for sample in &samples {
        for &id in &sample.location_id {
            for line in location(id).map_or(&[][..], |l| &l.line[..]) {
                frames
                    .values()
                    .append_value(function(line.function_id).map_or("", |f| text(f.name)));
            }
        }
        frames.append(true);
    }
    let t = &profile.sample_type[0];
    let period = profile.period_type.unwrap_or_default();
    let constant = |v: &str| Arc::new(StringArray::from(vec![v; n])) as ArrayRef;
    let mut columns: Vec<(String, ArrayRef)> = vec![
        (NAME.into(), constant(name)),
        (SAMPLE_TYPE.into(), constant(text(t.r#type))),
        (SAMPLE_UNIT.into(), constant(text(t.unit))),
        (PERIOD_TYPE.into(), constant(text(period.r#type))),
        (PERIOD_UNIT.into(), constant(text(period.unit))),
    ];
    for (k, v) in labels {
        columns.push((label_column(k), constant(v)));
    }
    let ints = |v: Vec<i64>| Arc::new(Int64Array::from(v)) as ArrayRef;
    columns.push((TIMESTAMP.into(), ints(vec![timestamp_ms; n])));
    columns.push((DURATION.into(), ints(vec![profile.duration_nanos; n])));
    columns.push((PERIOD.into(), ints(vec![profile.period; n])));
    columns.push((
        VALUE.into(),
        ints(samples.iter().map(|s| s.value[0]).collect()),
    ));
    columns.push((crate::FRAMES.into(), Arc::new(frames.finish())));
    arrow::array::RecordBatch::try_from_iter(columns).expect("a samples batch")
}
