//! Adam and AdamW, `torch.optim.Adam` / `torch.optim.AdamW` (no amsgrad):
//!
//! ```text
//! t = t + 1
//! p = p · (1 - lr · weight_decay)        AdamW (decoupled decay)
//! g = grad + weight_decay · p            Adam (L2 penalty)
//! m = β₁ · m + (1 - β₁) · g
//! v = β₂ · v + (1 - β₂) · g²
//! p = p - lr / (1 - β₁ᵗ) · m / (√v / √(1 - β₂ᵗ) + eps)
//! ```
//!
//! The step count `t` is a variable (`<adam|adamw>/step`, i64) and the
//! bias corrections are computed from it in the graph, so nothing about a
//! step is a constant that changes: every step runs the same plan.

use super::sgd::scalar_for;
use super::{check_lr, Group, Optimizer};
use crate::capture::HostScalar;
use crate::nn::{check_arg, variable_at, Params};
use crate::{Context, DType, Location, Result, Tensor, Variable};

/// Adam's and AdamW's hyperparameters. [`AdamConfig::adam`] (also the
/// `Default`) and [`AdamConfig::adamw`] are PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decay rates of the first and second moment estimates.
    pub betas: (f64, f64),
    /// Added to the denominator.
    pub eps: f64,
    /// Adam: an L2 penalty added to the gradient; AdamW: the decoupled
    /// decay `p · (1 - lr · weight_decay)`.
    pub weight_decay: f64,
}

impl AdamConfig {
    /// `torch.optim.Adam`'s defaults: lr 1e-3, betas (0.9, 0.999), eps
    /// 1e-8, no weight decay.
    pub fn adam() -> AdamConfig {
        AdamConfig { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0 }
    }

    /// `torch.optim.AdamW`'s defaults: as Adam's, weight decay 0.01.
    pub fn adamw() -> AdamConfig {
        AdamConfig { weight_decay: 0.01, ..AdamConfig::adam() }
    }
}

impl Default for AdamConfig {
    fn default() -> AdamConfig {
        AdamConfig::adam()
    }
}

/// Adam: moments in `adam/exp_avg/...` and `adam/exp_avg_sq/...`, the
/// step count in `adam/step`.
pub struct Adam {
    core: Core,
}

/// AdamW (decoupled weight decay): state in the scope `adamw`.
pub struct AdamW {
    core: Core,
}

impl Adam {
    /// An optimizer of `params`, its state in the scope `adam` below the
    /// current scope.
    #[track_caller]
    pub fn new(params: &impl Params, config: AdamConfig) -> Result<Adam> {
        Ok(Adam { core: Core::new(params, config, false, "Adam::new", Location::caller())? })
    }
}

impl AdamW {
    /// An optimizer of `params`, its state in the scope `adamw` below the
    /// current scope.
    #[track_caller]
    pub fn new(params: &impl Params, config: AdamConfig) -> Result<AdamW> {
        Ok(AdamW { core: Core::new(params, config, true, "AdamW::new", Location::caller())? })
    }
}

struct Core {
    group: Group,
    rule: AdamRule,
    exp_avg: Vec<Variable>,
    exp_avg_sq: Vec<Variable>,
    step: Variable,
}

impl Core {
    fn new(
        params: &impl Params,
        c: AdamConfig,
        decoupled: bool,
        op: &'static str,
        location: Location,
    ) -> Result<Core> {
        let rule = AdamRule::new(c, decoupled, op, location)?;
        let group = Group::new(params, op, location)?;
        let scope = rule.scope();
        let exp_avg = group.state(scope, "exp_avg")?;
        let exp_avg_sq = group.state(scope, "exp_avg_sq")?;
        let step = variable_at(&group.ctx, &[scope, "step"], &group.ctx.zeros_dtype([], DType::I64))?;
        Ok(Core { group, rule, exp_avg, exp_avg_sq, step })
    }

    fn step(&mut self) -> Result<()> {
        let grads = self.group.with_grads();
        if grads.is_empty() {
            return Ok(());
        }
        let mut step = self.rule.begin(&self.group.ctx, &self.step)?;
        for (i, p, grad) in grads {
            let updated = step.update(p, grad, &self.exp_avg[i], &self.exp_avg_sq[i])?;
            p.assign(updated)?;
        }
        Ok(())
    }

    fn state_bytes(&self) -> usize {
        let moments: usize =
            self.exp_avg.iter().chain(&self.exp_avg_sq).map(|v| v.numel() * v.dtype().size()).sum();
        moments + DType::I64.size()
    }
}

/// Adam's and AdamW's arithmetic, apart from which tensors it updates:
/// [`Adam`] and [`AdamW`] run it on each parameter, the sharded optimizer
/// (`kiln::dist::ShardedOptimizer`) on each rank's flat shard of the
/// parameters. The update is elementwise, so both compute the same bits
/// for the same element.
pub(crate) struct AdamRule {
    config: AdamConfig,
    decoupled: bool,
    /// The learning rate, read by each step at its run (see `Sgd`).
    lr: HostScalar,
}

