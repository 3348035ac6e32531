//! Gathers of casts, turned into casts of gathers.
//!
//! A `gather` (or `index_select`) picks elements; a `cast` converts each
//! element on its own, so `gather(views(cast(x)), i)` equals
//! `cast(gather(views(x), i))` bit for bit, whatever the two types: the
//! same elements are converted the same way, only fewer of them.
//!
//! *Why here.* Fusion recomputes a widening cast in each reader's body
//! instead of writing a wide copy, but only if every reader is fused
//! elementwise work or a row reduction (see `Walk::duplicate`). A
//! cross-entropy loss reads its logits' target entries with a `gather`,
//! so a bf16 LM head's logits were widened into an f32 `[B·T, V]` of
//! their own (0.42 ms of GPT-2 small's step, on top of the loss kernels
//! reading 4 bytes an element instead of 2). Moved past the gather, the
//! cast converts `B·T` elements and the full-size one has only fused
//! readers left.

use crate::ir::{Graph, Node, NodeId, Op};

/// Rewrites every `gather`/`index_select` whose source is a cast, seen
/// through views, into the cast of a gather of the cast's operand (the
/// views rebuilt over it); returns how many moved.
pub(super) fn hoist_casts_over_gathers(graph: &mut Graph) -> usize {
    let mut moved = 0;
    for id in graph.topo_order() {
        if !graph.contains(id) || !matches!(graph.node(id).op, Op::Gather { .. } | Op::IndexSelect { .. }) {
            continue;
        }
        let operands = graph.operands(id);
        let Some((cast, views)) = cast_under_views(graph, operands[0]) else { continue };
        let narrow = graph.operands(cast)[0];
        let from = graph.node(narrow).dtype;
        // The views again, over the cast's operand.
        let mut src = narrow;
        for &v in views.iter().rev() {
            let node = Node { dtype: from, ..graph.node(v).clone() };
            src = graph.add_unchecked(node, &[src]);
        }
        let gather = graph.node(id).clone();
        let picked = graph.add_unchecked(Node { dtype: from, ..gather.clone() }, &[src, operands[1]]);
        let cast_op = graph.node(cast).op.clone();
        let converted = graph.add_unchecked(Node { op: cast_op, ..gather }, &[picked]);
        graph.replace_all_uses(id, converted);
        graph.remove(id);
        moved += 1;
    }
    moved
}

/// The cast `id` views (itself if it is one) and the views between them,
/// outermost first.
pub(super) fn cast_under_views(graph: &Graph, mut id: NodeId) -> Option<(NodeId, Vec<NodeId>)> {
    let mut views = Vec::new();
    loop {
        let node = graph.node(id);
        match node.op {
            Op::Cast(_) => return Some((id, views)),
            ref op if op.is_view() => {
                views.push(id);
                id = graph.operands(id)[0];
            }
            _ => return None,
        }
    }
}
