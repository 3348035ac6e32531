//! Assign: a variable's new value becomes the value itself, and a fused
//! elementwise value may be written over the variable's old bytes.
//!
//! *Does.* Replaces every `assign %old, %value` (recorded by
//! `Variable::assign` when the variable held a realized value, see
//! [`crate::ir::Op::Assign`]) by `%value`. When `%value` is a `fused`
//! elementwise node that reads `%old` as operand `k`, `%old` is an
//! `input`, and no other assignment claimed `%value` first, the fused node
//! is marked `over=k` ([`crate::ir::FusedBody::over`]): the memory pass may
//! then place its result over that input's bytes (`OverInput`), so an
//! optimizer update, an EMA or a running statistic is computed into the
//! variable's own buffer. Whether it does depends on the schedule and the
//! other readers (`Facts::over_input_refusal`), and whether a run writes
//! there depends on the caller giving the buffer up (`context/donate.rs`).
//!
//! *Does not.* Mark a value that is not a fused elementwise node (a matmul,
//! a constant, a view, an input: they are computed as before), or one
//! that does not read the old value (its kernel would have to read the
//! old bytes it does not need first). Reorder anything.
//!
//! *Preserves.* Every value: `assign` is its value.
//!
//! *Invalidates.* The `assign` node ids.
//!
//! *Assumes.* A verified graph. The pass is required: it runs even when
//! turned off (`KILN_PASSES=-assign`), then marking nothing, since no
//! backend runs an `assign`.

use super::{Changed, Pass, PassCtx};
use crate::ir::{FusedKind, Graph, Op};
use crate::Result;
use std::sync::Arc;

/// Lowers assignments (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Assign;

impl Pass for Assign {
    fn name(&self) -> &'static str {
        "assign"
    }

    fn required(&self) -> bool {
        true
    }

    fn applies(&self, _options: &super::PassOptions, graph: &Graph) -> bool {
        graph.node_ids().into_iter().any(|id| matches!(graph.node(id).op, Op::Assign))
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let assigns: Vec<_> =
            graph.topo_order().into_iter().filter(|&id| matches!(graph.node(id).op, Op::Assign)).collect();
        for id in assigns {
            let [old, value] = graph.operands(id)[..] else { continue };
            if !cx.off {
                mark_over(graph, old, value);
            }
            graph.replace_all_uses(id, value);
            graph.remove(id);
            cx.rewrite();
        }
        Ok(Changed::from(cx.stats.rewrites > 0))
    }
}

/// Marks `value` as written over operand `old` when the module docs allow.
fn mark_over(graph: &mut Graph, old: crate::ir::NodeId, value: crate::ir::NodeId) {
    if !matches!(graph.node(old).op, Op::Input(_)) {
        return;
    }
    let Op::Fused(body) = &graph.node(value).op else { return };
    if body.kind() != &FusedKind::Elementwise || body.over().is_some() {
        return;
    }
    let Some(k) = graph.operands(value).iter().position(|&o| o == old) else { return };
    if let Ok(marked) = body.as_ref().clone().with_over(k) {
        graph.node_mut(value).op = Op::Fused(Arc::new(marked));
    }
}
