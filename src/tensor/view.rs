//! Views: ops that re-index without arithmetic. Backends answer them with
//! a new layout over the same bytes where strides allow (no copy).

use super::{IntoDim, Tensor};
use crate::ir::{Op, Shape};
use crate::{Error, Location};

impl Tensor {
    /// The same elements (row-major order) with a new shape.
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> Tensor {
        self.reshape_at(shape.into(), Location::caller())
    }

    pub(crate) fn reshape_at(&self, shape: Shape, location: Location) -> Tensor {
        if self.error().is_none() && shape.dims() == self.shape() {
            return self.clone();
        }
        Tensor::record(&[self], Op::Reshape(shape), None, location)
    }

    /// All dimensions flattened into one.
    #[track_caller]
    pub fn flatten(&self) -> Tensor {
        self.reshape_at(Shape::new([self.numel()]), Location::caller())
    }

    /// Reorders dimensions: dimension `i` of the result is dimension
    /// `perm[i]` of `self`.
    #[track_caller]
    pub fn permute<D: IntoDim>(&self, perm: &[D]) -> Tensor {
        let location = Location::caller();
        match self.dims_of("permute", perm, location) {
            Ok(perm) => Tensor::record(&[self], Op::Permute(perm), None, location),
            Err(failed) => failed,
        }
    }

    /// Swaps two dimensions.
    #[track_caller]
    pub fn transpose(&self, dim0: impl IntoDim, dim1: impl IntoDim) -> Tensor {
        let location = Location::caller();
        match (self.dim_of("transpose", dim0, location), self.dim_of("transpose", dim1, location)) {
            (Ok(a), Ok(b)) => self.transpose_at(a, b, location),
            (Err(failed), _) | (_, Err(failed)) => failed,
        }
    }

    pub(crate) fn transpose_at(&self, dim0: usize, dim1: usize, location: Location) -> Tensor {
        let rank = self.rank();
        if dim0 >= rank || dim1 >= rank {
            return self.fail_shape(
                "transpose",
                format!("dims {dim0} and {dim1} for a tensor of rank {rank}"),
                location,
            );
        }
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(dim0, dim1);
        Tensor::record(&[self], Op::Permute(perm), None, location)
    }

    /// The transpose of a matrix (the last two dims swapped).
    #[track_caller]
    pub fn t(&self) -> Tensor {
        let location = Location::caller();
        let rank = self.rank();
        if rank < 2 {
            return self.fail_shape("t", format!("t needs rank >= 2, got {}", self.shape_ir()), location);
        }
        self.transpose_at(rank - 2, rank - 1, location)
    }

    /// Numpy broadcast to `shape`: dims of size 1 repeat, new dims are added
    /// in front. No data is copied.
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Tensor {
        self.broadcast_at(shape.into(), Location::caller())
    }

    pub(crate) fn broadcast_at(&self, shape: Shape, location: Location) -> Tensor {
        if self.error().is_none() && shape.dims() == self.shape() {
            return self.clone();
        }
        Tensor::record(&[self], Op::Expand(shape), None, location)
    }

    /// `len` elements of dimension `dim` from `start` (PyTorch `narrow`).
    #[track_caller]
    pub fn narrow(&self, dim: impl IntoDim, start: usize, len: usize) -> Tensor {
        self.narrow_at(dim, start, len, Location::caller())
    }

    pub(crate) fn narrow_at(
        &self,
        dim: impl IntoDim,
        start: usize,
        len: usize,
        location: Location,
    ) -> Tensor {
        let dim = match self.dim_of("narrow", dim, location) {
            Ok(d) => d,
            Err(failed) => return failed,
        };
        match self.shape().get(dim) {
            _ if self.error().is_some() => self.clone(),
            None => self.fail_shape(
                "narrow",
                format!("dim {dim} is out of range for rank {}", self.rank()),
                location,
            ),
            Some(&size) if start.checked_add(len).is_none_or(|end| end > size) => self.fail_shape(
                "narrow",
                format!(
                    "{len} element(s) from {start} run past the end of dim {dim} (size {size}) of {}",
                    self.shape_ir()
                ),
                location,
            ),
            Some(_) => Tensor::record(&[self], Op::Slice { dim, start, step: 1, len }, None, location),
        }
    }

    /// Elements `start..end` of dimension `dim`, every `step`-th
    /// (`x[:, start:end:step]` in Python).
    #[track_caller]
    pub fn slice(&self, dim: impl IntoDim, start: usize, end: usize, step: usize) -> Tensor {
        let location = Location::caller();
        let dim = match self.dim_of("slice", dim, location) {
            Ok(d) => d,
            Err(failed) => return failed,
        };
        if step == 0 || end < start {
            return self.fail_shape(
                "slice",
                format!("slice {start}..{end} step {step} is empty or backwards"),
                location,
            );
        }
        let len = (end - start).div_ceil(step);
        Tensor::record(&[self], Op::Slice { dim, start, step, len }, None, location)
    }

    /// Removes dimension `dim`, which must have size 1.
    #[track_caller]
    pub fn squeeze(&self, dim: impl IntoDim) -> Tensor {
        let location = Location::caller();
        let dim = match self.dim_of("squeeze", dim, location) {
            Ok(d) => d,
            Err(failed) => return failed,
        };
        match self.shape().get(dim) {
            Some(1) => {
                let mut dims = self.shape().to_vec();
                dims.remove(dim);
                self.reshape_at(Shape(dims), location)
            }
            _ => self.fail_shape(
                "squeeze",
                format!("dim {dim} of {} is not of size 1", self.shape_ir()),
                location,
            ),
        }
    }

    /// Inserts a dimension of size 1 at `dim` (`0..=rank`; `-1` appends
    /// one, as in PyTorch).
    #[track_caller]
    pub fn unsqueeze(&self, dim: impl IntoDim) -> Tensor {
        let location = Location::caller();
        match self.dim_in("unsqueeze", dim, self.rank() + 1, location) {
            Ok(d) => self.unsqueeze_at(d, location),
            Err(failed) => failed,
        }
    }

    pub(crate) fn unsqueeze_at(&self, dim: usize, location: Location) -> Tensor {
        if dim > self.rank() {
            return self.fail_shape(
                "unsqueeze",
                format!("dim {dim} for a tensor of rank {}", self.rank()),
                location,
            );
        }
        let mut dims = self.shape().to_vec();
        dims.insert(dim, 1);
        self.reshape_at(Shape(dims), location)
    }

    /// A failed tensor with a shape error, unless `self` already failed.
    pub(crate) fn fail_shape(&self, op: &'static str, message: String, location: Location) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        Tensor::failed(Error::Shape { op, message, location })
    }
}
