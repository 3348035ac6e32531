//! Reductions, and the softmax family built from them.
//!
//! `softmax` and `log_softmax` are recorded as primitives (max, sub, exp,
//! sum, div / log): the fusion pass is what puts them back into one kernel
//! per row block, and keeping them primitive lets every later pass (and
//! autodiff) see through them.

use super::{IntoDim, Tensor};
use crate::ir::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::{Error, Location};

impl Tensor {
    /// Sum over `dims` (negative dims count from the end; integers wrap in their dtype; floats accumulate in
    /// f64). With `keepdim` the reduced dims stay as size 1.
    #[track_caller]
    pub fn sum<D: IntoDim>(&self, dims: &[D], keepdim: bool) -> Tensor {
        let location = Location::caller();
        match self.dims_of("sum", dims, location) {
            Ok(dims) => self.reduce_at(ReduceOp::Sum, &dims, keepdim, location),
            Err(failed) => failed,
        }
    }

    /// Sum of every element, as a scalar tensor.
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        let dims: Vec<usize> = (0..self.rank()).collect();
        self.reduce_at(ReduceOp::Sum, &dims, false, Location::caller())
    }

    /// Mean over `dims` (float dtypes).
    #[track_caller]
    pub fn mean<D: IntoDim>(&self, dims: &[D], keepdim: bool) -> Tensor {
        let location = Location::caller();
        match self.dims_of("mean", dims, location) {
            Ok(dims) => self.reduce_at(ReduceOp::Mean, &dims, keepdim, location),
            Err(failed) => failed,
        }
    }

    /// Maximum over `dims` (NaN wins).
    #[track_caller]
    pub fn max<D: IntoDim>(&self, dims: &[D], keepdim: bool) -> Tensor {
        let location = Location::caller();
        match self.dims_of("max", dims, location) {
            Ok(dims) => self.reduce_at(ReduceOp::Max, &dims, keepdim, location),
            Err(failed) => failed,
        }
    }

    /// Minimum over `dims` (NaN wins).
    #[track_caller]
    pub fn min<D: IntoDim>(&self, dims: &[D], keepdim: bool) -> Tensor {
        let location = Location::caller();
        match self.dims_of("min", dims, location) {
            Ok(dims) => self.reduce_at(ReduceOp::Min, &dims, keepdim, location),
            Err(failed) => failed,
        }
    }

    /// Index (`i64`) of the first maximum along `dim` (a NaN counts as the
    /// maximum, as in PyTorch).
    #[track_caller]
    pub fn argmax(&self, dim: impl IntoDim, keepdim: bool) -> Tensor {
        let location = Location::caller();
        match self.dim_of("argmax", dim, location) {
            Ok(dim) => self.reduce_at(ReduceOp::ArgMax, &[dim], keepdim, location),
            Err(failed) => failed,
        }
    }

    pub(crate) fn reduce_at(
        &self,
        op: ReduceOp,
        dims: &[usize],
        keepdim: bool,
        location: Location,
    ) -> Tensor {
        let mut sorted = dims.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return self.fail_shape(op.mnemonic(), format!("dims {dims:?} name a dimension twice"), location);
        }
        Tensor::record(&[self], Op::Reduce { op, dims: sorted, keepdim, into: None }, None, location)
    }

    /// `exp(x) / sum(exp(x))` along `dim`, computed stably (the row maximum
    /// is subtracted first). Recorded as max, sub, exp, sum, div.
    #[track_caller]
    pub fn softmax(&self, dim: impl IntoDim) -> Tensor {
        let location = Location::caller();
        let dim = match self.dim_of("softmax", dim, location) {
            Ok(d) => d,
            Err(failed) => return failed,
        };
        let e = self.shifted_at("softmax", dim, location).unary_at(UnaryOp::Exp, location);
        let s = e.reduce_at(ReduceOp::Sum, &[dim], true, location);
        e.binary_at(s.into_operand_tensor(), BinaryOp::Div, false, location)
    }

    /// `log(softmax(x))` along `dim`, computed as `x - max - log(sum(exp(x - max)))`.
    #[track_caller]
    pub fn log_softmax(&self, dim: impl IntoDim) -> Tensor {
        let location = Location::caller();
        let dim = match self.dim_of("log_softmax", dim, location) {
            Ok(d) => d,
            Err(failed) => return failed,
        };
        let shifted = self.shifted_at("log_softmax", dim, location);
        let lse = shifted.unary_at(UnaryOp::Exp, location).reduce_at(ReduceOp::Sum, &[dim], true, location);
        shifted.binary_at(
            lse.unary_at(UnaryOp::Log, location).into_operand_tensor(),
            BinaryOp::Sub,
            false,
            location,
        )
    }

    /// Layer normalization over the last dimension, as PyTorch's
    /// `F.layer_norm(x, [n], weight, bias, eps)`, that is
    /// `(x - mean) / sqrt(var + eps) * weight + bias` with the biased
    /// variance. `weight` and `bias` have shape `[n]`. Recorded as
    /// primitives (mean, sub, mul, mean, add, rsqrt, mul, mul, add), which
    /// fusion turns into one kernel per row block.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [1, 4]);
    /// let (w, b) = (ctx.ones([4]), ctx.zeros([4]));
    /// let y = x.layer_norm(&w, &b, 0.0).to_vec::<f32>()?;
    /// assert!((y[0] + 1.3416).abs() < 1e-4 && (y[3] - 1.3416).abs() < 1e-4);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn layer_norm(&self, weight: &Tensor, bias: &Tensor, eps: f64) -> Tensor {
        let location = Location::caller();
        if self.error().is_some() {
            return self.clone();
        }
        let Some(last) = self.rank().checked_sub(1) else {
            return self.fail_shape("layer_norm", "layer_norm needs at least one dimension".into(), location);
        };
        let n = self.shape()[last];
        for (what, t) in [("weight", weight), ("bias", bias)] {
            if t.error().is_none() && t.shape() != [n] {
                return self.fail_shape(
                    "layer_norm",
                    format!("{what} has shape {:?}, but it must be [{n}] (the last dimension)", t.shape()),
                    location,
                );
            }
        }
        let mean = self.reduce_at(ReduceOp::Mean, &[last], true, location);
        let centered = self.binary_at(mean.into_operand_tensor(), BinaryOp::Sub, false, location);
        let var = centered
            .binary_at(centered.clone().into_operand_tensor(), BinaryOp::Mul, false, location)
            .reduce_at(ReduceOp::Mean, &[last], true, location);
        let eps = super::elementwise::Operand::Scalar(crate::ir::Scalar::Float(eps));
        let inv = var.binary_at(eps, BinaryOp::Add, false, location).unary_at(UnaryOp::Rsqrt, location);
        centered
            .binary_at(inv.into_operand_tensor(), BinaryOp::Mul, false, location)
            .binary_at(weight.clone().into_operand_tensor(), BinaryOp::Mul, false, location)
            .binary_at(bias.clone().into_operand_tensor(), BinaryOp::Add, false, location)
    }

    /// `x - max(x, dim, keepdim)`, after checking `dim` and the dtype.
    fn shifted_at(&self, op: &'static str, dim: usize, location: Location) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        if dim >= self.rank() {
            return self.fail_shape(
                op,
                format!("dim {dim} is out of range for rank {}", self.rank()),
                location,
            );
        }
        if !self.dtype().is_float() {
            return Tensor::failed(Error::DType {
                op,
                message: format!("{op} needs a float tensor, got {}; cast it first", self.dtype()),
                location,
            });
        }
        // The maximum only keeps exp from overflowing: both functions are
        // shift-invariant, so it gets no gradient (exact, and cheaper).
        let m = self.reduce_at(ReduceOp::Max, &[dim], true, location);
        m.mark_detached();
        self.binary_at(m.into_operand_tensor(), BinaryOp::Sub, false, location)
    }

    fn into_operand_tensor(self) -> super::elementwise::Operand {
        super::elementwise::Operand::Tensor(self)
    }
}
