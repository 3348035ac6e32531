//! Reading values: extract the subgraph the reads need, compile it (or
//! find it in the cache), run it, and turn the read nodes into buffers.

use super::{Context, State};
use crate::backends::{Buffer, Executable, RngArgs};
use crate::ir::{self, BufferId, Graph, NodeId, Op, Plan};
use crate::{passes, Location, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Compiled plans by the text of the graph they were compiled from. The
/// text holds ops, shapes, dtypes, constants and regions but no buffer
/// identities or random stream numbers (extraction renumbers both), so the
/// same computation on new data hits.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: HashMap<String, Arc<dyn Executable>>,
}

/// A subgraph ready to compile: its inputs are realized buffers, its
/// random streams are renumbered from 0.
pub(crate) struct Extracted {
    pub(crate) graph: Graph,
    pub(crate) inputs: Vec<BufferId>,
    pub(crate) streams: Vec<u64>,
}

/// Copies what `targets` need out of the recording graph. The walk is the
/// graph's structural order, so a loop that records the same computation
/// each iteration extracts the same graph each time.
pub(crate) fn extract(graph: &Graph, targets: &[NodeId]) -> Extracted {
    let mut out = graph.empty_like();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let mut inputs: Vec<BufferId> = Vec::new();
    let mut streams: Vec<u64> = Vec::new();
    for id in graph.topo_order_from(targets) {
        let mut node = graph.node(id).clone();
        node.op = match node.op {
            Op::Buffer(b) => {
                let slot = inputs.iter().position(|&x| x == b).unwrap_or_else(|| {
                    inputs.push(b);
                    inputs.len() - 1
                });
                Op::Input(slot as u32)
            }
            Op::Random { dist, stream } => {
                let slot = streams.iter().position(|&x| x == stream).unwrap_or_else(|| {
                    streams.push(stream);
                    streams.len() - 1
                });
                Op::Random { dist, stream: slot as u64 }
            }
            op => op,
        };
        let operands: Vec<NodeId> = graph.operands(id).iter().map(|o| map[o]).collect();
        map.insert(id, out.add_unchecked(node, &operands));
    }
    out.set_outputs(targets.iter().map(|t| map[t]).collect());
    Extracted { graph: out, inputs, streams }
}

/// What a read computes: the nodes read, then the pending variable values
/// and gradients (assignments recorded before a read run in its plan).
struct Targets {
    all: Vec<NodeId>,
    /// How many of `all` were asked for.
    read: usize,
}

fn with_pending(state: &State, targets: &[NodeId]) -> Targets {
    let mut all = targets.to_vec();
    for id in state.ws.pending(&state.graph) {
        if !all.contains(&id) {
            all.push(id);
        }
    }
    Targets { all, read: targets.len() }
}

impl Context {
    /// Computes the given nodes, and every pending variable value and
    /// gradient in the same plan, and makes each a buffer node. Returns
    /// the targets' buffers, in order.
    pub(crate) fn realize_nodes(&self, targets: &[NodeId]) -> Result<Vec<Buffer>> {
        let mut state = self.state();
        let targets = with_pending(&state, targets);
        let mut outputs = self.run_locked(&mut state, &targets.all)?;
        for (&target, buffer) in targets.all.iter().zip(&outputs) {
            if matches!(state.graph.node(target).op, Op::Buffer(_)) {
                continue;
            }
            let id = state.add_buffer(buffer.clone());
            state.graph.node_mut(target).op = Op::Buffer(id);
            state.graph.set_operands(target, &[]);
        }
        state.collect();
        outputs.truncate(targets.read);
        Ok(outputs)
    }

