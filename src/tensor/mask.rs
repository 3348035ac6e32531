//! Triangular masks: `tril` and `triu` keep the elements on and below
//! (above) a diagonal of the last two dims and zero the rest, as PyTorch's.
//! Recorded as `arange`s, a comparison and a `where`, so fusion makes them
//! one kernel with whatever follows and autodiff needs no rule of its own
//! (the gradient is the same mask applied to the incoming gradient).

use super::{Operand, Tensor};
use crate::ir::{BinaryOp, CompareOp, DType, Op, Scalar, Shape};
use crate::{Context, Location};

impl Tensor {
    /// The lower triangle of the last two dims: element `[.., i, j]` is
    /// kept when `j - i <= diagonal`, zero otherwise (`torch.tril`). With
    /// `diagonal = 0` the main diagonal is kept; `-1` drops it too.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let x = ctx.ones([2, 3]).tril(0);
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Tensor {
        self.triangle("tril", diagonal, true, Location::caller())
    }

    /// The upper triangle of the last two dims: element `[.., i, j]` is
    /// kept when `j - i >= diagonal` (`torch.triu`).
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Tensor {
        self.triangle("triu", diagonal, false, Location::caller())
    }

    fn triangle(&self, op: &'static str, diagonal: i64, lower: bool, location: Location) -> Tensor {
        let Some(ctx) = self.context() else { return self.clone() };
        let rank = self.rank();
        if rank < 2 {
            return self.fail_shape(
                op,
                format!("{op} needs a tensor of rank >= 2, got {}", self.shape_ir()),
                location,
            );
        }
        let (m, n) = (self.shape()[rank - 2], self.shape()[rank - 1]);
        let keep = triangle_mask(ctx, m, n, diagonal, lower, location);
        keep.where_at(Operand::Tensor(self.clone()), Operand::Scalar(Scalar::Int(0)), location)
    }
}

/// The `[m, n]` bool mask of a triangle: `j - i <= diagonal` for the lower
/// one, `j - i >= diagonal` for the upper one.
pub(crate) fn triangle_mask(
    ctx: &Context,
    m: usize,
    n: usize,
    diagonal: i64,
    lower: bool,
    location: Location,
) -> Tensor {
    let range = |len: usize| {
        let op = Op::Arange { start: Scalar::Int(0), step: Scalar::Int(1) };
        ctx.record(op, &[], Some((Shape::new([len]), DType::I64)), location)
    };
    let rows = range(m).reshape_at(Shape::new([m, 1]), location);
    let cols = range(n).reshape_at(Shape::new([1, n]), location);
    let offset = cols.binary_at(Operand::Tensor(rows), BinaryOp::Sub, false, location);
    let op = if lower { CompareOp::Le } else { CompareOp::Ge };
    offset.compare_at(Operand::Scalar(Scalar::Int(diagonal)), op, location)
}
