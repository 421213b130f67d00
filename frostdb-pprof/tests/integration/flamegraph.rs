//! Flame graphs truncated to `max_nodes`, on every real profile of shared/testdata:
//! `max_nodes` named nodes (or all), the largest ones, each with the values it has in the
//! full graph; the callees left out summed into one `other` per parent, so every total stays
//! exact. Their JSON, and diffs', byte for byte what serde wrote for nested trees.

use crate::common;

use std::collections::HashMap;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::report::tree::{self, FlameGraph, FlameValues, Node, OTHER};
use frostdb_pprof::{IngestOptions, Merged, ProfileStore, StoreOptions};
use frostdb_profile::Selector;
use frostdb_profile::TimeRange;

/// The nodes of a full graph below the root, numbered depth first from 1 (0: the root),
/// found by (parent's number, name).
struct Numbered<'a> {
    ids: HashMap<(usize, &'a str), usize>,
    /// (self, total) by number.
    values: Vec<(i64, i64)>,
}

impl<'a> Numbered<'a> {
    fn new(root: Node<'a, FlameValues>) -> Self {
        let mut out = Numbered {
            ids: HashMap::new(),
            values: vec![(root.self_value(), root.total())],
        };
        let mut stack = vec![(root, 0usize)];
        while let Some((node, id)) = stack.pop() {
            for child in node.children() {
                let child_id = out.values.len();
                out.values.push((child.self_value(), child.total()));
                assert!(out.ids.insert((id, child.name()), child_id).is_none());
                stack.push((child, child_id));
            }
        }
        out
    }

    fn len(&self) -> usize {
        self.values.len() - 1
    }
}

/// Checks `truncated` against the full graph for `max_nodes`; returns how many nodes it
/// named.
fn check(all: &Numbered<'_>, truncated: &FlameGraph, max_nodes: usize, what: &str) -> usize {
    assert_eq!(
        truncated.root().total(),
        all.values[0].1,
        "{what}: root total"
    );
    let mut kept = vec![false; all.values.len()];
    let mut others = 0;
    let mut stack = vec![(truncated.root(), 0usize)];
    while let Some((node, id)) = stack.pop() {
        // Every node's total is its self plus its callees' totals, `other` included.
        let below: i64 = node.children().map(|c| c.total()).sum();
        assert_eq!(
            node.total(),
            node.self_value() + below,
            "{what}: {}",
            node.name()
        );
        for child in node.children() {
            match all.ids.get(&(id, child.name())) {
                Some(&child_id) => {
                    assert_eq!(
                        (child.self_value(), child.total()),
                        all.values[child_id],
                        "{what}: {} differs from the full graph",
                        child.name()
                    );
                    kept[child_id] = true;
                    stack.push((child, child_id));
                }
                None => {
                    assert_eq!(
                        child.name(),
                        OTHER,
                        "{what}: {} is not in the full graph",
                        child.name()
                    );
                    assert!(!child.has_children(), "{what}: `other` has callees");
                    others += 1;
                }
            }
        }
    }
    let named = kept.iter().filter(|k| **k).count();
    assert_eq!(named, max_nodes.min(all.len()), "{what}: named nodes");
    assert_eq!(
        named + truncated.truncated,
        all.len(),
        "{what}: nodes unaccounted for"
    );
    assert!(
        others <= named + 1,
        "{what}: more `other` nodes than parents"
    );
    // The nodes left out are never larger than the ones kept.
    let kept = &kept;
    let totals = |keep: bool| {
        (1..all.values.len())
            .filter(move |&i| kept[i] == keep)
            .map(|i| all.values[i].1)
    };
    if let (Some(dropped), Some(smallest)) = (totals(false).max(), totals(true).min()) {
        assert!(
            dropped <= smallest,
            "{what}: a node of total {dropped} left out, one of {smallest} kept"
        );
    }
    named
}

