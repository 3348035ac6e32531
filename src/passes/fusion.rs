//! Fusion: elementwise chains, broadcasts, row reductions and matmul
//! epilogues become `fused` nodes, one kernel each.
//!
//! *Does.* Partitions the compute nodes into groups and replaces each group
//! by one `fused` node whose body ([`crate::ir::fused`] states the
//! contract) computes the group's root from the group's external operands.
//! Groups grow from consumers to producers, walking the needed nodes in
//! reverse topological order: a node joins the group of its users when all
//! of them are in that one group, it is not a graph output, and the group
//! stays legal with it; otherwise an elementwise op or a reduction starts a
//! group of its own (so even a lone `exp` becomes a fused node: the memory
//! pass can then compute it in place, and every elementwise op reaches a
//! backend the same way). The kinds that come out:
//! - *elementwise*: ops of one shape, with the broadcasts (`expand` of an
//!   input or a `full`) and other views of their operands inside;
//! - *reduction*: `sum`/`mean`/`max`/`min` over the trailing dims of one
//!   domain, with the elementwise prologue before them, the row values
//!   between them (`expand` from the row back to the domain) and the
//!   epilogue after them: softmax, log-softmax and layernorm each become
//!   one node, as `src/tensor/reduce.rs` records them;
//! - *matmul*: a matmul whose result only feeds one elementwise group in
//!   which every op follows the matmul (bias via `expand`, `relu`, `gelu`,
//!   a residual `add`): the GEMM with its epilogue.
//!
//! Leaves go inside: a `full` read by a group becomes a `full` in the body
//! (never an operand), and a view of anything outside the group (an input,
//! a `full`, another group's result) becomes a leaf view in the body. Both
//! are free to recompute, so several bodies may each hold a copy.
//!
//! *When not to fuse (the rule).* Compute is never duplicated: every
//! compute node lands in exactly one group, so an `exp`, a reduction or a
//! matmul runs once. One exception: a widening cast (bf16 or f16 to f32)
//! that only elementwise groups and row reductions read is recomputed in
//! each of their bodies from the narrow value, which costs each reader
//! fewer bytes than reading a wide copy and writes no copy at all. Hence a value read by consumers outside its group
//! (or returned) is materialized: it is its group's root (the one output)
//! and the consumers read it. Only leaves and leaf views (cheap, no work)
//! are copied into several bodies. A view of a computed value ends the
//! value's group, except the `expand` of a reduced row back over the
//! domain inside a reduction group; the view then starts the next group as
//! a leaf view of the materialized value. A reduction joins a group only if
//! every reduction there has its domain and reduced dims, so a value
//! computed from rows of one reduction (e.g. a log-softmax) is not pulled
//! into a group that reduces other dims (e.g. a loss summed over the batch):
//! each node carries the row reduction it descends from through
//! elementwise ops and expands, and a group only takes nodes that agree
//! with its own. A reduction that drops its dims (no `keepdim`) can only be
//! a root. Left as they are: matmuls with no epilogue, conv, pooling,
//! gather, index_select, cat, argmax, reductions over non-trailing dims,
//! and `random`/`arange`/`buffer` sources (they are operands of bodies).
//!
//! A `gather` or `index_select` of a cast (through views) becomes a cast
//! of the gather first (`gather_cast.rs`: the same elements converted),
//! so that a widening cast a loss gathers from keeps only fused readers
//! and is recomputed in them.
//!
//! A float `sum` or `mean` over non-trailing dims (a column sum, which
//! stays unfused) of a widening cast (through views) reads the narrow
//! value and widens as it reads (`wide_sum.rs`: `sum(cast(x))` becomes
//! `sum(x) into=f32`, the same bits), so that no kernel writes the wide
//! copy for it.
//!
//! A `reshape` of an elementwise node that nothing else reads moves to
//! that node's operands first (`sink.rs`: `reshape(f(a, b)) =
//! f(reshape(a), reshape(b))`, the same elements), so that the node joins
//! its reader's group instead of ending its own there. The other way for
//! a matmul's product: a reshape of it that keeps the last dimension
//! moves below the elementwise ops that read it with a bias or a scalar
//! (`f(reshape(p), expand(b))` becomes `reshape(f(p, expand(b)))`), so
//! that a `[batch, seq, in]` linear layer's bias joins the GEMM as it
//! does for a 2-d product (not on the CPU backend:
//! `PassOptions::reshape_epilogues`).
//!
//! *Stats.* The note says `kernels A -> B, bytes moved C -> D`. A kernel is
//! every needed node that is neither a source nor a view (a fused node is
//! one). Bytes moved sums over kernels the output's bytes plus the bytes of
//! the distinct values it reads from memory: an operand is followed through
//! views to the value they view (counted whole, an upper bound for a
//! slice), and a `full` costs nothing (a backend broadcasts one element).
//! Each fused node counts as one rewrite.
//!
//! *Does not.* Duplicate compute, fuse across a non-fusible op, reorder or
//! rewrite arithmetic (bodies hold the original ops, so results are bit for
//! bit those of the unfused graph run op by op), or pull a computed residual
//! into a matmul epilogue (a matmul whose epilogue group also computes
//! something that does not follow the matmul stays a lone matmul).
//!
//! *Preserves.* Every value the outputs see; the outputs' order. A fused
//! node sits in its root's region (body nodes have none of their own).
//!
//! *Invalidates.* Every node id (the graph is rebuilt from its needed
//! nodes; dead nodes are dropped) and the plan tables.
//!
//! *Assumes.* A verified graph; canonical is best (folded views, merged
//! constants) but not needed. The output is a function of the graph's
//! structure only: the same graph always gives the same text.

