//! Memory: liveness over the schedule (aware of streams), in-place reuse,
//! offsets in one arena; reports the arena size and the lower bound.
//!
//! *Does.* Fills the graph's memory table for its schedule (the
//! topological order, stored as the schedule, when there is none) and its
//! stream plan (one stream when there is none):
//! - **Placements.** `input` → input; `full` → constant; a view → an alias
//!   of its storage root (view chains are followed to the value they
//!   start from); the storage root of a graph output → output (its own
//!   allocation, never shared); everything else → arena. A `reshape`
//!   whose operand's strides cannot express it copies, so it is a root
//!   and takes bytes of its own (PyTorch's `view` rule).
//! - **Lifetimes.** A value lives from its step to its last reader's,
//!   readers of its aliases included. On several streams its bytes stay
//!   reserved until every node that is not ordered after all of its
//!   readers has been scheduled (such a node may run while a reader still
//!   reads), so values on streams that happens-before does not order never
//!   share bytes.
//! - **Over an input.** The storage root of a graph output that is a
//!   `write_at` is written over its target input (`OverInput`) when every
//!   other reader of that input runs before it, no output returns the
//!   input, and neither the value nor the offset reads it
//!   ([`crate::ir::lifetimes::Facts::over_input_refusal`]); each input at
//!   most once. The caller decides per run whether it gives the input's
//!   bytes up (see `Plan::donated`).
//! - **In place.** A `fused` node of kind elementwise, or of kind
//!   reduction whose value has the domain's shape (a row kernel writes it
//!   in its last pass over each row, as the softmax gradient of a loss
//!   merged with the loss's row reductions), takes the bytes of
//!   its first operand `k` such that (a) the operand is an arena value
//!   whose last reader (aliases included) is this node, and every other
//!   reader happens before it; (b) the body reads `input k` only directly
//!   with compute nodes (no view) at the output's shape; (c) the operand
//!   has the output's byte size; (d) no other operand reads the same
//!   bytes. Each element is then read before it is overwritten. Unfused
//!   elementwise ops are never in place: the CPU backend computes only
//!   fused nodes in place, and a fusion pass leaves no unfused chains.
//! - **Offsets.** 64-byte aligned, chosen by two layouts, keeping the
//!   smaller arena (ties: greedy by size): greedy by size (largest first,
//!   lowest offset clear of the placed values whose lifetimes overlap;
//!   TFLite's planner) and first fit in schedule order. On the 1,000
//!   random DAGs of tests/plan_props.rs (fixed seed, one stream, tiny
//!   shapes, so the 64-byte alignment weighs a lot) the arenas add up to
//!   71,916 B with greedy by size alone, 73,436 B with first fit alone,
//!   and 71,616 B keeping the smaller per graph (first fit wins 14 of
//!   1,000); the lower bounds add up to 59,580 B, the naive sums to
//!   79,000 B.
//!   Both are O(m log m) plus the overlapping pairs.
//!
//! Reports `arena_bytes`, `lower_bound` (the most bytes of arena values
//! whose lifetimes include one step; a value and the one computed in place
//! of it count once) and `naive_bytes` (every arena value in its own
//! bytes) in the table and as a note.
//!
//! *Does not.* Reorder the schedule, pick streams, or place inputs,
//! constants and outputs (the caller and the backend own those bytes).
//!
//! *Preserves.* The graph, the schedule and the stream plan.
//!
//! *Invalidates.* Nothing.
//!
//! *Assumes.* A verified graph whose schedule and stream tables, if any,
//! passed [`crate::ir::verify`].

mod layout;

use super::{Changed, Pass, PassCtx};
use crate::ir::lifetimes::{peak_bytes, value_bytes, Facts, Kind};
use crate::ir::{Graph, MemoryPlan, Phase, Placement, ValueMemory};
use crate::Result;
use layout::Item;
use std::collections::BTreeMap;

/// Plans the arena (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory;

impl Pass for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let order = graph.schedule_or_topo();
        let (plan, layout) = plan_memory(graph, &order);
        cx.note(format!(
            "arena {} B, lower bound {} B, naive {} B",
            plan.arena_bytes, plan.lower_bound, plan.naive_bytes
        ));
        cx.note(format!(
            "layouts: greedy by size {} B, first fit in schedule order {} B",
            layout.0, layout.1
        ));
        tracing::debug!(
            arena = plan.arena_bytes,
            lower_bound = plan.lower_bound,
            naive = plan.naive_bytes,
            by_size = layout.0,
            in_order = layout.1,
            "memory"
        );
        let tables = graph.tables_mut();
        let changed = tables.memory.as_ref() != Some(&plan) || tables.schedule.is_none();
        tables.schedule = Some(order);
        tables.memory = Some(plan);
        Ok(changed.into())
    }

    fn reaches(&self) -> Phase {
        Phase::Planned
    }
}

/// The memory plan of `order` and the arena sizes of both layouts
/// (greedy by size, first fit in schedule order).
fn plan_memory(graph: &Graph, order: &[crate::ir::NodeId]) -> (MemoryPlan, (u64, u64)) {
    let facts = Facts::new(graph, order, graph.tables().streams.as_ref());
    let n = order.len();
    // In place, and the groups of values that share one range.
    let mut in_place = vec![None; n];
    let mut group_of = vec![usize::MAX; n];
    let mut items: Vec<Item> = Vec::new();
    let mut naive = 0u64;
    for t in 0..n {
        if facts.kind[t] != Kind::Arena {
            continue;
        }
        let bytes = value_bytes(graph, order[t]);
        naive += bytes;
        let slots = graph.operands(order[t]);
        let k = (0..slots.len()).find(|&k| facts.in_place_refusal(graph, t, k).is_none());
        let end = facts.window_end(t);
        match k.and_then(|k| facts.step(slots[k])) {
            Some(x) => {
                in_place[t] = Some(slots[k.unwrap_or(0)]);
                let g = group_of[x];
                group_of[t] = g;
                items[g].end = items[g].end.max(end);
            }
            None => {
                group_of[t] = items.len();
                items.push(Item { start: facts.window_start(t), end, bytes });
            }
        }
    }
    let by_size = layout::greedy_by_size(&items);
    let in_order = layout::first_fit_in_order(&items);
    let (size_a, size_b) = (layout::arena_size(&items, &by_size), layout::arena_size(&items, &in_order));
    let (offsets, arena_bytes) = if size_b < size_a { (in_order, size_b) } else { (by_size, size_a) };
    let windows: Vec<(u32, u32, u64)> = items.iter().map(|it| (it.start, it.end, it.bytes)).collect();
    let mut values = BTreeMap::new();
    let mut written_over = std::collections::BTreeSet::new();
    for (t, &id) in order.iter().enumerate() {
        let placement = match facts.kind[t] {
            Kind::Input => Placement::Input,
            Kind::Constant => Placement::Constant,
            Kind::Output => match facts.over_input(graph, t) {
                Some(input) if written_over.insert(input) => Placement::OverInput(input),
                _ => Placement::Output,
            },
            Kind::Alias(root) => Placement::Alias(root),
            Kind::Arena => {
                let g = group_of[t];
                let bytes = value_bytes(graph, id);
                let offset = if bytes == 0 { 0 } else { offsets[g] };
                Placement::Arena { offset, bytes, in_place_of: in_place[t] }
            }
        };
        values.insert(id, ValueMemory { placement, live: (t as u32, facts.last_read[t]) });
    }
    let plan = MemoryPlan { arena_bytes, lower_bound: peak_bytes(&windows), naive_bytes: naive, values };
    (plan, (size_a, size_b))
}
