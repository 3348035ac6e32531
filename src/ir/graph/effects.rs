//! Effects in a graph: the nodes a run must execute whether or not an
//! output reads them (today the collectives, see
//! [`Op::is_effect`](crate::ir::Op::is_effect)), in the order they were
//! recorded.

use super::{Graph, NodeId};
use std::collections::HashMap;

impl Graph {
    /// What a run must compute: the outputs, then every effect
    /// ([`Graph::effects`]) in recorded order. An effect is a root whether
    /// or not anything reads it: a collective whose value a rank's
    /// constants made unused still runs, since every other rank runs it.
    pub fn roots(&self) -> Vec<NodeId> {
        let mut roots = self.outputs.clone();
        roots.extend(self.effects());
        roots
    }

    /// Every effect node ([`Op::is_effect`](crate::ir::Op::is_effect):
    /// the collectives) in recorded order: by sequence number, then id.
    /// A valid graph has no two effects of one sequence number
    /// ([`crate::ir::verify`]).
    pub fn effects(&self) -> Vec<NodeId> {
        let mut effects: Vec<(u64, NodeId)> = self
            .g
            .node_indices()
            .filter_map(|ix| self.g[ix].op.effect_seq().map(|seq| (seq, NodeId::from_ix(ix))))
            .collect();
        effects.sort_unstable();
        effects.into_iter().map(|(_, id)| id).collect()
    }

    /// The sequence number for the next effect recorded into this graph:
    /// above that of every effect added so far, so recording order is
    /// sequence order (what a context and autodiff number collectives by).
    pub fn next_effect_seq(&self) -> u64 {
        self.next_effect
    }

    /// `order` (a topological order) changed as little as possible so the
    /// effects come in recorded order: each node as early as in `order`,
    /// but an effect never before the one recorded before it. Unchanged
    /// with fewer than two effects.
    pub fn effect_ordered(&self, order: Vec<NodeId>) -> Vec<NodeId> {
        let effects = self.effects();
        if effects.len() < 2 {
            return order;
        }
        let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let n = order.len();
        let mut waiting = vec![0usize; n];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, &id) in order.iter().enumerate() {
            let mut ops: Vec<usize> = self.operands(id).iter().filter_map(|o| pos.get(o).copied()).collect();
            ops.sort_unstable();
            ops.dedup();
            waiting[i] = ops.len();
            for o in ops {
                users[o].push(i);
            }
        }
        let chain: Vec<usize> = effects.iter().filter_map(|e| pos.get(e).copied()).collect();
        for pair in chain.windows(2) {
            users[pair[0]].push(pair[1]);
            waiting[pair[1]] += 1;
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
            (0..n).filter(|&i| waiting[i] == 0).map(std::cmp::Reverse).collect();
        let mut out = Vec::with_capacity(n);
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            out.push(order[i]);
            for &u in &users[i] {
                waiting[u] -= 1;
                if waiting[u] == 0 {
                    ready.push(std::cmp::Reverse(u));
                }
            }
        }
        out
    }
}
