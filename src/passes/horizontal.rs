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
//! *Column sums.* The same deferral groups *column reductions* (a sum,
//! mean, max or min over a value's leading dims that keeps its trailing
//! ones: a bias's or a layer norm's parameter gradient), of any size,
//! into groups of their own (never mixed with elementwise members). Each
//! is a few microseconds of latency over a few MB: GPT-2 small's bf16 step
//! has 99, 7-10 µs each on an H200 where their bytes take 2-5, and a layer
//! norm's backward is followed by three or four of them (`dγ`, `dβ`, the
//! bias gradient of the projection before it). One launch for the lot
//! overlaps their latencies. A deferred column reduction keeps its operand
//! (a gradient of the activations' size) alive, so it waits for at most
//! [`COLUMN_WINDOW`] launching nodes that are no candidates; the next one
//! flushes every deferred column reduction first. A small candidate that
//! reads a deferred column reduction (a bias's optimizer update reads its
//! gradient, and the schedule puts it right after) does not flush it: the
//! reduction is emitted when the small node is, or earlier.
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
//! launch is a small share of their time) out of it. A column reduction's
//! operand lives at most [`COLUMN_WINDOW`] launches longer.
//!
//! *Assumes.* A verified graph. O(n + e) plus the sort of each flush.

use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, GroupKind, LaunchGroup, NodeId, Op, Phase};
use crate::Result;
use std::collections::{HashMap, HashSet};

/// Elements up to which an elementwise node is worth grouping: below
/// about a million, a GPU kernel's launch and tail cost a large share of
/// its time (an H100 streams the 4 MiB of a million f32s in about 2 µs,
/// about what a launch costs).
pub const SMALL: usize = 1 << 20;

/// Launching nodes (other than candidates) a deferred column reduction
/// waits for at most. GPT-2's layer norm backward is followed by its
/// column sums within two: the input gradient's product and its views.
pub const COLUMN_WINDOW: usize = 2;

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

/// What a deferred node is grouped with: groups are of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Small fused elementwise work.
    Small,
    /// A column reduction (see the module docs).
    Column,
}

/// The class of a node this pass defers, `None` for any other.
fn candidate(graph: &Graph, id: NodeId) -> Option<Class> {
    let node = graph.node(id);
    match GroupKind::of(graph, id)? {
        // A padded body writes past its loop (`ir::Padded`): a kernel of its own.
        GroupKind::Elementwise => {
            let padded = matches!(&node.op, Op::Fused(b) if b.padded().is_some());
            (!padded && node.shape.numel() <= SMALL).then_some(Class::Small)
        }
        GroupKind::Columns => Some(Class::Column),
    }
}

