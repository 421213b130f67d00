//! Flame graphs in Grafana Pyroscope's encoding: what its query API (`querier.v1.FlameGraph`,
//! `FlameGraphDiff`) and its legacy render API (flamebearer) return, and what Grafana's flame
//! graph panel and `@pyroscope/flamegraph` draw.
//!
//! Names are numbered once each, `names[0]` being `total`. Level `d` lists the nodes of depth
//! `d` left to right, each as 4 numbers: its x offset, total, self and name index. A node's
//! self is drawn first, its callees after it; x offsets are delta-encoded within a level (the
//! gap from the end of the node before). A diff lists 7 numbers per node: left offset, total
//! and self, right offset, total and self, name index; each side's offsets are encoded apart.

use super::HashMap;
use super::tree::{DiffTree, DiffValues, FlameGraph, FlameValues, Node, OTHER};
use crate::api::querier::v1 as querier;

/// A flame graph in Pyroscope's encoding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Levels {
    /// Node names, each once; `names[0]` is `total`.
    pub names: Vec<String>,
    /// Per depth, the nodes' numbers ([`WIDTH`] per node, or [`DIFF_WIDTH`] for a diff).
    pub levels: Vec<Vec<i64>>,
    /// The root's total (for a diff: left plus right).
    pub total: i64,
    /// The largest self of any node.
    pub max_self: i64,
}

/// Numbers per node of a flame graph: x offset, total, self, name index.
pub const WIDTH: usize = 4;

/// Numbers per node of a diff: left offset, total, self; right offset, total, self; name.
pub const DIFF_WIDTH: usize = 7;

/// Numbers names as they are met; `total` is the first.
#[derive(Default)]
struct NameIndex {
    names: Vec<String>,
    index: HashMap<String, i64>,
}

impl NameIndex {
    fn of(&mut self, name: &str) -> i64 {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = self.names.len() as i64;
        self.names.push(name.to_owned());
        self.index.insert(name.to_owned(), i);
        i
    }
}

