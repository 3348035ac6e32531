//! Typed modules: what a model is ([`Module`], [`BuildModule`]), where
//! a module records ([`At`]), skip connections ([`Residual`]), and tuples
//! as sequential models.
//!
//! A typed module wraps the untyped `kiln::nn` module of the same name
//! and calls it, so its parameters are the same scoped variables (made in
//! the same order from the same random numbers: checkpoints, optimizers,
//! [`crate::nn::Ema`] and [`crate::nn::zero_grad`] take typed and untyped
//! models alike) and it records the same graph. The types add the
//! checks: `Module<Tensor<(B, Const<5>)>>` is implemented for
//! `Linear<5, O>` and for nothing that takes another width.
//!
//! Naming follows `nn::Sequential`: a tuple built with name `net` opens
//! the scope `net` and builds its elements as `"0"`, `"1"`, ..., so
//! `((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>)`
//! has the parameters `net/0/0/weight`, `net/1/0/weight`, `net/2/weight`
//! (and biases), the names an untyped model of nested `Sequential`s has.

use super::tensor::Tensor;
use crate::nn::Params;
use crate::{Context, Element, Result, Variable};

/// A function of one input with parameters: `forward` records (nothing
/// runs until a value is read). `Input` is a typed tensor; a module
/// implements `Module` only for the shapes it accepts, so feeding it
/// another is a compile error.
#[diagnostic::on_unimplemented(
    message = "the module `{Self}` cannot take an input of type `{Input}`",
    label = "this module does not accept that shape",
    note = "in a tuple model, each module's output type must be the next one's input type"
)]
pub trait Module<Input> {
    /// The output type.
    type Output;
    /// The output for `x`. Errors only where runtime (`usize`) dims do not
    /// fit, with the caller's line.
    fn forward(&self, x: Input) -> Result<Self::Output>;
}

/// A typed module's construction and mode: built on a context under a
/// name (its scope, or the name its tuple gave it), with parameters, and
/// a training mode that dropout reads.
pub trait BuildModule: Params + Sized {
    /// Builds the module inside the current scope of `ctx` under `name`
    /// (parameters are found again when they exist: a model built twice,
    /// or after `ctx.load`, starts from the stored values).
    fn build(ctx: &Context, name: &str) -> Result<Self>;

    /// Training mode (the default after `build`: dropout drops) or
    /// evaluation mode. Tuples and `Residual` pass it on.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }
}

/// The scope a typed module records in, kept as a path at build time so
/// that `forward` enters the same scopes a nested `nn::Sequential` would:
/// the recorded regions (`@net/0`) are the untyped model's. Entered
/// relative to the scope current at `forward` (a model built and run from
/// one scope enters the whole path).
#[derive(Clone)]
pub(crate) struct At {
    ctx: Context,
    path: String,
}

impl At {
    /// The current scope of `ctx`.
    pub(crate) fn here(ctx: &Context) -> At {
        At { ctx: ctx.clone(), path: ctx.current_scope() }
    }

    /// Runs `f` inside the scope this was made in.
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let current = self.ctx.current_scope();
        let rest = if current.is_empty() {
            self.path.as_str()
        } else if self.path == current {
            ""
        } else {
            self.path.strip_prefix(&current).and_then(|r| r.strip_prefix('/')).unwrap_or(&self.path)
        };
        let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
        enter(&self.ctx, &segments, f)
    }
}

fn enter<R, F: FnOnce() -> Result<R>>(ctx: &Context, segments: &[&str], f: F) -> Result<R> {
    match segments {
        [] => f(),
        [first, rest @ ..] => ctx.scope(first, |ctx| enter(ctx, rest, f)),
    }
}

/// `x + inner(x)`: a skip connection around a module whose output has its
/// input's type (so a shape-changing inner module is a compile error).
pub struct Residual<M> {
    /// The wrapped module.
    pub inner: M,
    at: At,
}

impl<M: BuildModule> BuildModule for Residual<M> {
    /// Builds `inner` under `name` itself (a residual adds no scope, as
    /// `nn::Residual` adds none).
    fn build(ctx: &Context, name: &str) -> Result<Self> {
        Ok(Residual { inner: M::build(ctx, name)?, at: At::here(ctx) })
    }

    fn set_training(&mut self, training: bool) {
        self.inner.set_training(training)
    }
}

impl<M: Params> Params for Residual<M> {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.inner.visit(f)
    }
}

impl<S: super::Shape, E: Element, M> Module<Tensor<S, E>> for Residual<M>
where
    M: Module<Tensor<S, E>, Output = Tensor<S, E>>,
{
    type Output = Tensor<S, E>;
    #[track_caller]
    fn forward(&self, x: Tensor<S, E>) -> Result<Tensor<S, E>> {
        let y = self.inner.forward(x.clone())?;
        self.at.run(|| Ok(Tensor::wrap(x.untyped() + y.untyped(), *x.shape())))
    }
}

macro_rules! tuples {
    ($(($first:ident $fi:tt $(, $t:ident $i:tt <- $prev:ident)*);)*) => {$(
        impl<$first: BuildModule $(, $t: BuildModule)*> BuildModule for ($first, $($t,)*) {
            fn build(ctx: &Context, name: &str) -> Result<Self> {
                ctx.scope(name, |ctx| {
                    Ok(($first::build(ctx, stringify!($fi))?, $($t::build(ctx, stringify!($i))?,)*))
                })
            }

            fn set_training(&mut self, training: bool) {
                self.$fi.set_training(training);
                $(self.$i.set_training(training);)*
            }
        }

        impl<$first: Params $(, $t: Params)*> Params for ($first, $($t,)*) {
            fn visit(&self, f: &mut dyn FnMut(&Variable)) {
                self.$fi.visit(f);
                $(self.$i.visit(f);)*
            }
        }

        impl<Input, $first: Module<Input> $(, $t: Module<$prev::Output>)*> Module<Input> for ($first, $($t,)*) {
            tuples!(@output $first $($t)*);
            #[track_caller]
            fn forward(&self, x: Input) -> Result<Self::Output> {
                let x = self.$fi.forward(x)?;
                $(let x = self.$i.forward(x)?;)*
                Ok(x)
            }
        }
    )*};
    (@output $only:ident) => { type Output = $only::Output; };
    (@output $first:ident $($rest:ident)+) => { tuples!(@output $($rest)+); };
}

tuples! {
    (A 0);
    (A 0, B 1 <- A);
    (A 0, B 1 <- A, C 2 <- B);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F, H 6 <- G);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F, H 6 <- G, I 7 <- H);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F, H 6 <- G, I 7 <- H, J 8 <- I);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F, H 6 <- G, I 7 <- H, J 8 <- I, K 9 <- J);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F, H 6 <- G, I 7 <- H, J 8 <- I, K 9 <- J, L 10 <- K);
    (A 0, B 1 <- A, C 2 <- B, D 3 <- C, F 4 <- D, G 5 <- F, H 6 <- G, I 7 <- H, J 8 <- I, K 9 <- J, L 10 <- K, M 11 <- L);
}
