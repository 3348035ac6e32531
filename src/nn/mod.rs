//! Neural-network modules, losses, an exponential moving average of
//! parameters, and checkpoints of a model's parameters.
//!
//! Written only against the public [`Tensor`] / [`Context`] API, so every
//! module runs unchanged on every backend. A module's parameters are
//! variables ([`Variable`]) in a scope of its own: `Linear::new(ctx, "0",
//! 64, 256)` called inside the scope `mlp` makes `mlp/0/weight` and
//! `mlp/0/bias`, the names that dumps, [`crate::Stats::regions`],
//! gradient workspaces and checkpoints show. `forward` enters the same
//! scope, so the nodes it records land in region `mlp/0` (call it from
//! the scope the module was built in and the regions match the names).
//!
//! Building a module twice on one context finds the same variables (as
//! [`Context::variable`] does), so a model built inside a training loop,
//! or after [`Context::load`], starts from the values already there.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln::nn::{self, Linear, Module, Params, ReLU, Sequential};
//!
//! let ctx = Context::cpu().with_seed(0);
//! let mlp = Sequential::new(&ctx, "mlp", |ctx| {
//!     Ok(vec![Linear::new(ctx, "0", 4, 8)?.boxed(), ReLU.boxed(), Linear::new(ctx, "2", 8, 3)?.boxed()])
//! })?;
//! let names: Vec<String> = mlp.parameters().iter().map(|v| v.name()).collect();
//! assert_eq!(names, ["mlp/0/weight", "mlp/0/bias", "mlp/2/weight", "mlp/2/bias"]);
//! let logits = mlp.forward(&ctx.randn([5, 4]))?;
//! let loss = nn::cross_entropy(&logits, &ctx.tensor(&[0i64, 1, 2, 1, 0], [5]))?;
//! assert!(loss.item::<f32>()? > 0.0);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! Initializations are PyTorch's defaults: `Linear` and `Conv2d` draw
//! weight and bias from `U(-1/√fan_in, 1/√fan_in)` (its
//! `kaiming_uniform_(a=√5)`), `LayerNorm` starts at weight 1 and bias 0,
//! `Embedding` from `N(0, 1)`. Weights have PyTorch's layouts (`Linear`:
//! `[out, in]`; `Conv2d`: `[out, in / groups, k, k]`), so a checkpoint
//! maps onto a PyTorch state dict name for name.

mod activation;
pub mod bert;
mod checkpoint;
mod container;
mod conv;
mod ema;
pub mod gpt2;
mod kv_cache;
mod layers;
mod loss;
mod mapped;
pub mod sampling;
#[cfg(feature = "tokenizers")]
mod tokenizer;

pub use activation::{Flatten, ReLU, Sigmoid, Tanh, GELU};
pub use checkpoint::{load, save};
pub use container::{Residual, Sequential};
pub use conv::{AvgPool2d, Conv2d, Conv2dOptions, MaxPool2d};
pub use ema::Ema;
pub use kv_cache::KvCache;
pub use layers::{Dropout, Embedding, LayerNorm, Linear};
pub use loss::{binary_cross_entropy_with_logits, cross_entropy, cross_entropy_smoothed, mse};
pub use mapped::{checkpoint_files, load_mapped, table, LoadReport, Target};
#[cfg(feature = "tokenizers")]
pub use tokenizer::{Batch, Tokenizer};

use crate::{Context, DType, Error, Location, Result, Tensor, Variable};

/// Something that owns parameters: visits them in a fixed order (the
/// order they were made). What optimizers, [`zero_grad`], [`Ema`],
/// [`save`] and [`load`] walk.
pub trait Params {
    /// Calls `f` on every parameter, in order.
    fn visit(&self, f: &mut dyn FnMut(&Variable));

    /// The parameters, in order.
    fn parameters(&self) -> Vec<Variable> {
        let mut out = Vec::new();
        self.visit(&mut |v| out.push(v.clone()));
        out
    }

    /// How many numbers the parameters hold together.
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit(&mut |v| n += v.numel());
        n
    }
}

/// A layer or a model: a function of one tensor, with parameters.
///
/// `forward` records; nothing runs until a value is read. Modules start
/// in training mode; [`Module::set_training`] switches the ones that
/// behave differently (dropout) for every module inside.
pub trait Module: Params + Send + Sync {
    /// The output for input `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Training mode (`true`, the default: dropout drops) or evaluation
    /// mode (`false`: dropout is the identity). Containers pass it on.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// The module as a `Box<dyn Module>`, for [`Sequential`].
    fn boxed(self) -> Box<dyn Module>
    where
        Self: Sized + 'static,
    {
        Box::new(self)
    }
}

