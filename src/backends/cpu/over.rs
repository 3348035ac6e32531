//! Fused kernels run: into fresh or arena bytes, or over the variables
//! they update.
//!
//! An optimizer's update is one fused node per parameter whose outputs
//! (the parameter, and as extra outputs its moments) the `assign` pass
//! marked to be written over the operands that hold their old values
//! (`over=[..]`); the memory pass places them over those variables'
//! inputs ([`crate::ir::Placement::OverInput`]) when nothing else needs the
//! old bytes, and the context gives the buffers up to the run when no
//! tensor reads them (`context/donate.rs`).
//!
//! **Ownership.** The run takes such an operand out of its values when
//! the fused node is its last reader ([`Step::over`], `run.rs`'s
//! `take_operands`), so the step holds the buffer by value. It writes the
//! output into that buffer's own elements only when `Storage::exclusive`
//! proves nobody else holds the storage (`Arc::get_mut`: no user tensor,
//! no other run, no other value of this run, no view); else, and when the
//! buffer is not a dense `[0..n]` run of the output's type, the output
//! gets fresh bytes and the buffer is read as an ordinary operand, which
//! is the same value (the copying semantics). Each output decides alone.
//!
//! **Order of reads and writes.** The kernel reads an operand it writes
//! over from the output's own block, copying the block out before any
//! step of the block writes it ([`FusedKernel::run_over`]), so every
//! element is read before it is overwritten, whatever the block size or
//! the thread that runs it.

use super::arena::Arena;
use super::exec::{CpuExecutable, Place, Step};
use super::launch::{host_out, Dest};
use super::storage::{dispatch, Elem, Out, Storage};
use super::CpuBuffer;
use crate::ir::{FusedBody, HostData};
use crate::{Error, Result};
use std::sync::Arc;

/// An operand buffer a fused step writes one of its outputs over.
pub(super) struct Target {
    /// The operand slot it came from.
    slot: usize,
    /// The body output written over it (0 the value, 1.. extras).
    output: usize,
    buffer: CpuBuffer,
}

impl CpuExecutable {
    /// Runs fused step `step`, writing each output that [`Step::over`]
    /// marks over its operand where the run holds that operand's only
    /// reference (see the module docs); the rest as [`Self::fused`] does.
    pub(super) fn fused_over(
        &self,
        step: &Step,
        args: Vec<CpuBuffer>,
        arena: Option<&Arc<Arena>>,
        extras: &mut Vec<(usize, CpuBuffer)>,
    ) -> Result<CpuBuffer> {
        let node = self.plan.graph.node(step.id);
        let crate::ir::Op::Fused(body) = &node.op else {
            return Err(Error::Backend(format!("cpu: {} writes over operands but is not fused", step.id)));
        };
        let kernel = self
            .fused
            .get(&step.id)
            .ok_or_else(|| Error::Backend(format!("cpu: fused {} has no compiled kernel", step.id)))?;
        let mut args: Vec<Option<CpuBuffer>> = args.into_iter().map(Some).collect();
        let mut targets = Vec::new();
        for &(slot, output) in &step.over {
            let Some(out) = body.outputs().get(output).map(|&o| body.graph().node(o)) else { continue };
            let allowed = match output {
                0 => kernel.can_run_in_place(slot),
                j => kernel.can_write_extra_over(j, slot),
            };
            let Some(buffer) = args.get_mut(slot).filter(|_| allowed) else { continue };
            // `exclusive` last: it marks the storage's contents new.
            let fits = buffer.as_mut().is_some_and(|b| {
                b.layout.is_contiguous()
                    && b.layout.offset == 0
                    && b.shape() == &out.shape
                    && b.dtype() == out.dtype
                    && Storage::exclusive(&mut b.storage, out.shape.numel()).is_some()
            });
            if fits {
                if let Some(buffer) = buffer.take() {
                    targets.push(Target { slot, output, buffer });
                }
            }
        }
        // An output 0 placed in place of an arena operand reads it from its output.
        let arena_slot = match step.place {
            Place::InPlaceOf { slot, .. } => Some(slot),
            _ => None,
        };
        let operands: Vec<Option<&CpuBuffer>> =
            args.iter().enumerate().map(|(k, a)| a.as_ref().filter(|_| Some(k) != arena_slot)).collect();
        self.fused(step, body, &operands, targets, arena, extras)
    }

