//! View folding: compose chains of views and drop views that change nothing.
//!
//! *Does.* Walks the needed nodes operands-first and, for each view whose
//! operand is a view of the same kind, rewrites it in place to one view of
//! the original value:
//! `reshape(reshape(x, a), b)` → `reshape(x, b)`;
//! `permute(permute(x, p), q)` → `permute(x, [p[q[0]], p[q[1]], ...])`;
//! `expand(expand(x, a), b)` → `expand(x, b)` (if `x` broadcasts to `a` and
//! `a` to `b`, then `x` broadcasts to `b`, element for element);
//! `slice(slice(x, d, s1, t1, _), d, s2, t2, n)` → `slice(x, d, s1 + s2*t1, t1*t2, n)`.
//! Then it removes identity views, redirecting their users to the operand:
//! a reshape to the operand's shape, the identity permutation, an expand to
//! the operand's shape, and a slice that keeps its whole dimension (for a
//! valid slice that is exactly "output shape equals input shape": start 0
//! and step 1, or a dimension of size 0 or 1).
//!
//! *Does not.* Reorder views of different kinds (`permute∘reshape` stays), merge
//! slices of different dimensions, or touch views of a `Full`: turning those
//! into a `Full` of the new shape is constant folding's job. It leaves the
//! inner view of a composed chain in place; DCE removes it once unused.
//!
//! *Preserves.* Every value the outputs see, bit for bit (views only
//! re-index), node ids of everything it does not bypass, regions (a rewritten
//! view keeps its own region).
//!
//! *Invalidates.* Any side table keyed by the rewritten views' operands
//! (use lists); there are none at this phase.
//!
//! *Assumes.* A verified graph (view attributes agree with shapes, as
//! `ir::infer` checks). A composed slice whose start or step would overflow
//! `usize` (only possible for zero-length slices) is left alone.

use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, NodeId, Op};
use crate::Result;

/// Composes view chains and removes identity views (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct ViewFold;

impl Pass for ViewFold {
    fn name(&self) -> &'static str {
        "view-fold"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let mut changed = Changed::No;
        for id in graph.topo_order() {
            if !graph.node(id).op.is_view() {
                continue;
            }
            if compose(graph, id) {
                cx.rewrite();
                changed = Changed::Yes;
            }
            if let Some(operand) = identity_operand(graph, id) {
                graph.replace_all_uses(id, operand);
                cx.rewrite();
                changed = Changed::Yes;
            }
        }
        Ok(changed)
    }
}

/// If `id` is a view of a view of the same kind, rewrites `id` to one view of
/// the inner view's operand. Returns whether it did.
fn compose(graph: &mut Graph, id: NodeId) -> bool {
    let [inner] = graph.operands(id)[..] else { return false };
    let [source] = graph.operands(inner)[..] else { return false };
    let composed = match (&graph.node(inner).op, &graph.node(id).op) {
        (Op::Reshape(_), Op::Reshape(to)) => Op::Reshape(to.clone()),
        (Op::Expand(_), Op::Expand(to)) => Op::Expand(to.clone()),
        (Op::Permute(p), Op::Permute(q)) => {
            // Output dim i of the outer view is inner dim q[i], which is
            // source dim p[q[i]].
            let Some(perm) = q.iter().map(|&i| p.get(i).copied()).collect::<Option<Vec<_>>>() else {
                return false;
            };
            Op::Permute(perm)
        }
        (Op::Slice { dim: d1, start: s1, step: t1, .. }, Op::Slice { dim: d2, start: s2, step: t2, len })
            if d1 == d2 =>
        {
            // Outer index k reads inner index s2 + k*t2, which reads source
            // index s1 + (s2 + k*t2)*t1.
            let Some(start) = s2.checked_mul(*t1).and_then(|v| v.checked_add(*s1)) else { return false };
            let Some(step) = t1.checked_mul(*t2) else { return false };
            Op::Slice { dim: *d1, start, step, len: *len }
        }
        _ => return false,
    };
    graph.node_mut(id).op = composed;
    graph.set_operands(id, &[source]);
    true
}

