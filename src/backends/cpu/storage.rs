//! Typed, reference-counted element storage and the element trait kernels
//! are generic over.
//!
//! A [`Storage`] owns one typed vector (a [`HostData`]) and reports its size
//! to the backend's [`DeviceStats`] when created and when dropped, so the
//! counters see every allocation however many views share it.

use super::layout::Layout;
use crate::backends::DeviceStats;
use crate::ir::{DType, Element, HostData, Scalar};
use crate::{Error, Result};
use half::{bf16, f16};
use std::sync::Arc;

/// One allocation: typed elements plus the counters to credit on drop.
#[derive(Debug)]
pub struct Storage {
    data: HostData,
    bytes: u64,
    stats: Arc<DeviceStats>,
}

impl Storage {
    /// Takes ownership of `data` and records its bytes as allocated.
    pub(crate) fn new(data: HostData, stats: &Arc<DeviceStats>) -> Arc<Storage> {
        let bytes = (data.len() * data.dtype().size()) as u64;
        stats.allocated(bytes);
        Arc::new(Storage { data, bytes, stats: stats.clone() })
    }

    /// The elements.
    pub(crate) fn data(&self) -> &HostData {
        &self.data
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.stats.freed(self.bytes);
        super::pool::give_back(std::mem::replace(&mut self.data, HostData::U8(Vec::new())));
    }
}

/// A typed element of CPU storage: the conversions kernels need, with
/// the semantics of [`Scalar::cast`] (floats via `f64`, integers via `i64`
/// wrapping, non-zero is `true`).
pub(crate) trait Elem: Element + Default + PartialOrd + std::fmt::Debug {
    /// The elements of `h`, if it holds this type.
    fn slice(h: &HostData) -> Option<&[Self]>;
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
    fn slice(h: &HostData) -> Option<&[Self]> {
        match h {
            HostData::Bool(v) => Some(v),
            _ => None,
        }
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
