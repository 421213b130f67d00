//! Stacks too deep to show: ingest counts a stack's frames with its inlined lines, and data
//! stored under a larger limit (as an older store holds it) is still answered by every
//! report, cut to `report::MAX_STACK_DEPTH` frames with a marker frame, on a thread whose
//! stack is small enough that any recursion over frames would overflow it.

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::proto::{Function, Line, Location, Profile, Sample, ValueType};
use frostdb_pprof::report::pyroscope::{Levels, tree_bytes};
use frostdb_pprof::report::top::TopTable;
use frostdb_pprof::report::tree::{self, FlameGraph};
use frostdb_pprof::report::{self, Format, MAX_STACK_DEPTH, RenderOptions};
use frostdb_pprof::{
    Error, IngestOptions, Limits, Merged, ProfileStore, StoreOptions, decode, validate,
};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;
use prost::Message;

/// A profile of one deep stack of `locations` locations of `lines` lines each (calls
/// inlined into the location's outermost): the root's is `main` (with `main_inlined{j}`
/// inlined), the others `f{k}_{j}`; with `distinct` false every location but the root is the
/// same one (a recursion), as a small hostile profile would be. Plus a shallow stack, `main`
/// and `shallow`. Values 7 (deep) and 5.
fn deep_profile(locations: usize, lines: usize, distinct: bool) -> Profile {
    let mut p = Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        period_type: Some(ValueType { r#type: 1, unit: 2 }),
        period: 1,
        string_table: vec![String::new(), "cpu".into(), "nanoseconds".into()],
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    // A location of functions named `names`, innermost first; its id.
    let location = |p: &mut Profile, names: Vec<String>| {
        let mut line = Vec::with_capacity(names.len());
        for (j, name) in names.into_iter().enumerate() {
            p.string_table.push(name);
            let id = p.function.len() as u64 + 1;
            let name = p.string_table.len() as i64 - 1;
            p.function.push(Function {
                id,
                name,
                system_name: name,
                ..Default::default()
            });
            line.push(Line {
                function_id: id,
                line: j as i64 + 1,
                column: 0,
            });
        }
        let id = p.location.len() as u64 + 1;
        p.location.push(Location {
            id,
            address: 0x1000 + id,
            line,
            ..Default::default()
        });
        id
    };
    let main_names = (1..lines)
        .rev()
        .map(|j| format!("main_inlined{j}"))
        .chain(["main".to_owned()])
        .collect();
    let main = location(&mut p, main_names);
    let shallow = location(&mut p, vec!["shallow".into()]);
    let mut deep = Vec::with_capacity(locations);
    for k in 0..locations - 1 {
        if distinct || k == 0 {
            deep.push(location(
                &mut p,
                (0..lines).map(|j| format!("f{k}_{j}")).collect(),
            ));
        } else {
            deep.push(deep[0]);
        }
    }
    // Leaf first.
    deep.reverse();
    deep.push(main);
    p.sample = vec![
        Sample {
            location_id: deep,
            value: vec![7],
            label: Vec::new(),
        },
        Sample {
            location_id: vec![shallow, main],
            value: vec![5],
            label: Vec::new(),
        },
    ];
    p
}

/// The deep profiles stored, by name: locations and lines each, whether distinct, and the
/// marker a report ends the stack with (at most `MAX_STACK_DEPTH` frames, the marker
/// included, cut between locations).
const STORED: [(&str, usize, usize, bool, &str); 3] = [
    // 100,000 frames of one recursive location below main: 4,095 kept.
    ("recursive", 100_000, 1, false, "[truncated: 95,905 frames]"),
    // 100,000 frames: 2,047 locations (4,094 frames) kept.
    ("inlined", 50_000, 2, true, "[truncated: 95,906 frames]"),
    // 120,000 frames: 1,365 locations (4,095 frames) kept.
    ("inlined3", 40_000, 3, true, "[truncated: 115,905 frames]"),
];

fn open(dir: &std::path::Path) -> ProfileStore {
    let options = StoreOptions::default().limits(Limits {
        max_stack_depth: 200_000,
        ..Default::default()
    });
    ProfileStore::open(Db::open(dir, DbOptions::default()).unwrap(), options).unwrap()
}

fn merge(store: &ProfileStore, name: &str) -> Merged {
    let selector = Selector::parse(&format!("{name}:cpu:nanoseconds:cpu:nanoseconds")).unwrap();
    let merged = store.merge(&selector, TimeRange::ALL).unwrap();
    assert_eq!(merged.total(), 12, "{name}");
    merged
}

/// Whether `json` nests its brackets properly (outside strings), and how deep.
fn json_depth(json: &[u8]) -> usize {
    let (mut depth, mut most, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                most = most.max(depth);
            }
            b'}' | b']' => depth = depth.checked_sub(1).expect("a bracket closes none"),
            _ => {}
        }
    }
    assert_eq!(depth, 0, "unclosed brackets");
    most
}

