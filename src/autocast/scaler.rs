//! Dynamic loss scaling, `torch.amp.GradScaler` as graph ops.
//!
//! Per step, recorded (nothing runs until the step's read):
//!
//! ```text
//! backward of loss · scale                    (GradScaler::backward)
//! g = held gradient / scale                   for every held gradient
//! ok = (max over all held |gradient|) / scale < inf   (false for any inf or NaN)
//! the inner optimizer's step on g             (its assignments, gated:)
//! v = ok ? v_new : v_old                      for every variable it assigned
//! t = tracker + 1
//! grown = scale · growth
//! scale   = ok ? (t >= interval && grown < inf ? grown : scale) : scale · backoff
//! tracker = ok ? (t >= interval ? 0 : t) : 0
//! ```
//!
//! A scale never grows to inf (PyTorch's `_amp_update_scale_` keeps the
//! old scale when the grown one is not finite, and restarts the count all
//! the same): an inf scale would make every later step skip, since the
//! scaled gradients would be inf or `0 · inf = NaN`, and `inf · backoff`
//! is inf again.
//!
//! The scale and the tracker are variables (`grad_scaler/scale`, f32, and
//! `grad_scaler/growth_tracker`, i64), so the decision to skip never
//! reaches the host: one plan computes the loss, the gradients, the check,
//! the update or its skip, and the new scale. A skipped step leaves every
//! variable the optimizer would have assigned as it was, its step count
//! included (as PyTorch skips `optimizer.step()`), and the gradients it
//! held are released by `zero_grad` as usual.

use crate::nn::check_arg;
use crate::optim::Optimizer;
use crate::{Context, DType, Location, Result, Tensor, Variable};

/// [`GradScaler`]'s settings; the defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalerConfig {
    /// The first scale (65536 = 2^16).
    pub init_scale: f64,
    /// The factor a scale grows by after `growth_interval` finite steps (2).
    pub growth_factor: f64,
    /// The factor a scale shrinks by after a step with an inf or NaN (0.5).
    pub backoff_factor: f64,
    /// Finite steps in a row before the scale grows (2000).
    pub growth_interval: u32,
}

impl Default for ScalerConfig {
    fn default() -> ScalerConfig {
        ScalerConfig { init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
    }
}

/// An optimizer whose gradients come from a scaled loss (see the module
/// docs): `backward` scales, `step` unscales, checks, and updates or
/// skips. Use it for f16 autocast; bf16 does not need it.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::autocast::{GradScaler, ScalerConfig};
/// use kiln::nn::{self, Linear, Module};
/// use kiln::optim::{Sgd, SgdConfig, TrainStep};
///
/// let ctx = Context::cpu().with_seed(0).with_autocast(DType::F16);
/// let model = Linear::new(&ctx, "fc", 4, 1)?;
/// let sgd = Sgd::new(&model, SgdConfig { lr: 0.05, ..SgdConfig::default() })?;
/// let config = ScalerConfig { init_scale: 1024.0, growth_interval: 3, ..ScalerConfig::default() };
/// let opt = GradScaler::new(&ctx, sgd, config)?;
/// let scale = opt.scale();
/// let mut step = TrainStep::new(&ctx, opt, |b: &[Tensor]| nn::mse(&model.forward(&b[0])?, &b[1]));
/// let (x, y) = (ctx.randn([16, 4]), ctx.randn([16, 1]));
/// for _ in 0..3 {
///     step.call(&[&x, &y])?;
/// }
/// assert_eq!(scale.item::<f32>()?, 2048.0); // three finite steps: grown once
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct GradScaler<O> {
    inner: O,
    ctx: Context,
    scale: Variable,
    tracker: Variable,
    config: ScalerConfig,
}

impl<O: Optimizer> GradScaler<O> {
    /// A scaler of `inner`'s gradients, its state in the scope
    /// `grad_scaler` below the current scope. A non-positive or
    /// non-finite scale, a growth factor not above 1, a backoff factor
    /// outside (0, 1) or an interval of 0 is an error.
    #[track_caller]
    pub fn new(ctx: &Context, inner: O, config: ScalerConfig) -> Result<GradScaler<O>> {
        let location = Location::caller();
        let op = "GradScaler::new";
        let c = config;
        // The scale is kept in f32: 1e39 is finite in f64, inf in f32.
        check_arg((c.init_scale as f32).is_finite() && c.init_scale > 0.0, op, location, || {
            format!(
                "the initial scale must be finite in f32 (where it is kept) and > 0, got {:?}",
                c.init_scale
            )
        })?;
        check_arg(c.growth_factor.is_finite() && c.growth_factor > 1.0, op, location, || {
            format!("the growth factor must be finite and > 1, got {}", c.growth_factor)
        })?;
        check_arg(c.backoff_factor > 0.0 && c.backoff_factor < 1.0, op, location, || {
            format!("the backoff factor must be in (0, 1), got {}", c.backoff_factor)
        })?;
        check_arg(c.growth_interval >= 1, op, location, || {
            "the growth interval must be at least 1 step".into()
        })?;
        let (scale, tracker) = ctx.scope("grad_scaler", |ctx| {
            Ok((
                ctx.variable("scale", ctx.full([], c.init_scale as f32))?,
                ctx.variable("growth_tracker", ctx.zeros_dtype([], DType::I64))?,
            ))
        })?;
        Ok(GradScaler { inner, ctx: ctx.clone(), scale, tracker, config })
    }

