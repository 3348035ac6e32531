//! The simplify pass's cost model, extraction from the saturated e-graph,
//! and the rebuild of the kiln graph from what was extracted.

use super::lang::{ENode, OpKey, SGraph};
use crate::ir::{BinaryOp, DType, Graph, Node, NodeId, RegionId, Shape};
use egg::Id;
use std::collections::{HashMap, HashSet};

/// What a node costs, compared lexicographically: bytes moved first, then
/// reductions, then nodes, then divisions, then nodes that are not in the
/// input graph (so a tie keeps what the user wrote). A graph's cost counts
/// each node once and fits these integers; [`extract`]'s tree costs do not
/// (see [`TreeCost`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cost {
    /// Bytes read and written.
    pub bytes: u128,
    /// Reductions: at equal bytes an elementwise form is cheaper, because
    /// fusion puts it in its neighbours' kernel and a reduction ends one
    /// (a sum over a dim of size 1 is then a reshape plus 0).
    pub reductions: u128,
    /// Nodes.
    pub ops: u128,
    /// Divisions (slower than a multiply on every target).
    pub divisions: u128,
    /// Nodes the input graph did not have.
    pub new: u128,
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            bytes: self.bytes.saturating_add(o.bytes),
            reductions: self.reductions.saturating_add(o.reductions),
            ops: self.ops.saturating_add(o.ops),
            divisions: self.divisions.saturating_add(o.divisions),
            new: self.new.saturating_add(o.new),
        }
    }
}

/// A non-negative integer of any size (little-endian limbs, no zero limb
/// on top): a tree cost's only operations are addition and comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Wide(Vec<u64>);

impl Wide {
    fn of(x: u128) -> Wide {
        let mut w = Wide(vec![x as u64, (x >> 64) as u64]);
        w.trim();
        w
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn add(&mut self, o: &Wide) {
        if self.0.len() < o.0.len() {
            self.0.resize(o.0.len(), 0);
        }
        let mut carry = 0u64;
        for (i, limb) in self.0.iter_mut().enumerate() {
            let (a, c1) = limb.overflowing_add(o.0.get(i).copied().unwrap_or(0));
            let (b, c2) = a.overflowing_add(carry);
            *limb = b;
            carry = u64::from(c1) + u64::from(c2);
        }
        if carry > 0 {
            self.0.push(carry);
        }
        self.trim();
    }
}

impl Ord for Wide {
    fn cmp(&self, o: &Wide) -> std::cmp::Ordering {
        self.0.len().cmp(&o.0.len()).then_with(|| self.0.iter().rev().cmp(o.0.iter().rev()))
    }
}

impl PartialOrd for Wide {
    fn partial_cmp(&self, o: &Wide) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// A [`Cost`] summed over a tree: a node's own cost plus its operands'
/// tree costs. It counts a value once per path to it, which grows
/// exponentially with the sharing of a deep graph: GPT-2 small's training
/// step passes 2^128 bytes. Exact integers of any size keep the few
/// megabytes two choices differ by (floats lost them, and saturating
/// integers tied everything: simplify kept every large graph as it was).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct TreeCost([Wide; 5]);

impl TreeCost {
    fn of(c: Cost) -> TreeCost {
        TreeCost([c.bytes, c.reductions, c.ops, c.divisions, c.new].map(Wide::of))
    }

    fn add(&mut self, o: &TreeCost) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            a.add(b);
        }
    }
}

impl Cost {
    /// The cost without the tie-break on new nodes: what decides whether
    /// the extracted graph is an improvement.
    pub fn work(self) -> Cost {
        Cost { new: 0, ..self }
    }
}

fn bytes(shape: &Shape, dtype: DType) -> u128 {
    shape.numel() as u128 * dtype.size() as u128
}

/// The cost of one node on its own. Inputs, buffers, `full` constants and
/// views move no bytes (a view is a new layout over the same bytes; a
/// `full` is a value a kernel reads from a register, so reading a constant
/// operand, a `full` or a view of one, moves none either). `arange` and
/// random nodes write their output. Every other op reads each operand slot
/// and writes its output. Operands come as (shape, dtype, constant).
pub fn own_cost<'a>(
    op: &OpKey,
    shape: &Shape,
    dtype: DType,
    operands: impl Iterator<Item = (&'a Shape, DType, bool)>,
) -> Cost {
    let bytes = match op {
        OpKey::Input(_) | OpKey::Buffer(_) | OpKey::Full(_) => 0,
        OpKey::Reshape(_) | OpKey::Permute(_) | OpKey::Expand(_) | OpKey::Slice { .. } => 0,
        OpKey::Arange { .. } | OpKey::Random { .. } => bytes(shape, dtype),
        _ => bytes(shape, dtype) + operands.filter(|o| !o.2).map(|(s, d, _)| bytes(s, d)).sum::<u128>(),
    };
    let divisions = u128::from(*op == OpKey::Binary(BinaryOp::Div));
    let reductions = u128::from(matches!(op, OpKey::Reduce { .. }));
    Cost { bytes, reductions, ops: 1, divisions, new: 0 }
}

