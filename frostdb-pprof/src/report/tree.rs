//! Flame graphs (a call tree with self and total per node), folded stacks, and diffs.
//!
//! Trees are flat: their nodes in one array in depth-first order, each knowing its parent
//! and where its subtree ends, so that building, walking, writing and dropping a tree never
//! recurses, however deep the stacks it was built from ([`Node::children`] walks a node's
//! callees; [`Tree::nodes`] every node). Stacks deeper than
//! [`MAX_STACK_DEPTH`](super::MAX_STACK_DEPTH) are cut with a marker frame (see
//! [`truncation_marker`](super::truncation_marker)).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};

use super::{HashMap, Walker};
use crate::error::Result;
use crate::store::Merged;
use crate::symbols::{Frame, StackId};

/// A call tree: a root (`total`) and the call paths below it, with values `V` per node
/// ([`FlameValues`] for a flame graph, [`DiffValues`] for a diff).
///
/// Nodes are held in depth-first order (a node before its callees, callees in their order),
/// each with its parent and the end of its subtree: nothing about a tree recurses, so a
/// tree of any depth is built, read, written ([`FlameGraph::to_json`], [`Tree::to_json`])
/// and dropped in constant stack space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree<V> {
    nodes: Vec<Slot<V>>,
    /// `(name, filename)` of the nodes, each once.
    names: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot<V> {
    /// Index in [`Tree::names`].
    name: u32,
    /// Index of the caller; `u32::MAX` for the root.
    parent: u32,
    /// One past the last node of this node's subtree.
    end: u32,
    depth: u32,
    values: V,
}

/// A flame graph node's values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlameValues {
    /// Value of samples whose innermost frame this node is.
    pub self_value: i64,
    /// Value of samples through this node.
    pub total: i64,
}

/// A diff node's values: the same call path in a base and a compared profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffValues {
    /// Total in the base.
    pub base: i64,
    /// Total in the compared profile.
    pub compare: i64,
    /// Self in the base.
    pub base_self: i64,
    /// Self in the compared profile.
    pub compare_self: i64,
}

/// A node of a [`Tree`]: a function called along one path from the root.
pub struct Node<'a, V> {
    tree: &'a Tree<V>,
    index: u32,
}

impl<V: Copy + std::fmt::Debug> std::fmt::Debug for Node<'_, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("index", &self.index)
            .field("name", &self.name())
            .field("values", &self.values())
            .finish()
    }
}

impl<V> Clone for Node<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for Node<'_, V> {}

impl<'a, V: Copy> Node<'a, V> {
    fn slot(&self) -> &'a Slot<V> {
        &self.tree.nodes[self.index as usize]
    }

    /// Its position in [`Tree::nodes`] (the root is 0).
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// Function name (or address when unsymbolized); `total` for the root.
    pub fn name(&self) -> &'a str {
        &self.tree.names[self.slot().name as usize].0
    }

    /// Source file, when known (else empty).
    pub fn filename(&self) -> &'a str {
        &self.tree.names[self.slot().name as usize].1
    }

    /// Its values.
    pub fn values(&self) -> V {
        self.slot().values
    }

    /// Calls from the root to here: 0 for the root.
    pub fn depth(&self) -> usize {
        self.slot().depth as usize
    }

    /// The caller; `None` for the root.
    pub fn parent(&self) -> Option<Self> {
        let parent = self.slot().parent;
        (parent != u32::MAX).then_some(Node {
            tree: self.tree,
            index: parent,
        })
    }

    /// The callees, in their order (a flame graph's by descending total, then name; a
    /// diff's by the largest absolute change, then name).
    pub fn children(&self) -> Children<'a, V> {
        Children {
            tree: self.tree,
            next: self.index + 1,
            end: self.slot().end,
        }
    }

    /// Whether it has callees.
    pub fn has_children(&self) -> bool {
        self.slot().end > self.index + 1
    }

    /// Every node below it, depth first.
    pub fn descendants(&self) -> impl ExactSizeIterator<Item = Self> + 'a {
        let tree = self.tree;
        (self.index + 1..self.slot().end).map(move |index| Node { tree, index })
    }
}

impl Node<'_, FlameValues> {
    /// Value of samples whose innermost frame this node is.
    pub fn self_value(&self) -> i64 {
        self.values().self_value
    }

    /// Value of samples through this node.
    pub fn total(&self) -> i64 {
        self.values().total
    }
}

