//! What a profiler shows of a merged profile: a pprof file, a flame graph (JSON, Arrow, SVG),
//! the top table, folded stacks, diffs.

/// Maps keyed by names and symbols built per query: foldhash, not SipHash (a report hashes
/// every frame of every stack it shows; the keys come from stored symbols).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod dot;
pub mod pprof;
pub mod pyroscope;
pub mod svg;
pub mod top;
pub mod tree;

use crate::store::Merged;

/// `name` as text output writes it: each control character (a newline would forge a row,
/// an escape sequence would drive the reader's terminal) and line or paragraph separator
/// as `replacement`.
pub fn printable(name: &str, replacement: char) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    match name.contains(bad) {
        false => std::borrow::Cow::Borrowed(name),
        true => name
            .chars()
            .map(|c| if bad(c) { replacement } else { c })
            .collect::<String>()
            .into(),
    }
}

use crate::symbols::{Frame, Partition, StackId, Symbols, location_frame_count, location_frames};

/// The formats a merged profile is written in: one dispatch for the server's query API and
/// the CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The flame graph tree as JSON ([`tree::FlameGraph`]), truncated to `max_nodes`.
    FlameGraph,
    /// The top table as JSON ([`top::TopTable`]).
    Top,
    /// The top table as text, as `go tool pprof -top` prints it.
    TopText,
    /// Folded stacks, one `root;…;leaf value` line per stack.
    Folded,
    /// Gzipped pprof; each sample carries its series' labels when the merge kept series
    /// apart ([`Format::keeps_series`]).
    Pprof,
    /// The flame graph as an SVG image, truncated to `max_nodes`.
    Svg,
    /// The call graph in Graphviz DOT ([`dot`]), its `max_nodes` largest functions.
    Dot,
}

impl Format {
    /// The names [`Format::parse`] accepts, for error messages.
    pub const NAMES: &'static str = "flamegraph (or json), top, top-text, folded, pprof, svg, dot";

    /// The format named `name`.
    pub fn parse(name: &str) -> Result<Self, crate::Error> {
        Ok(match name {
            "flamegraph" | "json" => Self::FlameGraph,
            "top" => Self::Top,
            "top-text" => Self::TopText,
            "folded" => Self::Folded,
            "pprof" => Self::Pprof,
            "svg" | "flamegraph-svg" => Self::Svg,
            "dot" => Self::Dot,
            other => {
                return Err(crate::Error::Query(format!(
                    "format {other:?} ({})",
                    Self::NAMES
                )));
            }
        })
    }

    /// Its media type.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::FlameGraph | Self::Top => "application/json",
            Self::TopText | Self::Folded => "text/plain; charset=utf-8",
            Self::Pprof => "application/octet-stream",
            Self::Svg => "image/svg+xml",
            Self::Dot => "text/vnd.graphviz; charset=utf-8",
        }
    }

    /// Whether the format shows series apart (pprof's sample labels), so the merge should
    /// keep them ([`crate::MergeOptions::by_series`]).
    pub fn keeps_series(self) -> bool {
        self == Self::Pprof
    }
}

/// How [`render`] shapes its output.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// Nodes kept: of a flame graph (the rest summed into `other` per parent; default
    /// [`tree::DEFAULT_MAX_NODES`]) or of a DOT graph (default [`dot::DEFAULT_MAX_NODES`]).
    pub max_nodes: Option<usize>,
    /// The top table leaves out nodes below this fraction of the total.
    pub node_fraction: f64,
    /// The SVG's title.
    pub title: String,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            max_nodes: None,
            node_fraction: top::NODE_FRACTION,
            title: String::new(),
        }
    }
}

/// `merged` written in `format`.
pub fn render(
    merged: &Merged,
    format: Format,
    options: &RenderOptions,
) -> Result<Vec<u8>, crate::Error> {
    fn json(v: &impl serde::Serialize) -> Result<Vec<u8>, crate::Error> {
        serde_json::to_vec(v).map_err(|e| crate::Error::Query(format!("writing JSON: {e}")))
    }
    let graph_nodes = options.max_nodes.unwrap_or(tree::DEFAULT_MAX_NODES);
    Ok(match format {
        Format::FlameGraph => tree::FlameGraph::build_truncated(merged, graph_nodes).to_json(),
        Format::Top => json(&top::TopTable::build_with(
            merged,
            options.node_fraction,
            top::EDGE_FRACTION,
        ))?,
        Format::TopText => {
            top::TopTable::build_with(merged, options.node_fraction, top::EDGE_FRACTION)
                .render()
                .into_bytes()
        }
        Format::Folded => tree::folded(merged).into_bytes(),
        Format::Pprof => pprof::encode_gzip(&pprof::to_profile(merged)?)?,
        Format::Svg => {
            let graph = tree::FlameGraph::build_truncated(merged, graph_nodes);
            svg::render(&graph, &options.title).into_bytes()
        }
        Format::Dot => {
            dot::render(merged, options.max_nodes.unwrap_or(dot::DEFAULT_MAX_NODES)).into_bytes()
        }
    })
}

