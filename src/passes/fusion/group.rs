//! Deciding the groups: one reverse topological walk, consumers first.
//!
//! Everything is indexed by position in [`Graph::topo_order`], so the walk
//! and every tie-break follow the graph's structure, never a hash order.

use crate::ir::{DType, Graph, NodeId, Op, ReduceOp, Shape};
use std::collections::{HashMap, HashSet};

/// What a node is to fusion.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Class {
    /// `input` or `full`: a body may hold it (a `full` goes inside).
    Leaf,
    /// `buffer`, `random`, `arange`: only ever an operand of a body.
    Source,
    /// A view: inside a body only over leaves, or as a row expand.
    View,
    /// Elementwise op or cast.
    Elementwise,
    /// `sum`/`mean`/`max`/`min` over the trailing dims `split..` of its
    /// operand.
    Reduce { split: usize, keepdim: bool },
    /// A matmul: fused only under an epilogue.
    MatMul,
    /// Everything else (conv, pool, gather, argmax, other reductions, ...).
    Other,
}

/// The graph's needed nodes, by topological position.
pub(super) struct Index<'g> {
    pub graph: &'g Graph,
    pub order: Vec<NodeId>,
    /// Position of each needed node (looked up, never iterated).
    pub pos: HashMap<NodeId, usize>,
    pub operands: Vec<Vec<usize>>,
    /// Distinct live users, ascending positions.
    pub users: Vec<Vec<usize>>,
    pub output: Vec<bool>,
    pub class: Vec<Class>,
    /// The row reduction each node's value descends from (see [`Up`]).
    pub up: Vec<Up>,
}

/// Which row reduction a value descends from through elementwise ops and
/// views: none, one `(domain, split)`, or several different ones.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Up {
    None,
    Row(Shape, usize),
    Mixed,
}

impl Up {
    fn join(&self, other: &Up) -> Up {
        match (self, other) {
            (Up::None, x) | (x, Up::None) => x.clone(),
            (Up::Row(a, s), Up::Row(b, t)) if a == b && s == t => self.clone(),
            _ => Up::Mixed,
        }
    }

    /// Whether a group of this domain and split may hold values of this
    /// descent: with a split every row value must come from that split.
    fn fits(&self, domain: &Shape, split: Option<usize>) -> bool {
        match (self, split) {
            (_, None) => true,
            (Up::None, Some(_)) => true,
            (Up::Row(d, s), Some(t)) => d == domain && *s == t,
            (Up::Mixed, Some(_)) => false,
        }
    }
}

