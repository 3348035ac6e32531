//! CUDA graphs: a plan's second run captures all its streams into one
//! graph, and later runs replay it (`KILN_CUDA_GRAPHS=0` or
//! `Context::with_cuda_graphs(false)` turns this off).
//!
//! # Inputs
//!
//! A graph bakes in every address, so inputs go through *static input
//! slots*. A slot adopts the bound buffer's allocation when the graph is
//! captured, so an input bound again as the same buffer (weights, a KV
//! cache written in place) is never copied (`slots.rs` says when a slot
//! copies, becomes private or lets go). A private slot copies the bound
//! buffer in on stream 0 before a replay, unless it already holds a copy
//! of the very same bytes. "The same bytes" is the buffer's
//! [`Contents`](crate::backends::Contents), not its allocation: an output
//! set's allocations are rewritten by every replay that reuses the set,
//! and each such replay hands its outputs out with new contents
//! (`replay.rs` says why, and lists every cache keyed by a buffer).
//!
//! # Outputs
//!
//! A value the user can still read must never be overwritten by a later
//! replay. Each graph writes one *output set* (an allocation per output
//! slot), and hands out those very allocations; a replay uses a set only
//! when nobody else holds any of its buffers any more. While every set is
//! held, a new set is captured (up to `replay::MAX_SETS` graphs per plan), and
//! beyond that the run is eager with fresh outputs. A loop that drops
//! each result before the next run replays one graph; a training step,
//! whose inputs are the parameters its last run wrote (held by their
//! variables, so that set stays busy), alternates between two sets and
//! copies those inputs into its slots each step (they are new bytes); a
//! loop that keeps results alive costs one graph per set, then eager
//! launches. We chose this over copying outputs out of
//! fixed slots (which doubles the output bytes of every run, the whole
//! cost of a bandwidth-bound kernel) and over re-pointing graph nodes per
//! run (a host cost per kernel).
//!
//! # Inputs written over
//!
//! A plan that writes an output over an input (`write_at` into a
//! variable, `Program::donated`) writes it over that input's slot, and the
//! slot's allocation itself is handed out as the output. The next call
//! binds that very allocation again (the variable's new value), and the
//! replay copies nothing: a KV cache updated every decode step makes no
//! input copy at all. The slot is written only when nobody else can read
//! its old bytes as a value: bound again as the run's own buffer (held by
//! nothing but slots and the run), or held by slots alone (so the bound
//! buffer is copied in first). Otherwise, when someone still holds the
//! bytes the slot has (a snapshot of the cache), the run is eager and
//! writes over the run's own buffer or a copy of it (`outputs.rs`).
//!
//! # Why the first run is eager
//!
//! Capturing and instantiating costs more than one eager launch, and a
//! plan read once never pays it; the eager run also loads every library
//! kernel lazily, outside any capture. If capture fails, kiln says why
//! once (a `tracing` warning), runs the plan eagerly from then on, and
//! stays correct. A capture that fails or panics half way is always
//! ended, so the capture stream never stays in capture mode.

use super::device::{raw, LaunchState};
use super::exec::CudaExecutable;
use super::memory::DeviceAlloc;
use super::replay::{Next, Replays};
use super::slots::Slot;
use super::CudaBuffer;
use crate::{Error, Result};
use cudarc::driver::{result, sys, CudaGraph, CudaStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// One captured graph and the outputs it writes.
struct OutputSet {
    outs: Vec<Arc<DeviceAlloc>>,
    graph: CudaGraph,
}

/// The graph state of one executable.
pub(crate) struct Graphs {
    replays: Replays,
    /// Static input slots; those of donated inputs (`Program::donated`)
    /// are handed out as the outputs written over them (see "Inputs
    /// written over").
    slots: Vec<Option<Slot>>,
    /// Slots that let go of an allocation someone held: they never adopt
    /// again (`slots.rs`).
    released: Vec<bool>,
    /// The allocation each input was bound to on the run before: a
    /// capture adopts only an input bound to the same one twice running
    /// (`slots.rs`).
    last: Vec<Weak<DeviceAlloc>>,
    sets: Vec<OutputSet>,
}

/// What a replay wrote: the output set, and per input slot the
/// allocation an output was written over (`Output::OverInput`).
pub(crate) struct Replayed {
    pub outs: Vec<Arc<DeviceAlloc>>,
    pub over: Vec<Option<Arc<DeviceAlloc>>>,
}

// SAFETY: CudaGraph holds raw driver handles; it is only used under the
// executable's lock and the device's launch lock.
unsafe impl Send for Graphs {}

/// An open capture on a stream: ended when dropped if nobody ended it, so
/// an error or a panic while enqueueing never leaves the stream capturing
/// (every later capture on it would fail).
struct Capturing<'s> {
    stream: &'s Arc<CudaStream>,
    open: bool,
}

