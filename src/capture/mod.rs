//! Captured steps: a closure recorded once per input signature and then
//! replayed, without calling it again.
//!
//! A loop that records its step every iteration pays the host for every
//! op (record, walk, key, look up: about half a microsecond per node) on
//! every call, even when the plan is cached. [`Context::capture`] pays it
//! once: the first call with a new signature (the arguments' shapes and
//! dtypes) runs the closure, realizes what it returns together with the
//! assignments it recorded, and keeps the plan that ran with where each of
//! its inputs and outputs comes from and goes to ([`plan::StepPlan`]).
//! Later calls bind the arguments and the variables' current values to
//! that plan and launch it (a replayed CUDA graph on CUDA): host work in
//! proportion to the inputs and outputs, flat in the size of the graph.
//!
//! What a step may do: read its arguments, variables (their values at
//! each call) and any tensor from outside (a constant of the step); assign
//! variables (the optimizer's update); open scopes; draw random numbers
//! (each call draws fresh ones: the random streams a call uses are new
//! context streams, numbered as the recording call numbered them, so a
//! captured loop draws the numbers an uncaptured loop would); compute and
//! release gradients. What it may not: create variables (make modules and
//! optimizers before capturing), leave gradients held when it returns, be
//! called while gradients are held (each would change the graph the next
//! call needs), or read a value on the host (`to_vec`, `item`, `realize`,
//! `sync`: an error at the read, since a replay runs one plan and no host
//! code). The closure must record the same computation for the same
//! signature: host-side branching on values (`if loss > 1.0`) is frozen at
//! the recording call, as in every tracing compiler.
//!
//! What a call binds, so that a replay equals running the closure again:
//! the arguments; each variable's value at the call (the step's reads of
//! it; a tensor from outside that read the variable before the step, such
//! as `w.detach()`, keeps the value it read); and each [`HostScalar`] the
//! step read, at its value then (the optimizers' learning rates are such
//! cells, so `set_lr` between calls reaches the replay). A Rust number the
//! closure uses is a constant of the step, frozen at the recording call:
//! a value that changes between calls is an argument, a variable or a
//! [`HostScalar`].
//!
//! A new signature records again, up to a cap (8 by default,
//! [`Captured::with_cap`]); past it a call is an error that says what
//! changed, since a signature that changes every call (a growing
//! sequence) would record every call.

mod plan;
mod scalar;

pub use scalar::HostScalar;
pub(crate) use scalar::HostScalarReads;

use crate::ir::{DType, Shape};
use crate::{Context, Error, Location, Result, Tensor};
use plan::StepPlan;

/// The closure type a captured step runs when it records.
pub trait StepFn: FnMut(&[Tensor]) -> Result<Vec<Tensor>> {}
impl<F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>> StepFn for F {}

/// The plans of one captured step, by signature (see the module docs).
/// [`Captured`] pairs it with its closure; [`crate::optim::TrainStep`]
/// with a model's loss and an optimizer.
pub struct Steps {
    ctx: Context,
    plans: Vec<StepPlan>,
    cap: usize,
    replays: u64,
}

/// The arguments' shapes and dtypes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Signature(Vec<(Shape, DType)>);

impl Signature {
    fn of(args: &[&Tensor]) -> Signature {
        Signature(args.iter().map(|t| (t.shape_ir(), t.dtype())).collect())
    }

    /// What differs from `other`, in words.
    fn change_from(&self, other: &Signature) -> String {
        if self.0.len() != other.0.len() {
            return format!("{} argument(s) before, {} now", other.0.len(), self.0.len());
        }
        let changes: Vec<String> = self
            .0
            .iter()
            .zip(&other.0)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(k, (now, was))| format!("argument {k} was {}{}, now {}{}", was.1, was.0, now.1, now.0))
            .collect();
        changes.join("; ")
    }
}

impl Steps {
    /// No plans yet, on `ctx`, with the default cap of 8 signatures.
    pub fn new(ctx: &Context) -> Steps {
        Steps { ctx: ctx.clone(), plans: Vec::new(), cap: 8, replays: 0 }
    }

