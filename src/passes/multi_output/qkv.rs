//! An attention's three gradients written where a fused QKV projection
//! reads them.
//!
//! *Why.* GPT-2 (and most decoders) project `q, k, v` with one product,
//! `[b, s, 3 · h · d]`, viewed as `[b, s, 3, h, d]` and sliced into heads.
//! The gradient of that product's output is the three gradients back in
//! that layout: autodiff records it as a `cat` of views of
//! `attention_grad wrt=q` (`[b, h, s, d]`) and of the two halves of
//! `attention_grad wrt=kv` (`[b, h, s, 2d]`). The cat is a kernel that
//! reads and writes all of it again: 0.15 ms of GPT-2 small's bf16 step
//! on an H200 (12 layers of `[8, 512, 2304]`). The backward's kernels can
//! write each gradient row into its place instead
//! ([`AttnWrt::QueryKeyValue`]).
//!
//! *Does.* For `cat %a, %b, %c dim=2` (`[b, s, 3, h, d]`) where `%a` is
//! `reshape(permute(%dq, [0, 2, 1, 3]))`, `%b` and `%c` the same of
//! `slice %dkv dim=3` at `0..d` and `d..2d`, `%dq` and `%dkv` the `q` and
//! `kv` gradients of one attention (the same operands and settings), and
//! nothing else reads them or the views between: the cat becomes
//! `attention_grad wrt=qkv` over the same operands.
//!
//! *Does not.* Match other view chains of the same layout (what autodiff
//! records for GPT-2's heads is this one), or rewrite when another node
//! reads one of the gradients (both copies would then be needed).
//!
//! *Preserves.* Every value: the kernels compute the same rows and write
//! them elsewhere.

use crate::ir::{AttnWrt, Graph, Node, NodeId, Op};

/// Rewrites every such cat (module docs); gives how many.
pub(super) fn gradients_in_projection_layout(graph: &mut Graph) -> usize {
    let mut rewritten = 0;
    for cat in graph.topo_order() {
        if !graph.contains(cat) {
            continue;
        }
        let Some(found) = packable(graph, cat) else { continue };
        let node = graph.node(found.q).clone();
        let Op::AttentionGrad { scale, causal, mask, .. } = node.op else { continue };
        let op = Op::AttentionGrad { scale, causal, mask, wrt: AttnWrt::QueryKeyValue };
        let shape = graph.node(cat).shape.clone();
        let operands = graph.operands(found.q);
        let packed = graph.add_unchecked(Node { op, shape, ..node }, &operands);
        graph.replace_all_uses(cat, packed);
        graph.remove(cat);
        graph.remove_many(&found.views);
        graph.remove_many(&[found.q, found.kv]);
        rewritten += 1;
    }
    rewritten
}

/// Whether some cat of `graph` qualifies (the pass's `applies`).
pub(super) fn any(graph: &Graph) -> bool {
    graph.node_ids().into_iter().any(|id| packable(graph, id).is_some())
}

/// The gradients a qualifying cat joins, and the views between.
struct Found {
    q: NodeId,
    kv: NodeId,
    views: Vec<NodeId>,
}

fn packable(graph: &Graph, cat: NodeId) -> Option<Found> {
    if graph.node(cat).op != (Op::Cat { dim: 2 }) || graph.node(cat).shape.rank() != 5 {
        return None;
    }
    let parts = graph.operands(cat);
    let [a, b, c] = parts[..] else { return None };
    let d = graph.node(cat).shape.0[4];
    let mut views = Vec::new();
    let q = heads_of(graph, a, &mut views)?;
    let k = heads_of(graph, b, &mut views)?;
    let v = heads_of(graph, c, &mut views)?;
    let half = |x: NodeId, start: usize| match graph.node(x).op {
        Op::Slice { dim: 3, start: s, step: 1, len } if s == start && len == d => Some(graph.operands(x)[0]),
        _ => None,
    };
    let kv = half(k, 0)?;
    if half(v, d)? != kv || graph.node(kv).shape.0.last() != Some(&(2 * d)) {
        return None;
    }
    views.extend([k, v]);
    let grad = |x: NodeId, want: AttnWrt| match graph.node(x).op {
        Op::AttentionGrad { scale, causal, mask, wrt } if wrt == want => {
            Some((scale.to_bits(), causal, mask))
        }
        _ => None,
    };
    let same = grad(q, AttnWrt::Query)? == grad(kv, AttnWrt::KeyValue)?
        && graph.operands(q) == graph.operands(kv)
        && graph.users(q).len() == 1
        && graph.users(kv) == sorted(k, v)
        && [k, v].iter().all(|&x| graph.users(x).len() == 1)
        && ![q, kv].iter().chain(&views).any(|x| graph.outputs().contains(x));
    same.then_some(Found { q, kv, views })
}

/// `x` = `reshape(permute(y, [0, 2, 1, 3]))`, each view read once: `y`
/// (the two views go to `views`).
fn heads_of(graph: &Graph, x: NodeId, views: &mut Vec<NodeId>) -> Option<NodeId> {
    let Op::Reshape(_) = graph.node(x).op else { return None };
    let p = graph.operands(x)[0];
    let Op::Permute(ref perm) = graph.node(p).op else { return None };
    if perm[..] != [0, 2, 1, 3] || graph.users(x).len() != 1 || graph.users(p).len() != 1 {
        return None;
    }
    views.extend([x, p]);
    Some(graph.operands(p)[0])
}

fn sorted(a: NodeId, b: NodeId) -> Vec<NodeId> {
    let mut v = vec![a, b];
    v.sort_unstable();
    v
}
