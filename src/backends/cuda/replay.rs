//! Which bytes a replayed plan reads and writes: the bookkeeping of CUDA
//! graph replay that does not touch a device, shared by the real backend
//! (`graph.rs`) and its CPU emulator (`emulate/`), so the emulator makes
//! exactly the decisions the GPU makes and the suite tests them without
//! one.
//!
//! # The two caches this keeps, and what they are keyed by
//!
//! A captured graph bakes in every address, so a replay reads its inputs
//! from *static input slots* and writes its outputs into one of its
//! *output sets* (see `graph.rs`). Both are caches whose correctness
//! rests on an identity:
//!
//! - **Input slots** skip the copy of an input whose bytes the slot already
//!   holds. They are keyed by the bound buffer's [`Contents`], never by
//!   its allocation: an allocation is rewritten whenever a replay reuses
//!   the output set it belongs to, and a slot keyed by allocation then
//!   keeps serving the bytes of the run before (the stale-input bug of
//!   issue 17). A `Contents` is handed out afresh every time bytes are
//!   written into an allocation, so equal contents mean equal bytes.
//! - **Output sets** are reused only when nobody holds any buffer of the
//!   set (the caller counts references: a held buffer's bytes must never
//!   change). Each reuse hands its outputs out with new `Contents`.
//!
//! Nothing else in a replay is keyed by a buffer: the arena, scratch and
//! parameter block belong to the executable, whose runs are serialized and
//! stream-ordered.

use crate::backends::Contents;

/// Graphs (output sets) per plan at most.
pub(crate) const MAX_SETS: usize = 3;

/// How the next run of a plan goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Launch every kernel with fresh outputs (the first run, graphs off,
    /// a failed capture, or every output set still held).
    Eager,
    /// Replay captured set `k` (nobody holds its outputs).
    Replay(usize),
    /// Capture a new set, then replay it.
    Capture,
}

/// The replay decisions of one executable (see the module docs). `K` is
/// what identifies the bytes bound to an input: a [`Contents`] for dense
/// device buffers; the emulator adds the CPU buffer's layout.
#[derive(Debug)]
pub(crate) struct Replays<K = Contents> {
    enabled: bool,
    runs: u64,
    /// What each input slot holds a copy of (`None`: nothing yet).
    holds: Vec<Option<K>>,
    sets: usize,
}

impl<K: PartialEq> Replays<K> {
    /// The state of a plan with `inputs` input slots; `enabled` as the
    /// context's `cuda_graphs` option says.
    pub fn new(inputs: usize, enabled: bool) -> Replays<K> {
        Replays { enabled, runs: 0, holds: (0..inputs).map(|_| None).collect(), sets: 0 }
    }

    /// The next run's kind. `free` says, per captured set in order, whether
    /// nobody holds any of its outputs.
    pub fn next(&self, free: impl IntoIterator<Item = bool>) -> Next {
        if !self.enabled || self.runs == 0 {
            return Next::Eager;
        }
        match free.into_iter().position(|f| f) {
            Some(k) => Next::Replay(k),
            None if self.sets < MAX_SETS => Next::Capture,
            None => Next::Eager,
        }
    }

    /// Records that a new set was captured (it is set `sets - 1`).
    pub fn captured(&mut self) -> usize {
        self.sets += 1;
        self.sets - 1
    }

    /// Forgets every captured set (their graphs were dropped to give an
    /// input slot a new allocation): the next run captures anew.
    pub fn forget_sets(&mut self) {
        self.sets = 0;
    }

    /// Turns replay off for good (a capture failed; the plan stays correct
    /// eagerly).
    pub fn disable(&mut self) {
        self.enabled = false;
    }

    /// Records a finished run, eager or replayed.
    pub fn ran(&mut self) {
        self.runs += 1;
    }

    /// Whether input `k`, now bound to bytes identified by `key`, must be
    /// copied into its slot before a replay; records that the slot holds
    /// them from now on. The caller copies when this says so.
    pub fn must_copy(&mut self, k: usize, key: K) -> bool {
        match self.holds.get_mut(k) {
            Some(held) if held.as_ref() == Some(&key) => false,
            Some(held) => {
                *held = Some(key);
                true
            }
            None => true,
        }
    }

    /// Forgets what input slot `k` holds (its copy failed half way).
    pub fn forget(&mut self, k: usize) {
        if let Some(h) = self.holds.get_mut(k) {
            *h = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_run_is_eager_then_sets_are_captured_up_to_the_cap() {
        let mut r: Replays = Replays::new(1, true);
        assert_eq!(r.next([]), Next::Eager);
        r.ran();
        assert_eq!(r.next([]), Next::Capture);
        assert_eq!(r.captured(), 0);
        assert_eq!(r.next([false]), Next::Capture);
        r.captured();
        assert_eq!(r.next([false, true]), Next::Replay(1));
        r.captured();
        assert_eq!(r.next([false, false, false]), Next::Eager);
        r.disable();
        assert_eq!(r.next([true, true, true]), Next::Eager);
    }

    #[test]
    fn a_slot_copies_whenever_the_contents_differ_even_in_the_same_allocation() {
        let mut r: Replays = Replays::new(2, true);
        let (a, b) = (Contents::fresh(), Contents::fresh());
        assert!(r.must_copy(0, a));
        assert!(!r.must_copy(0, a));
        // The same allocation rewritten by a replay has new contents.
        assert!(r.must_copy(0, b));
        assert!(r.must_copy(1, b));
        r.forget(1);
        assert!(r.must_copy(1, b));
        assert!(!r.must_copy(1, b));
    }
}
