//! Merge matmuls: products that read the same left operand become one
//! product over their right operands side by side.
//!
//! *Why.* An encoder layer projects its input three times, `q = x wqᵀ +
//! bq`, `k = x wkᵀ + bk`, `v = x wvᵀ + bv`: three GEMMs of `[b · s, w]` by
//! `[w, w]`. A GEMM that small does not fill a large GPU for long enough
//! to hide its start and its tail: on an H200, BERT-base's `[4096, 768] x
//! [768, 768]` bf16 products take 12 µs each under ncu, and one `[4096,
//! 768] x [768, 2304]` over the three weights 25 (cuBLASLt, bias epilogue
//! both). GPT-2's checkpoints store the three
//! projections as one weight already; BERT's, and most encoders', as
//! three. TensorRT and XLA's horizontal fusion merge such siblings too.
//!
//! *Does.* Finds the 2-D f16 and bf16 `matmul`s `%m_i = matmul %a, %w_i`
//! (`[M, K] x [K, N_i]`) that read one value `%a` as their left operand. A member *has a
//! bias* when its only user, or the only user of its only user, a
//! `reshape` that keeps the last dimension, is `add` of it and an `expand`
//! of a vector `%b_i` of `N_i` elements (`x.matmul(wᵀ) + b` as a linear
//! layer records it). Members with a bias merge with each other, members
//! without one with each other; for each such set of two or more:
//!
//! ```text
//! %w  = cat %w_1, .., %w_n dim=1                  [K, ΣN]
//! %p  = matmul %a, %w                             [M, ΣN]
//! %b  = cat %b_1, .., %b_n dim=0                  [ΣN]        (biased sets)
//! %pb = add %p, expand %b                         [M, ΣN]
//! %m_i (or its add) = slice %pb dim=1 start=Σ_{j<i} N_j len=N_i  (reshaped as the add was)
//! ```
//!
//! When every `%w_i` is `permute %t_i perm=[1,0]` (a linear layer's
//! `[N_i, K]` weight read transposed), `%w` is `permute(cat %t_i dim=0)`
//! instead: the copy joins whole rows, and the product reads its right
//! operand transposed as each member did. When such a set has biases and
//! every `N_i` is a multiple of 8, one copy joins the weights and the
//! biases (each piece viewed as rows of 8 elements): `%w` is a view of its
//! first `ΣN · K` elements and `%b` of the last `ΣN`, one launch where
//! there were two (the biases' copy alone took 2 µs for 4.6 KB on an
//! H200). The slices are views: the readers of `q`, `k` and `v` (an
//! attention's kernels) read the merged product through strides. Fusion
//! then makes `%pb` the GEMM's bias epilogue as it did each member's.
//!
//! *Does not.* Merge f32 or f64 products: without TF32 their GEMMs run on
//! CUDA cores and already fill the GPU (MiniLM-L6's three f32 `[8192,
//! 384] x [384, 384]` take 214 µs, one over the three weights 202), and
//! the weights' copy took back more than that (MiniLM-L6 f32 4.88-4.90 ms
//! a call unmerged, 4.91-4.99 merged). Merge when the right operands (with
//! the biases) hold more elements than `%a`: the weights' copy must stay small beside the
//! product. The weight gradients of the same projections also share
//! their left operand (`xᵀ`), but their right operands are the
//! activations' gradients, as large as `x` each; a token's decode step
//! (`M` = 1) reads each weight once, and copying them would double its
//! bytes. Merge when a member reaches another member's right operand or
//! bias (the merged node would read itself), or products of other ranks.
//!
//! *Preserves.* Every output value up to rounding: each element is the
//! same dot product plus the same bias, but the merged GEMM may run
//! another kernel, which sums in another order. Effects (a `matmul` is
//! none); regions (the merged nodes go to the members' nearest common
//! region, each slice to the region of the node it replaces).
//!
//! *Invalidates.* Nothing kept across passes (it runs before fusion). The
//! members and their bias adds are left to DCE.
//!
//! *Cost.* The weights' and the biases' copy: for a BERT-base layer
//! 3.5 MB, one kernel of 4.5 µs (4.4 and 2.0 as two) against the 11 µs
//! the merged product saves. In a context's plan whose weights are
//! variables the copy reads nothing else, so `weight-prologue` keeps it
//! between calls; it runs again when a weight changes.
//!
//! *Assumes.* A verified graph in the canonical phase. O(n) per set (the
//! check that no member feeds another's operands).

use super::cse::common_ancestor;
use super::{Changed, Pass, PassCtx, PassOptions};
use crate::ir::{BinaryOp, DType, Graph, Node, NodeId, Op, RegionId, Shape};
use crate::Result;

