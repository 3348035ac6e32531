//! An elementwise body moved onto another domain of as many elements.
//!
//! Fusion may leave a reader and its producer on two shapes of the same
//! elements: GPT-2's loss gradient is computed in the logits' `[B, T, V]`
//! (the reshape autodiff put after it was moved onto its operands, see
//! `fusion/sink.rs`), while the loss's row kernel reduces `[B·T, V]`. The
//! fused contract wants one domain, so the two could not merge, and the
//! gradient read the logits back from memory.
//!
//! An elementwise op computes each element from the same position of its
//! operands, and a row-major reshape keeps every position, so an
//! elementwise body over `D` equals, element for element, the same body
//! over `D'` (`numel(D) = numel(D')`) whose leaves are reshaped to `D'`:
//! compute nodes only change their shape, a leaf `reshape` to `D` of a
//! value of shape `D'` is that value itself, any other leaf reshape goes
//! straight to `D'`, and another leaf view gets a `reshape` to `D'`.
//! [`redomain`] builds that body when every new leaf reshape is a view of
//! its operand's dense layout (no copy at run time), and leaves the
//! decision to merge to [`super::merge`].

use crate::backends::layout::Layout;
use crate::ir::{FusedBody, FusedKind, Graph, Node, NodeId, Op, Shape};
use std::collections::HashMap;

/// `body` (elementwise, every output of its one shape, nothing written
/// over an operand) computed over `domain` instead; `None` if it is not
/// such a body, has another element count, or a leaf would need a copy.
pub(super) fn redomain(body: &FusedBody, domain: &Shape) -> Option<FusedBody> {
    let g = body.graph();
    let own = g.node(body.output()).shape.clone();
    let plain = *body.kind() == FusedKind::Elementwise
        && own != *domain
        && own.numel() == domain.numel()
        && body.outputs().iter().all(|&o| g.node(o).shape == own)
        && (0..body.outputs().len()).all(|j| body.output_over(j).is_none());
    if !plain {
        return None;
    }
    let mut b =
        Builder { g, own: &own, domain, out: Graph::new(), leaves: HashMap::new(), over: HashMap::new() };
    for id in g.topo_order() {
        let n = g.node(id);
        if n.op.is_elementwise() {
            if n.shape != own {
                return None;
            }
            let mut operands = Vec::new();
            for o in g.operands(id) {
                operands.push(b.over_domain(o)?);
            }
            let new = b.out.add_unchecked(Node { shape: domain.clone(), ..n.clone() }, &operands);
            b.over.insert(id, new);
        } else if !matches!(n.op, Op::Input(_) | Op::Full(_)) && !n.op.is_view() {
            return None;
        }
    }
    let mut outputs = Vec::new();
    for &o in body.outputs() {
        outputs.push(b.over_domain(o)?);
    }
    b.out.set_outputs(outputs);
    FusedBody::new(b.out).ok()
}

/// The body being built (see [`redomain`]).
struct Builder<'a> {
    g: &'a Graph,
    own: &'a Shape,
    domain: &'a Shape,
    out: Graph,
    /// Leaves (inputs, constants, their views) copied as they are, with
    /// their layout over dense operands.
    leaves: HashMap<NodeId, (NodeId, Layout)>,
    /// Values of the body's own shape, as nodes over `domain`.
    over: HashMap<NodeId, NodeId>,
}

impl Builder<'_> {
    /// Leaf `id` copied unchanged (its chain first), with its layout.
    fn leaf(&mut self, id: NodeId) -> Option<(NodeId, Layout)> {
        if let Some(l) = self.leaves.get(&id) {
            return Some(l.clone());
        }
        let n = self.g.node(id).clone();
        let l = match &n.op {
            Op::Input(_) | Op::Full(_) => {
                let layout = Layout::contiguous(n.shape.clone());
                (self.out.add_unchecked(n, &[]), layout)
            }
            op if op.is_view() => {
                let (from, layout) = self.leaf(self.g.operands(id)[0])?;
                let layout = view_layout(&layout, op)?;
                (self.out.add_unchecked(n, &[from]), layout)
            }
            _ => return None,
        };
        self.leaves.insert(id, l.clone());
        Some(l)
    }

    /// Value `id` (of the body's own shape) over the new domain.
    fn over_domain(&mut self, id: NodeId) -> Option<NodeId> {
        if let Some(&v) = self.over.get(&id) {
            return Some(v);
        }
        let n = self.g.node(id).clone();
        let v = match &n.op {
            Op::Full(_) => self.out.add_unchecked(Node { shape: self.domain.clone(), ..n }, &[]),
            // reshape(x) of an x already over the domain: x itself.
            Op::Reshape(_) if self.g.node(self.g.operands(id)[0]).shape == *self.domain => {
                self.leaf(self.g.operands(id)[0])?.0
            }
            // Any other reshape goes straight to the domain.
            Op::Reshape(_) => {
                let (from, layout) = self.leaf(self.g.operands(id)[0])?;
                layout.reshape(self.domain)?;
                self.reshaped(from, &n)
            }
            _ => {
                let (from, layout) = self.leaf(id)?;
                layout.reshape(self.domain)?;
                self.reshaped(from, &n)
            }
        };
        debug_assert_eq!(self.g.node(id).shape, *self.own);
        self.over.insert(id, v);
        Some(v)
    }

    /// `reshape(from)` to the domain, typed as `like`.
    fn reshaped(&mut self, from: NodeId, like: &Node) -> NodeId {
        let node = Node { op: Op::Reshape(self.domain.clone()), shape: self.domain.clone(), ..like.clone() };
        self.out.add_unchecked(node, &[from])
    }
}

/// `from` seen through view `op` (`None` for a reshape that is not a view
/// of it).
fn view_layout(from: &Layout, op: &Op) -> Option<Layout> {
    match op {
        Op::Reshape(t) => from.reshape(t),
        Op::Permute(p) => Some(from.permute(p)),
        Op::Expand(t) => Some(from.expand(t)),
        Op::Slice { dim, start, step, len } => Some(from.slice(*dim, *start, *step, *len)),
        _ => None,
    }
}
