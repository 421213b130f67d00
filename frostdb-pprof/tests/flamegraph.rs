//! Flame graphs truncated to `max_nodes`, on every real profile of shared/testdata:
//! `max_nodes` named nodes (or all), the largest ones, each with the values it has in the
//! full graph; the callees left out summed into one `other` per parent, so every total stays
//! exact.

mod common;

use std::collections::HashMap;

use frostdb_core::{Db, DbOptions};
use frostdb_pprof::report::tree::{FlameGraph, Node, OTHER};
use frostdb_pprof::{IngestOptions, ProfileStore, StoreOptions};
use frostdb_query::Selector;
use frostdb_query::profile::TimeRange;

/// The nodes of a full graph below the root, numbered depth first from 1 (0: the root),
/// found by (parent's number, name).
struct Numbered<'a> {
    ids: HashMap<(usize, &'a str), usize>,
    /// (self, total) by number.
    values: Vec<(i64, i64)>,
}

impl<'a> Numbered<'a> {
    fn new(root: &'a Node) -> Self {
        let mut out = Numbered {
            ids: HashMap::new(),
            values: vec![(root.self_value, root.total)],
        };
        let mut stack = vec![(root, 0usize)];
        while let Some((node, id)) = stack.pop() {
            for child in &node.children {
                let child_id = out.values.len();
                out.values.push((child.self_value, child.total));
                assert!(out.ids.insert((id, &child.name), child_id).is_none());
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
    assert_eq!(truncated.root.total, all.values[0].1, "{what}: root total");
    let mut kept = vec![false; all.values.len()];
    let mut others = 0;
    let mut stack = vec![(&truncated.root, 0usize)];
    while let Some((node, id)) = stack.pop() {
        // Every node's total is its self plus its callees' totals, `other` included.
        let below: i64 = node.children.iter().map(|c| c.total).sum();
        assert_eq!(node.total, node.self_value + below, "{what}: {}", node.name);
        for child in &node.children {
            match all.ids.get(&(id, child.name.as_str())) {
                Some(&child_id) => {
                    assert_eq!(
                        (child.self_value, child.total),
                        all.values[child_id],
                        "{what}: {} differs from the full graph",
                        child.name
                    );
                    kept[child_id] = true;
                    stack.push((child, child_id));
                }
                None => {
                    assert_eq!(
                        child.name, OTHER,
                        "{what}: {} is not in the full graph",
                        child.name
                    );
                    assert!(child.children.is_empty(), "{what}: `other` has callees");
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

#[test]
fn truncated_flame_graphs_keep_the_largest_nodes_and_every_total() {
    let store = ProfileStore::open(
        Db::open_in_memory(DbOptions::default()).unwrap(),
        StoreOptions::default(),
    )
    .unwrap();
    let mut truncated_somewhere = 0;
    for (i, (name, bytes)) in common::testdata().into_iter().enumerate() {
        let summary = store
            .ingest(
                &bytes,
                &IngestOptions {
                    name: format!("f{i}"),
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for profile_type in &summary.profile_types {
            let merged = store
                .merge(&Selector::parse(profile_type).unwrap(), TimeRange::ALL)
                .unwrap();
            let full = FlameGraph::build(&merged);
            assert_eq!(full.truncated, 0);
            assert_eq!(full.root.total, merged.total(), "{name}");
            let all = Numbered::new(&full.root);
            for max_nodes in [0, 1, 7, 100, all.len() / 2, all.len()] {
                let what = format!("{name} {profile_type} max_nodes={max_nodes}");
                let truncated = FlameGraph::build_truncated(&merged, max_nodes);
                if check(&all, &truncated, max_nodes, &what) < all.len() {
                    truncated_somewhere += 1;
                }
            }
            assert_eq!(FlameGraph::build_truncated(&merged, all.len()), full);
        }
    }
    assert!(
        truncated_somewhere > 100,
        "only {truncated_somewhere} graphs truncated"
    );
}