impl<'g> Index<'g> {
    pub fn new(graph: &'g Graph) -> Index<'g> {
        let order = graph.topo_order();
        let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let operands: Vec<Vec<usize>> =
            order.iter().map(|&id| graph.operands(id).iter().map(|o| pos[o]).collect()).collect();
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for (i, ops) in operands.iter().enumerate() {
            for &o in ops {
                if users[o].last() != Some(&i) {
                    users[o].push(i);
                }
            }
        }
        let mut output = vec![false; order.len()];
        for o in graph.outputs() {
            output[pos[o]] = true;
        }
        let class: Vec<Class> = order.iter().map(|&id| classify(graph, id)).collect();
        let mut up = Vec::with_capacity(order.len());
        for i in 0..order.len() {
            let value = match &class[i] {
                Class::Reduce { split, .. } => {
                    Up::Row(graph.node(order[operands[i][0]]).shape.clone(), *split)
                }
                Class::Elementwise | Class::View => {
                    operands[i].iter().fold(Up::None, |acc, &o| acc.join(&up[o]))
                }
                _ => Up::None,
            };
            up.push(value);
        }
        Index { graph, order, pos, operands, users, output, class, up }
    }

    pub fn position(&self, id: NodeId) -> Option<usize> {
        self.pos.get(&id).copied()
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn shape(&self, i: usize) -> &Shape {
        &self.graph.node(self.order[i]).shape
    }
}

fn classify(graph: &Graph, id: NodeId) -> Class {
    let op = &graph.node(id).op;
    match op {
        Op::Input(_) | Op::Full(_) => Class::Leaf,
        Op::Buffer(_) | Op::Random { .. } | Op::Arange { .. } => Class::Source,
        op if op.is_view() => Class::View,
        op if op.is_elementwise() => Class::Elementwise,
        Op::Reduce { op: ReduceOp::ArgMax, .. } | Op::Reduce { into: Some(_), .. } => Class::Other,
        Op::Reduce { dims, keepdim, .. } => {
            let rank = graph.operands(id).first().map_or(0, |&o| graph.node(o).shape.rank());
            match dims.first() {
                Some(&split) if dims.iter().copied().eq(split..rank) => {
                    Class::Reduce { split, keepdim: *keepdim }
                }
                _ => Class::Other,
            }
        }
        Op::MatMul => Class::MatMul,
        _ => Class::Other,
    }
}

/// The row shape of `domain` reduced over `split..`.
pub(super) fn row(domain: &Shape, split: usize) -> Shape {
    Shape(domain.0.iter().enumerate().map(|(i, &d)| if i < split { d } else { 1 }).collect())
}

/// The split for which `from` is the row shape of `to`, if any (the first
/// dim where they differ; every later dim of `from` must be 1).
fn row_split(from: &Shape, to: &Shape) -> Option<usize> {
    if from.rank() != to.rank() || from == to {
        return None;
    }
    let split = from.0.iter().zip(&to.0).position(|(a, b)| a != b)?;
    (from.0[split..].iter().all(|&d| d == 1)).then_some(split)
}

/// What a group's legality depends on; checks return the next one.
#[derive(Clone, Debug)]
pub(super) struct State {
    /// Elementwise: the shape of every compute node; with reductions: the
    /// reduced domain.
    pub domain: Shape,
    /// The first reduced dim, once a reduction or a row expand joined.
    pub split: Option<usize>,
    /// Whether a reduction is in the group.
    pub reduction: bool,
    /// A matmul joined: the group takes no more producers.
    pub sealed: bool,
    /// The join of the members' [`Up`].
    pub up: Up,
}

/// One group while it grows.
#[derive(Clone, Debug)]
pub(super) struct Group {
    /// The group's one output.
    pub root: usize,
    /// The group's legality state.
    pub state: State,
    /// Members, in the order they joined (consumers first).
    pub members: Vec<usize>,
}

/// The result of the walk.
pub(super) struct Grouping {
    pub groups: Vec<Group>,
    /// The group of each position.
    pub group_of: Vec<Option<usize>>,
    /// Positions of widening casts that every reader's body recomputes
    /// from the narrow value (see [`Walk::duplicate`]): in no group.
    pub dup: Vec<bool>,
}

/// Groups the needed nodes. A group that took a row expand but no
/// reduction would compute row values without the loop that makes them
/// legal; its row expands become barriers (views that end a group) and
/// the walk runs again. Each retry adds barriers, so it ends.
pub(super) fn plan(ix: &Index) -> Grouping {
    let mut barrier = vec![false; ix.len()];
    loop {
        let grouping = walk(ix, &barrier);
        let mut retry = false;
        for g in &grouping.groups {
            let domain_only =
                g.members.iter().all(|&m| ix.class[m] == Class::View || *ix.shape(m) == g.state.domain);
            if !g.state.reduction && g.state.split.is_some() && !domain_only {
                for &m in &g.members {
                    if ix.class[m] == Class::View {
                        barrier[m] = true;
                        retry = true;
                    }
                }
            }
        }
        if !retry {
            return grouping;
        }
    }
}

fn walk(ix: &Index, barrier: &[bool]) -> Grouping {
    let mut w = Walk { ix, groups: Vec::new(), group_of: vec![None; ix.len()], dup: vec![false; ix.len()] };
    for i in (0..ix.len()).rev() {
        match &ix.class[i] {
            Class::Elementwise => {
                let joined = w.try_join(i, |w, g| w.join_elementwise(g, i));
                if !joined && !w.duplicate(i) {
                    w.start(i, ix.shape(i).clone(), None, ix.up[i].clone());
                }
            }
            Class::Reduce { split, keepdim } => {
                let joined = *keepdim && w.try_join(i, |w, g| w.join_reduction(g, i, *split));
                if !joined {
                    let domain = ix.shape(ix.operands[i][0]).clone();
                    w.start(i, domain, Some(*split), ix.up[i].clone());
                }
            }
            Class::View if !barrier[i] && matches!(ix.graph.node(ix.order[i]).op, Op::Expand(_)) => {
                w.try_join(i, |w, g| w.join_row_expand(g, i));
            }
            Class::MatMul => {
                w.try_join(i, |w, g| w.join_matmul(g, i));
            }
            _ => {}
        }
    }
    Grouping { groups: w.groups, group_of: w.group_of, dup: w.dup }
}

struct Walk<'a, 'g> {
    ix: &'a Index<'g>,
    groups: Vec<Group>,
    group_of: Vec<Option<usize>>,
    dup: Vec<bool>,
}

impl Walk<'_, '_> {
    /// Marks `i` to be recomputed in each reader's body when it is a
    /// widening cast (f16 or bf16 to f32 or f64, f32 to f64), not an
    /// output, and every reader is an elementwise op or a row reduction
    /// in a group that can take it: reading the narrow value and
    /// converting it costs each reader fewer bytes than reading the wide
    /// copy, and the copy is never written (a bf16 LM head's logits,
    /// widened for the loss's two row reductions and its gradient, were an
    /// f32 `[4096, 50257]` of their own).
    fn duplicate(&mut self, i: usize) -> bool {
        let graph = self.ix.graph;
        let Op::Cast(to) = graph.node(self.ix.order[i]).op else { return false };
        let from = graph.node(self.ix.order[self.ix.operands[i][0]]).dtype;
        let widens = matches!(
            (from, to),
            (DType::F16 | DType::BF16, DType::F32 | DType::F64) | (DType::F32, DType::F64)
        );
        if !widens || self.ix.output[i] || self.ix.users[i].is_empty() {
            return false;
        }
        let mut next = Vec::new();
        for &u in &self.ix.users[i] {
            let Some(g) = self.group_of[u] else { return false };
            let reads = matches!(self.ix.class[u], Class::Elementwise | Class::Reduce { .. });
            if !reads || self.groups[g].state.sealed {
                return false;
            }
            match self.join_elementwise(&self.groups[g], i) {
                Some(state) => next.push((g, state)),
                None => return false,
            }
        }
        for (g, state) in next {
            self.groups[g].state = state;
        }
        self.dup[i] = true;
        true
    }

    /// The one group every user of `i` is in, if `i` is not an output.
    fn sole_group(&self, i: usize) -> Option<usize> {
        if self.ix.output[i] {
            return None;
        }
        let mut found = None;
        for &u in &self.ix.users[i] {
            let g = self.group_of[u]?;
            if found.is_some_and(|f| f != g) {
                return None;
            }
            found = Some(g);
        }
        found
    }

    /// Whether `g`'s root is the value of an `assign` over an input (a
    /// variable's update, such as SGD's momentum `0.9 * buf + grad`): it
    /// stays elementwise, so that the assign pass can mark it to be
    /// written over the variable (a matmul epilogue writes the GEMM's
    /// product first, over bytes the epilogue still has to read). The
    /// walk meets the matmul before the members that read the variable
    /// (consumers first), so this does not wait to see them.
    fn updates_in_place(&self, g: &Group) -> bool {
        let graph = self.ix.graph;
        let root = self.ix.order[g.root];
        graph.users(root).into_iter().any(|a| {
            let ops = graph.operands(a);
            matches!(graph.node(a).op, Op::Assign)
                && ops.get(1) == Some(&root)
                && ops.first().is_some_and(|&old| matches!(graph.node(old).op, Op::Input(_)))
        })
    }

    /// Adds `i` to its users' group if `check` allows (and applies the
    /// group's new state).
    fn try_join(&mut self, i: usize, check: impl FnOnce(&Self, &Group) -> Option<State>) -> bool {
        let Some(g) = self.sole_group(i) else { return false };
        if self.groups[g].state.sealed {
            return false;
        }
        match check(self, &self.groups[g]) {
            Some(next) => {
                let group = &mut self.groups[g];
                group.state = next;
                group.members.push(i);
                self.group_of[i] = Some(g);
                true
            }
            None => false,
        }
    }

    fn start(&mut self, i: usize, domain: Shape, split: Option<usize>, up: Up) {
        let state = State { domain, split, reduction: split.is_some(), sealed: false, up };
        self.group_of[i] = Some(self.groups.len());
        self.groups.push(Group { root: i, state, members: vec![i] });
    }

    fn join_elementwise(&self, g: &Group, i: usize) -> Option<State> {
        let g = &g.state;
        let shape = self.ix.shape(i);
        let at_row = g.split.is_some_and(|s| *shape == row(&g.domain, s));
        if *shape != g.domain && !at_row {
            return None;
        }
        let up = g.up.join(&self.ix.up[i]);
        up.fits(&g.domain, g.split).then(|| State { up, ..g.clone() })
    }

    fn join_reduction(&self, g: &Group, i: usize, split: usize) -> Option<State> {
        let g = &g.state;
        let domain = self.ix.shape(self.ix.operands[i][0]);
        let same_loop = g.split == Some(split) && g.domain == *domain;
        let row_epilogue = g.split.is_none() && !g.reduction && g.domain == *self.ix.shape(i);
        if !same_loop && !row_epilogue {
            return None;
        }
        let up = g.up.join(&self.ix.up[i]);
        up.fits(domain, Some(split)).then(|| State {
            domain: domain.clone(),
            split: Some(split),
            reduction: true,
            sealed: false,
            up,
        })
    }

    /// An expand of a computed row value back over the domain.
    fn join_row_expand(&self, g: &Group, i: usize) -> Option<State> {
        let g = &g.state;
        let x = self.ix.operands[i][0];
        if !matches!(self.ix.class[x], Class::Elementwise | Class::Reduce { keepdim: true, .. }) {
            return None; // a leaf view (or a view of a value that is materialized anyway)
        }
        let split = row_split(self.ix.shape(x), self.ix.shape(i))?;
        if *self.ix.shape(i) != g.domain || g.split.is_some_and(|s| s != split) {
            return None;
        }
        let up = g.up.join(&self.ix.up[i]);
        up.fits(&g.domain, Some(split)).then(|| State { split: Some(split), up, ..g.clone() })
    }

    /// A matmul joins an elementwise group of its shape in which every
    /// member follows it (a walk from the matmul over members reaches them all).
    fn join_matmul(&self, g: &Group, i: usize) -> Option<State> {
        let s = &g.state;
        if s.split.is_some() || s.reduction || s.domain != *self.ix.shape(i) || self.updates_in_place(g) {
            return None;
        }
        let me = self.group_of[g.root]?;
        let mut seen: HashSet<usize> = HashSet::from([i]);
        let mut stack = vec![i];
        while let Some(n) = stack.pop() {
            for &u in &self.ix.users[n] {
                if self.group_of[u] == Some(me) && seen.insert(u) {
                    stack.push(u);
                }
            }
        }
        (seen.len() == g.members.len() + 1).then(|| State { sealed: true, ..s.clone() })
    }
}
