//! In-place writes: which buffers a run may write over.
//!
//! A plan that writes an output over an input (`Placement::OverInput`:
//! a `write_at` into a variable, such as a KV cache, or an update the
//! `assign` pass marked) lists those input
//! slots (`Plan::donated`, [`Executable::donated`]). For each run the
//! context decides whether it *gives* the slot's buffer up, and the
//! backend writes in place only when it then holds the only reference to
//! the bytes ([`Executable::launch_owned`]); otherwise it writes over a
//! copy, which is exactly the copying semantics. Two checks, because
//! values are held two ways:
//!
//! - **Nodes.** A recorded tensor reads a realized value through its
//!   `buffer` node, by id. The context gives a buffer up only when no node
//!   will be able to read it once the run has stored its results: for a
//!   read, the buffer node is unreachable from every root (live tensors,
//!   variables, gradients, other threads' runs) without passing through
//!   the run's targets (which become operand-less buffers); for a
//!   captured step's replay, the variable's value node has no user, no
//!   handle and no other root. Given up, the buffer leaves the context's
//!   table and goes to the run alone.
//! - **References.** The same bytes may also be held under another id (a
//!   captured step records each variable's value under a fresh id), by a
//!   run in flight, or by a host read. The backend counts the references
//!   when the run starts (`Arc::get_mut` on the CPU, the allocation's
//!   count on CUDA), after the context dropped its own.
//!
//! A buffer given up belongs to the run: if the run fails, the old value
//! is gone with it. When the launch itself fails (the CPU runs the plan
//! as it launches), a later read of something that needed the old value
//! (the assignment, still pending) reports the run's error again
//! (`State::lost`); a run that fails on the device later leaves its error
//! in the buffers it wrote, which every reader of the new value gets. A second thread that reads a pending value
//! of the same variable while the run is launching can hit that too;
//! reading a variable while another thread writes it is a race in the
//! program either way.
//!
//! [`Executable::donated`]: crate::backends::Executable::donated
//! [`Executable::launch_owned`]: crate::backends::Executable::launch_owned

use super::{State, VarId};
use crate::backends::Buffer;
use crate::ir::{BufferId, NodeId, Op};

impl State {
    /// The slots of `donated` (input slots of a read's plan, bound to
    /// `inputs`) whose buffers no node reads once `targets` are realized
    /// (see the module docs).
    pub(super) fn givable(&self, targets: &[NodeId], inputs: &[BufferId], donated: &[u32]) -> Vec<u32> {
        if donated.is_empty() {
            return Vec::new();
        }
        let mut roots: Vec<NodeId> = self.live.iter().filter_map(|w| w.upgrade()).map(|n| n.id).collect();
        roots.extend(self.ws.roots());
        roots.extend_from_slice(&self.in_flight);
        let kept = self.graph.reachable_from_stopping(&roots, targets);
        let still_read = |b: BufferId| {
            self.graph
                .node_ids()
                .into_iter()
                .any(|id| kept.contains(&id) && matches!(self.graph.node(id).op, Op::Buffer(x) if x == b))
        };
        donated.iter().copied().filter(|&k| inputs.get(k as usize).is_some_and(|&b| !still_read(b))).collect()
    }

    /// Takes the buffers of `slots` (ids in `inputs`) out of the
    /// context's table, for a run that writes over them.
    pub(super) fn give_up(&mut self, inputs: &[BufferId], slots: &[u32], bound: &mut [Buffer]) {
        for &k in slots {
            let Some(id) = inputs.get(k as usize) else { continue };
            if let Some(b) = self.buffers.remove(id) {
                bound[k as usize] = b;
            }
        }
    }

    /// The value of variable `v`, taken out of the context for a captured
    /// step's run to write over, when nothing but the variable reads it:
    /// its buffer node has no user, no live handle, and is no other root
    /// (another variable's value or a gradient). `None` otherwise.
    pub(crate) fn give_up_var(&mut self, v: VarId) -> Option<Buffer> {
        let node = self.ws.value(v);
        let Op::Buffer(id) = self.graph.node(node).op else { return None };
        let read_elsewhere = !self.graph.users(node).is_empty()
            || self.in_flight.contains(&node)
            || self.live.iter().any(|w| w.upgrade().is_some_and(|n| n.id == node))
            || self.ws.roots().filter(|&r| r == node).count() > 1;
        if read_elsewhere {
            return None;
        }
        self.buffers.remove(&id)
    }
}