impl Levels {
    /// `graph` (truncated as it was built) in Pyroscope's encoding.
    pub fn of(graph: &FlameGraph) -> Self {
        let mut names = NameIndex::default();
        names.of("total");
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut max_self = 0;
        // Depth first, callees left to right: each level's nodes come in x order.
        let mut stack: Vec<(Node<'_, FlameValues>, i64)> = vec![(graph.root(), 0)];
        let mut next = Vec::new();
        while let Some((node, x)) = stack.pop() {
            let depth = node.depth();
            if levels.len() == depth {
                levels.push(Vec::new());
            }
            let name = if depth == 0 { 0 } else { names.of(node.name()) };
            levels[depth].extend([x, node.total(), node.self_value(), name]);
            max_self = max_self.max(node.self_value());
            // Self first, then the callees; pushed in reverse so the leftmost pops first.
            // Totals saturate at i64::MAX: so do the offsets, rather than wrap.
            let mut at = x.saturating_add(node.self_value());
            for child in node.children() {
                next.push((child, at));
                at = at.saturating_add(child.total());
            }
            stack.extend(next.drain(..).rev());
        }
        for level in &mut levels {
            delta_encode(level, WIDTH, 0);
        }
        Levels {
            names: names.names,
            levels,
            total: graph.root().total(),
            max_self,
        }
    }

    /// The diff `tree` (from [`super::tree::diff`]) in Pyroscope's encoding, keeping about
    /// `max_nodes` nodes: those whose larger side reaches the `max_nodes`-th largest; each
    /// node's other callees are summed into one `other` callee per side.
    pub fn of_diff(tree: &DiffTree, max_nodes: usize) -> Self {
        let min = diff_threshold(tree, max_nodes);
        let mut names = NameIndex::default();
        names.of("total");
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut max_self = 0;
        // A node to place: a tree's, or the `other` summing a parent's dropped callees
        // (left and right totals, which are also their selves).
        enum Item<'a> {
            Node(Node<'a, DiffValues>),
            Other(i64, i64),
        }
        // (item, depth, left x, right x), depth first, callees left to right.
        let mut stack: Vec<(Item<'_>, usize, i64, i64)> = vec![(Item::Node(tree.root()), 0, 0, 0)];
        let mut next = Vec::new();
        while let Some((item, depth, lx, rx)) = stack.pop() {
            if levels.len() == depth {
                levels.push(Vec::new());
            }
            let (name, values, node) = match item {
                Item::Node(n) => {
                    let v = n.values();
                    (
                        n.name(),
                        [v.base, v.base_self, v.compare, v.compare_self],
                        Some(n),
                    )
                }
                Item::Other(l, r) => (OTHER, [l, l, r, r], None),
            };
            let [base, base_self, compare, compare_self] = values;
            let name = if depth == 0 { 0 } else { names.of(name) };
            levels[depth].extend([lx, base, base_self, rx, compare, compare_self, name]);
            max_self = max_self.max(base_self).max(compare_self);
            let (mut l, mut r) = (
                lx.saturating_add(base_self),
                rx.saturating_add(compare_self),
            );
            let (mut other_l, mut other_r) = (0i64, 0i64);
            for child in node.iter().flat_map(|n| n.children()) {
                let v = child.values();
                if v.base.max(v.compare) >= min {
                    next.push((Item::Node(child), depth + 1, l, r));
                    l = l.saturating_add(v.base);
                    r = r.saturating_add(v.compare);
                } else {
                    other_l = other_l.saturating_add(v.base);
                    other_r = other_r.saturating_add(v.compare);
                }
            }
            if other_l != 0 || other_r != 0 {
                next.push((Item::Other(other_l, other_r), depth + 1, l, r));
            }
            stack.extend(next.drain(..).rev());
        }
        for level in &mut levels {
            delta_encode(level, DIFF_WIDTH, 0);
            delta_encode(level, DIFF_WIDTH, 3);
        }
        let root = tree.root().values();
        Levels {
            names: names.names,
            levels,
            total: root.base.saturating_add(root.compare),
            max_self,
        }
    }

    /// As `querier.v1.FlameGraph`.
    pub fn to_proto(&self) -> querier::FlameGraph {
        querier::FlameGraph {
            names: self.names.clone(),
            levels: self.proto_levels(),
            total: self.total,
            max_self: self.max_self,
        }
    }

    /// As `querier.v1.FlameGraphDiff`, with each side's total.
    pub fn to_proto_diff(&self, left_ticks: i64, right_ticks: i64) -> querier::FlameGraphDiff {
        querier::FlameGraphDiff {
            names: self.names.clone(),
            levels: self.proto_levels(),
            total: self.total,
            max_self: self.max_self,
            left_ticks,
            right_ticks,
        }
    }

    fn proto_levels(&self) -> Vec<querier::Level> {
        self.levels
            .iter()
            .map(|values| querier::Level {
                values: values.clone(),
            })
            .collect()
    }

    /// Decodes the x offsets back: per level, each node's `(absolute x, total, self, name)`
    /// (of the left side at `at` 0, the right at 3 for a diff), to check an encoding.
    pub fn absolute(&self, width: usize, at: usize) -> Vec<Vec<(i64, i64, i64, String)>> {
        self.levels
            .iter()
            .map(|level| {
                let mut end = 0i64;
                level
                    .chunks(width)
                    .map(|n| {
                        let x = end.saturating_add(n[at]);
                        end = x.saturating_add(n[at + 1]);
                        let name = self.names[n[width - 1] as usize].clone();
                        (x, n[at + 1], n[at + 2], name)
                    })
                    .collect()
            })
            .collect()
    }
}

/// A flame graph as Pyroscope's legacy render API answers (`/pyroscope/render`, version 1 of
/// the flamebearer JSON that `@pyroscope/flamegraph` draws).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Flamebearer {
    /// Always 1.
    pub version: u32,
    /// The graph.
    pub flamebearer: FlamebearerGraph,
    /// What the values are.
    pub metadata: FlamebearerMetadata,
    /// The total over time of what was merged.
    pub timeline: Option<Timeline>,
    /// Per value of the grouping label, its timeline.
    pub groups: Option<std::collections::BTreeMap<String, Timeline>>,
    /// A diff's left total.
    #[serde(rename = "leftTicks", skip_serializing_if = "Option::is_none")]
    pub left_ticks: Option<i64>,
    /// A diff's right total.
    #[serde(rename = "rightTicks", skip_serializing_if = "Option::is_none")]
    pub right_ticks: Option<i64>,
}

/// The graph of a [`Flamebearer`]: [`Levels`] under the legacy names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FlamebearerGraph {
    /// Node names, `total` first.
    pub names: Vec<String>,
    /// Per depth, 4 numbers per node (7 for a diff).
    pub levels: Vec<Vec<i64>>,
    /// The root's total.
    #[serde(rename = "numTicks")]
    pub num_ticks: i64,
    /// The largest self.
    #[serde(rename = "maxSelf")]
    pub max_self: i64,
}

