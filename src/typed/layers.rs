//! Typed layers: `Linear<I, O>`, `LayerNorm<D>`, the activations,
//! dropout, `Flatten<N>`, and the losses. Each wraps the `kiln::nn`
//! module of the same name (see [`super::modules`]).

use super::modules::{At, BuildModule, Module};
use super::shape::{Const, Dim, Shape};
use super::tensor::Tensor;
use crate::nn::{self, Module as _, Params};
use crate::{Context, Error, Location, Result, Variable};
use std::marker::PhantomData;

/// `y = x · weightᵀ + bias` from `I` to `O` features (`nn::Linear`: weight
/// `[O, I]`, bias `[O]`). Takes `(Const<I>,)`, `(B, Const<I>)` or
/// `(B, T, Const<I>)` for any dims `B`, `T`.
pub struct Linear<const I: usize, const O: usize> {
    /// The untyped layer (its `weight` and `bias` variables).
    pub inner: nn::Linear,
    at: At,
}

impl<const I: usize, const O: usize> BuildModule for Linear<I, O> {
    #[track_caller]
    fn build(ctx: &Context, name: &str) -> Result<Self> {
        Ok(Linear { inner: nn::Linear::new(ctx, name, I, O)?, at: At::here(ctx) })
    }
}

impl<const I: usize, const O: usize> Params for Linear<I, O> {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.inner.visit(f)
    }
}

macro_rules! linear_input {
    ($(($($d:ident),*);)*) => {$(
        #[diagnostic::do_not_recommend]
        impl<$($d: Dim,)* const I: usize, const O: usize> Module<Tensor<($($d,)* Const<I>,)>> for Linear<I, O> {
            type Output = Tensor<($($d,)* Const<O>,)>;
            #[track_caller]
            #[allow(non_snake_case)]
            fn forward(&self, x: Tensor<($($d,)* Const<I>,)>) -> Result<Self::Output> {
                let ($($d,)* _,) = *x.shape();
                let y = self.at.run(|| self.inner.forward(x.untyped()))?;
                Ok(Tensor::wrap(y, ($($d,)* Const,)))
            }
        }
    )*};
}

linear_input! {
    ();
    (B);
    (B, T);
}

/// Layer normalization over a last axis of size `D` (`nn::LayerNorm`,
/// eps 1e-5).
pub struct LayerNorm<const D: usize> {
    /// The untyped layer (`weight`, `bias`, `eps`).
    pub inner: nn::LayerNorm,
    at: At,
}

impl<const D: usize> BuildModule for LayerNorm<D> {
    #[track_caller]
    fn build(ctx: &Context, name: &str) -> Result<Self> {
        Ok(LayerNorm { inner: nn::LayerNorm::new(ctx, name, D)?, at: At::here(ctx) })
    }
}

impl<const D: usize> Params for LayerNorm<D> {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.inner.visit(f)
    }
}

macro_rules! layer_norm_input {
    ($(($($d:ident),*);)*) => {$(
        #[diagnostic::do_not_recommend]
        impl<$($d: Dim,)* const D: usize> Module<Tensor<($($d,)* Const<D>,)>> for LayerNorm<D> {
            type Output = Tensor<($($d,)* Const<D>,)>;
            #[track_caller]
            fn forward(&self, x: Tensor<($($d,)* Const<D>,)>) -> Result<Self::Output> {
                let y = self.at.run(|| self.inner.forward(x.untyped()))?;
                Ok(Tensor::wrap(y, *x.shape()))
            }
        }
    )*};
}

layer_norm_input! {
    ();
    (B);
    (B, T);
}

macro_rules! activations {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Default)]
        pub struct $name {
            at: Option<At>,
        }

        impl BuildModule for $name {
            fn build(ctx: &Context, _name: &str) -> Result<Self> {
                Ok($name { at: Some(At::here(ctx)) })
            }
        }

        impl Params for $name {
            fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
        }

        impl<S: Shape> Module<Tensor<S>> for $name {
            type Output = Tensor<S>;
            #[track_caller]
            fn forward(&self, x: Tensor<S>) -> Result<Tensor<S>> {
                let run = || Ok(Tensor::wrap(nn::$name.forward(x.untyped())?, *x.shape()));
                match &self.at {
                    Some(at) => at.run(run),
                    None => run(),
                }
            }
        }
    )*};
}

activations! {
    /// `max(x, 0)`, any shape. Records in the scope of the tuple that
    /// holds it (as in `nn::Sequential`); one made with `default()` records
    /// where it is called.
    ReLU;
    /// `x · Φ(x)`, exact normal CDF.
    GELU;
    /// `tanh(x)`.
    Tanh;
    /// `1 / (1 + e^-x)`.
    Sigmoid;
}

/// Dropout with probability `p` (0.5 when built; the field is public):
/// `nn::Dropout`, the identity in evaluation mode.
pub struct Dropout {
    /// The untyped layer (`p`).
    pub inner: nn::Dropout,
    at: At,
}

