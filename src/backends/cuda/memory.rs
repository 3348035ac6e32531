//! Device memory: a caching allocator for persistent buffers, arenas and
//! scratch, so a loop does not call `cuMemAlloc` every iteration.
//!
//! Blocks are rounded up to a size class (512 bytes below 1 MiB, 2 MiB
//! above) and a freed block goes back to its class's free list, where the
//! next allocation of that class takes it. Reuse is *stream-ordered*: every
//! plan joins all its streams into stream 0 before it ends, and input
//! copies run on stream 0, so run work that reuses a block is always
//! ordered after the last run that read it (as in PyTorch's caching
//! allocator for one stream). Uploads and downloads run on the copy
//! stream (`copy.rs`), which stream 0 does not order: so a freed block
//! remembers the last stream-0 completion recorded before it was freed
//! (a copy-stream allocation takes it only once that has fired) and the
//! upload that wrote it (a stream-0 allocation takes it only once that
//! has finished). A block whose fence has not fired is left for later,
//! and a fresh block is allocated instead. When an allocation fails, every
//! cached block is released and the allocation tried once more; if it
//! still fails the error says how much was asked for and how much the
//! device had free, and nothing is left half allocated.
//!
//! Counters: `live_bytes` are bytes in blocks kiln holds (buffers, arenas,
//! scratch), `peak_bytes` their maximum; cached blocks count as neither.

use super::copy::CopyFence;
use super::device::Event;
use crate::backends::DeviceStats;
use crate::{Error, Result};
use cudarc::driver::{result, sys, CudaContext};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The caching allocator of one device.
pub(crate) struct Pool {
    ctx: Arc<CudaContext>,
    free: Mutex<HashMap<u64, Vec<FreeBlock>>>,
    /// Bytes of the blocks in `free`.
    cached: AtomicU64,
    stats: Arc<DeviceStats>,
    /// The completion event last recorded on stream 0 (after a run).
    stream0_tail: Mutex<Option<Arc<Event>>>,
}

/// A cached block and what must finish before the other stream reuses it
/// (see the module docs).
struct FreeBlock {
    ptr: sys::CUdeviceptr,
    /// The last stream-0 completion recorded before the block was freed.
    stream0: Option<Arc<Event>>,
    /// The upload that wrote the block, if one did.
    copy: Option<Arc<CopyFence>>,
}

/// Which stream first uses a block an allocation returns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FirstUse {
    /// A run (stream 0, or a stream forked from it).
    Stream0,
    /// An upload on the copy stream.
    Copy,
}

impl FreeBlock {
    /// Whether `first` may use the block without a query.
    fn plainly_usable_by(&self, first: FirstUse) -> bool {
        match first {
            FirstUse::Stream0 => self.copy.as_ref().is_none_or(|c| c.known_finished()),
            FirstUse::Copy => self.stream0.is_none(),
        }
    }

    /// Whether `first` may use the block now (queries events: call with
    /// the context bound).
    fn usable_by(&self, first: FirstUse) -> bool {
        match first {
            FirstUse::Stream0 => self.copy.as_ref().is_none_or(|c| c.finished()),
            // A query error counts as unfinished: the block is left and a
            // fresh one tried (which reports a dead context).
            FirstUse::Copy => self.stream0.as_ref().is_none_or(|e| e.query().is_ok()),
        }
    }
}

/// How many cached blocks of a class an allocation looks at before it
/// allocates a fresh one instead.
const SCAN: usize = 16;

/// A block of device memory; back to its pool's free list when dropped.
pub(crate) struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    class: u64,
    bytes: u64,
    pool: Arc<Pool>,
    /// The upload that wrote the block, when the copy stream did.
    copy: Option<Arc<CopyFence>>,
    /// How many captured graphs' input slots hold the block
    /// (`slots.rs`): they hold it as staging bytes, never as a value.
    slot_refs: AtomicUsize,
}

