//! A row kernel writes the zero-padded copy of its value that a `cat`
//! would make.
//!
//! *Why.* A slice's gradient is the gradient followed by constant (zero)
//! columns, a `cat`, and a `cat` is a kernel that reads its parts and
//! writes them again. GPT-2's loss gradient is padded so for its LM head
//! (`Gpt2::lm_head` multiplies by the embedding padded to a multiple of 8
//! rows): `[4096, 50257]` written by the loss's row kernel, then read and
//! written again as `[4096, 50264]` by the cat, about 0.22 ms of a bf16
//! training step on an H200, and both copies live at once. The row kernel
//! can write each row where the cat puts it, and the constants after it
//! ([`crate::ir::Padded`]); the cat then costs nothing. In the spirit of
//! the rest of the pass: a value another kernel only copies is written by
//! the kernel that computes it.
//!
//! *Does.* For `cat %v, %f1, .. dim=last` where `%v` is a fused row
//! kernel `F` over its last dim (or reshapes of it that keep that last
//! dim: rows stay rows), the rest are `full` constants, and nothing else
//! reads `F`'s value (its `extra` outputs may have readers) and it is no
//! graph output: `F` becomes `F'` whose body's output 0 is that cat at
//! `F`'s domain (`full`s of the domain's rows), and the cat becomes a
//! reshape of `F'` (or `F'` itself). `F`'s extras read `F'`. The same
//! for `cat %v, %f1, .. dim=0` of an elementwise kernel `F` itself: its
//! value, then the constants (GPT-2's bf16 embedding padded with zero
//! rows for the LM head, 77 MB copied again by the cat).
//!
//! *Does not.* Pad a row kernel along another dim than its rows', an
//! elementwise kernel along another dim than 0 (its loop would have to
//! skip the padding), a kernel marked to write over a variable, or a cat
//! whose padding comes first.
//!
//! *Preserves.* Every value: the same body computes each row, and the
//! cat's constants are written beside it.

use crate::ir::{FusedBody, FusedKind, Graph, Node, NodeId, Op, RegionId};
use std::sync::Arc;

/// Rewrites every cat a row kernel can write (module docs); gives how
/// many.
pub(super) fn rows_write_their_padding(graph: &mut Graph) -> usize {
    let mut rewritten = 0;
    for cat in graph.topo_order() {
        if !graph.contains(cat) {
            continue;
        }
        let Some(found) = paddable(graph, cat) else { continue };
        if rewrite(graph, cat, found).is_some() {
            rewritten += 1;
        }
    }
    rewritten
}

/// Whether some cat of `graph` qualifies (the pass's `applies`).
pub(super) fn any(graph: &Graph) -> bool {
    graph.node_ids().into_iter().any(|id| paddable(graph, id).is_some())
}

/// What a qualifying cat pads: the row kernel and the reshapes between.
struct Found {
    kernel: NodeId,
    chain: Vec<NodeId>,
}

fn paddable(graph: &Graph, cat: NodeId) -> Option<Found> {
    let Op::Cat { dim } = graph.node(cat).op else { return None };
    let parts = graph.operands(cat);
    let same_type = parts[1..]
        .iter()
        .all(|&p| matches!(graph.node(p).op, Op::Full(_)) && graph.node(p).dtype == graph.node(cat).dtype);
    if !same_type {
        return None;
    }
    // Reshapes down to the kernel, each read only by the next.
    let mut chain = Vec::new();
    let mut cur = parts[0];
    while matches!(graph.node(cur).op, Op::Reshape(_)) {
        if graph.users(cur) != [*chain.last().unwrap_or(&cat)] || graph.outputs().contains(&cur) {
            return None;
        }
        chain.push(cur);
        cur = graph.operands(cur)[0];
    }
    let Op::Fused(body) = &graph.node(cur).op else { return None };
    let value_read_once = graph
        .users(cur)
        .into_iter()
        .all(|u| u == *chain.last().unwrap_or(&cat) || matches!(graph.node(u).op, Op::Extra { .. }));
    let plain = body.padded().is_none()
        && (0..body.outputs().len()).all(|j| body.output_over(j).is_none())
        && value_read_once
        && !graph.outputs().contains(&cur);
    let shape = &graph.node(cur).shape;
    let fits = match body.kind() {
        // Rows stay rows: the cat's last dim is the domain's.
        FusedKind::Reduction { domain, split } => {
            let last = &graph.node(parts[0]).shape.0[dim];
            *split + 1 == domain.rank()
                && dim + 1 == graph.node(cat).shape.rank()
                && shape == domain
                && domain.0.last() == Some(last)
        }
        // The value, then the fills: the kernel's own shape along dim 0.
        FusedKind::Elementwise => dim == 0 && chain.is_empty(),
        FusedKind::MatMul { .. } => false,
    };
    (plain && fits).then_some(Found { kernel: cur, chain })
}

/// Replaces the kernel by one that writes the cat (module docs); `None`
/// leaves the graph as it was when the padded body would be illegal.
fn rewrite(graph: &mut Graph, cat: NodeId, Found { kernel, chain }: Found) -> Option<()> {
    let Op::Fused(body) = &graph.node(kernel).op else { return None };
    let node = graph.node(kernel).clone();
    let Op::Cat { dim } = graph.node(cat).op else { return None };
    // The cat at the kernel's shape: along its last dim (a row kernel,
    // whose rows the reshapes kept) or along dim 0 (no reshapes).
    let at = if chain.is_empty() { dim } else { node.shape.rank() - 1 };
    let mut g = body.graph().clone();
    let value = body.output();
    let mut parts = vec![value];
    let mut padded_shape = node.shape.clone();
    for &f in &graph.operands(cat)[1..] {
        let fill = graph.node(f);
        let n = fill.shape.0[dim];
        padded_shape.0[at] += n;
        let mut shape = node.shape.clone();
        shape.0[at] = n;
        parts.push(g.add_unchecked(Node { shape, region: RegionId::ROOT, ..fill.clone() }, &[]));
    }
    let cat_node = Node {
        op: Op::Cat { dim: at },
        shape: padded_shape.clone(),
        dtype: node.dtype,
        region: RegionId::ROOT,
    };
    let out = g.add_unchecked(cat_node, &parts);
    let mut outputs = g.outputs().to_vec();
    outputs[0] = out;
    g.set_outputs(outputs);
    let padded = FusedBody::new(g).ok()?;
    let operands = graph.operands(kernel);
    let new = graph.add_unchecked(
        Node { op: Op::Fused(Arc::new(padded)), shape: padded_shape.clone(), ..node },
        &operands,
    );
    let cat_shape = graph.node(cat).shape.clone();
    let value = if cat_shape == padded_shape {
        new
    } else {
        let region = graph.node(cat).region;
        let reshape = Node {
            op: Op::Reshape(cat_shape.clone()),
            shape: cat_shape,
            dtype: graph.node(cat).dtype,
            region,
        };
        graph.add_unchecked(reshape, &[new])
    };
    graph.replace_all_uses(cat, value);
    graph.remove(cat);
    graph.remove_many(&chain);
    // Only the extras read the old kernel now.
    graph.replace_all_uses(kernel, new);
    graph.remove(kernel);
    Some(())
}
