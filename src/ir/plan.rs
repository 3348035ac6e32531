//! A plan: what the passes hand a backend.

use super::{Graph, NodeId, Op};

/// An optimized graph and the order to run it in. Backends compile and run
/// plans; they never change them.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The optimized graph (its outputs are the plan's results).
    pub graph: Graph,
    /// Every node the outputs need, operands before users.
    pub order: Vec<NodeId>,
    /// How many input slots the plan binds per run (`Op::Input(k)`, `k < inputs`).
    pub inputs: usize,
    /// How many random streams the plan reads per run (`Op::Random { stream }`).
    pub random_streams: usize,
}

impl Plan {
    /// A plan that runs `graph` in its topological order.
    pub fn new(graph: Graph) -> Plan {
        let order = graph.topo_order();
        let mut inputs = 0;
        let mut random_streams = 0;
        for &id in &order {
            match graph.node(id).op {
                Op::Input(k) => inputs = inputs.max(k as usize + 1),
                Op::Random { stream, .. } => random_streams = random_streams.max(stream as usize + 1),
                _ => {}
            }
        }
        Plan { graph, order, inputs, random_streams }
    }
}
