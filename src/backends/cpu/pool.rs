//! A cache of freed large allocations, reused for outputs of the same
//! dtype and length.
//!
//! A fresh 64 MB vector costs 16K page faults the first time it is
//! written, which on this backend's memory-bound kernels costs more than
//! the arithmetic (numpy answers the same problem with huge pages). A loop
//! that realizes the same plan each iteration frees and allocates the same
//! sizes over and over, so handing a freed vector back out removes the
//! faults entirely. Only allocations of at least [`MIN_POOLED_BYTES`] are
//! kept, at most [`MAX_POOLED_BYTES`] in all (oldest dropped first), and
//! only kernels that overwrite every element take pooled vectors (their
//! stale contents are never read).
//!
//! The memory-planning pass (one arena per plan) will make this
//! unnecessary for planned plans; it stays useful for unplanned ones.

use super::storage::Elem;
use crate::ir::HostData;
use crate::{Error, Result};
use std::alloc::Layout as AllocLayout;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Smaller allocations come from the system allocator, which is fast for them.
pub(crate) const MIN_POOLED_BYTES: usize = 1 << 20;
/// The most bytes the pool holds on to.
pub(crate) const MAX_POOLED_BYTES: usize = 1 << 30;

struct Pool {
    free: VecDeque<HostData>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: VecDeque::new(), bytes: 0 });

fn bytes_of(h: &HostData) -> usize {
    h.len() * h.dtype().size()
}

fn lock() -> std::sync::MutexGuard<'static, Pool> {
    // The pool holds plain vectors; a panic elsewhere cannot corrupt it.
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A vector of `n` elements whose contents the caller overwrites
/// entirely: a pooled one (stale values) if one of this dtype and length
/// is free, else a fresh zeroed one ([`zeroed`]: out of memory is an error).
pub(crate) fn vec_for_overwrite<T: Elem>(n: usize) -> Result<Vec<T>> {
    if n * T::DTYPE.size() >= MIN_POOLED_BYTES {
        let mut pool = lock();
        if let Some(i) = pool.free.iter().position(|h| h.dtype() == T::DTYPE && h.len() == n) {
            if let Some(h) = pool.free.remove(i) {
                pool.bytes -= bytes_of(&h);
                if let Some(v) = T::from_host(h) {
                    return Ok(v);
                }
            }
        }
    }
    zeroed(n)
}

/// `n` zeroed elements, or [`Error::OutOfMemory`] when the allocator says
/// no: `vec![0; n]` would abort the process instead. Zeroed pages come
/// from `calloc` (the kernel's zero pages), so a large vector costs no
/// memset before its writer touches it.
pub(crate) fn zeroed<T: Elem>(n: usize) -> Result<Vec<T>> {
    let too_large = || refused(n, T::DTYPE);
    let layout = AllocLayout::array::<T>(n).map_err(|_| too_large())?;
    if layout.size() == 0 {
        return Ok(vec![T::default(); n]);
    }
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(too_large());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of
    // `[T; n]`, so `Vec` may own and free it with capacity `n`. Every `Elem`
    // is a float, an integer or `bool`, for which all-zero bytes are a valid
    // value (zero, `false`), so all `n` elements are initialized.
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

fn refused(n: usize, dtype: crate::ir::DType) -> Error {
    let bytes = n.saturating_mul(dtype.size());
    Error::OutOfMemory(format!(
        "cpu: the allocator refused a buffer of {n} {dtype} elements ({})",
        super::arena::human_bytes(bytes)
    ))
}

/// A copy of `s`, or [`Error::OutOfMemory`] (see [`zeroed`]).
pub(crate) fn try_to_vec<T: Elem>(s: &[T]) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(s.len()).map_err(|_| refused(s.len(), T::DTYPE))?;
    v.extend_from_slice(s);
    Ok(v)
}

/// Takes back a freed allocation if it is large enough to be worth keeping.
pub(crate) fn give_back(data: HostData) {
    let bytes = bytes_of(&data);
    if !(MIN_POOLED_BYTES..=MAX_POOLED_BYTES).contains(&bytes) {
        return;
    }
    let mut pool = lock();
    while pool.bytes + bytes > MAX_POOLED_BYTES {
        match pool.free.pop_front() {
            Some(old) => pool.bytes -= bytes_of(&old),
            None => break,
        }
    }
    pool.bytes += bytes;
    pool.free.push_back(data);
}

