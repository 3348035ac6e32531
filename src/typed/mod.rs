//! Shapes the compiler checks: an optional typed layer over [`crate::Tensor`]
//! (dfdx's design on top of kiln's graph compiler).
//!
//! A [`Tensor<S, E>`](Tensor) is an untyped tensor plus its shape as a type
//! `S` (a tuple of [`Const<N>`](Const) dims, known to the compiler, and
//! `usize` dims, known at run time) and its element type `E`. Ops exist
//! only for the shapes they accept, so a matmul with mismatched inner
//! dims, adding `[3, 5]` to `[5, 3]`, a reduction over an axis past the
//! rank or a `Linear<5, 10>` fed 7 features is a compile error whose
//! message names the shapes. `usize` dims are checked when the op is
//! recorded, as every untyped op is, and a mismatch is a [`crate::Error`]
//! that points at the caller's line.
//!
//! ```
//! use kiln::typed::*;
//! use kiln::optim::{AdamConfig, AdamW, Optimizer};
//!
//! type Model = ((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>);
//!
//! let ctx = Context::cpu().with_seed(0);
//! let model = Model::build(&ctx, "net")?;
//! assert_eq!(model.parameters()[0].name(), "net/0/0/weight");
//! let mut opt = AdamW::new(&model, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() })?;
//! let teacher: Tensor<Rank2<5, 2>> = ctx.randn_typed(Default::default());
//! teacher.realize()?;
//! let mut losses = Vec::new();
//! for _ in 0..100 {
//!     let x: Tensor<(usize, Const<5>)> = ctx.randn_typed((16, Const)); // a runtime batch
//!     let y = x.matmul(&teacher).tanh();                              // (usize, Const<2>)
//!     let loss = mse(&model.forward(x)?, &y)?;                         // Tensor<()>
//!     loss.backward()?;
//!     opt.step()?;
//!     opt.zero_grad()?;
//!     losses.push(loss.item()?);
//! }
//! assert!(losses[99] < losses[0] / 4.0);
//! assert!(ctx.stats().compiles <= 3);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! `model.forward(ctx.randn_typed((16, Const::<7>)))` does not compile:
//! "the module `Linear<5, 10>` cannot take an input of type
//! `Tensor<(usize, Const<7>)>`" (`tests/typed/ui/` has every such message).
//!
//! **Zero cost.** A typed tensor is the untyped handle plus a shape value
//! (a few `usize`s, none for `Const` dims); every typed op calls the
//! untyped op of the same name, and typed modules wrap and call the
//! untyped `kiln::nn` modules. A typed model records the same graph (the
//! same text) as its untyped twin, so plans, the plan cache and speed are
//! unchanged, and its parameters are the same scoped variables: optimizers,
//! gradient accumulation, [`crate::nn::Ema`] and checkpoints take it as
//! they take an untyped model.
//!
//! **Mixing.** [`Tensor::untyped`] / [`Tensor::into_untyped`] give the
//! untyped tensor (no copy); [`Tensor::from_untyped`] checks an untyped
//! tensor's dims against `S` once and wraps it. Untyped code and typed
//! code share one [`Context`] and one graph.
//!
//! **What stable Rust cannot check.** Arithmetic on const generics needs
//! the unstable `generic_const_exprs`, so:
//! - a reshape or a [`Flatten<N>`](Flatten) between all-`Const` shapes is
//!   checked by a const assertion when the call is compiled to code
//!   (`cargo build`, `cargo test`), not by `cargo check`;
//! - conv and pooling output sizes are a table of common configurations
//!   ([`ConvOut`]); elsewhere use `usize` spatial dims;
//! - concatenating along an axis gives a `usize` dim there.
//!
//! Naming: `kiln::typed::Tensor` is the typed tensor; `use kiln::typed::*`
//! brings it with everything else typed code needs (the [`Context`],
//! [`Result`], [`crate::nn::Params`]), so write `kiln::Tensor` for the
//! untyped one in a file that uses both.

mod conv;
mod layers;
mod modules;
mod ops;
mod reduce;
mod rules;
mod shape;
mod tensor;
mod view;

pub use conv::{AvgPool2d, Conv2d, ConvOut, MaxPool2d};
pub use layers::{
    cross_entropy, mse, Dropout, DropoutOneIn, Flatten, LayerNorm, Linear, ReLU, Sigmoid, Tanh, GELU,
};
pub use modules::{BuildModule, Module, Residual};
pub use rules::{ConcatShapes, MatMulShapes, PermuteShape};
pub use shape::{
    Axes2, Axes3, Axes4, Axis, BroadcastShapes, Const, ConstDim, ConstShape, Dim, HasAxis, Rank0, Rank1,
    Rank2, Rank3, Rank4, Shape,
};
pub use tensor::Tensor;

pub use crate::nn::Params;
pub use crate::{Context, DType, Element, Error, Result, Variable};
