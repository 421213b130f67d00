//! The top table, computed and printed as `go tool pprof -top` does: per function, flat
//! (samples whose innermost frame it is) and cum (samples whose stack holds it, once each),
//! sorted by flat, then name, then cum; values scaled as pprof scales them.

use super::{HashMap, Walker};
use std::borrow::Cow;
use std::fmt::Write as _;

use serde::Serialize;

use crate::store::Merged;

/// One row of the top table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopRow {
    /// Function (node) name, as pprof prints it.
    pub name: String,
    /// Value of samples whose innermost frame this is.
    pub flat: i64,
    /// Value of samples whose stack holds it.
    pub cum: i64,
    /// `(inline)` when every call into it was inlined, `(partial-inline)` when some were.
    pub inline: Option<&'static str>,
}

/// The top table of a merged profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopTable {
    /// Sample type (for the header).
    pub sample_type: String,
    /// Unit of the values.
    pub unit: String,
    /// The unit values are printed in (pprof picks one for the whole table).
    pub output_unit: String,
    /// Sum of all values.
    pub total: i64,
    /// Nodes left out for their small cum, and the cutoff.
    pub dropped: (usize, i64),
    /// Rows, in pprof's order.
    pub rows: Vec<TopRow>,
}

/// The top table's nodes, numbered as first met, by function (or location) and by name.
#[derive(Default)]
struct Nodes<'m> {
    node_of: HashMap<(bool, u64), u32>,
    by_name: HashMap<Cow<'m, str>, u32>,
    names: Vec<Cow<'m, str>>,
    /// Nodes some frame of which was inlined into its caller.
    inlined_somewhere: Vec<bool>,
}

impl<'m> Nodes<'m> {
    /// The node named `name`.
    fn named(&mut self, name: Cow<'m, str>) -> u32 {
        let names = &mut self.names;
        *self.by_name.entry(name).or_insert_with_key(|name| {
            names.push(name.clone());
            names.len() as u32 - 1
        })
    }

    /// The node of `frame`, and whether the frame was inlined.
    fn frame(&mut self, frame: crate::symbols::Frame<'m>) -> (u32, bool) {
        let key = match (frame.function_name(), frame.function_id()) {
            (Some(_), Some(function)) => (true, function),
            _ => (false, frame.location_id()),
        };
        let node = match self.node_of.get(&key) {
            Some(&node) => node,
            None => {
                let node = self.named(frame.printable_name());
                self.node_of.insert(key, node);
                node
            }
        };
        if frame.inlined() {
            if self.inlined_somewhere.len() <= node as usize {
                self.inlined_somewhere.resize(node as usize + 1, false);
            }
            self.inlined_somewhere[node as usize] = true;
        }
        (node, frame.inlined())
    }
}

#[derive(Default)]
struct NodeAcc {
    flat: i64,
    cum: i64,
}

/// `go tool pprof`'s default `-nodefraction`.
pub const NODE_FRACTION: f64 = 0.005;
/// `go tool pprof`'s default `-edgefraction`.
pub const EDGE_FRACTION: f64 = 0.001;

/// The top table's flat column alone: per function (named as the table names its nodes),
/// the value of the samples whose innermost frame it is, largest first, ties by name. It
/// reads one location a stack (each distinct location resolved once), so it costs the
/// stacks, not their frames: for a view without cum (functions by self value, an alert on
/// a function's share), about a fifth of [`TopTable::build`] on a fleet's merge. A stack
/// deeper than [`super::MAX_STACK_DEPTH`] counts its real leaf here, where the table
/// gives its value to the cut's marker.
pub fn flat_by_function(merged: &Merged) -> Vec<(String, i64)> {
    let mut nodes = Nodes::default();
    let mut flat: Vec<i64> = Vec::new();
    // Per partition: per location index, the node of its innermost frame plus one (0: not
    // met yet).
    let mut leaf_nodes: Vec<(u32, Vec<u32>)> = Vec::new();
    for &(stack, value) in &merged.samples {
        let Some((p, &[leaf, ..])) = merged.symbols.locations(stack) else {
            continue; // an empty stack has no flat
        };
        let at = match leaf_nodes.iter().position(|(id, _)| *id == p.id()) {
            Some(at) => at,
            None => {
                leaf_nodes.push((p.id(), vec![0; p.counts().locations]));
                leaf_nodes.len() - 1
            }
        };
        let slots = &mut leaf_nodes[at].1;
        if leaf as usize >= slots.len() {
            slots.resize(leaf as usize + 1, 0);
        }
        let node = match slots[leaf as usize] {
            0 => {
                let mut innermost = None;
                crate::symbols::location_frames(p, leaf, &mut |f| {
                    innermost.get_or_insert(f);
                });
                let Some(frame) = innermost else { continue };
                let node = nodes.frame(frame).0;
                slots[leaf as usize] = node + 1;
                node
            }
            n => n - 1,
        } as usize;
        if node >= flat.len() {
            flat.resize(node + 1, 0);
        }
        flat[node] = flat[node].saturating_add(value);
    }
    let mut rows: Vec<(String, i64)> = nodes
        .names
        .into_iter()
        .zip(flat)
        .map(|(name, flat)| (name.into_owned(), flat))
        .collect();
    rows.sort_by(|a, b| {
        b.1.unsigned_abs()
            .cmp(&a.1.unsigned_abs())
            .then_with(|| a.0.cmp(&b.0))
    });
    rows
}

