//! Reductions over a typed axis (`x.sum::<Axis<1>>()`), the normalizations
//! that run along an axis (softmax, log-softmax, layer norm), and
//! `argmax`. The axis is a type, so an axis past the rank is a compile
//! error ([`HasAxis`]) and the result's shape drops exactly that dim.

use super::shape::{Const, HasAxis, Shape};
use super::tensor::Tensor;
use crate::Element;

macro_rules! reduce {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        impl<S: Shape, E: Element> Tensor<S, E> {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name<Ax>(&self) -> Tensor<S::Reduced, E>
                where
                    S: HasAxis<Ax>,
                {
                    Tensor::wrap(self.untyped().$name(&[S::INDEX], false), self.shape().reduced())
                }
            )*
        }
    };
}

reduce! {
    /// The sum over axis `Ax`, which the result drops.
    sum;
    /// The mean over axis `Ax`.
    mean;
    /// The maximum over axis `Ax`.
    max;
    /// The minimum over axis `Ax`.
    min;
}

impl<S: Shape, E: Element> Tensor<S, E> {
    /// The sum of every element, a scalar.
    #[track_caller]
    pub fn sum_all(&self) -> Tensor<(), E> {
        Tensor::wrap(self.untyped().sum_all(), ())
    }

    /// The mean of every element, a scalar.
    #[track_caller]
    pub fn mean_all(&self) -> Tensor<(), E> {
        let dims: Vec<usize> = (0..S::RANK).collect();
        Tensor::wrap(self.untyped().mean(&dims, false), ())
    }

    /// The index of the maximum along `Ax`, as `i64`.
    #[track_caller]
    pub fn argmax<Ax>(&self) -> Tensor<S::Reduced, i64>
    where
        S: HasAxis<Ax>,
    {
        Tensor::wrap(self.untyped().argmax(S::INDEX, false), self.shape().reduced())
    }

    /// Softmax along `Ax` (stable: the maximum is subtracted first).
    #[track_caller]
    pub fn softmax<Ax>(&self) -> Tensor<S, E>
    where
        S: HasAxis<Ax>,
    {
        Tensor::wrap(self.untyped().softmax(S::INDEX), *self.shape())
    }

    /// `log(softmax(x))` along `Ax`.
    #[track_caller]
    pub fn log_softmax<Ax>(&self) -> Tensor<S, E>
    where
        S: HasAxis<Ax>,
    {
        Tensor::wrap(self.untyped().log_softmax(S::INDEX), *self.shape())
    }
}

macro_rules! layer_norm {
    ($(($($d:ident),*);)*) => {$(
        impl<$($d: super::shape::Dim,)* const N: usize, E: Element> Tensor<($($d,)* Const<N>,), E> {
            /// Layer normalization over the last axis (PyTorch's
            /// `F.layer_norm(x, [N], weight, bias, eps)`): the weight and
            /// bias have that axis' size `N`, checked by the types.
            #[track_caller]
            pub fn layer_norm(&self, weight: &Tensor<(Const<N>,), E>, bias: &Tensor<(Const<N>,), E>, eps: f64) -> Self {
                Tensor::wrap(self.untyped().layer_norm(weight.untyped(), bias.untyped(), eps), *self.shape())
            }
        }
    )*};
}

layer_norm! {
    ();
    (D0);
    (D0, D1);
    (D0, D1, D2);
}
