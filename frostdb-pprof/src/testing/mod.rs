//! Synthetic profiles for tests and benchmarks: as many distinct stacks as asked for,
//! deterministic, cheap to build.

use crate::proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

pub mod stripped;

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

/// A `WriteArrow` record as Parca Agent v0.48+ builds one (`reporter/arrow_v2.go` and
/// `reporter/parca_reporter.go` at main `cb46a8ea73a4c97ff0a555a4bab1cf9cec73daa0`): one
/// row per sample; labels a struct of run-end encoded dictionaries; the stack a list view
/// of dictionary-encoded locations (native frames an address in a mapping with its build
/// id and no lines; kernel and interpreted frames with their function); the types run-end
/// encoded; an Arrow IPC stream, LZ4 compressed, its schema marked `v2`; the native
/// frames' mapping has `build_id`. Returns the bytes and the CPU and off-CPU totals.
pub fn parca_agent_record(build_id: &str) -> (Vec<u8>, i64, i64) {
    parca_agent_record_of(build_id, 1)
}

/// [`parca_agent_record`] with the Python frame's location holding `python_lines` lines
/// (its handler inlined into itself), one line value shown that many times by its view.
pub fn parca_agent_record_of(build_id: &str, python_lines: usize) -> (Vec<u8>, i64, i64) {
    parca_agent_record_at(
        build_id,
        python_lines,
        [
            1_763_805_600_000_000_000,
            1_763_805_601_000_000_000,
            1_763_805_602_000_000_000,
        ],
    )
}

