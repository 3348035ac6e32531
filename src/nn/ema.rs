//! An exponential moving average of a model's parameters (Polyak
//! averaging), kept in variables of its own: `ema/<parameter name>`.

use super::{check_arg, runtime_scalar, variable_at, Params};
use crate::capture::HostScalar;
use crate::{Context, Error, Location, Result, Variable};

/// Shadow copies of a model's parameters that follow them slowly:
/// `update` records `ema = ema · decay + param · (1 - decay)` for every
/// parameter, as assignments, so the next read runs all of them in one
/// plan (with the training step recorded before it). The decay is a
/// runtime scalar: a schedule that changes it compiles nothing new. In a
/// captured step (which never runs its closure again) a decay that
/// changes between calls is a [`HostScalar`] read by
/// [`Ema::update_from`]: each call binds its value then.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::nn::{Ema, Params};
/// let ctx = Context::cpu();
/// let w = ctx.variable("w", ctx.tensor(&[0.0f32], [1]))?;
/// let ema = Ema::new(&w)?;
/// w.assign(ctx.tensor(&[1.0f32], [1]))?;
/// ema.update(&w, 0.9)?;
/// assert_eq!(ema.parameters()[0].name(), "ema/w");
/// assert!((ema.parameters()[0].item::<f32>()? - 0.1).abs() < 1e-6);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct Ema {
    /// `(the model's parameter name, its shadow)`, in the model's order.
    shadows: Vec<(String, Variable)>,
    ctx: Option<Context>,
}

impl Ema {
    /// Shadows of `model`'s parameters, starting at their current values,
    /// in the scope `ema` below the current scope (existing ones, from a
    /// loaded checkpoint, are kept).
    #[track_caller]
    pub fn new(model: &impl Params) -> Result<Ema> {
        let mut shadows = Vec::new();
        let mut ctx = None;
        for p in model.parameters() {
            let Some(c) = p.context().cloned() else { continue };
            let name = p.name();
            let mut path = vec!["ema"];
            path.extend(name.split('/'));
            shadows.push((name.clone(), variable_at(&c, &path, &p.detach())?));
            ctx = Some(c);
        }
        Ok(Ema { shadows, ctx })
    }

    /// Records one step of the average toward `model`'s current values
    /// (those after every assignment recorded so far, such as an
    /// optimizer step). `decay` is in `[0, 1]`; `model` must have the
    /// parameters the average was made from.
    #[track_caller]
    pub fn update(&self, model: &impl Params, decay: f64) -> Result<()> {
        let location = Location::caller();
        check_arg((0.0..=1.0).contains(&decay), "Ema::update", location, || {
            format!("the decay must be in [0, 1], got {decay}")
        })?;
        let params = self.matching(model, "Ema::update", location)?;
        let Some(ctx) = &self.ctx else { return Ok(()) };
        for ((_, shadow), p) in self.shadows.iter().zip(&params) {
            let d = runtime_scalar(ctx, decay, shadow.dtype());
            let rest = runtime_scalar(ctx, 1.0 - decay, shadow.dtype());
            shadow.assign(&**shadow * &d + &**p * &rest)?;
        }
        Ok(())
    }

    /// [`Ema::update`] with the decay a [`HostScalar`] holds when the
    /// update runs: a captured step that calls this reads the cell at each
    /// call, so a decay schedule set between calls reaches every replay.
    /// The value must be in `[0, 1]` (checked here, at recording).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::capture::HostScalar;
    /// use kiln::nn::{Ema, Params};
    /// let ctx = Context::cpu();
    /// let w = ctx.variable("w", ctx.tensor(&[1.0f32], [1]))?;
    /// let ema = Ema::new(&w)?;
    /// let decay = HostScalar::new(0.5);
    /// let (d, w2) = (decay.clone(), w.clone());
    /// let mut step = ctx.capture(move |_: &[Tensor]| {
    ///     w2.assign(&*w2 * 0.0)?;
    ///     ema.update_from(&w2, &d)?;
    ///     Ok(vec![ema.parameters()[0].tensor()])
    /// });
    /// assert_eq!(step.call(&[])?[0].to_vec::<f32>()?, vec![0.5]);
    /// decay.set(0.25);
    /// assert_eq!(step.call(&[])?[0].to_vec::<f32>()?, vec![0.125]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn update_from(&self, model: &impl Params, decay: &HostScalar) -> Result<()> {
        let location = Location::caller();
        let value = decay.get();
        check_arg((0.0..=1.0).contains(&value), "Ema::update_from", location, || {
            format!("the decay must be in [0, 1], got {value}")
        })?;
        let params = self.matching(model, "Ema::update_from", location)?;
        let Some(ctx) = &self.ctx else { return Ok(()) };
        let mut reads: Vec<(crate::DType, crate::Tensor)> = Vec::new();
        for ((_, shadow), p) in self.shadows.iter().zip(&params) {
            let dtype = shadow.dtype();
            let d = match reads.iter().find(|(t, _)| *t == dtype) {
                Some((_, d)) => d.clone(),
                None => {
                    let d = decay.tensor(ctx, dtype);
                    reads.push((dtype, d.clone()));
                    d
                }
            };
            shadow.assign(&**shadow * &d + &**p * &(1.0f64 - &d))?;
        }
        Ok(())
    }

    /// Records `param = ema` for every parameter of `model` (to evaluate
    /// or export the averaged weights).
    #[track_caller]
    pub fn copy_to(&self, model: &impl Params) -> Result<()> {
        let params = self.matching(model, "Ema::copy_to", Location::caller())?;
        for ((_, shadow), p) in self.shadows.iter().zip(&params) {
            p.assign(shadow.detach())?;
        }
        Ok(())
    }

    /// `model`'s parameters, checked against the shadows' names.
    fn matching(&self, model: &impl Params, op: &'static str, location: Location) -> Result<Vec<Variable>> {
        let params = model.parameters();
        let names: Vec<String> = params.iter().map(|p| p.name()).collect();
        let ours: Vec<&str> = self.shadows.iter().map(|(n, _)| n.as_str()).collect();
        if names != ours {
            return Err(Error::Argument {
                op,
                message: format!(
                    "the model's parameters {names:?} are not the ones the average was made from {ours:?}"
                ),
                location,
            });
        }
        Ok(params)
    }
}

impl Params for Ema {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.shadows.iter().for_each(|(_, v)| f(v))
    }
}