impl AdamRule {
    /// Checks the hyperparameters (errors name `op` and the caller).
    pub(crate) fn new(
        c: AdamConfig,
        decoupled: bool,
        op: &'static str,
        location: Location,
    ) -> Result<AdamRule> {
        check_lr(c.lr, op, location)?;
        let (b1, b2) = c.betas;
        check_arg((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2), op, location, || {
            format!("betas must be in [0, 1), got ({b1}, {b2})")
        })?;
        check_arg(c.eps.is_finite() && c.eps >= 0.0, op, location, || {
            format!("eps must be finite and >= 0, got {}", c.eps)
        })?;
        check_arg(c.weight_decay.is_finite() && c.weight_decay >= 0.0, op, location, || {
            format!("weight decay must be finite and >= 0, got {}", c.weight_decay)
        })?;
        Ok(AdamRule { config: c, decoupled, lr: HostScalar::new(c.lr) })
    }

    /// The scope its state lives in (`adam`, `adamw`).
    pub(crate) fn scope(&self) -> &'static str {
        if self.decoupled {
            "adamw"
        } else {
            "adam"
        }
    }

    /// The learning rate's host value (set it with [`AdamRule::lr`]'s
    /// [`HostScalar::set`]).
    pub(crate) fn lr(&self) -> &HostScalar {
        &self.lr
    }

    /// Records the step count's increment (`step`, an i64 scalar
    /// variable) and returns what this step's updates share.
    pub(crate) fn begin(&self, ctx: &Context, step: &Variable) -> Result<AdamStep<'_>> {
        let t = &**step + 1i64;
        step.assign(&t)?;
        Ok(AdamStep { rule: self, ctx: ctx.clone(), t, lrs: Vec::new(), corrections: Vec::new() })
    }
}

/// One step of an [`AdamRule`]: the step count and, per dtype, the
/// learning rate and bias corrections, recorded once and shared by every
/// tensor the step updates.
pub(crate) struct AdamStep<'a> {
    rule: &'a AdamRule,
    ctx: Context,
    t: Tensor,
    lrs: Vec<(DType, Tensor)>,
    /// Per dtype: lr / (1 - β₁ᵗ) and √(1 - β₂ᵗ).
    corrections: Vec<(DType, (Tensor, Tensor))>,
}

impl AdamStep<'_> {
    /// The updated value of `p` (a parameter, or a flat shard of several)
    /// for its gradient `g`; records the new moments into `m` and `v`
    /// (of `p`'s shape and dtype). The caller assigns the result.
    pub(crate) fn update(&mut self, p: &Tensor, g: Tensor, m: &Variable, v: &Variable) -> Result<Tensor> {
        let c = self.rule.config;
        let (b1, b2) = c.betas;
        let dtype = p.dtype();
        let lr = scalar_for(&mut self.lrs, &self.ctx, &self.rule.lr, dtype);
        let (step_size, bc2_sqrt) = match self.corrections.iter().find(|(d, _)| *d == dtype) {
            Some((_, pair)) => pair.clone(),
            None => {
                let tf = self.t.cast(dtype);
                let bc1 = 1.0f64 - self.ctx.full_dtype([], b1, dtype).pow(&tf);
                let bc2 = 1.0f64 - self.ctx.full_dtype([], b2, dtype).pow(&tf);
                let pair = (&lr / &bc1, bc2.sqrt());
                self.corrections.push((dtype, pair.clone()));
                pair
            }
        };
        let mut base: Tensor = p.clone();
        let mut g = g;
        if c.weight_decay != 0.0 {
            if self.rule.decoupled {
                base = &base * &(1.0f64 - &lr * c.weight_decay);
            } else {
                g = g + &base * c.weight_decay;
            }
        }
        let m_new = &**m * b1 + &g * (1.0 - b1);
        let v_new = &**v * b2 + &(&g * &g) * (1.0 - b2);
        let denom = v_new.sqrt() / &bc2_sqrt + c.eps;
        let updated = base - &(&step_size * &(&m_new / &denom));
        m.assign(&m_new)?;
        v.assign(&v_new)?;
        Ok(updated)
    }
}

macro_rules! adam_optimizer {
    ($($t:ident)*) => {$(
        impl Optimizer for $t {
            fn step(&mut self) -> Result<()> {
                self.core.step()
            }

            #[track_caller]
            fn zero_grad(&self) -> Result<()> {
                crate::nn::zero_grad(&self.core.group.params)
            }

            fn lr(&self) -> f64 {
                self.core.rule.lr().get()
            }

            #[track_caller]
            fn set_lr(&mut self, lr: f64) -> Result<()> {
                check_lr(lr, "set_lr", Location::caller())?;
                self.core.rule.lr().set(lr);
                Ok(())
            }

            fn state_bytes(&self) -> Option<usize> {
                Some(self.core.state_bytes())
            }
        }
    )*};
}

adam_optimizer!(Adam AdamW);