/// What a [`Flamebearer`]'s values are.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FlamebearerMetadata {
    /// `single`, or `double` for a diff.
    pub format: String,
    /// The profiler that sent it (unknown here: empty).
    #[serde(rename = "spyName")]
    pub spy_name: String,
    /// Samples per second (CPU in nanoseconds: 10⁹, so values read as time).
    #[serde(rename = "sampleRate")]
    pub sample_rate: u64,
    /// `samples`, `objects`, `bytes`, or the sample unit.
    pub units: String,
    /// The sample type.
    pub name: String,
}

/// Values over time, a sample per `duration_delta` seconds from `start_time`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Timeline {
    /// Unix seconds of the first sample.
    #[serde(rename = "startTime")]
    pub start_time: i64,
    /// The values, 0 where nothing was stored.
    pub samples: Vec<u64>,
    /// Seconds per sample.
    #[serde(rename = "durationDelta")]
    pub duration_delta: i64,
}

impl Timeline {
    /// The timeline of `points` (`(Unix ms, value)`, in time order) over `[start_ms, end_ms)`
    /// at `step_s` seconds per sample, its start aligned down to the step and its end up:
    /// the last step, partly past `end_ms`, holds what was stored since the one before (the
    /// newest data, which the flame graph of the range holds too).
    pub fn new(points: &[(i64, f64)], start_ms: i64, end_ms: i64, step_s: i64) -> Self {
        let step_ms = step_s.max(1) * 1000;
        let start = start_ms.div_euclid(step_ms) * step_ms;
        let end = end_ms
            .div_euclid(step_ms)
            .saturating_add(i64::from(end_ms.rem_euclid(step_ms) != 0))
            .saturating_mul(step_ms);
        let len = ((end - start) / step_ms).clamp(0, MAX_TIMELINE) as usize;
        let mut samples = vec![0u64; len];
        for &(t, v) in points {
            if t >= start && t < end {
                let i = ((t - start) / step_ms) as usize;
                if let Some(s) = samples.get_mut(i) {
                    // Saturating, as every sum of a report is: series' points of up to
                    // 2^63 each in one bucket.
                    *s = s.saturating_add(v.max(0.0).round() as u64);
                }
            }
        }
        Timeline {
            start_time: start.div_euclid(1000),
            samples,
            duration_delta: step_s.max(1),
        }
    }
}

/// The most samples a timeline holds (a range over a step this long is refused before).
pub const MAX_TIMELINE: i64 = 1 << 20;

/// The step of a render's timeline for a range, as Pyroscope picks it: about 1,500 points,
/// at least 15 s, rounded to a usual interval.
pub fn timeline_step_s(start_ms: i64, end_ms: i64) -> i64 {
    const STEPS_S: [i64; 12] = [15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 86_400];
    let want_s = (end_ms.saturating_sub(start_ms) / 1500).div_euclid(1000);
    STEPS_S
        .iter()
        .copied()
        .find(|s| *s >= want_s)
        .unwrap_or_else(|| want_s.div_euclid(86_400).max(1) * 86_400)
}

impl Flamebearer {
    /// `levels` (a flame graph, or a diff when `ticks` gives its sides' totals) of a profile
    /// type's `sample_type` and `sample_unit`.
    pub fn new(
        levels: Levels,
        sample_type: &str,
        sample_unit: &str,
        ticks: Option<(i64, i64)>,
    ) -> Self {
        // Pyroscope's mapping (`ExportToFlamebearer`) for the types it names; the rest get
        // units its flame graph component can print (it knows samples, objects, goroutines,
        // bytes, lock_nanoseconds, lock_samples and exceptions, and fails on others), so a
        // wall-time or mutex-delay graph shows seconds rather than breaking its tooltip.
        let (units, sample_rate) = match (sample_type, sample_unit) {
            ("cpu", _) => ("samples", 1_000_000_000),
            ("inuse_objects" | "alloc_objects" | "goroutine" | "samples", _) => ("objects", 100),
            ("delay", "nanoseconds") => ("lock_nanoseconds", 100),
            ("contentions", _) => ("lock_samples", 100),
            ("exceptions", _) => ("exceptions", 100),
            (_, "nanoseconds") => ("samples", 1_000_000_000),
            (_, "bytes") => ("bytes", 100),
            (_, "count") => ("objects", 100),
            (_, unit) => (unit, 100),
        };
        Flamebearer {
            version: 1,
            flamebearer: FlamebearerGraph {
                names: levels.names,
                levels: levels.levels,
                num_ticks: levels.total,
                max_self: levels.max_self,
            },
            metadata: FlamebearerMetadata {
                format: if ticks.is_some() { "double" } else { "single" }.to_owned(),
                spy_name: String::new(),
                sample_rate,
                units: units.to_owned(),
                name: sample_type.to_owned(),
            },
            timeline: None,
            groups: None,
            left_ticks: ticks.map(|t| t.0),
            right_ticks: ticks.map(|t| t.1),
        }
    }
}