impl Capturing<'_> {
    fn end(mut self) -> std::result::Result<Option<CudaGraph>, cudarc::driver::DriverError> {
        self.open = false;
        self.stream.end_capture(sys::CUgraphInstantiate_flags(0))
    }
}

impl Drop for Capturing<'_> {
    fn drop(&mut self) {
        if self.open {
            // SAFETY: the stream is capturing (begun by this guard's maker);
            // the half-captured graph is destroyed uninstantiated.
            unsafe {
                if let Ok(graph) = result::stream::end_capture(raw(self.stream)) {
                    if !graph.is_null() {
                        let _ = result::graph::destroy(graph);
                    }
                }
            }
        }
    }
}

impl Graphs {
    /// Graph state for a plan of `inputs` inputs; `enabled` as the
    /// context's [`crate::backends::CompileOptions::cuda_graphs`] says.
    pub fn new(inputs: usize, enabled: bool) -> Graphs {
        Graphs {
            replays: Replays::new(inputs, enabled),
            slots: (0..inputs).map(|_| None).collect(),
            released: vec![false; inputs],
            last: (0..inputs).map(|_| Weak::new()).collect(),
            sets: Vec::new(),
        }
    }

    /// Counts an eager run.
    pub fn ran_eagerly(&mut self) {
        self.replays.ran();
    }

