//! Graphviz export, for looking at a graph: `dot -Tsvg graph.dot`.
//!
//! Nodes are numbered and labelled as in the text IR (`%5 matmul
//! f32[64,128]`), so a picture and a `.kir` dump can be read side by side.
//! Each non-root region that holds a printed node is a `cluster_<id>`
//! subgraph labelled with its path, nested as the region tree. Output is
//! deterministic: nodes in text-IR order, regions by id.

use super::text::numbering;
use super::{Graph, RegionId};
use std::fmt::Write;

/// The graph as a Graphviz `digraph`: one box per node the outputs need,
/// regions as nested clusters, edges from operand to user labelled with the
/// operand slot when the user has more than one operand, and a `return`
/// node fed by the outputs. Never panics, even on an invalid graph.
pub fn to_dot(graph: &Graph) -> String {
    let (order, number) = numbering(graph);
    let regions = graph.regions();
    // Which region each printed node sits in (out-of-range regions: the root).
    let region_of = |r: RegionId| if (r.0 as usize) < regions.len() { r.0 as usize } else { 0 };
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); regions.len()];
    let mut used = vec![false; regions.len()];
    for (i, &id) in order.iter().enumerate() {
        let r = region_of(graph.node(id).region);
        members[r].push(i);
        // Mark the region and its ancestors (parents always precede children).
        let mut cur = Some(r);
        while let Some(c) = cur {
            if used[c] {
                break;
            }
            used[c] = true;
            cur = regions[c].parent.map(|p| p.0 as usize).filter(|&p| p < c);
        }
    }
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); regions.len()];
    for (i, r) in regions.iter().enumerate().skip(1) {
        if let Some(p) = r.parent.map(|p| p.0 as usize).filter(|&p| p < i) {
            if used[i] {
                children[p].push(i);
            }
        }
    }

    let mut out = String::from("digraph kiln {\n");
    out.push_str("  node [shape=box, fontname=\"monospace\"];\n");
    let ctx = Ctx { graph, order: &order, members: &members, children: &children };
    if !regions.is_empty() {
        ctx.region(&mut out, 0, 1);
    }
    for (i, &id) in order.iter().enumerate() {
        let operands = graph.operands(id);
        for (slot, o) in operands.iter().enumerate() {
            let Some(src) = number.get(o) else { continue };
            if operands.len() > 1 {
                let _ = writeln!(out, "  n{src} -> n{i} [label=\"{slot}\"];");
            } else {
                let _ = writeln!(out, "  n{src} -> n{i};");
            }
        }
    }
    out.push_str("  return [shape=plaintext, label=\"return\"];\n");
    let outputs = graph.outputs();
    for (k, o) in outputs.iter().enumerate() {
        let Some(src) = number.get(o) else { continue };
        if outputs.len() > 1 {
            let _ = writeln!(out, "  n{src} -> return [label=\"{k}\"];");
        } else {
            let _ = writeln!(out, "  n{src} -> return;");
        }
    }
    out.push_str("}\n");
    out
}

struct Ctx<'a> {
    graph: &'a Graph,
    order: &'a [super::NodeId],
    members: &'a [Vec<usize>],
    children: &'a [Vec<usize>],
}

impl Ctx<'_> {
    fn region(&self, out: &mut String, r: usize, depth: usize) {
        let pad = "  ".repeat(depth);
        for &i in &self.members[r] {
            let node = self.graph.node(self.order[i]);
            let label = format!("%{i} {} {}{}", node.op.mnemonic(), node.dtype, node.shape);
            let _ = writeln!(out, "{pad}n{i} [label=\"{}\"];", escape(&label));
        }
        for &c in &self.children[r] {
            let _ = writeln!(out, "{pad}subgraph cluster_{c} {{");
            let path = self.graph.region_name(RegionId(c as u32));
            let _ = writeln!(out, "{pad}  label=\"{}\";", escape(&path));
            self.region(out, c, depth + 1);
            let _ = writeln!(out, "{pad}}}");
        }
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}
