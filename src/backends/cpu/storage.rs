//! Typed, reference-counted element storage and the element trait kernels
//! are generic over.
//!
//! A [`Storage`] either owns one typed vector (a [`HostData`]), reporting
//! its size to the backend's [`DeviceStats`] when created and when dropped
//! (so the counters see every allocation however many views share it), or
//! names a range of a plan's arena (counted once, with the arena).

use super::arena::Arena;
use crate::backends::layout::Layout;
use crate::backends::{Contents, DeviceStats};
use crate::ir::{DType, Element, HostData, Scalar};
use crate::{Error, Result};
use half::{bf16, f16};
use std::marker::PhantomData;
use std::sync::Arc;

/// Where a storage's elements are.
#[derive(Debug)]
enum Backing {
    /// Its own vector, credited to the counters on creation and drop.
    Owned { data: HostData, bytes: u64, stats: Arc<DeviceStats> },
    /// `len` elements of `dtype` at byte `offset` of a plan's arena.
    Arena { arena: Arc<Arena>, offset: usize, len: usize, dtype: DType },
}

/// One allocation (or one arena range): typed elements.
#[derive(Debug)]
pub struct Storage {
    backing: Backing,
    /// Which bytes it holds (new whenever they are written, see
    /// [`Contents`]).
    contents: Contents,
}

impl Storage {
    /// Takes ownership of `data` and records its bytes as allocated.
    pub(crate) fn new(data: HostData, stats: &Arc<DeviceStats>) -> Arc<Storage> {
        let bytes = (data.len() * data.dtype().size()) as u64;
        stats.allocated(bytes);
        Arc::new(Storage {
            backing: Backing::Owned { data, bytes, stats: stats.clone() },
            contents: Contents::fresh(),
        })
    }

    /// Which bytes the storage holds.
    pub(crate) fn contents(&self) -> Contents {
        self.contents
    }

    /// Writes `data` over an owned storage nobody else holds, as a device
    /// rewrites a reused allocation (the CUDA emulator's output sets): the
    /// same storage, new [`Contents`]. Gives `data` back when the storage
    /// is shared, an arena range, or of another dtype or length.
    #[cfg_attr(not(feature = "cuda-emulator"), allow(dead_code))]
    pub(crate) fn rewrite(this: &mut Arc<Storage>, data: HostData) -> std::result::Result<(), HostData> {
        let Some(storage) = Arc::get_mut(this) else { return Err(data) };
        match &mut storage.backing {
            Backing::Owned { data: old, .. } if old.dtype() == data.dtype() && old.len() == data.len() => {
                super::pool::give_back(std::mem::replace(old, data));
                storage.contents = Contents::fresh();
                Ok(())
            }
            _ => Err(data),
        }
    }

    /// The elements of an owned storage of `len` elements that nobody else
    /// holds, to overwrite in place (a `write_at` over a donated input):
    /// the same allocation with new [`Contents`]. `None` when the storage
    /// is shared (someone may still read the old elements), an arena
    /// range, or of another length. `Arc::get_mut` is the proof that the
    /// write races with no reader.
    pub(crate) fn exclusive(this: &mut Arc<Storage>, len: usize) -> Option<&mut HostData> {
        let storage = Arc::get_mut(this)?;
        match &mut storage.backing {
            Backing::Owned { data, .. } if data.len() == len => {
                storage.contents = Contents::fresh();
                Some(data)
            }
            _ => None,
        }
    }