/// The most frames of one stack a report shows, inlined frames counted (as
/// [`crate::Limits::max_stack_depth`] counts them on ingest, whose default this is). A deeper
/// stack (stored before that limit counted inlined frames, or under a larger limit) is cut
/// between locations: it keeps its root-most locations whose frames fit in one frame less,
/// and ends in one marker frame named by [`truncation_marker`] that takes the stack's value
/// as its self, so every total stays exact and a cut stack is at most this deep (an exported
/// pprof is accepted back under the default limit). Every report cuts stacks this way:
/// flame graphs (JSON, Arrow, SVG, Pyroscope's levels and tree), diffs, top tables, folded
/// stacks, DOT, pprof, [`tree::each_named_stack`] and [`tree::select_call_site`].
pub const MAX_STACK_DEPTH: usize = 4096;

/// The name of the frame that ends a stack cut by [`MAX_STACK_DEPTH`]: how many frames were
/// left out, e.g. `[truncated: 95,905 frames]`.
pub fn truncation_marker(frames_left_out: usize) -> String {
    let digits = frames_left_out.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(d);
    }
    let s = if frames_left_out == 1 { "" } else { "s" };
    format!("[truncated: {grouped} frame{s}]")
}

/// Of a stack's `locations` (leaf first) in `p`, how many root-most ones a report shows
/// and how many frames the others hold (0 when the stack is shown whole; see
/// [`MAX_STACK_DEPTH`]).
pub(crate) fn shown_locations(p: &Partition, locations: &[u32]) -> (usize, usize) {
    let counts = || locations.iter().rev().map(|&l| location_frame_count(p, l));
    let mut frames = 0;
    for n in counts() {
        frames += n;
        if frames > MAX_STACK_DEPTH {
            break;
        }
    }
    if frames <= MAX_STACK_DEPTH {
        return (locations.len(), 0);
    }
    // Room for the marker.
    let (mut shown, mut kept) = (0, 0);
    for n in counts() {
        if kept + n >= MAX_STACK_DEPTH {
            break;
        }
        (shown, kept) = (shown + 1, kept + n);
    }
    (shown, counts().sum::<usize>() - kept)
}

/// Walks stacks root first, resolving each distinct location's frames to a key once (a
/// report's node, a name) however many stacks hold it: stacks share most of their locations,
/// so a report's cost follows the distinct locations, not the frames of every stack.
pub(crate) struct Walker<'a, K> {
    symbols: &'a Symbols,
    /// Per partition: per location index, `start << 32 | len` of its keys in `keys`, plus
    /// one (0: not resolved yet).
    spans: Vec<(u32, Vec<u64>)>,
    /// Keys of resolved locations, outermost frame first within each.
    keys: Vec<K>,
}

impl<'a, K: Copy> Walker<'a, K> {
    pub(crate) fn new(symbols: &'a Symbols) -> Self {
        Self {
            symbols,
            spans: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// Replaces `out` with the keys of `stack`'s frames, root first (outermost first within
    /// a location); `key` resolves a frame the first time its location is met. Returns how
    /// many frames were left out below them (0 for a whole stack), which the caller ends the
    /// stack with as one [`truncation_marker`] frame (see [`MAX_STACK_DEPTH`]).
    pub(crate) fn root_first(
        &mut self,
        stack: StackId,
        key: &mut impl FnMut(Frame<'a>) -> K,
        out: &mut Vec<K>,
    ) -> usize {
        out.clear();
        let Some((p, locations)) = self.symbols.locations(stack) else {
            return 0;
        };
        let at = match self.spans.iter().position(|(id, _)| *id == p.id()) {
            Some(at) => at,
            None => {
                self.spans.push((p.id(), vec![0; p.counts().locations]));
                self.spans.len() - 1
            }
        };
        for &l in locations.iter().rev() {
            let (start, len) = self.resolve(at, p, l, key);
            if out.len() + len > MAX_STACK_DEPTH {
                // Too deep (rare): keep the locations shown (a location has as many keys as
                // frames), which are among those in `out` already.
                let (shown, left_out) = shown_locations(p, locations);
                let kept = locations[locations.len() - shown..]
                    .iter()
                    .map(|&l| location_frame_count(p, l))
                    .sum();
                out.truncate(kept);
                return left_out;
            }
            out.extend_from_slice(&self.keys[start..start + len]);
        }
        0
    }

    fn resolve(
        &mut self,
        at: usize,
        p: &'a Partition,
        l: u32,
        key: &mut impl FnMut(Frame<'a>) -> K,
    ) -> (usize, usize) {
        let slots = &mut self.spans[at].1;
        if l as usize >= slots.len() {
            // Written after the walk began: the partition is still taking symbols.
            slots.resize(l as usize + 1, 0);
        }
        let span = slots[l as usize];
        if span != 0 {
            let span = span - 1;
            return ((span >> 32) as usize, (span & 0xffff_ffff) as usize);
        }
        let start = self.keys.len();
        location_frames(p, l, &mut |f| self.keys.push(key(f)));
        self.keys[start..].reverse();
        let len = self.keys.len() - start;
        self.spans[at].1[l as usize] = ((start as u64) << 32 | len as u64) + 1;
        (start, len)
    }
}
