//! The call graph in Graphviz DOT, as `go tool pprof -dot` draws it: a box per function
//! with its flat and cum values, an edge per call with the value that went through it, the
//! `max_nodes` functions of the largest cum kept. Pyroscope's `/pyroscope/render?format=dot`
//! answers this (Grafana's Profiles Drilldown sends it to its flame graph explainer).

use std::fmt::Write as _;

use super::top::{percentage, scaled_label};
use super::tree::StackNames;
use crate::store::Merged;

/// Maps and sets keyed by name ids: foldhash, as the report's maps.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// Pyroscope's default node count of a DOT answer.
pub const DEFAULT_MAX_NODES: usize = 100;

/// Most nodes a DOT graph draws, whatever `max_nodes` asks: Graphviz lays out a few
/// thousand at most, and each is a line of its name (a graph of every function of a
/// three-day merge was a gigabyte, built outside the report's reservation).
pub const MAX_DOT_NODES: usize = 4096;

/// Most edges a DOT graph draws, per node drawn: the heaviest, the rest dropped and
/// counted in the legend, as pprof drops its light edges.
pub const EDGES_PER_NODE: usize = 8;

/// Longest name a node or edge shows, in bytes: longer ones are cut (a name of a megabyte
/// was written into every edge of its node).
pub const MAX_DOT_NAME_BYTES: usize = 1024;

#[derive(Default, Clone, Copy)]
struct Node {
    flat: i64,
    cum: i64,
}

/// `name`, cut to [`MAX_DOT_NAME_BYTES`] on a character boundary.
fn shown(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= MAX_DOT_NAME_BYTES {
        return std::borrow::Cow::Borrowed(name);
    }
    let end = name.floor_char_boundary(MAX_DOT_NAME_BYTES);
    std::borrow::Cow::Owned(format!("{}…", &name[..end]))
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

/// The DOT call graph of `merged`, its `max_nodes` functions of the largest cum kept (at
/// most [`MAX_DOT_NODES`]), and of the edges between them the heaviest
/// [`EDGES_PER_NODE`] per node. Counted by name id, three walks of the stacks: names,
/// then each function's flat and cum, then the edges between the functions kept.
pub fn render(merged: &Merged, max_nodes: usize) -> String {
    let max_nodes = max_nodes.min(MAX_DOT_NODES);
    let mut names = StackNames::of(merged);
    let mut nodes = vec![Node::default(); names.len()];
    // Recursion counts a function (and a call) once per stack, as pprof does: the stack
    // that last counted each function, not a set per stack (a stack may be thousands of
    // frames deep).
    let mut counted_in = vec![usize::MAX; names.len()];
    let mut stack = 0usize;
    names.each(|path, value| {
        stack += 1;
        let Some(&leaf) = path.last() else { return };
        if let Some(leaf) = nodes.get_mut(leaf as usize) {
            leaf.flat = leaf.flat.saturating_add(value);
        }
        for &id in path {
            let i = id as usize;
            if i < nodes.len() && counted_in[i] != stack {
                counted_in[i] = stack;
                nodes[i].cum = nodes[i].cum.saturating_add(value);
            }
        }
    });
    drop(counted_in);
    let mut ranked: Vec<u32> = (0..nodes.len() as u32).collect();
    ranked.sort_by(|&a, &b| {
        nodes[b as usize]
            .cum
            .cmp(&nodes[a as usize].cum)
            .then_with(|| names.name(a).cmp(names.name(b)))
    });
    let dropped = ranked.len().saturating_sub(max_nodes);
    ranked.truncate(max_nodes);
    // Node numbers (from 1) of the functions kept, by name id.
    let mut number = vec![0u32; nodes.len()];
    for (i, &id) in ranked.iter().enumerate() {
        number[id as usize] = i as u32 + 1;
    }
    let mut edges: HashMap<(u32, u32), i64> = HashMap::default();
    let mut seen: HashSet<(u32, u32)> = HashSet::default();
    names.each(|path, value| {
        seen.clear();
        for pair in path.windows(2) {
            let (a, b) = (pair[0] as usize, pair[1] as usize);
            let (Some(&na), Some(&nb)) = (number.get(a), number.get(b)) else {
                continue;
            };
            if na > 0 && nb > 0 && seen.insert((na, nb)) {
                let sum = edges.entry((na, nb)).or_default();
                *sum = sum.saturating_add(value);
            }
        }
    });
    let mut edges: Vec<((u32, u32), i64)> = edges.into_iter().collect();
    edges.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let dropped_edges = edges
        .len()
        .saturating_sub(ranked.len().saturating_mul(EDGES_PER_NODE));
    edges.truncate(ranked.len().saturating_mul(EDGES_PER_NODE));
    edges.sort_by_key(|(pair, _)| *pair);
    let total = merged.total();
    let unit = &merged.profile_type.sample_unit;
    let node = |id: u32| nodes[id as usize];
    let shown_value: i64 = ranked
        .iter()
        .map(|&id| node(id).flat)
        .fold(0, i64::saturating_add);
    let max_flat = ranked
        .iter()
        .map(|&id| node(id).flat)
        .max()
        .unwrap_or(0)
        .max(1);
    let t = &merged.profile_type;
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", quote(&t.to_string()));
    out.push_str("node [style=filled fillcolor=\"#f8f8f8\"]\n");
    let mut legend = format!(
        "Type: {}\\lShowing nodes accounting for {}, {} of {} total\\l",
        quote(&t.sample_type),
        scaled_label(shown_value, unit),
        percentage(shown_value, total).trim(),
        scaled_label(total, unit)
    );
    if dropped > 0 {
        let _ = write!(legend, "Dropped {dropped} nodes\\l");
    }
    if dropped_edges > 0 {
        let _ = write!(legend, "Dropped {dropped_edges} edges\\l");
    }
    let _ = writeln!(
        out,
        "subgraph cluster_L {{ \"Type: {0}\" [shape=box fontsize=16 label=\"{legend}\" tooltip=\"{0}\"] }}",
        quote(&t.sample_type)
    );
    for (i, &id) in ranked.iter().enumerate() {
        let (n, name) = (i + 1, shown(names.name(id)));
        let Node { flat, cum } = node(id);
        let flat_label = format!(
            "{} ({})",
            scaled_label(flat, unit),
            percentage(flat, total).trim()
        );
        let value = if flat == cum {
            flat_label
        } else {
            format!(
                "{flat_label}\\nof {} ({})",
                scaled_label(cum, unit),
                percentage(cum, total).trim()
            )
        };
        // Font size grows with flat, as pprof's does (8 to 50).
        let size = 8 + (42.0 * (flat as f64 / max_flat as f64).sqrt()) as i64;
        let _ = writeln!(
            out,
            "N{n} [label=\"{}\\n{value}\" id=\"node{n}\" fontsize={size} shape=box tooltip=\"{} ({})\"]",
            label_name(&name),
            quote(&name),
            scaled_label(cum, unit)
        );
    }
    for ((a, b), value) in edges {
        let name = |n: u32| shown(names.name(ranked[n as usize - 1]));
        let width = 1 + (value.saturating_mul(4) / total.max(1)).clamp(0, 4);
        let _ = writeln!(
            out,
            "N{a} -> N{b} [label=\" {}\" weight={} penwidth={width} tooltip=\"{} -> {} ({})\"]",
            scaled_label(value, unit),
            1 + value.saturating_mul(100) / total.max(1),
            quote(&name(a)),
            quote(&name(b)),
            scaled_label(value, unit)
        );
    }
    out.push_str("}\n");
    out
}
