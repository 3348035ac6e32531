//! Elementwise ops on typed tensors: unary math, binary arithmetic whose
//! broadcasting the shape types decide ([`BroadcastShapes`]), comparisons,
//! and `+ - * /` with tensors or Rust numbers on either side.
//!
//! Each calls the untyped op of the same name with the caller's location
//! (`#[track_caller]` all the way down), so a runtime failure (two
//! `usize` dims that differ) reports the user's line.

use super::rules::MatMulShapes;
use super::shape::{BroadcastShapes, Shape};
use super::tensor::Tensor;
use crate::Element;
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        impl<S: Shape, E: Element> Tensor<S, E> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Tensor<S, E> {
                    Tensor::wrap(self.untyped().$name(), *self.shape())
                }
            )*
        }
    };
}

unary! {
    /// `-x`.
    neg;
    /// `|x|`.
    abs;
    /// `e^x`.
    exp;
    /// Natural logarithm.
    log;
    /// Square root.
    sqrt;
    /// `1 / sqrt(x)`.
    rsqrt;
    /// `1 / x`.
    recip;
    /// Sine.
    sin;
    /// Cosine.
    cos;
    /// Hyperbolic tangent.
    tanh;
    /// `1 / (1 + e^-x)`.
    sigmoid;
    /// `max(x, 0)`.
    relu;
    /// `x · Φ(x)` (exact normal CDF).
    gelu;
    /// `x · sigmoid(x)`.
    silu;
}

macro_rules! binary {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        impl<S: Shape, E: Element> Tensor<S, E> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name<S2: Shape>(&self, rhs: &Tensor<S2, E>) -> Tensor<S::Output, E>
                where
                    S: BroadcastShapes<S2>,
                {
                    let shape = S::broadcast(self.shape(), rhs.shape());
                    Tensor::wrap(self.untyped().$name(rhs.untyped()), shape)
                }
            )*
        }
    };
}

binary! {
    /// `self + rhs`, broadcast as the types say.
    add;
    /// `self - rhs`.
    sub;
    /// `self * rhs`.
    mul;
    /// `self / rhs`.
    div;
    /// `self ^ rhs`.
    pow;
    /// Elementwise maximum (NaN wins).
    maximum;
    /// Elementwise minimum (NaN wins).
    minimum;
}

macro_rules! compare {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        impl<S: Shape, E: Element> Tensor<S, E> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name<S2: Shape>(&self, rhs: &Tensor<S2, E>) -> Tensor<S::Output, bool>
                where
                    S: BroadcastShapes<S2>,
                {
                    let shape = S::broadcast(self.shape(), rhs.shape());
                    Tensor::wrap(self.untyped().$name(rhs.untyped()), shape)
                }
            )*
        }
    };
}

compare! {
    /// `self == rhs` as bools.
    eq;
    /// `self != rhs`.
    ne;
    /// `self < rhs`.
    lt;
    /// `self <= rhs`.
    le;
    /// `self > rhs`.
    gt;
    /// `self >= rhs`.
    ge;
}

