//! Completions on CUDA: an event recorded on stream 0 after a run, or on
//! the copy stream after an upload (`copy.rs`), and a run's index-check status copied back to pinned host
//! memory by the run itself, so nobody has to wait for the run to know
//! whether it found a bad index (see [`crate::runtime`]).

use super::device::{raw, Device, Event};
use crate::runtime::completion::{Check, Signal};
use crate::runtime::Completion;
use crate::{Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::sync::{Arc, Mutex};

/// A completion event and the context to bind before touching it (the
/// runtime thread and readers may never have bound it).
struct EventSignal {
    event: Arc<Event>,
    ctx: Arc<CudaContext>,
}

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("cuda: {what}: {e:?}"))
}

impl Signal for EventSignal {
    fn query(&self) -> Result<bool> {
        self.ctx.bind_to_thread().map_err(|e| err("binding the context", e))?;
        match self.event.query() {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(err("running the plan", e)),
        }
    }

    fn wait(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| err("binding the context", e))?;
        self.event.synchronize()
    }
}

/// Records the completion of everything enqueued on `stream`, stream 0,
/// so far (call under the launch lock, right after a run's work). `read`: the completions
/// of the buffers the work read, whose errors it inherits.
pub(crate) fn record(
    dev: &Device,
    stream: &CudaStream,
    check: Option<Check>,
    read: impl IntoIterator<Item = Completion>,
) -> Result<Completion> {
    let event = Arc::new(Event::new(&dev.ctx)?);
    event.record(raw(stream))?;
    // Blocks freed from now on were last used before this event.
    dev.pool.note_stream0(event.clone());
    let signal = EventSignal { event, ctx: dev.ctx.clone() };
    Ok(Completion::in_flight(Box::new(signal), check, read, dev.runtime.clone()))
}

/// The completion of an upload: its copy fence's event.
pub(crate) fn of_upload(dev: &Device, fence: &super::copy::CopyFence) -> Completion {
    let signal = EventSignal { event: fence.event(), ctx: dev.ctx.clone() };
    Completion::in_flight(Box::new(signal), None, [], dev.runtime.clone())
}

/// Page-locked host memory: the device copies into it asynchronously.
pub(crate) struct Pinned {
    ptr: *mut u64,
    words: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value; the device writes it
// only between a copy being enqueued and the run's event, and it is read
// only after that event (see `StatusCopies`).
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, words: usize) -> Result<Pinned> {
        ctx.bind_to_thread().map_err(|e| err("binding the context", e))?;
        // SAFETY: a fresh allocation of `words` u64s; flags 0 = portable off.
        let ptr = unsafe { result::malloc_host(words.max(1) * 8, 0) }
            .map_err(|e| err("allocating pinned host memory", e))? as *mut u64;
        Ok(Pinned { ptr, words, ctx: ctx.clone() })
    }

    fn words(&mut self) -> &mut [u64] {
        // SAFETY: `words` u64s allocated in `new`, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.words) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by `malloc_host`; no copy into it is pending
        // (a block is dropped only after its run's event, or unused).
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// Pinned blocks for a plan's index-check status, one per run in flight,
/// reused once a run's check has read its block.
#[derive(Default)]
pub(crate) struct StatusCopies {
    free: Arc<Mutex<Vec<Pinned>>>,
}

impl StatusCopies {
    /// Enqueues a copy of the `words`-word status block at `src` on
    /// `stream` (after the run) and returns the check that reads it once
    /// the run's completion has fired.
    pub(crate) fn copy_back(
        &self,
        dev: &Device,
        stream: &CudaStream,
        src: u64,
        words: usize,
        read: impl FnOnce(&[u64]) -> Result<()> + Send + 'static,
    ) -> Result<Check> {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut block = match reused {
            Some(b) if b.words == words => b,
            _ => Pinned::new(&dev.ctx, words)?,
        };
        // SAFETY: the block holds `words` u64s and stays alive (moved into
        // the check) until the copy has completed: the check runs after
        // the run's event, which is recorded after this copy.
        unsafe { result::memcpy_dtoh_async(block.words(), src, raw(stream)) }
            .map_err(|e| err("copying the index checks back", e))?;
        let free = self.free.clone();
        Ok(Box::new(move || {
            let outcome = read(block.words());
            free.lock().unwrap_or_else(|e| e.into_inner()).push(block);
            outcome
        }))
    }
}

/// [`record`] for a run with collectives: its signal has the group's
/// watchdog and its check the group's health (`group.rs`).
pub(crate) fn record_watched(
    dev: &Device,
    stream: &CudaStream,
    check: Option<Check>,
    read: impl IntoIterator<Item = Completion>,
    comm: &Arc<super::nccl::Comm>,
    label: String,
) -> Result<Completion> {
    let event = Arc::new(Event::new(&dev.ctx)?);
    event.record(raw(stream))?;
    dev.pool.note_stream0(event.clone());
    let signal = EventSignal { event, ctx: dev.ctx.clone() };
    let watched = super::group::Watched::new(Box::new(signal), comm.clone(), label.clone());
    let check = super::group::check(check, comm.clone(), label);
    Ok(Completion::in_flight(Box::new(watched), Some(check), read, dev.runtime.clone()))
}
