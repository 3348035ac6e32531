//! A graph as SVG: nodes numbered as in the text IR, regions as nested
//! clusters, fused nodes as boxes that open to show their body (the page's
//! script shows the body's own drawing), edges labelled with the shape
//! they carry, and, when a profile is attached, each node's time.
//!
//! Deterministic: the same graph gives the same bytes (coordinates are
//! printed with one decimal; nothing iterates a hash map into the output).

use super::html::esc;
use super::layout::{self, Input, Rect};
use crate::ir::text::numbering;
use crate::ir::{Graph, Op};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Pixels per character of the 11px monospace labels.
const CHAR_W: f64 = 6.7;

/// Times to show on a graph's nodes: per printed node number, the node's
/// total time in milliseconds and its share of the run.
pub(crate) type NodeTimes = BTreeMap<usize, (f64, f64)>;

/// A drawn graph, and the drawings of the fused bodies it holds (by the
/// fused node's number), for the page to open on a click.
pub(crate) struct Drawing {
    pub svg: String,
    pub bodies: Vec<(usize, String)>,
}

/// Draws `graph`. `id` prefixes the DOM ids of its fused bodies
/// (`<id>-body-<n>`), so several drawings can share a page.
pub(crate) fn draw(graph: &Graph, id: &str, times: Option<&NodeTimes>) -> Drawing {
    let (order, number) = numbering(graph);
    let text = crate::ir::text::print(graph);
    // The top-level line of each node: the tooltip.
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('%')).collect();
    let regions = graph.regions();
    let mut input = Input::default();
    let mut labels: Vec<[String; 3]> = Vec::with_capacity(order.len());
    for (i, &nid) in order.iter().enumerate() {
        let node = graph.node(nid);
        let op = match &node.op {
            Op::Fused(body) => format!("fused {}", body.kind().name()),
            Op::Input(k) => format!("input {k}"),
            Op::Full(v) => format!("full {}", v.format(node.dtype)),
            other => other.mnemonic().to_string(),
        };
        let third = match times.and_then(|t| t.get(&i)) {
            Some((ms, share)) => format!("{} ({:.0}%)", fmt_ms(*ms), share * 100.0),
            None => String::new(),
        };
        let l = [format!("%{i} {op}"), format!("{}{}", node.dtype, node.shape), third];
        let chars = l.iter().map(|s| s.chars().count()).max().unwrap_or(4).min(48);
        let rows = if l[2].is_empty() { 2.0 } else { 3.0 };
        input.sizes.push((chars as f64 * CHAR_W + 14.0, rows * 14.0 + 8.0));
        // The region path, outermost first, the root left out.
        let mut path = Vec::new();
        let mut r = Some(node.region);
        while let Some(cur) = r.filter(|c| c.0 != 0 && (c.0 as usize) < regions.len()) {
            path.push(cur.0);
            r = regions[cur.0 as usize].parent.filter(|p| p.0 < cur.0);
        }
        path.reverse();
        input.groups.push(path);
        labels.push(l);
        for o in graph.operands(nid) {
            if let Some(&src) = number.get(&o) {
                input.edges.push((src, i));
            }
        }
    }
    let lay = layout::layout(&input);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{:.0}" height="{:.0}" viewBox="0 0 {:.0} {:.0}">"#,
        lay.width, lay.height, lay.width, lay.height
    );
    svg.push('\n');
    // Clusters, outermost first (a parent's id is below its children's).
    for (&g, polys) in &lay.clusters {
        let name = graph.region_name(crate::ir::RegionId(g));
        for (k, poly) in polys.iter().enumerate() {
            let points: Vec<String> = poly.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let label = if k == 0 {
                format!(
                    r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                    poly[0].0 + 5.0,
                    poly[0].1 + 12.0,
                    esc(&name)
                )
            } else {
                String::new()
            };
            let _ =
                writeln!(svg, r#"<g class="cluster"><polygon points="{}"/>{label}</g>"#, points.join(" "));
        }
    }
    for (e, pts) in lay.edges.iter().enumerate() {
        let (src, _) = input.edges[e];
        let mut d = format!("M{:.1} {:.1}", pts[0].0, pts[0].1);
        for w in pts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let my = (a.1 + b.1) / 2.0;
            let _ = write!(d, " C{:.1} {:.1} {:.1} {:.1} {:.1} {:.1}", a.0, my, b.0, my, b.0, b.1);
        }
        let node = graph.node(order[src]);
        let shape = format!("{}{}", node.dtype, node.shape);
        let (lx, ly) = label_point(pts);
        let _ = writeln!(
            svg,
            r#"<g class="edge"><path d="{d}"/><text x="{:.1}" y="{:.1}">{}</text></g>"#,
            lx,
            ly,
            esc(&shape)
        );
    }
    let outputs: Vec<usize> = graph.outputs().iter().filter_map(|o| number.get(o).copied()).collect();
    let max_ms = times.map(|t| t.values().map(|v| v.0).fold(0.0, f64::max)).unwrap_or(0.0);
    let mut bodies = Vec::new();
    for (i, &nid) in order.iter().enumerate() {
        let node = graph.node(nid);
        let r: Rect = lay.nodes[i];
        let mut class = String::from("node");
        let mut extra = String::new();
        match &node.op {
            Op::Fused(body) => {
                class.push_str(" fused");
                let body_id = format!("{id}-body-{i}");
                let _ = write!(extra, r#" data-body="{body_id}""#);
                bodies.push((i, draw(body.graph(), &body_id, None).svg));
            }
            Op::Input(_) | Op::Buffer(_) => class.push_str(" input"),
            Op::Full(_) => class.push_str(" const"),
            Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. } => class.push_str(" view"),
            _ => {}
        }
        if outputs.contains(&i) {
            class.push_str(" output");
        }
        let fill = match times.and_then(|t| t.get(&i)) {
            Some((ms, _)) if max_ms > 0.0 => format!(r#" style="fill:{}""#, heat(ms / max_ms)),
            _ => String::new(),
        };
        let _ = write!(
            svg,
            r#"<g class="{class}" data-node="{i}"{extra}><title>{}</title><rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="3"{fill}/>"#,
            esc(lines.get(i).copied().unwrap_or("")),
            r.x,
            r.y,
            r.w,
            r.h
        );
        for (k, line) in labels[i].iter().enumerate().filter(|(_, l)| !l.is_empty()) {
            let shown: String = line.chars().take(48).collect();
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" class="l{k}">{}</text>"#,
                r.x + 7.0,
                r.y + 15.0 + k as f64 * 14.0,
                esc(&shown)
            );
        }
        svg.push_str("</g>\n");
    }
    svg.push_str("</svg>\n");
    Drawing { svg, bodies }
}

/// Where an edge's label goes: on its first segment, a little below the
/// source, nudged right of the line.
fn label_point(pts: &[(f64, f64)]) -> (f64, f64) {
    let (a, b) = (pts[0], pts[1.min(pts.len() - 1)]);
    let t = if pts.len() > 2 { 0.5 } else { 0.45 };
    (a.0 + (b.0 - a.0) * t + 4.0, a.1 + (b.1 - a.1) * t + 3.0)
}

/// Milliseconds for people: `812 µs`, `3.21 ms`.
pub(crate) fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{:.0} µs", ms * 1000.0)
    } else {
        format!("{ms:.2} ms")
    }
}

/// White to orange by the share of the slowest node's time.
fn heat(f: f64) -> String {
    let f = f.clamp(0.0, 1.0);
    let g = (255.0 - 120.0 * f) as u8;
    let b = (255.0 - 200.0 * f) as u8;
    format!("#ff{g:02x}{b:02x}")
}
