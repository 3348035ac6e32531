//! A plan with a weight prologue: two compiled plans run as one
//! executable, the prologue only when the bytes it reads changed.
//!
//! The `weight-prologue` pass moves work that reads only variables (the
//! joined copy of q, k and v's weights, autocast's casts of f32 weights)
//! out of a plan into a prologue, and the plan reads the prologue's
//! outputs, the *kept values*, from input slots of their own
//! (`passes/weight_prologue.rs`). This executable binds the caller's
//! inputs as the plan did before the split: it takes the identity of each
//! input the prologue reads (its [`Contents`] and layout: a number made
//! afresh whenever bytes are written into an allocation, never reused in a
//! process), launches the prologue when those differ from the identities
//! its kept values were made from, and then launches the plan on the
//! caller's inputs and the kept values. Nothing here depends on the
//! backend: both plans are compiled by it, and ordered as any two plans
//! are (the plan reads the kept values' buffers, which carry the
//! prologue's completion; on CUDA its kernels wait for it on the device).
//!
//! A prologue run that fails leaves nothing kept: its error reaches the
//! plan's outputs (they read its buffers), and the next call runs it again.
//! The kept values live as long as this executable (the context's plan
//! cache holds it): a variable assigned a new value is read afresh at the
//! next call, and the old kept values are dropped before the prologue
//! writes new ones, so a prologue that runs every call (weights updated
//! between inference calls) reuses its output set on CUDA.

use super::{Buffer, Contents, DeviceStats, Executable, Launched, Layout, RngArgs};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// What identifies the elements a buffer holds (see the module docs).
type Identity = (Contents, Layout);

/// The kept values and the identities of the inputs they were made from.
struct Kept {
    made_from: Vec<Identity>,
    values: Vec<Buffer>,
}

/// A compiled plan and its compiled prologue (see the module docs).
pub(crate) struct WithPrologue {
    prologue: Arc<dyn Executable>,
    plan: Arc<dyn Executable>,
    /// For each prologue input, the caller's input slot it reads.
    reads: Vec<u32>,
    /// The caller's input slots (the plan reads the kept values after them).
    inputs: usize,
    /// The plan's donated slots among the caller's.
    donated: Vec<u32>,
    kept: Mutex<Option<Kept>>,
    stats: Arc<DeviceStats>,
}

impl WithPrologue {
    /// `plan` reads the caller's `inputs` slots and then the prologue's
    /// outputs; `reads[j]` is the caller's slot that prologue input `j` is.
    pub(crate) fn new(
        prologue: Arc<dyn Executable>,
        plan: Arc<dyn Executable>,
        reads: Vec<u32>,
        inputs: usize,
        stats: Arc<DeviceStats>,
    ) -> WithPrologue {
        let donated = plan.donated().iter().copied().filter(|&k| (k as usize) < inputs).collect();
        WithPrologue { prologue, plan, reads, inputs, donated, kept: Mutex::new(None), stats }
    }

    /// The kept values for these inputs: those kept, or the prologue's
    /// outputs of a run launched now.
    fn kept_values(&self, inputs: &[Buffer]) -> Result<Vec<Buffer>> {
        if inputs.len() != self.inputs {
            return Err(Error::Backend(format!(
                "a plan with a weight prologue was given {} inputs for {} slots",
                inputs.len(),
                self.inputs
            )));
        }
        let read: Vec<&Buffer> = self.reads.iter().map(|&k| &inputs[k as usize]).collect();
        let made_from: Vec<Identity> = read.iter().map(|b| b.identity()).collect();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = kept.as_ref() {
            let failed = k.values.iter().any(|v| matches!(v.completion().try_settle(), Some(Err(_))));
            if k.made_from == made_from && !failed {
                return Ok(k.values.clone());
            }
        }
        // Dropped first: the prologue's output set is then free to reuse.
        *kept = None;
        let _span = tracing::debug_span!("prologue", inputs = read.len()).entered();
        // Counted when launched, failed or not (on the CPU a run fails in
        // `launch`, on a GPU after it).
        self.stats.prologue_runs.fetch_add(1, Ordering::Relaxed);
        let launched =
            self.prologue.launch(&read.into_iter().cloned().collect::<Vec<_>>(), &RngArgs::default())?;
        let values = launched.outputs;
        *kept = Some(Kept { made_from, values: values.clone() });
        Ok(values)
    }
}

impl Executable for WithPrologue {
    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
        let mut all = inputs.to_vec();
        all.extend(self.kept_values(inputs)?);
        self.plan.run(&all, rng)
    }

    fn launch(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Launched> {
        let mut all = inputs.to_vec();
        all.extend(self.kept_values(inputs)?);
        self.plan.launch(&all, rng)
    }

    fn donated(&self) -> &[u32] {
        &self.donated
    }

    fn launch_owned(&self, inputs: Vec<Buffer>, rng: &RngArgs) -> Result<Launched> {
        let kept = self.kept_values(&inputs)?;
        let mut all = inputs;
        all.extend(kept);
        self.plan.launch_owned(all, rng)
    }

    /// The plan's times, after the prologue's on a call that ran it
    /// (marked `prologue`, numbered in the prologue's graph). Where the
    /// plan's times overlap the prologue's, the two were timed from their
    /// own starts (CUDA's start events; the CPU times both from the run's
    /// start, and its plan runs after the prologue): the plan's times
    /// then move to after the prologue's end, which the plan waited for.
    fn take_profile(&self, run_start: std::time::Instant) -> Option<crate::profile::RunTimes> {
        let prologue = self.prologue.take_profile(run_start);
        let mut times = self.plan.take_profile(run_start)?;
        let Some(prologue) = prologue.filter(|p| !p.nodes.is_empty()) else {
            return Some(times);
        };
        let end = prologue.nodes.iter().map(|n| n.start_us + n.dur_us).fold(0.0, f64::max);
        if times.nodes.iter().any(|n| n.start_us < end) {
            for n in &mut times.nodes {
                n.start_us += end;
            }
        }
        let mut nodes: Vec<_> =
            prologue.nodes.into_iter().map(|n| crate::profile::NodeTime { prologue: true, ..n }).collect();
        nodes.append(&mut times.nodes);
        times.nodes = nodes;
        Some(times)
    }
}