    fn run_locked(&self, state: &mut State, targets: &[NodeId]) -> Result<Vec<Buffer>> {
        // Already realized targets need no plan.
        if let Some(ready) = targets
            .iter()
            .map(|&t| match state.graph.node(t).op {
                Op::Buffer(b) => state.buffers.get(&b).cloned(),
                _ => None,
            })
            .collect::<Option<Vec<Buffer>>>()
        {
            return Ok(ready);
        }
        let extracted = extract(&state.graph, targets);
        let key = format!(
            ";; {} tf32={} graphs={} passes={}\n{}",
            state.options,
            state.compile.tf32,
            state.compile.cuda_graphs,
            state.config.as_ref().map(|c| c.enabled_text()).unwrap_or_default(),
            ir::text::print(&extracted.graph)
        );
        let executable = match state.cache.plans.get(&key) {
            Some(exe) => {
                state.cache_hits += 1;
                exe.clone()
            }
            None => {
                let _span = tracing::debug_span!("compile", nodes = extracted.graph.len()).entered();
                let mut config = state.config.clone()?;
                config.options = state.options;
                let optimized = passes::optimize(extracted.graph, &config)?;
                let exe = self.inner.backend.compile_with(Arc::new(Plan::new(optimized)), &state.compile)?;
                state.compiles += 1;
                state.cache.plans.insert(key, exe.clone());
                exe
            }
        };
        let inputs: Vec<Buffer> = extracted
            .inputs
            .iter()
            .map(|b| {
                state.buffers.get(b).cloned().ok_or_else(|| {
                    crate::Error::Backend(format!("buffer {} was freed while still read", b.0))
                })
            })
            .collect::<Result<_>>()?;
        let rng = RngArgs { seed: state.seed, streams: extracted.streams };
        let _span = tracing::debug_span!("run", backend = self.inner.backend.name()).entered();
        executable.run(&inputs, &rng)
    }

    /// The optimized graph the given tensors would compile to (what
    /// [`Context::explain`] prints). Compiles nothing for the backend and
    /// leaves the cache alone.
    #[track_caller]
    pub fn optimized_graph(&self, tensors: &[&crate::Tensor]) -> Result<Graph> {
        self.optimized_graph_at(tensors, Location::caller())
    }

    fn optimized_graph_at(&self, tensors: &[&crate::Tensor], location: Location) -> Result<Graph> {
        let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
        let (extracted, config) = {
            let state = self.state();
            let targets = with_pending(&state, &targets).all;
            (
                extract(&state.graph, &targets),
                state.config.clone().map(|mut c| {
                    c.options = state.options;
                    c
                }),
            )
        };
        let config = config?;
        passes::optimize(extracted.graph, &config)
    }

    /// The optimized text IR of the graph that computes `tensors`: one line
    /// per node, `%id: dtype[shape] = op operands attributes @region`, then
    /// `return`. Realized values appear as `input k`. Pending assignments
    /// (and held gradients) are part of the graph a read would run, so
    /// they follow the tensors in the `return` line.
    #[track_caller]
    pub fn explain(&self, tensors: &[&crate::Tensor]) -> Result<String> {
        Ok(ir::text::print(&self.optimized_graph_at(tensors, Location::caller())?))
    }

    /// Computes several tensors in one plan (sharing their common work) and
    /// keeps their values, so later reads and ops start from them.
    #[track_caller]
    pub fn realize(&self, tensors: &[&crate::Tensor]) -> Result<()> {
        let location = Location::caller();
        let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
        self.realize_nodes(&targets).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    fn extract_of(ctx: &Context, t: &crate::Tensor) -> Extracted {
        let id = t.node_in(ctx, crate::Location::caller()).expect("live tensor");
        extract(&ctx.state().graph, &[id])
    }

    #[test]
    fn extraction_renumbers_random_streams_so_iterations_share_a_plan() {
        let ctx = Context::cpu();
        let first = ctx.randn([3]) + ctx.randn([3]);
        let second = ctx.randn([3]) + ctx.randn([3]);
        let (a, b) = (extract_of(&ctx, &first), extract_of(&ctx, &second));
        assert_eq!(ir::text::print(&a.graph), ir::text::print(&b.graph));
        assert_eq!((a.streams, b.streams), (vec![0, 1], vec![2, 3]));
    }

    #[test]
    fn extraction_keeps_different_constants_apart() {
        let ctx = Context::cpu();
        let x = ctx.randn([3]);
        let (a, b) = (extract_of(&ctx, &(&x * 2.0)), extract_of(&ctx, &(&x * 3.0)));
        assert_ne!(ir::text::print(&a.graph), ir::text::print(&b.graph));
    }

    #[test]
    fn context_and_tensor_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Context>();
        send_sync::<crate::Tensor>();
    }
}