/// Every report of `merged` (a deep stack of value 7 ending in `marker` after
/// `MAX_STACK_DEPTH - 1` frames or fewer, and a shallow one of 5), each checked.
fn check_reports(merged: &Merged, marker: &str, what: &str) {
    let total = merged.total();
    let options = RenderOptions::default();
    let render = |format| report::render(merged, format, &options).unwrap();

    // The flame graph: the deepest node is the marker, self 7, at most MAX_STACK_DEPTH
    // below the root; every node's total is its self plus its callees'.
    let graph = FlameGraph::build(merged);
    assert_eq!(graph.root().total(), total, "{what}");
    let deepest = graph.tree.nodes().max_by_key(|n| n.depth()).expect("nodes");
    assert_eq!(deepest.name(), marker, "{what}");
    assert_eq!((deepest.self_value(), deepest.total()), (7, 7), "{what}");
    assert!(
        deepest.depth() <= MAX_STACK_DEPTH,
        "{what}: {}",
        deepest.depth()
    );
    assert!(
        deepest.depth() > MAX_STACK_DEPTH - 4,
        "{what}: {}",
        deepest.depth()
    );
    for node in graph.tree.nodes() {
        let below: i64 = node.children().map(|c| c.total()).sum();
        assert_eq!(node.total(), node.self_value() + below, "{what}");
    }
    let path: Vec<&str> = std::iter::successors(Some(deepest), |n| n.parent())
        .map(|n| n.name())
        .collect();
    assert_eq!(
        path[path.len() - 2],
        "main",
        "{what}: root-most frames kept"
    );

    let json = render(Format::FlameGraph);
    assert_eq!(json, graph.to_json(), "{what}");
    let marker_json = format!("{{\"name\":\"{marker}\",\"self\":7,\"total\":7}}");
    assert!(
        String::from_utf8_lossy(&json).contains(&marker_json),
        "{what}: the JSON lacks {marker_json}"
    );
    // Two levels of brackets per node (the node, its `children`), plus the graph's own.
    assert_eq!(json_depth(&json), 2 * deepest.depth() + 2, "{what}");

    let arrow = graph.to_arrow().unwrap();
    assert_eq!(arrow.num_rows(), graph.tree.node_count(), "{what}");

    let svg = String::from_utf8(render(Format::Svg)).unwrap();
    assert!(svg.contains(marker) && svg.ends_with("</svg>\n"), "{what}");

    // Pyroscope's levels: one per depth, the marker's self the largest.
    let levels = Levels::of(&graph);
    assert_eq!(levels.levels.len(), deepest.depth() + 1, "{what}");
    assert_eq!((levels.total, levels.max_self), (total, 7), "{what}");
    assert!(levels.names.iter().any(|n| n == marker), "{what}");
    let bytes = tree_bytes(&graph);
    assert!(
        bytes.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "{what}"
    );

    // The top table: the marker is a function whose flat is the deep stack's value.
    let top = TopTable::build(merged);
    assert_eq!(top.total, total, "{what}");
    let row = top
        .rows
        .iter()
        .find(|r| r.name == marker)
        .expect("marker row");
    assert_eq!((row.flat, row.cum), (7, 7), "{what}");
    let text = String::from_utf8(render(Format::TopText)).unwrap();
    assert!(text.contains(marker), "{what}");
    let top_json = String::from_utf8(render(Format::Top)).unwrap();
    assert!(top_json.contains(marker), "{what}");

    // Folded stacks: the deep line ends in the marker, and the values add up.
    let folded = String::from_utf8(render(Format::Folded)).unwrap();
    let mut sum = 0;
    for line in folded.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap();
        sum += value.parse::<i64>().unwrap();
        let frames: Vec<&str> = stack.split(';').collect();
        assert!(frames.len() <= MAX_STACK_DEPTH, "{what}");
        assert_eq!(frames[0], "main", "{what}");
        assert_eq!(frames[frames.len() - 1] == marker, value == "7", "{what}");
    }
    assert_eq!(sum, total, "{what}");
    tree::each_named_stack(merged, |path, value| {
        assert_eq!(path.last() == Some(&marker), value == 7, "{what}");
        if value == 7 {
            assert_eq!(path.len(), deepest.depth(), "{what}");
        }
    });
    let under_main = tree::select_call_site(merged.clone(), &["main"]);
    assert_eq!(under_main.total(), total, "{what}");

    // pprof: the cut stack is at most MAX_STACK_DEPTH frames, so the default limits take
    // the export back; its leaf is the marker.
    let pprof = decode(&render(Format::Pprof), &Limits::default()).unwrap();
    let pprof = pprof.into_inner();
    let deep = pprof.sample.iter().find(|s| s.value == [7]).expect("deep");
    let leaf = &pprof.location[deep.location_id[0] as usize - 1];
    let leaf_name = pprof.function[leaf.line[0].function_id as usize - 1].name;
    assert_eq!(pprof.string_table[leaf_name as usize], marker, "{what}");
    let frames: usize = deep
        .location_id
        .iter()
        .map(|&id| pprof.location[id as usize - 1].line.len())
        .sum();
    assert_eq!(frames, deepest.depth(), "{what}: pprof frames");

    let dot = String::from_utf8(render(Format::Dot)).unwrap();
    assert!(dot.contains(marker), "{what}");

    // The diff of the profile against itself: both sides exact, the marker at the bottom.
    let diff = tree::diff(merged, merged);
    let root = diff.root();
    assert_eq!((root.base(), root.compare()), (total, total), "{what}");
    assert_eq!(diff.max_depth(), deepest.depth(), "{what}");
    assert!(
        diff.nodes()
            .any(|n| n.name() == marker && n.base_self() == 7)
    );
    let diff_json = diff.to_json();
    assert_eq!(json_depth(&diff_json), 2 * deepest.depth() + 1, "{what}");
    let levels = Levels::of_diff(&diff, tree::DEFAULT_MAX_NODES);
    assert_eq!(levels.total, 2 * total, "{what}");
    assert_eq!(levels.levels.len(), deepest.depth() + 1, "{what}");
}

