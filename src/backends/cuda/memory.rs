//! Device memory: a caching allocator for persistent buffers, arenas and
//! scratch, so a loop does not call `cuMemAlloc` every iteration.
//!
//! Blocks are rounded up to a size class (512 bytes below 1 MiB, 64 KiB
//! from there) and a freed block goes back to its class's free list, where
//! the next allocation of that class takes it.
//!
//! Where fresh blocks come from: the driver hands out blocks below 1 MiB
//! at their size (it sub-allocates them), but rounds every larger block
//! up to 2 MiB (`benches/alloc_granularity.py` on an H100: a 2.25 MiB
//! block takes 4 MiB of the device, a 6.75 MiB one 8). So large blocks
//! are carved, one after another, out of *segments*: a request up to
//! 10 MiB out of a 20 MiB segment shared with the next ones, a larger one
//! out of its own segment rounded up to 2 MiB, whose end the next blocks
//! use. GPT-2 small's 48 weight matrices lost 64 MB to the rounding
//! before (their own `cuMemAlloc` each, in 2 MiB classes). A carved block
//! is never given back alone: it goes to its class's free list like any
//! other, and a segment is freed when every block carved from it is
//! cached and the cache is released (as in PyTorch's caching allocator,
//! without its splitting and merging of cached blocks). Reuse is *stream-ordered*: every
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
    free: Mutex<Lists>,
    /// Bytes of the blocks in `free`.
    cached: AtomicU64,
    stats: Arc<DeviceStats>,
    /// The completion event last recorded on stream 0 (after a run).
    stream0_tail: Mutex<Option<Arc<Event>>>,
}

/// The free lists by class, and the segments large blocks are carved
/// from (see the module docs), under one lock.
#[derive(Default)]
struct Lists {
    free: HashMap<u64, Vec<FreeBlock>>,
    segments: HashMap<u64, Segment>,
    next_segment: u64,
}

/// A `cuMemAlloc` block that large blocks are carved from, front to back.
struct Segment {
    ptr: sys::CUdeviceptr,
    size: u64,
    /// Bytes carved so far (the next block starts there).
    carved: u64,
    /// Blocks carved from it that are not in a free list.
    held: usize,
}

/// Requests from this size on are carved from segments.
const LARGE: u64 = 1 << 20;
/// Requests up to this size share segments of [`SHARED_SEGMENT`] bytes.
const SHARED_UP_TO: u64 = 10 << 20;
const SHARED_SEGMENT: u64 = 20 << 20;
/// The driver's rounding of large blocks.
const DRIVER_PAGE: u64 = 2 << 20;

/// A cached block and what must finish before the other stream reuses it
/// (see the module docs).
struct FreeBlock {
    ptr: sys::CUdeviceptr,
    /// The segment it was carved from, for a large block.
    segment: Option<u64>,
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
    /// The segment it was carved from, for a large block.
    segment: Option<u64>,
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
    const SMALL_STEP: u64 = 512;
    const LARGE_STEP: u64 = 64 << 10;
    let b = bytes.max(1);
    if b < LARGE {
        b.div_ceil(SMALL_STEP) * SMALL_STEP
    } else {
        b.div_ceil(LARGE_STEP) * LARGE_STEP
    }
}

/// The size of a new segment for a block of `class` bytes.
fn segment_for(class: u64) -> u64 {
    if class <= SHARED_UP_TO {
        SHARED_SEGMENT
    } else {
        class.div_ceil(DRIVER_PAGE) * DRIVER_PAGE
    }
}

impl Lists {
    /// A block of `class` bytes from the end of a segment that has room,
    /// the fullest first (so the roomy ones keep room for large blocks).
    fn carve(&mut self, class: u64) -> Option<(sys::CUdeviceptr, u64)> {
        let (&id, seg) = self
            .segments
            .iter_mut()
            .filter(|(_, g)| g.size - g.carved >= class)
            .min_by_key(|(&id, g)| (g.size - g.carved, id))?;
        let ptr = seg.ptr + seg.carved;
        seg.carved += class;
        seg.held += 1;
        Some((ptr, id))
    }

    /// Adds a fresh segment and carves `class` bytes from its start.
    fn carve_new(&mut self, ptr: sys::CUdeviceptr, size: u64, class: u64) -> (sys::CUdeviceptr, u64) {
        let id = self.next_segment;
        self.next_segment += 1;
        self.segments.insert(id, Segment { ptr, size, carved: class, held: 1 });
        (ptr, id)
    }
}

