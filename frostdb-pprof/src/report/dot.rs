//! The call graph in Graphviz DOT, as `go tool pprof -dot` draws it: a box per function
//! with its flat and cum values, an edge per call with the value that went through it, the
//! `max_nodes` functions of the largest cum kept. Pyroscope's `/pyroscope/render?format=dot`
//! answers this (Grafana's Profiles Drilldown sends it to its flame graph explainer).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::top::{percentage, scaled_label};
use super::tree::each_named_stack;
use crate::store::Merged;

/// Sets of names per stack: foldhash, as the report's maps.
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// Pyroscope's default node count of a DOT answer.
pub const DEFAULT_MAX_NODES: usize = 100;

#[derive(Default)]
struct Node {
    flat: i64,
    cum: i64,
}

/// Escapes a string for a double-quoted DOT string.
fn quote(s: &str) -> String {
    super::printable(s, '\u{FFFD}')
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
}

/// A function name on several lines, as pprof breaks `pkg.(*T).method` at dots.
fn label_name(name: &str) -> String {
    let mut out = String::new();
    for (i, part) in name.split_inclusive('.').enumerate() {
        if i > 0 && out.len() > 16 && !out.ends_with("\\n") {
            out.push_str("\\n");
        }
        out.push_str(&quote(part));
    }
    out
}

/// `map`'s value of `key`, made (with its key) only when it is not there: a lookup of a
/// borrowed name allocates nothing.
fn entry<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// The DOT call graph of `merged`, its `max_nodes` functions of the largest cum kept.
pub fn render(merged: &Merged, max_nodes: usize) -> String {
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    // Callers, then callees: looked up by the names as borrowed, a key made only when new.
    let mut edges: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    each_named_stack(merged, |path, value| {
        let Some(leaf) = path.last() else { return };
        let leaf = entry(&mut nodes, leaf);
        leaf.flat = leaf.flat.saturating_add(value);
        // Recursion counts a function (and a call) once per stack, as pprof does. Sets, not
        // lists: a stack may be thousands of frames deep.
        let mut seen: HashSet<&str> = HashSet::default();
        let mut seen_edges: HashSet<(&str, &str)> = HashSet::default();
        for (i, name) in path.iter().enumerate() {
            if seen.insert(name) {
                let node = entry(&mut nodes, name);
                node.cum = node.cum.saturating_add(value);
            }
            if i > 0 {
                let edge = (path[i - 1], *name);
                if seen_edges.insert(edge) {
                    let sum = entry(entry(&mut edges, edge.0), edge.1);
                    *sum = sum.saturating_add(value);
                }
            }
        }
    });
    let total = merged.total();
    let unit = &merged.profile_type.sample_unit;
    let mut ranked: Vec<(&String, &Node)> = nodes.iter().collect();
    ranked.sort_by(|a, b| b.1.cum.cmp(&a.1.cum).then_with(|| a.0.cmp(b.0)));
    let dropped = ranked.len().saturating_sub(max_nodes);
    ranked.truncate(max_nodes);
    let ids: BTreeMap<&str, usize> = ranked
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.as_str(), i + 1))
        .collect();
    let shown: i64 = ranked
        .iter()
        .map(|(_, n)| n.flat)
        .fold(0, i64::saturating_add);
    let max_flat = ranked.iter().map(|(_, n)| n.flat).max().unwrap_or(0).max(1);
    let t = &merged.profile_type;
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", quote(&t.to_string()));
    out.push_str("node [style=filled fillcolor=\"#f8f8f8\"]\n");
    let mut legend = format!(
        "Type: {}\\lShowing nodes accounting for {}, {} of {} total\\l",
        quote(&t.sample_type),
        scaled_label(shown, unit),
        percentage(shown, total).trim(),
        scaled_label(total, unit)
    );
    if dropped > 0 {
        let _ = write!(legend, "Dropped {dropped} nodes\\l");
    }
    let _ = writeln!(
        out,
        "subgraph cluster_L {{ \"Type: {0}\" [shape=box fontsize=16 label=\"{legend}\" tooltip=\"{0}\"] }}",
        quote(&t.sample_type)
    );
    for (name, node) in &ranked {
        let id = ids[name.as_str()];
        let flat = format!(
            "{} ({})",
            scaled_label(node.flat, unit),
            percentage(node.flat, total).trim()
        );
        let value = if node.flat == node.cum {
            flat
        } else {
            format!(
                "{flat}\\nof {} ({})",
                scaled_label(node.cum, unit),
                percentage(node.cum, total).trim()
            )
        };
        // Font size grows with flat, as pprof's does (8 to 50).
        let size = 8 + (42.0 * (node.flat as f64 / max_flat as f64).sqrt()) as i64;
        let _ = writeln!(
            out,
            "N{id} [label=\"{}\\n{value}\" id=\"node{id}\" fontsize={size} shape=box tooltip=\"{} ({})\"]",
            label_name(name),
            quote(name),
            scaled_label(node.cum, unit)
        );
    }
    let edges = edges
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |(to, value)| ((from, to), value)));
    for ((from, to), value) in edges {
        let (Some(a), Some(b)) = (ids.get(from.as_str()), ids.get(to.as_str())) else {
            continue;
        };
        let width = 1 + (value.saturating_mul(4) / total.max(1)).clamp(0, 4);
        let _ = writeln!(
            out,
            "N{a} -> N{b} [label=\" {}\" weight={} penwidth={width} tooltip=\"{} -> {} ({})\"]",
            scaled_label(*value, unit),
            1 + value.saturating_mul(100) / total.max(1),
            quote(from),
            quote(to),
            scaled_label(*value, unit)
        );
    }
    out.push_str("}\n");
    out
}
