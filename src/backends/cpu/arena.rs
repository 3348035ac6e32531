//! The arena of a compiled plan: one 64-byte-aligned allocation that holds
//! every `Placement::Arena` value of the plan at its planned offset.
//!
//! The arena is reached only through raw pointers: [`Arena::slice`] and
//! [`Arena::slice_mut`] hand out a slice of exactly one value's range, so a
//! reader of one value and the writer of another never hold references to
//! the same bytes as long as the plan's ranges of simultaneously live
//! values are disjoint. Who may call them when is the executor's business
//! (see `exec.rs`); this file only guarantees bounds and alignment.

use crate::backends::DeviceStats;
use crate::{Error, Result};
use std::alloc::Layout as AllocLayout;
use std::ptr::NonNull;
use std::sync::Arc;

/// `4.0 TiB`: a byte count for people.
pub(crate) fn human_bytes(bytes: usize) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// Alignment of every arena: enough for any dtype and a cache line.
pub(crate) const ARENA_ALIGN: usize = 64;

/// One zero-initialized allocation of `bytes` bytes.
#[derive(Debug)]
pub(crate) struct Arena {
    ptr: NonNull<u8>,
    bytes: usize,
    stats: Arc<DeviceStats>,
}

// SAFETY: the arena is plain bytes with no thread affinity; every access
// goes through `slice`/`slice_mut`, whose callers guarantee that no two
// threads touch overlapping ranges unless both only read.
unsafe impl Send for Arena {}
// SAFETY: as for `Send`: shared access only hands out raw-pointer-derived
// slices under the callers' disjointness guarantee.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates `bytes` zeroed bytes (zeroed so that every byte a typed
    /// slice covers is initialized), crediting `stats`.
    pub(crate) fn new(bytes: usize, stats: &Arc<DeviceStats>) -> Result<Arc<Arena>> {
        let ptr = if bytes == 0 {
            // A dangling pointer aligned for any dtype (8 bytes): a
            // zero-size arena only ever yields empty slices.
            NonNull::<u64>::dangling().cast::<u8>()
        } else {
            let layout = AllocLayout::from_size_align(bytes, ARENA_ALIGN)
                .map_err(|e| Error::Backend(format!("cpu: arena of {bytes} bytes: {e}")))?;
            // SAFETY: `layout` has a non-zero size.
            let raw = unsafe { std::alloc::alloc_zeroed(layout) };
            NonNull::new(raw).ok_or_else(|| {
                Error::OutOfMemory(format!(
                    "cpu: the allocator refused the plan's arena of {bytes} bytes ({})",
                    human_bytes(bytes)
                ))
            })?
        };
        stats.allocated(bytes as u64);
        Ok(Arc::new(Arena { ptr, bytes, stats: stats.clone() }))
    }

    /// Checks that `len` elements of `T` at byte `offset` lie inside the
    /// arena and are aligned for `T`.
    pub(crate) fn check_range<T>(&self, offset: usize, len: usize) -> Result<()> {
        let size = len.checked_mul(std::mem::size_of::<T>());
        let end = size.and_then(|s| offset.checked_add(s));
        if end.is_none_or(|e| e > self.bytes) || offset % std::mem::align_of::<T>() != 0 {
            return Err(Error::Backend(format!(
                "cpu: arena range {offset}+{len} elements of {} bytes does not fit an aligned {}-byte arena",
                std::mem::size_of::<T>(),
                self.bytes
            )));
        }
        Ok(())
    }

    /// The `len` elements of `T` at byte `offset`, to read.
    ///
    /// # Safety
    ///
    /// The range passed [`Arena::check_range`]; its bytes hold valid `T`s;
    /// nobody writes them while the slice lives.
    pub(crate) unsafe fn slice<T>(&self, offset: usize, len: usize) -> &[T] {
        // SAFETY: in bounds and aligned (check_range), initialized and not
        // written meanwhile (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset).cast::<T>(), len) }
    }

    /// The `len` elements of `T` at byte `offset`, to write.
    ///
    /// # Safety
    ///
    /// The range passed [`Arena::check_range`]; its bytes hold valid `T`s;
    /// no other slice of overlapping bytes lives while this one does.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<T>(&self, offset: usize, len: usize) -> &mut [T] {
        // SAFETY: in bounds and aligned (check_range), initialized, and
        // exclusive (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset).cast::<T>(), len) }
    }

    /// Zeroes `bytes` bytes at `offset` (so a `bool` slice over bytes that
    /// last held another dtype is valid before it is written).
    ///
    /// # Safety
    ///
    /// As [`Arena::slice_mut`] for the byte range.
    pub(crate) unsafe fn zero(&self, offset: usize, bytes: usize) {
        // SAFETY: in bounds and exclusive (the caller's contract); any
        // byte value is a valid u8.
        unsafe { self.ptr.as_ptr().add(offset).write_bytes(0, bytes) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.stats.freed(self.bytes as u64);
        if self.bytes > 0 {
            if let Ok(layout) = AllocLayout::from_size_align(self.bytes, ARENA_ALIGN) {
                // SAFETY: allocated in `new` with exactly this layout.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
            }
        }
    }
}