impl TopTable {
    /// Builds the table of `merged` with pprof's default node and edge fractions.
    pub fn build(merged: &Merged) -> Self {
        Self::build_with(merged, NODE_FRACTION, EDGE_FRACTION)
    }

    /// Builds the table, leaving out nodes whose cum is below `node_fraction` of the total
    /// and ignoring call edges below `edge_fraction` for the inline labels (pprof's
    /// `-nodefraction` and `-edgefraction`).
    pub fn build_with(merged: &Merged, node_fraction: f64, edge_fraction: f64) -> Self {
        // Nodes are numbered as first met; a frame finds its node through its function (or,
        // unsymbolized, its location), and each location's frames are resolved once.
        let mut nodes = Nodes::default();
        let mut acc: Vec<NodeAcc> = Vec::new();
        // The last stack (numbered from 1) that counted each node's cum.
        let mut counted: Vec<usize> = Vec::new();
        let mut total = 0i64;
        let mut walker = Walker::new(&merged.symbols);
        let mut frames = Vec::new();
        for (n, (stack, value)) in merged.samples.iter().enumerate() {
            let stamp = n + 1;
            total = total.saturating_add(*value);
            let cut = walker.root_first(*stack, &mut |frame| nodes.frame(frame), &mut frames);
            if cut > 0 {
                // The marker is the leaf of a cut stack: its flat is the stack's value.
                frames.push((
                    nodes.named(Cow::Owned(super::truncation_marker(cut))),
                    false,
                ));
            }
            for &(node, _) in &frames {
                let i = node as usize;
                if i >= acc.len() {
                    acc.resize_with(i + 1, NodeAcc::default);
                    counted.resize(i + 1, 0);
                }
                if counted[i] != stamp {
                    counted[i] = stamp;
                    acc[i].cum = acc[i].cum.saturating_add(*value);
                }
            }
            if let Some(&(leaf, _)) = frames.last() {
                let flat = &mut acc[leaf as usize].flat;
                *flat = flat.saturating_add(*value);
            }
        }
        let Nodes {
            names,
            mut inlined_somewhere,
            ..
        } = nodes;
        acc.resize_with(names.len(), NodeAcc::default);
        inlined_somewhere.resize(names.len(), false);
        let flat_total: i64 = acc.iter().map(|n| n.flat).fold(0, i64::saturating_add);
        let node_cutoff = (flat_total as f64 * node_fraction).abs() as i64;
        let edge_cutoff = (flat_total as f64 * edge_fraction).abs() as i64;
        let kept: Vec<bool> = acc
            .iter()
            .map(|n| n.cum.unsigned_abs() >= node_cutoff.unsigned_abs())
            .collect();
        let dropped = (kept.iter().filter(|k| !**k).count(), node_cutoff);

        // Inline labels: a node is `(inline)` when every (heavy enough, kept) call into it
        // was inlined, `(partial-inline)` when some were. A node never inlined gets no label
        // whatever its calls, so only calls into nodes inlined somewhere are weighed: a
        // second pass over the stacks (their locations already resolved), usually skipped.
        let mut labels = vec![(false, false); names.len()];
        if inlined_somewhere.iter().any(|i| *i) {
            // (caller, callee) -> edge; per edge: (weight, every call inlined), and the last
            // stack that counted its weight.
            let mut edge_of: HashMap<(u32, u32), u32> = HashMap::default();
            let mut edges: Vec<(i64, bool, usize)> = Vec::new();
            // Every location was resolved by the first pass.
            const UNSEEN: (u32, bool) = (u32::MAX, false);
            for (n, (stack, value)) in merged.samples.iter().enumerate() {
                // A cut stack's marker is never inlined: its call is not weighed.
                walker.root_first(*stack, &mut |_| UNSEEN, &mut frames);
                for pair in frames.windows(2) {
                    let ((caller, _), (callee, inlined)) = (pair[0], pair[1]);
                    if caller == callee
                        || caller == UNSEEN.0
                        || !inlined_somewhere.get(callee as usize).is_some_and(|i| *i)
                    {
                        continue;
                    }
                    let e = *edge_of.entry((caller, callee)).or_insert_with(|| {
                        edges.push((0, true, 0));
                        edges.len() as u32 - 1
                    });
                    let e = &mut edges[e as usize];
                    if e.2 != n + 1 {
                        e.2 = n + 1;
                        e.0 = e.0.saturating_add(*value);
                        e.1 &= inlined;
                    }
                }
            }
            for (&(caller, callee), &e) in &edge_of {
                let (weight, inline, _) = edges[e as usize];
                if weight.unsigned_abs() < edge_cutoff.unsigned_abs()
                    || !kept[caller as usize]
                    || !kept[callee as usize]
                {
                    continue;
                }
                let l = &mut labels[callee as usize];
                if inline {
                    l.0 = true;
                } else {
                    l.1 = true;
                }
            }
        }
        let mut rows: Vec<TopRow> = names
            .iter()
            .zip(&acc)
            .zip(labels)
            .zip(kept)
            .filter(|(_, kept)| *kept)
            .map(|(((name, n), label), _)| TopRow {
                name: name.to_string(),
                flat: n.flat,
                cum: n.cum,
                inline: match label {
                    (true, true) => Some("(partial-inline)"),
                    (true, false) => Some("(inline)"),
                    _ => None,
                },
            })
            .collect();
        rows.sort_by(|a, b| {
            b.flat
                .unsigned_abs()
                .cmp(&a.flat.unsigned_abs())
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| b.cum.unsigned_abs().cmp(&a.cum.unsigned_abs()))
        });
        let unit = merged.profile_type.sample_unit.clone();
        let output_unit = output_unit(&rows, total, &unit);
        TopTable {
            sample_type: merged.profile_type.sample_type.clone(),
            unit,
            output_unit,
            total,
            dropped,
            rows,
        }
    }

    /// A value as the table prints it.
    pub fn format(&self, value: i64) -> String {
        scaled_label_to(value, &self.unit, &self.output_unit)
    }

    /// The table as `go tool pprof -top` prints it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let shown: i64 = self
            .rows
            .iter()
            .map(|r| r.flat)
            .fold(0, i64::saturating_add);
        let _ = writeln!(out, "Type: {}", self.sample_type);
        let _ = writeln!(
            out,
            "Showing nodes accounting for {}, {} of {} total",
            self.format(shown),
            percentage(shown, self.total).trim(),
            self.format(self.total)
        );
        if self.dropped.0 > 0 {
            let _ = writeln!(
                out,
                "Dropped {} nodes (cum <= {})",
                self.dropped.0,
                self.format(self.dropped.1)
            );
        }
        let _ = writeln!(
            out,
            "{:>10} {:>5}% {:>5}% {:>10} {:>5}%",
            "flat", "flat", "sum", "cum", "cum"
        );
        let mut sum = 0i64;
        for r in &self.rows {
            sum = sum.saturating_add(r.flat);
            let inline = r.inline.map(|i| format!(" {i}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "{:>10} {} {} {:>10} {}  {}{}",
                self.format(r.flat),
                percentage(r.flat, self.total),
                percentage(sum, self.total),
                self.format(r.cum),
                percentage(r.cum, self.total),
                super::printable(&r.name, '\u{FFFD}'),
                inline
            );
        }
        out
    }
}