macro_rules! operators {
    ($($trait:ident $method:ident;)*) => {$(
        impl<S: Shape, S2: Shape, E: Element> $trait<Tensor<S2, E>> for Tensor<S, E>
        where
            S: BroadcastShapes<S2>,
        {
            type Output = Tensor<S::Output, E>;
            #[track_caller]
            fn $method(self, rhs: Tensor<S2, E>) -> Self::Output {
                Tensor::$method(&self, &rhs)
            }
        }
        impl<S: Shape, S2: Shape, E: Element> $trait<&Tensor<S2, E>> for Tensor<S, E>
        where
            S: BroadcastShapes<S2>,
        {
            type Output = Tensor<S::Output, E>;
            #[track_caller]
            fn $method(self, rhs: &Tensor<S2, E>) -> Self::Output {
                Tensor::$method(&self, rhs)
            }
        }
        impl<S: Shape, S2: Shape, E: Element> $trait<Tensor<S2, E>> for &Tensor<S, E>
        where
            S: BroadcastShapes<S2>,
        {
            type Output = Tensor<S::Output, E>;
            #[track_caller]
            fn $method(self, rhs: Tensor<S2, E>) -> Self::Output {
                Tensor::$method(self, &rhs)
            }
        }
        impl<S: Shape, S2: Shape, E: Element> $trait<&Tensor<S2, E>> for &Tensor<S, E>
        where
            S: BroadcastShapes<S2>,
        {
            type Output = Tensor<S::Output, E>;
            #[track_caller]
            fn $method(self, rhs: &Tensor<S2, E>) -> Self::Output {
                Tensor::$method(self, rhs)
            }
        }
        operators!(@scalar $trait $method f32);
        operators!(@scalar $trait $method f64);
    )*};
    (@scalar $trait:ident $method:ident $scalar:ty) => {
        /// A Rust number takes the tensor's element type (a constant of
        /// the graph; use [`crate::Context::scalar_typed`] for a value that
        /// changes every step).
        impl<S: Shape, E: Element> $trait<$scalar> for Tensor<S, E> {
            type Output = Tensor<S, E>;
            #[track_caller]
            fn $method(self, rhs: $scalar) -> Tensor<S, E> {
                Tensor::wrap($trait::$method(self.untyped(), rhs), *self.shape())
            }
        }
        impl<S: Shape, E: Element> $trait<$scalar> for &Tensor<S, E> {
            type Output = Tensor<S, E>;
            #[track_caller]
            fn $method(self, rhs: $scalar) -> Tensor<S, E> {
                Tensor::wrap($trait::$method(self.untyped(), rhs), *self.shape())
            }
        }
        impl<S: Shape, E: Element> $trait<Tensor<S, E>> for $scalar {
            type Output = Tensor<S, E>;
            #[track_caller]
            fn $method(self, rhs: Tensor<S, E>) -> Tensor<S, E> {
                Tensor::wrap($trait::$method(self, rhs.untyped()), *rhs.shape())
            }
        }
        impl<S: Shape, E: Element> $trait<&Tensor<S, E>> for $scalar {
            type Output = Tensor<S, E>;
            #[track_caller]
            fn $method(self, rhs: &Tensor<S, E>) -> Tensor<S, E> {
                Tensor::wrap($trait::$method(self, rhs.untyped()), *rhs.shape())
            }
        }
    };
}

operators! {
    Add add;
    Sub sub;
    Mul mul;
    Div div;
}

impl<S: Shape, E: Element> Neg for Tensor<S, E> {
    type Output = Tensor<S, E>;
    #[track_caller]
    fn neg(self) -> Tensor<S, E> {
        Tensor::neg(&self)
    }
}

impl<S: Shape, E: Element> Neg for &Tensor<S, E> {
    type Output = Tensor<S, E>;
    #[track_caller]
    fn neg(self) -> Tensor<S, E> {
        Tensor::neg(self)
    }
}

impl<S: Shape, E: Element> Tensor<S, E> {
    /// Matrix product (`torch.matmul`'s rules for the shapes
    /// [`MatMulShapes`] lists): `(M, K) × (K, N) → (M, N)`, batched
    /// `(B, M, K) × (B, K, N)`, a shared right matrix `(B, M, K) × (K, N)`.
    /// The inner dims must have one type, so `Const` inner dims that
    /// differ are a compile error; `usize` ones are compared when the op
    /// is recorded.
    #[track_caller]
    pub fn matmul<S2: Shape>(&self, rhs: &Tensor<S2, E>) -> Tensor<S::Output, E>
    where
        S: MatMulShapes<S2>,
    {
        let shape = S::product(self.shape(), rhs.shape());
        Tensor::wrap(self.untyped().matmul(rhs.untyped()), shape)
    }
}
