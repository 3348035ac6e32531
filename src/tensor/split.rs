//! `split` and `chunk`: a tensor cut along one dim into views (`narrow`s,
//! no copies), as PyTorch's. They return a `Result` rather than a failed
//! tensor because how many pieces there are depends on the arguments.

use super::{IntoDim, Tensor};
use crate::{Error, Location, Result};

impl Tensor {
    /// Pieces of `size` along `dim`; the last is smaller when `size` does
    /// not divide the dim (`torch.split(x, size, dim)`).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let x = ctx.arange(0i64, 5, 1);
    /// let parts = x.split(2, -1)?;
    /// assert_eq!(parts.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(), [2, 2, 1]);
    /// assert_eq!(parts[2].to_vec::<i64>()?, vec![4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn split(&self, size: usize, dim: impl IntoDim) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let (dim, n) = self.split_dim("split", dim, location)?;
        if size == 0 && n > 0 {
            return Err(Error::Argument {
                op: "split",
                message: format!("split size must be at least 1 to cut dim {dim} of size {n}"),
                location,
            });
        }
        let sizes: Vec<usize> =
            if n == 0 { vec![0] } else { (0..n).step_by(size).map(|s| size.min(n - s)).collect() };
        Ok(self.pieces(dim, &sizes, location))
    }

    /// Pieces of the given sizes along `dim`, which must add up to the
    /// dim's size (`torch.split(x, [a, b, c], dim)`).
    #[track_caller]
    pub fn split_sizes(&self, sizes: &[usize], dim: impl IntoDim) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let (dim, n) = self.split_dim("split_sizes", dim, location)?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(n) {
            return Err(Error::Shape {
                op: "split_sizes",
                message: format!(
                    "sizes {sizes:?} add up to {} but dim {dim} of {} has size {n}",
                    total.map_or("more than usize holds".to_string(), |t| t.to_string()),
                    self.shape_ir()
                ),
                location,
            });
        }
        Ok(self.pieces(dim, sizes, location))
    }

    /// `chunks` pieces of equal size along `dim` (the last smaller), or
    /// fewer when the dim is too short, as `torch.chunk`: each piece has
    /// `ceil(size / chunks)` elements.
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: impl IntoDim) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let (dim, n) = self.split_dim("chunk", dim, location)?;
        if chunks == 0 {
            return Err(Error::Argument {
                op: "chunk",
                message: "chunk needs at least one chunk".into(),
                location,
            });
        }
        let size = n.div_ceil(chunks).max(1);
        let sizes: Vec<usize> =
            if n == 0 { vec![0] } else { (0..n).step_by(size).map(|s| size.min(n - s)).collect() };
        Ok(self.pieces(dim, &sizes, location))
    }

    /// The resolved dim and its size, or the error.
    fn split_dim(&self, op: &'static str, dim: impl IntoDim, location: Location) -> Result<(usize, usize)> {
        if let Some(e) = self.error() {
            return Err(e.clone());
        }
        let dim = self
            .dim_of(op, dim, location)
            .map_err(|t| t.error().cloned().unwrap_or(Error::Backend(op.into())))?;
        match self.shape().get(dim) {
            Some(&n) => Ok((dim, n)),
            None => Err(Error::Shape {
                op,
                message: format!("dim {dim} is out of range for {} (rank {})", self.shape_ir(), self.rank()),
                location,
            }),
        }
    }

    fn pieces(&self, dim: usize, sizes: &[usize], location: Location) -> Vec<Tensor> {
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let piece = self.narrow_at(dim, start, len, location);
                start += len;
                piece
            })
            .collect()
    }
}
