//! Dead code elimination: remove every node the outputs do not need.
//!
//! *Does.* Keeps exactly the nodes [`Graph::topo_order`] reaches from the
//! outputs and the effects ([`Graph::roots`], following operands) and
//! removes the rest, in ascending id order. A graph with no outputs and no
//! collectives ends up empty.
//!
//! *Does not.* Remove a node that some output needs, however cheap, or a
//! collective whose value nothing reads (every other rank runs it, so
//! this rank must too), or renumber the survivors (printing compacts;
//! ids stay stable here).
//!
//! *Preserves.* Every value the outputs see; ids and regions of survivors;
//! the region tree (regions with no nodes left are kept: they are names).
//!
//! *Invalidates.* Removed node ids.
//!
//! *Assumes.* Every op but the effects is pure: nothing but the outputs
//! and the effects is observable.
//! Variable assignments are outputs (the context adds each pending one to
//! the graph it extracts), so they are roots here like any other output.

use super::{Changed, Pass, PassCtx};
use crate::ir::Graph;
use crate::Result;
use std::collections::HashSet;

/// Removes nodes the outputs do not need (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let live: HashSet<_> = graph.topo_order().into_iter().collect();
        let dead: Vec<_> = graph.node_ids().into_iter().filter(|id| !live.contains(id)).collect();
        for _ in &dead {
            cx.rewrite();
        }
        graph.remove_many(&dead);
        Ok(if dead.is_empty() { Changed::No } else { Changed::Yes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Op, RegionId, Shape, UnaryOp};

    #[test]
    fn removes_exactly_the_unneeded_nodes() {
        let mut g = Graph::new();
        let x = g.add(Op::Input(0), &[], Some((Shape::new([2]), DType::F32)), RegionId::ROOT).unwrap();
        let y = g.add(Op::Input(1), &[], Some((Shape::new([2]), DType::F32)), RegionId::ROOT).unwrap();
        let a = g.add(Op::Unary(UnaryOp::Exp), &[x], None, RegionId::ROOT).unwrap();
        let dead = g.add(Op::Unary(UnaryOp::Exp), &[y], None, RegionId::ROOT).unwrap();
        let _dead_user = g.add(Op::Unary(UnaryOp::Neg), &[dead], None, RegionId::ROOT).unwrap();
        g.set_outputs(vec![a]);
        let mut cx = PassCtx::default();
        assert_eq!(Dce.run(&mut g, &mut cx).unwrap(), Changed::Yes);
        assert_eq!(cx.stats.rewrites, 3);
        assert_eq!(g.node_ids(), vec![x, a]);
        assert_eq!(Dce.run(&mut g, &mut cx).unwrap(), Changed::No);
    }

    #[test]
    fn no_outputs_means_nothing_is_live() {
        let mut g = Graph::new();
        g.add(Op::Input(0), &[], Some((Shape::new([2]), DType::F32)), RegionId::ROOT).unwrap();
        Dce.run(&mut g, &mut PassCtx::default()).unwrap();
        assert!(g.is_empty());
    }
}