impl Node<'_, DiffValues> {
    /// Total in the base.
    pub fn base(&self) -> i64 {
        self.values().base
    }

    /// Total in the compared profile.
    pub fn compare(&self) -> i64 {
        self.values().compare
    }

    /// Self in the base.
    pub fn base_self(&self) -> i64 {
        self.values().base_self
    }

    /// Self in the compared profile.
    pub fn compare_self(&self) -> i64 {
        self.values().compare_self
    }
}

/// The callees of a [`Node`], in order.
pub struct Children<'a, V> {
    tree: &'a Tree<V>,
    next: u32,
    end: u32,
}

impl<V> std::fmt::Debug for Children<'_, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field("next", &self.next)
            .field("end", &self.end)
            .finish()
    }
}

impl<'a, V: Copy> Iterator for Children<'a, V> {
    type Item = Node<'a, V>;

    fn next(&mut self) -> Option<Node<'a, V>> {
        if self.next >= self.end {
            return None;
        }
        let node = Node {
            tree: self.tree,
            index: self.next,
        };
        // The next callee starts where this one's subtree ends.
        self.next = node.slot().end;
        Some(node)
    }
}

impl<V: Copy> Tree<V> {
    /// The root (`total`).
    pub fn root(&self) -> Node<'_, V> {
        Node {
            tree: self,
            index: 0,
        }
    }

    /// Every node, depth first: a node before its callees, callees in their order.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = Node<'_, V>> {
        (0..self.nodes.len() as u32).map(move |index| Node { tree: self, index })
    }

    /// Node `index` (its position in [`Tree::nodes`]).
    pub fn node(&self, index: usize) -> Option<Node<'_, V>> {
        (index < self.nodes.len()).then_some(Node {
            tree: self,
            index: index as u32,
        })
    }

    /// How many nodes it has, the root included.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The depth of its deepest node (0 when the root has no callees).
    pub fn max_depth(&self) -> usize {
        self.nodes.iter().map(|n| n.depth).max().unwrap_or(0) as usize
    }

    /// The tree as JSON, `{"name", <fields>, "children": [...]}` from the root (children
    /// left out when there are none), without recursing: `fields` writes a node's fields
    /// after its name.
    fn write_json(&self, out: &mut Vec<u8>, fields: impl Fn(&mut Vec<u8>, Node<'_, V>)) {
        // Ends of the subtrees whose `children` array is open, innermost last.
        let mut open: Vec<u32> = Vec::new();
        for node in self.nodes() {
            let i = node.index;
            if i > 0 && node.slot().parent + 1 != i {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"name\":");
            json_string(out, node.name());
            fields(out, node);
            if node.has_children() {
                out.extend_from_slice(b",\"children\":[");
                open.push(node.slot().end);
            } else {
                out.push(b'}');
                while open.last() == Some(&(i + 1)) {
                    open.pop();
                    out.extend_from_slice(b"]}");
                }
            }
        }
    }
}

/// `s` as a JSON string, escaped as serde_json escapes it.
fn json_string(out: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail, and a str always serializes.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `v` as a JSON number.
fn json_number(out: &mut Vec<u8>, v: impl std::fmt::Display) {
    use std::io::Write as _;
    let _ = write!(out, "{v}");
}

/// A field `,"key":v` of a number.
fn json_field(out: &mut Vec<u8>, key: &str, v: impl std::fmt::Display) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    json_number(out, v);
}

impl Tree<DiffValues> {
    /// The diff as JSON: per node `name`, `base`, `compare`, `base_self`, `compare_self`
    /// and `children` (left out when empty), nested from the root.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 * self.nodes.len());
        self.write_json(&mut out, |out, n| {
            let v = n.values();
            json_field(out, "base", v.base);
            json_field(out, "compare", v.compare);
            json_field(out, "base_self", v.base_self);
            json_field(out, "compare_self", v.compare_self);
        });
        out
    }
}

/// A tree under construction in depth-first order: each node is added after its caller
/// and its caller's earlier callees' subtrees.
struct TreeBuilder<'a, V> {
    nodes: Vec<Slot<V>>,
    names: Vec<(&'a str, &'a str)>,
    name_of: HashMap<(&'a str, &'a str), u32>,
}

impl<'a, V: Copy> TreeBuilder<'a, V> {
    fn new() -> Self {
        Self {
            nodes: Vec::new(),
            names: Vec::new(),
            name_of: HashMap::default(),
        }
    }