/// The operand of `id` if `id` is a view that changes nothing.
fn identity_operand(graph: &Graph, id: NodeId) -> Option<NodeId> {
    let [operand] = graph.operands(id)[..] else { return None };
    let (node, input) = (graph.node(id), graph.node(operand));
    let identity = match &node.op {
        Op::Reshape(_) | Op::Expand(_) | Op::Slice { .. } => node.shape == input.shape,
        Op::Permute(perm) => perm.iter().enumerate().all(|(i, &p)| i == p),
        _ => false,
    };
    identity.then_some(operand)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, RegionId, Shape};

    fn input(g: &mut Graph, dims: &[usize]) -> NodeId {
        g.add(Op::Input(0), &[], Some((Shape::new(dims), DType::F32)), RegionId::ROOT).unwrap()
    }

    fn run(g: &mut Graph) -> (Changed, usize) {
        let mut cx = PassCtx::default();
        let changed = ViewFold.run(g, &mut cx).unwrap();
        (changed, cx.stats.rewrites)
    }

    fn add(g: &mut Graph, op: Op, operands: &[NodeId]) -> NodeId {
        g.add(op, operands, None, RegionId::ROOT).unwrap()
    }

    #[test]
    fn reshape_chain_becomes_one_reshape() {
        let mut g = Graph::new();
        let x = input(&mut g, &[2, 3, 4]);
        let a = add(&mut g, Op::Reshape(Shape::new([6, 4])), &[x]);
        let b = add(&mut g, Op::Reshape(Shape::new([4, 6])), &[a]);
        g.set_outputs(vec![b]);
        assert_eq!(run(&mut g), (Changed::Yes, 1));
        assert_eq!(g.operands(b), vec![x]);
        assert_eq!(g.node(b).op, Op::Reshape(Shape::new([4, 6])));
    }

    #[test]
    fn reshape_chain_back_to_the_source_shape_disappears() {
        let mut g = Graph::new();
        let x = input(&mut g, &[2, 3]);
        let a = add(&mut g, Op::Reshape(Shape::new([6])), &[x]);
        let b = add(&mut g, Op::Reshape(Shape::new([2, 3])), &[a]);
        let n = add(&mut g, Op::Unary(crate::ir::UnaryOp::Neg), &[b]);
        g.set_outputs(vec![n, b]);
        assert_eq!(run(&mut g), (Changed::Yes, 2));
        assert_eq!(g.operands(n), vec![x]);
        assert_eq!(g.outputs(), &[n, x]);
    }

    #[test]
    fn permutations_compose_in_the_right_order() {
        let mut g = Graph::new();
        let x = input(&mut g, &[2, 3, 5]);
        let a = add(&mut g, Op::Permute(vec![1, 2, 0]), &[x]); // [3,5,2]
        let b = add(&mut g, Op::Permute(vec![2, 0, 1]), &[a]); // [2,3,5]... check
        let c = add(&mut g, Op::Permute(vec![0, 2, 1]), &[b]);
        g.set_outputs(vec![c]);
        run(&mut g);
        // a∘b is the identity, so c permutes x directly.
        assert_eq!(g.operands(c), vec![x]);
        assert_eq!(g.node(c).op, Op::Permute(vec![0, 2, 1]));
        assert_eq!(g.node(c).shape, Shape::new([2, 5, 3]));
    }

    #[test]
    fn non_identity_composed_permutation() {
        let mut g = Graph::new();
        let x = input(&mut g, &[2, 3, 5]);
        let a = add(&mut g, Op::Permute(vec![1, 2, 0]), &[x]); // [3,5,2]
        let b = add(&mut g, Op::Permute(vec![1, 0, 2]), &[a]); // [5,3,2]
        g.set_outputs(vec![b]);
        run(&mut g);
        assert_eq!(g.operands(b), vec![x]);
        assert_eq!(g.node(b).op, Op::Permute(vec![2, 1, 0]));
        // The composed permutation still infers the node's shape.
        let t = crate::ir::infer(&g.node(b).op, &[(&Shape::new([2, 3, 5]), DType::F32)]).unwrap();
        assert_eq!(t.unwrap().0, Shape::new([5, 3, 2]));
    }

    #[test]
    fn slices_on_one_dim_compose() {
        let mut g = Graph::new();
        let x = input(&mut g, &[20]);
        let a = add(&mut g, Op::Slice { dim: 0, start: 2, step: 3, len: 6 }, &[x]); // 2,5,8,11,14,17
        let b = add(&mut g, Op::Slice { dim: 0, start: 1, step: 2, len: 3 }, &[a]); // 5,11,17
        g.set_outputs(vec![b]);
        run(&mut g);
        assert_eq!(g.operands(b), vec![x]);
        assert_eq!(g.node(b).op, Op::Slice { dim: 0, start: 5, step: 6, len: 3 });
    }

    #[test]
    fn slices_on_different_dims_stay() {
        let mut g = Graph::new();
        let x = input(&mut g, &[4, 4]);
        let a = add(&mut g, Op::Slice { dim: 0, start: 1, step: 1, len: 2 }, &[x]);
        let b = add(&mut g, Op::Slice { dim: 1, start: 1, step: 1, len: 2 }, &[a]);
        g.set_outputs(vec![b]);
        assert_eq!(run(&mut g), (Changed::No, 0));
        assert_eq!(g.operands(b), vec![a]);
    }

    #[test]
    fn overflowing_empty_slice_is_left_alone() {
        let mut g = Graph::new();
        let x = input(&mut g, &[4]);
        let a = add(&mut g, Op::Slice { dim: 0, start: 1, step: 2, len: 2 }, &[x]);
        // A zero-length slice may carry any start; composing it would overflow.
        let b = add(&mut g, Op::Slice { dim: 0, start: usize::MAX, step: 1, len: 0 }, &[a]);
        g.set_outputs(vec![b]);
        assert_eq!(run(&mut g), (Changed::No, 0));
        assert_eq!(g.operands(b), vec![a]);
    }

    #[test]
    fn identity_views_are_removed() {
        let mut g = Graph::new();
        let x = input(&mut g, &[1, 3]);
        let r = add(&mut g, Op::Reshape(Shape::new([1, 3])), &[x]);
        let p = add(&mut g, Op::Permute(vec![0, 1]), &[r]);
        let e = add(&mut g, Op::Expand(Shape::new([1, 3])), &[p]);
        let s = add(&mut g, Op::Slice { dim: 0, start: 0, step: 7, len: 1 }, &[e]);
        g.set_outputs(vec![s]);
        assert_eq!(run(&mut g).0, Changed::Yes);
        assert_eq!(g.outputs(), &[x]);
    }

    #[test]
    fn expands_compose() {
        let mut g = Graph::new();
        let x = input(&mut g, &[3, 1]);
        let a = add(&mut g, Op::Expand(Shape::new([1, 3, 1])), &[x]);
        let b = add(&mut g, Op::Expand(Shape::new([2, 3, 4])), &[a]);
        g.set_outputs(vec![b]);
        run(&mut g);
        assert_eq!(g.operands(b), vec![x]);
        assert_eq!(g.node(b).op, Op::Expand(Shape::new([2, 3, 4])));
    }

    #[test]
    fn mixed_kinds_and_fulls_are_left_alone() {
        let mut g = Graph::new();
        let x = input(&mut g, &[2, 3]);
        let p = add(&mut g, Op::Permute(vec![1, 0]), &[x]);
        let r = add(&mut g, Op::Reshape(Shape::new([6])), &[p]);
        let f = g
            .add(
                Op::Full(crate::ir::Scalar::Float(1.0)),
                &[],
                Some((Shape::new([6]), DType::F32)),
                RegionId::ROOT,
            )
            .unwrap();
        let e = add(&mut g, Op::Expand(Shape::new([2, 6])), &[f]);
        g.set_outputs(vec![r, e]);
        assert_eq!(run(&mut g), (Changed::No, 0));
    }
}
