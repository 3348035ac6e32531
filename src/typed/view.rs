//! Views and joins on typed tensors: reshape, permute and transpose,
//! broadcast, concatenation, and indexing (`select`, `narrow`,
//! `index_select`).
//!
//! Reshape is where stable Rust stops: the element counts of two shapes
//! can only be compared by arithmetic on const generics. Between shapes
//! of `Const` dims the comparison is a const assertion, evaluated when
//! the call is instantiated: `cargo build` and `cargo test` reject a
//! wrong reshape, `cargo check` (and an editor running it) does not see
//! it. With a `usize` dim on either side the untyped reshape checks the
//! count when it is recorded and reports the caller's line.

use super::rules::{ConcatShapes, PermuteShape};
use super::shape::{BroadcastShapes, ConstShape, Dim, HasAxis, Shape};
use super::tensor::Tensor;
use crate::Element;
use std::marker::PhantomData;

/// The compile-time half of a reshape: `CHECK` fails to evaluate (a
/// build error naming both shapes) when both are all-`Const` and their
/// element counts differ.
struct SameNumel<A, B>(PhantomData<(A, B)>);

impl<A: Shape, B: Shape> SameNumel<A, B> {
    const CHECK: () = if let (Some(a), Some(b)) = (A::CONST_NUMEL, B::CONST_NUMEL) {
        assert!(a == b, "kiln::typed: reshape between shapes of different element counts")
    };
}

impl<S: Shape, E: Element> Tensor<S, E> {
    /// The same elements in the shape `S2`, all of whose dims are `Const`.
    /// From an all-`Const` shape the element counts are compared at build
    /// time; otherwise when the op is recorded.
    ///
    /// ```
    /// use kiln::typed::*;
    /// let ctx = Context::cpu();
    /// let x: Tensor<Rank3<2, 3, 4>> = ctx.zeros_typed(Default::default());
    /// let y = x.reshape::<Rank2<6, 4>>();
    /// assert_eq!(y.dims(), vec![6, 4]);
    /// ```
    #[track_caller]
    pub fn reshape<S2: ConstShape>(&self) -> Tensor<S2, E> {
        #[allow(clippy::let_unit_value)]
        let () = SameNumel::<S, S2>::CHECK;
        let shape = S2::default();
        Tensor::wrap(self.untyped().reshape(shape.dims()), shape)
    }

    /// The same elements in `shape`, which may have runtime dims (the
    /// element counts are compared when the op is recorded, and at build
    /// time where both shapes are all-`Const`).
    #[track_caller]
    pub fn reshape_to<S2: Shape>(&self, shape: S2) -> Tensor<S2, E> {
        #[allow(clippy::let_unit_value)]
        let () = SameNumel::<S, S2>::CHECK;
        Tensor::wrap(self.untyped().reshape(shape.dims()), shape)
    }

    /// The axes reordered: `x.permute::<Axes3<0, 2, 1>>()`.
    #[track_caller]
    pub fn permute<Ax>(&self) -> Tensor<S::Output, E>
    where
        S: PermuteShape<Ax>,
    {
        Tensor::wrap(self.untyped().permute(S::PERM), self.shape().permuted())
    }

    /// Repeats the tensor (without copying) up to `shape`, of which its
    /// shape is a suffix.
    #[track_caller]
    pub fn broadcast_to<S2: Shape>(&self, shape: S2) -> Tensor<S2, E>
    where
        S: BroadcastShapes<S2, Output = S2>,
    {
        Tensor::wrap(self.untyped().broadcast_to(shape.dims()), shape)
    }

    /// Joins `self` and `other` along `Ax`; every other dim has one type.
    /// The joined dim is a `usize`.
    #[track_caller]
    pub fn concat<Ax, S2: Shape>(&self, other: &Tensor<S2, E>) -> Tensor<S::Output, E>
    where
        S: ConcatShapes<Ax, S2>,
    {
        let shape = S::concat(self.shape(), other.shape());
        Tensor::wrap(crate::Tensor::cat(&[self.untyped(), other.untyped()], S::AXIS), shape)
    }

    /// Entry `index` along `Ax`, which the result drops (`x[i]` for
    /// `Axis<0>`). An index past the dim is an error with the caller's
    /// line.
    #[track_caller]
    pub fn select<Ax>(&self, index: usize) -> Tensor<S::Reduced, E>
    where
        S: HasAxis<Ax>,
    {
        let reduced = self.shape().reduced();
        Tensor::wrap(self.untyped().narrow(S::INDEX, index, 1).reshape(reduced.dims()), reduced)
    }

    /// Entries `start..start + len` along `Ax`; that dim becomes `usize`.
    #[track_caller]
    pub fn narrow<Ax>(&self, start: usize, len: usize) -> Tensor<S::WithDim<usize>, E>
    where
        S: HasAxis<Ax>,
    {
        Tensor::wrap(self.untyped().narrow(S::INDEX, start, len), self.shape().with_dim(len))
    }

    /// The entries at `ids` (i64) along `Ax`, whose dim becomes the ids'
    /// dim `N`; an id out of range is an error when the value is read.
    #[track_caller]
    pub fn index_select<Ax, N: Dim>(&self, ids: &Tensor<(N,), i64>) -> Tensor<S::WithDim<N>, E>
    where
        S: HasAxis<Ax>,
    {
        let shape = self.shape().with_dim(ids.shape().0);
        Tensor::wrap(self.untyped().index_select(S::INDEX, ids.untyped()), shape)
    }
}

impl<A: Dim, B: Dim, E: Element> Tensor<(A, B), E> {
    /// The transpose of a matrix (a view).
    #[track_caller]
    pub fn t(&self) -> Tensor<(B, A), E> {
        let (a, b) = *self.shape();
        Tensor::wrap(self.untyped().t(), (b, a))
    }
}
