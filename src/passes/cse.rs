//! Common subexpression elimination: nodes that compute the same value
//! become one node.
//!
//! *Does.* Walks the needed nodes operands-first. Two nodes are the same
//! when they have the same op with the same attributes (scalars compared by
//! their bits: `0.0` and `-0.0` differ, NaNs are equal only with the same
//! payload), the same operands in the same slots, and the same shape and
//! dtype. The later node (in [`Graph::topo_order`]) is removed and its users
//! and output slots read the first one. Since the walk is operands-first,
//! merging cascades: once two operands are one node, their users compare
//! equal too. `Random` nodes of different streams differ (the stream is an
//! attribute); two with the same stream and type are the same numbers
//! (counter-based RNG) and merge. `input` nodes of one slot merge.
//!
//! *Regions need not match.* Regions name and group nodes but never change
//! what they compute (see `ir`), so requiring equal regions would only keep
//! duplicate work. When the two nodes' regions differ, the survivor moves to
//! their nearest common ancestor region, since its value now belongs to
//! both scopes; a profile then charges shared work to the enclosing scope
//! instead of to whichever scope happened to come first.
//!
//! *Does not.* Use algebra (`a + b` and `b + a` stay two nodes), look at
//! values (two `Full`s of equal bits do merge; `x * 1` vs `x` do not),
//! touch dead nodes (DCE's job), or merge effects: two collectives are two
//! rounds every other rank runs, whatever their operands (on one rank two
//! all-reduces of equal constants look alike while on another they
//! differ; merging them on one rank only pairs the wrong rounds).
//!
//! *Preserves.* Every value the outputs see, bit for bit; the ids of
//! surviving nodes.
//!
//! *Invalidates.* Removed node ids; region of survivors that were merged
//! across regions.
//!
//! *Assumes.* A verified graph whose ops are pure but for the effects
//! ([`Op::is_effect`]), which it leaves alone.

use super::{Changed, Pass, PassCtx};
use crate::ir::{DType, Graph, NodeId, Op, RegionId, Shape};
use crate::Result;
use std::collections::HashMap;

/// Merges structurally equal nodes (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cse;

/// What makes two nodes the same: the op (scalars as bits), operands in
/// slot order, and the type.
#[derive(PartialEq, Eq, Hash)]
struct Key {
    op: String,
    operands: Vec<NodeId>,
    shape: Shape,
    dtype: DType,
}

/// The op with every scalar spelled by its bits; `Debug` of the other
/// variants is a faithful encoding of all their attributes.
fn op_key(op: &Op) -> String {
    match op {
        Op::Full(v) => format!("Full{:?}", v.hash_bits()),
        Op::Arange { start, step } => format!("Arange{:?}{:?}", start.hash_bits(), step.hash_bits()),
        other => format!("{other:?}"),
    }
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let mut changed = Changed::No;
        // Only looked up, never iterated: the walk order decides everything.
        let mut seen: HashMap<Key, NodeId> = HashMap::new();
        for id in graph.topo_order() {
            let node = graph.node(id);
            if node.op.is_effect() {
                continue;
            }
            let key = Key {
                op: op_key(&node.op),
                operands: graph.operands(id),
                shape: node.shape.clone(),
                dtype: node.dtype,
            };
            match seen.get(&key) {
                None => {
                    seen.insert(key, id);
                }
                Some(&first) => {
                    let (a, b) = (graph.node(first).region, graph.node(id).region);
                    if a != b {
                        graph.node_mut(first).region = common_ancestor(graph, a, b);
                    }
                    graph.replace_all_uses(id, first);
                    graph.remove(id);
                    cx.rewrite();
                    changed = Changed::Yes;
                }
            }
        }
        Ok(changed)
    }
}

