//! Turning groups into fused bodies and a new graph; the cost model the
//! note reports.

use super::group::{Class, Grouping, Index};
use super::PassCtx;
use crate::ir::{FusedBody, Graph, Node, NodeId, Op, RegionId};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// A built body and the outer values (positions) its input slots read.
struct Built {
    body: Arc<FusedBody>,
    inputs: Vec<usize>,
}

/// Builds every group's body, then the new graph in topological order; a
/// body the contract rejects (a fusion bug) leaves its group unfused, with
/// a note. Returns the graph and how many fused nodes it holds.
pub(super) fn build(
    graph: &Graph,
    ix: &Index,
    grouping: &Grouping,
    cx: &mut PassCtx,
) -> Result<(Graph, usize)> {
    let mut built: Vec<Option<Built>> = Vec::with_capacity(grouping.groups.len());
    for group in &grouping.groups {
        let mut members = group.members.clone();
        members.sort_unstable();
        match body(graph, ix, &grouping.dup, &members, group.root) {
            Ok(b) => built.push(Some(b)),
            Err(message) => {
                cx.note(format!("group at {} left unfused: {message}", ix.order[group.root]));
                tracing::warn!(root = %ix.order[group.root], reason = %message, "fusion built an illegal body");
                built.push(None);
            }
        }
    }
    let fused_group = |i: usize| grouping.group_of[i].and_then(|g| Some((g, built[g].as_ref()?)));
    let mut out = graph.empty_like();
    let mut map: Vec<Option<NodeId>> = vec![None; ix.len()];
    let mapped = |map: &[Option<NodeId>], i: usize| {
        map[i].ok_or_else(|| Error::Verify(format!("fusion: {} is used before it is built", ix.order[i])))
    };
    let mut fused = 0;
    for i in 0..ix.len() {
        let node = graph.node(ix.order[i]);
        let new = match fused_group(i) {
            Some((g, _)) if grouping.groups[g].root != i => continue,
            Some((_, b)) => {
                let operands = b.inputs.iter().map(|&o| mapped(&map, o)).collect::<Result<Vec<_>>>()?;
                fused += 1;
                cx.rewrite();
                let op = Op::Fused(b.body.clone());
                out.add_unchecked(Node { op, ..node.clone() }, &operands)
            }
            None => {
                let operands = ix.operands[i].iter().map(|&o| mapped(&map, o)).collect::<Result<Vec<_>>>()?;
                out.add_unchecked(node.clone(), &operands)
            }
        };
        map[i] = Some(new);
    }
    let outputs =
        graph.outputs().iter().map(|o| ix.position(*o).and_then(|i| map[i])).collect::<Option<Vec<_>>>();
    out.set_outputs(outputs.ok_or_else(|| Error::Verify("fusion: an output was not built".into()))?);
    // Views and fulls that every reader took into its body are dead now.
    let live: std::collections::HashSet<NodeId> = out.topo_order().into_iter().collect();
    for id in out.node_ids() {
        if !live.contains(&id) {
            out.remove(id);
        }
    }
    Ok((out, fused))
}

/// The body of one group: members in topological order, reading leaves
/// (a `full`, views over anything outside) built inside and every other
/// outside value as the next `input k`.
fn body(
    graph: &Graph,
    ix: &Index,
    dup: &[bool],
    members: &[usize],
    root: usize,
) -> std::result::Result<Built, String> {
    let mut b = BodyBuilder { graph, ix, dup, body: Graph::new(), inner: HashMap::new(), inputs: Vec::new() };
    for &m in members {
        let operands: Vec<NodeId> = ix.operands[m].iter().map(|&o| b.value(o)).collect();
        let id = b.add(m, &operands);
        b.inner.insert(m, id);
    }
    let out = b.inner[&root];
    b.body.set_outputs(vec![out]);
    let body = FusedBody::new(b.body)?;
    Ok(Built { body: Arc::new(body), inputs: b.inputs })
}

struct BodyBuilder<'a, 'g> {
    graph: &'a Graph,
    ix: &'a Index<'g>,
    /// Widening casts every reader recomputes (rebuilt like views).
    dup: &'a [bool],
    body: Graph,
    /// Body node of each outer position already in the body.
    inner: HashMap<usize, NodeId>,
    /// Outer position read by each input slot.
    inputs: Vec<usize>,
}

impl BodyBuilder<'_, '_> {
    /// A copy of outer node `i` in the body (no region: the fused node has it).
    fn add(&mut self, i: usize, operands: &[NodeId]) -> NodeId {
        let node = self.graph.node(self.ix.order[i]);
        self.body.add_unchecked(Node { region: RegionId::ROOT, ..node.clone() }, operands)
    }

    /// The body value for outer position `o` (not a member, or already
    /// built): a `full` copied in, a chain of views and duplicated
    /// widening casts rebuilt over its base, or an input slot. Iterative, so a long view chain cannot overflow.
    fn value(&mut self, o: usize) -> NodeId {
        let mut chain = Vec::new();
        let mut cur = o;
        let mut base = loop {
            if let Some(&id) = self.inner.get(&cur) {
                break id;
            }
            match self.ix.class[cur] {
                _ if self.dup[cur] => {
                    chain.push(cur);
                    cur = self.ix.operands[cur][0];
                }
                Class::View => {
                    chain.push(cur);
                    cur = self.ix.operands[cur][0];
                }
                Class::Leaf if matches!(self.graph.node(self.ix.order[cur]).op, Op::Full(_)) => {
                    let id = self.add(cur, &[]);
                    self.inner.insert(cur, id);
                    break id;
                }
                _ => {
                    let node = self.graph.node(self.ix.order[cur]);
                    let slot = Node {
                        op: Op::Input(self.inputs.len() as u32),
                        shape: node.shape.clone(),
                        dtype: node.dtype,
                        region: RegionId::ROOT,
                    };
                    self.inputs.push(cur);
                    let id = self.body.add_unchecked(slot, &[]);
                    self.inner.insert(cur, id);
                    break id;
                }
            }
        };
        while let Some(v) = chain.pop() {
            base = self.add(v, &[base]);
            self.inner.insert(v, base);
        }
        base
    }
}

/// Kernels and bytes moved, as the module docs define them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cost {
    pub kernels: usize,
    pub bytes: u64,
}

pub(super) fn cost(graph: &Graph) -> Cost {
    let bytes_of = |id: NodeId| {
        let n = graph.node(id);
        (n.shape.numel() * n.dtype.size()) as u64
    };
    let mut cost = Cost { kernels: 0, bytes: 0 };
    for id in graph.topo_order() {
        let op = &graph.node(id).op;
        if op.is_source() || op.is_view() {
            continue;
        }
        cost.kernels += 1;
        cost.bytes += bytes_of(id);
        let mut read: Vec<NodeId> = Vec::new();
        for mut base in graph.operands(id) {
            while graph.node(base).op.is_view() {
                base = graph.operands(base)[0];
            }
            if !matches!(graph.node(base).op, Op::Full(_)) && !read.contains(&base) {
                read.push(base);
                cost.bytes += bytes_of(base);
            }
        }
    }
    cost
}

/// `1088 B`, `12.3 kB`, `3.4 MB`, `5.6 GB` (powers of 1000; exact bytes
/// below 10 kB, where test graphs live).
pub(super) fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..=9_999 => format!("{bytes} B"),
        10_000..=999_999 => format!("{:.1} kB", b / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.1} GB", b / 1e9),
    }
}