    /// Adds a node below `parent` (`u32::MAX` for the root); its index.
    fn push(&mut self, parent: u32, name: (&'a str, &'a str), values: V) -> u32 {
        let names = &mut self.names;
        let name = *self.name_of.entry(name).or_insert_with(|| {
            names.push(name);
            names.len() as u32 - 1
        });
        let index = self.nodes.len() as u32;
        let depth = match self.nodes.get(parent as usize) {
            Some(p) => p.depth + 1,
            None => 0,
        };
        self.nodes.push(Slot {
            name,
            parent,
            end: index + 1,
            depth,
            values,
        });
        index
    }

    fn finish(mut self) -> Tree<V> {
        // A callee comes after its caller: from the last node back, each subtree's end is
        // known before its caller's is taken from it.
        for i in (1..self.nodes.len()).rev() {
            let (parent, end) = (self.nodes[i].parent as usize, self.nodes[i].end);
            let p = &mut self.nodes[parent];
            p.end = p.end.max(end);
        }
        Tree {
            nodes: self.nodes,
            names: self
                .names
                .into_iter()
                .map(|(n, f)| (n.to_owned(), f.to_owned()))
                .collect(),
        }
    }
}

/// A flame graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlameGraph {
    /// Profile type.
    pub profile_type: String,
    /// Unit of the values.
    pub unit: String,
    /// The call tree; its root is `total`: every stack starts below it.
    pub tree: Tree<FlameValues>,
    /// Nodes summed into `other` nodes to keep within `max_nodes`.
    pub truncated: usize,
}

/// Names of frames as a flame graph shows them, numbered as first met: the display name
/// and the source file of the first frame met with it.
#[derive(Default)]
struct Names<'a> {
    names: Vec<(Cow<'a, str>, &'a str)>,
    by_name: HashMap<Cow<'a, str>, u32>,
}

impl<'a> Names<'a> {
    fn named(&mut self, name: Cow<'a, str>, filename: &'a str) -> u32 {
        let names = &mut self.names;
        *self.by_name.entry(name).or_insert_with_key(|name| {
            names.push((name.clone(), filename));
            names.len() as u32 - 1
        })
    }

    fn id(&mut self, frame: Frame<'a>) -> u32 {
        self.named(frame.display_name(), frame.filename())
    }

    /// Calls `f` with every stack of `merged` as name ids, root first, and its value.
    /// A stack deeper than [`super::MAX_STACK_DEPTH`] ends in its marker frame.
    ///
    /// Stops early once the request the work is for has ended ([`frostdb_core::stopped_now`]:
    /// its deadline passed or its client left), checked every [`Pace::EVERY`] stacks: what
    /// it would have built is for nobody, and a report of a billion frames kept its query
    /// slot for minutes after the 408.
    ///
    /// [`Pace::EVERY`]: crate::decode::charge::Pace::EVERY
    fn each_stack(&mut self, merged: &'a Merged, mut f: impl FnMut(&[u32], i64)) {
        let mut walker = Walker::new(&merged.symbols);
        let mut path = Vec::new();
        let mut pace = crate::decode::charge::Pace::new();
        for (stack, value) in &merged.samples {
            if pace.tick().is_err() {
                return;
            }
            let cut = walker.root_first(*stack, &mut |frame| self.id(frame), &mut path);
            if cut > 0 {
                path.push(self.named(Cow::Owned(super::truncation_marker(cut)), ""));
            }
            f(&path, *value);
        }
    }

    fn name(&self, id: u32) -> (&str, &str) {
        self.names
            .get(id as usize)
            .map_or(("total", ""), |(n, f)| (n, f))
    }
}

/// Most nodes a call tree is built with (about 100 bytes each while it is built): past it,
/// the callees a call path would add are summed into one [`OTHER`] callee of the deepest
/// node already there, so every total stays exact and a merge of many deep distinct stacks
/// (a hundred thousand stacks of 4,096 frames each: 400 million paths) builds a bounded
/// tree. Flame graphs keep at most a million nodes of it.
pub const MAX_TREE_NODES: usize = 1 << 21;

