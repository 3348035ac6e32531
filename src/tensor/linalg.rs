//! Matrix multiplication, convolution and pooling.

use super::Tensor;
use crate::ir::{Op, PoolKind, Shape};
use crate::Location;

impl Tensor {
    /// Matrix product with `torch.matmul`'s rules: 1-D operands are
    /// promoted to a row (left) or column (right) vector and the added dim
    /// is removed afterwards; batch dimensions broadcast (without copying).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let a = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    /// let b = ctx.tensor(&[1.0f32, 1.0], [2]);
    /// assert_eq!(a.matmul(&b).to_vec::<f32>()?, vec![3.0, 7.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        let location = Location::caller();
        if let Some(failed) = [self, rhs].into_iter().find(|t| t.error().is_some()) {
            return failed.clone();
        }
        let (ra, rb) = (self.rank(), rhs.rank());
        if ra == 0 || rb == 0 {
            return self.fail_shape(
                "matmul",
                format!("matmul needs operands of rank >= 1, got {} and {}", self.shape_ir(), rhs.shape_ir()),
                location,
            );
        }
        let a = if ra == 1 { self.unsqueeze_at(0, location) } else { self.clone() };
        let b = if rb == 1 { rhs.unsqueeze_at(1, location) } else { rhs.clone() };
        let (sa, sb) = (a.shape_ir(), b.shape_ir());
        let (m, k) = (sa.0[sa.rank() - 2], sa.0[sa.rank() - 1]);
        let (k2, n) = (sb.0[sb.rank() - 2], sb.0[sb.rank() - 1]);
        if k != k2 {
            return self.fail_shape(
                "matmul",
                format!(
                    "matmul of {} and {}: the inner dimensions {k} and {k2} differ",
                    self.shape_ir(),
                    rhs.shape_ir()
                ),
                location,
            );
        }
        if sa.rank() > 2 && sb.rank() == 2 {
            // A stack of matrices times one matrix is one product of all
            // their rows, as `torch.matmul` computes it: one GEMM with the
            // batch in its rows instead of a batched GEMM over a broadcast
            // right side, whose gradient would be a batch of per-matrix
            // products summed afterwards (for a linear layer's weight, B
            // times its size written and read again).
            let rows: usize = sa.0[..sa.rank() - 1].iter().product();
            let flat = a.reshape_at(Shape::new([rows, k]), location);
            let out = Tensor::record(&[&flat, &b], Op::MatMul, None, location);
            let mut dims = sa.0[..sa.rank() - 1].to_vec();
            if rb != 1 {
                dims.push(n);
            }
            return out.reshape_at(Shape(dims), location);
        }
        let batch_a = Shape::new(&sa.0[..sa.rank() - 2]);
        let batch_b = Shape::new(&sb.0[..sb.rank() - 2]);
        let batch = match batch_a.broadcast(&batch_b) {
            Ok(b) => b,
            Err(message) => return self.fail_shape("matmul", format!("batch dims: {message}"), location),
        };
        let with = |mut dims: Vec<usize>, x: usize, y: usize| {
            dims.extend([x, y]);
            Shape(dims)
        };
        let a = a.broadcast_at(with(batch.0.clone(), m, k), location);
        let b = b.broadcast_at(with(batch.0.clone(), k, n), location);
        let out = Tensor::record(&[&a, &b], Op::MatMul, None, location);
        let mut dims = with(batch.0, m, n).0;
        if rb == 1 {
            dims.pop();
        }
        if ra == 1 {
            let at = dims.len() - if rb == 1 { 1 } else { 2 };
            dims.remove(at);
        }
        out.reshape_at(Shape(dims), location)
    }

    /// 2-D convolution (cross-correlation, as PyTorch) of an NCHW input
    /// with an OIHW weight (`I = C / groups`); the same `stride`,
    /// `padding` (zeros) and `dilation` in both spatial dims. No bias: add
    /// one with `+`.
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> Tensor {
        let op = Op::Conv2d { stride: [stride; 2], padding: [padding; 2], dilation: [dilation; 2], groups };
        Tensor::record(&[self, weight], op, None, Location::caller())
    }

    /// Max pooling over `kernel x kernel` windows of an NCHW input; padding
    /// never wins.
    #[track_caller]
    pub fn max_pool2d(&self, kernel: usize, stride: usize, padding: usize) -> Tensor {
        self.pool_at(PoolKind::Max, kernel, stride, padding, Location::caller())
    }

    /// The gradient of [`Tensor::max_pool2d`] with respect to its input
    /// `self`, given `grad`, the gradient of its result: each window's
    /// gradient added at the window's maximum (the first of tied maxima,
    /// the last NaN of a window holding any, as PyTorch's
    /// `max_pool2d_with_indices_backward` routes it), zeros elsewhere.
    /// What `backward` records for a max pooling; exposed for custom
    /// gradients and for testing.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let x = ctx.tensor(&[1.0f32, 3.0, 3.0, 2.0], [1, 1, 2, 2]);
    /// let g = ctx.tensor(&[5.0f32], [1, 1, 1, 1]);
    /// assert_eq!(x.max_pool2d_grad(&g, 2, 2, 0).to_vec::<f32>()?, vec![0.0, 5.0, 0.0, 0.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d_grad(&self, grad: &Tensor, kernel: usize, stride: usize, padding: usize) -> Tensor {
        let op = Op::MaxPool2dGrad { kernel: [kernel; 2], stride: [stride; 2], padding: [padding; 2] };
        Tensor::record(&[self, grad], op, None, Location::caller())
    }

    /// Average pooling over `kernel x kernel` windows of an NCHW input;
    /// padding counts as zeros (PyTorch's `count_include_pad=True`).
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: usize, stride: usize, padding: usize) -> Tensor {
        self.pool_at(PoolKind::Avg, kernel, stride, padding, Location::caller())
    }

    fn pool_at(
        &self,
        kind: PoolKind,
        kernel: usize,
        stride: usize,
        padding: usize,
        location: Location,
    ) -> Tensor {
        let op = Op::Pool2d { kind, kernel: [kernel; 2], stride: [stride; 2], padding: [padding; 2] };
        Tensor::record(&[self], op, None, location)
    }
}
