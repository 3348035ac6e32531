//! Graph → text.

use crate::ir::{Graph, NodeId, Op};
use std::collections::HashMap;
use std::fmt::Write;

/// Prints the graph in the text IR: the nodes its outputs need, numbered
/// densely in structural topological order, then `return`. Ends with a
/// newline. Deterministic, so it can be snapshotted and diffed.
///
/// An invalid graph still prints (for debugging a pass) and never panics:
/// a missing output prints as `%?missing`, a node in a missing region as
/// `@?region<id>`, and on a cycle some operand is used before its line
/// (or prints as `%?cycle`); such text does not parse back.
pub fn print(graph: &Graph) -> String {
    let (order, number) = numbering(graph);
    let name = |id: &NodeId, placeholder: &str| match number.get(id) {
        Some(n) => format!("%{n}"),
        None => format!("%?{placeholder}"),
    };
    let mut out = String::new();
    for (i, &id) in order.iter().enumerate() {
        let node = graph.node(id);
        let operands: Vec<String> = graph.operands(id).iter().map(|o| name(o, "cycle")).collect();
        let _ = write!(out, "%{i}: {}{} = {}", node.dtype, node.shape, node.op.mnemonic());
        if !operands.is_empty() {
            let _ = write!(out, " {}", operands.join(", "));
        }
        out.push_str(&attrs(&node.op, node.dtype));
        if (node.region.0 as usize) < graph.regions().len() {
            let path = graph.region_name(node.region);
            if !path.is_empty() {
                let _ = write!(out, " @{path}");
            }
        } else {
            let _ = write!(out, " @?region{}", node.region.0);
        }
        out.push('\n');
    }
    out.push_str("return");
    let outputs: Vec<String> = graph.outputs().iter().map(|o| name(o, "missing")).collect();
    if !outputs.is_empty() {
        let _ = write!(out, " {}", outputs.join(", "));
    }
    out.push('\n');
    out
}

/// The nodes the outputs need in [`Graph::compacted`] order and each one's
/// dense number. Unlike `compacted` it tolerates invalid graphs (outputs
/// that do not exist are skipped), so printing and DOT never panic.
pub(crate) fn numbering(graph: &Graph) -> (Vec<NodeId>, HashMap<NodeId, usize>) {
    let roots: Vec<NodeId> = graph.outputs().iter().copied().filter(|&o| graph.contains(o)).collect();
    let order = graph.topo_order_from(&roots);
    let number = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    (order, number)
}

fn list(xs: &[usize]) -> String {
    let items: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// The attribute text of an op, each attribute preceded by a space.
fn attrs(op: &Op, dtype: crate::ir::DType) -> String {
    match op {
        Op::Input(k) => format!(" {k}"),
        Op::Buffer(b) => format!(" {}", b.0),
        Op::Full(v) => format!(" {}", v.format(dtype)),
        Op::Arange { start, step } => format!(" start={} step={}", start.format(dtype), step.format(dtype)),
        Op::Random { stream, .. } => format!(" stream={stream}"),
        Op::Reshape(_)
        | Op::Expand(_)
        | Op::Cast(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Where
        | Op::MatMul => String::new(),
        Op::Permute(perm) => format!(" perm={}", list(perm)),
        Op::Slice { dim, start, step, len } => format!(" dim={dim} start={start} step={step} len={len}"),
        Op::Reduce { dims, keepdim, .. } => {
            format!(" dims={}{}", list(dims), if *keepdim { " keepdim" } else { "" })
        }
        Op::Conv2d { stride, padding, dilation, groups } => format!(
            " stride={} padding={} dilation={} groups={groups}",
            list(stride),
            list(padding),
            list(dilation)
        ),
        Op::Pool2d { kernel, stride, padding, .. } => {
            format!(" kernel={} stride={} padding={}", list(kernel), list(stride), list(padding))
        }
        Op::Gather { dim } | Op::IndexSelect { dim } | Op::Cat { dim } => format!(" dim={dim}"),
    }
}
