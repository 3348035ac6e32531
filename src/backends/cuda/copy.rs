//! Host copies that overlap running plans: uploads and downloads go
//! through pinned staging chunks and asynchronous copies on a stream of
//! their own, the *copy stream*, so making a tensor from host data never
//! waits for a running plan, and a data loader's next batch is copied
//! while the current step runs.
//!
//! Why a stream of its own: runs are ordered on stream 0, and a copy on
//! stream 0 queues behind every run in flight. Why pinned chunks: a copy
//! from pageable memory may make the driver synchronize with the stream to
//! stage it, and only page-locked memory is copied by the DMA engines
//! while the host goes on.
//!
//! Ordering, on the device and never on the host:
//! - A run that reads an uploaded buffer makes stream 0 wait for the
//!   upload's event ([`CopyFence::order_before`], called by the run's
//!   launch) unless the copy is already known to have finished.
//! - A block another stream used is reused only when that use is over:
//!   the pool keeps, with each freed block, the last stream-0 completion
//!   recorded before it was freed and the upload that wrote it, and a
//!   copy-stream allocation takes only blocks whose stream-0 work has
//!   finished (a stream-0 allocation, only blocks whose upload finished);
//!   see `memory.rs`. When none is free, a fresh block is allocated: the
//!   pool grows to about one block per run in flight, then reuses.
//!
//! Staging: [`MAX_CHUNKS`] pinned chunks of [`CHUNK`] bytes, made
//! together on first need and kept. A chunk is reused once the copy that
//! last used it has finished; when every chunk is busy, the host waits for
//! the oldest chunk's copy, which is copy-stream work only.
//! An upload returns once its bytes are in pinned chunks (a host memcpy),
//! before the device has them; a download waits for its own copies.

use super::device::{raw, Event};
use super::memory::{DeviceAlloc, Pool};
use crate::{Error, Result};
use cudarc::driver::{result, CudaContext, CudaStream};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes per staging chunk.
pub(crate) const CHUNK: usize = 4 << 20;
/// The most staging chunks a device keeps (32 MiB of pinned memory).
pub(crate) const MAX_CHUNKS: usize = 8;

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("cuda: {what}: {e:?}"))
}

/// The event after an upload's copies, and whether it is known to have
/// fired (so later readers skip the query and the stream wait).
pub(crate) struct CopyFence {
    event: Arc<Event>,
    finished: AtomicBool,
}

impl CopyFence {
    /// Whether the copy has finished (never blocks). A query error counts
    /// as not finished: whoever then waits on the event sees the error.
    pub fn finished(&self) -> bool {
        if self.finished.load(Ordering::Acquire) {
            return true;
        }
        let done = self.event.query().is_ok();
        if done {
            self.finished.store(true, Ordering::Release);
        }
        done
    }

    /// Whether the copy is already known to have finished (no query).
    pub fn known_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Makes `stream` wait (on the device) for the copy, unless it has
    /// finished. Call with the context bound, under the launch lock.
    pub fn order_before(&self, stream: &CudaStream) -> Result<()> {
        if self.finished() {
            return Ok(());
        }
        self.event.wait_on(raw(stream))
    }

    /// The event, for a completion of the upload.
    pub fn event(&self) -> Arc<Event> {
        self.event.clone()
    }
}

/// Page-locked host bytes.
struct PinnedBytes {
    ptr: *mut u8,
    len: usize,
    /// The context the block was allocated in, alive until it is freed
    /// (see [`Event`]: a reset context frees its pinned memory itself).
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this value; the device reads or
// writes it only between a copy being enqueued and the chunk's event,
// and the host touches it only after that event (see `Staging::take`).
unsafe impl Send for PinnedBytes {}

impl PinnedBytes {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedBytes> {
        ctx.bind_to_thread().map_err(|e| err("binding the context", e))?;
        // SAFETY: a fresh page-locked allocation of `len` bytes; flags 0.
        let ptr =
            unsafe { result::malloc_host(len, 0) }.map_err(|e| err("allocating pinned host memory", e))?;
        Ok(PinnedBytes { ptr: ptr as *mut u8, len, ctx: ctx.clone() })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated in `new`, owned by `self`; no copy
        // into or out of them is pending (see the type's `Send`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host`; the copier synchronizes its
        // stream before its chunks are dropped, so no copy is pending.
        let _ = self.ctx.bind_to_thread();
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// A staging chunk and the event of the last copy that used it.
struct Chunk {
    pinned: PinnedBytes,
    last: Event,
    /// Whether `last` was ever recorded.
    used: bool,
}

impl Chunk {
    fn idle(&self) -> bool {
        !self.used || self.last.query().is_ok()
    }
}

/// The chunks not lent to a copy, oldest use first, and how many exist.
#[derive(Default)]
struct Staging {
    idle: VecDeque<Chunk>,
    made: usize,
}

impl Staging {
    /// The oldest chunk not lent out, once its last copy has finished
    /// (copy-stream work only, never a running plan). `None` when every
    /// chunk is lent out (the caller drains its own copies first).
    fn take(&mut self, ctx: &Arc<CudaContext>) -> Result<Option<Chunk>> {
        if self.made == 0 {
            // All chunks at once, on first need: the driver may allocate
            // pinned memory synchronously with the device, and the first
            // copy usually comes before any plan runs (weights, the first
            // batch), so no later upload waits for a running plan.
            for _ in 0..MAX_CHUNKS {
                let chunk =
                    Chunk { pinned: PinnedBytes::new(ctx, CHUNK)?, last: Event::new(ctx)?, used: false };
                self.idle.push_back(chunk);
                self.made += 1;
            }
        }
        let Some(chunk) = self.idle.pop_front() else { return Ok(None) };
        if !chunk.idle() {
            chunk.last.synchronize()?;
        }
        Ok(Some(chunk))
    }
}

/// The copy stream and its staging chunks (one per device).
pub(crate) struct Copier {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    staging: Mutex<Staging>,
}

impl Copier {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Copier> {
        let stream = ctx.new_stream().map_err(|e| err("creating the copy stream", e))?;
        Ok(Copier { ctx: ctx.clone(), stream, staging: Mutex::new(Staging::default()) })
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| err("binding the context", e))
    }

