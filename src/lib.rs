//! kiln: eager-looking tensor code that runs as a compiled graph.
//!
//! Every op on a [`Context`] or [`Tensor`] records a node in a lazy graph
//! ([`ir`]); nothing runs until a value is read. Then the part of the graph
//! the read needs is extracted, optimized by [`passes`], compiled for the
//! context's backend (cached by structure, so a loop compiles once) and run.
//!
//! ```
//! use kiln::prelude::*;
//!
//! let ctx = Context::cpu().with_seed(7);
//! let x = ctx.randn([4, 8]);
//! let w = ctx.randn([8, 3]) * 0.1;
//! let p = x.matmul(&w).relu().softmax(1);          // recorded, not run
//! let rows: Vec<f32> = p.sum(&[1], false).to_vec()?; // runs here
//! assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-5));
//! println!("{}", ctx.explain(&[&p])?);              // the optimized IR
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! Variables, scopes and gradients make a training step one graph: the
//! forward pass, the gradient graph `backward` records, and the `assign`ed
//! updates compile once and run as one plan (see [`Variable`],
//! [`Context::scope`], [`Tensor::backward`]).
//!
//! ```
//! use kiln::prelude::*;
//!
//! let ctx = Context::cpu().with_seed(0);
//! let (x, y) = (ctx.randn([64, 8]), ctx.randn([64, 1]));
//! let mut first = None;
//! for step in 0..100 {
//!     let (w, b) = ctx.scope("linear", |ctx| {
//!         Ok((ctx.variable("w", ctx.randn([8, 1]) * 0.1)?, ctx.variable("b", ctx.zeros([1]))?))
//!     })?;
//!     let err = x.matmul(&w) + &b - &y;
//!     let loss = (&err * &err).mean(&[0, 1], false);
//!     let grads = loss.backward()?;
//!     let lr = ctx.scalar(0.1f32 / (1.0 + step as f32 / 50.0)); // data, not a constant
//!     for (v, g) in grads.iter() {
//!         v.assign(v - &(g * &lr))?;
//!     }
//!     ctx.zero_grad();
//!     let l = loss.item::<f32>()?; // runs forward, backward and both updates
//!     first.get_or_insert(l);
//!     assert!(step < 99 || l < first.unwrap());
//! }
//! assert!(ctx.stats().compiles <= 3);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! On top of that, [`nn`] has modules (each one's parameters in a scope of
//! its own), losses, an average of parameters and model checkpoints,
//! [`optim`] has SGD, Adam and AdamW (a step is assignments, so training
//! runs as one plan per step), and [`data`] shuffles, batches and stacks
//! samples; all three use only the public API above, so they run on every
//! backend (`examples/digits.rs` trains a real classifier with them).
//! [`autocast`] trains in mixed precision (bf16/f16 products, f32 master
//! weights, dynamic loss scaling) as a compiler pass.
//!
//! Errors never panic: an op given operands it cannot take returns a
//! tensor that carries the error and where it was recorded, and reading it
//! returns that [`Error`].
//!
//! ```
//! use kiln::prelude::*;
//! let ctx = Context::cpu();
//! let bad = ctx.zeros([2, 3]) + ctx.zeros([4]);
//! let err = bad.to_vec::<f32>().unwrap_err();
//! assert!(matches!(err, Error::Shape { .. }));
//! ```
#![warn(missing_docs)]

pub mod attention;
pub mod autocast;
pub mod backends;
pub mod capture;
mod context;
pub mod data;
pub mod dist;
mod error;
pub mod ir;
pub mod nn;
pub mod optim;
pub mod passes;
pub mod profile;
pub mod report;
pub mod runtime;
mod tensor;
pub mod typed;

pub use context::{
    CompileTime, Context, Gradients, Recompile, RecompileCause, RegionStats, Stats, Variable, VariableInfo,
    Workspace,
};
pub use error::{Error, Location, Result};
pub use ir::{DType, Element};
pub use tensor::{IntoDim, IntoOperand, Offset, Operand, Tensor};

/// What most programs need: `use kiln::prelude::*;`.
pub mod prelude {
    pub use crate::{Context, DType, Element, Error, Gradients, Result, Tensor, Variable};
}