    /// The `len` elements of `T` at byte `offset` of `arena`, which the
    /// executor has just written (checked to fit the arena here).
    pub(crate) fn in_arena<T: Elem>(arena: &Arc<Arena>, offset: usize, len: usize) -> Result<Arc<Storage>> {
        arena.check_range::<T>(offset, len)?;
        Ok(Arc::new(Storage {
            backing: Backing::Arena { arena: arena.clone(), offset, len, dtype: T::DTYPE },
            contents: Contents::fresh(),
        }))
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> DType {
        match &self.backing {
            Backing::Owned { data, .. } => data.dtype(),
            Backing::Arena { dtype, .. } => *dtype,
        }
    }

    /// True when the elements live in a plan's arena.
    pub(crate) fn is_arena(&self) -> bool {
        matches!(self.backing, Backing::Arena { .. })
    }

    /// The arena and byte range of an arena storage.
    #[cfg(test)]
    pub(crate) fn arena_range(&self) -> Option<(&Arc<Arena>, usize, usize)> {
        match &self.backing {
            Backing::Arena { arena, offset, len, dtype } => Some((arena, *offset, len * dtype.size())),
            Backing::Owned { .. } => None,
        }
    }

    /// The elements, typed as they are stored.
    pub(crate) fn host_slice(&self) -> Result<HostSlice<'_>> {
        dispatch!(self.dtype(), T => self.slice::<T>().map(T::host_slice))
    }

    /// The elements, or a backend error naming the dtype mismatch.
    pub(crate) fn slice<T: Elem>(&self) -> Result<&[T]> {
        match &self.backing {
            Backing::Owned { data, .. } => typed::<T>(data),
            Backing::Arena { arena, offset, len, dtype } => {
                if *dtype != T::DTYPE {
                    return Err(Error::Backend(format!("cpu: expected {} storage, found {dtype}", T::DTYPE)));
                }
                // SAFETY: `in_arena` checked that the range fits the arena
                // and is aligned for `T` (= `dtype`). Its bytes hold valid
                // `T`s: the arena starts zeroed and the executor zeroes a
                // bool range before handing it to a kernel. Nobody writes
                // them while this slice lives: the executor only makes an
                // arena storage after its node has run, and the plan (checked
                // at compile: ranges of a node and its operands are disjoint,
                // and `ir::verify` checks that no two simultaneously live
                // values overlap) writes no overlapping range until every
                // reader of this value has finished.
                Ok(unsafe { arena.slice::<T>(*offset, *len) })
            }
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Backing::Owned { data, bytes, stats } = &mut self.backing {
            stats.freed(*bytes);
            super::pool::give_back(std::mem::replace(data, HostData::U8(Vec::new())));
        }
    }
}

/// Borrowed typed elements, whatever backs them (an owned vector or a
/// range of a plan's arena): what fused kernels read operands through.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub(crate) enum HostSlice<'a> {
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    U8(&'a [u8]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    Bool(&'a [bool]),
}