/// Scratch vectors kept for kernels that need working space every call
/// (a convolution's weights, padded input, column matrix and product):
/// at most this many of them. The list is a queue, so a step that cycles
/// through more sizes than this would miss every time (the digits CNN's
/// five convolutions take twenty; 16 missed them all).
const SCRATCH_KEPT: usize = 48;
/// The most bytes the kept scratch vectors hold.
const SCRATCH_BYTES: usize = 64 << 20;

static SCRATCH: Mutex<Vec<HostData>> = Mutex::new(Vec::new());

/// Working space of `n` elements that its user writes before it reads
/// ([`scratch`]): stale values of an earlier user, never read. It goes
/// back to the kept list when dropped.
///
/// Why not [`vec_for_overwrite`]: below [`MIN_POOLED_BYTES`] that one
/// zeroes a fresh allocation, which the digits CNN's convolutions (column
/// matrices of 73-590 KB, five a step) paid as `memset` in a tenth of
/// their time; and it only hands back a vector of the same length.
pub(crate) struct Scratch<T: Elem> {
    v: Vec<T>,
    n: usize,
}

impl<T: Elem> std::ops::Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[..self.n]
    }
}

impl<T: Elem> std::ops::DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[..self.n]
    }
}

impl<T: Elem> Drop for Scratch<T> {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        if v.is_empty() || v.len() * T::DTYPE.size() > SCRATCH_BYTES {
            return;
        }
        let mut kept = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(T::into_host(v));
        let bytes = |kept: &[HostData]| kept.iter().map(bytes_of).sum::<usize>();
        // The oldest go first.
        while kept.len() > SCRATCH_KEPT || bytes(&kept) > SCRATCH_BYTES {
            kept.remove(0);
        }
    }
}

/// [`Scratch`] of `n` elements: the smallest kept vector of this dtype
/// that holds `n` and is not more than twice as long (plus 4K elements),
/// else a fresh zeroed one ([`zeroed`]).
pub(crate) fn scratch<T: Elem>(n: usize) -> Result<Scratch<T>> {
    let mut kept = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    let fits = |h: &HostData| h.dtype() == T::DTYPE && h.len() >= n && h.len() <= 2 * n + 4096;
    let best = kept.iter().enumerate().filter(|(_, h)| fits(h)).min_by_key(|(_, h)| h.len()).map(|(i, _)| i);
    if let Some(v) = best.and_then(|i| T::from_host(kept.remove(i))) {
        return Ok(Scratch { v, n });
    }
    drop(kept);
    Ok(Scratch { v: zeroed(n)?, n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_vector_comes_back_for_the_same_dtype_and_length() {
        let n = MIN_POOLED_BYTES / 4 + 7;
        let mut v = vec![0f32; n];
        v[3] = 42.0;
        let ptr = v.as_ptr();
        give_back(HostData::F32(v));
        // Another test may take it first; only a hit must be the same buffer.
        let again: Vec<f32> = vec_for_overwrite(n).unwrap();
        assert_eq!(again.len(), n);
        if again.as_ptr() == ptr {
            assert_eq!(again[3], 42.0, "a pooled vector is handed out as it was");
        }
        let other: Vec<f64> = vec_for_overwrite(n).unwrap();
        assert_eq!(other.len(), n);
    }

    #[test]
    fn small_allocations_are_not_pooled() {
        let v: Vec<u8> = vec_for_overwrite(16).unwrap();
        assert_eq!(v, vec![0u8; 16]);
        give_back(HostData::U8(v));
        assert!(lock().free.iter().all(|h| h.len() != 16));
    }

    #[test]
    fn scratch_comes_back_with_its_length_and_stale_contents() {
        // A length no other test asks for, so the kept vector is this one.
        let n = 12_345;
        let mut a: Scratch<f32> = scratch(n).unwrap();
        assert_eq!(a.len(), n);
        a[n - 1] = 7.0;
        let ptr = a.as_ptr();
        drop(a);
        let b: Scratch<f32> = scratch(n - 3).unwrap();
        assert_eq!(b.len(), n - 3, "a longer kept vector is cut to the length asked");
        if b.as_ptr() == ptr {
            assert_eq!(b.v[n - 1], 7.0, "kept as it was");
        }
        drop(b);
        let d: Scratch<f32> = scratch(n + 1).unwrap();
        assert_eq!(d.len(), n + 1, "never a shorter vector");
        let c: Scratch<f64> = scratch(n).unwrap();
        assert_ne!(c.as_ptr().cast::<f32>(), ptr, "never another dtype's vector");
        assert_eq!(c.len(), n);
    }
}