    /// Runs fused step `step` on `operands` (`None` for each one read from
    /// an output: the operand of [`Place::InPlaceOf`], and each target's),
    /// writing each output of `targets` into that buffer's elements (they
    /// are exclusive, dense, of the output's type), output 0 where its
    /// place says otherwise, and the extra outputs into bytes of their
    /// own, which it pushes to `extras` as (step position, value).
    pub(super) fn fused(
        &self,
        step: &Step,
        body: &FusedBody,
        operands: &[Option<&CpuBuffer>],
        mut targets: Vec<Target>,
        arena: Option<&Arc<Arena>>,
        extras: &mut Vec<(usize, CpuBuffer)>,
    ) -> Result<CpuBuffer> {
        let node = self.plan.graph.node(step.id);
        let kernel = self
            .fused
            .get(&step.id)
            .ok_or_else(|| Error::Backend(format!("cpu: fused {} has no compiled kernel", step.id)))?;
        let lost = |what: &str| Error::Backend(format!("cpu: fused {}: {what}", step.id));
        let count = body.outputs().len();
        // Where each output goes: its target's elements, or a destination.
        let mut over: Vec<Option<usize>> = vec![None; count];
        for t in &targets {
            if let Some(o) = over.get_mut(t.output) {
                *o = Some(t.slot);
            }
        }
        let in_place = match (over[0], step.place) {
            (Some(slot), _) | (None, Place::InPlaceOf { slot, .. }) => Some(slot),
            _ => None,
        };
        let none = vec![None; count - 1];
        let slots = self.extras.get(&step.id).unwrap_or(&none);
        let mut dests = Vec::with_capacity(count - 1);
        for (j, at) in slots.iter().enumerate() {
            let out = body.graph().node(body.outputs()[j + 1]);
            if over[j + 1].is_some() {
                dests.push((*at, None));
                continue;
            }
            // An output no step reads still gets bytes to be written.
            let (id, place) = at.map_or((step.id, Place::Auto), |p| (self.steps[p].id, self.steps[p].place));
            let d = dispatch!(out.dtype, E => Dest::new::<E>(place, &out.shape, arena, id)?);
            dests.push((*at, Some(d)));
        }
        let mut fresh = None;
        {
            // Each target's elements by output, borrowed apart (distinct buffers).
            let mut by_output: Vec<Option<&mut HostData>> = (0..count).map(|_| None).collect();
            for t in &mut targets {
                let n = body.graph().node(body.outputs()[t.output]).shape.numel();
                let data = Storage::exclusive(&mut t.buffer.storage, n)
                    .ok_or_else(|| lost("a target's storage is shared"))?;
                *by_output.get_mut(t.output).ok_or_else(|| lost("a target of no output"))? = Some(data);
            }
            let mut by_output = by_output.into_iter();
            let own = by_output.next().flatten();
            let mut outs = Vec::with_capacity(count - 1);
            for ((_, d), target) in dests.iter_mut().zip(by_output) {
                outs.push(match (d, target) {
                    (Some(d), _) => d.out(),
                    (None, Some(h)) => host_out(h),
                    (None, None) => return Err(lost("an output has no bytes")),
                });
            }
            let extra_over = &over[1..];
            match own {
                Some(h) => dispatch!(node.dtype, T => {
                    let v = T::vec_mut(h).ok_or_else(|| lost("the target is of another dtype"))?;
                    kernel.run_over(operands, in_place, v.as_mut_slice(), outs, extra_over)?
                }),
                None => {
                    fresh = Some(dispatch!(node.dtype, T => self.write::<T>(step, arena, |out: Out<'_>| {
                        kernel.run_over(operands, in_place, out.get::<T>()?, outs, extra_over)
                    }))?);
                }
            }
        }
        let mut value = fresh;
        let mut written: Vec<Option<CpuBuffer>> = (0..count).map(|_| None).collect();
        for t in targets {
            match t.output {
                0 => value = Some(t.buffer),
                o => written[o] = Some(t.buffer),
            }
        }
        for (j, (at, d)) in dests.into_iter().enumerate() {
            let buffer = match (d, written[j + 1].take()) {
                (Some(d), _) => d.finish(&self.stats)?,
                (None, Some(b)) => b,
                (None, None) => return Err(lost("an output was not written")),
            };
            if let Some(at) = at {
                extras.push((at, buffer));
            }
        }
        value.ok_or_else(|| lost("its value was not written"))
    }
}
