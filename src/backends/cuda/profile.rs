//! Per-step times of a profiled CUDA plan: a timing event before and after
//! every step's launches, on the step's stream, and one at the start of
//! the run on stream 0 (`Context::with_profiling`, see `crate::profile`).
//!
//! Profiled plans are compiled with CUDA graphs off (`backend.rs`), so
//! every run is enqueued eagerly and the events sit around real launches;
//! each run's times carry a note saying so. The events of a step are
//! re-recorded by every run; the executable's run lock (one enqueue of a
//! plan at a time) keeps a run's records from racing another's, and the
//! times are read after the run finished: runs are non-blocking, but the
//! context waits for a profiled run before it returns from the launch and
//! calls `Executable::take_profile` (`Context::launch_job`). Two threads
//! running one profiled plan at once may read each other's times (never
//! unsound: reading an event waits for it); profile from one thread.
//! Other streams of the run are forked from stream 0 after the start
//! event, so every step's events come after it.

use super::device::raw;
use crate::ir::Plan;
use crate::profile::{Recorder, RunTimes};
use crate::{Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::sync::Arc;

/// A CUDA event that records time (the backend's ordering events do not).
/// A timing event, holding its context (see `device::Event` for why).
struct TimingEvent(sys::CUevent, Arc<CudaContext>);

// SAFETY: a CUevent is a driver handle and the driver API is thread-safe;
// records and reads are ordered by the run lock (see the module docs).
unsafe impl Send for TimingEvent {}
// SAFETY: as for `Send`.
unsafe impl Sync for TimingEvent {}

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("cuda: profiling: {what}: {e:?}"))
}

impl TimingEvent {
    fn new(ctx: &Arc<CudaContext>) -> Result<TimingEvent> {
        ctx.bind_to_thread().map_err(|e| err("binding the context", e))?;
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(|e| TimingEvent(e, ctx.clone()))
            .map_err(|e| err("creating an event", e))
    }

    fn record(&self, stream: &CudaStream) -> Result<()> {
        // SAFETY: a live event and a stream of the bound context.
        unsafe { result::event::record(self.0, raw(stream)) }.map_err(|e| err("recording an event", e))
    }

    /// Milliseconds from `start` to this event; both were recorded and
    /// have completed.
    fn since(&self, start: &TimingEvent) -> Result<f32> {
        // SAFETY: both events are live and were recorded (see `take`).
        unsafe {
            result::event::synchronize(self.0).map_err(|e| err("waiting for an event", e))?;
            result::event::elapsed(start.0, self.0).map_err(|e| err("reading an event", e))
        }
    }
}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        // SAFETY: the event is ours; the driver defers destruction until
        // pending records complete.
        let _ = self.1.bind_to_thread();
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// The events of a profiled plan, and its labels (see the module docs).
pub(crate) struct StepTimes {
    recorder: Recorder,
    start: TimingEvent,
    /// Per program step: (before, after).
    steps: Vec<(TimingEvent, TimingEvent)>,
    /// The plan node of each program step.
    nodes: Vec<crate::ir::NodeId>,
    /// Whether a run has recorded the events since the last `take`.
    recorded: std::sync::atomic::AtomicBool,
}

impl StepTimes {
    pub fn new(ctx: &Arc<CudaContext>, plan: &Plan, program: &super::program::Program) -> Result<StepTimes> {
        let steps = program
            .steps
            .iter()
            .map(|_| Ok((TimingEvent::new(ctx)?, TimingEvent::new(ctx)?)))
            .collect::<Result<_>>()?;
        Ok(StepTimes {
            recorder: Recorder::new(plan),
            start: TimingEvent::new(ctx)?,
            steps,
            nodes: program.steps.iter().map(|s| s.node).collect(),
            recorded: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Marks the start of a run on stream 0.
    pub fn begin(&self, s0: &CudaStream) -> Result<()> {
        self.recorded.store(true, std::sync::atomic::Ordering::Relaxed);
        self.start.record(s0)
    }

    /// Before (`after == false`) or after step `i`'s launches, on its stream.
    pub fn mark(&self, i: usize, stream: &CudaStream, after: bool) -> Result<()> {
        match self.steps.get(i) {
            Some((b, a)) => (if after { a } else { b }).record(stream),
            None => Ok(()),
        }
    }

    /// The last run's step times (waits for its events).
    pub fn take(&self) -> Option<RunTimes> {
        if !self.recorded.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let nodes = self
            .steps
            .iter()
            .zip(&self.nodes)
            .filter_map(|((b, a), &id)| {
                let start = b.since(&self.start).ok()? as f64 * 1000.0;
                let end = a.since(&self.start).ok()? as f64 * 1000.0;
                self.recorder.time(id, start, end - start)
            })
            .collect();
        Some(RunTimes {
            plan: self.recorder.plan,
            nodes,
            note: Some("CUDA events around every launch; profiled runs are launched eagerly, not captured into CUDA graphs".into()),
        })
    }
}