impl Params for Variable {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(self)
    }
}

impl Params for [Variable] {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.iter().for_each(f)
    }
}

impl Params for Vec<Variable> {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.iter().for_each(f)
    }
}

impl<P: Params + ?Sized> Params for &P {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        (**self).visit(f)
    }
}

impl<P: Params + ?Sized> Params for Box<P> {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        (**self).visit(f)
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        (**self).forward(x)
    }
    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }
}

/// Releases the gradient workspaces of the scopes that hold `params`
/// (`grad/mlp/0`, ...), newest first, so the next `backward` starts from
/// zero for them. Gradient workspaces are released in LIFO order: one of
/// another scope that is newer than one of these is an error, and then
/// nothing is released ([`Context::zero_grad`] releases all of them).
/// Nothing to release is not an error.
#[track_caller]
pub fn zero_grad(params: &impl Params) -> Result<()> {
    let location = Location::caller();
    let params = params.parameters();
    let Some(ctx) = params.first().and_then(|p| p.context()).cloned() else {
        return Ok(());
    };
    let ours: std::collections::BTreeSet<String> =
        params.iter().map(|p| grad_workspace_of(&p.name())).collect();
    let held = ctx.grad_workspaces();
    let newest_foreign = held.iter().rposition(|w| !ours.contains(w));
    let first_ours = held.iter().position(|w| ours.contains(w));
    if let (Some(foreign), Some(mine)) = (newest_foreign, first_ours) {
        if foreign > mine {
            return Err(Error::Workspace {
                op: "zero_grad",
                message: format!(
                    "cannot release {}: {} is newer and holds gradients of other variables (gradient workspaces are released newest first); release that first, or all of them with Context::zero_grad",
                    held[mine], held[foreign]
                ),
                location,
            });
        }
    }
    for w in held.iter().rev().take_while(|w| ours.contains(*w)) {
        let scope = w.strip_prefix("grad/").unwrap_or("");
        ctx.pop_grad_workspace(scope)?;
    }
    Ok(())
}

/// `grad/<scope>` of the variable `name` (`grad` for a root variable).
fn grad_workspace_of(name: &str) -> String {
    match name.rsplit_once('/') {
        Some((scope, _)) => format!("grad/{scope}"),
        None => "grad".to_string(),
    }
}

/// The variable `path[last]` in the scopes `path[..last]` below the
/// current scope, made from `init` the first time.
pub(crate) fn variable_at(ctx: &Context, path: &[&str], init: &Tensor) -> Result<Variable> {
    match path {
        [name] => ctx.variable(name, init),
        [scope, rest @ ..] => ctx.scope(scope, |ctx| variable_at(ctx, rest, init)),
        [] => ctx.variable("", init),
    }
}

/// `U(-bound, bound)` numbers of `shape`.
pub(crate) fn uniform(ctx: &Context, shape: &[usize], bound: f64) -> Tensor {
    ctx.rand(shape.to_vec()) * (2.0 * bound) - bound
}

/// A 0-d tensor holding `value` in `dtype` (a float dtype): a runtime
/// scalar, so a value that changes (a learning rate, a decay) compiles
/// nothing new.
pub(crate) fn runtime_scalar(ctx: &Context, value: f64, dtype: DType) -> Tensor {
    match dtype {
        DType::F64 => ctx.scalar(value),
        DType::F16 => ctx.scalar(half::f16::from_f64(value)),
        DType::BF16 => ctx.scalar(half::bf16::from_f64(value)),
        _ => ctx.scalar(value as f32).cast(dtype),
    }
}

/// An [`Error::Argument`] unless `ok`.
pub(crate) fn check_arg(
    ok: bool,
    op: &'static str,
    location: Location,
    message: impl FnOnce() -> String,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Argument { op, message: message(), location })
    }
}

#[cfg(test)]
mod tests {
    use super::grad_workspace_of;

    #[test]
    fn gradient_workspace_names_follow_the_variable_scope() {
        assert_eq!(grad_workspace_of("mlp/0/weight"), "grad/mlp/0");
        assert_eq!(grad_workspace_of("w"), "grad");
    }
}
