//! Column sums of widening casts, turned into widening sums.
//!
//! autocast reduces in f32 (its policy's `reductions=f32`), so a bf16
//! gradient's bias sum is recorded as `sum(cast(g), dims=[0, 1])`. A
//! column sum (dims not at the end) is not fused, so the cast was a kernel
//! of its own or, where the gradient's producer is fused work, an extra f32
//! output of that kernel: GPT-2 small's GELU backward wrote a
//! `[4096, 3072]` f32 copy of its gradient (50 MB) and the QKV gradient was
//! widened by a kernel that did nothing else, each only for its column
//! sum, which then read twice the bytes it needed.
//!
//! `sum(views(cast(x)))` becomes `sum(views(x)) into=f32`
//! ([`crate::ir::Op::Reduce`]'s `into`): the sum widens each element as it
//! reads it. Widening a float is exact and the sum accumulates the same
//! values in the same order, so the result is the same bits on every
//! backend (the CUDA column kernel already accumulates in double and
//! stores in its output's dtype).
//!
//! Only reductions that fusion leaves alone are rewritten: a sum over the
//! trailing dims is a row reduction, whose body recomputes the cast from
//! the narrow value anyway. Nor is the cast of a matmul's result: fusion
//! makes that cast the GEMM's epilogue (the GEMM writes the f32 value its
//! other readers take), and a second, narrow reader would split it off
//! into a kernel of its own.

use crate::ir::{Graph, Node, Op, ReduceOp};

/// Rewrites every float `sum`/`mean` over non-trailing dims whose operand
/// is, through views, a widening float cast; returns how many changed.
pub(super) fn widen_in_column_sums(graph: &mut Graph) -> usize {
    let mut changed = 0;
    for id in graph.topo_order() {
        if !graph.contains(id) {
            continue;
        }
        let Op::Reduce { op: op @ (ReduceOp::Sum | ReduceOp::Mean), dims, keepdim, into: None } =
            graph.node(id).op.clone()
        else {
            continue;
        };
        let operand = graph.operands(id)[0];
        let rank = graph.node(operand).shape.rank();
        let trailing = dims.first().is_some_and(|&first| dims.iter().copied().eq(first..rank));
        if trailing {
            continue;
        }
        let Some((cast, views)) = super::gather_cast::cast_under_views(graph, operand) else { continue };
        let narrow = graph.operands(cast)[0];
        let (from, to) = (graph.node(narrow).dtype, graph.node(cast).dtype);
        if !super::widens_float(from, to) {
            continue;
        }
        let mut src = narrow;
        for &v in views.iter().rev() {
            let node = Node { dtype: from, ..graph.node(v).clone() };
            src = graph.add_unchecked(node, &[src]);
        }
        let sum = Node { op: Op::Reduce { op, dims, keepdim, into: Some(to) }, ..graph.node(id).clone() };
        let wide = graph.add_unchecked(sum, &[src]);
        graph.replace_all_uses(id, wide);
        graph.remove(id);
        changed += 1;
    }
    changed
}