mod build;
mod gather_cast;
mod group;
mod sink;
mod wide_sum;

use super::{Changed, Pass, PassCtx};
use crate::ir::{DType, Graph, Phase};
use crate::Result;

/// Groups elementwise work, row reductions and matmul epilogues into fused
/// nodes (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fusion;

impl Pass for Fusion {
    fn name(&self) -> &'static str {
        "fusion"
    }

    fn reaches(&self) -> Phase {
        Phase::Fused
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let before = build::cost(graph);
        let hoisted = gather_cast::hoist_casts_over_gathers(graph);
        let widened = wide_sum::widen_in_column_sums(graph);
        let lifted =
            if cx.options.reshape_epilogues { sink::hoist_reshapes_over_epilogues(graph) } else { 0 };
        let sunk = sink::sink_reshapes(graph) + hoisted + widened + lifted;
        let index = group::Index::new(graph);
        let grouping = {
            let _span = tracing::debug_span!("fusion-group", nodes = index.len()).entered();
            group::plan(&index)
        };
        let (out, fused) = {
            let _span = tracing::debug_span!("fusion-build", groups = grouping.groups.len()).entered();
            build::build(graph, &index, &grouping, cx)?
        };
        if fused == 0 {
            cx.note(format!("kernels {0} -> {0}, no group fused", before.kernels));
            return Ok(Changed::from(sunk > 0));
        }
        *graph = out;
        let after = build::cost(graph);
        cx.note(format!(
            "kernels {} -> {}, bytes moved {} -> {}",
            before.kernels,
            after.kernels,
            build::human_bytes(before.bytes),
            build::human_bytes(after.bytes)
        ));
        Ok(Changed::Yes)
    }
}

#[cfg(test)]
mod tests;

/// Whether a cast from `from` to `to` widens one float type to a wider
/// one (exact: every value of `from` is a value of `to`), the casts
/// fusion lets readers redo from the narrow value (`wide_sum.rs`,
/// `sink.rs`).
fn widens_float(from: DType, to: DType) -> bool {
    from.is_float() && to.is_float() && to.size() > from.size()
}