fn enode_cost(g: &SGraph, n: &ENode, originals: &HashMap<ENode, NodeId>) -> Cost {
    let operands =
        n.children.iter().map(|&c| (&g[c].data.shape, g[c].data.dtype, g[c].data.constant.is_some()));
    let mut cost = own_cost(&n.op, &n.shape, n.dtype, operands);
    if !originals.contains_key(n) {
        cost.new = 1;
    }
    cost
}

/// The distinct e-classes under `c` (children of all its nodes).
fn class_children(g: &SGraph, c: Id) -> Vec<Id> {
    let mut out: Vec<Id> = g[c].nodes.iter().flat_map(|n| n.children.iter().map(|&k| g.find(k))).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// E-classes reachable from the roots, children before parents except
/// along cycles (which unions make: `x * 1` joins `x`'s class).
fn post_order(g: &SGraph, roots: &[Id]) -> Vec<Id> {
    let mut seen: HashSet<Id> = HashSet::new();
    let mut order = Vec::new();
    for &root in roots {
        let root = g.find(root);
        if !seen.insert(root) {
            continue;
        }
        let mut stack = vec![(root, class_children(g, root), 0usize)];
        while let Some((class, children, next)) = stack.last_mut() {
            if let Some(&child) = children.get(*next) {
                *next += 1;
                if seen.insert(child) {
                    let grandchildren = class_children(g, child);
                    stack.push((child, grandchildren, 0));
                }
            } else {
                order.push(*class);
                stack.pop();
            }
        }
    }
    order
}

/// Sweeps are repeated until no class finds a cheaper node; in practice
/// two or three (the order is topological but for cycles). The bound only
/// guards against a pathological e-graph; every recorded choice is valid.
const MAX_SWEEPS: usize = 64;

/// The chosen node of every e-class the roots need, and the cost of that
/// graph counting each chosen node once.
pub struct Extraction {
    /// Chosen node per e-class (canonical ids).
    pub choice: HashMap<Id, ENode>,
    /// The summed own costs of the chosen nodes reachable from the roots.
    pub cost: Cost,
}

/// Chooses one node per e-class by tree cost (a node's own cost plus its
/// distinct operands' best costs), updating a class only when strictly
/// cheaper. Costs are non-negative and every node counts one op, so a
/// strictly cheaper node can never lead back to its own class: the choice
/// is always acyclic. Tree cost counts a value shared by two users twice;
/// that can mislead a choice on graphs with much sharing, never make it
/// invalid, and the caller compares the extracted graph's real (each node
/// once) cost against the input's before keeping it.
pub fn extract(g: &SGraph, roots: &[Id], originals: &HashMap<ENode, NodeId>) -> Extraction {
    let order = post_order(g, roots);
    let mut best: HashMap<Id, (TreeCost, usize)> = HashMap::with_capacity(order.len());
    for _ in 0..MAX_SWEEPS {
        let mut changed = false;
        for &c in &order {
            for (i, n) in g[c].nodes.iter().enumerate() {
                let mut children: Vec<Id> = n.children.iter().map(|&k| g.find(k)).collect();
                children.sort_unstable();
                children.dedup();
                let mut cost = TreeCost::of(enode_cost(g, n, originals));
                let complete = children.iter().all(|k| match best.get(k) {
                    Some((below, _)) => {
                        cost.add(below);
                        true
                    }
                    None => false,
                });
                if !complete {
                    continue;
                }
                if best.get(&c).is_none_or(|(b, _)| cost < *b) {
                    best.insert(c, (cost, i));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut choice = HashMap::new();
    let mut cost = Cost::default();
    let mut stack: Vec<Id> = roots.iter().map(|&r| g.find(r)).collect();
    while let Some(c) = stack.pop() {
        if choice.contains_key(&c) {
            continue;
        }
        // Every root class holds an input node, so it has a cost; so does
        // every child of a costed node.
        let Some(&i) = best.get(&c).map(|(_, i)| i) else { continue };
        let n = &g[c].nodes[i];
        cost = cost + enode_cost(g, n, originals);
        stack.extend(n.children.iter().map(|&k| g.find(k)));
        choice.insert(c, n.clone());
    }
    Extraction { choice, cost }
}

/// Rewrites `graph` to compute its roots with the extracted nodes: the
/// first `outputs` roots become the outputs, the rest (the collectives)
/// are built without becoming outputs. A
/// chosen node that is a node of the input graph is that node, its operands
/// pointed at the extracted nodes of the same e-classes (same values, so
/// its value and every other user are unchanged); any other chosen node
/// is added, in the region of the first input node of its e-class or, in a
/// class the rules made, the region of the user that first reached it.
/// Returns the number of nodes added, or `None` if the choice is
/// incomplete or cyclic (never for a choice from [`extract`]).
pub fn rebuild(
    graph: &mut Graph,
    g: &SGraph,
    roots: &[Id],
    outputs: usize,
    choice: &HashMap<Id, ENode>,
    originals: &HashMap<ENode, NodeId>,
    class_region: &HashMap<Id, RegionId>,
) -> Option<usize> {
    // Regions, outputs first: a class without input nodes takes its
    // first user's region.
    let mut region: HashMap<Id, RegionId> = HashMap::with_capacity(choice.len());
    let mut stack: Vec<(Id, RegionId)> = roots.iter().map(|&r| (g.find(r), RegionId::ROOT)).collect();
    while let Some((c, user_region)) = stack.pop() {
        if region.contains_key(&c) {
            continue;
        }
        let r = class_region.get(&c).copied().unwrap_or(user_region);
        region.insert(c, r);
        stack.extend(choice.get(&c)?.children.iter().map(|&k| (g.find(k), r)));
    }
    // Nodes, operands first.
    let mut built: HashMap<Id, NodeId> = HashMap::with_capacity(choice.len());
    // Classes whose operands are being built: meeting one again is a cycle.
    let mut open: HashSet<Id> = HashSet::new();
    let mut added = 0;
    for &root in roots {
        let root = g.find(root);
        let mut stack = vec![(root, false)];
        while let Some((c, expanded)) = stack.pop() {
            if built.contains_key(&c) {
                continue;
            }
            let n = choice.get(&c)?;
            if !expanded {
                if !open.insert(c) {
                    return None;
                }
                stack.push((c, true));
                stack.extend(
                    n.children.iter().map(|&k| (g.find(k), false)).filter(|(k, _)| !built.contains_key(k)),
                );
                continue;
            }
            let operands =
                n.children.iter().map(|&k| built.get(&g.find(k)).copied()).collect::<Option<Vec<_>>>()?;
            let id = match originals.get(n) {
                Some(&id) => {
                    if graph.operands(id) != operands {
                        graph.set_operands(id, &operands);
                    }
                    id
                }
                None => {
                    added += 1;
                    let node = Node {
                        op: n.op.to_op(),
                        shape: n.shape.clone(),
                        dtype: n.dtype,
                        region: region.get(&c).copied().unwrap_or(RegionId::ROOT),
                    };
                    graph.add_unchecked(node, &operands)
                }
            };
            built.insert(c, id);
        }
    }
    let outputs =
        roots[..outputs].iter().map(|&r| built.get(&g.find(r)).copied()).collect::<Option<Vec<_>>>()?;
    graph.set_outputs(outputs);
    Some(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_integers_add_with_carry_and_compare_by_value() {
        let mut a = Wide::of(u128::MAX);
        a.add(&Wide::of(1));
        assert_eq!(a, Wide(vec![0, 0, 1]), "2^128");
        assert!(a > Wide::of(u128::MAX));
        let mut b = a.clone();
        b.add(&Wide::of(5));
        assert!(b > a);
        assert_eq!(b.cmp(&a), std::cmp::Ordering::Greater);
        assert_eq!(Wide::of(0), Wide::default());
        assert!(Wide::of(3) < Wide::of(1 << 70));
        // Costs compare field by field: bytes decide before nodes.
        let small = TreeCost::of(Cost { bytes: 10, ops: 9, ..Cost::default() });
        let mut large = TreeCost::of(Cost { bytes: 11, ..Cost::default() });
        assert!(small < large);
        large.add(&small);
        assert_eq!(large, TreeCost::of(Cost { bytes: 21, ops: 9, ..Cost::default() }));
    }
}