/// Every real profile of shared/testdata stored (as `f{i}`) and merged, per profile type:
/// `("file profile_type", merge)`.
fn testdata_merges() -> Vec<(String, Merged)> {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let mut merges = Vec::new();
    for (i, (name, bytes)) in common::testdata().into_iter().enumerate() {
        let summary = store
            .ingest(&bytes, &IngestOptions::default().name(format!("f{i}")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for profile_type in &summary.profile_types {
            let merged = store
                .merge(&Selector::parse(profile_type).unwrap(), TimeRange::ALL)
                .unwrap();
            merges.push((format!("{name} {profile_type}"), merged));
        }
    }
    merges
}

#[test]
fn truncated_flame_graphs_keep_the_largest_nodes_and_every_total() {
    let mut truncated_somewhere = 0;
    for (name, merged) in testdata_merges() {
        let full = FlameGraph::build(&merged);
        assert_eq!(full.truncated, 0);
        assert_eq!(full.root().total(), merged.total(), "{name}");
        let all = Numbered::new(full.root());
        for max_nodes in [0, 1, 7, 100, all.len() / 2, all.len()] {
            let what = format!("{name} max_nodes={max_nodes}");
            let truncated = FlameGraph::build_truncated(&merged, max_nodes);
            if check(&all, &truncated, max_nodes, &what) < all.len() {
                truncated_somewhere += 1;
            }
        }
        assert_eq!(FlameGraph::build_truncated(&merged, all.len()), full);
    }
    assert!(
        truncated_somewhere > 100,
        "only {truncated_somewhere} graphs truncated"
    );
}

/// The JSON of flame graphs and diffs as serde's derive wrote it from the nested structs
/// trees were before they were flat: what the web page and API clients read. The trees'
/// own writers must produce exactly these bytes.
mod nested {
    use frostdb_pprof::report::tree::{DiffTree, DiffValues, FlameGraph, FlameValues, Node};
    use serde::Serialize;

    #[derive(Serialize)]
    pub(crate) struct Graph {
        profile_type: String,
        unit: String,
        root: FlameNode,
        #[serde(skip_serializing_if = "is_zero")]
        truncated: usize,
    }

    fn is_zero(n: &usize) -> bool {
        *n == 0
    }

    #[derive(Serialize)]
    struct FlameNode {
        name: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        filename: String,
        #[serde(rename = "self")]
        self_value: i64,
        total: i64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        children: Vec<FlameNode>,
    }

    #[derive(Serialize)]
    pub(crate) struct Diff {
        name: String,
        base: i64,
        compare: i64,
        base_self: i64,
        compare_self: i64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        children: Vec<Diff>,
    }

    // Recursive: real profiles are shallow.
    fn flame(n: Node<'_, FlameValues>) -> FlameNode {
        FlameNode {
            name: n.name().to_owned(),
            filename: n.filename().to_owned(),
            self_value: n.self_value(),
            total: n.total(),
            children: n.children().map(flame).collect(),
        }
    }

    pub(crate) fn graph(g: &FlameGraph) -> Graph {
        Graph {
            profile_type: g.profile_type.clone(),
            unit: g.unit.clone(),
            root: flame(g.root()),
            truncated: g.truncated,
        }
    }

    fn diff_node(n: Node<'_, DiffValues>) -> Diff {
        Diff {
            name: n.name().to_owned(),
            base: n.base(),
            compare: n.compare(),
            base_self: n.base_self(),
            compare_self: n.compare_self(),
            children: n.children().map(diff_node).collect(),
        }
    }

    pub(crate) fn diff(d: &DiffTree) -> Diff {
        diff_node(d.root())
    }
}

#[test]
fn flame_graph_and_diff_json_is_what_serde_wrote_for_the_nested_trees() {
    let (mut graphs, mut diffs) = (0, 0);
    for (name, merged) in testdata_merges() {
        for max_nodes in [0, 7, 100, usize::MAX] {
            let graph = FlameGraph::build_truncated(&merged, max_nodes);
            let want = serde_json::to_vec(&nested::graph(&graph)).unwrap();
            assert!(graph.to_json() == want, "{name} {max_nodes}");
            graphs += 1;
        }
        // The stacks under the first stack's root frame, against all of them.
        let mut first = None;
        tree::each_named_stack(&merged, |path, _| {
            first = first.take().or_else(|| path.first().map(|f| f.to_string()))
        });
        let part = tree::select_call_site(merged.clone(), &[first.as_deref().unwrap_or("")]);
        for (base, compare) in [(&part, &merged), (&merged, &part)] {
            let diff = tree::diff(base, compare);
            let want = serde_json::to_vec(&nested::diff(&diff)).unwrap();
            assert!(diff.to_json() == want, "{name} diff");
            diffs += 1;
        }
    }
    assert!(
        graphs > 200 && diffs > 100,
        "{graphs} graphs, {diffs} diffs"
    );
}

#[test]
fn names_are_escaped_as_serde_escapes_them() {
    use frostdb_pprof::proto::{Function, Line, Location, Profile, Sample, ValueType};
    let names = [
        "main",
        "quote\"back\\slash",
        "new\nline\ttab\u{1}\u{7f}",
        "é ☃ 🦀 </script>",
        "",
    ];
    let mut strings = vec![String::new(), "cpu".into(), "nanoseconds".into()];
    strings.extend(names.iter().map(|n| n.to_string()));
    strings.push("dir/\"file\".go".into());
    let file = strings.len() as i64 - 1;
    let p = Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        function: (0..names.len())
            .map(|i| Function {
                id: i as u64 + 1,
                name: 3 + i as i64,
                filename: if i % 2 == 0 { file } else { 0 },
                ..Default::default()
            })
            .collect(),
        location: (0..names.len())
            .map(|i| Location {
                id: i as u64 + 1,
                address: 0x40 + i as u64,
                line: vec![Line {
                    function_id: i as u64 + 1,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            })
            .collect(),
        sample: (1..=names.len() as u64)
            .map(|leaf| Sample {
                location_id: (1..=leaf).rev().collect(),
                value: vec![leaf as i64],
                label: Vec::new(),
            })
            .collect(),
        string_table: strings,
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let options = IngestOptions::default().name("names");
    let summary = store
        .ingest(&prost::Message::encode_to_vec(&p), &options)
        .unwrap();
    let selector = Selector::parse(&summary.profile_types[0]).unwrap();
    let merged = store.merge(&selector, TimeRange::ALL).unwrap();
    let graph = FlameGraph::build(&merged);
    assert_eq!(graph.tree.node_count(), names.len() + 1);
    let want = serde_json::to_vec(&nested::graph(&graph)).unwrap();
    assert_eq!(
        String::from_utf8(graph.to_json()).unwrap(),
        String::from_utf8(want).unwrap()
    );
    let diff = tree::diff(&merged, &Merged::empty(merged.profile_type.clone()));
    let want = serde_json::to_vec(&nested::diff(&diff)).unwrap();
    assert_eq!(
        String::from_utf8(diff.to_json()).unwrap(),
        String::from_utf8(want).unwrap()
    );
}

/// The stacks of a report (and the count of its frame bytes before it) stop once the
/// request they are for has ended (its deadline, or its client gone): within a thousand
/// stacks, not after the last of a billion frames, in the slot of a query lane. Without a
/// request to answer to, every stack is walked.
#[test]
fn named_stacks_stop_once_the_request_has_ended() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let profile = frostdb_pprof::testing::profile(0, 5_000, 3);
    let options = IngestOptions::default().name("cpu");
    store
        .ingest(&prost::Message::encode_to_vec(&profile), &options)
        .unwrap();
    let merged = store
        .merge(
            &Selector::parse("cpu:cpu:nanoseconds:cpu:nanoseconds").unwrap(),
            TimeRange::ALL,
        )
        .unwrap();
    let stacks = merged.samples.len();
    assert!(stacks > 2_048, "{stacks} stacks");
    let mut walked = 0;
    tree::each_named_stack(&merged, |_, _| walked += 1);
    assert_eq!(walked, stacks);
    let mut walked = 0;
    frostdb_core::stop_scans_when(
        || Some("the request ended".into()),
        || tree::each_named_stack(&merged, |_, _| walked += 1),
    );
    assert!(walked < 1_024, "{walked} of {stacks} stacks walked");
    // So does the count of a report's frame bytes that comes before it.
    let all = merged.frame_bytes();
    let counted =
        frostdb_core::stop_scans_when(|| Some("the request ended".into()), || merged.frame_bytes());
    assert!(counted < all / 2, "{counted} of {all} bytes counted");
}

/// Flat, cum and the calls between functions, as a model computes them from the named
/// stacks: a function (and a call) counted once per stack, however often it recurs.
type Calls = std::collections::BTreeMap<(String, String), i64>;

fn dot_model(merged: &Merged) -> (std::collections::BTreeMap<String, (i64, i64)>, Calls) {
    let mut nodes = std::collections::BTreeMap::<String, (i64, i64)>::new();
    let mut calls = Calls::new();
    tree::each_named_stack(merged, |path, value| {
        let mut seen = std::collections::HashSet::new();
        let mut seen_calls = std::collections::HashSet::new();
        if let Some(leaf) = path.last() {
            nodes.entry(leaf.to_string()).or_default().0 += value;
        }
        for (i, name) in path.iter().enumerate() {
            if seen.insert(*name) {
                nodes.entry(name.to_string()).or_default().1 += value;
            }
            if i > 0 && seen_calls.insert((path[i - 1], *name)) {
                *calls
                    .entry((path[i - 1].to_string(), name.to_string()))
                    .or_default() += value;
            }
        }
    });
    (nodes, calls)
}

/// The DOT graph of every real profile of shared/testdata against the model: the
/// `max_nodes` functions of the largest cum, each with its flat and cum, and every call
/// between two of them with its value (the heaviest, where they are more than a graph
/// draws); never more than `MAX_DOT_NODES` nodes, whatever is asked.
#[test]
fn dot_graphs_draw_the_heaviest_functions_and_calls_as_a_model_counts_them() {
    use frostdb_pprof::report::dot::{self, EDGES_PER_NODE, MAX_DOT_NODES};
    use frostdb_pprof::report::top::{percentage, scaled_label};
    let mut checked = 0;
    for (name, merged) in testdata_merges() {
        let (nodes, calls) = dot_model(&merged);
        let unit = &merged.profile_type.sample_unit;
        let total = merged.total();
        let mut ranked: Vec<(&String, &(i64, i64))> = nodes.iter().collect();
        ranked.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
        for max_nodes in [1, 20, usize::MAX] {
            let what = format!("{name} max_nodes={max_nodes}");
            let graph = dot::render(&merged, max_nodes);
            let kept = &ranked[..ranked.len().min(max_nodes).min(MAX_DOT_NODES)];
            let node_lines: Vec<&str> = graph
                .lines()
                .filter(|l| l.starts_with('N') && !l.contains(" -> "))
                .collect();
            assert_eq!(node_lines.len(), kept.len(), "{what}");
            for (n, (line, (fname, (flat, cum)))) in node_lines.iter().zip(kept).enumerate() {
                if fname.len() > 200
                    || fname.contains(['"', '\\'])
                    || fname.chars().any(char::is_control)
                {
                    continue; // shown escaped or cut; its values are checked by the rest
                }
                assert!(line.starts_with(&format!("N{} ", n + 1)), "{what}: {line}");
                assert!(
                    line.contains(&format!(
                        "tooltip=\"{fname} ({})\"",
                        scaled_label(*cum, unit)
                    )),
                    "{what}: {fname}: {line}"
                );
                let flat = format!(
                    "{} ({})",
                    scaled_label(*flat, unit),
                    percentage(*flat, total).trim()
                );
                assert!(line.contains(&flat), "{what}: {fname} flat {flat}: {line}");
            }
            let number: std::collections::HashMap<&str, usize> = kept
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (name.as_str(), i + 1))
                .collect();
            let mut between: Vec<((usize, usize), i64)> = calls
                .iter()
                .filter_map(|((a, b), v)| {
                    Some(((*number.get(a.as_str())?, *number.get(b.as_str())?), *v))
                })
                .collect();
            between.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            between.truncate(kept.len() * EDGES_PER_NODE);
            let edge_lines: Vec<&str> = graph.lines().filter(|l| l.contains(" -> ")).collect();
            assert_eq!(edge_lines.len(), between.len(), "{what}");
            for ((a, b), value) in between {
                let head = format!("N{a} -> N{b} [label=\" {}\"", scaled_label(value, unit));
                assert!(
                    edge_lines.iter().any(|l| l.starts_with(&head)),
                    "{what}: no {head}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked}");
}

/// A merge of more functions than a graph draws: at most `MAX_DOT_NODES` nodes and their
/// heaviest edges, names cut, the rest counted in the legend; an answer of megabytes, not
/// the gigabyte a graph of every function was.
#[test]
fn a_dot_graph_of_more_functions_than_it_draws_is_bounded() {
    use frostdb_pprof::report::dot::{self, EDGES_PER_NODE, MAX_DOT_NAME_BYTES, MAX_DOT_NODES};
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let long = "x".repeat(4 * MAX_DOT_NAME_BYTES);
    let text: String = (0..3 * MAX_DOT_NODES)
        .map(|i| format!("main;{long}{i};callee{i} {}\n", 1 + i % 5))
        .collect();
    let profile = frostdb_pprof::convert::folded::to_profile(
        &text,
        false,
        &frostdb_pprof::convert::folded::Units {
            sample: ("samples".into(), "count".into()),
            period: ("cpu".into(), "nanoseconds".into()),
            period_value: 10_000_000,
            scale: 1,
        },
        &frostdb_pprof::Limits::default(),
    )
    .unwrap();
    let profile = frostdb_pprof::validate(profile, &frostdb_pprof::Limits::default()).unwrap();
    store
        .ingest_profile(&profile, &IngestOptions::default().name("wide"))
        .unwrap();
    let merged = store
        .merge(
            &Selector::parse("wide:samples:count:cpu:nanoseconds").unwrap(),
            TimeRange::ALL,
        )
        .unwrap();
    let graph = dot::render(&merged, usize::MAX);
    let nodes = graph
        .lines()
        .filter(|l| l.starts_with('N') && !l.contains(" -> "))
        .count();
    let edges = graph.lines().filter(|l| l.contains(" -> ")).count();
    assert_eq!(nodes, MAX_DOT_NODES);
    assert!(edges <= MAX_DOT_NODES * EDGES_PER_NODE, "{edges}");
    // main, and a caller and a callee per stack.
    let functions = 1 + 2 * 3 * MAX_DOT_NODES;
    assert!(
        graph.contains(&format!("Dropped {} nodes", functions - MAX_DOT_NODES)),
        "legend"
    );
    assert!(
        !graph.contains(&"x".repeat(MAX_DOT_NAME_BYTES + 1)),
        "a name is not cut"
    );
    assert!(graph.len() < 64 << 20, "{} bytes", graph.len());
}

/// Diffs truncated to `max_nodes` on every real profile of shared/testdata (each against
/// itself and against another of its type): at most `max_nodes` named nodes, the rest
/// summed into `other` callees, every node's totals on both sides its self plus its
/// callees', and the root's totals the whole diff's.
#[test]
fn truncated_diffs_keep_every_total_on_both_sides() {
    let merges = testdata_merges();
    let mut truncated_somewhere = 0;
    for (k, (what, base)) in merges.iter().enumerate() {
        let compare = &merges[(k + 1) % merges.len()].1;
        let compare = if compare.profile_type == base.profile_type {
            compare
        } else {
            base
        };
        let whole = tree::diff(base, compare);
        let all = whole.root().children().count(); // at least this many below the root
        for max_nodes in [0, 1, 7, 100] {
            let what = format!("{what} max_nodes={max_nodes}");
            let cut = tree::diff_truncated(base, compare, max_nodes);
            let root = cut.root();
            assert_eq!(
                (root.base(), root.compare()),
                (whole.root().base(), whole.root().compare()),
                "{what}"
            );
            let mut named = 0;
            let mut stack = vec![root];
            while let Some(node) = stack.pop() {
                let (mut base, mut compare) = (node.base_self(), node.compare_self());
                for child in node.children() {
                    base += child.base();
                    compare += child.compare();
                    if child.name() != OTHER {
                        named += 1;
                    }
                    stack.push(child);
                }
                assert_eq!(
                    (base, compare),
                    (node.base(), node.compare()),
                    "{what}: {}",
                    node.name()
                );
            }
            assert!(named <= max_nodes, "{what}: {named} named");
            if named < all {
                truncated_somewhere += 1;
            }
        }
        assert_eq!(tree::diff_truncated(base, compare, usize::MAX), whole);
    }
    assert!(truncated_somewhere > 50, "{truncated_somewhere}");
}
