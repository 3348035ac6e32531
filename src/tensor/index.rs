//! Indexing and joining: `gather`, `index_select`, `cat`, `stack`.

use super::Tensor;
use crate::ir::Op;
use crate::{Error, Location};

impl Tensor {
    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim == 0` (and so
    /// on), as `torch.gather`. `index` is i64 or i32 and has `self`'s rank;
    /// an out-of-range index is an error when the value is read.
    #[track_caller]
    pub fn gather(&self, dim: usize, index: &Tensor) -> Tensor {
        Tensor::record(&[self, index], Op::Gather { dim }, None, Location::caller())
    }

    /// The entries of `self` at `index` (1-D, i64 or i32) along `dim`.
    #[track_caller]
    pub fn index_select(&self, dim: usize, index: &Tensor) -> Tensor {
        Tensor::record(&[self, index], Op::IndexSelect { dim }, None, Location::caller())
    }

    /// Joins tensors along `dim`; all other dims must match.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let a = ctx.ones([2]);
    /// let b = ctx.zeros([1]);
    /// assert_eq!(Tensor::cat(&[&a, &b], 0).to_vec::<f32>()?, vec![1.0, 1.0, 0.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Tensor {
        Tensor::cat_at(tensors, dim, Location::caller())
    }

    fn cat_at(tensors: &[&Tensor], dim: usize, location: Location) -> Tensor {
        match tensors {
            [] => Tensor::failed(Error::Shape { op: "cat", message: "cat of no tensors".into(), location }),
            [one] if dim < one.rank() || one.error().is_some() => (*one).clone(),
            [one] => one.fail_shape(
                "cat",
                format!("cat dim {dim} is out of range for rank {}", one.rank()),
                location,
            ),
            _ => Tensor::record(tensors, Op::Cat { dim }, None, location),
        }
    }

    /// Stacks tensors of one shape along a new dimension `dim`.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Tensor {
        let location = Location::caller();
        let expanded: Vec<Tensor> = tensors.iter().map(|t| t.unsqueeze_at(dim, location)).collect();
        let refs: Vec<&Tensor> = expanded.iter().collect();
        Tensor::cat_at(&refs, dim, location)
    }
}
