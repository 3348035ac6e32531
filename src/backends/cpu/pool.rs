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
}