/// True for a node a backend runs as a launch of its own: not a view, a
/// source or an `extra` (which its node writes).
fn launches(graph: &Graph, id: NodeId) -> bool {
    let op = &graph.node(id).op;
    !op.is_view() && !op.is_source() && !matches!(op, Op::Extra { .. })
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
    /// Defers `id`, which must follow the deferred nodes `after` and
    /// reads the storage roots `roots`.
    fn defer(&mut self, id: NodeId, after: Vec<NodeId>, roots: Vec<NodeId>) {
        let level = after.iter().map(|p| self.level[p] + 1).max().unwrap_or(0);
        self.level.insert(id, level);
        self.roots_read.insert(id, roots);
        self.after.insert(id, after);
        self.nodes.push(id);
    }

    /// `needed` and every deferred node they must follow.
    fn closure(&self, needed: &[NodeId]) -> HashSet<NodeId> {
        let mut take: HashSet<NodeId> = HashSet::new();
        let mut stack: Vec<NodeId> = needed.to_vec();
        while let Some(n) = stack.pop() {
            if self.level.contains_key(&n) && take.insert(n) {
                stack.extend(&self.after[&n]);
            }
        }
        take
    }

    /// The deferred nodes that read storage root `x`.
    fn readers_of(&self, x: NodeId) -> Vec<NodeId> {
        self.nodes.iter().copied().filter(|p| self.roots_read[p].contains(&x)).collect()
    }

    /// Emits `needed` and every deferred node they must follow, level by
    /// level, into `out`, each level of two or more a group; the others
    /// stay deferred.
    fn flush(&mut self, needed: &[NodeId], out: &mut Vec<NodeId>, groups: &mut Vec<LaunchGroup>) {
        let take = self.closure(needed);
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

/// Flushes `needed` of the small nodes, after the deferred column
/// reductions that they (and the small nodes they follow) read.
fn flush_small(
    small: &mut Pending,
    columns: &mut Pending,
    needs: &HashMap<NodeId, Vec<NodeId>>,
    needed: &[NodeId],
    out: &mut Vec<NodeId>,
    groups: &mut Vec<LaunchGroup>,
) {
    let mut read: Vec<NodeId> = small
        .closure(needed)
        .iter()
        .flat_map(|n| needs.get(n).into_iter().flatten().copied())
        .filter(|c| columns.level.contains_key(c))
        .collect();
    read.sort();
    read.dedup();
    if !read.is_empty() {
        columns.flush(&read, out, groups);
    }
    small.flush(needed, out, groups);
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
    let mut candidates: HashMap<NodeId, Class> =
        order.iter().filter_map(|&id| Some((id, candidate(graph, id)?))).collect();
    let mut planned = defer(graph, order, &candidates);
    for _ in 1..ROUNDS {
        let grouped: HashSet<NodeId> = planned.1.iter().flat_map(|g| g.members.iter().copied()).collect();
        if grouped.len() == candidates.len() {
            break;
        }
        candidates.retain(|id, _| grouped.contains(id));
        planned = defer(graph, order, &candidates);
    }
    planned
}

/// One round: `order` with `candidates` deferred (one [`Pending`] a
/// class) and flushed in groups.
fn defer(
    graph: &Graph,
    order: &[NodeId],
    candidates: &HashMap<NodeId, Class>,
) -> (Vec<NodeId>, Vec<LaunchGroup>) {
    let mut out: Vec<NodeId> = Vec::with_capacity(order.len());
    let mut groups: Vec<LaunchGroup> = Vec::new();
    let mut small = Pending::default();
    let mut columns = Pending::default();
    // Launching non-candidates seen since the first deferred column reduction.
    let mut waited = 0;
    // The deferred column reductions each deferred small node reads.
    let mut needs: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for &id in order {
        if let (Op::Extra { .. }, Some(&f)) = (&graph.node(id).op, graph.operands(id).first()) {
            if small.level.contains_key(&f) {
                small.extras.entry(f).or_default().push(id);
                small.extra_of.insert(id, f);
                continue;
            }
        }
        // A deferred extra is read when its node is.
        let reads: Vec<NodeId> =
            graph.operands(id).into_iter().map(|o| small.extra_of.get(&o).copied().unwrap_or(o)).collect();
        let class = candidates.get(&id).copied();
        let overs: Vec<NodeId> = over_targets(graph, id).into_iter().map(|x| root(graph, x)).collect();
        let mut after = [Vec::new(), Vec::new()];
        for (pending, after) in [&small, &columns].into_iter().zip(&mut after) {
            after.extend(reads.iter().copied().filter(|o| pending.level.contains_key(o)));
            for &x in &overs {
                after.extend(pending.readers_of(x));
            }
            after.sort();
            after.dedup();
        }
        let [after_small, after_columns] = after;
        // What the node must follow in the other class is emitted now,
        // but for the column reductions a small node reads (an optimizer's
        // update of a bias reads its gradient): they are emitted when it
        // is, so that they still group.
        if class != Some(Class::Small) && !after_small.is_empty() {
            flush_small(&mut small, &mut columns, &needs, &after_small, &mut out, &mut groups);
        }
        if class.is_none() && !after_columns.is_empty() {
            columns.flush(&after_columns, &mut out, &mut groups);
        }
        match class {
            Some(Class::Small) => {
                small.defer(id, after_small, reads.iter().map(|&o| root(graph, o)).collect());
                needs.insert(id, after_columns);
            }
            Some(Class::Column) => {
                columns.defer(id, after_columns, reads.iter().map(|&o| root(graph, o)).collect())
            }
            None => {
                if launches(graph, id) && !columns.nodes.is_empty() {
                    waited += 1;
                    if waited > COLUMN_WINDOW {
                        let rest = columns.nodes.clone();
                        columns.flush(&rest, &mut out, &mut groups);
                    }
                }
                out.push(id);
            }
        }
        if columns.nodes.is_empty() {
            waited = 0;
        }
    }
    let rest = columns.nodes.clone();
    columns.flush(&rest, &mut out, &mut groups);
    let rest = small.nodes.clone();
    flush_small(&mut small, &mut columns, &needs, &rest, &mut out, &mut groups);
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