impl std::fmt::Debug for DeviceAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceAlloc({} bytes at {:#x})", self.bytes, self.ptr)
    }
}

/// The size class of a request: the bytes the block really has.
fn class_of(bytes: u64) -> u64 {
    const SMALL: u64 = 512;
    const LARGE: u64 = 2 << 20;
    let b = bytes.max(1);
    if b < (1 << 20) {
        b.div_ceil(SMALL) * SMALL
    } else {
        b.div_ceil(LARGE) * LARGE
    }
}

impl Pool {
    pub fn new(ctx: Arc<CudaContext>, stats: Arc<DeviceStats>) -> Arc<Pool> {
        Arc::new(Pool {
            ctx,
            free: Mutex::new(HashMap::new()),
            cached: AtomicU64::new(0),
            stats,
            stream0_tail: Mutex::new(None),
        })
    }

    /// A block of at least `bytes` bytes (contents undefined) for a run:
    /// stream 0 or a stream forked from it uses it first.
    pub fn alloc(self: &Arc<Pool>, bytes: u64) -> Result<DeviceAlloc> {
        self.alloc_for(bytes, FirstUse::Stream0)
    }

    /// A block of at least `bytes` bytes for an upload on the copy stream.
    pub fn alloc_for_copy(self: &Arc<Pool>, bytes: u64) -> Result<DeviceAlloc> {
        self.alloc_for(bytes, FirstUse::Copy)
    }

    fn alloc_for(self: &Arc<Pool>, bytes: u64, first: FirstUse) -> Result<DeviceAlloc> {
        let class = class_of(bytes);
        let ptr = match self.take_cached(class, first) {
            Some(p) => {
                self.cached.fetch_sub(class, Ordering::Relaxed);
                p
            }
            None => self.fresh(class, bytes)?,
        };
        self.stats.allocated(class);
        Ok(DeviceAlloc { ptr, class, bytes, pool: self.clone(), copy: None, slot_refs: AtomicUsize::new(0) })
    }

    /// A cached block of `class` that `first` may use now: the newest
    /// first (a run's blocks are reused in stream order, so the newest is
    /// usable unless an upload wrote it), the oldest first for uploads
    /// (the most likely to have finished their runs).
    fn take_cached(&self, class: u64, first: FirstUse) -> Option<sys::CUdeviceptr> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let list = free.get_mut(&class)?;
        let n = list.len();
        let order: Box<dyn Iterator<Item = usize>> = match first {
            FirstUse::Stream0 => Box::new((0..n).rev().take(SCAN)),
            FirstUse::Copy => Box::new((0..n).take(SCAN)),
        };
        let mut bound = false;
        for k in order {
            if !list[k].plainly_usable_by(first) {
                if !bound {
                    // Event queries need the context.
                    bound = true;
                    if self.ctx.bind_to_thread().is_err() {
                        return None;
                    }
                }
                if !list[k].usable_by(first) {
                    continue;
                }
            }
            return Some(list.remove(k).ptr);
        }
        None
    }

    /// Notes a completion event just recorded on stream 0 (under the
    /// launch lock, after a run's work): blocks freed from now on were
    /// last used by work before it.
    pub fn note_stream0(&self, event: Arc<Event>) {
        *self.stream0_tail.lock().unwrap_or_else(|e| e.into_inner()) = Some(event);
    }

    fn fresh(&self, class: u64, asked: u64) -> Result<sys::CUdeviceptr> {
        self.ctx.bind_to_thread().map_err(|e| Error::Backend(format!("cuda: {e:?}")))?;
        let size = usize::try_from(class).map_err(|_| Error::OutOfMemory(format!("cuda: {asked} bytes")))?;
        // SAFETY: a plain device allocation in the bound context.
        match unsafe { result::malloc_sync(size) } {
            Ok(p) => Ok(p),
            Err(_) => {
                self.release_cached();
                // SAFETY: as above.
                unsafe { result::malloc_sync(size) }.map_err(|e| {
                    let (free, total) = result::mem_get_info().unwrap_or((0, 0));
                    Error::OutOfMemory(format!(
                        "cuda device {}: asked for {asked} bytes ({} MiB) with {} MiB free of {} MiB ({e:?})",
                        self.ctx.ordinal(),
                        asked >> 20,
                        free >> 20,
                        total >> 20
                    ))
                })
            }
        }
    }

    /// Frees every cached block (the device then has them back).
    ///
    /// A cached block may still be read or written by work in flight: the
    /// free list is stream-ordered (see the module docs), which says when a
    /// *new user* of the block may run, not that the last one has. NVIDIA
    /// does not document that `cuMemFree` waits for such work, so the
    /// device is synchronized first; this path runs only when an
    /// allocation failed or the device closes, so the wait costs nothing in
    /// a loop.
    pub fn release_cached(&self) {
        let blocks: Vec<(u64, Vec<FreeBlock>)> =
            self.free.lock().unwrap_or_else(|e| e.into_inner()).drain().collect();
        if blocks.is_empty() {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        if let Err(e) = self.ctx.synchronize() {
            // The context is unusable (a kernel faulted): freeing is still
            // the best that can be done with its memory.
            tracing::warn!(error = ?e, "cuda: synchronizing before releasing cached blocks failed");
        }
        for (class, freed) in blocks {
            for FreeBlock { ptr: p, .. } in freed {
                // SAFETY: a block this pool allocated and no buffer holds;
                // the device has finished every piece of work (synchronized
                // above), so none still uses it.
                let _ = unsafe { result::free_sync(p) };
                self.cached.fetch_sub(class, Ordering::Relaxed);
            }
        }
    }

    /// Bytes held in cached (free) blocks.
    pub fn cached_bytes(&self) -> u64 {
        self.cached.load(Ordering::Relaxed)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.release_cached();
    }
}