    /// Calls the step: replays the plan of this signature, or records
    /// one by running `f`. Returns what `f` returns (as realized tensors).
    #[track_caller]
    pub fn call(&mut self, args: &[&Tensor], f: &mut dyn StepFn) -> Result<Vec<Tensor>> {
        self.call_at(args, f, Location::caller())
    }

    pub(crate) fn call_at(
        &mut self,
        args: &[&Tensor],
        f: &mut dyn StepFn,
        location: Location,
    ) -> Result<Vec<Tensor>> {
        for a in args {
            a.node_in(&self.ctx, location)?;
        }
        let signature = Signature::of(args);
        if let Some(plan) = self.plans.iter().find(|p| p.signature == signature) {
            let _span = tracing::debug_span!("step", replay = true).entered();
            let out = plan.replay(&self.ctx, args, location)?;
            self.replays += 1;
            return Ok(out);
        }
        if self.plans.len() >= self.cap {
            let last = &self.plans[self.plans.len() - 1].signature;
            return Err(Error::Argument {
                op: "captured step",
                message: format!(
                    "a captured step was called with a new signature after {} captures (the cap): {}. \
                     Give it fixed shapes (pad or bucket the batch), or raise the cap with `with_cap`",
                    self.cap,
                    signature.change_from(last)
                ),
                location,
            });
        }
        let _span = tracing::debug_span!("step", replay = false, signature = self.plans.len()).entered();
        let (plan, out) = StepPlan::record(&self.ctx, signature, args, f, location)?;
        self.plans.push(plan);
        Ok(out)
    }

    /// How many signatures were recorded.
    pub fn captures(&self) -> usize {
        self.plans.len()
    }

    /// How many calls replayed a recorded plan.
    pub fn replays(&self) -> u64 {
        self.replays
    }

    fn set_cap(&mut self, cap: usize) {
        self.cap = cap.max(1);
    }
}

/// A step recorded once per signature and replayed: see the module docs
/// and [`Context::capture`].
pub struct Captured<F> {
    steps: Steps,
    f: F,
}

impl<F: StepFn> Captured<F> {
    /// Calls the step with these arguments (their shapes and dtypes pick
    /// the recorded plan) and returns its results, computed on the device
    /// without waiting (read them as any tensor).
    #[track_caller]
    pub fn call(&mut self, args: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.steps.call_at(args, &mut self.f, Location::caller())
    }

    /// The most signatures recorded (default 8, at least 1).
    pub fn with_cap(mut self, cap: usize) -> Captured<F> {
        self.steps.set_cap(cap);
        self
    }

    /// How many signatures were recorded.
    pub fn captures(&self) -> usize {
        self.steps.captures()
    }

    /// How many calls replayed a recorded plan.
    pub fn replays(&self) -> u64 {
        self.steps.replays()
    }
}

impl Context {
    /// Makes a captured step of `f`: each [`Captured::call`] with a new
    /// signature runs `f` once and records its plan, and every later call
    /// with that signature replays the plan without running `f` (see
    /// [`crate::capture`] for what `f` may do). Nothing is recorded until
    /// the first call, so this cannot fail; the calls return the errors.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let w = ctx.variable("w", ctx.ones([3]))?;
    /// let mut step = ctx.capture(|args: &[Tensor]| {
    ///     let y = &args[0] * &*w;
    ///     w.assign(&*w + 1.0)?;
    ///     Ok(vec![y.sum_all()])
    /// });
    /// let x = ctx.tensor(&[1.0f32, 2.0, 3.0], [3]);
    /// for k in 0..4 {
    ///     let out = step.call(&[&x])?;
    ///     assert_eq!(out[0].item::<f32>()?, 6.0 * (1.0 + k as f32));
    /// }
    /// assert_eq!((step.captures(), step.replays()), (1, 3));
    /// assert_eq!(w.to_vec::<f32>()?, vec![5.0; 3]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn capture<F: StepFn>(&self, f: F) -> Captured<F> {
        Captured { steps: Steps::new(self), f }
    }
}
