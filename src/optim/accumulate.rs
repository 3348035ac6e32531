//! Gradient accumulation: `k` micro-batches, one update.

use crate::nn::check_arg;
use crate::{Location, Result, Tensor};

/// Counts micro-batches: each [`Accumulate::backward`] records the
/// backward pass of `loss / k`, which the gradient workspaces add up, so
/// after `k` of them they hold the gradient of the mean loss over all `k`
/// (equal-sized) micro-batches, and it returns `true`: time to
/// [`step`](super::Optimizer::step) and release the gradients.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::optim::{Accumulate, Optimizer, Sgd, SgdConfig};
/// let ctx = Context::cpu();
/// let w = ctx.variable("w", ctx.ones([2]))?;
/// let mut opt = Sgd::new(&w, SgdConfig { lr: 0.1, ..Default::default() })?;
/// let mut acc = Accumulate::new(2)?;
/// for batch in 0..4 {
///     let loss = (&w * (batch as f32 + 1.0)).sum_all();
///     if acc.backward(&loss)? {
///         opt.step()?;
///         opt.zero_grad()?;
///     }
///     loss.item::<f32>()?; // a read between micro-batches keeps the sum as a buffer
/// }
/// // Two updates, by the mean gradients 1.5 and 3.5.
/// assert_eq!(w.to_vec::<f32>()?, vec![0.5, 0.5]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Accumulate {
    every: usize,
    seen: usize,
}

impl Accumulate {
    /// Accumulation over `k >= 1` micro-batches.
    #[track_caller]
    pub fn new(k: usize) -> Result<Accumulate> {
        check_arg(k >= 1, "Accumulate::new", Location::caller(), || {
            "gradient accumulation needs k >= 1 micro-batches, got 0".into()
        })?;
        Ok(Accumulate { every: k, seen: 0 })
    }

    /// Records the backward pass of `loss / k`; `true` when this was the
    /// `k`-th micro-batch since the last `true`.
    #[track_caller]
    pub fn backward(&mut self, loss: &Tensor) -> Result<bool> {
        let scaled = if self.every == 1 { loss.clone() } else { loss / self.every as f64 };
        scaled.backward()?;
        self.seen += 1;
        if self.seen == self.every {
            self.seen = 0;
            return Ok(true);
        }
        Ok(false)
    }

    /// Micro-batches recorded since the last update.
    pub fn pending(&self) -> usize {
        self.seen
    }
}
