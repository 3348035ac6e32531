//! Creating tensors: from host data, constants, ranges, random numbers.

use super::Tensor;
use crate::context::Context;
use crate::ir::{DType, Distribution, Element, Op, Scalar, Shape};
use crate::{Error, Location};

impl Context {
    /// A tensor holding `data` (row-major) with the given shape; the dtype
    /// is `T`'s. The data is copied to the device now.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let t = ctx.tensor(&[1i64, 2, 3, 4, 5, 6], [2, 3]);
    /// assert_eq!(t.shape(), &[2, 3]);
    /// assert_eq!(t.dtype(), DType::I64);
    /// ```
    #[track_caller]
    pub fn tensor<T: Element>(&self, data: &[T], shape: impl Into<Shape>) -> Tensor {
        let location = Location::caller();
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Tensor::failed(Error::Shape {
                op: "tensor",
                message: format!(
                    "{} value(s) given for shape {shape}, which holds {}",
                    data.len(),
                    shape.numel()
                ),
                location,
            });
        }
        match self.inner.backend.upload(T::into_host(data.to_vec()), &shape) {
            Ok(buffer) => self.record_buffer(buffer),
            Err(e) => Tensor::failed(e),
        }
    }

    /// An `f32` tensor of zeros.
    #[track_caller]
    pub fn zeros(&self, shape: impl Into<Shape>) -> Tensor {
        self.full_at(shape.into(), Scalar::Int(0), DType::F32, Location::caller())
    }

    /// A tensor of zeros of the given dtype.
    #[track_caller]
    pub fn zeros_dtype(&self, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        self.full_at(shape.into(), Scalar::Int(0), dtype, Location::caller())
    }

    /// An `f32` tensor of ones.
    #[track_caller]
    pub fn ones(&self, shape: impl Into<Shape>) -> Tensor {
        self.full_at(shape.into(), Scalar::Int(1), DType::F32, Location::caller())
    }

    /// A tensor of ones of the given dtype.
    #[track_caller]
    pub fn ones_dtype(&self, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        self.full_at(shape.into(), Scalar::Int(1), dtype, Location::caller())
    }

    /// An `f32` tensor with every element `value` (rounded to f32).
    #[track_caller]
    pub fn full(&self, shape: impl Into<Shape>, value: impl Element) -> Tensor {
        self.full_at(shape.into(), value.to_scalar(), DType::F32, Location::caller())
    }

    /// A tensor of the given dtype with every element `value`.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let t = ctx.full_dtype([3], 7, DType::I32);
    /// assert_eq!(t.to_vec::<i32>()?, vec![7, 7, 7]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn full_dtype(&self, shape: impl Into<Shape>, value: impl Element, dtype: DType) -> Tensor {
        self.full_at(shape.into(), value.to_scalar(), dtype, Location::caller())
    }

    pub(crate) fn full_at(&self, shape: Shape, value: Scalar, dtype: DType, location: Location) -> Tensor {
        let Some(value) = value.fit_to(dtype) else {
            return Tensor::failed(Error::DType {
                op: "full",
                message: format!(
                    "the value {} does not fit {dtype} (a fraction or out-of-range value for an integer dtype, or an overflow to infinity)",
                    value.format(DType::F64)
                ),
                location,
            });
        };
        self.record(Op::Full(value), &[], Some((shape, dtype)), location)
    }

    /// `start, start + step, ...` up to but excluding `end`, of `T`'s dtype.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// assert_eq!(ctx.arange(0i64, 5, 2).to_vec::<i64>()?, vec![0, 2, 4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn arange<T: Element>(&self, start: T, end: T, step: T) -> Tensor {
        let location = Location::caller();
        let dtype = T::DTYPE;
        let (s, e, st) = (start.to_scalar(), end.to_scalar(), step.to_scalar());
        let fail = |message: String| Tensor::failed(Error::Shape { op: "arange", message, location });
        if dtype == DType::Bool {
            return Tensor::failed(Error::DType {
                op: "arange",
                message: "arange needs a numeric dtype, got bool".into(),
                location,
            });
        }
        let count = if dtype.is_float() {
            let (s, e, st) = (s.as_f64(), e.as_f64(), st.as_f64());
            if st == 0.0 || !st.is_finite() || !s.is_finite() || !e.is_finite() {
                return fail(format!(
                    "arange needs finite bounds and a non-zero step, got {s}..{e} step {st}"
                ));
            }
            ((e - s) / st).ceil().max(0.0) as usize
        } else {
            let (s, e, st) = (s.as_i64() as i128, e.as_i64() as i128, st.as_i64() as i128);
            if st == 0 {
                return fail("arange needs a non-zero step".into());
            }
            let span = e - s;
            if (span > 0) != (st > 0) || span == 0 {
                0
            } else {
                ((span + st - st.signum()) / st) as usize
            }
        };
        self.record(Op::Arange { start: s, step: st }, &[], Some((Shape::new([count]), dtype)), location)
    }

    /// `f32` numbers uniform on `[0, 1)`.
    #[track_caller]
    pub fn rand(&self, shape: impl Into<Shape>) -> Tensor {
        self.random_at(shape.into(), Distribution::Uniform, DType::F32, Location::caller())
    }

    /// Uniform numbers on `[0, 1)` of a float dtype.
    #[track_caller]
    pub fn rand_dtype(&self, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        self.random_at(shape.into(), Distribution::Uniform, dtype, Location::caller())
    }

    /// `f32` numbers from the standard normal distribution.
    #[track_caller]
    pub fn randn(&self, shape: impl Into<Shape>) -> Tensor {
        self.random_at(shape.into(), Distribution::Normal, DType::F32, Location::caller())
    }

    /// Standard normal numbers of a float dtype.
    #[track_caller]
    pub fn randn_dtype(&self, shape: impl Into<Shape>, dtype: DType) -> Tensor {
        self.random_at(shape.into(), Distribution::Normal, dtype, Location::caller())
    }

    fn random_at(&self, shape: Shape, dist: Distribution, dtype: DType, location: Location) -> Tensor {
        if !dtype.is_float() {
            return Tensor::failed(Error::DType {
                op: if dist == Distribution::Uniform { "rand" } else { "randn" },
                message: format!("random numbers need a float dtype, got {dtype}"),
                location,
            });
        }
        // The stream is assigned by `record`.
        self.record(Op::Random { dist, stream: 0 }, &[], Some((shape, dtype)), location)
    }
}