/// A call tree under construction: nodes in an arena, children found by (parent, name).
struct Arena<T> {
    /// `(name, values)`; node 0 is the root.
    nodes: Vec<(u32, T)>,
    children: Vec<Vec<u32>>,
    child_of: HashMap<(u32, u32), u32>,
    /// Nodes made before paths are summed into [`OTHER`] callees ([`MAX_TREE_NODES`]).
    most: usize,
    /// The name id of [`OTHER`].
    other: u32,
}

impl<T: Default> Arena<T> {
    /// An empty tree whose [`OTHER`] callees are named `other`.
    fn new(other: u32) -> Self {
        Self {
            nodes: vec![(u32::MAX, T::default())],
            children: vec![Vec::new()],
            child_of: HashMap::default(),
            most: MAX_TREE_NODES,
            other,
        }
    }

    /// Adds the path of names `path` below the root: `on_path` is called with the values of
    /// every node it passes (the root included), `at_leaf` with the last one's. Past
    /// [`Arena::most`] nodes, the part of the path not in the tree yet ends in the
    /// [`OTHER`] callee of the node it leaves (one a node at most).
    fn add(&mut self, path: &[u32], on_path: impl Fn(&mut T), at_leaf: impl FnOnce(&mut T)) {
        let mut node = 0u32;
        on_path(&mut self.nodes[0].1);
        for &name in path {
            node = match self.child_of.get(&(node, name)) {
                Some(&child) => child,
                None if self.nodes.len() <= self.most => self.child(node, name),
                None => {
                    let other = match self.child_of.get(&(node, self.other)) {
                        Some(&child) => child,
                        None => self.child(node, self.other),
                    };
                    on_path(&mut self.nodes[other as usize].1);
                    at_leaf(&mut self.nodes[other as usize].1);
                    return;
                }
            };
            on_path(&mut self.nodes[node as usize].1);
        }
        at_leaf(&mut self.nodes[node as usize].1);
    }

    /// Makes `name` a callee of `node`.
    fn child(&mut self, node: u32, name: u32) -> u32 {
        let id = self.nodes.len() as u32;
        self.nodes.push((name, T::default()));
        self.children.push(Vec::new());
        self.children[node as usize].push(id);
        self.child_of.insert((node, name), id);
        id
    }
}

/// A node of a tree being finished: its arena node (`None` for one made up, as `other`),
/// its name and file, its values.
type Callee<'n, V> = (Option<u32>, (&'n str, &'n str), V);

impl<T: Copy> Arena<T> {
    /// The tree in depth-first order, without recursing: `callees` lists a node's callees
    /// in the order the tree keeps them.
    fn finish<'n, V: Copy>(
        &self,
        names: &'n Names<'_>,
        root: V,
        mut callees: impl FnMut(u32, &mut Vec<Callee<'n, V>>),
    ) -> Tree<V> {
        let mut tree = TreeBuilder::new();
        // Nodes to add, each with its caller's index, the next one last.
        let mut stack: Vec<(Callee<'n, V>, u32)> =
            vec![((Some(0), names.name(u32::MAX), root), u32::MAX)];
        let mut below = Vec::new();
        while let Some(((node, name, values), parent)) = stack.pop() {
            let index = tree.push(parent, name, values);
            if let Some(node) = node {
                below.clear();
                callees(node, &mut below);
                // The first callee is taken first.
                stack.extend(below.drain(..).rev().map(|callee| (callee, index)));
            }
        }
        tree.finish()
    }
}

/// A flame graph node's values: self and total.
type SelfTotal = (i64, i64);

impl From<SelfTotal> for FlameValues {
    fn from((self_value, total): SelfTotal) -> Self {
        FlameValues { self_value, total }
    }
}

impl<T: Copy> Arena<T> {
    /// Which nodes keep their own name when at most `max_nodes` may (the root always): the
    /// `max_nodes` of the largest `weight`, ties to the node made first. A callee's weight
    /// (a total) is never above its caller's and a callee is made after its caller, so a
    /// kept node's callers are kept.
    fn kept_by(&self, max_nodes: usize, weight: impl Fn(T) -> i128) -> Vec<bool> {
        let mut kept = vec![true; self.nodes.len()];
        if self.nodes.len() - 1 <= max_nodes {
            return kept;
        }
        kept[1..].fill(false);
        if max_nodes == 0 {
            return kept;
        }
        let key = |i: u32| (std::cmp::Reverse(weight(self.nodes[i as usize].1)), i);
        let mut order: Vec<u32> = (1..self.nodes.len() as u32).collect();
        order.select_nth_unstable_by_key(max_nodes - 1, |&i| key(i));
        for &i in &order[..max_nodes] {
            kept[i as usize] = true;
        }
        kept
    }
}

impl Arena<SelfTotal> {
    /// [`Arena::kept_by`] their totals.
    fn kept(&self, max_nodes: usize) -> Vec<bool> {
        self.kept_by(max_nodes, |(_, total)| i128::from(total))
    }

