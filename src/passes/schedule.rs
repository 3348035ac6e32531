//! Schedule: an execution order that keeps the peak of live bytes low.
//!
//! *Does.* Stores in the graph's schedule table a topological order of the
//! nodes the outputs need, built by greedy list scheduling: among the
//! ready nodes (every operand scheduled) it takes the one with the best
//! *bytes freed − bytes allocated*, ties broken by the node's position in
//! [`Graph::topo_order`] (so a graph with nothing to gain keeps its
//! structural order, and the result never depends on node ids or hashing).
//! A ready node that allocates, frees nothing, is the last missing
//! operand of no reader and leaves no root with one reader to go (which
//! could then free it) is *deferred*: taken only when no other node is
//! ready. Without that rule the greedy choice took GPT-2 small's twelve
//! f32 masked score matrices of the backward (101 MB each, computable
//! from forward values) before the LM head's 823 MB logits, because each
//! allocated less, and kept them through the LM head: 1.2 GB of its peak.
//! A node allocates its value's bytes unless it is a view, an `input` or a
//! `full` constant; it frees the bytes of each storage root (the value a
//! view chain starts from) whose last reader it is, readers of views of
//! the root included, unless that root is what a graph output reads. Notes
//! the simulated peak of the new order and of the topological order.
//! A collective (`crate::dist`) is taken as soon as it is ready, whatever
//! its score: it runs on a stream of its own, so issuing it early is what
//! lets it overlap the compute still to come (the rest of a backward
//! pass); its bytes are a gradient's, small next to what overlap saves.
//! Collectives keep their recorded order (`seq`): each waits for the one
//! before it as for an operand, so every rank issues them in one order
//! whatever its constants did to the rest of its graph.
//! A node that reads a collective's result (directly or through views)
//! and leads to no other collective is taken only when no other node is
//! ready: its stream would wait there for the collective to finish, where
//! the compute still to come could run meanwhile. Data parallelism's
//! optimizer update of a bucket took the free bytes of its averaged
//! gradient as soon as the all-reduce was issued: on two H200s every
//! bucket of GPT-2 small stalled the backward for its all-reduce, 13 times
//! a step (the per-stream timeline of `benches/gpu_ddp_gpt.rs --profile`).
//! A reader that leads to another collective (ZeRO's shard update before
//! its all-gather) is not held back, so that collective is not either.
//! A fused update marked to write over an input (`over`, see the assign
//! pass) waits for every other reader of that input (views included) as
//! for an operand, unless such a reader needs the update's own result:
//! the memory pass can then write it in place (a parameter update after
//! the backward matmul that still reads the old weights). So does a
//! fused node with an extra output marked `over` an input. An `extra`
//! node is taken as soon as its fused node is: it runs nothing, and its
//! bytes are written by that node.
//!
//! *Does not.* Look ahead (a node that allocates now to free more later
//! loses to one that allocates less), change the graph, or pick streams or
//! offsets (the streams and memory passes do).
//!
//! *Preserves.* Every node, edge and value: only the side table changes.
//!
//! *Invalidates.* The stream and memory tables and the launch groups
//! (they are per schedule).
//!
//! *Assumes.* A verified graph. Runs in O((n + e) log n): a heap of ready
//! nodes whose scores are updated lazily (a node's score only changes when
//! it becomes the last reader of a root, which happens once per root).

use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, NodeId, Op, Phase};
use crate::Result;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Orders the graph for a low memory peak (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Schedule;

impl Pass for Schedule {
    fn name(&self) -> &'static str {
        "schedule"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let dag = Dag::of(graph);
        let order = dag.greedy();
        let (peak, topo_peak) = (dag.peak(&order), dag.peak(&(0..dag.len()).collect::<Vec<_>>()));
        cx.note(format!("peak {peak} B (topological order {topo_peak} B)"));
        tracing::debug!(peak, topo_peak, nodes = order.len(), "schedule");
        let order: Vec<NodeId> = order.into_iter().map(|i| dag.ids[i]).collect();
        let changed = graph.tables().schedule.as_ref() != Some(&order);
        let tables = graph.tables_mut();
        tables.schedule = Some(order);
        tables.streams = None;
        tables.memory = None;
        tables.groups.clear();
        Ok(changed.into())
    }

    fn reaches(&self) -> Phase {
        Phase::Scheduled
    }
}

/// Which nodes need node `i`'s result (`i` included), by dense index.
fn descendants(users: &[Vec<usize>], i: usize) -> Vec<bool> {
    let mut seen = vec![false; users.len()];
    let mut stack = vec![i];
    seen[i] = true;
    while let Some(j) = stack.pop() {
        for &u in &users[j] {
            if !seen[u] {
                seen[u] = true;
                stack.push(u);
            }
        }
    }
    seen
}

