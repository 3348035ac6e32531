//! Dimensions as users write them: `usize` as before, or a signed integer
//! where `-1` is the last dimension (PyTorch's convention), wherever an op
//! takes a dim. Negative dims are resolved against the tensor's rank when
//! the op is recorded; an unsigned dim passes through unchanged and the op
//! itself checks its range (so its message stays the op's own).

use super::Tensor;
use crate::{Error, Location};

/// A dimension index: `usize`, or `i32`/`i64`/`isize` counting from the
/// end when negative (`-1` is the last dimension).
///
/// ```
/// use kiln::prelude::*;
/// let ctx = Context::cpu();
/// let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
/// assert_eq!(x.sum(&[-1], false).to_vec::<f32>()?, x.sum(&[1], false).to_vec::<f32>()?);
/// assert_eq!(x.transpose(0, -1).shape(), &[3, 2]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub trait IntoDim: Copy + std::fmt::Debug {
    /// The dimension in `0..rank`, or the message for a negative dim
    /// below `-rank`. Non-negative values are returned as they are.
    fn resolve(self, rank: usize) -> Result<usize, String>;
}

impl IntoDim for usize {
    fn resolve(self, _rank: usize) -> Result<usize, String> {
        Ok(self)
    }
}

macro_rules! signed_dim {
    ($($t:ty),*) => {$(
        impl IntoDim for $t {
            fn resolve(self, rank: usize) -> Result<usize, String> {
                if self >= 0 {
                    return Ok(self as usize);
                }
                let back = (self as i64).unsigned_abs() as usize;
                rank.checked_sub(back).ok_or_else(|| {
                    format!(
                        "dim {self} is out of range for a tensor of rank {rank} (negative dims count from the end: -1 is the last, -{rank} the first)"
                    )
                })
            }
        }
    )*};
}
signed_dim!(i32, i64, isize);

impl Tensor {
    /// `dim` resolved against `rank` (the tensor's rank, or one more for
    /// ops that insert a dim), or a failed tensor saying why.
    pub(crate) fn dim_in(
        &self,
        op: &'static str,
        dim: impl IntoDim,
        rank: usize,
        location: Location,
    ) -> Result<usize, Tensor> {
        if let Some(e) = self.error() {
            return Err(Tensor::failed(e.clone()));
        }
        dim.resolve(rank).map_err(|message| Tensor::failed(Error::Shape { op, message, location }))
    }

    /// `dim` resolved against the tensor's rank.
    pub(crate) fn dim_of(
        &self,
        op: &'static str,
        dim: impl IntoDim,
        location: Location,
    ) -> Result<usize, Tensor> {
        self.dim_in(op, dim, self.rank(), location)
    }

    /// Every dim of `dims` resolved against the tensor's rank.
    pub(crate) fn dims_of<D: IntoDim>(
        &self,
        op: &'static str,
        dims: &[D],
        location: Location,
    ) -> Result<Vec<usize>, Tensor> {
        dims.iter().map(|&d| self.dim_of(op, d, location)).collect()
    }
}
