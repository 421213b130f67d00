//! Flame graphs (a call tree with self and total per node), folded stacks, and diffs.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use serde::Serialize;

use super::{HashMap, Walker};
use crate::error::Result;
use crate::store::Merged;
use crate::symbols::{Frame, StackId};

/// A node of a flame graph: a function called along one path from the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    /// Function name (or address when unsymbolized).
    pub name: String,
    /// Source file, when known.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub filename: String,
    /// Value of samples whose innermost frame this node is.
    #[serde(rename = "self")]
    pub self_value: i64,
    /// Value of samples through this node.
    pub total: i64,
    /// Callees, by descending total, then name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Node>,
}

/// A flame graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlameGraph {
    /// Profile type.
    pub profile_type: String,
    /// Unit of the values.
    pub unit: String,
    /// The root (`total`): every stack starts below it.
    pub root: Node,
    /// Nodes summed into `other` nodes to keep within `max_nodes`.
    #[serde(skip_serializing_if = "is_zero")]
    pub truncated: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Names of frames as a flame graph shows them, numbered as first met: the display name
/// and the source file of the first frame met with it.
#[derive(Default)]
struct Names<'a> {
    names: Vec<(Cow<'a, str>, &'a str)>,
    by_name: HashMap<Cow<'a, str>, u32>,
}

impl<'a> Names<'a> {
    fn id(&mut self, frame: Frame<'a>) -> u32 {
        let names = &mut self.names;
        *self
            .by_name
            .entry(frame.display_name())
            .or_insert_with_key(|name| {
                names.push((name.clone(), frame.filename()));
                names.len() as u32 - 1
            })
    }

    /// Calls `f` with every stack of `merged` as name ids, root first, and its value.
    fn each_stack(&mut self, merged: &'a Merged, mut f: impl FnMut(&[u32], i64)) {
        let mut walker = Walker::new(&merged.symbols);
        let mut path = Vec::new();
        for (stack, value) in &merged.samples {
            walker.root_first(*stack, &mut |frame| self.id(frame), &mut path);
            f(&path, *value);
        }
    }

    fn name(&self, id: u32) -> (&str, &str) {
        self.names
            .get(id as usize)
            .map_or(("total", ""), |(n, f)| (n, f))
    }
}

/// A call tree under construction: nodes in an arena, children found by (parent, name).
struct Arena<T> {
    /// `(name, values)`; node 0 is the root.
    nodes: Vec<(u32, T)>,
    children: Vec<Vec<u32>>,
    child_of: HashMap<(u32, u32), u32>,
}

impl<T: Default> Arena<T> {
    fn new() -> Self {
        Self {
            nodes: vec![(u32::MAX, T::default())],
            children: vec![Vec::new()],
            child_of: HashMap::default(),
        }
    }

    /// Adds the path of names `path` below the root: `on_path` is called with the values of
    /// every node it passes (the root included), `at_leaf` with the last one's.
    fn add(&mut self, path: &[u32], on_path: impl Fn(&mut T), at_leaf: impl FnOnce(&mut T)) {
        let mut node = 0u32;
        on_path(&mut self.nodes[0].1);
        for &name in path {
            let (nodes, children) = (&mut self.nodes, &mut self.children);
            node = *self.child_of.entry((node, name)).or_insert_with(|| {
                let id = nodes.len() as u32;
                nodes.push((name, T::default()));
                children.push(Vec::new());
                children[node as usize].push(id);
                id
            });
            on_path(&mut self.nodes[node as usize].1);
        }
        at_leaf(&mut self.nodes[node as usize].1);
    }
}

/// A flame graph node's values: self and total.
type SelfTotal = (i64, i64);

impl Arena<SelfTotal> {
    /// Which nodes keep their own name when at most `max_nodes` may: the `max_nodes` of
    /// the largest totals, ties to the node made first. A callee's total is never above its
    /// caller's and a callee is made after its caller, so a kept node's callers are kept.
    fn kept(&self, max_nodes: usize) -> Vec<bool> {
        let mut kept = vec![true; self.nodes.len()];
        if self.nodes.len() - 1 <= max_nodes {
            return kept;
        }
        kept[1..].fill(false);
        if max_nodes == 0 {
            return kept;
        }
        let key = |i: u32| (std::cmp::Reverse(self.nodes[i as usize].1.1), i);
        let mut order: Vec<u32> = (1..self.nodes.len() as u32).collect();
        order.select_nth_unstable_by_key(max_nodes - 1, |&i| key(i));
        for &i in &order[..max_nodes] {
            kept[i as usize] = true;
        }
        kept
    }

