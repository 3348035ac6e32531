//! Where a run's outputs are: fresh allocations or a captured set's
//! output slots, an input handed back as it is, or an input's allocation
//! written over (`Program::donated`: the run's own buffer when nobody
//! else holds it, a private copy otherwise; see `graph.rs` for replays).

use super::device::{raw, LaunchState};
use super::exec::CudaExecutable;
use super::memory::DeviceAlloc;
use super::program::Output;
use super::CudaBuffer;
use crate::backends::{Buffer, Contents};
use crate::runtime::Completion;
use crate::{Error, Result};
use cudarc::driver::result;
use std::sync::Arc;

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!("cuda: {msg}"))
}

impl CudaExecutable {
    /// The output buffers of a run from its output slots and the
    /// allocations written over inputs (`over`, per input slot). Every
    /// such allocation's bytes were just written, so its buffers get new
    /// [`Contents`] (the allocation may be a reused output set's); an
    /// input handed back is the input's bytes, unchanged.
    pub(super) fn outputs(
        &self,
        inputs: &[&CudaBuffer],
        outs: &[Arc<DeviceAlloc>],
        over: &[Option<Arc<DeviceAlloc>>],
        ready: &Completion,
    ) -> Result<Vec<Buffer>> {
        let written: Vec<Contents> = outs.iter().map(|_| Contents::fresh()).collect();
        self.program
            .outputs
            .iter()
            .map(|o| match o {
                Output::Input { k, shape } => inputs
                    .get(*k as usize)
                    .map(|b| {
                        let c = b.ready.clone();
                        Buffer::Cuda(CudaBuffer::new(
                            b.alloc.clone(),
                            shape.clone(),
                            b.dtype(),
                            b.contents,
                            c,
                        ))
                    })
                    .ok_or_else(|| bad("an output input is missing")),
                Output::OverInput { k, shape, dtype } => over
                    .get(*k as usize)
                    .and_then(Option::as_ref)
                    .map(|a| {
                        let c = ready.clone();
                        Buffer::Cuda(CudaBuffer::new(a.clone(), shape.clone(), *dtype, Contents::fresh(), c))
                    })
                    .ok_or_else(|| bad("an input written over is missing")),
                Output::Slot { slot, shape, dtype } => outs
                    .get(*slot as usize)
                    .map(|a| {
                        let contents = written[*slot as usize];
                        let c = ready.clone();
                        Buffer::Cuda(CudaBuffer::new(a.clone(), shape.clone(), *dtype, contents, c))
                    })
                    .ok_or_else(|| bad("an output slot is missing")),
            })
            .collect()
    }

    /// Where an eager run writes each donated input (`Program::donated`):
    /// the bound buffer's own allocation when nobody else can read it as
    /// a value (the run holds the only reference, besides graph input
    /// slots, which hold staging bytes: `slots.rs`), else a private copy
    /// made on stream 0. So a value someone holds never changes.
    pub(super) fn eager_over(
        &self,
        ls: &LaunchState,
        ins: &[&CudaBuffer],
    ) -> Result<Vec<Option<Arc<DeviceAlloc>>>> {
        let mut over = vec![None; ins.len()];
        for &k in &self.program.donated {
            let b = ins.get(k as usize).ok_or_else(|| bad(format!("donated input {k} is not bound")))?;
            let alloc = if DeviceAlloc::value_holders(&b.alloc) == 1 {
                b.alloc.clone()
            } else {
                let copy = Arc::new(self.dev.pool.alloc(b.bytes())?);
                // SAFETY: both allocations have the input's bytes; stream 0
                // orders the copy after the buffer was written and before
                // the run writes over the copy.
                unsafe {
                    result::memcpy_dtod_async(copy.ptr(), b.ptr(), b.bytes() as usize, raw(&ls.streams[0]))
                }
                .map_err(|e| bad(format!("copying input {k} to write over it: {e:?}")))?;
                copy
            };
            over[k as usize] = Some(alloc);
        }
        Ok(over)
    }

    /// Fresh output allocations, one per slot.
    pub(super) fn fresh_outs(&self) -> Result<Vec<Arc<DeviceAlloc>>> {
        self.program.out_slots.iter().map(|&b| self.dev.pool.alloc(b).map(Arc::new)).collect()
    }
}
