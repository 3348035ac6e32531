//! The shape rules of ops that combine or rearrange dims, as traits on
//! shape tuples: matrix products, permutations, concatenation. Each impl
//! is one case the types allow; a missing impl is the compile error, and
//! its message names the shapes.

use super::shape::{Axes2, Axes3, Axes4, Axis, Dim, Shape};

/// `self × Rhs` as `torch.matmul` takes it, restricted to what the types
/// decide: the inner dims must be one dim type (`Const<K>` with the same
/// `K`, or both `usize`) and batch dims equal.
#[diagnostic::on_unimplemented(
    message = "cannot multiply a matrix of shape `{Self}` by one of shape `{Rhs}`",
    label = "the inner dims (and batch dims) must be the same dim types",
    note = "kiln::typed matmul shapes: (M, K) x (K, N) -> (M, N); (B, M, K) x (B, K, N) or (K, N) -> (B, M, N); (B, H, M, K) x (B, H, K, N) or (K, N) -> (B, H, M, N); (K,) x (K, N) -> (N,); (M, K) x (K,) -> (M,)"
)]
pub trait MatMulShapes<Rhs: Shape>: Shape {
    /// The product's shape.
    type Output: Shape;
    /// Its value.
    fn product(lhs: &Self, rhs: &Rhs) -> Self::Output;
}

#[diagnostic::do_not_recommend]
impl<M: Dim, K: Dim, N: Dim> MatMulShapes<(K, N)> for (M, K) {
    type Output = (M, N);
    fn product(l: &Self, r: &(K, N)) -> Self::Output {
        (l.0, r.1)
    }
}

#[diagnostic::do_not_recommend]
impl<K: Dim, N: Dim> MatMulShapes<(K, N)> for (K,) {
    type Output = (N,);
    fn product(_: &Self, r: &(K, N)) -> Self::Output {
        (r.1,)
    }
}

#[diagnostic::do_not_recommend]
impl<M: Dim, K: Dim> MatMulShapes<(K,)> for (M, K) {
    type Output = (M,);
    fn product(l: &Self, _: &(K,)) -> Self::Output {
        (l.0,)
    }
}

#[diagnostic::do_not_recommend]
impl<B: Dim, M: Dim, K: Dim, N: Dim> MatMulShapes<(B, K, N)> for (B, M, K) {
    type Output = (B, M, N);
    fn product(l: &Self, r: &(B, K, N)) -> Self::Output {
        (l.0, l.1, r.2)
    }
}

#[diagnostic::do_not_recommend]
impl<B: Dim, M: Dim, K: Dim, N: Dim> MatMulShapes<(K, N)> for (B, M, K) {
    type Output = (B, M, N);
    fn product(l: &Self, r: &(K, N)) -> Self::Output {
        (l.0, l.1, r.1)
    }
}

#[diagnostic::do_not_recommend]
impl<B: Dim, H: Dim, M: Dim, K: Dim, N: Dim> MatMulShapes<(B, H, K, N)> for (B, H, M, K) {
    type Output = (B, H, M, N);
    fn product(l: &Self, r: &(B, H, K, N)) -> Self::Output {
        (l.0, l.1, l.2, r.3)
    }
}

#[diagnostic::do_not_recommend]
impl<B: Dim, H: Dim, M: Dim, K: Dim, N: Dim> MatMulShapes<(K, N)> for (B, H, M, K) {
    type Output = (B, H, M, N);
    fn product(l: &Self, r: &(K, N)) -> Self::Output {
        (l.0, l.1, l.2, r.1)
    }
}

/// A permutation `Ax` (`Axes2<1, 0>`, `Axes4<0, 2, 3, 1>`, ...) of a
/// shape's axes: `Output` lists the dims in the new order.
#[diagnostic::on_unimplemented(
    message = "`{Ax}` is not a permutation of the axes of `{Self}`",
    label = "name every axis once, as many as the rank"
)]
pub trait PermuteShape<Ax>: Shape {
    /// The permuted shape.
    type Output: Shape;
    /// Where each output dim comes from.
    const PERM: &'static [usize];
    /// Its value.
    fn permuted(&self) -> Self::Output;
}

