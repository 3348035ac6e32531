//! Stochastic gradient descent, `torch.optim.SGD` without dampening:
//!
//! ```text
//! g = grad + weight_decay · p
//! b = momentum · b + g                (b starts at zero, so b₁ = g)
//! g = g + momentum · b  if nesterov,  else b
//! p = p - lr · g
//! ```

use super::{check_lr, Group, Optimizer};
use crate::capture::HostScalar;
use crate::nn::{check_arg, Params};
use crate::{Context, DType, Location, Result, Tensor, Variable};

/// [`Sgd`]'s hyperparameters; the defaults are PyTorch's (`lr` 1e-3, no
/// momentum, no weight decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: none).
    pub momentum: f64,
    /// Nesterov momentum (needs `momentum > 0`).
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { lr: 1e-3, momentum: 0.0, nesterov: false, weight_decay: 0.0 }
    }
}

/// SGD with optional momentum, Nesterov momentum and weight decay; the
/// momentum buffers are variables `sgd/momentum/<parameter name>`.
pub struct Sgd {
    group: Group,
    config: SgdConfig,
    /// The learning rate, read by each step at its run (a captured step
    /// binds its value at every call, so `set_lr` reaches replays).
    lr: HostScalar,
    momentum: Option<Vec<Variable>>,
}

impl Sgd {
    /// An optimizer of `params`, its state in the scope `sgd` below the
    /// current scope.
    #[track_caller]
    pub fn new(params: &impl Params, config: SgdConfig) -> Result<Sgd> {
        let location = Location::caller();
        let op = "Sgd::new";
        check_lr(config.lr, op, location)?;
        check_arg(config.momentum.is_finite() && config.momentum >= 0.0, op, location, || {
            format!("momentum must be finite and >= 0, got {}", config.momentum)
        })?;
        check_arg(config.weight_decay.is_finite() && config.weight_decay >= 0.0, op, location, || {
            format!("weight decay must be finite and >= 0, got {}", config.weight_decay)
        })?;
        check_arg(!config.nesterov || config.momentum > 0.0, op, location, || {
            "Nesterov momentum needs a momentum > 0".into()
        })?;
        let group = Group::new(params, op, location)?;
        let momentum = if config.momentum > 0.0 { Some(group.state("sgd", "momentum")?) } else { None };
        Ok(Sgd { group, config, lr: HostScalar::new(config.lr), momentum })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let c = self.config;
        let mut lrs: Vec<(DType, Tensor)> = Vec::new();
        for (i, p, grad) in self.group.with_grads() {
            let lr = scalar_for(&mut lrs, &self.group.ctx, &self.lr, p.dtype());
            let mut g = grad;
            if c.weight_decay != 0.0 {
                g = g + &**p * c.weight_decay;
            }
            if let Some(bufs) = &self.momentum {
                let b = &*bufs[i] * c.momentum + &g;
                bufs[i].assign(&b)?;
                g = if c.nesterov { g + &b * c.momentum } else { b };
            }
            p.assign(&**p - &(g * &lr))?;
        }
        Ok(())
    }

    #[track_caller]
    fn zero_grad(&self) -> Result<()> {
        crate::nn::zero_grad(&self.group.params)
    }

    fn lr(&self) -> f64 {
        self.lr.get()
    }

    #[track_caller]
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_lr(lr, "set_lr", Location::caller())?;
        self.lr.set(lr);
        Ok(())
    }

    fn state_bytes(&self) -> Option<usize> {
        let bufs = self.momentum.iter().flatten();
        Some(bufs.map(|b| b.numel() * b.dtype().size()).sum())
    }
}

/// A read of `value` in `dtype`, made once per step and dtype.
pub(super) fn scalar_for(
    cache: &mut Vec<(DType, Tensor)>,
    ctx: &Context,
    value: &HostScalar,
    dtype: DType,
) -> Tensor {
    if let Some((_, t)) = cache.iter().find(|(d, _)| *d == dtype) {
        return t.clone();
    }
    let t = value.tensor(ctx, dtype);
    cache.push((dtype, t.clone()));
    t
}
