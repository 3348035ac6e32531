//! Mixed precision: bf16/f16 autocast with f32 master weights, and loss
//! scaling for f16.
//!
//! A context made with [`Context::with_autocast`] compiles every plan
//! through the `autocast` pass ([`crate::passes::Autocast`]), first in the
//! pipeline: matmuls and convolutions run in the low type (accumulating in
//! f32), reductions, exp/log/pow and normalizers stay f32, everything else
//! follows its operands, by the policy table [`crate::passes::POLICY`]
//! (printed at the head of the pass's `KILN_DUMP` file). Nothing about
//! recording changes: tensors keep the dtypes they were recorded with,
//! variables stay f32 (the master weights), every read returns its
//! recorded dtype, and autodiff differentiates the f32 graph it recorded;
//! the pass then rewrites forward, backward and update together, so the
//! low copy of each weight is made once per step inside the step's plan
//! and shared by the forward product and the backward one.
//!
//! f16's range (6e-5 to 65504) is too small for many gradients, so f16
//! training scales the loss: [`GradScaler`] wraps an optimizer, records
//! the backward pass of `loss * scale`, unscales the gradients, and
//! records the update gated on their being finite (a step with an inf or
//! NaN changes no parameter and halves the scale; `growth_interval`
//! finite steps in a row double it). Its state is two variables, so the
//! whole step, the check and the skip included, is one plan with no host
//! round trip, and it works unchanged in a captured
//! [`crate::optim::TrainStep`]. bf16 has f32's range and needs no scaler.
//!
//! Autocast is a setting of the context, not of a scope: regions name
//! nodes but carry no settings in the IR (its text format and the plan
//! cache's key would both need them), and what a per-scope switch is
//! mostly wanted for, keeping an optimizer's update out of the low type,
//! the pass already does (values that reach an assignment through
//! elementwise ops stay f32).
//!
//! ```
//! use kiln::prelude::*;
//! use kiln::nn::{self, Linear, Module, Params};
//! use kiln::optim::{AdamConfig, AdamW, Optimizer};
//!
//! let ctx = Context::cpu().with_seed(0).with_autocast(DType::BF16);
//! let model = Linear::new(&ctx, "fc", 8, 1)?;
//! let mut opt = AdamW::new(&model, AdamConfig { lr: 0.05, ..AdamConfig::adamw() })?;
//! let (x, y) = (ctx.randn([32, 8]), ctx.randn([32, 1]));
//! let mut losses = Vec::new();
//! for _ in 0..20 {
//!     let loss = nn::mse(&model.forward(&x)?, &y)?;  // f32, as recorded
//!     loss.backward()?;
//!     opt.step()?;
//!     opt.zero_grad()?;
//!     losses.push(loss.item::<f32>()?);
//! }
//! assert!(losses[19] < losses[0]);
//! assert_eq!(model.parameters()[0].dtype(), DType::F32); // master weights
//! # Ok::<(), kiln::Error>(())
//! ```

mod scaler;

pub use scaler::{GradScaler, ScalerConfig};

use crate::{Context, DType, Error, Location};

impl Context {
    /// Compiles this context's plans in mixed precision with `low`
    /// (`DType::BF16` or `DType::F16`): see [`crate::autocast`]. Plans
    /// compiled before stay cached under their own setting. Any other
    /// dtype is an [`Error::Argument`] that the next read reports.
    #[track_caller]
    pub fn with_autocast(self, low: DType) -> Context {
        let location = Location::caller();
        {
            let mut state = self.state();
            match low {
                DType::BF16 | DType::F16 => state.options.autocast = Some(low),
                other => {
                    state.config = Err(Error::Argument {
                        op: "with_autocast",
                        message: format!(
                            "autocast runs products in bf16 or f16, not {other}; to train in {other}, leave autocast off"
                        ),
                        location,
                    })
                }
            }
        }
        self
    }

    /// The low type plans compile in, if autocast is on.
    pub fn autocast(&self) -> Option<DType> {
        self.state().options.autocast
    }
}