    /// Copies `bytes` into a new block of `pool` on the copy stream.
    /// Returns once the bytes are staged; the fence says when the device
    /// has them.
    pub fn upload(&self, pool: &Arc<Pool>, bytes: &[u8]) -> Result<(DeviceAlloc, Arc<CopyFence>)> {
        let _span = tracing::trace_span!("upload", bytes = bytes.len()).entered();
        self.bind()?;
        let alloc = pool.alloc_for_copy(bytes.len() as u64)?;
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        for (k, piece) in bytes.chunks(CHUNK).enumerate() {
            let Some(mut chunk) = staging.take(&self.ctx)? else {
                return Err(err("uploading", "no staging chunk is free"));
            };
            let staged = &mut chunk.pinned.bytes()[..piece.len()];
            staged.copy_from_slice(piece);
            let dst = alloc.ptr() + (k * CHUNK) as u64;
            // SAFETY: `dst` has `piece.len()` bytes of the block (which
            // holds `bytes.len()`); the chunk is page-locked and not reused
            // before its event, recorded right after this copy.
            let copied = unsafe { result::memcpy_htod_async(dst, &*staged, raw(&self.stream)) }
                .map_err(|e| err("copying to the device", e))
                .and_then(|()| chunk.last.record(raw(&self.stream)));
            chunk.used = true;
            staging.idle.push_back(chunk);
            copied?;
        }
        drop(staging);
        let event = Arc::new(Event::new(&self.ctx)?);
        event.record(raw(&self.stream))?;
        Ok((alloc, Arc::new(CopyFence { event, finished: AtomicBool::new(bytes.is_empty()) })))
    }

    /// Copies `out.len()` bytes at `src` to `out` through the staging
    /// chunks, waiting for its own copies only. The work that wrote `src`
    /// must have finished.
    pub fn download(&self, src: u64, out: &mut [u8]) -> Result<()> {
        let _span = tracing::trace_span!("download", bytes = out.len()).entered();
        self.bind()?;
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        // Chunks lent to this download, with the piece each holds.
        let mut lent: VecDeque<(Chunk, usize)> = VecDeque::new();
        let mut outcome = Ok(());
        for k in 0..out.len().div_ceil(CHUNK) {
            let mut chunk = match staging.take(&self.ctx) {
                Ok(Some(c)) => c,
                Ok(None) => match lent.pop_front() {
                    // Every chunk is ours: the oldest is copied out first.
                    Some((mut c, j)) => match Self::copy_out(&mut c, j, out) {
                        Ok(()) => c,
                        Err(e) => {
                            staging.idle.push_back(c);
                            outcome = Err(e);
                            break;
                        }
                    },
                    None => {
                        outcome = Err(err("downloading", "no staging chunk is free"));
                        break;
                    }
                },
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            };
            let len = CHUNK.min(out.len() - k * CHUNK);
            // SAFETY: the chunk is page-locked, holds `len` bytes, and is
            // read only after its event, recorded right after this copy;
            // `src` has at least `(k + 1) * CHUNK` or `out.len()` bytes.
            let copied = unsafe {
                result::memcpy_dtoh_async(
                    &mut chunk.pinned.bytes()[..len],
                    src + (k * CHUNK) as u64,
                    raw(&self.stream),
                )
            }
            .map_err(|e| err("copying to the host", e))
            .and_then(|()| chunk.last.record(raw(&self.stream)));
            chunk.used = true;
            lent.push_back((chunk, k));
            if let Err(e) = copied {
                outcome = Err(e);
                break;
            }
        }
        for (mut chunk, k) in lent {
            if outcome.is_ok() {
                outcome = Self::copy_out(&mut chunk, k, out);
            }
            staging.idle.push_back(chunk);
        }
        outcome
    }

    /// Waits for chunk `chunk`'s copy and moves its piece `k` into `out`.
    fn copy_out(chunk: &mut Chunk, k: usize, out: &mut [u8]) -> Result<()> {
        chunk.last.synchronize()?;
        let start = k * CHUNK;
        let len = CHUNK.min(out.len() - start);
        out[start..start + len].copy_from_slice(&chunk.pinned.bytes()[..len]);
        Ok(())
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        // Pending copies read or write the chunks: finish them first.
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
    }
}