/// pprof's choice of one output unit for a table: the unit of the smallest non-zero node
/// value, or of a hundred times it when the total needs a larger unit.
fn output_unit(rows: &[TopRow], total: i64, unit: &str) -> String {
    let mut min = 0i64;
    for r in rows {
        let v = if r.flat != 0 {
            r.flat.saturating_abs()
        } else {
            r.cum.saturating_abs()
        };
        if v > 0 && (min == 0 || v < min) {
            min = v;
        }
    }
    let max = total;
    if min == 0 {
        min = max;
    }
    let (_, min_unit) = scale(min, unit);
    let (_, max_unit) = scale(max, unit);
    let mut chosen = min_unit;
    if min_unit != max_unit && min.saturating_mul(100) < max {
        chosen = scale(min.saturating_mul(100), unit).1;
    }
    if chosen.is_empty() {
        unit.to_owned()
    } else {
        chosen.to_owned()
    }
}

/// pprof's `ScaledLabel(value, unit, to)`: `value` in the unit `to`, two decimals, a
/// trailing `.00` dropped.
pub fn scaled_label_to(value: i64, unit: &str, to: &str) -> String {
    let (v, u) = convert(value, unit, to);
    let s = format!("{v:.2}");
    let s = s.strip_suffix(".00").unwrap_or(&s).to_owned();
    if s == "0" || s == "-0" {
        return "0".to_owned();
    }
    format!("{s}{u}")
}

