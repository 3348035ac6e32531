//! Horizontal: small independent elementwise kernels run as one launch.
//!
//! *Why.* An optimizer step updates every parameter with the same few
//! elementwise kernels (AdamW: the second moment, the first moment, the
//! parameter), each a fused node of a few thousand elements. On a GPU each
//! is one launch that costs about as much as its work; a GPT with 54
//! parameter tensors spends 162 launches on them. PyTorch's `fused=True`
//! AdamW is one multi-tensor kernel. This pass gives backends the same
//! opportunity, for any small elementwise work (the scaler's checks, EMA,
//! bias corrections), as [`LaunchGroup`]s.
//!
//! *Does.* Walks the schedule and defers each *candidate*: a `fused` node
//! of kind elementwise with at most [`SMALL`] elements. A deferred node
//! gets a *level*: one more than the highest level among the deferred
//! nodes it reads, and, when it is marked to write `over` an input, among
//! the deferred nodes that read that input (they must run first, or the
//! write could not be in place). Any other node that reads a deferred
//! node (or writes over an input one reads) first *flushes* those and
//! every deferred node they must follow: level 0 in schedule order, then
//! level 1, and so on, each level of two or more nodes one launch group;
//! the other deferred nodes stay deferred. The end of the schedule
//! flushes the rest. A candidate that ends up alone gained nothing and
//! kept its operands alive: the walk is redone with only the grouped
//! candidates, until none is alone (at most [`ROUNDS`] walks). AdamW's
//! updates of every small parameter (each one node with three outputs
//! after `multi-output`; its moments and its parameter as separate nodes
//! without it, then two groups) are then one group.
//! An `extra` output of a deferred node is deferred with it and emitted
//! right after its level (it launches nothing; its node writes it), and a
//! node that reads the extra follows that node.
//! Notes the groups, their members and the launches they save.
//!
//! *Does not.* Change the graph, move a node earlier or past a reader of
//! its value, or group nodes of different streams (it runs before the
//! streams pass, which keeps a group on one stream).
//!
//! *Preserves.* Every node and edge; the order of every node that is no
//! candidate (collectives keep their order).
//!
//! *Invalidates.* The stream and memory tables (they are per schedule).
//!
//! *Cost.* Deferring a node keeps its operands alive until the flush: the
//! optimizer's gradients of small parameters live until the last of them
//! is computed, as PyTorch's do. [`SMALL`] keeps large updates (whose
//! launch is a small share of their time) out of it.
//!
//! *Assumes.* A verified graph. O(n + e) plus the sort of each flush.

use super::{Changed, Pass, PassCtx};
use crate::ir::{FusedKind, Graph, LaunchGroup, NodeId, Op, Phase};
use crate::Result;
use std::collections::{HashMap, HashSet};

/// Elements up to which an elementwise node is worth grouping: below
/// about a million, a GPU kernel's launch and tail cost a large share of
/// its time (an H100 streams the 4 MiB of a million f32s in about 2 µs,
/// about what a launch costs).
pub const SMALL: usize = 1 << 20;

/// Groups small independent elementwise nodes (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Horizontal;

impl Pass for Horizontal {
    fn name(&self) -> &'static str {
        "horizontal"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let order = graph.schedule_or_topo();
        let (order, groups) = plan_groups(graph, &order);
        let members: usize = groups.iter().map(|g| g.members.len()).sum();
        cx.note(format!(
            "{} group(s) of {members} node(s): {} launch(es) fewer",
            groups.len(),
            members - groups.len()
        ));
        cx.stats.rewrites = groups.len();
        tracing::debug!(groups = groups.len(), members, "horizontal");
        let tables = graph.tables_mut();
        let changed = tables.schedule.as_ref() != Some(&order) || tables.groups != groups;
        tables.schedule = Some(order);
        tables.groups = groups;
        tables.streams = None;
        tables.memory = None;
        Ok(changed.into())
    }

    fn reaches(&self) -> Phase {
        Phase::Scheduled
    }
}

/// True for a node this pass defers: small fused elementwise work.
fn candidate(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    // A padded body writes past its loop (`ir::Padded`): a kernel of its own.
    matches!(&node.op, Op::Fused(b) if *b.kind() == FusedKind::Elementwise && b.padded().is_none())
        && node.shape.numel() <= SMALL
}

/// The inputs a node writes over: a fused node's `over` operands (one per
/// output at most), a `write_at`'s target.
fn over_targets(graph: &Graph, id: NodeId) -> Vec<NodeId> {
    let slots: Vec<usize> = match &graph.node(id).op {
        Op::Fused(b) => (0..b.outputs().len()).filter_map(|j| b.output_over(j)).collect(),
        Op::WriteAt { .. } => vec![0],
        _ => return Vec::new(),
    };
    slots.into_iter().filter_map(|k| graph.operands(id).get(k).copied()).collect()
}

/// The storage a node's operand reads: views followed to their root.
fn root(graph: &Graph, mut id: NodeId) -> NodeId {
    while graph.node(id).op.is_view() {
        match graph.operands(id).first() {
            Some(&o) => id = o,
            None => break,
        }
    }
    id
}

/// The deferred nodes: each one's level and the deferred nodes it must
/// follow, in schedule order.
#[derive(Default)]
struct Pending {
    nodes: Vec<NodeId>,
    level: HashMap<NodeId, usize>,
    after: HashMap<NodeId, Vec<NodeId>>,
    /// The storage roots each deferred node reads.
    roots_read: HashMap<NodeId, Vec<NodeId>>,
    /// The `extra` nodes of each deferred node, emitted after its level.
    extras: HashMap<NodeId, Vec<NodeId>>,
    /// The deferred node of each deferred `extra`.
    extra_of: HashMap<NodeId, NodeId>,
}

