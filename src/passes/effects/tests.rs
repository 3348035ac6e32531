//! The collectives check: deliberately broken passes (what CSE, folding
//! with DCE, and a schedule did before collectives were effects) and the
//! golden error each gets; and every real pass leaving collectives alone.

use super::super::{run::run_pass, Changed, Pass, PassCtx};
use super::Recorded;
use crate::ir::text::parse;
use crate::ir::{Graph, Op, ReduceOp};
use crate::Result;

/// Rank 1 of issue 33's repro: two all-reduces of equal constants, and a
/// third in the branch a constant `where` does not take.
const GRAPH: &str = "\
%one: f32[4] = full 1
%also_one: f32[4] = full 1
%yes: bool[4] = full true
%a: f32[4] = all_reduce_sum %one
%b: f32[4] = all_reduce_sum %also_one
%c: f32[4] = all_reduce_sum %one
%s: f32[4] = add %a, %b
%w: f32[4] = where %yes, %s, %c
return %w
";

/// Runs `pass` as the pass manager does and returns its error, if any.
fn after(pass: &dyn Pass, src: &str) -> Option<String> {
    let mut g = parse(src).unwrap();
    let recorded = Recorded::of(&g);
    run_pass(pass, &mut g, &mut PassCtx::default(), true, &recorded).err().map(|e| e.to_string())
}

fn golden(name: &str, message: Option<String>) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, message.expect("the check must fail")));
}

/// CSE as it was: the later of two equal-looking collectives merged away.
struct MergeEqualCollectives;
impl Pass for MergeEqualCollectives {
    fn name(&self) -> &'static str {
        "merge-equal-collectives"
    }
    fn run(&self, graph: &mut Graph, _cx: &mut PassCtx) -> Result<Changed> {
        let effects = graph.effects();
        let (first, second) = (effects[0], effects[2]);
        graph.replace_all_uses(second, first);
        graph.remove(second);
        Ok(Changed::Yes)
    }
}

/// DCE as it was: only what the outputs read survives, so the collective
/// in the branch a constant `where` dropped is gone.
struct KeepOnlyWhatOutputsRead;
impl Pass for KeepOnlyWhatOutputsRead {
    fn name(&self) -> &'static str {
        "keep-only-what-outputs-read"
    }
    fn run(&self, graph: &mut Graph, _cx: &mut PassCtx) -> Result<Changed> {
        let w = graph.outputs()[0];
        let s = graph.operands(w)[1];
        graph.set_outputs(vec![s]);
        let live = graph.reachable_from(&[s]);
        let dead: Vec<_> = graph.node_ids().into_iter().filter(|id| !live.contains(id)).collect();
        graph.remove_many(&dead);
        Ok(Changed::Yes)
    }
}

/// A schedule that issues two independent collectives out of order.
struct SwapTwoCollectives;
impl Pass for SwapTwoCollectives {
    fn name(&self) -> &'static str {
        "swap-two-collectives"
    }
    fn run(&self, graph: &mut Graph, _cx: &mut PassCtx) -> Result<Changed> {
        let mut order = graph.topo_order();
        let effects = graph.effects();
        let i = order.iter().position(|&n| n == effects[0]).unwrap();
        let j = order.iter().position(|&n| n == effects[1]).unwrap();
        order.swap(i, j);
        graph.tables_mut().schedule = Some(order);
        Ok(Changed::Yes)
    }
    fn reaches(&self) -> crate::ir::Phase {
        crate::ir::Phase::Scheduled
    }
}

/// A rewrite that turns a sum into a mean.
struct ChangeACollective;
impl Pass for ChangeACollective {
    fn name(&self) -> &'static str {
        "change-a-collective"
    }
    fn run(&self, graph: &mut Graph, _cx: &mut PassCtx) -> Result<Changed> {
        let b = graph.effects()[1];
        graph.node_mut(b).op =
            Op::Collective { what: crate::ir::Collective::AllReduce(ReduceOp::Mean), seq: 1 };
        Ok(Changed::Yes)
    }
}

#[test]
fn a_merged_collective_is_an_error_naming_the_pass() {
    golden("effects-merged-collective", after(&MergeEqualCollectives, GRAPH));
}

#[test]
fn a_dropped_collective_is_an_error_naming_the_pass() {
    golden("effects-dropped-collective", after(&KeepOnlyWhatOutputsRead, GRAPH));
}

#[test]
fn reordered_collectives_are_an_error_naming_the_pass() {
    let src = "%x: f32[4] = input 0\n%a: f32[4] = all_reduce_sum %x\n%b: f32[4] = all_reduce_mean %x\n\
               return %a, %b\n";
    golden("effects-reordered-collectives", after(&SwapTwoCollectives, src));
}

#[test]
fn a_changed_collective_is_an_error_naming_the_pass() {
    golden("effects-changed-collective", after(&ChangeACollective, GRAPH));
}

/// Every pass of the pipeline, and the whole pipeline, keeps the three
/// collectives of rank 1's graph (the check runs after each pass).
#[test]
fn every_pass_keeps_the_recorded_collectives() {
    for info in super::super::REGISTRY {
        if info.name() == "autodiff" {
            continue;
        }
        let g = parse(GRAPH).unwrap();
        let out = super::super::run_single(info.name(), g, Default::default())
            .unwrap_or_else(|e| panic!("{}: {e}", info.name()));
        assert_eq!(out.effects().len(), 3, "{}", info.name());
    }
    let out = super::super::optimize(parse(GRAPH).unwrap(), &Default::default()).unwrap();
    let seqs: Vec<_> = out.effects().iter().map(|&id| out.node(id).op.effect_seq()).collect();
    assert_eq!(seqs, vec![Some(0), Some(1), Some(2)]);
    let schedule = out.tables().schedule.clone().unwrap();
    let order: Vec<_> = schedule.iter().filter_map(|&id| out.node(id).op.effect_seq()).collect();
    assert_eq!(order, vec![0, 1, 2]);
}
