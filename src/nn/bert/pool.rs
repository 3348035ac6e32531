//! sentence-transformers' pooling: the mean of the token vectors a mask
//! keeps, then unit length.

use crate::DType;
use crate::Tensor;

/// The mean over the sequence of `hidden` (`[batch, seq, width]`) where
/// `mask` (`[batch, seq]`, 1 for a token, 0 for padding, any numeric
/// dtype) is set, in f32 whatever `hidden`'s dtype: `[batch, width]`.
/// A row with no token gives zeros (its count is clamped to 1e-9, as
/// sentence-transformers does).
#[track_caller]
pub fn mean_pool(hidden: &Tensor, mask: &Tensor) -> Tensor {
    let h = hidden.cast(DType::F32);
    let m = mask.cast(DType::F32).unsqueeze(-1);
    let summed = (&h * &m).sum(&[1], false);
    let count = m.sum(&[1], false).maximum(1e-9f32);
    summed / count
}

/// Each row of `x` (`[.., width]`) divided by its Euclidean norm (at
/// least 1e-12), as `F.normalize(x, dim=-1)`.
#[track_caller]
pub fn normalize(x: &Tensor) -> Tensor {
    let norm = (x * x).sum(&[-1], true).sqrt().maximum(1e-12f32);
    x / norm
}