/// [`parca_agent_record_of`] with its three rows at `times` (ns).
pub fn parca_agent_record_at(
    build_id: &str,
    python_lines: usize,
    times: [i64; 3],
) -> (Vec<u8>, i64, i64) {
    use crate::convert::parca::wire;
    use std::sync::Arc;

    use arrow::array::{
        Array, ArrayRef, DictionaryArray, FixedSizeBinaryArray, Int32Array, Int64Array,
        ListViewArray, RunArray, StringArray, StringViewArray, StructArray,
        TimestampNanosecondArray, UInt32Array, UInt64Array,
    };
    use arrow::buffer::ScalarBuffer;
    use arrow::datatypes::{DataType, Field, Fields, Int32Type, Schema, TimeUnit, UInt32Type};

    let dict = |keys: Vec<Option<u32>>, values: &[&str]| -> ArrayRef {
        Arc::new(
            DictionaryArray::<UInt32Type>::try_new(
                UInt32Array::from(keys),
                Arc::new(StringArray::from(values.to_vec())),
            )
            .unwrap(),
        )
    };
    // A run-end encoding of `values` (one run each) repeated over `lens` rows.
    let ree = |lens: &[i32], values: ArrayRef| -> ArrayRef {
        let mut end = 0;
        let ends: Vec<i32> = lens
            .iter()
            .map(|l| {
                end += l;
                end
            })
            .collect();
        Arc::new(RunArray::<Int32Type>::try_new(&Int32Array::from(ends), &values).unwrap())
    };
    let strings = |v: &[&str]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };

    // Functions: the kernel's, and a Python handler.
    let function_fields = Fields::from(vec![
        Field::new("system_name", DataType::Utf8View, true),
        Field::new(
            "filename",
            DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new("start_line", DataType::UInt64, false),
    ]);
    let functions = StructArray::new(
        function_fields.clone(),
        vec![
            Arc::new(StringViewArray::from(vec!["do_syscall_64", "handler"])),
            dict(vec![Some(0), Some(1)], &["vmlinux", "app.py"]),
            Arc::new(UInt64Array::from(vec![0, 40])),
        ],
        None,
    );
    // Line 0 the kernel's; lines 1.. the Python location's, each the handler's.
    let function_dict = DictionaryArray::<UInt32Type>::try_new(
        UInt32Array::from_iter_values(
            std::iter::once(0).chain(std::iter::repeat_n(1, python_lines)),
        ),
        Arc::new(functions),
    )
    .unwrap();
    let line_fields = Fields::from(vec![
        Field::new("line", DataType::UInt64, false),
        Field::new("column", DataType::UInt64, false),
        Field::new("function", function_dict.data_type().clone(), false),
    ]);
    let lines = StructArray::new(
        line_fields.clone(),
        vec![
            Arc::new(UInt64Array::from_iter_values(
                std::iter::once(0).chain(std::iter::repeat_n(42, python_lines)),
            )),
            Arc::new(UInt64Array::from_iter_values(
                std::iter::once(0).chain(std::iter::repeat_n(7, python_lines)),
            )),
            Arc::new(function_dict),
        ],
        None,
    );
    // Locations: 0..3 native (app), 3 kernel, 4 Python; lines of 3 and 4 only.
    let line_field = Arc::new(Field::new("item", DataType::Struct(line_fields), true));
    let location_lines = ListViewArray::new(
        line_field,
        ScalarBuffer::from(vec![0, 0, 0, 0, 1]),
        ScalarBuffer::from(vec![0, 0, 0, 1, python_lines as i32]),
        Arc::new(lines),
        Some(vec![false, false, false, true, true].into()),
    );
    let location_fields = Fields::from(vec![
        Field::new("address", DataType::UInt64, false),
        Field::new(
            "frame_type",
            DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new(
            "mapping_file",
            DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new(
            "mapping_build_id",
            DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new("lines", location_lines.data_type().clone(), true),
    ]);
    let locations = StructArray::new(
        location_fields,
        vec![
            Arc::new(UInt64Array::from(vec![
                0x1140,
                0x11a0,
                0x1220,
                0xffff_ffff_8100_0000,
                0,
            ])),
            dict(
                vec![Some(0), Some(0), Some(0), Some(1), Some(2)],
                &["native", "kernel", "cpython"],
            ),
            dict(
                vec![Some(0), Some(0), Some(0), Some(1), None],
                &["app", "[kernel.kallsyms]"],
            ),
            dict(vec![Some(0), Some(0), Some(0), None, None], &[build_id]),
            Arc::new(location_lines),
        ],
        None,
    );
    // Stacks (leaf first) as dictionary keys into the locations; rows 0 and 2 share one.
    let stack_keys = UInt32Array::from(vec![0, 1, 2, 3, 4, 2]);
    let stack_values =
        DictionaryArray::<UInt32Type>::try_new(stack_keys, Arc::new(locations)).unwrap();
    let stack_field = Arc::new(Field::new("item", stack_values.data_type().clone(), true));
    let stacks = ListViewArray::new(
        stack_field,
        ScalarBuffer::from(vec![0, 3, 0]),
        ScalarBuffer::from(vec![3, 3, 3]),
        Arc::new(stack_values),
        None,
    );
    let label_type = |values: ArrayRef, lens: &[i32]| ree(lens, values);
    let labels = StructArray::new(
        Fields::from(vec![
            Field::new(
                "node",
                label_type(dict(vec![Some(0)], &["arrow-node"]), &[3])
                    .data_type()
                    .clone(),
                true,
            ),
            Field::new(
                "thread_name",
                label_type(dict(vec![Some(0)], &["worker"]), &[3])
                    .data_type()
                    .clone(),
                true,
            ),
        ]),
        vec![
            label_type(dict(vec![Some(0)], &["arrow-node"]), &[3]),
            label_type(dict(vec![Some(0), Some(1)], &["worker", "main"]), &[2, 1]),
        ],
        None,
    );
    // Two CPU samples (7 and 3) and one off-CPU sample (1.5 ms).
    let values = Int64Array::from(vec![7, 3, 1_500_000]);
    let (cpu, off_cpu) = (10, 1_500_000);
    let uuid = FixedSizeBinaryArray::try_from_iter((0u8..3).map(|i| [i; 16])).unwrap();
    let columns: Vec<(Field, ArrayRef)> = vec![
        (
            Field::new(wire::LABELS, labels.data_type().clone(), false),
            Arc::new(labels),
        ),
        (
            Field::new(wire::STACKTRACE, stacks.data_type().clone(), true),
            Arc::new(stacks),
        ),
        (
            Field::new(wire::STACKTRACE_ID, DataType::FixedSizeBinary(16), false).with_metadata(
                [("ARROW:extension:name".to_owned(), "arrow.uuid".to_owned())].into(),
            ),
            Arc::new(uuid),
        ),
        (
            Field::new(wire::VALUE, DataType::Int64, false),
            Arc::new(values),
        ),
        (wire::PRODUCER, ree(&[3], strings(&["parca_agent"]))).into_field(),
        (
            wire::SAMPLE_TYPE,
            ree(&[2, 1], strings(&["samples", "wallclock"])),
        )
            .into_field(),
        (
            wire::SAMPLE_UNIT,
            ree(&[2, 1], strings(&["count", "nanoseconds"])),
        )
            .into_field(),
        (
            wire::PERIOD_TYPE,
            ree(&[2, 1], strings(&["cpu", "samples"])),
        )
            .into_field(),
        (
            wire::PERIOD_UNIT,
            ree(&[2, 1], strings(&["nanoseconds", "count"])),
        )
            .into_field(),
        (wire::TEMPORALITY, ree(&[3], strings(&["delta"]))).into_field(),
        (
            wire::PERIOD,
            ree(&[2, 1], Arc::new(Int64Array::from(vec![52_631_578, 1]))),
        )
            .into_field(),
        (
            wire::DURATION,
            ree(&[3], Arc::new(UInt64Array::from(vec![1_000_000_000]))),
        )
            .into_field(),
        (
            Field::new(
                wire::TIMESTAMP,
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Arc::new(TimestampNanosecondArray::from(times.to_vec()).with_timezone("UTC")),
        ),
    ];
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    let schema = Arc::new(
        Schema::new(fields)
            .with_metadata([("parca_write_schema_version".to_owned(), "v2".to_owned())].into()),
    );
    let batch = arrow::array::RecordBatch::try_new(schema.clone(), arrays).unwrap();
    let options = arrow::ipc::writer::IpcWriteOptions::default()
        .try_with_compression(Some(arrow::ipc::CompressionType::LZ4_FRAME))
        .unwrap();
    let mut out = Vec::new();
    let mut writer =
        arrow::ipc::writer::StreamWriter::try_new_with_options(&mut out, &schema, options).unwrap();
    writer.write(&batch).unwrap();
    writer.finish().unwrap();
    drop(writer);
    (out, cpu, off_cpu)
}

/// A column of the record: its field (nullable, named) and array.
pub trait IntoField {
    /// The column.
    fn into_field(self) -> (arrow::datatypes::Field, arrow::array::ArrayRef);
}

impl IntoField for (&str, arrow::array::ArrayRef) {
    fn into_field(self) -> (arrow::datatypes::Field, arrow::array::ArrayRef) {
        (
            arrow::datatypes::Field::new(self.0, self.1.data_type().clone(), true),
            self.1,
        )
    }
}

/// The two records of a `Write` stream as Parca Agent v0.32 to v0.47 sends them
/// (`reporter/arrow.go` at v0.49.0, `6ed23c1092ecd07cb6068c73b3e667e8fb04a748`, schema
/// `v1`): the samples (labels as `labels.<name>` columns and the types as run-end encoded
/// dictionaries of binary, each row's stack a 16-byte stack trace id) and, sent once the
/// server asks for their ids, the locations of each stack (native frames an address in a
/// mapping with `build_id`, kernel and Python frames with their function). Returns both
/// records, the ids in the order the samples name them, and the CPU and off-CPU totals.
pub fn parca_agent_v1_records(build_id: &str) -> (Vec<u8>, Vec<u8>, Vec<Vec<u8>>, i64, i64) {
    use crate::convert::parca::wire;
    use std::sync::Arc;

    use arrow::array::{
        Array, ArrayRef, BinaryArray, BooleanArray, DictionaryArray, Int32Array, Int64Array,
        ListArray, RunArray, StructArray, UInt32Array, UInt64Array,
    };
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::{Field, Fields, Int32Type, Schema, UInt32Type};

    let runs = |n: usize| Int32Array::from_iter_values(1..=n as i32);
    // A run per row, of a dictionary of binary (None: null).
    let ree_bin = |values: &[Option<&[u8]>]| -> ArrayRef {
        let keys: UInt32Array = (0..values.len() as u32)
            .map(|k| values[k as usize].map(|_| k))
            .collect();
        let dict = DictionaryArray::<UInt32Type>::try_new(
            keys,
            Arc::new(BinaryArray::from_iter_values(
                values.iter().map(|v| v.unwrap_or_default()),
            )),
        )
        .unwrap();
        Arc::new(RunArray::<Int32Type>::try_new(&runs(values.len()), &dict).unwrap())
    };
    let ree_i64 = |values: &[i64]| -> ArrayRef {
        let v = Int64Array::from(values.to_vec());
        Arc::new(RunArray::<Int32Type>::try_new(&runs(values.len()), &v).unwrap())
    };
    let ree_u64 = |values: &[u64]| -> ArrayRef {
        let v = UInt64Array::from(values.to_vec());
        Arc::new(RunArray::<Int32Type>::try_new(&runs(values.len()), &v).unwrap())
    };
    let dict_bin = |values: &[&[u8]]| -> ArrayRef {
        Arc::new(
            DictionaryArray::<UInt32Type>::try_new(
                UInt32Array::from_iter_values(0..values.len() as u32),
                Arc::new(BinaryArray::from_iter_values(values.iter())),
            )
            .unwrap(),
        )
    };
    let with_fields = |columns: Vec<(&str, ArrayRef)>| -> (Vec<Field>, Vec<ArrayRef>) {
        columns
            .into_iter()
            .map(|(name, a)| (Field::new(name, a.data_type().clone(), true), a))
            .unzip()
    };
    let ipc = |fields: Vec<Field>, arrays: Vec<ArrayRef>| -> Vec<u8> {
        let schema = Arc::new(
            Schema::new(fields)
                .with_metadata([("parca_write_schema_version".to_owned(), "v1".to_owned())].into()),
        );
        let batch = arrow::array::RecordBatch::try_new(schema.clone(), arrays).unwrap();
        let mut out = Vec::new();
        let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &schema).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        drop(w);
        out
    };

    let (a, b) = (vec![0xa1u8; 16], vec![0xb2u8; 16]);
    let (node, thread_name) = (
        format!("{}.node", wire::LABELS),
        format!("{}.thread_name", wire::LABELS),
    );
    // Samples: stack A on CPU (7), B on CPU (3), A off CPU (1.5 ms).
    let (samples_fields, samples_arrays) = with_fields(vec![
        (
            node.as_str(),
            ree_bin(&[Some(b"v1-node"), Some(b"v1-node"), Some(b"v1-node")]),
        ),
        (
            thread_name.as_str(),
            ree_bin(&[Some(b"worker"), Some(b"main"), Some(b"worker")]),
        ),
        (
            wire::STACKTRACE_ID,
            ree_bin(&[Some(&a), Some(&b), Some(&a)]),
        ),
        (
            wire::VALUE,
            Arc::new(Int64Array::from(vec![7, 3, 1_500_000])),
        ),
        (
            wire::PRODUCER,
            ree_bin(&[Some(b"parca_agent".as_slice()); 3]),
        ),
        (
            wire::SAMPLE_TYPE,
            ree_bin(&[Some(b"samples"), Some(b"samples"), Some(b"wallclock")]),
        ),
        (
            wire::SAMPLE_UNIT,
            ree_bin(&[Some(b"count"), Some(b"count"), Some(b"nanoseconds")]),
        ),
        (
            wire::PERIOD_TYPE,
            ree_bin(&[Some(b"cpu"), Some(b"cpu"), Some(b"samples")]),
        ),
        (
            wire::PERIOD_UNIT,
            ree_bin(&[Some(b"nanoseconds"), Some(b"nanoseconds"), Some(b"count")]),
        ),
        (wire::TEMPORALITY, ree_bin(&[Some(b"delta".as_slice()); 3])),
        (wire::PERIOD, ree_i64(&[52_631_578, 52_631_578, 1])),
        (wire::DURATION, ree_i64(&[1_000_000_000; 3])),
        (
            wire::TIMESTAMP,
            ree_i64(&[
                1_763_805_600_000_000_000,
                1_763_805_601_000_000_000,
                1_763_805_602_000_000_000,
            ]),
        ),
    ]);
    let samples = ipc(samples_fields, samples_arrays);

    // Lines of the kernel and Python frames.
    let (line_fields, line_arrays) = with_fields(vec![
        ("line", Arc::new(Int64Array::from(vec![0, 42]))),
        ("column", Arc::new(UInt64Array::from(vec![0, 7]))),
        ("function_name", dict_bin(&[b"do_syscall_64", b"handler"])),
        (
            "function_system_name",
            dict_bin(&[b"do_syscall_64", b"handler"]),
        ),
        (
            "function_filename",
            ree_bin(&[Some(b"vmlinux"), Some(b"app.py")]),
        ),
        (
            "function_start_line",
            Arc::new(Int64Array::from(vec![0, 40])),
        ),
    ]);
    let lines = StructArray::new(Fields::from(line_fields), line_arrays, None);
    // Locations of A (three native frames) and B (kernel, Python, native).
    // (frame type, mapping file, build id)
    type Kind<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, Option<&'a [u8]>);
    let app: Kind<'_> = (Some(b"native"), Some(b"app"), Some(build_id.as_bytes()));
    let frames: Vec<(u64, Kind<'_>)> = vec![
        (0x1140, app),
        (0x11a0, app),
        (0x1220, app),
        (
            0xffff_ffff_8100_0000,
            (Some(b"kernel"), Some(b"[kernel.kallsyms]"), None),
        ),
        (0, (Some(b"cpython"), None, None)),
        (0x1220, app),
    ];
    let line_field = Arc::new(Field::new("item", lines.data_type().clone(), true));
    let location_lines = ListArray::new(
        line_field,
        OffsetBuffer::new(vec![0, 0, 0, 0, 1, 2, 2].into()),
        Arc::new(lines),
        Some(vec![false, false, false, true, true, false].into()),
    );
    let (location_fields, location_arrays) = with_fields(vec![
        (
            "address",
            Arc::new(UInt64Array::from(
                frames.iter().map(|f| f.0).collect::<Vec<_>>(),
            )),
        ),
        (
            "frame_type",
            ree_bin(&frames.iter().map(|f| f.1.0).collect::<Vec<_>>()),
        ),
        ("mapping_start", ree_u64(&[0; 6])),
        ("mapping_limit", ree_u64(&[0; 6])),
        ("mapping_offset", ree_u64(&[0; 6])),
        (
            "mapping_file",
            ree_bin(&frames.iter().map(|f| f.1.1).collect::<Vec<_>>()),
        ),
        (
            "mapping_build_id",
            ree_bin(&frames.iter().map(|f| f.1.2).collect::<Vec<_>>()),
        ),
        ("lines", Arc::new(location_lines)),
    ]);
    let locations = StructArray::new(Fields::from(location_fields), location_arrays, None);
    let location_field = Arc::new(Field::new("item", locations.data_type().clone(), true));
    let stacks = ListArray::new(
        location_field,
        OffsetBuffer::new(vec![0, 3, 6].into()),
        Arc::new(locations),
        None,
    );
    let (fields, arrays) = with_fields(vec![
        (
            wire::STACKTRACE_ID,
            Arc::new(BinaryArray::from_iter_values([&a, &b])),
        ),
        (
            "is_complete",
            Arc::new(BooleanArray::from(vec![true, true])),
        ),
        (wire::LOCATIONS, Arc::new(stacks)),
    ]);
    let locations = ipc(fields, arrays);
    (samples, locations, vec![a, b], 10, 1_500_000)
}
