//! Flame graphs (a call tree with self and total per node), folded stacks, and diffs.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use serde::Serialize;

use crate::error::Result;
use crate::store::Merged;
use crate::symbols::{StackId, Symbols};

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
}

#[derive(Default)]
struct Building<'a> {
    filename: &'a str,
    self_value: i64,
    total: i64,
    children: BTreeMap<Cow<'a, str>, Building<'a>>,
}

impl Building<'_> {
    fn finish(self, name: String) -> Node {
        let mut children: Vec<Node> = self
            .children
            .into_iter()
            .map(|(n, b)| b.finish(n.into_owned()))
            .collect();
        children.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.name.cmp(&b.name)));
        Node {
            name,
            filename: self.filename.to_owned(),
            self_value: self.self_value,
            total: self.total,
            children,
        }
    }
}

/// Root-first frames of `stack`: display name and file.
fn path<'a>(symbols: &'a Symbols, stack: StackId, out: &mut Vec<(Cow<'a, str>, &'a str)>) {
    out.clear();
    symbols.for_each_frame(stack, |f| out.push((f.display_name(), f.filename())));
    out.reverse();
}

impl FlameGraph {
    /// Builds the flame graph of `merged`.
    pub fn build(merged: &Merged) -> Self {
        let mut root = Building::default();
        let mut frames = Vec::new();
        for (stack, value) in &merged.samples {
            root.total += value;
            let mut node = &mut root;
            path(&merged.symbols, *stack, &mut frames);
            for (name, file) in frames.drain(..) {
                node = node.children.entry(name).or_default();
                if node.filename.is_empty() {
                    node.filename = file;
                }
                node.total += value;
            }
            node.self_value += value;
        }
        FlameGraph {
            profile_type: merged.profile_type.to_string(),
            unit: merged.profile_type.sample_unit.clone(),
            root: root.finish("total".to_owned()),
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
    let mut lines: BTreeMap<String, i64> = BTreeMap::new();
    let mut frames = Vec::new();
    for (stack, value) in &merged.samples {
        path(&merged.symbols, *stack, &mut frames);
        let names: Vec<String> = frames
            .drain(..)
            .map(|(n, _)| n.replace([';', '\n'], "_"))
            .collect();
        *lines.entry(names.join(";")).or_default() += value;
    }
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

#[derive(Default)]
struct DiffBuilding<'a> {
    base: i64,
    compare: i64,
    base_self: i64,
    compare_self: i64,
    children: BTreeMap<Cow<'a, str>, DiffBuilding<'a>>,
}

impl<'a> DiffBuilding<'a> {
    fn add(&mut self, frames: &mut Vec<(Cow<'a, str>, &'a str)>, value: i64, compare: bool) {
        let mut node = self;
        let bump = |n: &mut DiffBuilding<'_>| {
            if compare {
                n.compare += value;
            } else {
                n.base += value;
            }
        };
        bump(node);
        for (name, _) in frames.drain(..) {
            node = node.children.entry(name).or_default();
            bump(node);
        }
        if compare {
            node.compare_self += value;
        } else {
            node.base_self += value;
        }
    }

    fn finish(self, name: String) -> DiffNode {
        let mut children: Vec<DiffNode> = self
            .children
            .into_iter()
            .map(|(n, b)| b.finish(n.into_owned()))
            .collect();
        children.sort_by(|a, b| {
            (b.compare - b.base)
                .abs()
                .cmp(&(a.compare - a.base).abs())
                .then_with(|| a.name.cmp(&b.name))
        });
        DiffNode {
            name,
            base: self.base,
            compare: self.compare,
            base_self: self.base_self,
            compare_self: self.compare_self,
            children,
        }
    }
}

/// The diff of two merged profiles (of the same type): one tree with both values per node.
pub fn diff(base: &Merged, compare: &Merged) -> DiffNode {
    let mut root = DiffBuilding::default();
    let mut frames = Vec::new();
    for (stack, value) in &base.samples {
        path(&base.symbols, *stack, &mut frames);
        root.add(&mut frames, *value, false);
    }
    for (stack, value) in &compare.samples {
        path(&compare.symbols, *stack, &mut frames);
        root.add(&mut frames, *value, true);
    }
    root.finish("total".to_owned())
}