/// The nearest region that contains both `a` and `b`.
pub(super) fn common_ancestor(graph: &Graph, a: RegionId, b: RegionId) -> RegionId {
    let chain = |mut r: RegionId| {
        let mut out = vec![r];
        while let Some(p) = graph.regions().get(r.0 as usize).and_then(|x| x.parent) {
            // The tree is acyclic in a verified graph; the bound keeps a
            // broken one from looping.
            if out.len() > graph.regions().len() {
                break;
            }
            out.push(p);
            r = p;
        }
        out
    };
    let ancestors_of_a = chain(a);
    chain(b).into_iter().find(|r| ancestors_of_a.contains(r)).unwrap_or(RegionId::ROOT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Distribution, Scalar, UnaryOp};

    fn src(g: &mut Graph, op: Op, dtype: DType) -> NodeId {
        g.add(op, &[], Some((Shape::new([2]), dtype)), RegionId::ROOT).unwrap()
    }

    fn run(g: &mut Graph) -> usize {
        let mut cx = PassCtx::default();
        Cse.run(g, &mut cx).unwrap();
        cx.stats.rewrites
    }

    #[test]
    fn duplicates_merge_and_cascade() {
        let mut g = Graph::new();
        let x = src(&mut g, Op::Input(0), DType::F32);
        let a1 = g.add(Op::Unary(UnaryOp::Exp), &[x], None, RegionId::ROOT).unwrap();
        let a2 = g.add(Op::Unary(UnaryOp::Exp), &[x], None, RegionId::ROOT).unwrap();
        let b1 = g.add(Op::Binary(BinaryOp::Add), &[a1, x], None, RegionId::ROOT).unwrap();
        let b2 = g.add(Op::Binary(BinaryOp::Add), &[a2, x], None, RegionId::ROOT).unwrap();
        g.set_outputs(vec![b1, b2]);
        assert_eq!(run(&mut g), 2);
        assert_eq!(g.outputs(), &[b1, b1]);
        assert!(!g.contains(a2) && !g.contains(b2));
    }

    #[test]
    fn operand_order_matters() {
        let mut g = Graph::new();
        let x = src(&mut g, Op::Input(0), DType::F32);
        let y = src(&mut g, Op::Input(1), DType::F32);
        let a = g.add(Op::Binary(BinaryOp::Sub), &[x, y], None, RegionId::ROOT).unwrap();
        let b = g.add(Op::Binary(BinaryOp::Sub), &[y, x], None, RegionId::ROOT).unwrap();
        g.set_outputs(vec![a, b]);
        assert_eq!(run(&mut g), 0);
    }

    #[test]
    fn scalars_compare_by_bits() {
        let mut g = Graph::new();
        let zero = src(&mut g, Op::Full(Scalar::Float(0.0)), DType::F32);
        let neg_zero = src(&mut g, Op::Full(Scalar::Float(-0.0)), DType::F32);
        let nan1 = src(&mut g, Op::Full(Scalar::Float(f64::NAN)), DType::F32);
        let nan2 = src(&mut g, Op::Full(Scalar::Float(f64::NAN)), DType::F32);
        let one_f64 = src(&mut g, Op::Full(Scalar::Float(1.0)), DType::F64);
        let one_f32 = src(&mut g, Op::Full(Scalar::Float(1.0)), DType::F32);
        g.set_outputs(vec![zero, neg_zero, nan1, nan2, one_f64, one_f32]);
        assert_eq!(run(&mut g), 1);
        assert_eq!(g.outputs(), &[zero, neg_zero, nan1, nan1, one_f64, one_f32]);
    }

    #[test]
    fn random_streams_differ() {
        let mut g = Graph::new();
        let r0 = src(&mut g, Op::Random { dist: Distribution::Normal, stream: 0 }, DType::F32);
        let r1 = src(&mut g, Op::Random { dist: Distribution::Normal, stream: 1 }, DType::F32);
        let r0b = src(&mut g, Op::Random { dist: Distribution::Normal, stream: 0 }, DType::F32);
        g.set_outputs(vec![r0, r1, r0b]);
        assert_eq!(run(&mut g), 1);
        assert_eq!(g.outputs(), &[r0, r1, r0]);
    }

    #[test]
    fn merging_across_regions_moves_to_the_common_ancestor() {
        let mut g = Graph::new();
        let enc = g.region_path("enc");
        let l1 = g.region_path("enc/l1");
        let l2 = g.region_path("enc/l2");
        let x = src(&mut g, Op::Input(0), DType::F32);
        let a = g.add(Op::Unary(UnaryOp::Tanh), &[x], None, l1).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Tanh), &[x], None, l2).unwrap();
        g.set_outputs(vec![a, b]);
        assert_eq!(run(&mut g), 1);
        assert_eq!(g.node(a).region, enc);
        assert_eq!(common_ancestor(&g, l1, RegionId::ROOT), RegionId::ROOT);
        assert_eq!(common_ancestor(&g, l1, l1), l1);
    }
}