/// Dropout with probability `1 / N` (`DropoutOneIn<5>` drops 20%), so the
/// rate is part of the model's type.
pub struct DropoutOneIn<const N: usize> {
    /// The untyped layer.
    pub inner: nn::Dropout,
    at: At,
}

impl BuildModule for Dropout {
    #[track_caller]
    fn build(ctx: &Context, _name: &str) -> Result<Self> {
        Ok(Dropout { inner: nn::Dropout::new(0.5)?, at: At::here(ctx) })
    }
    fn set_training(&mut self, training: bool) {
        self.inner.set_training(training)
    }
}

impl<const N: usize> BuildModule for DropoutOneIn<N> {
    #[track_caller]
    fn build(ctx: &Context, _name: &str) -> Result<Self> {
        Ok(DropoutOneIn { inner: nn::Dropout::new(1.0 / N as f64)?, at: At::here(ctx) })
    }
    fn set_training(&mut self, training: bool) {
        self.inner.set_training(training)
    }
}

macro_rules! dropout {
    ($($name:ty, [$($g:tt)*];)*) => {$(
        impl<$($g)*> Params for $name {
            fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
        }

        impl<$($g)* S: Shape> Module<Tensor<S>> for $name {
            type Output = Tensor<S>;
            #[track_caller]
            fn forward(&self, x: Tensor<S>) -> Result<Tensor<S>> {
                let y = self.at.run(|| self.inner.forward(x.untyped()))?;
                Ok(Tensor::wrap(y, *x.shape()))
            }
        }
    )*};
}

dropout! {
    Dropout, [];
    DropoutOneIn<N>, [const N: usize,];
}

/// Flattens every dim after the first into one of size `N`:
/// `(B, C, H, W) -> (B, Const<N>)` (`nn::Flatten`). The product of the
/// flattened dims is arithmetic on const generics, so `N` is written in
/// the type and checked against the input: at build time where the
/// flattened dims are all `Const` (a const assertion, as for `reshape`),
/// when `forward` runs otherwise (an error with the caller's line).
#[derive(Clone, Default)]
pub struct Flatten<const N: usize> {
    at: Option<At>,
}

impl<const N: usize> BuildModule for Flatten<N> {
    fn build(ctx: &Context, _name: &str) -> Result<Self> {
        Ok(Flatten { at: Some(At::here(ctx)) })
    }
}

impl<const N: usize> Params for Flatten<N> {
    fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
}

/// The compile-time half of `Flatten<N>`'s check.
struct FlattensTo<S, const N: usize>(PhantomData<S>);

impl<S: Shape, const N: usize> FlattensTo<S, N> {
    const CHECK: () = if let Some(n) = S::CONST_NUMEL {
        assert!(n == N, "kiln::typed: Flatten<N> where N is not the product of the flattened dims")
    };
}

macro_rules! flatten_input {
    ($(($($d:ident),*);)*) => {$(
        impl<B: Dim, $($d: Dim,)* const N: usize> Module<Tensor<(B, $($d,)*)>> for Flatten<N> {
            type Output = Tensor<(B, Const<N>)>;
            #[track_caller]
            fn forward(&self, x: Tensor<(B, $($d,)*)>) -> Result<Self::Output> {
                #[allow(clippy::let_unit_value)]
                let () = FlattensTo::<($($d,)*), N>::CHECK;
                let location = Location::caller();
                let dims = x.dims();
                if x.error().is_none() && dims[1..].iter().product::<usize>() != N {
                    return Err(Error::Shape {
                        op: "typed::Flatten",
                        message: format!("Flatten<{N}> was given {dims:?}, whose dims after the first hold {} elements", dims[1..].iter().product::<usize>()),
                        location,
                    });
                }
                let run = || nn::Flatten.forward(x.untyped());
                let y = match &self.at {
                    Some(at) => at.run(run)?,
                    None => run()?,
                };
                Ok(Tensor::wrap(y, (x.shape().0, Const)))
            }
        }
    )*};
}

flatten_input! {
    (D1);
    (D1, D2);
    (D1, D2, D3);
}

/// Cross-entropy of logits `(B, Const<C>)` against class ids `(B,)` (i64),
/// averaged over the batch, with label smoothing `eps` (0 for none):
/// `nn::cross_entropy_smoothed`. The batch dims must be one type.
#[track_caller]
pub fn cross_entropy<B: Dim, const C: usize>(
    logits: &Tensor<(B, Const<C>)>,
    targets: &Tensor<(B,), i64>,
    eps: f64,
) -> Result<Tensor<()>> {
    Ok(Tensor::wrap(nn::cross_entropy_smoothed(logits.untyped(), targets.untyped(), eps)?, ()))
}

/// Mean squared error of two tensors of one shape type (`nn::mse`).
#[track_caller]
pub fn mse<S: Shape>(pred: &Tensor<S>, target: &Tensor<S>) -> Result<Tensor<()>> {
    Ok(Tensor::wrap(nn::mse(pred.untyped(), target.untyped())?, ()))
}
