//! An attention's queries' gradient written by the node that computes
//! its keys' and values'.
//!
//! *Why.* Autodiff records an attention's gradients as two nodes over the
//! same operands, `attention_grad wrt=q` and `wrt=kv`. Each `dq` tile
//! needs `dS = P (g vᵀ - delta)` of its queries and keys, which the `dk,
//! dv` kernel computes too (transposed); run apart, the `dq` kernel
//! computes `S`, `P` and `dP` again, three products of its four (at
//! `[8, 16, 2048, 128]` in bf16 on an H200, 1.8 ms of a 4.6 ms backward).
//! One node lets the backend run them as a pair: the CUDA `dk, dv` kernel
//! stores each `dSᵀ` tile and the `dq` kernel reads it
//! (`codegen/attention_grad_ds.rs`), as a packed QKV gradient (`qkv.rs`)
//! already does.
//!
//! *Does.* For `%dq = attention_grad … wrt=q` and `%dkv = attention_grad
//! … wrt=kv` of the same operands and settings in one region: `%dkv`
//! becomes `attention_grad … wrt=kv+q` (same value), and every reader of
//! `%dq` (graph outputs included) reads `extra %dkv output=1`. It runs
//! after `qkv.rs`, so a pair whose gradients a QKV projection joins is
//! packed instead.
//!
//! *Does not.* Pair gradients of different attentions (other operands,
//! scale, mask or causality), or a `q` gradient with no `kv` one.
//!
//! *Preserves.* Every value: the backends compute each gradient as the
//! separate nodes did (the CUDA `dq` from stored `dSᵀ` rounds `dS` to the
//! input type, as the recomputing kernel does before its product).

use crate::ir::{AttnWrt, Graph, Node, NodeId, Op};
use std::collections::HashMap;

/// Pairs every such `q` and `kv` gradient (module docs); gives how many.
pub(super) fn queries_with_keys(graph: &mut Graph) -> usize {
    let mut paired = 0;
    for (q, kv) in pairs(graph) {
        let node = graph.node(kv).clone();
        let Op::AttentionGrad { scale, causal, mask, .. } = node.op else { continue };
        let op = Op::AttentionGrad { scale, causal, mask, wrt: AttnWrt::KeyValueAndQuery };
        let operands = graph.operands(kv);
        let both = graph.add_unchecked(Node { op, ..node }, &operands);
        let q_node = graph.node(q).clone();
        let extra = graph.add_unchecked(Node { op: Op::Extra { output: 1 }, ..q_node }, &[both]);
        graph.replace_all_uses(kv, both);
        graph.replace_all_uses(q, extra);
        graph.remove_many(&[q, kv]);
        paired += 1;
    }
    paired
}

/// Whether some pair qualifies (the pass's `applies`).
pub(super) fn any(graph: &Graph) -> bool {
    !pairs(graph).is_empty()
}

/// The `(q, kv)` gradient pairs of `graph`, each node in one pair.
fn pairs(graph: &Graph) -> Vec<(NodeId, NodeId)> {
    // The key a pair shares: operands, settings and region.
    let key = |id: NodeId| match graph.node(id).op {
        Op::AttentionGrad { scale, causal, mask, wrt } => {
            Some((wrt, (graph.operands(id), scale.to_bits(), causal, mask, graph.node(id).region)))
        }
        _ => None,
    };
    let mut queries = HashMap::new();
    let mut found = Vec::new();
    let ids = graph.topo_order();
    for &id in &ids {
        if let Some((AttnWrt::Query, k)) = key(id) {
            queries.entry(k).or_insert(id);
        }
    }
    for &id in &ids {
        if let Some((AttnWrt::KeyValue, k)) = key(id) {
            if let Some(q) = queries.remove(&k) {
                found.push((q, id));
            }
        }
    }
    found
}