#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim> PermuteShape<Axes2<0, 1>> for (D0, D1) {
    type Output = (D0, D1);
    const PERM: &'static [usize] = &[0, 1];
    fn permuted(&self) -> Self::Output {
        (self.0, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim> PermuteShape<Axes2<1, 0>> for (D0, D1) {
    type Output = (D1, D0);
    const PERM: &'static [usize] = &[1, 0];
    fn permuted(&self) -> Self::Output {
        (self.1, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> PermuteShape<Axes3<0, 1, 2>> for (D0, D1, D2) {
    type Output = (D0, D1, D2);
    const PERM: &'static [usize] = &[0, 1, 2];
    fn permuted(&self) -> Self::Output {
        (self.0, self.1, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> PermuteShape<Axes3<0, 2, 1>> for (D0, D1, D2) {
    type Output = (D0, D2, D1);
    const PERM: &'static [usize] = &[0, 2, 1];
    fn permuted(&self) -> Self::Output {
        (self.0, self.2, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> PermuteShape<Axes3<1, 0, 2>> for (D0, D1, D2) {
    type Output = (D1, D0, D2);
    const PERM: &'static [usize] = &[1, 0, 2];
    fn permuted(&self) -> Self::Output {
        (self.1, self.0, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> PermuteShape<Axes3<1, 2, 0>> for (D0, D1, D2) {
    type Output = (D1, D2, D0);
    const PERM: &'static [usize] = &[1, 2, 0];
    fn permuted(&self) -> Self::Output {
        (self.1, self.2, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> PermuteShape<Axes3<2, 0, 1>> for (D0, D1, D2) {
    type Output = (D2, D0, D1);
    const PERM: &'static [usize] = &[2, 0, 1];
    fn permuted(&self) -> Self::Output {
        (self.2, self.0, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> PermuteShape<Axes3<2, 1, 0>> for (D0, D1, D2) {
    type Output = (D2, D1, D0);
    const PERM: &'static [usize] = &[2, 1, 0];
    fn permuted(&self) -> Self::Output {
        (self.2, self.1, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<0, 1, 2, 3>> for (D0, D1, D2, D3) {
    type Output = (D0, D1, D2, D3);
    const PERM: &'static [usize] = &[0, 1, 2, 3];
    fn permuted(&self) -> Self::Output {
        (self.0, self.1, self.2, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<0, 1, 3, 2>> for (D0, D1, D2, D3) {
    type Output = (D0, D1, D3, D2);
    const PERM: &'static [usize] = &[0, 1, 3, 2];
    fn permuted(&self) -> Self::Output {
        (self.0, self.1, self.3, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<0, 2, 1, 3>> for (D0, D1, D2, D3) {
    type Output = (D0, D2, D1, D3);
    const PERM: &'static [usize] = &[0, 2, 1, 3];
    fn permuted(&self) -> Self::Output {
        (self.0, self.2, self.1, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<0, 2, 3, 1>> for (D0, D1, D2, D3) {
    type Output = (D0, D2, D3, D1);
    const PERM: &'static [usize] = &[0, 2, 3, 1];
    fn permuted(&self) -> Self::Output {
        (self.0, self.2, self.3, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<0, 3, 1, 2>> for (D0, D1, D2, D3) {
    type Output = (D0, D3, D1, D2);
    const PERM: &'static [usize] = &[0, 3, 1, 2];
    fn permuted(&self) -> Self::Output {
        (self.0, self.3, self.1, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<0, 3, 2, 1>> for (D0, D1, D2, D3) {
    type Output = (D0, D3, D2, D1);
    const PERM: &'static [usize] = &[0, 3, 2, 1];
    fn permuted(&self) -> Self::Output {
        (self.0, self.3, self.2, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<1, 0, 2, 3>> for (D0, D1, D2, D3) {
    type Output = (D1, D0, D2, D3);
    const PERM: &'static [usize] = &[1, 0, 2, 3];
    fn permuted(&self) -> Self::Output {
        (self.1, self.0, self.2, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<1, 0, 3, 2>> for (D0, D1, D2, D3) {
    type Output = (D1, D0, D3, D2);
    const PERM: &'static [usize] = &[1, 0, 3, 2];
    fn permuted(&self) -> Self::Output {
        (self.1, self.0, self.3, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<1, 2, 0, 3>> for (D0, D1, D2, D3) {
    type Output = (D1, D2, D0, D3);
    const PERM: &'static [usize] = &[1, 2, 0, 3];
    fn permuted(&self) -> Self::Output {
        (self.1, self.2, self.0, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<1, 2, 3, 0>> for (D0, D1, D2, D3) {
    type Output = (D1, D2, D3, D0);
    const PERM: &'static [usize] = &[1, 2, 3, 0];
    fn permuted(&self) -> Self::Output {
        (self.1, self.2, self.3, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<1, 3, 0, 2>> for (D0, D1, D2, D3) {
    type Output = (D1, D3, D0, D2);
    const PERM: &'static [usize] = &[1, 3, 0, 2];
    fn permuted(&self) -> Self::Output {
        (self.1, self.3, self.0, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<1, 3, 2, 0>> for (D0, D1, D2, D3) {
    type Output = (D1, D3, D2, D0);
    const PERM: &'static [usize] = &[1, 3, 2, 0];
    fn permuted(&self) -> Self::Output {
        (self.1, self.3, self.2, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<2, 0, 1, 3>> for (D0, D1, D2, D3) {
    type Output = (D2, D0, D1, D3);
    const PERM: &'static [usize] = &[2, 0, 1, 3];
    fn permuted(&self) -> Self::Output {
        (self.2, self.0, self.1, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<2, 0, 3, 1>> for (D0, D1, D2, D3) {
    type Output = (D2, D0, D3, D1);
    const PERM: &'static [usize] = &[2, 0, 3, 1];
    fn permuted(&self) -> Self::Output {
        (self.2, self.0, self.3, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<2, 1, 0, 3>> for (D0, D1, D2, D3) {
    type Output = (D2, D1, D0, D3);
    const PERM: &'static [usize] = &[2, 1, 0, 3];
    fn permuted(&self) -> Self::Output {
        (self.2, self.1, self.0, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<2, 1, 3, 0>> for (D0, D1, D2, D3) {
    type Output = (D2, D1, D3, D0);
    const PERM: &'static [usize] = &[2, 1, 3, 0];
    fn permuted(&self) -> Self::Output {
        (self.2, self.1, self.3, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<2, 3, 0, 1>> for (D0, D1, D2, D3) {
    type Output = (D2, D3, D0, D1);
    const PERM: &'static [usize] = &[2, 3, 0, 1];
    fn permuted(&self) -> Self::Output {
        (self.2, self.3, self.0, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<2, 3, 1, 0>> for (D0, D1, D2, D3) {
    type Output = (D2, D3, D1, D0);
    const PERM: &'static [usize] = &[2, 3, 1, 0];
    fn permuted(&self) -> Self::Output {
        (self.2, self.3, self.1, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<3, 0, 1, 2>> for (D0, D1, D2, D3) {
    type Output = (D3, D0, D1, D2);
    const PERM: &'static [usize] = &[3, 0, 1, 2];
    fn permuted(&self) -> Self::Output {
        (self.3, self.0, self.1, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<3, 0, 2, 1>> for (D0, D1, D2, D3) {
    type Output = (D3, D0, D2, D1);
    const PERM: &'static [usize] = &[3, 0, 2, 1];
    fn permuted(&self) -> Self::Output {
        (self.3, self.0, self.2, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<3, 1, 0, 2>> for (D0, D1, D2, D3) {
    type Output = (D3, D1, D0, D2);
    const PERM: &'static [usize] = &[3, 1, 0, 2];
    fn permuted(&self) -> Self::Output {
        (self.3, self.1, self.0, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<3, 1, 2, 0>> for (D0, D1, D2, D3) {
    type Output = (D3, D1, D2, D0);
    const PERM: &'static [usize] = &[3, 1, 2, 0];
    fn permuted(&self) -> Self::Output {
        (self.3, self.1, self.2, self.0)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<3, 2, 0, 1>> for (D0, D1, D2, D3) {
    type Output = (D3, D2, D0, D1);
    const PERM: &'static [usize] = &[3, 2, 0, 1];
    fn permuted(&self) -> Self::Output {
        (self.3, self.2, self.0, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> PermuteShape<Axes4<3, 2, 1, 0>> for (D0, D1, D2, D3) {
    type Output = (D3, D2, D1, D0);
    const PERM: &'static [usize] = &[3, 2, 1, 0];
    fn permuted(&self) -> Self::Output {
        (self.3, self.2, self.1, self.0)
    }
}

/// Shapes that concatenate along `Ax`: every other dim of one dim type.
/// The axis' dim of the result is a `usize` (the sum of two `Const`s
/// would need const-generic arithmetic).
#[diagnostic::on_unimplemented(
    message = "cannot concatenate `{Self}` and `{Rhs}` along `{Ax}`",
    label = "the two shapes must have one rank and equal dims except along the axis"
)]
pub trait ConcatShapes<Ax, Rhs: Shape>: Shape {
    /// The result's shape: the axis becomes `usize`.
    type Output: Shape;
    /// The axis' index.
    const AXIS: usize;
    /// Its value.
    fn concat(lhs: &Self, rhs: &Rhs) -> Self::Output;
}

#[diagnostic::do_not_recommend]
impl<A: Dim, B: Dim> ConcatShapes<Axis<0>, (B,)> for (A,) {
    type Output = (usize,);
    const AXIS: usize = 0;
    fn concat(l: &Self, r: &(B,)) -> Self::Output {
        (l.0.size() + r.0.size(),)
    }
}
#[diagnostic::do_not_recommend]
impl<D1: Dim, A: Dim, B: Dim> ConcatShapes<Axis<0>, (B, D1)> for (A, D1) {
    type Output = (usize, D1);
    const AXIS: usize = 0;
    fn concat(l: &Self, r: &(B, D1)) -> Self::Output {
        (l.0.size() + r.0.size(), l.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, A: Dim, B: Dim> ConcatShapes<Axis<1>, (D0, B)> for (D0, A) {
    type Output = (D0, usize);
    const AXIS: usize = 1;
    fn concat(l: &Self, r: &(D0, B)) -> Self::Output {
        (l.0, l.1.size() + r.1.size())
    }
}
#[diagnostic::do_not_recommend]
impl<D1: Dim, D2: Dim, A: Dim, B: Dim> ConcatShapes<Axis<0>, (B, D1, D2)> for (A, D1, D2) {
    type Output = (usize, D1, D2);
    const AXIS: usize = 0;
    fn concat(l: &Self, r: &(B, D1, D2)) -> Self::Output {
        (l.0.size() + r.0.size(), l.1, l.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D2: Dim, A: Dim, B: Dim> ConcatShapes<Axis<1>, (D0, B, D2)> for (D0, A, D2) {
    type Output = (D0, usize, D2);
    const AXIS: usize = 1;
    fn concat(l: &Self, r: &(D0, B, D2)) -> Self::Output {
        (l.0, l.1.size() + r.1.size(), l.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, A: Dim, B: Dim> ConcatShapes<Axis<2>, (D0, D1, B)> for (D0, D1, A) {
    type Output = (D0, D1, usize);
    const AXIS: usize = 2;
    fn concat(l: &Self, r: &(D0, D1, B)) -> Self::Output {
        (l.0, l.1, l.2.size() + r.2.size())
    }
}
#[diagnostic::do_not_recommend]
impl<D1: Dim, D2: Dim, D3: Dim, A: Dim, B: Dim> ConcatShapes<Axis<0>, (B, D1, D2, D3)> for (A, D1, D2, D3) {
    type Output = (usize, D1, D2, D3);
    const AXIS: usize = 0;
    fn concat(l: &Self, r: &(B, D1, D2, D3)) -> Self::Output {
        (l.0.size() + r.0.size(), l.1, l.2, l.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D2: Dim, D3: Dim, A: Dim, B: Dim> ConcatShapes<Axis<1>, (D0, B, D2, D3)> for (D0, A, D2, D3) {
    type Output = (D0, usize, D2, D3);
    const AXIS: usize = 1;
    fn concat(l: &Self, r: &(D0, B, D2, D3)) -> Self::Output {
        (l.0, l.1.size() + r.1.size(), l.2, l.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D3: Dim, A: Dim, B: Dim> ConcatShapes<Axis<2>, (D0, D1, B, D3)> for (D0, D1, A, D3) {
    type Output = (D0, D1, usize, D3);
    const AXIS: usize = 2;
    fn concat(l: &Self, r: &(D0, D1, B, D3)) -> Self::Output {
        (l.0, l.1, l.2.size() + r.2.size(), l.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, A: Dim, B: Dim> ConcatShapes<Axis<3>, (D0, D1, D2, B)> for (D0, D1, D2, A) {
    type Output = (D0, D1, D2, usize);
    const AXIS: usize = 3;
    fn concat(l: &Self, r: &(D0, D1, D2, B)) -> Self::Output {
        (l.0, l.1, l.2, l.3.size() + r.3.size())
    }
}