impl Pool {
    pub fn new(ctx: Arc<CudaContext>, stats: Arc<DeviceStats>) -> Arc<Pool> {
        Arc::new(Pool {
            ctx,
            free: Mutex::new(Lists::default()),
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
        let (ptr, segment) = match self.take_cached(class, first) {
            Some(p) => {
                self.cached.fetch_sub(class, Ordering::Relaxed);
                p
            }
            None if class >= LARGE => self.carve(class, bytes)?,
            None => (self.fresh(class, bytes)?, None),
        };
        self.stats.allocated(class);
        Ok(DeviceAlloc {
            ptr,
            segment,
            class,
            bytes,
            pool: self.clone(),
            copy: None,
            slot_refs: AtomicUsize::new(0),
        })
    }

    /// A never used large block: from a segment's room, or a new segment.
    fn carve(&self, class: u64, asked: u64) -> Result<(sys::CUdeviceptr, Option<u64>)> {
        if let Some((ptr, id)) = self.lists().carve(class) {
            return Ok((ptr, Some(id)));
        }
        // A shared segment, or (when the device has no room for one) the
        // block alone at the driver's rounding.
        let mut size = segment_for(class);
        let ptr = match self.fresh(size, asked) {
            Ok(p) => p,
            Err(_) if size > class.div_ceil(DRIVER_PAGE) * DRIVER_PAGE => {
                size = class.div_ceil(DRIVER_PAGE) * DRIVER_PAGE;
                self.fresh(size, asked)?
            }
            Err(e) => return Err(e),
        };
        let (ptr, id) = self.lists().carve_new(ptr, size, class);
        Ok((ptr, Some(id)))
    }

    fn lists(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cached block of `class` that `first` may use now: the newest
    /// first (a run's blocks are reused in stream order, so the newest is
    /// usable unless an upload wrote it), the oldest first for uploads
    /// (the most likely to have finished their runs).
    fn take_cached(&self, class: u64, first: FirstUse) -> Option<(sys::CUdeviceptr, Option<u64>)> {
        let mut lists = self.lists();
        let Lists { free, segments, .. } = &mut *lists;
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
            let block = list.remove(k);
            if let Some(seg) = block.segment.and_then(|id| segments.get_mut(&id)) {
                seg.held += 1;
            }
            return Some((block.ptr, block.segment));
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
    ///
    /// A carved block's memory goes back with its segment, once every block
    /// of the segment is cached: the blocks of a segment still in use stay
    /// in the free lists.
    pub fn release_cached(&self) {
        let (blocks, segments) = {
            let mut lists = self.lists();
            let Lists { free, segments, .. } = &mut *lists;
            let empty: Vec<u64> = segments.iter().filter(|(_, g)| g.held == 0).map(|(&id, _)| id).collect();
            let mut blocks: Vec<(u64, Vec<FreeBlock>)> = Vec::new();
            for (&class, list) in free.iter_mut() {
                let (go, stay): (Vec<FreeBlock>, Vec<FreeBlock>) =
                    list.drain(..).partition(|b| b.segment.is_none_or(|id| empty.contains(&id)));
                *list = stay;
                blocks.push((class, go));
            }
            free.retain(|_, list| !list.is_empty());
            let gone: Vec<Segment> = empty.iter().filter_map(|id| segments.remove(id)).collect();
            (blocks, gone)
        };
        if blocks.iter().all(|(_, b)| b.is_empty()) && segments.is_empty() {
            return;
        }
        let _no_capture = super::device::no_capture_in_progress();
        let _ = self.ctx.bind_to_thread();
        if let Err(e) = self.ctx.synchronize() {
            // The context is unusable (a kernel faulted): freeing is still
            // the best that can be done with its memory.
            tracing::warn!(error = ?e, "cuda: synchronizing before releasing cached blocks failed");
        }
        for (class, freed) in blocks {
            for FreeBlock { ptr: p, segment, .. } in freed {
                if segment.is_none() {
                    // SAFETY: a block this pool allocated and no buffer
                    // holds; the device has finished every piece of work
                    // (synchronized above), so none still uses it.
                    let _ = unsafe { result::free_sync(p) };
                }
                self.cached.fetch_sub(class, Ordering::Relaxed);
            }
        }
        for g in segments {
            // SAFETY: as above: every block carved from it was cached, and
            // is out of the free lists now.
            let _ = unsafe { result::free_sync(g.ptr) };
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
        let mut lists = self.pool.lists();
        if let Some(seg) = self.segment.and_then(|id| lists.segments.get_mut(&id)) {
            seg.held -= 1;
        }
        lists.free.entry(self.class).or_default().push(FreeBlock {
            ptr: self.ptr,
            segment: self.segment,
            stream0,
            copy,
        });
        drop(lists);
        self.pool.cached.fetch_add(self.class, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::{class_of, segment_for, Lists};

    #[test]
    fn size_classes() {
        assert_eq!(class_of(0), 512);
        assert_eq!(class_of(513), 1024);
        assert_eq!(class_of(1 << 20), 1 << 20);
        assert_eq!(class_of((1 << 20) + 1), (1 << 20) + (64 << 10));
        // GPT-2 small's f32 `c_proj` (768 x 768) is its own size.
        assert_eq!(class_of(2_359_296), 2_359_296);
    }

    #[test]
    fn large_blocks_are_carved_from_shared_segments() {
        let mut lists = Lists::default();
        assert!(lists.carve(1 << 20).is_none(), "no segment yet");
        let (a, s0) = lists.carve_new(1 << 30, segment_for(2_359_296), 2_359_296);
        assert_eq!(segment_for(2_359_296), 20 << 20);
        // The next blocks follow it in the same segment while they fit.
        let (b, s1) = lists.carve(7_077_888).expect("room for 6.75 MiB");
        assert_eq!((b, s1), (a + 2_359_296, s0));
        let (c, _) = lists.carve(9_437_184).expect("room for 9 MiB");
        assert_eq!(c, b + 7_077_888);
        assert!(lists.carve((2 << 20) + (64 << 10)).is_none(), "20 MiB less 18 MiB carved");
        assert_eq!(lists.segments[&s0].held, 3);
        // A large block gets its own segment, rounded to the driver's page
        // (GPT-2's f32 `wte`, 147.2 MiB, takes 148 MiB).
        assert_eq!(segment_for(154_389_504), 148 << 20);
        let (_, big) = lists.carve_new(1 << 34, segment_for(13_107_200), 13_107_200);
        assert_eq!(segment_for(13_107_200), 14 << 20);
        // Its end (1.5 MiB) serves the next block before the first
        // segment's 2 MiB: the fullest segment first.
        let (d, sd) = lists.carve(1 << 20).expect("the big segment's end");
        assert_eq!((d, sd), ((1 << 34) + 13_107_200, big));
    }
}
