//! The plan as pictures: the schedule as a table, streams as swimlanes
//! with their events, and the arena as a chart of offset × schedule step
//! (which value holds which bytes at each step) with the lower bound
//! marked. Everything is read from the planned graph's tables; a graph
//! without them (a dump before planning) draws as "not planned".

use super::html::esc;
use super::svg::{fmt_ms, NodeTimes};
use crate::ir::text::numbering;
use crate::ir::{Graph, Op, Placement};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The plan section's HTML.
pub(crate) fn section(graph: &Graph, times: Option<&NodeTimes>) -> String {
    let t = graph.tables();
    if t.schedule.is_none() {
        return "<p>This graph carries no plan (the planning passes did not run).</p>".into();
    }
    let mut out = String::new();
    if let Some(m) = &t.memory {
        let _ = write!(
            out,
            "<p class=\"totals\">arena <b>{}</b> · lower bound <b>{}</b> · one allocation per value {} · {} step(s) · {} stream(s)</p>",
            bytes(m.arena_bytes),
            bytes(m.lower_bound),
            bytes(m.naive_bytes),
            numbering(graph).0.len(),
            t.streams.as_ref().map_or(1, |s| s.count)
        );
    }
    out.push_str("<h3>Streams</h3>\n");
    out.push_str(&swimlanes(graph));
    out.push_str("<h3>Schedule</h3>\n");
    out.push_str(&schedule(graph, times));
    out
}

/// `1.5 KiB`: bytes for people (and the exact count).
pub(crate) fn bytes(b: u64) -> String {
    if b < 1024 {
        format!("{b} B")
    } else if b < 1 << 20 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn placement_text(p: &Placement, number: &dyn Fn(crate::ir::NodeId) -> String) -> String {
    match p {
        Placement::Arena { offset, bytes, in_place_of: Some(of) } => {
            format!("arena {offset}+{bytes} in place of {}", number(*of))
        }
        Placement::Arena { offset, bytes, in_place_of: None } => format!("arena {offset}+{bytes}"),
        Placement::Alias(of) => format!("view of {}", number(*of)),
        Placement::Input => "input".into(),
        Placement::Output => "output".into(),
        Placement::OverInput(of) => format!("output over {}", number(*of)),
        Placement::Constant => "constant".into(),
    }
}

fn op_text(graph: &Graph, id: crate::ir::NodeId) -> String {
    match &graph.node(id).op {
        Op::Fused(b) => format!("fused {}", b.kind().name()),
        other => other.mnemonic().to_string(),
    }
}

/// One row per step: node, op, stream, events, bytes, live range, region, time.
fn schedule(graph: &Graph, times: Option<&NodeTimes>) -> String {
    let (order, number) = numbering(graph);
    let name = |id: crate::ir::NodeId| number.get(&id).map_or("%?".to_string(), |n| format!("%{n}"));
    let t = graph.tables();
    let mut waits: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut records: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    if let Some(s) = &t.streams {
        for (e, ev) in s.events.iter().enumerate() {
            if let Some(&n) = number.get(&ev.after) {
                records.entry(n).or_default().push(format!("e{e}"));
            }
            for w in &ev.waiters {
                if let Some(&n) = number.get(w) {
                    waits.entry(n).or_default().push(format!("e{e}"));
                }
            }
        }
    }
    let mut out = String::from(
        "<table class=\"sched\"><tr><th>step</th><th>node</th><th>op</th><th>type</th><th>stream</th><th>waits</th><th>records</th><th>memory</th><th>live</th><th>region</th><th>time</th></tr>\n",
    );
    for (i, &id) in order.iter().enumerate() {
        let node = graph.node(id);
        let stream = t.streams.as_ref().and_then(|s| s.stream_of.get(&id)).map_or(0, |s| s.0);
        let mem = t.memory.as_ref().and_then(|m| m.values.get(&id));
        let time = times.and_then(|t| t.get(&i)).map_or(String::new(), |(ms, _)| fmt_ms(*ms));
        let _ = writeln!(
            out,
            "<tr data-node=\"{i}\"><td>{i}</td><td>%{i}</td><td>{}</td><td>{}{}</td><td>s{stream}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&op_text(graph, id)),
            node.dtype,
            node.shape,
            waits.get(&i).map_or(String::new(), |w| w.join(",")),
            records.get(&i).map_or(String::new(), |r| r.join(",")),
            esc(&mem.map_or(String::new(), |m| placement_text(&m.placement, &name))),
            mem.map_or(String::new(), |m| format!("{}..{}", m.live.0, m.live.1)),
            esc(&graph.region_name(node.region)),
            time
        );
    }
    out.push_str("</table>\n");
    out
}

/// Column width of one schedule step in the step-based charts.
fn step_width(steps: usize) -> f64 {
    (1600.0 / steps.max(1) as f64).clamp(3.0, 44.0)
}

/// One lane per stream, a box per node at its step, and an arrow per
/// event from the node it is recorded after to each waiter.
fn swimlanes(graph: &Graph) -> String {
    let (order, number) = numbering(graph);
    let t = graph.tables();
    let lanes = t.streams.as_ref().map_or(1, |s| s.count.max(1)) as usize;
    let w = step_width(order.len());
    let (lane_h, left, top) = (34.0, 40.0, 8.0);
    let width = left + w * order.len() as f64 + 10.0;
    let height = top + lane_h * lanes as f64 + 10.0;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="lanes" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}">"#
    );
    out.push('\n');
    for l in 0..lanes {
        let y = top + l as f64 * lane_h;
        let _ = writeln!(
            out,
            r#"<rect class="lane" x="{left}" y="{y:.1}" width="{:.1}" height="{lane_h}"/><text x="4" y="{:.1}">s{l}</text>"#,
            w * order.len() as f64,
            y + 20.0
        );
    }
    let lane_of = |id| t.streams.as_ref().and_then(|s| s.stream_of.get(&id)).map_or(0, |s| s.0 as usize);
    for (i, &id) in order.iter().enumerate() {
        let node = graph.node(id);
        let kind = match &node.op {
            Op::Input(_) | Op::Full(_) => "ready",
            Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. } => "view",
            Op::Fused(_) => "fused",
            _ => "work",
        };
        let (x, y) = (left + i as f64 * w, top + lane_of(id) as f64 * lane_h + 4.0);
        let label = if w >= 24.0 {
            format!("<text x=\"{:.1}\" y=\"{:.1}\">{i}</text>", x + 2.0, y + 16.0)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            r#"<g class="step {kind}" data-node="{i}"><title>%{i} {} {}{} @{}</title><rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}"/>{label}</g>"#,
            esc(&op_text(graph, id)),
            node.dtype,
            node.shape,
            esc(&graph.region_name(node.region)),
            x + 0.5,
            (w - 1.0).max(1.0),
            lane_h - 8.0
        );
    }
    if let Some(s) = &t.streams {
        for (e, ev) in s.events.iter().enumerate() {
            let Some(&a) = number.get(&ev.after) else { continue };
            for wt in &ev.waiters {
                let Some(&b) = number.get(wt) else { continue };
                let (x1, y1) =
                    (left + (a as f64 + 1.0) * w, top + lane_of(ev.after) as f64 * lane_h + lane_h / 2.0);
                let (x2, y2) = (left + b as f64 * w, top + lane_of(*wt) as f64 * lane_h + lane_h / 2.0);
                let _ = writeln!(
                    out,
                    r#"<line class="event" x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}"><title>e{e}: recorded after %{a}, awaited by %{b}</title></line>"#
                );
            }
        }
    }
    out.push_str("</svg>\n");
    out
}