    /// The scale the next backward pass multiplies the loss by (a variable
    /// of the context: read it to see the scaler's state).
    pub fn scale(&self) -> Variable {
        self.scale.clone()
    }

    /// Finite steps since the scale last changed (a variable).
    pub fn growth_tracker(&self) -> Variable {
        self.tracker.clone()
    }

    /// The optimizer it wraps.
    pub fn inner(&mut self) -> &mut O {
        &mut self.inner
    }

    /// Unscales every held gradient, records the inner optimizer's step
    /// gated on the gradients being finite, and the new scale.
    fn scaled_step(&mut self) -> Result<()> {
        let held = self.ctx.held_gradients();
        if held.is_empty() {
            return Ok(());
        }
        let location = Location::caller();
        let inverse = self.scale.recip();
        let mut worst: Option<Tensor> = None;
        for (var, g) in &held {
            // The check reads the scaled gradient, so the unscaled one is
            // read only by the update and fuses into its kernel instead
            // of being materialized for the check as well.
            let m = largest_magnitude(g).cast(DType::F32);
            worst = Some(match worst {
                None => m,
                Some(w) => w.maximum(&m),
            });
            self.ctx.replace_grad(var, &(g * &inverse.cast(g.dtype())), location)?;
        }
        let Some(worst) = worst else { return Ok(()) };
        // max |g / scale| = max |g| / scale (rounding is monotone), so this
        // is PyTorch's check of the unscaled gradients: an overflow in the
        // unscaling fails it too. NaN compares false, so a NaN anywhere
        // makes `ok` false.
        let ok = (&worst * &inverse).lt(f32::INFINITY);
        let before = self.ctx.variable_snapshot();
        self.inner.step()?;
        for (var, node, old) in before {
            if self.ctx.value_node(&var) != node {
                var.assign(ok.where_cond(&*var, &old))?;
            }
        }
        let c = self.config;
        let t = &*self.tracker + 1i64;
        let grow = t.ge(c.growth_interval as i64);
        let scale = &*self.scale;
        let larger = scale * c.growth_factor;
        // f32: a grown scale past 3.4e38 is inf, and stays where it was.
        let grown = grow.where_cond(larger.lt(f32::INFINITY).where_cond(&larger, scale), scale);
        self.scale.assign(ok.where_cond(&grown, scale * c.backoff_factor))?;
        self.tracker.assign(ok.where_cond(grow.where_cond(0i64, &t), 0i64))?;
        Ok(())
    }
}

/// `max |g|` over every element, in two reductions: a whole-tensor
/// reduction runs in one block of threads on CUDA, while a reduction over
/// the last dim runs a group of threads per row, with `abs` fused into
/// it and the gradient read through its view (a `Linear` weight's is the
/// transpose of a product) rather than copied.
fn largest_magnitude(g: &Tensor) -> Tensor {
    let a = g.abs();
    if g.rank() < 2 {
        let dims: Vec<usize> = (0..g.rank()).collect();
        return a.max(&dims, false);
    }
    let rows: Vec<usize> = (0..g.rank() - 1).collect();
    a.max(&[g.rank() - 1], false).max(&rows, false)
}

impl<O: Optimizer> Optimizer for GradScaler<O> {
    fn step(&mut self) -> Result<()> {
        self.scaled_step()
    }

    #[track_caller]
    fn zero_grad(&self) -> Result<()> {
        self.inner.zero_grad()
    }

    fn lr(&self) -> f64 {
        self.inner.lr()
    }

    #[track_caller]
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.inner.set_lr(lr)
    }

    /// Records the backward pass of `loss · scale`. The scale is detached:
    /// it is a variable, and its own gradient is no business of the step.
    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        (loss * &self.scale.detach().cast(loss.dtype())).backward().map(|_| ())
    }

    /// The wrapped optimizer's (the scaler's own scale and counters are a
    /// few scalars).
    fn state_bytes(&self) -> Option<usize> {
        self.inner.state_bytes()
    }
}
