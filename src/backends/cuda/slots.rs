//! Graph input slots: the addresses a captured graph reads its inputs
//! from (a graph bakes in every address).
//!
//! # Adopted, not copied
//!
//! When a plan is captured, an input bound to the same allocation as on
//! the run before (the weights of a model, a KV cache written in place)
//! has its slot *adopt* that allocation: a plan that reads the same
//! buffers every call copies nothing and holds no second copy of them,
//! however many plans read them. Before, every captured plan copied every
//! input into a slot of its own: GPT-2's weights once per prefill length
//! and once for the decode step, 3.5x the weights' bytes. An input that
//! changed since the run before (a batch of data) gets a private slot
//! from the start: its old buffer is often still held when the next call
//! comes (the context collects dead tensors after a run), and an adopted
//! slot would then have to let go of it and capture again.
//!
//! A slot holds its allocation as *staging bytes*, not as a value:
//! [`DeviceAlloc::value_holders`] does not count slots, so several plans
//! adopting one variable's buffer do not make each other's in-place
//! writes (`write_at`, donation) think that someone reads it.
//!
//! # When the bound buffer moves
//!
//! A call that binds another allocation (the variable was given a new
//! value) finds the slot holding the old one. When nobody else holds
//! that allocation any more (no value, no other plan's slot, no output
//! set), the slot keeps it and becomes *private*: the bound buffer is
//! copied in, and from then on a copy happens only when the bound
//! contents change, by `replay.rs`'s memo, as for a slot allocated fresh.
//! A training step whose parameters move every step takes this path
//! (one copy per parameter per step, until its updates are written in
//! place). When someone else still holds it (a snapshot of the old
//! weights, or another plan that adopted them too), the slot lets go,
//! the graphs baked on it are dropped, that run is eager, and the next
//! captures a private slot. A slot never adopts again once it let go, so
//! this costs one capture per slot, not one per call.
//!
//! A donated input's slot (written over, `graph.rs`) is written only when
//! nobody but the run reads it as a value; other plans' slots may share
//! it, since they hold staging bytes and compare allocations, not
//! contents.

use super::memory::DeviceAlloc;
use std::sync::Arc;

/// One input slot of a captured plan.
pub(super) struct Slot {
    alloc: Arc<DeviceAlloc>,
    /// Allocated for this plan alone and never handed out, or adopted
    /// and since held by no one else: the contents memo applies.
    private: bool,
}

impl Slot {
    /// A slot that is `alloc` itself, shared with whoever holds it.
    pub fn adopt(alloc: &Arc<DeviceAlloc>) -> Slot {
        let alloc = alloc.clone();
        alloc.slot_taken();
        Slot { alloc, private: false }
    }

    /// A slot of its own.
    pub fn private(alloc: DeviceAlloc) -> Slot {
        let alloc = Arc::new(alloc);
        alloc.slot_taken();
        Slot { alloc, private: true }
    }

    pub fn alloc(&self) -> &Arc<DeviceAlloc> {
        &self.alloc
    }

    /// Whether the bytes are this plan's alone, so the contents memo
    /// says what they hold.
    pub fn is_private(&self) -> bool {
        self.private
    }

    /// Makes the slot private: the caller checked that no one else holds
    /// its allocation (no value, no other plan's slot, no output set), and
    /// it is never handed out, so nothing but this plan writes it.
    pub fn privatize(&mut self) {
        self.private = true;
    }

    /// How many hold the slot's bytes as a value, not counting `bound`
    /// when it is the very allocation (the run's own input).
    pub fn readers_besides(&self, bound: &Arc<DeviceAlloc>) -> usize {
        let holders = DeviceAlloc::value_holders(&self.alloc);
        if Arc::ptr_eq(&self.alloc, bound) {
            holders.saturating_sub(1)
        } else {
            holders
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.alloc.slot_released();
    }
}
