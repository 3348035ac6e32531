//! Attention gradients: keep them fused where a kernel runs them, expand
//! them elsewhere.
//!
//! *Does.* Autodiff records an attention's gradient as an
//! [`Op::AttentionStats`] node and [`Op::AttentionGrad`] nodes, which never
//! hold the `[sq, sk]` score matrices (`passes/autodiff/attention.rs`).
//! This pass keeps them when the queries are `f16` or `bf16` and both
//! head dims are multiples of 16 from 16 to 128: the shapes the
//! tensor-core kernels take (on CUDA; the CPU runs every shape). Every
//! other one is replaced by its definition in the IR's own ops: the
//! scores, their log-sum-exp and `Σ o g` for the stats; `P = e^(s -
//! lse)`, `dS = P (g vᵀ - delta)` and the matmuls for the gradients. f32
//! products then run on the GEMM library, which beats a CUDA-core fused
//! kernel. Expanded f16 and bf16 nodes keep their products in their type
//! and the softmax in f32, as autocast would have placed them (the pass
//! runs after autocast, so it sees the type each attention runs in).
//!
//! *Does not.* Touch forward attention, or anything else.
//!
//! *Preserves.* Every value, up to rounding: an expansion is the op's
//! definition.
//!
//! *Invalidates.* The ids of the expanded nodes, and the slices autodiff
//! took of a key-and-value gradient (answered by the expanded gradients
//! themselves).
//!
//! *Assumes.* A verified graph. The pass is required: turned off
//! (`KILN_PASSES=-attention-grad`) it expands every node, which gives the
//! unfused formulation to compare against.

use super::autodiff::expand_attention_grad;
use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, NodeId, Op};
use crate::{Error, Result};

/// Keeps or expands attention gradients (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionGrad;

impl Pass for AttentionGrad {
    fn name(&self) -> &'static str {
        "attention-grad"
    }

    fn required(&self) -> bool {
        true
    }

    fn applies(&self, _options: &super::PassOptions, graph: &Graph) -> bool {
        graph
            .node_ids()
            .into_iter()
            .any(|id| matches!(graph.node(id).op, Op::AttentionGrad { .. } | Op::AttentionStats { .. }))
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let grads: Vec<NodeId> = graph
            .topo_order()
            .into_iter()
            .filter(|&id| matches!(graph.node(id).op, Op::AttentionGrad { .. } | Op::AttentionStats { .. }))
            .collect();
        let mut kept = 0;
        for id in grads {
            if !cx.off && fused_kernel_takes(graph, id) {
                kept += 1;
                continue;
            }
            expand_attention_grad(graph, id)
                .map_err(|m| Error::Verify(format!("attention-grad: expanding {id}: {m}")))?;
            graph.remove(id);
            cx.rewrite();
        }
        if kept > 0 {
            cx.note(format!("{kept} kept fused"));
        }
        Ok(Changed::from(cx.stats.rewrites > 0))
    }
}

/// Whether the fused kernels run the `attention_stats` or
/// `attention_grad` node `id` (operand 2, the values or the output, has
/// the value head dim).
fn fused_kernel_takes(graph: &Graph, id: NodeId) -> bool {
    let ops = graph.operands(id);
    let (q, v) = (graph.node(ops[0]), graph.node(ops[2]));
    crate::attention::fused_grad_takes(q.dtype, q.shape.0[3], v.shape.0[3])
}
