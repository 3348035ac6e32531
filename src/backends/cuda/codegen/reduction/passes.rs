//! What each column pass of a row kernel computes, reads and keeps: the
//! pass planning of [`super::generate`].

use super::Class;
use crate::backends::cuda::codegen::body::Body;
use crate::backends::cuda::codegen::types;
use crate::ir::{DType, NodeId, Op, ReduceOp};
use std::collections::{HashMap, HashSet};

/// The leaves a column pass computing `targets` reads, its cone ending at
/// the values `known` before it.
pub(super) fn leaves_of(body: &Body<'_>, targets: &[NodeId], known: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
    let mut out = Vec::new();
    for &target in targets {
        if body.is_leaf(target) {
            out.push(target);
        }
        for n in body.cone(target, known) {
            out.extend(body.g.operands(n).into_iter().filter(|o| body.is_leaf(*o)));
        }
    }
    out
}

/// The nodes a column pass computes for `targets`, in body order, its
/// cone ending at the values `known` before it.
pub(super) fn pass_cone(body: &Body<'_>, targets: &[NodeId], known: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
    let need: HashSet<NodeId> = targets.iter().flat_map(|&t| body.cone(t, known)).collect();
    body.order.iter().copied().filter(|n| need.contains(n)).collect()
}

/// True when pass `pass` finds `n` computed: a row value, or a value kept
/// by an earlier pass.
pub(super) fn available(
    class: &HashMap<NodeId, Class>,
    kept: &[(NodeId, usize)],
    pass: usize,
    n: NodeId,
) -> bool {
    class[&n] == Class::Row || kept.iter().any(|&(k, p)| k == n && p < pass)
}

/// Per-column values computed in one pass and read again by later ones,
/// each with the pass that computes it, at most `room` of them: a later
/// pass reads `k<id>[it]` instead of computing the value again (and
/// reloading its operands). Only the frontier is kept: a value whose later
/// readers are not themselves recomputed (a layer norm keeps its residual
/// sum `x`, then `x - mean`; a softmax keeps `exp(x - max)`, not
/// `x - max` too). Expands of row values cost nothing and stay out.
///
/// A bf16 layer norm without it computed the residual sum and its rounding
/// in all three passes: measured alone (H200), one rounding less an
/// element is worth about a microsecond on BERT-base's `[4096, 768]`.
pub(super) fn kept_values(
    body: &Body<'_>,
    class: &HashMap<NodeId, Class>,
    passes: &[Vec<NodeId>],
    room: usize,
) -> Vec<(NodeId, usize)> {
    let g = body.g;
    let mut kept: Vec<(NodeId, usize)> = Vec::new();
    for p in 0..passes.len() {
        let known = |n: NodeId| available(class, &kept, p + 1, n);
        let here: HashSet<NodeId> =
            pass_cone(body, &passes[p], &|n| available(class, &kept, p, n)).into_iter().collect();
        let later: HashSet<NodeId> =
            passes[p + 1..].iter().flat_map(|t| pass_cone(body, t, &known)).collect();
        let shared: Vec<NodeId> =
            body.order.iter().copied().filter(|n| here.contains(n) && later.contains(n)).collect();
        let mut keep = Vec::new();
        for &n in &shared {
            let read_later = passes[p + 1..].iter().any(|t| t.contains(&n))
                || later.iter().any(|&u| !shared.contains(&u) && g.operands(u).contains(&n));
            if read_later && !matches!(g.node(n).op, Op::Expand(_)) && kept.len() + keep.len() < room {
                keep.push((n, p));
            }
        }
        kept.extend(keep);
    }
    kept
}

/// Whether a thread sums its columns of an unrolled row (at most
/// [`super::MAX_ITEMS`]) in float before the group adds the threads' sums in
/// double. Each conversion to double issues at a quarter of float
/// arithmetic's rate, and one a column set the time of BERT-base's layer
/// norm (`[4096, 768]` bf16, H200, `benches/probes/layer_norm.py`: 11.5 us
/// with double terms, 9.9 with float partials; both with one conversion a
/// rounding). The online max-and-sum pass does the same with [`super::CHUNK`]
/// columns. What it costs: a partial of at most 16 floats rounds up to 15
/// times, a relative error of about `15 * 2^-24` of the sum of the
/// terms' magnitudes (a bf16 or f16 result cannot see it; an f32 one can,
/// in its last bits, where the CPU backend sums in double), and a partial
/// can overflow where a double would not (terms near `f32::MAX` that
/// cancel), as PyTorch's float accumulation does.
pub(super) fn partial_in_float(op: ReduceOp, xd: DType) -> bool {
    matches!(op, ReduceOp::Sum | ReduceOp::Mean) && types::compute(xd) == "float"
}