fn sniff(unit: &str) -> String {
    let mut sniffed = unit.to_lowercase();
    if sniffed.chars().count() > 2
        && let Some(s) = sniffed.strip_suffix('s')
    {
        sniffed = s.to_owned();
    }
    sniffed
}

/// `value` in `unit` converted to the unit `to` (a unit name, or "minimum" for the best).
fn convert(value: i64, unit: &str, to: &str) -> (f64, String) {
    if to == "minimum" || to == "auto" {
        let (v, u) = scale(value, unit);
        return (v, u.to_owned());
    }
    if value < 0 {
        let (v, u) = convert(value.saturating_neg(), unit, to);
        return (-v, u);
    }
    let from = sniff(unit);
    for units in [MEMORY, TIME] {
        let Some(f) = units.iter().find(|u| u.aliases.contains(&from.as_str())) else {
            continue;
        };
        let v = value as f64 * f.factor;
        let target = sniff(to);
        return match units
            .iter()
            .find(|u| u.aliases.contains(&target.as_str()) || u.name == to)
        {
            Some(t) => (v / t.factor, t.name.to_owned()),
            None if std::ptr::eq(units, MEMORY) => (v, "B".to_owned()),
            None => (v / 1e9, "s".to_owned()),
        };
    }
    match to {
        "count" | "sample" | "unit" => (value as f64, String::new()),
        other if other == unit => (
            value as f64,
            if matches!(unit, "count" | "sample" | "unit") {
                String::new()
            } else {
                other.to_owned()
            },
        ),
        other => (value as f64, other.to_owned()),
    }
}

/// pprof's percentage: `  100%`, `%5.2f%%` from 1%, `%5.2g%%` below.
pub fn percentage(value: i64, total: i64) -> String {
    let ratio = if total == 0 {
        0.0
    } else {
        (value as f64 / total as f64).abs() * 100.0
    };
    if (99.95..=100.05).contains(&ratio) {
        "  100%".to_owned()
    } else if ratio >= 1.0 {
        format!("{ratio:5.2}%")
    } else {
        format!("{:>5}%", go_g2(ratio))
    }
}