    /// The flame graph's tree; callees left out by `kept` are summed into one [`OTHER`]
    /// per caller.
    fn finish_graph(&self, names: &Names<'_>, kept: &[bool]) -> Tree<FlameValues> {
        self.finish(names, self.nodes[0].1.into(), |node, below| {
            let mut other: Option<i64> = None;
            for &c in &self.children[node as usize] {
                let (name, values) = self.nodes[c as usize];
                if kept[c as usize] {
                    below.push((Some(c), names.name(name), values.into()));
                } else {
                    let sum = other.get_or_insert(0);
                    *sum = sum.saturating_add(values.1);
                }
            }
            if let Some(other) = other {
                below.push((None, (OTHER, ""), (other, other).into()));
            }
            below.sort_by(|a, b| b.2.total.cmp(&a.2.total).then_with(|| a.1.0.cmp(b.1.0)));
        })
    }
}

/// Calls `f` with every stack of `merged`: its frames' display names, root first (outermost
/// first within a location), and its value. Each location's names are resolved once. A
/// stack deeper than [`super::MAX_STACK_DEPTH`] frames is cut, ending in its marker frame
/// ([`super::truncation_marker`]).
///
/// The stacks are walked twice, first for their names (which grow as stacks are walked),
/// then for `f`: no stack's path is kept past its call. Before, every stack's path was
/// kept for the second pass, 4 bytes a frame of every stack: gigabytes for a merge of deep
/// stacks, past what a report is charged.
pub fn each_named_stack(merged: &Merged, mut f: impl FnMut(&[&str], i64)) {
    let mut names = StackNames::of(merged);
    let named: Vec<Cow<'_, str>> = names
        .names
        .names
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    let mut path: Vec<&str> = Vec::new();
    names.each(|ids, value| {
        path.clear();
        path.extend(
            ids.iter()
                .map(|&i| named.get(i as usize).map_or("total", |n| n.as_ref())),
        );
        f(&path, value);
    });
}

/// The stacks of a merge as name ids (root first), walked as often as a report needs, with
/// the names the ids number: a report keyed by ids copies no name per frame (the DOT graph
/// did, in maps of strings: 19 s of CPU for a two-day merge, 15 times a flame graph's).
pub(super) struct StackNames<'a> {
    names: Names<'a>,
    merged: &'a Merged,
}

impl<'a> StackNames<'a> {
    /// Numbers every name of `merged`'s stacks (one walk).
    pub(super) fn of(merged: &'a Merged) -> Self {
        let mut names = Names::default();
        names.each_stack(merged, |_, _| {});
        Self { names, merged }
    }

    /// How many names there are: ids are below this.
    pub(super) fn len(&self) -> usize {
        self.names.names.len()
    }

    /// The display name of `id`.
    pub(super) fn name(&self, id: u32) -> &str {
        self.names.name(id).0
    }

    /// Calls `f` with every stack as name ids, root first, and its value.
    pub(super) fn each(&mut self, f: impl FnMut(&[u32], i64)) {
        self.names.each_stack(self.merged, f);
    }
}