impl DeviceAlloc {
    /// The device address.
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The bytes asked for.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// True when the block came from `pool` (and goes back to it).
    pub fn belongs_to(&self, pool: &Arc<Pool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }

    /// How many references to `this` hold a value in it: every reference
    /// but the graph input slots' (`slots.rs`). The slot count is read
    /// first and a slot counts itself only after it cloned the reference
    /// (and uncounts before it drops it), so a race can only count a
    /// holder too many, never one too few.
    pub fn value_holders(this: &Arc<DeviceAlloc>) -> usize {
        let slots = this.slot_refs.load(Ordering::SeqCst);
        Arc::strong_count(this).saturating_sub(slots)
    }

    /// Counts a graph input slot that holds the block (`slots.rs`).
    pub fn slot_taken(&self) {
        self.slot_refs.fetch_add(1, Ordering::SeqCst);
    }

    /// Uncounts a graph input slot that is about to drop its reference.
    pub fn slot_released(&self) {
        self.slot_refs.fetch_sub(1, Ordering::SeqCst);
    }

    /// Marks the block as written by an upload on the copy stream.
    pub fn written_by(&mut self, copy: Arc<CopyFence>) {
        self.copy = Some(copy);
    }

    /// Makes `stream` wait (on the device) for the upload that wrote the
    /// block, if one did and it may not have finished.
    pub fn order_after_upload(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        match &self.copy {
            Some(c) => c.order_before(stream),
            None => Ok(()),
        }
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        self.pool.stats.freed(self.class);
        let stream0 = self.pool.stream0_tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let copy = self.copy.take().filter(|c| !c.known_finished());
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(self.class)
            .or_default()
            .push(FreeBlock { ptr: self.ptr, stream0, copy });
        self.pool.cached.fetch_add(self.class, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::class_of;

    #[test]
    fn size_classes() {
        assert_eq!(class_of(0), 512);
        assert_eq!(class_of(513), 1024);
        assert_eq!(class_of(1 << 20), 2 << 20);
        assert_eq!(class_of((2 << 20) + 1), 4 << 20);
    }
}