impl<'a> HostSlice<'a> {
    /// The elements as `T`, or a backend error naming the mismatch.
    pub(crate) fn typed<T: Elem>(self) -> Result<&'a [T]> {
        T::from_host_slice(self).ok_or_else(|| {
            Error::Backend(format!("cpu: expected {} storage, found {}", T::DTYPE, self.dtype()))
        })
    }

    /// The element type.
    pub(crate) fn dtype(self) -> DType {
        match self {
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
            HostSlice::F32(_) => DType::F32,
            HostSlice::F64(_) => DType::F64,
            HostSlice::U8(_) => DType::U8,
            HostSlice::I32(_) => DType::I32,
            HostSlice::I64(_) => DType::I64,
            HostSlice::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub(crate) fn len(self) -> usize {
        dispatch!(self.dtype(), T => self.typed::<T>().map_or(0, <[T]>::len))
    }
}

impl<'a> From<&'a HostData> for HostSlice<'a> {
    fn from(h: &'a HostData) -> HostSlice<'a> {
        match h {
            HostData::F16(v) => HostSlice::F16(v),
            HostData::BF16(v) => HostSlice::BF16(v),
            HostData::F32(v) => HostSlice::F32(v),
            HostData::F64(v) => HostSlice::F64(v),
            HostData::U8(v) => HostSlice::U8(v),
            HostData::I32(v) => HostSlice::I32(v),
            HostData::I64(v) => HostSlice::I64(v),
            HostData::Bool(v) => HostSlice::Bool(v),
        }
    }
}

/// A kernel's output: a mutable slice of the node's dtype with the type
/// erased, so that kernels are compiled once, not once per output type.
/// [`Out::get`] gives the slice back at the type the kernel computed.
pub(crate) struct Out<'a> {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> Out<'a> {
    /// Wraps `out`, borrowing it for `'a`.
    pub(crate) fn new<T: Elem>(out: &'a mut [T]) -> Out<'a> {
        Out { ptr: out.as_mut_ptr().cast(), len: out.len(), dtype: T::DTYPE, _borrow: PhantomData }
    }

    /// The element type.
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The same slice for a shorter borrow (so a kernel can hand it out
    /// more than once, one use at a time).
    pub(crate) fn reborrow(&mut self) -> Out<'_> {
        Out { ptr: self.ptr, len: self.len, dtype: self.dtype, _borrow: PhantomData }
    }

    /// The element count.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slice cut into consecutive pieces of `len` elements (the last
    /// may be shorter), each borrowing its own elements.
    pub(crate) fn chunks(self, len: usize) -> Vec<Out<'a>> {
        let size = self.dtype.size();
        (0..self.len)
            .step_by(len.max(1))
            .map(|at| Out {
                // SAFETY: `at < self.len`, so the offset stays inside the
                // slice `new` borrowed; the pieces do not overlap.
                ptr: unsafe { self.ptr.add(at * size) },
                len: len.max(1).min(self.len - at),
                dtype: self.dtype,
                _borrow: PhantomData,
            })
            .collect()
    }

    /// The slice as `T`, which must be its element type.
    pub(crate) fn get<T: Elem>(self) -> Result<&'a mut [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::Backend(format!(
                "cpu: the kernel writes {} into {} output",
                T::DTYPE,
                self.dtype
            )));
        }
        // SAFETY: `Elem` is implemented by exactly one Rust type per dtype
        // (it is crate-private), so `T` is the type `new` erased: the
        // pointer, length, alignment and validity carry over; the borrow
        // of `'a` is the one `new` took, and `self` is consumed.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), self.len) })
    }
}

// SAFETY: an `Out` is a `&'a mut [T]` for one of the `Elem` types, all of
// which are `Send`; it is consumed by `get`, so it moves between threads as
// that borrow would.
unsafe impl Send for Out<'_> {}

/// A typed element of CPU storage: the conversions kernels need, with
/// the semantics of [`Scalar::cast`] (floats via `f64`, integers via `i64`
/// wrapping, non-zero is `true`).
pub(crate) trait Elem: Element + Default + 'static + PartialOrd + std::fmt::Debug {
    /// The elements of `h`, if it holds this type.
    fn slice(h: &HostData) -> Option<&[Self]>;
    /// The vector of `h`, to grow and write, if it holds this type.
    fn vec_mut(h: &mut HostData) -> Option<&mut Vec<Self>>;
    /// The elements of a borrowed typed slice, if it holds this type.
    fn from_host_slice(h: HostSlice<'_>) -> Option<&[Self]>;
    /// A slice of this type as a [`HostSlice`].
    fn host_slice(s: &[Self]) -> HostSlice<'_>;
    /// Widens to `f64` (bool is 0/1).
    fn to_f64(self) -> f64;
    /// Converts to `i64` (floats truncate and saturate, as `Scalar::as_i64`).
    fn to_i64(self) -> i64;
    /// True if non-zero.
    fn nonzero(self) -> bool;
    /// Rounds from `f64` (integers truncate).
    fn from_f64(v: f64) -> Self;
    /// Wraps from `i64`.
    fn from_i64(v: i64) -> Self;
    /// `0` or `1`.
    fn from_bool(b: bool) -> Self;
}