/// The run, in elements, of the weights' and biases' joined copy: every
/// width a multiple of it keeps every piece (and the biases' start, for
/// cuBLASLt's bias pointer) 16-byte aligned in 16-bit types, and the
/// copy kernel moves four elements at a time.
const RUN: usize = 8;

/// Merges products that share their left operand (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct MergeMatmuls;

impl Pass for MergeMatmuls {
    fn name(&self) -> &'static str {
        "merge-matmuls"
    }

    /// Off where [`PassOptions::merge_matmuls`] is (a CPU context), and on
    /// graphs without a 16-bit product.
    fn applies(&self, options: &PassOptions, graph: &Graph) -> bool {
        options.merge_matmuls
            && graph.node_ids().iter().any(|&id| {
                let node = graph.node(id);
                node.op == Op::MatMul && matches!(node.dtype, DType::F16 | DType::BF16)
            })
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let mut changed = Changed::No;
        if !cx.options.merge_matmuls {
            // Run by name (`run_single`) in a context that merges nothing.
            return Ok(changed);
        }
        for set in sets(graph) {
            if let Some(widths) = merge(graph, &set) {
                cx.note(format!("merged {} products of {} into one of {}", set.len(), set[0].lhs, widths));
                cx.rewrite();
                changed = Changed::Yes;
            }
        }
        Ok(changed)
    }
}

/// One product that may merge: `node = matmul lhs, rhs`, with its bias.
#[derive(Clone, Debug)]
struct Member {
    node: NodeId,
    lhs: NodeId,
    rhs: NodeId,
    /// The bias add and the vector it adds, if any.
    bias: Option<Bias>,
}

#[derive(Clone, Debug)]
struct Bias {
    add: NodeId,
    vector: NodeId,
}

/// The sets to merge: members grouped by left operand, dtype and whether
/// they have a bias, in the order their first member comes in the graph;
/// only sets of two or more.
fn sets(graph: &Graph) -> Vec<Vec<Member>> {
    let mut sets: Vec<((NodeId, DType, bool), Vec<Member>)> = Vec::new();
    for id in graph.topo_order() {
        let node = graph.node(id);
        if node.op != Op::MatMul || node.shape.rank() != 2 || !matches!(node.dtype, DType::F16 | DType::BF16)
        {
            continue;
        }
        let ops = graph.operands(id);
        let (lhs, rhs) = (ops[0], ops[1]);
        if graph.node(lhs).shape.rank() != 2 || graph.node(rhs).shape.rank() != 2 || lhs == rhs {
            continue;
        }
        let bias = bias_of(graph, id);
        let key = (lhs, node.dtype, bias.is_some());
        let member = Member { node: id, lhs, rhs, bias };
        match sets.iter_mut().find(|(k, _)| *k == key) {
            Some((_, set)) => set.push(member),
            None => sets.push((key, vec![member])),
        }
    }
    sets.into_iter().map(|(_, set)| set).filter(|set| set.len() >= 2).collect()
}

/// The bias a linear layer adds to product `m` (see the module docs).
fn bias_of(graph: &Graph, m: NodeId) -> Option<Bias> {
    let width = *graph.node(m).shape.0.last()?;
    let only_user = |id: NodeId| match graph.users(id)[..] {
        [u] if !graph.outputs().contains(&id) => Some(u),
        _ => None,
    };
    let mut user = only_user(m)?;
    let mut reshape = None;
    if let Op::Reshape(to) = &graph.node(user).op {
        if to.0.last() != Some(&width) {
            return None;
        }
        reshape = Some(user);
        user = only_user(user)?;
    }
    if graph.node(user).op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let value = reshape.unwrap_or(m);
    let ops = graph.operands(user);
    let other = match ops[..] {
        [a, b] if a == value && b != value => b,
        [a, b] if b == value && a != value => a,
        _ => return None,
    };
    if !matches!(graph.node(other).op, Op::Expand(_)) {
        return None;
    }
    let vector = graph.operands(other)[0];
    let v = graph.node(vector);
    (v.shape.0[..] == [width] && v.dtype == graph.node(m).dtype).then_some(Bias { add: user, vector })
}