/// The needed nodes in topological order, as dense indices.
struct Dag {
    ids: Vec<NodeId>,
    /// Distinct operands.
    operands: Vec<Vec<usize>>,
    /// Distinct users among the needed nodes.
    users: Vec<Vec<usize>>,
    /// Bytes the node allocates.
    alloc: Vec<u64>,
    /// Distinct storage roots of the node's operands.
    roots_read: Vec<Vec<usize>>,
    /// Readers of each storage root (nodes reading it or a view of it).
    readers: Vec<Vec<usize>>,
    /// Whether a root's bytes are freed after its last reader (not an
    /// output's, not an input's or a constant's).
    freeable: Vec<bool>,
    /// Whether the node is a collective (issued as soon as it is ready).
    collective: Vec<bool>,
    /// Whether the node is an `extra` output (taken as soon as it is ready).
    extra: Vec<bool>,
    /// Whether the node reads a collective's result and leads to no other
    /// collective (taken only when nothing else is ready).
    after_collective: Vec<bool>,
    /// The collective recorded right after this one (which waits for it).
    next_collective: Vec<Option<usize>>,
    /// The updates marked `over` an input that wait for this reader of it.
    updates_after: Vec<Vec<usize>>,
}

impl Dag {
    fn of(graph: &Graph) -> Dag {
        let ids = graph.topo_order();
        let pos: HashMap<NodeId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let n = ids.len();
        let mut operands = Vec::with_capacity(n);
        let mut users = vec![Vec::new(); n];
        let mut alloc = vec![0u64; n];
        let mut root = vec![0usize; n];
        for (i, &id) in ids.iter().enumerate() {
            let node = graph.node(id);
            let mut ops: Vec<usize> = graph.operands(id).iter().map(|o| pos[o]).collect();
            ops.sort_unstable();
            ops.dedup();
            for &o in &ops {
                users[o].push(i);
            }
            root[i] = if node.op.is_view() { root[ops[0]] } else { i };
            let allocates =
                !node.op.is_view() && !matches!(node.op, Op::Input(_) | Op::Buffer(_) | Op::Full(_));
            if allocates {
                alloc[i] = node.shape.numel() as u64 * node.dtype.size() as u64;
            }
            operands.push(ops);
        }
        let mut freeable: Vec<bool> = alloc.iter().map(|&a| a > 0).collect();
        for out in graph.outputs() {
            if let Some(&i) = pos.get(out) {
                freeable[root[i]] = false;
            }
        }
        let mut readers = vec![Vec::new(); n];
        let mut roots_read = Vec::with_capacity(n);
        for (i, ops) in operands.iter().enumerate() {
            let mut rs: Vec<usize> = ops.iter().map(|&o| root[o]).collect();
            rs.sort_unstable();
            rs.dedup();
            for &r in &rs {
                readers[r].push(i);
            }
            roots_read.push(rs);
        }
        let collective: Vec<bool> = ids.iter().map(|&id| graph.node(id).op.is_collective()).collect();
        let extra: Vec<bool> = ids.iter().map(|&id| matches!(graph.node(id).op, Op::Extra { .. })).collect();
        let mut recorded: Vec<(u64, usize)> = ids
            .iter()
            .enumerate()
            .filter_map(|(i, &id)| graph.node(id).op.effect_seq().map(|s| (s, i)))
            .collect();
        recorded.sort_unstable();
        // Whether a node leads to a collective (itself excluded), in reverse
        // topological order.
        let mut leads = vec![false; n];
        for i in (0..n).rev() {
            leads[i] = users[i].iter().any(|&u| collective[u] || leads[u]);
        }
        let after_collective: Vec<bool> = (0..n)
            .map(|i| !collective[i] && !leads[i] && roots_read[i].iter().any(|&r| collective[r]))
            .collect();
        let mut next_collective = vec![None; n];
        for pair in recorded.windows(2) {
            next_collective[pair[0].1] = Some(pair[1].1);
        }
        let mut updates_after = vec![Vec::new(); n];
        for (i, &id) in ids.iter().enumerate() {
            let Op::Fused(body) = &graph.node(id).op else { continue };
            let overs = (0..body.outputs().len()).filter_map(|j| body.output_over(j));
            let targets: Vec<usize> =
                overs.filter_map(|k| graph.operands(id).get(k).and_then(|x| pos.get(x)).copied()).collect();
            if targets.is_empty() {
                continue;
            }
            let after_i = descendants(&users, i);
            for x in targets {
                for &u in &readers[root[x]] {
                    if u != i && !after_i[u] && !updates_after[u].contains(&i) {
                        updates_after[u].push(i);
                    }
                }
            }
        }
        Dag {
            ids,
            operands,
            users,
            alloc,
            roots_read,
            readers,
            freeable,
            collective,
            extra,
            after_collective,
            next_collective,
            updates_after,
        }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Greedy list scheduling (see the module docs).
    fn greedy(&self) -> Vec<usize> {
        let n = self.len();
        let mut waiting: Vec<usize> = self.operands.iter().map(Vec::len).collect();
        for &next in self.next_collective.iter().flatten().chain(self.updates_after.iter().flatten()) {
            waiting[next] += 1;
        }
        let mut pending: Vec<usize> = self.readers.iter().map(Vec::len).collect();
        let mut done = vec![false; n];
        let mut score = vec![(false, false, 0i64); n];
        let mut heap: BinaryHeap<((bool, bool, i64), Reverse<usize>)> = BinaryHeap::new();
        // (not held behind a collective, taken now rather than deferred,
        // bytes freed − allocated); see the module docs.
        let score_of = |i: usize, pending: &[usize], waiting: &[usize]| -> (bool, bool, i64) {
            if self.collective[i] || self.extra[i] {
                return (true, true, i64::MAX);
            }
            let freed: u64 = self.roots_read[i]
                .iter()
                .filter(|&&r| self.freeable[r] && pending[r] == 1)
                .map(|&r| self.alloc[r])
                .sum();
            let completes = self.users[i].iter().any(|&u| waiting[u] == 1);
            // Leaves one reader of a root, which can then free it.
            let progresses = self.roots_read[i].iter().any(|&r| self.freeable[r] && pending[r] == 2);
            let now = freed > 0 || self.alloc[i] == 0 || completes || progresses || self.users[i].is_empty();
            (!self.after_collective[i], now, freed as i64 - self.alloc[i] as i64)
        };
        for i in 0..n {
            if waiting[i] == 0 {
                score[i] = score_of(i, &pending, &waiting);
                heap.push((score[i], Reverse(i)));
            }
        }
        let mut order = Vec::with_capacity(n);
        while let Some((s, Reverse(i))) = heap.pop() {
            if done[i] || s != score[i] {
                continue; // a stale entry
            }
            done[i] = true;
            order.push(i);
            for &r in &self.roots_read[i] {
                pending[r] -= 1;
                if pending[r] == 2 && self.freeable[r] {
                    // The two readers left now progress r: no longer deferred.
                    for &u in &self.readers[r] {
                        if !done[u] && waiting[u] == 0 {
                            let now = score_of(u, &pending, &waiting);
                            if now != score[u] {
                                score[u] = now;
                                heap.push((now, Reverse(u)));
                            }
                        }
                    }
                }
                if pending[r] == 1 && self.freeable[r] {
                    // The one reader left now frees r: rescore it if ready.
                    if let Some(&u) = self.readers[r].iter().find(|&&u| !done[u]) {
                        if waiting[u] == 0 {
                            score[u] = score_of(u, &pending, &waiting);
                            heap.push((score[u], Reverse(u)));
                        }
                    }
                }
            }
            for &u in self.users[i].iter().chain(&self.next_collective[i]).chain(&self.updates_after[i]) {
                waiting[u] -= 1;
                if waiting[u] == 0 {
                    score[u] = score_of(u, &pending, &waiting);
                    heap.push((score[u], Reverse(u)));
                } else if waiting[u] == 1 {
                    // u now waits for one node: if that is a ready operand,
                    // it completes a reader and is no longer deferred.
                    if let Some(&o) = self.operands[u].iter().find(|&&o| !done[o] && waiting[o] == 0) {
                        let now = score_of(o, &pending, &waiting);
                        if now != score[o] {
                            score[o] = now;
                            heap.push((now, Reverse(o)));
                        }
                    }
                }
            }
        }
        order
    }

    /// The most bytes live at once when running `order` (a value is live
    /// from its node to its root's last reader; outputs to the end).
    fn peak(&self, order: &[usize]) -> u64 {
        let mut pending: Vec<usize> = self.readers.iter().map(Vec::len).collect();
        let (mut live, mut peak) = (0u64, 0u64);
        for &i in order {
            live += self.alloc[i];
            peak = peak.max(live);
            if self.readers[i].is_empty() && self.freeable[i] {
                live -= self.alloc[i]; // read by nothing (a collective run for the others)
            }
            for &r in &self.roots_read[i] {
                pending[r] -= 1;
                if pending[r] == 0 && self.freeable[r] {
                    live -= self.alloc[r];
                }
            }
        }
        peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    #[test]
    fn every_needed_node_once_operands_first() {
        let src = "%x: f32[8] = input 0\n%a: f32[8] = exp %x\n%b: f32[8] = log %x\n\
                   %c: f32[8] = add %a, %b\n%dead: f32[8] = neg %x\nreturn %c, %a\n";
        let mut g = parse(src).unwrap();
        Schedule.run(&mut g, &mut PassCtx::default()).unwrap();
        let schedule = g.tables().schedule.clone().unwrap();
        assert_eq!(schedule.len(), 4);
        crate::ir::verify(&g).unwrap();
    }

    #[test]
    fn empty_graph() {
        let mut g = Graph::new();
        Schedule.run(&mut g, &mut PassCtx::default()).unwrap();
        assert_eq!(g.tables().schedule, Some(vec![]));
    }
}
