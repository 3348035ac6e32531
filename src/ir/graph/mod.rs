//! The graph: nodes with ordered operands, regions, outputs and a phase.

mod effects;
mod region;

pub use region::{Region, RegionAutocast, RegionId};

use super::{infer, DType, Op, PlanTables, Shape};
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;
use std::collections::HashMap;
use std::fmt;

/// From this many nodes on, batch edits rebuild the edge lists (see
/// [`Graph::remove_many`]).
const REBUILD_EDGES_AT: usize = 1024;

/// Identifies a node in one [`Graph`]. Ids are stable while other nodes
/// are added and removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

impl NodeId {
    /// The raw index (dense only right after printing or extraction).
    pub fn index(self) -> usize {
        self.0 as usize
    }
    fn ix(self) -> NodeIndex<u32> {
        NodeIndex::new(self.0 as usize)
    }
    fn from_ix(ix: NodeIndex<u32>) -> NodeId {
        NodeId(ix.index() as u32)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// How far through the pipeline a graph has come. It only moves forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// As recorded by the user API or parsed from text.
    Recorded,
    /// After the canonicalizing passes (view folding, constant folding,
    /// CSE, simplify, DCE).
    Canonical,
    /// After fusion: elementwise work sits in `fused` nodes.
    Fused,
    /// With a schedule (an execution order).
    Scheduled,
    /// With stream and memory plans: ready for a backend.
    Planned,
}

/// A set of nodes of one graph ([`Graph::reachable_from`]).
#[derive(Clone, Debug)]
pub struct NodeSet {
    bits: Vec<bool>,
}

impl NodeSet {
    /// True if `id` is in the set.
    pub fn contains(&self, id: &NodeId) -> bool {
        self.bits.get(id.index()).copied().unwrap_or(false)
    }
}

/// One node: what it computes and the type of its result.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// Shape of the result.
    pub shape: Shape,
    /// Dtype of the result.
    pub dtype: DType,
    /// The region the node belongs to.
    pub region: RegionId,
}

/// A dataflow graph of tensor operations. Edges run from operand to user
/// and carry the operand slot, so operand order is explicit.
#[derive(Clone, Debug)]
pub struct Graph {
    g: StableGraph<Node, u32, petgraph::Directed, u32>,
    regions: Vec<Region>,
    outputs: Vec<NodeId>,
    phase: Phase,
    /// Derived facts (schedule, streams, memory); cleared on every edit.
    tables: PlanTables,
    /// A sequence number above every effect's ever added
    /// ([`Graph::next_effect_seq`]).
    next_effect: u64,
}

impl Default for Graph {
    fn default() -> Self {
        Graph::new()
    }
}

impl Graph {
    /// An empty graph with only the root region.
    pub fn new() -> Graph {
        Graph {
            g: StableGraph::default(),
            regions: vec![Region { name: String::new(), parent: None, autocast: RegionAutocast::Inherit }],
            outputs: Vec::new(),
            phase: Phase::Recorded,
            tables: PlanTables::default(),
            next_effect: 0,
        }
    }

    /// Adds a node after checking its operands and inferring its type.
    /// Source ops take `declared` (shape and dtype), every other op ignores
    /// it. The error is a message without location; callers add theirs.
    pub fn add(
        &mut self,
        op: Op,
        operands: &[NodeId],
        declared: Option<(Shape, DType)>,
        region: RegionId,
    ) -> Result<NodeId, String> {
        for &o in operands {
            if !self.contains(o) {
                return Err(format!("operand {o} does not exist"));
            }
        }
        let types: Vec<(&Shape, DType)> =
            operands.iter().map(|&o| (&self.node(o).shape, self.node(o).dtype)).collect();
        let (shape, dtype) = match infer(&op, &types)? {
            Some(t) => t,
            None => declared.ok_or_else(|| format!("{} needs a declared shape and dtype", op.mnemonic()))?,
        };
        shape.check_addressable(dtype.size(), &dtype.to_string())?;
        Ok(self.add_unchecked(Node { op, shape, dtype, region }, operands))
    }

    /// Adds a node as given, without checks (the parser and passes use this
    /// and rely on [`super::verify`]).
    pub fn add_unchecked(&mut self, node: Node, operands: &[NodeId]) -> NodeId {
        self.invalidate();
        if let Some(seq) = node.op.effect_seq() {
            self.next_effect = self.next_effect.max(seq.saturating_add(1));
        }
        let id = NodeId::from_ix(self.g.add_node(node));
        for (slot, &o) in operands.iter().enumerate() {
            self.g.add_edge(o.ix(), id.ix(), slot as u32);
        }
        id
    }