/// Rewrites one set (module docs); the merged product's width, or `None`
/// when the set may not merge.
fn merge(graph: &mut Graph, set: &[Member]) -> Option<usize> {
    let lhs = set[0].lhs;
    let (rows, k) = (graph.node(lhs).shape.0[0], graph.node(lhs).shape.0[1]);
    let widths: Vec<usize> = set.iter().map(|m| graph.node(m.node).shape.0[1]).collect();
    let total: usize = widths.iter().sum();
    let copied = k * total + if set[0].bias.is_some() { total } else { 0 };
    if copied > graph.node(lhs).shape.numel() {
        return None;
    }
    // No member may feed another's operands: the merged node would read
    // its own value.
    let vectors: Vec<NodeId> = set.iter().filter_map(|m| m.bias.as_ref().map(|b| b.vector)).collect();
    let sources: Vec<NodeId> = set.iter().map(|m| m.rhs).chain(vectors.iter().copied()).collect();
    let upstream = graph.reachable_from(&sources);
    if set.iter().any(|m| upstream.contains(&m.node)) {
        return None;
    }
    let at = At {
        dtype: graph.node(set[0].node).dtype,
        region: set.iter().map(|m| graph.node(m.node).region).reduce(|a, b| common_ancestor(graph, a, b))?,
    };
    // The right operands side by side; rows of the untransposed weights
    // when every member reads its weight transposed.
    let transposed: Option<Vec<NodeId>> = set
        .iter()
        .map(|m| match &graph.node(m.rhs).op {
            Op::Permute(p) if p[..] == [1, 0] => Some(graph.operands(m.rhs)[0]),
            _ => None,
        })
        .collect();
    let (rhs, vector) = match transposed {
        Some(weights) if !vectors.is_empty() && widths.iter().all(|w| w % RUN == 0) => {
            let (rows_first, vector) = joined_copy(graph, at, &weights, &vectors, &widths, k);
            (at.add(graph, Op::Permute(vec![1, 0]), vec![k, total], &[rows_first]), Some(vector))
        }
        Some(weights) => {
            let rows_first = at.add(graph, Op::Cat { dim: 0 }, vec![total, k], &weights);
            (at.add(graph, Op::Permute(vec![1, 0]), vec![k, total], &[rows_first]), None)
        }
        None => {
            let rhs: Vec<NodeId> = set.iter().map(|m| m.rhs).collect();
            (at.add(graph, Op::Cat { dim: 1 }, vec![k, total], &rhs), None)
        }
    };
    let mut merged = at.add(graph, Op::MatMul, vec![rows, total], &[lhs, rhs]);
    if !vectors.is_empty() {
        let vector = vector.unwrap_or_else(|| at.add(graph, Op::Cat { dim: 0 }, vec![total], &vectors));
        let expanded = at.add(graph, Op::Expand(Shape::new([rows, total])), vec![rows, total], &[vector]);
        merged = at.add(graph, Op::Binary(BinaryOp::Add), vec![rows, total], &[merged, expanded]);
    }
    let mut start = 0;
    for (m, &width) in set.iter().zip(&widths) {
        let replaced = m.bias.as_ref().map_or(m.node, |b| b.add);
        let here = At { region: graph.node(replaced).region, ..at };
        let slice = Op::Slice { dim: 1, start, step: 1, len: width };
        let mut value = here.add(graph, slice, vec![rows, width], &[merged]);
        let shape = graph.node(replaced).shape.clone();
        if shape.0[..] != [rows, width] {
            value = here.add(graph, Op::Reshape(shape.clone()), shape.0, &[value]);
        }
        graph.replace_all_uses(replaced, value);
        start += width;
    }
    Some(total)
}

/// The dtype and region of the nodes a merge adds.
#[derive(Clone, Copy)]
struct At {
    dtype: DType,
    region: RegionId,
}

impl At {
    fn add(self, graph: &mut Graph, op: Op, shape: Vec<usize>, operands: &[NodeId]) -> NodeId {
        graph
            .add_unchecked(Node { op, shape: Shape(shape), dtype: self.dtype, region: self.region }, operands)
    }
}

/// One copy of the weights' rows (`[N_i, K]` each) and the biases, each
/// viewed as rows of [`RUN`] elements: the weights `[ΣN, K]` are a view of
/// its first `ΣN · K` elements, the biases of the `ΣN` after them.
fn joined_copy(
    graph: &mut Graph,
    at: At,
    weights: &[NodeId],
    vectors: &[NodeId],
    widths: &[usize],
    k: usize,
) -> (NodeId, NodeId) {
    let total: usize = widths.iter().sum();
    let sizes = widths.iter().map(|w| w * k).chain(widths.iter().copied());
    let pieces: Vec<NodeId> = weights
        .iter()
        .chain(vectors)
        .zip(sizes)
        .map(|(&part, elements)| {
            at.add(graph, Op::Reshape(Shape::new([elements / RUN, RUN])), vec![elements / RUN, RUN], &[part])
        })
        .collect();
    let all = total * k + total;
    let joined = at.add(graph, Op::Cat { dim: 0 }, vec![all / RUN, RUN], &pieces);
    let flat = at.add(graph, Op::Reshape(Shape::new([all])), vec![all], &[joined]);
    let slice = |start, len| Op::Slice { dim: 0, start, step: 1, len };
    let rows_flat = at.add(graph, slice(0, total * k), vec![total * k], &[flat]);
    let rows_first = at.add(graph, Op::Reshape(Shape::new([total, k])), vec![total, k], &[rows_flat]);
    (rows_first, at.add(graph, slice(total * k, total), vec![total], &[flat]))
}