    /// The tree below `node`; callees left out by `kept` are summed into one [`OTHER`].
    fn finish(&self, node: u32, names: &Names<'_>, kept: &[bool]) -> Node {
        let (name, (self_value, total)) = self.nodes[node as usize];
        let mut children: Vec<Node> = Vec::new();
        let mut other: Option<i64> = None;
        for &c in &self.children[node as usize] {
            if kept[c as usize] {
                children.push(self.finish(c, names, kept));
            } else {
                *other.get_or_insert(0) += self.nodes[c as usize].1.1;
            }
        }
        if let Some(other) = other {
            children.push(Node {
                name: OTHER.to_owned(),
                filename: String::new(),
                self_value: other,
                total: other,
                children: Vec::new(),
            });
        }
        children.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.name.cmp(&b.name)));
        let (name, filename) = names.name(name);
        Node {
            name: name.to_owned(),
            filename: filename.to_owned(),
            self_value,
            total,
            children,
        }
    }
}

/// Calls `f` with every stack of `merged`: its frames' display names, root first (outermost
/// first within a location), and its value. Each location's names are resolved once.
pub fn each_named_stack(merged: &Merged, mut f: impl FnMut(&[&str], i64)) {
    let mut names = Names::default();
    // Names first (they grow while stacks are walked), then the stacks by name.
    let (mut ids, mut ends) = (Vec::new(), Vec::with_capacity(merged.samples.len()));
    names.each_stack(merged, |path, _| {
        ids.extend_from_slice(path);
        ends.push(ids.len());
    });
    let mut path = Vec::new();
    let mut start = 0;
    for ((_, value), end) in merged.samples.iter().zip(ends) {
        path.clear();
        path.extend(ids[start..end].iter().map(|&i| names.name(i).0));
        f(&path, *value);
        start = end;
    }
}

/// `merged` keeping only the stacks under a call site: those whose frames, root first,
/// begin with `call_site`'s function names (Pyroscope's `stack_trace_selector.call_site`).
/// An empty call site keeps everything.
pub fn select_call_site(mut merged: Merged, call_site: &[&str]) -> Merged {
    if call_site.is_empty() {
        return merged;
    }
    let mut keep = Vec::with_capacity(merged.samples.len());
    each_named_stack(&merged, |path, _| {
        keep.push(path.len() >= call_site.len() && path.iter().zip(call_site).all(|(a, b)| a == b))
    });
    let kept: std::collections::HashSet<StackId> = merged
        .samples
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|((id, _), _)| *id)
        .collect();
    merged.samples.retain(|(id, _)| kept.contains(id));
    for (_, stacks) in &mut merged.series {
        stacks.retain(|(id, _)| kept.contains(id));
    }
    merged.series.retain(|(_, stacks)| !stacks.is_empty());
    merged
}

/// The name of the node that sums the callees a truncated flame graph leaves out.
pub const OTHER: &str = "other";

/// Pyroscope's default `max_nodes`.
pub const DEFAULT_MAX_NODES: usize = 8192;

impl FlameGraph {
    /// Builds the flame graph of `merged`, every node kept.
    pub fn build(merged: &Merged) -> Self {
        Self::build_truncated(merged, usize::MAX)
    }

    /// Builds the flame graph of `merged` keeping at most `max_nodes` nodes besides the
    /// root, those of the largest totals: each node's other callees are summed into one
    /// callee named [`OTHER`] (as Pyroscope truncates), so every total stays exact.
    pub fn build_truncated(merged: &Merged, max_nodes: usize) -> Self {
        let mut names = Names::default();
        let mut arena = Arena::<SelfTotal>::new();
        names.each_stack(merged, |path, value| {
            arena.add(path, |n| n.1 += value, |n| n.0 += value);
        });
        let kept = arena.kept(max_nodes);
        FlameGraph {
            profile_type: merged.profile_type.to_string(),
            unit: merged.profile_type.sample_unit.clone(),
            root: arena.finish(0, &names, &kept),
            truncated: kept.iter().filter(|k| !**k).count(),
        }
    }

