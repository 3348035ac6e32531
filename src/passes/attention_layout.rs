//! Attention layout: an attention whose heads are merged right after it
//! writes them merged.
//!
//! *Does.* For each `permute %a perm=[0,2,1,3]` of an `attention` `%a` in
//! the `[b, h, sq, dv]` layout that nothing else reads and that is not a
//! graph output, gives `%a` the `bshd` layout (its result becomes `[b,
//! sq, h, dv]`, the permute's value) and redirects the permute's users
//! and outputs to `%a`:
//! `permute(attention(q, k, v), [0,2,1,3])` → `attention(q, k, v) layout=bshd`.
//!
//! *Why.* A transformer merges its heads as `o.permute(0, 2, 1, 3)
//! .reshape(b, sq, h * dv)` before the output projection. The permute is
//! a view, but the reshape of a permuted value is not one, so the memory
//! plan made it a copy kernel: BERT-base 32x128 bf16 ran 12 of them, 4.2
//! µs each on an H200 (issue 36), and GPT-2 one a layer. With the layout
//! the attention's kernels write each output row where the merge puts it
//! and the reshape is free. FlashAttention's own output order is this one.
//!
//! *Does not.* Touch an attention something else reads too (the
//! backward's `attention_stats` reads the output `[b, h, sq, dv]`, so a
//! trained attention keeps its layout), or any other permute.
//!
//! *Preserves.* Every value the outputs see, bit for bit (the kernels
//! compute each row as before and store it elsewhere); regions.
//!
//! *Invalidates.* The ids of the removed permutes.
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
            if let Some(attention) = merged_attention(graph, id) {
                let node = graph.node_mut(attention);
                if let Op::Attention { layout, .. } = &mut node.op {
                    *layout = AttnLayout::Bshd;
                }
                let d = &node.shape.0;
                node.shape = Shape(vec![d[0], d[2], d[1], d[3]]);
                graph.replace_all_uses(id, attention);
                // The permute now reads a value of its own result's shape:
                // it goes, and nothing reads it any more.
                graph.remove(id);
                cx.rewrite();
                changed = Changed::Yes;
            }
        }
        Ok(changed)
    }
}

/// The attention that `id` merges the heads of, if `id` is such a permute
/// and it is the attention's only reader.
fn merged_attention(graph: &Graph, id: NodeId) -> Option<NodeId> {
    let Op::Permute(perm) = &graph.node(id).op else { return None };
    if perm[..] != MERGE {
        return None;
    }
    let a = graph.operands(id)[0];
    let only_reader = graph.users(a) == [id] && !graph.outputs().contains(&a);
    let bhsd = matches!(graph.node(a).op, Op::Attention { layout: AttnLayout::Bhsd, .. });
    (bhsd && only_reader).then_some(a)
}