/// `merged` keeping only the stacks under a call site: those whose frames, root first,
/// begin with `call_site`'s function names (Pyroscope's `stack_trace_selector.call_site`).
/// An empty call site keeps everything.
pub fn select_call_site(mut merged: Merged, call_site: &[impl AsRef<str>]) -> Merged {
    if call_site.is_empty() {
        return merged;
    }
    let mut keep = Vec::with_capacity(merged.samples.len());
    each_named_stack(&merged, |path, _| {
        keep.push(
            path.len() >= call_site.len()
                && path.iter().zip(call_site).all(|(a, b)| *a == b.as_ref()),
        )
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
        let mut arena = Arena::<SelfTotal>::new(names.named(Cow::Borrowed(OTHER), ""));
        names.each_stack(merged, |path, value| {
            arena.add(
                path,
                |n| n.1 = n.1.saturating_add(value),
                |n| n.0 = n.0.saturating_add(value),
            );
        });
        let kept = arena.kept(max_nodes);
        FlameGraph {
            profile_type: merged.profile_type.to_string(),
            unit: merged.profile_type.sample_unit.clone(),
            tree: arena.finish_graph(&names, &kept),
            truncated: kept.iter().filter(|k| !**k).count(),
        }
    }

    /// The root (`total`).
    pub fn root(&self) -> Node<'_, FlameValues> {
        self.tree.root()
    }

    /// The flame graph as JSON: `profile_type`, `unit`, `root` (per node `name`,
    /// `filename` when known, `self`, `total` and `children` when it has callees, nested)
    /// and `truncated` when nodes were left out.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 * self.tree.nodes.len() + 64);
        out.extend_from_slice(b"{\"profile_type\":");
        json_string(&mut out, &self.profile_type);
        out.extend_from_slice(b",\"unit\":");
        json_string(&mut out, &self.unit);
        out.extend_from_slice(b",\"root\":");
        self.tree.write_json(&mut out, |out, n| {
            if !n.filename().is_empty() {
                out.extend_from_slice(b",\"filename\":");
                json_string(out, n.filename());
            }
            let v = n.values();
            json_field(out, "self", v.self_value);
            json_field(out, "total", v.total);
        });
        if self.truncated != 0 {
            json_field(&mut out, "truncated", self.truncated);
        }
        out.push(b'}');
        out
    }

    /// The tree as a table, depth first: `id`, `parent` (null for the root), `depth`, `name`,
    /// `filename`, `self`, `total`.
    pub fn to_arrow(&self) -> Result<RecordBatch> {
        let nodes = || self.tree.nodes();
        let columns: Vec<(&str, ArrayRef, bool)> = vec![
            (
                "id",
                Arc::new(UInt32Array::from_iter_values(
                    nodes().map(|n| n.index() as u32),
                )),
                false,
            ),
            (
                "parent",
                Arc::new(UInt32Array::from_iter(
                    nodes().map(|n| n.parent().map(|p| p.index() as u32)),
                )),
                true,
            ),
            (
                "depth",
                Arc::new(UInt32Array::from_iter_values(
                    nodes().map(|n| n.depth() as u32),
                )),
                false,
            ),
            (
                "name",
                Arc::new(StringArray::from_iter_values(nodes().map(|n| n.name()))),
                false,
            ),
            (
                "filename",
                Arc::new(StringArray::from_iter_values(nodes().map(|n| n.filename()))),
                false,
            ),
            (
                "self",
                Arc::new(Int64Array::from_iter_values(
                    nodes().map(|n| n.self_value()),
                )),
                false,
            ),
            (
                "total",
                Arc::new(Int64Array::from_iter_values(nodes().map(|n| n.total()))),
                false,
            ),
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
    let other = names.named(Cow::Borrowed(OTHER), "");
    let mut paths: HashMap<Vec<u32>, i64> = HashMap::default();
    // Frames of the paths kept: past [`MAX_TREE_NODES`], new paths are one `other` line.
    let mut frames = 0usize;
    names.each_stack(merged, |path, value| {
        let sum = match paths.get_mut(path) {
            Some(sum) => sum,
            None if frames + path.len() <= MAX_TREE_NODES => {
                frames += path.len();
                paths.entry(path.to_vec()).or_default()
            }
            None => paths.entry(vec![other]).or_default(),
        };
        *sum = sum.saturating_add(value);
    });
    let clean: Vec<String> = names
        .names
        .iter()
        .map(|(n, _)| super::printable(n, '_').replace(';', "_"))
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

/// A diff: one tree of the call paths of a base and a compared profile, with both values
/// per node; callees by the largest absolute change first, then name.
pub type DiffTree = Tree<DiffValues>;

/// A diff node's values as they are summed: base and compared total, base and compared
/// self.
type DiffSums = (i64, i64, i64, i64);

impl From<DiffSums> for DiffValues {
    fn from((base, compare, base_self, compare_self): DiffSums) -> Self {
        DiffValues {
            base,
            compare,
            base_self,
            compare_self,
        }
    }
}

impl Arena<DiffSums> {
    /// [`Arena::kept_by`] the larger of their two totals.
    fn kept_diff(&self, max_nodes: usize) -> Vec<bool> {
        self.kept_by(max_nodes, |(base, compare, ..)| {
            i128::from(base.unsigned_abs().max(compare.unsigned_abs()))
        })
    }

    /// The diff's tree; callees left out by `kept` are summed into one [`OTHER`] per
    /// caller, both sides, so every total stays exact.
    fn finish_diff(&self, names: &Names<'_>, kept: &[bool]) -> DiffTree {
        self.finish(names, self.nodes[0].1.into(), |node, below| {
            let mut other: Option<(i64, i64)> = None;
            for &c in &self.children[node as usize] {
                let (name, values) = self.nodes[c as usize];
                if kept[c as usize] {
                    below.push((Some(c), names.name(name), DiffValues::from(values)));
                } else {
                    let (base, compare) = other.get_or_insert((0, 0));
                    *base = base.saturating_add(values.0);
                    *compare = compare.saturating_add(values.1);
                }
            }
            if let Some((base, compare)) = other {
                below.push((None, (OTHER, ""), (base, compare, base, compare).into()));
            }
            below.sort_by(|a, b| {
                (b.2.compare.saturating_sub(b.2.base))
                    .unsigned_abs()
                    .cmp(&a.2.compare.saturating_sub(a.2.base).unsigned_abs())
                    .then_with(|| a.1.0.cmp(b.1.0))
            });
        })
    }
}

/// The diff of two merged profiles (of the same type): one tree with both values per node.
pub fn diff(base: &Merged, compare: &Merged) -> DiffTree {
    diff_truncated(base, compare, usize::MAX)
}

/// [`diff`] of at most `max_nodes` nodes besides the root: those of the largest total on
/// either side; the callees left out summed into one [`OTHER`] per caller, so every
/// total stays exact (as [`FlameGraph::build_truncated`] keeps a flame graph's).
pub fn diff_truncated(base: &Merged, compare: &Merged, max_nodes: usize) -> DiffTree {
    let mut names = Names::default();
    let mut arena = Arena::<DiffSums>::new(names.named(Cow::Borrowed(OTHER), ""));
    names.each_stack(base, |path, v| {
        arena.add(
            path,
            |n| n.0 = n.0.saturating_add(v),
            |n| n.2 = n.2.saturating_add(v),
        );
    });
    names.each_stack(compare, |path, v| {
        arena.add(
            path,
            |n| n.1 = n.1.saturating_add(v),
            |n| n.3 = n.3.saturating_add(v),
        );
    });
    let kept = arena.kept_diff(max_nodes);
    arena.finish_diff(&names, &kept)
}

#[cfg(test)]
impl<V: Copy> Tree<V> {
    /// A tree of `(depth, name, values)` in depth-first order, the root first.
    pub(crate) fn from_depth_first(nodes: &[(usize, &str, V)]) -> Self {
        let mut tree = TreeBuilder::new();
        // The last node added at each depth.
        let mut at: Vec<u32> = Vec::new();
        for &(depth, name, values) in nodes {
            at.truncate(depth);
            let parent = at.last().copied().unwrap_or(u32::MAX);
            at.push(tree.push(parent, (name, ""), values));
        }
        tree.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_its_most_nodes_a_tree_sums_new_callees_into_one_other_each_node() {
        // Paths root → a → x{i} → y{i}: with room for four nodes, the first path is whole,
        // the second makes x1 and ends in x1's `other` callee, every later one in a's;
        // every total stays exact.
        const OTHER_ID: u32 = 99;
        let mut arena = Arena::<SelfTotal>::new(OTHER_ID);
        arena.most = 4;
        for i in 0..1_000u32 {
            arena.add(&[1, 10 + 2 * i, 11 + 2 * i], |n| n.1 += 1, |n| n.0 += 1);
        }
        assert!(
            arena.nodes.len() <= 2 * arena.most + 1,
            "{}",
            arena.nodes.len()
        );
        assert_eq!(arena.nodes[0].1, (0, 1_000));
        let a = arena.child_of[&(0, 1)];
        assert_eq!(arena.nodes[a as usize].1.1, 1_000);
        let other = arena.child_of[&(a, OTHER_ID)];
        let in_other = arena.nodes[other as usize].1;
        let whole: i64 = arena.children[a as usize]
            .iter()
            .map(|&c| arena.nodes[c as usize].1.1)
            .sum();
        assert_eq!(whole, 1_000, "the callees of a sum to its total");
        assert_eq!(in_other.0, in_other.1, "other is where those paths end");
        assert!(in_other.1 >= 998, "{in_other:?}");
    }
}
