//! A captured training step: forward, backward, the optimizer's update
//! and releasing the gradients, recorded once per batch shape and replayed
//! ([`crate::capture`]).

use super::Optimizer;
use crate::capture::Steps;
use crate::{Context, Location, Result, Tensor};

/// A training step recorded once per signature and replayed: each
/// [`TrainStep::call`] computes the loss of a batch, its gradients, and
/// the optimizer's update of every parameter, as one plan launched
/// without recording anything (the host cost is flat in the model's
/// size). The optimizer stays reachable ([`TrainStep::optimizer`]) for
/// schedules: `set_lr` is a runtime value, so it changes no plan. The
/// gradients come from [`Optimizer::backward`], so an optimizer under a
/// loss scaler (`kiln::autocast::GradScaler`) scales, checks and skips
/// inside the replayed plan too.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::nn::{self, Linear, Module};
/// use kiln::optim::{Sgd, SgdConfig, TrainStep};
///
/// let ctx = Context::cpu().with_seed(0);
/// let model = Linear::new(&ctx, "fc", 3, 1)?;
/// let opt = Sgd::new(&model, SgdConfig { lr: 0.1, ..SgdConfig::default() })?;
/// let mut step = TrainStep::new(&ctx, opt, |b: &[Tensor]| nn::mse(&model.forward(&b[0])?, &b[1]));
/// let (x, y) = (ctx.randn([16, 3]), ctx.randn([16, 1]));
/// let first = step.call(&[&x, &y])?.item::<f32>()?;
/// for _ in 0..20 {
///     step.call(&[&x, &y])?;
/// }
/// assert!(step.call(&[&x, &y])?.item::<f32>()? < first);
/// assert_eq!(step.captures(), 1);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct TrainStep<O, L> {
    steps: Steps,
    opt: O,
    loss: L,
}

impl<O: Optimizer, L: FnMut(&[Tensor]) -> Result<Tensor>> TrainStep<O, L> {
    /// A step of `opt` on the loss `loss(batch)` computes; nothing is
    /// recorded until the first call.
    pub fn new(ctx: &Context, opt: O, loss: L) -> TrainStep<O, L> {
        TrainStep { steps: Steps::new(ctx), opt, loss }
    }

    /// Runs one step on `batch` (the loss function's arguments) and
    /// returns the loss, computed without waiting (read it when needed).
    #[track_caller]
    pub fn call(&mut self, batch: &[&Tensor]) -> Result<Tensor> {
        let location = Location::caller();
        let (opt, loss) = (&mut self.opt, &mut self.loss);
        let mut step = |b: &[Tensor]| -> Result<Vec<Tensor>> {
            let l = loss(b)?;
            opt.backward(&l)?;
            opt.step()?;
            opt.zero_grad()?;
            Ok(vec![l])
        };
        let mut out = self.steps.call_at(batch, &mut step, location)?;
        Ok(out.remove(0))
    }

    /// The optimizer (for `set_lr`).
    pub fn optimizer(&mut self) -> &mut O {
        &mut self.opt
    }

    /// How many batch signatures were recorded.
    pub fn captures(&self) -> usize {
        self.steps.captures()
    }
}