    /// An empty graph with this graph's region tree and phase; extraction
    /// and compaction build into one so region ids stay valid.
    pub fn empty_like(&self) -> Graph {
        Graph {
            g: StableGraph::default(),
            regions: self.regions.clone(),
            outputs: Vec::new(),
            phase: self.phase,
            tables: PlanTables::default(),
            next_effect: 0,
        }
    }

    /// True if the id names a live node.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id.ix())
    }

    /// The node. Panics on a removed id, which is a kiln bug, never user input.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id.ix()]
    }

    /// The node, mutably (changing the type is on the caller).
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.invalidate();
        &mut self.g[id.ix()]
    }

    /// The operands in slot order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut ins: Vec<(u32, NodeId)> = self
            .g
            .edges_directed(id.ix(), Direction::Incoming)
            .map(|e| (*e.weight(), NodeId::from_ix(e.source())))
            .collect();
        ins.sort_unstable();
        ins.into_iter().map(|(_, n)| n).collect()
    }

    /// Appends the operands of `id`, in slot order, to `out` (what
    /// [`Graph::operands`] returns, without allocating: a read walks every
    /// node of its subgraph with one reused vector).
    pub fn operands_into(&self, id: NodeId, out: &mut Vec<NodeId>) {
        let start = out.len();
        // Slots of the first few operands, to sort without allocating.
        let mut slots = [0u32; 8];
        for (i, e) in self.g.edges_directed(id.ix(), Direction::Incoming).enumerate() {
            out.push(NodeId::from_ix(e.source()));
            if let Some(s) = slots.get_mut(i) {
                *s = *e.weight();
            }
        }
        let ops = &mut out[start..];
        if ops.len() > slots.len() {
            let sorted = self.operands(id);
            ops.copy_from_slice(&sorted);
            return;
        }
        // petgraph lists incoming edges newest first: insertion-sort by slot.
        for i in 1..ops.len() {
            let mut j = i;
            while j > 0 && slots[j - 1] > slots[j] {
                slots.swap(j - 1, j);
                ops.swap(j - 1, j);
                j -= 1;
            }
        }
    }

    /// One more than the largest node index in use: ids index arrays of
    /// this length (a walk's marks).
    pub fn node_bound(&self) -> usize {
        petgraph::visit::NodeIndexable::node_bound(&self.g)
    }

    /// The distinct users of a node, sorted by id.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let mut outs: Vec<NodeId> =
            self.g.neighbors_directed(id.ix(), Direction::Outgoing).map(NodeId::from_ix).collect();
        outs.sort_unstable();
        outs.dedup();
        outs
    }

    /// Replaces the operands of `id` (keeps the op; re-verify afterwards).
    pub fn set_operands(&mut self, id: NodeId, operands: &[NodeId]) {
        self.invalidate();
        let old: Vec<_> = self.g.edges_directed(id.ix(), Direction::Incoming).map(|e| e.id()).collect();
        for e in old {
            self.g.remove_edge(e);
        }
        for (slot, &o) in operands.iter().enumerate() {
            self.g.add_edge(o.ix(), id.ix(), slot as u32);
        }
    }

    /// Makes every user of `old` (and the outputs) use `new` instead.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) {
        if old == new {
            return;
        }
        self.invalidate();
        let uses: Vec<_> = self
            .g
            .edges_directed(old.ix(), Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (e, target, slot) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new.ix(), target, slot);
        }
        for o in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Removes a node and its edges.
    pub fn remove(&mut self, id: NodeId) {
        self.invalidate();
        self.g.remove_node(id.ix());
        self.outputs.retain(|&o| o != id);
    }

    /// Removes many nodes and their edges at once.
    ///
    /// petgraph's stable graph unlinks an edge by walking its endpoints'
    /// edge lists (newest edge first), so removing the 200,000 users of one
    /// shared node one at a time, oldest first, is quadratic. A large batch
    /// rebuilds the edge lists in one pass instead; a small one removes
    /// newest first, which unlinks near the heads of the lists.
    pub fn remove_many(&mut self, ids: &[NodeId]) {
        if ids.is_empty() {
            return;
        }
        self.invalidate();
        let gone = self.flags(ids);
        if ids.len() >= REBUILD_EDGES_AT {
            self.retain_edges(|source, target| !gone[source] && !gone[target]);
        }
        let mut newest_first = ids.to_vec();
        newest_first.sort_unstable_by_key(|id| std::cmp::Reverse(id.index()));
        for id in newest_first {
            self.g.remove_node(id.ix());
        }
        self.outputs.retain(|o| !gone[o.index()]);
    }

    /// [`Graph::set_operands`] to no operands for many nodes at once (they
    /// become sources), without the quadratic unlinking
    /// [`Graph::remove_many`] describes.
    pub fn clear_operands(&mut self, ids: &[NodeId]) {
        if ids.is_empty() {
            return;
        }
        self.invalidate();
        if ids.len() >= REBUILD_EDGES_AT {
            let cleared = self.flags(ids);
            self.retain_edges(|_, target| !cleared[target]);
        } else {
            for &id in ids.iter().rev() {
                self.set_operands(id, &[]);
            }
        }
    }

    /// One flag per node index, set for `ids`.
    fn flags(&self, ids: &[NodeId]) -> Vec<bool> {
        let mut flags = vec![false; self.node_bound()];
        for id in ids {
            flags[id.index()] = true;
        }
        flags
    }

    /// Keeps the edges `keep(source index, target index)` accepts, in one
    /// pass over all edges (the lists are rebuilt, edge weights kept).
    fn retain_edges(&mut self, keep: impl Fn(usize, usize) -> bool) {
        let kept: Vec<_> = self
            .g
            .edge_references()
            .filter(|e| keep(e.source().index(), e.target().index()))
            .map(|e| (e.source(), e.target(), *e.weight()))
            .collect();
        self.g.clear_edges();
        for (source, target, slot) in kept {
            self.g.add_edge(source, target, slot);
        }
    }

    /// Every live node id, ascending.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.g.node_indices().map(NodeId::from_ix).collect()
    }

    /// Number of live nodes.
    pub fn len(&self) -> usize {
        self.g.node_count()
    }

    /// True when the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.g.node_count() == 0
    }

    /// The values the graph computes for its caller, in order.
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Sets the outputs.
    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.invalidate();
        self.outputs = outputs;
    }

    /// The derived tables (schedule, streams, memory) of this exact graph.
    pub fn tables(&self) -> &PlanTables {
        &self.tables
    }

    /// The tables, to fill; a planning pass sets its own table and keeps
    /// the ones it does not invalidate. Editing the graph clears them all.
    pub fn tables_mut(&mut self) -> &mut PlanTables {
        &mut self.tables
    }

    /// The schedule if there is one, else the topological order with the
    /// effects in recorded order ([`Graph::effect_ordered`]): the order a
    /// backend runs.
    pub fn schedule_or_topo(&self) -> Vec<NodeId> {
        match &self.tables.schedule {
            Some(s) => s.clone(),
            None => self.effect_ordered(self.topo_order()),
        }
    }

    fn invalidate(&mut self) {
        if !self.tables.is_empty() {
            self.tables = PlanTables::default();
        }
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Moves the phase forward (never back: a request to go back is ignored).
    pub fn advance_phase(&mut self, phase: Phase) {
        self.phase = self.phase.max(phase);
    }

    /// The nodes the outputs and the effects depend on, operands before
    /// users. The order is a function of the graph's structure alone (a
    /// depth-first walk from [`Graph::roots`] in operand order), so two
    /// graphs that compute the same thing the same way list their nodes
    /// identically whatever their ids.
    pub fn topo_order(&self) -> Vec<NodeId> {
        self.topo_order_from(&self.roots())
    }

    /// [`Graph::topo_order`] from the given roots instead of the outputs.
    pub fn topo_order_from(&self, roots: &[NodeId]) -> Vec<NodeId> {
        const NEW: u8 = 0;
        const OPEN: u8 = 1;
        const DONE: u8 = 2;
        let mut order = Vec::new();
        // One state byte per node index: no hashing. The walk keeps an
        // explicit stack, so a chain of any length fits; the operands of
        // every open node sit in one shared vector, `operands[start..end]`.
        let mut state = vec![NEW; self.node_bound()];
        let mut operands: Vec<NodeId> = Vec::new();
        struct Frame {
            node: NodeId,
            start: usize,
            next: usize,
            end: usize,
        }
        let mut stack: Vec<Frame> = Vec::new();
        let open = |node: NodeId, state: &mut [u8], operands: &mut Vec<NodeId>, stack: &mut Vec<Frame>| {
            state[node.index()] = OPEN;
            let start = operands.len();
            if self.contains(node) {
                self.operands_into(node, operands);
            }
            stack.push(Frame { node, start, next: start, end: operands.len() });
        };
        for &root in roots {
            // A root need not be live (verify reports a removed output by
            // way of this order): it is listed, with no operands.
            if root.index() >= state.len() {
                state.resize(root.index() + 1, NEW);
            }
            if state[root.index()] != NEW {
                continue;
            }
            open(root, &mut state, &mut operands, &mut stack);
            while let Some(top) = stack.last_mut() {
                if top.next < top.end {
                    let child = operands[top.next];
                    top.next += 1;
                    if state[child.index()] == NEW {
                        open(child, &mut state, &mut operands, &mut stack);
                    }
                } else {
                    let Frame { node, start, .. } = *top;
                    state[node.index()] = DONE;
                    order.push(node);
                    operands.truncate(start);
                    stack.pop();
                }
            }
        }
        order
    }

    /// Every node some root needs (the roots included), as a set: what
    /// a context keeps when it collects. One flag per node index, no
    /// hashing, so collecting after each read of a loop stays cheap.
    pub fn reachable_from(&self, roots: &[NodeId]) -> NodeSet {
        self.reachable_from_stopping(roots, &[])
    }

    /// [`Graph::reachable_from`], treating the nodes of `stop` as if they
    /// had no operands and were no roots: what stays reachable once they
    /// are realized (a run's targets become operand-less buffers).
    pub fn reachable_from_stopping(&self, roots: &[NodeId], stop: &[NodeId]) -> NodeSet {
        let mut bits = vec![false; self.node_bound()];
        let mut blocked = vec![false; if stop.is_empty() { 0 } else { self.node_bound() }];
        for &s in stop {
            if let Some(b) = blocked.get_mut(s.index()) {
                *b = true;
            }
        }
        let open =
            |n: NodeId, bits: &[bool]| !bits[n.index()] && !blocked.get(n.index()).copied().unwrap_or(false);
        let mut stack: Vec<NodeId> = Vec::new();
        for &r in roots {
            if self.contains(r) && open(r, &bits) {
                bits[r.index()] = true;
                stack.push(r);
            }
        }
        let mut operands = Vec::new();
        while let Some(n) = stack.pop() {
            operands.clear();
            self.operands_into(n, &mut operands);
            for &o in &operands {
                if open(o, &bits) {
                    bits[o.index()] = true;
                    stack.push(o);
                }
            }
        }
        NodeSet { bits }
    }

    /// True if some path leads from `from` to `to` (following operand to user).
    pub fn reaches(&self, from: NodeId, to: NodeId) -> bool {
        petgraph::algo::has_path_connecting(&self.g, from.ix(), to.ix(), None)
    }

    /// True if the graph has a cycle.
    ///
    /// Kahn's algorithm: peel nodes with no unvisited operands; a node left
    /// over sits on a cycle. Iterative, so a chain of any length is fine
    /// (petgraph's `is_cyclic_directed` recurses once per node and overflows
    /// the stack near 30,000 nodes).
    pub fn has_cycle(&self) -> bool {
        let mut pending = vec![0usize; self.node_bound()];
        let mut ready = Vec::new();
        for ix in self.g.node_indices() {
            let n = self.g.neighbors_directed(ix, Direction::Incoming).count();
            pending[ix.index()] = n;
            if n == 0 {
                ready.push(ix);
            }
        }
        let mut peeled = 0;
        while let Some(ix) = ready.pop() {
            peeled += 1;
            for user in self.g.neighbors_directed(ix, Direction::Outgoing) {
                pending[user.index()] -= 1;
                if pending[user.index()] == 0 {
                    ready.push(user);
                }
            }
        }
        peeled != self.g.node_count()
    }

    /// A copy holding only the nodes the outputs need, renumbered densely
    /// in [`Graph::topo_order`]. Printing and hashing work on this form.
    ///
    /// A graph with a valid schedule is renumbered in schedule order
    /// instead, and keeps its tables (renamed to the new ids).
    pub fn compacted(&self) -> Graph {
        let mut out = self.empty_like();
        let mut map = HashMap::new();
        let (order, _) = super::text::numbering(self);
        for id in order {
            let operands: Vec<NodeId> = self.operands(id).iter().map(|o| map[o]).collect();
            let new = out.add_unchecked(self.node(id).clone(), &operands);
            map.insert(id, new);
        }
        out.outputs = self.outputs.iter().map(|o| map[o]).collect();
        out.tables = self.tables.remap(&map);
        out
    }
}
