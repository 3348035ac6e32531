//! Convolution and pooling on typed tensors, and their output sizes as
//! types.
//!
//! An output size is `(n + 2·padding - kernel) / stride + 1`, arithmetic
//! on const generics that stable Rust cannot do in a type
//! (`generic_const_exprs`). The nearest stable design is trait-level
//! arithmetic: [`ConvOut`] maps an input dim to an output dim. It is
//! implemented
//! - for `usize` dims, every configuration (the output is a `usize`),
//! - for every `Const<N>` where the size is kept: kernel 1, 3, 5 or 7
//!   with stride 1 and "same" padding `(kernel - 1) / 2`,
//! - from a table for the common shrinking configurations (pooling 2, 3
//!   and 4; 3x3 stride 2 padding 1; 3x3 and 5x5 without padding; the 7x7
//!   stride-2 stem) over the sizes 1..=64, 96, 112, 128, 192, 224, 256.
//!
//! Outside those a `Const` input is a compile error that says so; make the
//! spatial dims `usize` there (`reshape_to`) and the sizes are computed
//! and checked when the op is recorded.

use super::modules::{At, BuildModule, Module};
use super::shape::{Const, Dim, Rank4};
use super::tensor::Tensor;
use crate::nn::{self, Module as _, Params};
use crate::{Context, Element, Result, Variable};

/// The output size of a window of `K` taps, stride `S` and zero padding
/// `P` over a dim of this type.
#[diagnostic::on_unimplemented(
    message = "kiln::typed has no output size in the type for a window of {K}, stride {S}, padding {P} over `{Self}`",
    label = "this configuration is not in the table of compile-time output sizes",
    note = "const-generic arithmetic needs the unstable generic_const_exprs: sizes are a table (see kiln::typed::conv); use usize spatial dims (reshape_to) to compute this one at run time"
)]
pub trait ConvOut<const K: usize, const S: usize, const P: usize>: Dim {
    /// The output dim.
    type Out: Dim;
    /// Its value.
    fn out(&self) -> Self::Out;
}

/// `(n + 2p - k) / s + 1`, or 0 where the window does not fit (the op
/// then fails when recorded, with the caller's line).
pub(crate) const fn conv_out(n: usize, k: usize, s: usize, p: usize) -> usize {
    if n + 2 * p < k || s == 0 {
        0
    } else {
        (n + 2 * p - k) / s + 1
    }
}

#[diagnostic::do_not_recommend]
impl<const K: usize, const S: usize, const P: usize> ConvOut<K, S, P> for usize {
    type Out = usize;
    fn out(&self) -> usize {
        conv_out(*self, K, S, P)
    }
}

macro_rules! same_size {
    ($(($k:literal, $p:literal)),*) => {$(
        #[diagnostic::do_not_recommend]
        impl<const N: usize> ConvOut<$k, 1, $p> for Const<N> {
            type Out = Const<N>;
            fn out(&self) -> Const<N> {
                Const
            }
        }
    )*};
}

same_size!((1, 0), (3, 1), (5, 2), (7, 3));

macro_rules! table {
    ($(($k:literal, $s:literal, $p:literal): [$($n:literal)*];)*) => {$($(
        #[diagnostic::do_not_recommend]
        impl ConvOut<$k, $s, $p> for Const<$n> {
            type Out = Const<{ conv_out($n, $k, $s, $p) }>;
            fn out(&self) -> Self::Out {
                Const
            }
        }
    )*)*};
}

table! {
    (2, 2, 0): [
        2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33
        34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62
        63 64 96 112 128 192 224 256
    ];
    (3, 3, 0): [
        3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33
        34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62
        63 64 96 112 128 192 224 256
    ];
    (4, 4, 0): [
        4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34
        35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
        64 96 112 128 192 224 256
    ];
    (3, 2, 1): [
        1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
        33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63 64 96 112 128 192 224 256
    ];
    (3, 1, 0): [
        3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33
        34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62
        63 64 96 112 128 192 224 256
    ];
    (5, 1, 0): [
        5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35
        36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64
        96 112 128 192 224 256
    ];
    (7, 2, 3): [
        1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
        33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63 64 96 112 128 192 224 256
    ];
}

impl<B: Dim, const C: usize, H: Dim, W: Dim, E: Element> Tensor<(B, Const<C>, H, W), E> {
    /// 2-D convolution of an NCHW input with an OIHW weight of `C` input
    /// channels (the types check them), stride `S` and zero padding `P`
    /// given as values: `x.conv2d(&w, Const::<1>, Const::<1>)`.
    #[track_caller]
    pub fn conv2d<const O: usize, const K: usize, const S: usize, const P: usize>(
        &self,
        weight: &Tensor<Rank4<O, C, K, K>, E>,
        _stride: Const<S>,
        _padding: Const<P>,
    ) -> Tensor<(B, Const<O>, H::Out, W::Out), E>
    where
        H: ConvOut<K, S, P>,
        W: ConvOut<K, S, P>,
    {
        let (b, _, h, w) = *self.shape();
        Tensor::wrap(self.untyped().conv2d(weight.untyped(), S, P, 1, 1), (b, Const, h.out(), w.out()))
    }
}