    /// Replays (capturing first if needed) and returns the outputs, or
    /// `None` when this run must be eager.
    pub fn replay(
        &mut self,
        exe: &CudaExecutable,
        ls: &LaunchState,
        inputs: &[&CudaBuffer],
    ) -> Result<Option<Replayed>> {
        // A set is free when its buffers are held by nothing but the set
        // (and input slots, which hold bytes, not values).
        let free = self.sets.iter().map(|s| s.outs.iter().all(|o| DeviceAlloc::value_holders(o) == 1));
        let next = self.replays.next(free);
        let stable: Vec<bool> = inputs
            .iter()
            .zip(&mut self.last)
            .map(|(b, last)| {
                let same = Weak::ptr_eq(last, &Arc::downgrade(&b.alloc));
                *last = Arc::downgrade(&b.alloc);
                same
            })
            .collect();
        if next != Next::Eager && !self.slots_usable(exe, inputs) {
            self.release_held_slots(exe, inputs);
            return Ok(None);
        }
        let set = match next {
            Next::Eager => return Ok(None),
            Next::Replay(k) => k,
            Next::Capture => match self.capture(exe, ls, inputs, &stable) {
                Ok(set) => {
                    self.sets.push(set);
                    exe.dev.stats.graph_captures.fetch_add(1, Ordering::Relaxed);
                    self.replays.captured()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "CUDA graph capture failed; this plan runs eagerly from now on");
                    self.replays.disable();
                    return Ok(None);
                }
            },
        };
        let s0 = raw(&ls.streams[0]);
        let mut over = vec![None; inputs.len()];
        for (k, b) in inputs.iter().enumerate() {
            let Some(slot) = self.slots[k].as_mut() else { continue };
            let donated = exe.program.donated.contains(&(k as u32));
            if donated {
                over[k] = Some(slot.alloc().clone());
            }
            // `slots_usable` checked that nobody reads a slot written here.
            let copy = if Arc::ptr_eq(slot.alloc(), &b.alloc) {
                false
            } else if donated {
                true
            } else if slot.is_private() {
                self.replays.must_copy(k, b.contents)
            } else {
                // Adopted and bound to another allocation: held by this
                // slot alone (`slot_usable`), so it is private from now on.
                slot.privatize();
                self.replays.must_copy(k, b.contents)
            };
            if copy {
                // SAFETY: both allocations have the input's bytes; stream 0
                // orders the copy after the buffer was written and before the
                // replay reads the slot.
                let copied =
                    unsafe { result::memcpy_dtod_async(slot.alloc().ptr(), b.ptr(), b.bytes() as usize, s0) };
                if let Err(e) = copied {
                    self.replays.forget(k);
                    return Err(Error::Backend(format!(
                        "cuda: copying input {k} into its graph slot: {e:?}"
                    )));
                }
                exe.dev.stats.graph_input_copies.fetch_add(1, Ordering::Relaxed);
            }
        }
        let set = &self.sets[set];
        // SAFETY: the graph was instantiated from this executable's
        // enqueueing, over memory that lives as long as the executable.
        unsafe { result::graph::launch(set.graph.cu_graph_exec(), s0) }
            .map_err(|e| Error::Backend(format!("cuda: replaying the plan's graph: {e:?}")))?;
        self.replays.ran();
        exe.dev.stats.graph_replays.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Replayed { outs: set.outs.clone(), over }))
    }

    /// Whether a replay may use every slot as it stands (see `slots.rs`):
    /// a donated input's slot is written over, so nobody but this run may
    /// read it as a value; an adopted slot bound to another allocation
    /// becomes private, so nobody else may hold it at all (no value, no
    /// other plan's slot, no output set).
    fn slots_usable(&self, exe: &CudaExecutable, inputs: &[&CudaBuffer]) -> bool {
        (0..self.slots.len()).all(|k| self.slot_usable(exe, inputs, k))
    }

    fn slot_usable(&self, exe: &CudaExecutable, inputs: &[&CudaBuffer], k: usize) -> bool {
        let Some(slot) = &self.slots[k] else { return true };
        let Some(b) = inputs.get(k) else { return false };
        if exe.program.donated.contains(&(k as u32)) {
            slot.readers_besides(&b.alloc) == 0
        } else if !slot.is_private() && !Arc::ptr_eq(slot.alloc(), &b.alloc) {
            Arc::strong_count(slot.alloc()) == 1
        } else {
            true
        }
    }

    /// Lets go of every slot `slots_usable` refused (someone holds the
    /// bytes: a snapshot of what a replay wrote there, old weights that
    /// another plan adopted too), with the graphs that bake its address:
    /// this run is eager, and the next captures with a new private slot.
    /// So a value held for long costs one capture, not an eager run per
    /// call.
    fn release_held_slots(&mut self, exe: &CudaExecutable, inputs: &[&CudaBuffer]) {
        let mut released = false;
        for k in 0..self.slots.len() {
            if !self.slot_usable(exe, inputs, k) {
                self.slots[k] = None;
                self.released[k] = true;
                self.replays.forget(k);
                released = true;
            }
        }
        if released {
            self.sets.clear();
            self.replays.forget_sets();
        }
    }

    /// An input slot that has none adopts the bound buffer when the run
    /// before bound the same one (a donated one only when the run holds it
    /// alone), unless it let go before (`slots.rs`).
    fn capture(
        &mut self,
        exe: &CudaExecutable,
        ls: &LaunchState,
        bound: &[&CudaBuffer],
        stable: &[bool],
    ) -> Result<OutputSet> {
        for (k, want) in exe.program.inputs.iter().enumerate() {
            let Some((shape, dtype)) = want else { continue };
            if self.slots[k].is_some() {
                continue;
            }
            let bytes = shape.numel() as u64 * dtype.size() as u64;
            let adoptable = bound.get(k).filter(|b| {
                let donated = exe.program.donated.contains(&(k as u32));
                !self.released[k]
                    && stable.get(k) == Some(&true)
                    && b.bytes() == bytes
                    && (!donated || DeviceAlloc::value_holders(&b.alloc) == 1)
            });
            self.slots[k] = Some(match adoptable {
                Some(b) => {
                    self.replays.forget(k);
                    Slot::adopt(&b.alloc)
                }
                None => Slot::private(exe.dev.pool.alloc(bytes)?),
            });
        }
        let outs: Vec<Arc<DeviceAlloc>> = exe
            .program
            .out_slots
            .iter()
            .map(|&b| exe.dev.pool.alloc(b).map(Arc::new))
            .collect::<Result<_>>()?;
        let inputs = self.slots.iter().map(|s| s.as_ref().map_or(0, |s| s.alloc().ptr())).collect();
        let b = exe.bindings(inputs, outs.iter().map(|a| a.ptr()).collect());
        let n = exe.program.streams as usize;
        let streams = &ls.capture[..n];
        let _span = tracing::debug_span!("capture", steps = exe.program.steps.len(), streams = n).entered();
        let _in_progress = super::device::CaptureInProgress::begin();
        streams[0]
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| Error::Backend(format!("cuda: beginning capture: {e:?}")))?;
        let capturing = Capturing { stream: &streams[0], open: true };
        let enqueued = exe.enqueue(ls, streams, &b);
        let ended = capturing.end();
        enqueued?;
        let graph = ended
            .map_err(|e| Error::Backend(format!("cuda: ending capture: {e:?}")))?
            .ok_or_else(|| Error::Backend("cuda: the capture produced no graph".into()))?;
        Ok(OutputSet { outs, graph })
    }
}
