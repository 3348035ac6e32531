//! Indexing and joining: `gather`, `index_select`, `cat`, `stack`.

use super::{IntoDim, Tensor};
use crate::ir::Op;
use crate::{Error, Location};

impl Tensor {
    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim == 0` (and so
    /// on), as `torch.gather`. `index` is i64 or i32 and has `self`'s rank;
    /// an out-of-range index is an error when the value is read.
    #[track_caller]
    pub fn gather(&self, dim: impl IntoDim, index: &Tensor) -> Tensor {
        let location = Location::caller();
        match self.dim_of("gather", dim, location) {
            Ok(dim) => Tensor::record(&[self, index], Op::Gather { dim }, None, location),
            Err(failed) => failed,
        }
    }

    /// The entries of `self` at `index` (1-D, i64 or i32) along `dim`.
    #[track_caller]
    pub fn index_select(&self, dim: impl IntoDim, index: &Tensor) -> Tensor {
        let location = Location::caller();
        match self.dim_of("index_select", dim, location) {
            Ok(dim) => Tensor::record(&[self, index], Op::IndexSelect { dim }, None, location),
            Err(failed) => failed,
        }
    }

    /// `self` with `source[.., i, ..]` added at `index[i]` along `dim`
    /// (`torch.index_add`): `index` is 1-D (i64 or i32), `source` has
    /// `self`'s shape except `index.len()` along `dim`. Repeated indices
    /// add up, in index order. This is the scatter-add that an embedding's
    /// gradient is, linear in the number of rows added.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let x = ctx.zeros([3, 2]);
    /// let src = ctx.tensor(&[1.0f32, 1.0, 2.0, 2.0, 3.0, 3.0], [3, 2]);
    /// let y = x.index_add(0, &ctx.tensor(&[2i64, 0, 2], [3]), &src);
    /// assert_eq!(y.to_vec::<f32>()?, vec![2.0, 2.0, 0.0, 0.0, 4.0, 4.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn index_add(&self, dim: impl IntoDim, index: &Tensor, source: &Tensor) -> Tensor {
        let location = Location::caller();
        match self.dim_of("index_add", dim, location) {
            Ok(dim) => Tensor::record(&[self, index, source], Op::IndexAdd { dim }, None, location),
            Err(failed) => failed,
        }
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
    pub fn cat(tensors: &[&Tensor], dim: impl IntoDim) -> Tensor {
        let location = Location::caller();
        match tensors.first().map(|t| t.dim_of("cat", dim, location)) {
            Some(Ok(dim)) => Tensor::cat_at(tensors, dim, location),
            Some(Err(failed)) => failed,
            None => Tensor::cat_at(tensors, 0, location),
        }
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
    pub fn stack(tensors: &[&Tensor], dim: impl IntoDim) -> Tensor {
        let location = Location::caller();
        let dim = match tensors.first().map(|t| t.dim_in("stack", dim, t.rank() + 1, location)) {
            Some(Ok(dim)) => dim,
            Some(Err(failed)) => return failed,
            None => 0, // cat_at says there is nothing to join
        };
        let expanded: Vec<Tensor> = tensors.iter().map(|t| t.unsqueeze_at(dim, location)).collect();
        let refs: Vec<&Tensor> = expanded.iter().collect();
        Tensor::cat_at(&refs, dim, location)
    }
}