impl<B: Dim, C: Dim, H: Dim, W: Dim, E: Element> Tensor<(B, C, H, W), E> {
    /// Max pooling over `K x K` windows with stride `K`:
    /// `x.max_pool2d::<2>()`.
    #[track_caller]
    pub fn max_pool2d<const K: usize>(&self) -> Tensor<(B, C, H::Out, W::Out), E>
    where
        H: ConvOut<K, K, 0>,
        W: ConvOut<K, K, 0>,
    {
        let (b, c, h, w) = *self.shape();
        Tensor::wrap(self.untyped().max_pool2d(K, K, 0), (b, c, h.out(), w.out()))
    }

    /// Average pooling over `K x K` windows with stride `K`.
    #[track_caller]
    pub fn avg_pool2d<const K: usize>(&self) -> Tensor<(B, C, H::Out, W::Out), E>
    where
        H: ConvOut<K, K, 0>,
        W: ConvOut<K, K, 0>,
    {
        let (b, c, h, w) = *self.shape();
        Tensor::wrap(self.untyped().avg_pool2d(K, K, 0), (b, c, h.out(), w.out()))
    }
}

/// A 2-D convolution from `C_IN` to `C_OUT` channels, `K x K` kernel,
/// stride `S` (default 1) and zero padding `P` (default 0): `nn::Conv2d`
/// with a bias. Takes `(B, Const<C_IN>, H, W)`; the output's spatial dims
/// are [`ConvOut`]'s.
pub struct Conv2d<
    const C_IN: usize,
    const C_OUT: usize,
    const K: usize,
    const S: usize = 1,
    const P: usize = 0,
> {
    /// The untyped layer (`weight`, `bias`).
    pub inner: nn::Conv2d,
    at: At,
}

impl<const C_IN: usize, const C_OUT: usize, const K: usize, const S: usize, const P: usize> BuildModule
    for Conv2d<C_IN, C_OUT, K, S, P>
{
    #[track_caller]
    fn build(ctx: &Context, name: &str) -> Result<Self> {
        let options = nn::Conv2dOptions { stride: S, padding: P, ..Default::default() };
        Ok(Conv2d { inner: nn::Conv2d::with_options(ctx, name, C_IN, C_OUT, K, options)?, at: At::here(ctx) })
    }
}

impl<const C_IN: usize, const C_OUT: usize, const K: usize, const S: usize, const P: usize> Params
    for Conv2d<C_IN, C_OUT, K, S, P>
{
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.inner.visit(f)
    }
}

#[diagnostic::do_not_recommend]
impl<B, H, W, const C_IN: usize, const C_OUT: usize, const K: usize, const S: usize, const P: usize>
    Module<Tensor<(B, Const<C_IN>, H, W)>> for Conv2d<C_IN, C_OUT, K, S, P>
where
    B: Dim,
    H: ConvOut<K, S, P>,
    W: ConvOut<K, S, P>,
{
    type Output = Tensor<(B, Const<C_OUT>, H::Out, W::Out)>;
    #[track_caller]
    fn forward(&self, x: Tensor<(B, Const<C_IN>, H, W)>) -> Result<Self::Output> {
        let (b, _, h, w) = *x.shape();
        let y = self.at.run(|| self.inner.forward(x.untyped()))?;
        Ok(Tensor::wrap(y, (b, Const, h.out(), w.out())))
    }
}

macro_rules! pool {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Default)]
        pub struct $name<const K: usize> {
            at: Option<At>,
        }

        impl<const K: usize> BuildModule for $name<K> {
            fn build(ctx: &Context, _name: &str) -> Result<Self> {
                Ok($name { at: Some(At::here(ctx)) })
            }
        }

        impl<const K: usize> Params for $name<K> {
            fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
        }

        #[diagnostic::do_not_recommend]
        impl<B: Dim, C: Dim, H, W, const K: usize> Module<Tensor<(B, C, H, W)>> for $name<K>
        where
            H: ConvOut<K, K, 0>,
            W: ConvOut<K, K, 0>,
        {
            type Output = Tensor<(B, C, H::Out, W::Out)>;
            #[track_caller]
            fn forward(&self, x: Tensor<(B, C, H, W)>) -> Result<Self::Output> {
                let (b, c, h, w) = *x.shape();
                let run = || nn::$name::new(K).forward(x.untyped());
                let y = match &self.at {
                    Some(at) => at.run(run)?,
                    None => run()?,
                };
                Ok(Tensor::wrap(y, (b, c, h.out(), w.out())))
            }
        }
    )*};
}

pool! {
    /// Max pooling over `K x K` windows, stride `K` (`nn::MaxPool2d`).
    MaxPool2d;
    /// Average pooling over `K x K` windows, stride `K` (`nn::AvgPool2d`).
    AvgPool2d;
}