    /// The tree as a table, depth first: `id`, `parent` (null for the root), `depth`, `name`,
    /// `filename`, `self`, `total`.
    pub fn to_arrow(&self) -> Result<RecordBatch> {
        let (mut ids, mut parents, mut depths) = (Vec::new(), Vec::new(), Vec::new());
        let (mut names, mut files, mut selfs, mut totals) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut stack: Vec<(&Node, Option<u32>, u32)> = vec![(&self.root, None, 0)];
        while let Some((node, parent, depth)) = stack.pop() {
            let id = ids.len() as u32;
            ids.push(id);
            parents.push(parent);
            depths.push(depth);
            names.push(node.name.clone());
            files.push(node.filename.clone());
            selfs.push(node.self_value);
            totals.push(node.total);
            for child in node.children.iter().rev() {
                stack.push((child, Some(id), depth + 1));
            }
        }
        let columns: Vec<(&str, ArrayRef, bool)> = vec![
            ("id", Arc::new(UInt32Array::from(ids)), false),
            ("parent", Arc::new(UInt32Array::from(parents)), true),
            ("depth", Arc::new(UInt32Array::from(depths)), false),
            ("name", Arc::new(StringArray::from(names)), false),
            ("filename", Arc::new(StringArray::from(files)), false),
            ("self", Arc::new(Int64Array::from(selfs)), false),
            ("total", Arc::new(Int64Array::from(totals)), false),
        ];
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a, nullable)| Field::new(*n, a.data_type().clone(), *nullable))
            .collect();
        debug_assert!(fields.iter().any(|f| f.data_type() == &DataType::Utf8));
        Ok(RecordBatch::try_new(
            Arc::new(ArrowSchema::new(fields)),
            columns.into_iter().map(|(_, a, _)| a).collect(),
        )?)
    }
}

/// Folded stacks, one line per distinct stack: `root;caller;leaf value`, sorted.
pub fn folded(merged: &Merged) -> String {
    let mut names = Names::default();
    let mut paths: HashMap<Vec<u32>, i64> = HashMap::default();
    names.each_stack(merged, |path, value| {
        *paths.entry(path.to_vec()).or_default() += value;
    });
    let clean: Vec<String> = names
        .names
        .iter()
        .map(|(n, _)| n.replace([';', '\n'], "_"))
        .collect();
    let mut lines: Vec<(String, i64)> = paths
        .into_iter()
        .map(|(path, value)| {
            let path: Vec<&str> = path.iter().map(|&n| clean[n as usize].as_str()).collect();
            (path.join(";"), value)
        })
        .collect();
    // Paths of distinct names may still fold to one line (names differing in ';' or '\n').
    lines.sort_unstable();
    lines.dedup_by(|later, first| {
        let same = later.0 == first.0;
        if same {
            first.1 += later.1;
        }
        same
    });
    let mut out = String::new();
    for (stack, value) in lines {
        let _ = writeln!(out, "{stack} {value}");
    }
    out
}

/// A node of a diff: the same call path in a base and a compared profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiffNode {
    /// Function name.
    pub name: String,
    /// Total in the base.
    pub base: i64,
    /// Total in the compared profile.
    pub compare: i64,
    /// Self in the base.
    pub base_self: i64,
    /// Self in the compared profile.
    pub compare_self: i64,
    /// Callees, by the largest absolute change first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<DiffNode>,
}

/// A diff node's values: base and compared total, base and compared self.
type DiffValues = (i64, i64, i64, i64);

impl Arena<DiffValues> {
    fn finish_diff(&self, node: u32, names: &Names<'_>) -> DiffNode {
        let (name, (base, compare, base_self, compare_self)) = self.nodes[node as usize];
        let mut children: Vec<DiffNode> = self.children[node as usize]
            .iter()
            .map(|&c| self.finish_diff(c, names))
            .collect();
        children.sort_by(|a, b| {
            (b.compare - b.base)
                .abs()
                .cmp(&(a.compare - a.base).abs())
                .then_with(|| a.name.cmp(&b.name))
        });
        DiffNode {
            name: names.name(name).0.to_owned(),
            base,
            compare,
            base_self,
            compare_self,
            children,
        }
    }
}

/// The diff of two merged profiles (of the same type): one tree with both values per node.
pub fn diff(base: &Merged, compare: &Merged) -> DiffNode {
    let mut names = Names::default();
    let mut arena = Arena::<DiffValues>::new();
    names.each_stack(base, |path, v| {
        arena.add(path, |n| n.0 += v, |n| n.2 += v);
    });
    names.each_stack(compare, |path, v| {
        arena.add(path, |n| n.1 += v, |n| n.3 += v);
    });
    arena.finish_diff(0, &names)
}
