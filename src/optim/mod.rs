//! Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW,
//! with PyTorch's update formulas, and gradient accumulation.
//!
//! An optimizer holds the parameters it was given ([`Params`]) and its
//! state in variables of its own scope (`adamw/exp_avg/mlp/0/weight`,
//! `adamw/step`), so a checkpoint of the workspace resumes training
//! exactly. [`Optimizer::step`] *records* the update of every parameter
//! that has a gradient (the gradient workspaces hold them after
//! `backward`) as assignments: the next read runs the forward pass, the
//! backward pass and every update as one compiled plan. The learning rate
//! is a runtime scalar, so [`Optimizer::set_lr`] every step (a schedule)
//! compiles nothing new.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln::nn::{self, Linear, Module};
//! use kiln::optim::{AdamW, AdamConfig, Optimizer};
//!
//! let ctx = Context::cpu().with_seed(0);
//! let model = Linear::new(&ctx, "fc", 3, 1)?;
//! let mut opt = AdamW::new(&model, AdamConfig { lr: 0.05, ..AdamConfig::adamw() })?;
//! let (x, y) = (ctx.randn([16, 3]), ctx.randn([16, 1]));
//! let mut losses = Vec::new();
//! for _ in 0..20 {
//!     let loss = nn::mse(&model.forward(&x)?, &y)?;
//!     loss.backward()?;
//!     opt.step()?;       // records the update
//!     opt.zero_grad()?;  // the step's plan never writes the gradients out
//!     losses.push(loss.item::<f32>()?); // forward, backward, update: one plan
//! }
//! assert!(losses[19] < losses[0]);
//! assert!(ctx.stats().compiles <= 3);
//! # Ok::<(), kiln::Error>(())
//! ```

mod accumulate;
mod adam;
mod sgd;
mod step;

pub use accumulate::Accumulate;
pub(crate) use adam::AdamRule;
pub use adam::{Adam, AdamConfig, AdamW};
pub use sgd::{Sgd, SgdConfig};
pub use step::TrainStep;

use crate::nn::{check_arg, variable_at, Params};
use crate::{Context, Error, Location, Result, Tensor, Variable};

/// What every optimizer does.
pub trait Optimizer {
    /// Records one update of every parameter that has a gradient (in its
    /// gradient workspace); parameters without one are left alone, as
    /// PyTorch skips a parameter whose `.grad` is `None`.
    fn step(&mut self) -> Result<()>;

    /// Releases the gradient workspaces of the parameters' scopes (see
    /// [`crate::nn::zero_grad`]).
    fn zero_grad(&self) -> Result<()>;

    /// The learning rate the next step uses.
    fn lr(&self) -> f64;

    /// Sets the learning rate of the following steps (a runtime value:
    /// no recompile). A negative or non-finite rate is an error.
    fn set_lr(&mut self, lr: f64) -> Result<()>;

    /// Records the backward pass of `loss` whose gradients the next
    /// [`Optimizer::step`] uses: `loss.backward()`. A loss scaler
    /// (`kiln::autocast::GradScaler`) records the backward pass of the
    /// scaled loss instead, which is why [`TrainStep`] calls this rather
    /// than `backward` itself.
    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        loss.backward().map(|_| ())
    }

    /// Bytes of optimizer state this optimizer holds on its device (Adam's
    /// moments and step count, SGD's momentum buffers; a sharded
    /// optimizer's, only its rank's shard), for reporting memory. `None`
    /// where an optimizer does not say.
    fn state_bytes(&self) -> Option<usize> {
        None
    }
}

/// A boxed optimizer is an optimizer, so a program can choose one at run
/// time (`Box<dyn Optimizer>`: AdamW, or AdamW under a loss scaler) and
/// hand it to a [`TrainStep`].
impl<O: Optimizer + ?Sized> Optimizer for Box<O> {
    fn step(&mut self) -> Result<()> {
        (**self).step()
    }

    #[track_caller]
    fn zero_grad(&self) -> Result<()> {
        (**self).zero_grad()
    }

    fn lr(&self) -> f64 {
        (**self).lr()
    }

    #[track_caller]
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        (**self).set_lr(lr)
    }

    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        (**self).backward(loss)
    }

    fn state_bytes(&self) -> Option<usize> {
        (**self).state_bytes()
    }
}

/// The parameters an optimizer updates, and the context they live on.
pub(crate) struct Group {
    pub(crate) ctx: Context,
    pub(crate) params: Vec<Variable>,
}

impl Group {
    /// The parameters of `params`, which must be float variables of one
    /// context, at least one.
    pub(crate) fn new(params: &impl Params, op: &'static str, location: Location) -> Result<Group> {
        let params = params.parameters();
        let Some(ctx) = params.first().and_then(|p| p.context()).cloned() else {
            return Err(Error::Argument {
                op,
                message: "the optimizer was given no parameters (a model with no variables?)".into(),
                location,
            });
        };
        for p in &params {
            if !p.dtype().is_float() {
                return Err(Error::DType {
                    op,
                    message: format!(
                        "parameter \"{}\" is {}; only float parameters can be optimized",
                        p.name(),
                        p.dtype()
                    ),
                    location,
                });
            }
        }
        Ok(Group { ctx, params })
    }

    /// A zero-initialized state variable per parameter, named
    /// `<scope>/<kind>/<parameter name>` below the current scope.
    pub(crate) fn state(&self, scope: &str, kind: &str) -> Result<Vec<Variable>> {
        self.params
            .iter()
            .map(|p| {
                let name = p.name();
                let mut path = vec![scope, kind];
                path.extend(name.split('/'));
                variable_at(&self.ctx, &path, &self.ctx.zeros_dtype(p.shape().to_vec(), p.dtype()))
            })
            .collect()
    }

    /// `(index, parameter, gradient)` for every parameter with a gradient.
    pub(crate) fn with_grads(&self) -> Vec<(usize, &Variable, Tensor)> {
        self.params.iter().enumerate().filter_map(|(i, p)| Some((i, p, self.ctx.grad(p)?))).collect()
    }
}

/// Checks a learning rate.
pub(crate) fn check_lr(lr: f64, op: &'static str, location: Location) -> Result<()> {
    check_arg(lr.is_finite() && lr >= 0.0, op, location, || {
        format!("the learning rate must be finite and >= 0, got {lr}")
    })
}
