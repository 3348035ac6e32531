//! `write_at`: a tensor with a window along one dim replaced, at an offset
//! that may change every run without compiling anything new. A KV cache
//! is a variable updated this way (`Variable::write_at`).

use super::{IntoDim, Tensor};
use crate::ir::{DType, Op};
use crate::Location;

/// Where a [`Tensor::write_at`] window starts along its dim.
#[derive(Clone, Debug)]
pub enum Offset {
    /// A host number, checked against the sizes when the write is recorded
    /// and uploaded as a runtime value (a new offset compiles nothing new).
    Host(usize),
    /// A 0-d i64 or i32 tensor, read on the device: clamped to the last
    /// start at which the window fits (XLA's `dynamic_update_slice`), since
    /// a device value cannot be checked when the write is recorded.
    Device(Tensor),
}

impl From<usize> for Offset {
    fn from(at: usize) -> Offset {
        Offset::Host(at)
    }
}

impl From<&Tensor> for Offset {
    fn from(at: &Tensor) -> Offset {
        Offset::Device(at.clone())
    }
}

impl From<Tensor> for Offset {
    fn from(at: Tensor) -> Offset {
        Offset::Device(at)
    }
}

impl Tensor {
    /// `self` with `value` written over the window that starts at `offset`
    /// along `dim`: `value` has `self`'s shape except along `dim`, where
    /// it may be shorter. Like every op it makes a new value (`self` is
    /// unchanged); [`crate::Variable::write_at`] updates a variable with
    /// it.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let cache = ctx.zeros([2, 4]);
    /// let row = ctx.tensor(&[1.0f32, 2.0], [2, 1]);
    /// let written = cache.write_at(1, 2, &row);
    /// assert_eq!(written.to_vec::<f32>()?, vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]);
    /// // A device offset (here an argument of a captured step would do) is clamped:
    /// let late = cache.write_at(1, &ctx.scalar(9i64), &row);
    /// assert_eq!(late.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn write_at(&self, dim: impl IntoDim, offset: impl Into<Offset>, value: &Tensor) -> Tensor {
        let location = Location::caller();
        let dim = match self.dim_of("write_at", dim, location) {
            Ok(dim) => dim,
            Err(failed) => return failed,
        };
        let offset = match offset.into() {
            Offset::Device(t) => t,
            Offset::Host(at) => {
                // An out-of-range dim or a value of another rank is the
                // op's shape error (below); only a window that fits the
                // shapes but not at this offset is caught here.
                let size = self.shape().get(dim).copied().unwrap_or(usize::MAX);
                let len = value.shape().get(dim).copied().unwrap_or(0);
                if value.error().is_none() && value.rank() == self.rank() && at.saturating_add(len) > size {
                    return self.fail_shape(
                        "write_at",
                        format!(
                            "a window of {len} at offset {at} along dim {dim} ends at {} but the dim has size {size}",
                            at + len
                        ),
                        location,
                    );
                }
                let Some(ctx) = self.context() else { return self.clone() };
                let at = i64::try_from(at).unwrap_or(i64::MAX);
                ctx.scalar(at)
            }
        };
        if offset.error().is_none()
            && (!matches!(offset.dtype(), DType::I64 | DType::I32) || offset.rank() != 0)
        {
            return Tensor::failed(crate::Error::DType {
                op: "write_at",
                message: format!(
                    "the offset must be a 0-d i64 or i32 tensor, got {}{:?}",
                    offset.dtype(),
                    offset.shape()
                ),
                location,
            });
        }
        Tensor::record(&[self, value, &offset], Op::WriteAt { dim }, None, location)
    }
}
