//! CUDA graphs: a plan's second run captures all its streams into one
//! graph, and later runs replay it (`KILN_CUDA_GRAPHS=0` or
//! `Context::with_cuda_graphs(false)` turns this off).
//!
//! # Inputs
//!
//! A graph bakes in every address, so inputs go through *static input
//! slots*: before a replay each bound buffer is copied into its slot on
//! stream 0, unless the slot already holds that very buffer (buffers never
//! change once made, so an allocation id identifies their contents). A
//! loop that reads the same weights every iteration copies them once.
//!
//! # Outputs
//!
//! A value the user can still read must never be overwritten by a later
//! replay. Each graph writes one *output set* (an allocation per output
//! slot), and hands out those very allocations; a replay uses a set only
//! when nobody else holds any of its buffers any more. While every set is
//! held, a new set is captured (up to [`MAX_SETS`] graphs per plan), and
//! beyond that the run is eager with fresh outputs. A training loop that
//! drops each step's results before the next step replays one graph and
//! copies nothing; a loop that keeps results alive costs one graph per
//! set, then eager launches. We chose this over copying outputs out of
//! fixed slots (which doubles the output bytes of every run, the whole
//! cost of a bandwidth-bound kernel) and over re-pointing graph nodes per
//! run (a host cost per kernel).
//!
//! # Why the first run is eager
//!
//! Capturing and instantiating costs more than one eager launch, and a
//! plan read once never pays it; the eager run also loads every library
//! kernel lazily, outside any capture. If capture fails, kiln says why
//! once (a `tracing` warning), runs the plan eagerly from then on, and
//! stays correct.

use super::device::{raw, LaunchState};
use super::exec::CudaExecutable;
use super::memory::DeviceAlloc;
use super::CudaBuffer;
use crate::{Error, Result};
use cudarc::driver::{result, sys, CudaGraph};
use std::sync::Arc;

/// Graphs per plan at most (each with its own output set).
pub(crate) const MAX_SETS: usize = 3;

/// One captured graph and the outputs it writes.
struct OutputSet {
    outs: Vec<Arc<DeviceAlloc>>,
    graph: CudaGraph,
}

/// The graph state of one executable.
pub(crate) struct Graphs {
    enabled: bool,
    runs: u64,
    slots: Vec<Option<(DeviceAlloc, u64)>>,
    sets: Vec<OutputSet>,
}

// SAFETY: CudaGraph holds raw driver handles; it is only used under the
// executable's lock and the device's launch lock.
unsafe impl Send for Graphs {}

impl Graphs {
    /// Graph state for a plan of `inputs` inputs; `enabled` as the
    /// context's [`crate::backends::CompileOptions::cuda_graphs`] says.
    pub fn new(inputs: usize, enabled: bool) -> Graphs {
        Graphs { enabled, runs: 0, slots: (0..inputs).map(|_| None).collect(), sets: Vec::new() }
    }

    /// Counts an eager run.
    pub fn ran_eagerly(&mut self) {
        self.runs += 1;
    }

    /// Graphs captured so far (tests read it through the executable).
    #[allow(dead_code)]
    pub fn captured(&self) -> usize {
        self.sets.len()
    }

    /// Replays (capturing first if needed) and returns the outputs, or
    /// `None` when this run must be eager.
    pub fn replay(
        &mut self,
        exe: &CudaExecutable,
        ls: &LaunchState,
        inputs: &[&CudaBuffer],
    ) -> Result<Option<Vec<Arc<DeviceAlloc>>>> {
        if !self.enabled || self.runs == 0 {
            return Ok(None);
        }
        let free = self.sets.iter().position(|s| s.outs.iter().all(|o| Arc::strong_count(o) == 1));
        let set = match free {
            Some(i) => i,
            None if self.sets.len() < MAX_SETS => match self.capture(exe, ls) {
                Ok(set) => {
                    self.sets.push(set);
                    self.sets.len() - 1
                }
                Err(e) => {
                    tracing::warn!(error = %e, "CUDA graph capture failed; this plan runs eagerly from now on");
                    self.enabled = false;
                    return Ok(None);
                }
            },
            None => return Ok(None),
        };
        let s0 = raw(&ls.streams[0]);
        for (k, b) in inputs.iter().enumerate() {
            let Some((slot, holds)) = self.slots[k].as_mut() else { continue };
            if *holds != b.alloc.id() {
                // SAFETY: both allocations have the input's bytes; stream 0
                // orders the copy after the buffer was written and before the
                // replay reads the slot.
                unsafe { result::memcpy_dtod_async(slot.ptr(), b.ptr(), b.bytes() as usize, s0) }.map_err(
                    |e| Error::Backend(format!("cuda: copying input {k} into its graph slot: {e:?}")),
                )?;
                *holds = b.alloc.id();
            }
        }
        let set = &self.sets[set];
        // SAFETY: the graph was instantiated from this executable's
        // enqueueing, over memory that lives as long as the executable.
        unsafe { result::graph::launch(set.graph.cu_graph_exec(), s0) }
            .map_err(|e| Error::Backend(format!("cuda: replaying the plan's graph: {e:?}")))?;
        self.runs += 1;
        Ok(Some(set.outs.clone()))
    }

    /// Captures the plan into a graph writing a new output set.
    fn capture(&mut self, exe: &CudaExecutable, ls: &LaunchState) -> Result<OutputSet> {
        for (k, want) in exe.program.inputs.iter().enumerate() {
            let Some((shape, dtype)) = want else { continue };
            if self.slots[k].is_none() {
                let bytes = shape.numel() as u64 * dtype.size() as u64;
                self.slots[k] = Some((exe.dev.pool.alloc(bytes)?, 0));
            }
        }
        let outs: Vec<Arc<DeviceAlloc>> = exe
            .program
            .out_slots
            .iter()
            .map(|&b| exe.dev.pool.alloc(b).map(Arc::new))
            .collect::<Result<_>>()?;
        let inputs = self.slots.iter().map(|s| s.as_ref().map_or(0, |(a, _)| a.ptr())).collect();
        let b = exe.bindings(inputs, outs.iter().map(|a| a.ptr()).collect());
        let n = exe.program.streams as usize;
        let streams = &ls.capture[..n];
        let _span = tracing::debug_span!("capture", steps = exe.program.steps.len(), streams = n).entered();
        streams[0]
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| Error::Backend(format!("cuda: beginning capture: {e:?}")))?;
        let enqueued = exe.enqueue(ls, streams, &b);
        let ended = streams[0].end_capture(sys::CUgraphInstantiate_flags(0));
        enqueued?;
        let graph = ended
            .map_err(|e| Error::Backend(format!("cuda: ending capture: {e:?}")))?
            .ok_or_else(|| Error::Backend("cuda: the capture produced no graph".into()))?;
        Ok(OutputSet { outs, graph })
    }
}
