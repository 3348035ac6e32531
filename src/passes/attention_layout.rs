//! Attention layout: an attention whose heads are merged right after it
//! writes them merged.
//!
//! *Does.* For each `permute %p perm=[0,2,1,3]` of an `attention` `%a` in
//! the `[b, h, sq, dv]` layout that is not a graph output and that
//! nothing else reads except as the output operand of its gradient's
//! `attention_stats` or `attention_delta`, gives `%a` the `bshd` layout
//! (its result becomes `[b, sq, h, dv]`, the permute's value) and
//! redirects the permute's users and outputs to `%a`:
//! `permute(attention(q, k, v), [0,2,1,3])` → `attention(q, k, v) layout=bshd`.
//! The gradient's readers then read `%p`, now the permute of `%a` back
//! to `[b, h, sq, dv]` (a view: their kernels read the output through
//! strides); with none, `%p` is removed.
//!
//! *Why.* A transformer merges its heads as `o.permute(0, 2, 1, 3)
//! .reshape(b, sq, h * dv)` before the output projection. The permute is
//! a view, but the reshape of a permuted value is not one, so the memory
//! plan made it a copy kernel: BERT-base 32x128 bf16 ran 12 of them, 4.2
//! µs each on an H200 (issue 36), and GPT-2 one a layer. With the layout
//! the attention's kernels write each output row where the merge puts it
//! and the reshape is free. FlashAttention's own output order is this one.
//!
//! *Does not.* Touch an attention something else reads too, or any other
//! permute.
//!
//! *Preserves.* Every value the outputs see, bit for bit (the kernels
//! compute each row as before and store it elsewhere); regions.
//!
//! *Invalidates.* The ids of the removed permutes; a kept permute's
//! shape (now `[b, h, sq, dv]`).
//!
//! *Assumes.* A verified graph; it runs after autodiff recorded every
//! gradient (autodiff has no rule for the `bshd` layout) and after
//! `narrow`, which narrows `bhsd` attentions only.

use super::{Changed, Pass, PassCtx, PassOptions};
use crate::ir::{AttnLayout, Graph, NodeId, Op, Shape};
use crate::Result;

/// Gives attentions whose heads are merged next the `bshd` layout (see the
/// module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionLayout;

/// The permutation that moves heads behind query rows.
const MERGE: [usize; 4] = [0, 2, 1, 3];

impl Pass for AttentionLayout {
    fn name(&self) -> &'static str {
        "attention-layout"
    }

    /// Only a graph with an attention has one to lay out.
    fn applies(&self, _options: &PassOptions, graph: &Graph) -> bool {
        graph.node_ids().iter().any(|&id| matches!(graph.node(id).op, Op::Attention { .. }))
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let mut changed = Changed::No;
        for id in graph.topo_order() {
            if let Some((attention, gradient)) = merged_attention(graph, id) {
                let node = graph.node_mut(attention);
                if let Op::Attention { layout, .. } = &mut node.op {
                    *layout = AttnLayout::Bshd;
                }
                let d = node.shape.0.clone();
                node.shape = Shape(vec![d[0], d[2], d[1], d[3]]);
                graph.replace_all_uses(id, attention);
                if gradient.is_empty() {
                    // Nothing reads the permute any more: it goes.
                    graph.remove(id);
                } else {
                    // The permute turns the result back into `[b, h, sq,
                    // dv]`, and the gradient's readers read that view.
                    graph.node_mut(id).shape = Shape(d);
                    for user in gradient {
                        let ops: Vec<NodeId> = graph
                            .operands(user)
                            .into_iter()
                            .map(|o| if o == attention { id } else { o })
                            .collect();
                        graph.set_operands(user, &ops);
                    }
                }
                cx.rewrite();
                changed = Changed::Yes;
            }
        }
        Ok(changed)
    }
}

/// The attention that `id` merges the heads of, if `id` is such a permute
/// and every other reader of the attention is its gradient's (see
/// [`gradient_reader`]), with those readers.
fn merged_attention(graph: &Graph, id: NodeId) -> Option<(NodeId, Vec<NodeId>)> {
    let Op::Permute(perm) = &graph.node(id).op else { return None };
    if perm[..] != MERGE {
        return None;
    }
    let a = graph.operands(id)[0];
    if !matches!(graph.node(a).op, Op::Attention { layout: AttnLayout::Bhsd, .. })
        || graph.outputs().contains(&a)
    {
        return None;
    }
    let mut gradient = Vec::new();
    for user in graph.users(a) {
        if user == id {
            continue;
        }
        if !gradient_reader(graph, user, a) {
            return None;
        }
        if !gradient.contains(&user) {
            gradient.push(user);
        }
    }
    Some((a, gradient))
}

/// Whether `user` reads attention `a` only as its output operand: an
/// `attention_stats` (`q, k, o, g [, mask]`) or `attention_delta` (`o, g,
/// lse`) of its gradient, whose kernels read `o` through strides.
fn gradient_reader(graph: &Graph, user: NodeId, a: NodeId) -> bool {
    let slot = match graph.node(user).op {
        Op::AttentionStats { .. } => 2,
        Op::AttentionDelta => 0,
        _ => return false,
    };
    graph.operands(user).iter().enumerate().all(|(k, &o)| o != a || k == slot)
}