macro_rules! elem_float {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Elem for $t {
            fn slice(h: &HostData) -> Option<&[Self]> {
                match h {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(h: &mut HostData) -> Option<&mut Vec<Self>> {
                match h {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_host_slice(h: HostSlice<'_>) -> Option<&[Self]> {
                match h {
                    HostSlice::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn host_slice(s: &[Self]) -> HostSlice<'_> {
                HostSlice::$variant(s)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            #[inline(always)]
            fn nonzero(self) -> bool {
                self.to_f64() != 0.0
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                Self::from_f64(v as f64)
            }
            #[inline(always)]
            fn from_bool(b: bool) -> Self {
                Self::from_f64(b as u8 as f64)
            }
        }
    };
}

elem_float!(f16, F16, |x| x.to_f64(), f16::from_f64);
elem_float!(bf16, BF16, |x| x.to_f64(), bf16::from_f64);
elem_float!(f32, F32, |x| x as f64, |v| v as f32);
elem_float!(f64, F64, |x| x, |v| v);

macro_rules! elem_int {
    ($t:ty, $variant:ident) => {
        impl Elem for $t {
            fn slice(h: &HostData) -> Option<&[Self]> {
                match h {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(h: &mut HostData) -> Option<&mut Vec<Self>> {
                match h {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_host_slice(h: HostSlice<'_>) -> Option<&[Self]> {
                match h {
                    HostSlice::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn host_slice(s: &[Self]) -> HostSlice<'_> {
                HostSlice::$variant(s)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn nonzero(self) -> bool {
                self != 0
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                // Rust `as`: truncate toward zero, saturate, NaN -> 0.
                v as $t
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_bool(b: bool) -> Self {
                b as $t
            }
        }
    };
}

elem_int!(u8, U8);
elem_int!(i32, I32);
elem_int!(i64, I64);

impl Elem for bool {
    fn vec_mut(h: &mut HostData) -> Option<&mut Vec<Self>> {
        match h {
            HostData::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn slice(h: &HostData) -> Option<&[Self]> {
        match h {
            HostData::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn from_host_slice(h: HostSlice<'_>) -> Option<&[Self]> {
        match h {
            HostSlice::Bool(v) => Some(v),
            _ => None,
        }
    }
    fn host_slice(s: &[Self]) -> HostSlice<'_> {
        HostSlice::Bool(s)
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn nonzero(self) -> bool {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    #[inline(always)]
    fn from_bool(b: bool) -> Self {
        b
    }
}

/// `x` converted to `B` exactly as [`Scalar::cast`] converts a scalar.
#[inline(always)]
pub(crate) fn cast_elem<A: Elem, B: Elem>(x: A) -> B {
    if B::DTYPE.is_float() {
        B::from_f64(x.to_f64())
    } else if B::DTYPE == DType::Bool {
        B::from_bool(x.nonzero())
    } else if A::DTYPE.is_float() {
        // Float to integer saturates; it must not pass through i64 and wrap.
        B::from_f64(x.to_f64())
    } else {
        B::from_i64(x.to_i64())
    }
}

/// A scalar converted to `T` with cast semantics.
pub(crate) fn from_scalar<T: Elem>(s: Scalar) -> T {
    match s.cast(T::DTYPE) {
        Scalar::Float(v) => T::from_f64(v),
        Scalar::Int(v) => T::from_i64(v),
        Scalar::Bool(b) => T::from_bool(b),
    }
}

/// A typed, borrowed strided view: the elements and the layout that
/// addresses them. Kernels read operands through this.
#[derive(Clone, Copy)]
pub(crate) struct View<'a, T> {
    /// The whole storage.
    pub data: &'a [T],
    /// Which elements, in which order.
    pub layout: &'a Layout,
}

/// The typed elements of a storage, or a backend error naming the mismatch
/// (a plan whose node dtypes disagree with its buffers).
pub(crate) fn typed<T: Elem>(h: &HostData) -> Result<&[T]> {
    T::slice(h)
        .ok_or_else(|| Error::Backend(format!("cpu: expected {} storage, found {}", T::DTYPE, h.dtype())))
}

/// Runs `$body` with `$T` bound to the Rust element type of `$dt`.
macro_rules! dispatch {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::ir::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::ir::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::ir::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::ir::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::ir::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::ir::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}
pub(crate) use dispatch;
