//! An attention's backward reads the log-sum-exp its forward computed.
//!
//! *Why.* Autodiff records an attention's gradient with an
//! [`Op::AttentionStats`] node: each query row's log-sum-exp `lse` and
//! `delta = o · g`. Computed on its own, `lse` costs the forward's whole
//! `q kᵀ` again (on GPT-2 small in bf16, 41 µs a layer against the
//! forward's 60); the forward's online softmax ends with every row's
//! maximum and sum in registers, and FlashAttention's forward writes
//! `lse` for its backward for this reason.
//!
//! *Does.* For each `attention_stats q, k, o, g [, mask]` whose `o` is an
//! `attention q, k, v [, mask]` of the same queries, keys, mask and
//! settings, adds `extra %o output=1` (the forward's `[b, h, sq]`
//! log-sum-exp, in the stats' type; one per attention) and replaces the
//! stats by `attention_delta %o, %g, %lse`, which computes only `delta`.
//!
//! *Does not.* Touch a stats node whose output is not such an attention
//! (another attention's, a view of it other than the permute back from
//! the `bshd` layout): it keeps recomputing.
//!
//! *Preserves.* The stats' value up to rounding: the forward sums the
//! same exponentials in its online order (rescaled per key tile), the
//! stats kernel in its own.
//!
//! *Assumes.* A fused graph (attention is never fused, so its operands
//! are the nodes autodiff recorded against); every backend's attention
//! writes its extra output 1 where a plan reads it.

use crate::ir::{AttnLayout, Graph, Node, NodeId, Op};

/// Rewrites every stats node the forward can answer (see the module
/// docs); gives how many.
pub(super) fn forward_writes_lse(graph: &mut Graph) -> Result<usize, String> {
    let mut rewritten = 0;
    for stats in graph.topo_order() {
        let Some(attention) = answered_by(graph, stats) else { continue };
        let lse = lse_of(graph, attention)?;
        let ops = graph.operands(stats);
        let node = graph.node(stats).clone();
        let delta = graph.add_unchecked(Node { op: Op::AttentionDelta, ..node }, &[ops[2], ops[3], lse]);
        graph.replace_all_uses(stats, delta);
        graph.remove(stats);
        rewritten += 1;
    }
    Ok(rewritten)
}

/// The attention whose forward computes the `lse` of stats node `id`,
/// if `id` is one and its output operand is such an attention.
fn answered_by(graph: &Graph, id: NodeId) -> Option<NodeId> {
    let Op::AttentionStats { scale, causal, mask } = graph.node(id).op else { return None };
    let ops = graph.operands(id);
    // The output `[b, h, sq, dv]`: the attention, or the permute back of
    // one that writes its heads merged (the attention-layout pass).
    let o = match &graph.node(ops[2]).op {
        Op::Permute(p) if p[..] == [0, 2, 1, 3] => graph.operands(ops[2])[0],
        _ => ops[2],
    };
    let Op::Attention { scale: s, causal: c, mask: m, layout } = graph.node(o).op else { return None };
    if (layout == AttnLayout::Bshd) != (o != ops[2]) {
        return None;
    }
    let fwd = graph.operands(o);
    // Same queries, keys and mask (operand 3 of the forward, 4 of the stats).
    let same = s.to_bits() == scale.to_bits()
        && c == causal
        && m == mask
        && fwd[0] == ops[0]
        && fwd[1] == ops[1]
        && fwd.get(3) == ops.get(4);
    same.then_some(o)
}

/// The attention's `extra output=1` node, added if it has none.
fn lse_of(graph: &mut Graph, attention: NodeId) -> Result<NodeId, String> {
    let existing =
        graph.users(attention).into_iter().find(|&u| matches!(graph.node(u).op, Op::Extra { output: 1 }));
    if let Some(e) = existing {
        return Ok(e);
    }
    let (shape, dtype) = crate::ir::extra_type(graph, attention, 1)?;
    let region = graph.node(attention).region;
    Ok(graph.add_unchecked(Node { op: Op::Extra { output: 1 }, shape, dtype, region }, &[attention]))
}