/// `graph` in Pyroscope's serialized tree (the `tree` of `SelectMergeStacktracesResponse`):
/// depth first from a nameless root, per node its name's length and bytes, its self, and its
/// count of callees, each an unsigned varint, the callees' subtrees following.
pub fn tree_bytes(graph: &FlameGraph) -> Vec<u8> {
    let mut out = Vec::new();
    // The tree's own order is this one: depth first, callees in order.
    for node in graph.tree.nodes() {
        let name = if node.depth() == 0 { "" } else { node.name() };
        varint(&mut out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
        varint(&mut out, node.self_value().max(0) as u64);
        varint(&mut out, node.children().count() as u64);
    }
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Each node's x offset (at `at` in each `width`-number group) as the gap from the end of the
/// node before it in the level.
fn delta_encode(level: &mut [i64], width: usize, at: usize) {
    let mut end = 0;
    for node in level.chunks_mut(width) {
        let (x, total) = (node[at], node[at + 1]);
        node[at] = x.saturating_sub(end);
        end = x.saturating_add(total);
    }
}

/// The smallest larger-side total a diff node may have to be kept within `max_nodes`.
fn diff_threshold(tree: &DiffTree, max_nodes: usize) -> i64 {
    let mut sizes: Vec<i64> = tree
        .root()
        .descendants()
        .map(|n| n.base().max(n.compare()))
        .collect();
    if sizes.len() <= max_nodes {
        return i64::MIN;
    }
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes[max_nodes.saturating_sub(1)].max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::report::tree::Tree;

    /// Series' points summed into one bucket saturate: two of 2^63 (each a sum that
    /// saturated at `i64::MAX`) wrapped to 0 before.
    /// A range ending within a step keeps that step: the newest data, stamped at its
    /// step's start, was dropped (up to 30 minutes of a 30-day range).
    #[test]
    fn a_timeline_keeps_its_last_partial_step() {
        let t = Timeline::new(&[(0, 1.0), (20_000, 2.0)], 0, 29_000, 10);
        assert_eq!(t.samples, [1, 0, 2]);
        let aligned = Timeline::new(&[(0, 1.0), (10_000, 2.0)], 0, 20_000, 10);
        assert_eq!(aligned.samples, [1, 2]);
    }

    #[test]
    fn a_timelines_bucket_saturates() {
        let big = i64::MAX as f64;
        let t = Timeline::new(&[(0, big), (1, big), (10_000, 5.0)], 0, 20_000, 10);
        assert_eq!(t.samples, vec![u64::MAX, 5]);
    }

    /// A flame graph of `(depth, name, self)` in depth-first order, totals summed.
    fn graph(nodes: &[(usize, &str, i64)]) -> FlameGraph {
        let with_totals: Vec<(usize, &str, FlameValues)> = nodes
            .iter()
            .enumerate()
            .map(|(i, &(depth, name, self_value))| {
                let below: i64 = nodes[i + 1..]
                    .iter()
                    .take_while(|n| n.0 > depth)
                    .map(|n| n.2)
                    .fold(0, i64::saturating_add);
                let total = self_value.saturating_add(below);
                (depth, name, FlameValues { self_value, total })
            })
            .collect();
        FlameGraph {
            profile_type: "t".into(),
            unit: "count".into(),
            tree: Tree::from_depth_first(&with_totals),
            truncated: 0,
        }
    }

    #[test]
    fn levels_place_self_first_and_delta_encode_offsets() {
        // total(0) -> main(1) -> {a(2, self 3), b(4, self 5) -> a(6)}; main self 1.
        let graph = graph(&[
            (0, "total", 0),
            (1, "main", 1),
            (2, "a", 3),
            (2, "b", 5),
            (3, "a", 6),
        ]);
        let l = Levels::of(&graph);
        assert_eq!(l.names, ["total", "main", "a", "b"]);
        assert_eq!(l.total, 15);
        assert_eq!(l.max_self, 6);
        assert_eq!(
            l.levels,
            vec![
                vec![0, 15, 0, 0],
                vec![0, 15, 1, 1],
                // a at x 1 (after main's self), b right after a ends (gap 0).
                vec![1, 3, 3, 2, 0, 11, 5, 3],
                // b's a after b's self: x = 4 + 5 = 9; gap from the level's start.
                vec![9, 6, 6, 2],
            ]
        );
        let abs = l.absolute(WIDTH, 0);
        assert_eq!(abs[2][1], (4, 11, 5, "b".to_owned()));
        assert_eq!(abs[3][0], (9, 6, 6, "a".to_owned()));
    }

    /// Values saturate at i64::MAX when summed (two stacks of i64::MAX each): the levels'
    /// offsets saturate with them, never wrap (or panic where overflow is checked).
    #[test]
    fn levels_of_totals_at_the_limit_saturate() {
        let graph = graph(&[
            (0, "total", 0),
            (1, "a", i64::MAX),
            (1, "b", i64::MAX),
            (2, "c", 1),
        ]);
        let l = Levels::of(&graph);
        assert_eq!(l.total, i64::MAX);
        assert_eq!(
            l.levels[1],
            [0, i64::MAX, i64::MAX, 1, 0, i64::MAX, i64::MAX, 2]
        );
        let abs = l.absolute(WIDTH, 0);
        assert_eq!(abs[1][1].0, i64::MAX);
        assert_eq!(abs[2][0], (i64::MAX, 1, 1, "c".to_owned()));
    }

    #[test]
    fn tree_bytes_are_names_selves_and_callee_counts_depth_first() {
        let graph = graph(&[(0, "total", 0), (1, "a", 1), (2, "b", 200)]);
        assert_eq!(
            tree_bytes(&graph),
            [0, 0, 1, 1, b'a', 1, 1, 1, b'b', 0xc8, 0x01, 0]
        );
    }

    #[test]
    fn timelines_align_to_the_step_and_fill_gaps_with_zero() {
        let t = Timeline::new(
            &[(20_000, 5.0), (31_000, 2.0), (35_000, 1.0)],
            15_000,
            75_000,
            10,
        );
        assert_eq!(t.start_time, 10);
        assert_eq!(t.duration_delta, 10);
        // Buckets 10..80 s (the last for 70..75 s): 20 s holds 5, 30 s holds 3.
        assert_eq!(t.samples, [0, 5, 3, 0, 0, 0, 0]);
        assert_eq!(timeline_step_s(0, 3_600_000), 15);
        assert_eq!(timeline_step_s(0, 7 * 86_400_000), 600);
    }

    fn dnode(depth: usize, name: &str, l: (i64, i64), r: (i64, i64)) -> (usize, &str, DiffValues) {
        let values = DiffValues {
            base: l.0,
            base_self: l.1,
            compare: r.0,
            compare_self: r.1,
        };
        (depth, name, values)
    }

    #[test]
    fn diffs_encode_both_sides_and_sum_what_is_cut_into_other() {
        let root = Tree::from_depth_first(&[
            dnode(0, "total", (10, 0), (20, 0)),
            dnode(1, "big", (8, 8), (15, 15)),
            dnode(1, "x", (1, 1), (3, 3)),
            dnode(1, "y", (1, 1), (2, 2)),
        ]);
        let all = Levels::of_diff(&root, 100);
        assert_eq!(all.total, 30);
        assert_eq!(all.levels[1].len(), 3 * DIFF_WIDTH);
        let right = all.absolute(DIFF_WIDTH, 3);
        assert_eq!(right[1][1], (15, 3, 3, "x".to_owned()));
        assert_eq!(right[1][2], (18, 2, 2, "y".to_owned()));
        // Two nodes: big, and the rest in one `other` whose sides sum x and y.
        let cut = Levels::of_diff(&root, 1);
        let left = cut.absolute(DIFF_WIDTH, 0);
        let right = cut.absolute(DIFF_WIDTH, 3);
        assert_eq!(left[1][1], (8, 2, 2, OTHER.to_owned()));
        assert_eq!(right[1][1], (15, 5, 5, OTHER.to_owned()));
        assert_eq!(cut.levels[1].len(), 2 * DIFF_WIDTH);
    }
}