/// Arena values as rectangles: x over their live steps, y over their
/// bytes (hover one for its node, bytes and steps).
pub(crate) fn arena(graph: &Graph) -> String {
    let (order, number) = numbering(graph);
    let Some(m) = &graph.tables().memory else {
        return "<p>No memory plan.</p>\n".into();
    };
    if m.arena_bytes == 0 {
        return "<p>The arena is empty: every value is an input, a constant, a view or an output.</p>\n"
            .into();
    }
    let w = step_width(order.len());
    let (left, top, plot_h) = (70.0, 10.0, 260.0);
    let width = left + w * order.len() as f64 + 190.0;
    let height = top + plot_h + 30.0;
    let scale = plot_h / m.arena_bytes as f64;
    let y_of = |b: u64| top + plot_h - b as f64 * scale;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="arena" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}">"#
    );
    let _ = write!(
        out,
        "\n<rect class=\"frame\" x=\"{left}\" y=\"{top}\" width=\"{:.1}\" height=\"{plot_h}\"/><text x=\"2\" y=\"{:.1}\">{}</text><text x=\"2\" y=\"{:.1}\">0</text><text x=\"{left}\" y=\"{:.1}\">step 0</text><text x=\"{:.1}\" y=\"{:.1}\">step {}</text>\n",
        w * order.len() as f64,
        top + 10.0,
        bytes(m.arena_bytes),
        top + plot_h,
        top + plot_h + 16.0,
        left + w * order.len() as f64 - 40.0,
        top + plot_h + 16.0,
        order.len().saturating_sub(1)
    );
    for (id, v) in &m.values {
        let Placement::Arena { offset, bytes: b, .. } = v.placement else { continue };
        let Some(&n) = number.get(id) else { continue };
        let x = left + v.live.0 as f64 * w;
        let span = (v.live.1 - v.live.0 + 1) as f64 * w;
        let (y, h) = (y_of(offset + b), (b as f64 * scale).max(1.0));
        let _ = writeln!(
            out,
            r#"<g class="value" data-node="{n}"><title>%{n} {}: {} at offset {offset}, live steps {}..{}</title><rect x="{x:.1}" y="{y:.1}" width="{span:.1}" height="{h:.1}" style="fill:hsl({},60%,75%)"/></g>"#,
            esc(&op_text(graph, *id)),
            bytes(b),
            v.live.0,
            v.live.1,
            (n * 47) % 360
        );
    }
    let lb = y_of(m.lower_bound);
    let _ = writeln!(
        out,
        r#"<line class="bound" x1="{left}" y1="{lb:.1}" x2="{:.1}" y2="{lb:.1}"/><text class="bound" x="{:.1}" y="{:.1}">lower bound {}</text>"#,
        left + w * order.len() as f64,
        left + w * order.len() as f64 + 4.0,
        lb + 4.0,
        bytes(m.lower_bound)
    );
    out.push_str("</svg>\n");
    out
}