/// Go's `%.2g`: two significant digits, exponent form below 1e-4, no trailing zeros.
fn go_g2(v: f64) -> String {
    if v == 0.0 {
        return "0".to_owned();
    }
    let exp = v.abs().log10().floor() as i32;
    // Round to two significant digits first; rounding can bump the exponent.
    let scale = 10f64.powi(1 - exp);
    let rounded = (v * scale).round() / scale;
    let exp = if rounded == 0.0 {
        exp
    } else {
        rounded.abs().log10().floor() as i32
    };
    if !(-4..2).contains(&exp) {
        let mantissa = rounded / 10f64.powi(exp);
        let m = format!("{mantissa:.1}");
        let m = m.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let decimals = (1 - exp).max(0) as usize;
    let s = format!("{rounded:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

struct Unit {
    name: &'static str,
    aliases: &'static [&'static str],
    factor: f64,
}

const MEMORY: &[Unit] = &[
    Unit {
        name: "B",
        aliases: &["b", "byte"],
        factor: 1.0,
    },
    Unit {
        name: "kB",
        aliases: &["kb", "kbyte", "kilobyte"],
        factor: 1024.0,
    },
    Unit {
        name: "MB",
        aliases: &["mb", "mbyte", "megabyte"],
        factor: 1048576.0,
    },
    Unit {
        name: "GB",
        aliases: &["gb", "gbyte", "gigabyte"],
        factor: 1073741824.0,
    },
    Unit {
        name: "TB",
        aliases: &["tb", "tbyte", "terabyte"],
        factor: 1099511627776.0,
    },
    Unit {
        name: "PB",
        aliases: &["pb", "pbyte", "petabyte"],
        factor: 1125899906842624.0,
    },
];

const TIME: &[Unit] = &[
    Unit {
        name: "ns",
        aliases: &["ns", "nanosecond"],
        factor: 1.0,
    },
    Unit {
        name: "us",
        aliases: &["μs", "us", "microsecond"],
        factor: 1e3,
    },
    Unit {
        name: "ms",
        aliases: &["ms", "millisecond"],
        factor: 1e6,
    },
    Unit {
        name: "s",
        aliases: &["s", "sec", "second"],
        factor: 1e9,
    },
    Unit {
        name: "hrs",
        aliases: &["hour", "hr"],
        factor: 3.6e12,
    },
];

/// pprof's `ScaledLabel(value, unit, "minimum")`: the largest unit the value reaches, two
/// decimals, a trailing `.00` dropped.
pub fn scaled_label(value: i64, unit: &str) -> String {
    scaled_label_to(value, unit, "minimum")
}

fn scale(value: i64, unit: &str) -> (f64, &'static str) {
    if value < 0 {
        let (v, u) = scale(value.saturating_neg(), unit);
        return (-v, u);
    }
    let sniffed = sniff(unit);
    for units in [MEMORY, TIME] {
        let Some(from) = units.iter().find(|u| u.aliases.contains(&sniffed.as_str())) else {
            continue;
        };
        let v = value as f64 * from.factor;
        let mut best: Option<&Unit> = None;
        for u in units {
            if best.is_none_or(|b| u.factor >= b.factor) && v / u.factor >= 1.0 {
                best = Some(u);
            }
        }
        return match best {
            Some(u) => (v / u.factor, u.name),
            // Below every unit: the default (B for memory, s for time).
            None if std::ptr::eq(units, MEMORY) => (v, "B"),
            None => (v / 1e9, "s"),
        };
    }
    (value as f64, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_pprof() {
        assert_eq!(scaled_label(10_000_000, "nanoseconds"), "10ms");
        assert_eq!(scaled_label(1_500_000_000, "nanoseconds"), "1.50s");
        assert_eq!(scaled_label(3_930_000_000, "nanoseconds"), "3.93s");
        assert_eq!(scaled_label(524_288, "bytes"), "512kB");
        assert_eq!(scaled_label(1_572_864, "bytes"), "1.50MB");
        assert_eq!(scaled_label(1234, "count"), "1234");
        assert_eq!(scaled_label(0, "nanoseconds"), "0");
        assert_eq!(scaled_label(250, "microseconds"), "250us");
        assert_eq!(
            scaled_label_to(1_366_000_000, "nanoseconds", "ms"),
            "1366ms"
        );
        assert_eq!(scaled_label_to(6_922_793, "bytes", "kB"), "6760.54kB");
        assert_eq!(scaled_label_to(5, "count", "count"), "5");
        assert_eq!(percentage(1, 1), "  100%");
        assert_eq!(percentage(8973, 10000), "89.73%");
        assert_eq!(percentage(5, 1000), "  0.5%");
        assert_eq!(percentage(12, 10000), " 0.12%");
        assert_eq!(percentage(1, 1_000_000), "0.0001%");
        assert_eq!(percentage(1, 100_000_000), "1e-06%");
    }

    /// A stored name's control characters are not written raw: a newline forged a row of
    /// the table, an escape sequence drove the terminal it was printed on.
    #[test]
    fn a_name_writes_no_control_character() {
        let row = |name: &str| TopRow {
            name: name.to_owned(),
            flat: 5,
            cum: 5,
            inline: None,
        };
        let table = TopTable {
            sample_type: "cpu".into(),
            unit: "nanoseconds".into(),
            output_unit: "ns".into(),
            total: 10,
            dropped: (0, 0),
            rows: vec![
                row("x\n    90.00s 99.00% 99.00%     90.00s 99.00%  crypto/sha256.block"),
                row("a\u{1b}[1A\u{1b}[2Kb\r\u{2028}"),
            ],
        };
        let text = table.render();
        let before = TopTable {
            rows: Vec::new(),
            ..table.clone()
        }
        .render();
        assert_eq!(text.lines().count(), before.lines().count() + 2, "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        assert!(
            text.contains("a\u{FFFD}[1A\u{FFFD}[2Kb\u{FFFD}\u{FFFD}"),
            "{text:?}"
        );
        assert_eq!(
            super::super::svg::tests_escape("a\u{1}<b>"),
            "a\u{FFFD}&lt;b&gt;"
        );
    }
}
