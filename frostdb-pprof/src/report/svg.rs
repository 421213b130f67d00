//! A flame graph as a standalone SVG (hover a frame for its values).

use std::fmt::Write as _;

use super::top::scaled_label;
use super::tree::FlameGraph;

const WIDTH: f64 = 1200.0;
const ROW: f64 = 18.0;

fn escape(s: &str) -> String {
    // Control characters XML does not allow (one made the whole image unreadable).
    super::printable(s, '\u{FFFD}')
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// [`escape`], for the report's tests.
#[cfg(test)]
pub(super) fn tests_escape(s: &str) -> String {
    escape(s)
}

/// A warm color chosen by the name, so a function keeps its color across graphs.
fn color(name: &str) -> String {
    let h = name.bytes().fold(2166136261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16777619)
    });
    let r = 200 + (h % 55);
    let g = 80 + ((h >> 8) % 120);
    let b = (h >> 16) % 60;
    format!("rgb({r},{g},{b})")
}

/// Renders `graph` (root at the top, callees below, widths proportional to totals).
pub fn render(graph: &FlameGraph, title: &str) -> String {
    let total = graph.root().total().max(1) as f64;
    let rows = graph.tree.max_depth() + 1;
    let height = (rows as f64 + 2.0) * ROW;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="4" y="13" font-size="13">{}</text>"#,
        escape(title)
    );
    let mut stack = vec![(graph.root(), 0.0f64, 0usize)];
    while let Some((node, x, level)) = stack.pop() {
        let w = node.total() as f64 / total * WIDTH;
        if w < 0.3 {
            continue;
        }
        let y = ROW * (level as f64 + 1.0);
        let tip = format!(
            "{} (self {}, total {}, {:.2}%)",
            node.name(),
            scaled_label(node.self_value(), &graph.unit),
            scaled_label(node.total(), &graph.unit),
            node.total() as f64 / total * 100.0
        );
        let _ = write!(
            out,
            r#"<g><title>{}</title><rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{:.1}" fill="{}" rx="2"/>"#,
            escape(&tip),
            ROW - 1.0,
            color(node.name())
        );
        let chars = (w / 7.0) as usize;
        if chars >= 3 {
            let label: String = if node.name().chars().count() > chars {
                node.name()
                    .chars()
                    .take(chars.saturating_sub(2))
                    .chain("..".chars())
                    .collect()
            } else {
                node.name().to_owned()
            };
            let _ = write!(
                out,
                r#"<text x="{:.2}" y="{:.1}">{}</text>"#,
                x + 3.0,
                y + ROW - 5.0,
                escape(&label)
            );
        }
        let _ = writeln!(out, "</g>");
        let mut cx = x;
        for child in node.children() {
            stack.push((child, cx, level + 1));
            cx += child.total() as f64 / total * WIDTH;
        }
    }
    out.push_str("</svg>\n");
    out
}