impl Pending {
    /// The deferred nodes that read storage root `x`.
    fn readers_of(&self, x: NodeId) -> Vec<NodeId> {
        self.nodes.iter().copied().filter(|p| self.roots_read[p].contains(&x)).collect()
    }

    /// Emits `needed` and every deferred node they must follow, level by
    /// level, into `out`, each level of two or more a group; the others
    /// stay deferred.
    fn flush(&mut self, needed: &[NodeId], out: &mut Vec<NodeId>, groups: &mut Vec<LaunchGroup>) {
        let mut take: HashSet<NodeId> = HashSet::new();
        let mut stack: Vec<NodeId> = needed.to_vec();
        while let Some(n) = stack.pop() {
            if self.level.contains_key(&n) && take.insert(n) {
                stack.extend(&self.after[&n]);
            }
        }
        let mut taken: Vec<(usize, NodeId)> =
            self.nodes.iter().filter(|n| take.contains(n)).map(|&n| (self.level[&n], n)).collect();
        taken.sort_by_key(|&(l, _)| l); // stable: schedule order within a level
        for level in taken.chunk_by(|a, b| a.0 == b.0) {
            let members: Vec<NodeId> = level.iter().map(|&(_, n)| n).collect();
            out.extend(&members);
            for m in &members {
                for e in self.extras.remove(m).unwrap_or_default() {
                    self.extra_of.remove(&e);
                    out.push(e);
                }
            }
            if members.len() >= 2 {
                groups.push(LaunchGroup { members });
            }
        }
        self.nodes.retain(|n| !take.contains(n));
        for n in &take {
            self.level.remove(n);
            self.after.remove(n);
            self.roots_read.remove(n);
        }
    }
}

/// Rounds of [`plan_groups`] at most: each drops the candidates that
/// ended up alone. Two settle every graph we have seen; a round that does
/// not settle still leaves a valid schedule.
const ROUNDS: usize = 4;

/// The new schedule and its groups (see the module docs): deferral with
/// the candidates that the previous round grouped, until no candidate
/// ends up alone (a node deferred for nothing only keeps its operands
/// alive: a relu mask would keep the activation it reads).
fn plan_groups(graph: &Graph, order: &[NodeId]) -> (Vec<NodeId>, Vec<LaunchGroup>) {
    let mut candidates: HashSet<NodeId> = order.iter().copied().filter(|&id| candidate(graph, id)).collect();
    let mut planned = defer(graph, order, &candidates);
    for _ in 1..ROUNDS {
        let grouped: HashSet<NodeId> = planned.1.iter().flat_map(|g| g.members.iter().copied()).collect();
        if grouped == candidates {
            break;
        }
        candidates = grouped;
        planned = defer(graph, order, &candidates);
    }
    planned
}

/// One round: `order` with `candidates` deferred and flushed in groups.
fn defer(graph: &Graph, order: &[NodeId], candidates: &HashSet<NodeId>) -> (Vec<NodeId>, Vec<LaunchGroup>) {
    let mut out: Vec<NodeId> = Vec::with_capacity(order.len());
    let mut groups: Vec<LaunchGroup> = Vec::new();
    let mut pending = Pending::default();
    for &id in order {
        if let (Op::Extra { .. }, Some(&f)) = (&graph.node(id).op, graph.operands(id).first()) {
            if pending.level.contains_key(&f) {
                pending.extras.entry(f).or_default().push(id);
                pending.extra_of.insert(id, f);
                continue;
            }
        }
        // A deferred extra is read when its node is.
        let reads: Vec<NodeId> =
            graph.operands(id).into_iter().map(|o| pending.extra_of.get(&o).copied().unwrap_or(o)).collect();
        let mut after: Vec<NodeId> =
            reads.iter().copied().filter(|o| pending.level.contains_key(o)).collect();
        for x in over_targets(graph, id) {
            after.extend(pending.readers_of(root(graph, x)));
        }
        after.sort();
        after.dedup();
        if candidates.contains(&id) {
            let level = after.iter().map(|p| pending.level[p] + 1).max().unwrap_or(0);
            pending.level.insert(id, level);
            pending.roots_read.insert(id, reads.iter().map(|&o| root(graph, o)).collect());
            pending.after.insert(id, after);
            pending.nodes.push(id);
            continue;
        }
        if !after.is_empty() {
            pending.flush(&after, &mut out, &mut groups);
        }
        out.push(id);
    }
    let rest = pending.nodes.clone();
    pending.flush(&rest, &mut out, &mut groups);
    (out, groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::{parse, print};
    use crate::passes::{PassCtx, Schedule};

    fn grouped(src: &str) -> Graph {
        let mut g = parse(src).unwrap();
        let mut cx = PassCtx::default();
        Schedule.run(&mut g, &mut cx).unwrap();
        Horizontal.run(&mut g, &mut cx).unwrap();
        crate::ir::verify(&g).unwrap();
        g
    }

    /// A chain of candidates is one level each: no group, and the
    /// order stays operands first.
    #[test]
    fn a_chain_is_one_level_per_node() {
        let body = |op: &str| {
            format!("kind=elementwise {{\n    %0: f32[4] = input 0\n    %1: f32[4] = {op} %0\n    return %1\n}}\n")
        };
        let src = format!(
            "%x: f32[4] = input 0\n%a: f32[4] = fused %x {}%b: f32[4] = fused %a {}%c: f32[4] = fused %b {}return %c\n",
            body("exp"),
            body("neg"),
            body("abs")
        );
        let g = grouped(&src);
        assert!(g.tables().groups.is_empty(), "{}", print(&g));
        let order = g.tables().schedule.clone().unwrap();
        assert_eq!(order, g.topo_order(), "{}", print(&g));
    }
}