/// Runs `f` on a thread with a 256 KiB stack: recursion over thousands of frames overflows
/// it (and aborts the test process).
fn on_small_stack(f: impl FnOnce() + Send) {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn_scoped(s, f)
            .unwrap()
            .join()
            .unwrap()
    });
}

#[test]
fn every_report_of_a_stored_stack_too_deep_is_cut_with_a_marker_and_totals_exact() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        for (name, locations, lines, distinct, _) in STORED {
            let bytes = deep_profile(locations, lines, distinct).encode_to_vec();
            // Over the default limit...
            let e = decode(&bytes, &Limits::default()).unwrap_err();
            assert!(matches!(e, Error::TooLarge { limit: 4096, .. }), "{e}");
            // ...but stored under a larger one, as an older store holds it.
            let options = IngestOptions::default().name(name);
            store.ingest(&bytes, &options).unwrap();
        }
        for (name, _, _, _, marker) in STORED {
            let merged = merge(&store, name);
            on_small_stack(|| check_reports(&merged, marker, name));
        }
        store.db().flush().unwrap();
    }
    // Read back from the persisted blocks and symbol tables.
    let store = open(dir.path());
    for (name, _, _, _, marker) in STORED {
        let merged = merge(&store, name);
        on_small_stack(|| check_reports(&merged, marker, &format!("{name}, reopened")));
    }
}

#[test]
fn the_ingest_depth_limit_counts_inlined_frames() {
    let too_deep = |e: Error| {
        assert!(
            matches!(
                e,
                Error::TooLarge {
                    what: "stack depth",
                    limit: 4096
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "stack depth exceeds the limit of 4096");
        assert_eq!(e.kind(), frostdb_core::ErrorKind::LimitExceeded);
    };
    // About 33 KB of hostile profile: 4,096 locations of 2 lines are 8,192 frames.
    let hostile = deep_profile(4096, 2, false).encode_to_vec();
    assert!(hostile.len() < 40_000, "{}", hostile.len());
    too_deep(decode(&hostile, &Limits::default()).unwrap_err());
    too_deep(validate(deep_profile(4096, 2, true), &Limits::default()).unwrap_err());

    // 2,048 locations of 2 lines: exactly 4,096 frames.
    let accepted = deep_profile(2048, 2, false);
    decode(&accepted.encode_to_vec(), &Limits::default()).unwrap();
    validate(deep_profile(2048, 2, true), &Limits::default()).unwrap();
    // One line more anywhere is one frame too many...
    let mut over = deep_profile(2048, 2, true);
    let inner = over.location[5].line[0];
    over.location[5].line.push(inner);
    too_deep(validate(over, &Limits::default()).unwrap_err());
    // ...as is a location without lines (one frame).
    let mut bare = deep_profile(2048, 2, true);
    let id = bare.location.len() as u64 + 1;
    bare.location.push(Location {
        id,
        ..Default::default()
    });
    bare.sample[0].location_id.insert(0, id);
    too_deep(validate(bare, &Limits::default()).unwrap_err());

    // The store refuses it with the same error, and takes the one within the limit.
    let dir = tempfile::tempdir().unwrap();
    let store = ProfileStore::open(
        Db::open(dir.path(), DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let options = IngestOptions::default().name("hostile");
    too_deep(store.ingest(&hostile, &options).unwrap_err());
    store.ingest(&accepted.encode_to_vec(), &options).unwrap();
}
