//! Choosing the next token from logits, on the device: greedy, or a
//! sample with temperature, top-k and top-p (nucleus) filtering. Only
//! the chosen ids leave the device; nothing is sorted.
//!
//! - **Greedy** (temperature 0): `argmax` over the vocabulary, the first
//!   of equal maxima (PyTorch's and Hugging Face's choice).
//! - **Temperature** divides the logits (a runtime scalar: a new value
//!   compiles nothing new).
//! - **Top-k** keeps every logit `>=` the k-th largest: exactly the `k`
//!   most likely tokens, and all of those tied with the k-th (Hugging
//!   Face's `TopKLogitsWarper` keeps ties the same way). `k >= vocab`
//!   keeps everything, untouched.
//! - **Top-p** keeps a token when the probability of the tokens strictly
//!   more likely than it is below `p`: the smallest most-likely-first set
//!   whose mass reaches `p` (Hugging Face's `TopPLogitsWarper`), with all
//!   tokens tied with the last one. `p = 1` keeps everything, untouched.
//!   It applies after top-k, to the probabilities top-k left, as Hugging
//!   Face orders them.
//! - **Sampling** is the Gumbel-max trick: `argmax(z + g)` with
//!   `g = -log(-log(u))`, `u` uniform, which draws index `i` with
//!   probability `softmax(z)_i`. Removed tokens are `-inf` and never drawn.
//!
//! **Reproducible.** `u` comes from the context's random numbers
//! (Philox keyed by [`crate::Context::with_seed`] and a stream per random
//! node), so the same program with the same seed draws the same tokens,
//! on every backend; a different seed draws others.
//!
//! **Thresholds without sorting.** Both filters need, per row, the
//! largest logit value `τ` whose mass `F(τ) = Σ_{z >= τ} w` reaches a
//! target (`w = 1` and target `k` for top-k; `w` the probabilities and
//! target `p` for top-p); then `z >= τ` is the kept set. `F` is
//! non-increasing, so a vectorized search finds `τ`: the interval
//! `[min, max]` of the row holds `τ`; each of 8 rounds compares the row
//! with 7 evenly spaced candidates at once (`[batch, 7, vocab]`), sums
//! `w` above each, and keeps the sub-interval where `F` crosses the
//! target (the interval shrinks 8× a round, 2²⁴× in all). Then the 4
//! largest distinct logits of the interval are peeled off one by one and
//! `τ` is the largest of them whose mass reaches the target. This is
//! exact (ties included) whenever at most 4 distinct logit values lie in
//! the final interval above `τ`, that is, unless more than 4 distinct
//! logits sit within `(max - min) / 2²⁴` of each other at the boundary;
//! then it keeps a few more tokens than asked, never fewer. Cost per
//! filter: 60 compare-and-sum passes over `[batch, vocab]`.

use super::{check_arg, runtime_scalar};
use crate::{DType, Error, Location, Result, Tensor};

/// How the next token is chosen (Hugging Face's `do_sample`,
/// `temperature`, `top_k`, `top_p`).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 is greedy (`argmax`, the filters are not used); above 0 samples
    /// from `softmax(logits / temperature)` after the filters.
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (and ties); `None` keeps all.
    pub top_k: Option<usize>,
    /// Keep only the most likely tokens whose mass reaches `p`, in
    /// `(0, 1]`; `None` (or 1) keeps all.
    pub top_p: Option<f64>,
}

impl Default for Sampling {
    /// Greedy.
    fn default() -> Sampling {
        Sampling::greedy()
    }
}

impl Sampling {
    /// The most likely token every time.
    pub fn greedy() -> Sampling {
        Sampling { temperature: 0.0, top_k: None, top_p: None }
    }

    /// Samples from `softmax(logits / temperature)`, unfiltered.
    pub fn temperature(temperature: f64) -> Sampling {
        Sampling { temperature, top_k: None, top_p: None }
    }

    /// The same, keeping only the `k` most likely tokens.
    pub fn with_top_k(self, k: usize) -> Sampling {
        Sampling { top_k: Some(k), ..self }
    }

    /// The same, keeping only the most likely tokens whose mass reaches `p`.
    pub fn with_top_p(self, p: f64) -> Sampling {
        Sampling { top_p: Some(p), ..self }
    }

    /// An error unless the numbers are in range.
    pub(crate) fn check(&self, op: &'static str, location: Location) -> Result<()> {
        let t = self.temperature;
        check_arg(t.is_finite() && t >= 0.0, op, location, || {
            format!("the temperature must be finite and >= 0 (0 is greedy), got {t}")
        })?;
        if let Some(k) = self.top_k {
            check_arg(k >= 1, op, location, || "top_k must be at least 1, got 0".into())?;
        }
        if let Some(p) = self.top_p {
            check_arg(p > 0.0 && p <= 1.0, op, location, || format!("top_p must be in (0, 1], got {p}"))?;
        }
        Ok(())
    }
}

/// One token id per row of `logits` `[batch, vocab]` (any float dtype),
/// chosen as `sampling` says: i64 `[batch]`, computed on the device.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::nn::sampling::{sample, Sampling};
/// let ctx = Context::cpu().with_seed(3);
/// let logits = ctx.tensor(&[0.0f32, 5.0, 1.0, 5.0, 2.0, 0.0], [2, 3]);
/// assert_eq!(sample(&logits, &Sampling::greedy())?.to_vec::<i64>()?, [1, 0]);
/// // Top-k 1 keeps only the largest logit of each row.
/// let one = Sampling::temperature(1.0).with_top_k(1);
/// assert_eq!(sample(&logits, &one)?.to_vec::<i64>()?, [1, 0]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn sample(logits: &Tensor, sampling: &Sampling) -> Result<Tensor> {
    let location = Location::caller();
    let op = "nn::sampling::sample";
    let ctx = check_logits(logits, op, location)?;
    sampling.check(op, location)?;
    let _span = tracing::info_span!("sample", temperature = sampling.temperature).entered();
    if sampling.temperature == 0.0 {
        return Ok(logits.argmax(1, false));
    }
    let z = logits.cast(DType::F32) / runtime_scalar(ctx, sampling.temperature, DType::F32);
    let z = match sampling.top_k {
        Some(k) => top_k_filter(&z, k)?,
        None => z,
    };
    let z = match sampling.top_p {
        Some(p) => top_p_filter(&z, p)?,
        None => z,
    };
    let u = ctx.rand(z.shape().to_vec());
    let gumbel = -(-u.log()).log();
    Ok((z + gumbel).argmax(1, false))
}

/// `logits` `[batch, vocab]` with every value below the row's k-th
/// largest set to `-inf` (see the module docs for ties and the method).
/// `k >= vocab` returns the logits as they are.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::nn::sampling::top_k_filter;
/// let ctx = Context::cpu();
/// let logits = ctx.tensor(&[1.0f32, 4.0, 3.0, 4.0, 0.0], [1, 5]);
/// let kept = top_k_filter(&logits, 3)?.to_vec::<f32>()?;
/// assert_eq!(kept, [f32::NEG_INFINITY, 4.0, 3.0, 4.0, f32::NEG_INFINITY]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn top_k_filter(logits: &Tensor, k: usize) -> Result<Tensor> {
    let location = Location::caller();
    let op = "nn::sampling::top_k_filter";
    let ctx = check_logits(logits, op, location)?;
    check_arg(k >= 1, op, location, || "top_k must be at least 1, got 0".into())?;
    if k >= logits.shape()[1] {
        return Ok(logits.clone());
    }
    let z = logits.cast(DType::F32);
    let tau = threshold(&z, None, &runtime_scalar(ctx, k as f64, DType::F32));
    Ok(z.ge(&tau).where_cond(logits, f32::NEG_INFINITY))
}

/// `logits` `[batch, vocab]` with every token outside the row's nucleus
/// set to `-inf`: a token stays when the probability (`softmax` of the
/// row) of the tokens strictly more likely than it is below `p` (see the
/// module docs). `p` is in `(0, 1]`; 1 returns the logits as they are.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::nn::sampling::top_p_filter;
/// let ctx = Context::cpu();
/// // Probabilities 0.5, 0.3, 0.2: the first two reach 0.7.
/// let logits = ctx.tensor(&[0.5f32.ln(), 0.2f32.ln(), 0.3f32.ln()], [1, 3]);
/// let kept = top_p_filter(&logits, 0.7)?.to_vec::<f32>()?;
/// assert_eq!(kept, [0.5f32.ln(), f32::NEG_INFINITY, 0.3f32.ln()]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn top_p_filter(logits: &Tensor, p: f64) -> Result<Tensor> {
    let location = Location::caller();
    let op = "nn::sampling::top_p_filter";
    let ctx = check_logits(logits, op, location)?;
    check_arg(p > 0.0 && p <= 1.0, op, location, || format!("top_p must be in (0, 1], got {p}"))?;
    if p == 1.0 {
        return Ok(logits.clone());
    }
    let z = logits.cast(DType::F32);
    let probs = z.softmax(1);
    let tau = threshold(&z, Some(&probs), &runtime_scalar(ctx, p, DType::F32));
    Ok(z.ge(&tau).where_cond(logits, f32::NEG_INFINITY))
}

/// The context of float `[batch, vocab]` logits, or the error.
fn check_logits<'a>(logits: &'a Tensor, op: &'static str, location: Location) -> Result<&'a crate::Context> {
    if let Some(e) = logits.error() {
        return Err(e.clone());
    }
    if logits.rank() != 2 || logits.shape()[1] == 0 || !logits.dtype().is_float() {
        return Err(Error::Shape {
            op,
            message: format!(
                "logits are a float [batch, vocab] tensor with vocab >= 1, got {} {:?}",
                logits.dtype(),
                logits.shape()
            ),
            location,
        });
    }
    logits.context().ok_or_else(|| Error::Device { message: "the logits have no context".into(), location })
}

/// Interior candidates per round of the search (the interval shrinks by
/// one more than this each round).
const CANDIDATES: usize = 7;
/// Rounds of the search: 8 rounds of 8× shrink 2²⁴× in all.
const ROUNDS: usize = 8;
/// Distinct values peeled off the top of the final interval.
const PEELS: usize = 4;

/// Per row of `z` `[batch, vocab]` (f32, finite or `-inf`): the largest
/// value `τ` of the row with `Σ_{z >= τ} weight >= target` (`weight`
/// `None` counts), `[batch, 1]`. See the module docs.
fn threshold(z: &Tensor, weight: Option<&Tensor>, target: &Tensor) -> Tensor {
    const INF: f32 = f32::INFINITY;
    // The mass at or above each candidate `t` `[batch, n]`, `[batch, n]`.
    let mass = |t: &Tensor| -> Tensor {
        let above = z.unsqueeze(1).ge(t.unsqueeze(2));
        match weight {
            Some(w) => above.where_cond(w.unsqueeze(1), 0.0f32).sum(&[2], false),
            None => above.cast(DType::F32).sum(&[2], false),
        }
    };
    let Some(ctx) = z.context() else { return z.clone() };
    // τ is in [lo, hi]: the row's smallest finite value (whose mass is all
    // of it) and its largest.
    let mut lo = z.gt(-INF).where_cond(z, INF).min(&[1], true);
    let mut hi = z.max(&[1], true);
    let steps = ctx.arange(1.0f32, (CANDIDATES + 1) as f32, 1.0) / (CANDIDATES + 1) as f32;
    for _ in 0..ROUNDS {
        let t = &lo + (&hi - &lo) * &steps;
        let reaches = mass(&t).ge(target);
        // A candidate whose mass reaches the target is <= τ; one whose
        // mass falls short is > τ.
        lo = lo.maximum(reaches.where_cond(&t, -INF).max(&[1], true));
        hi = hi.minimum(reaches.where_cond(INF, &t).min(&[1], true));
    }
    // The largest values of the row at or below `hi`, one by one.
    let mut last = z.le(&hi).where_cond(z, -INF).max(&[1], true);
    let mut peeled = Vec::with_capacity(PEELS);
    for _ in 1..PEELS {
        let next = z.lt(&last).where_cond(z, -INF).max(&[1], true);
        peeled.push(std::mem::replace(&mut last, next));
    }
    peeled.push(last);
    let peeled = Tensor::cat(&peeled.iter().collect::<Vec<_>>(), 1);
    let reaches = mass(&peeled).ge(target);
    reaches.where_cond(&peeled, -INF).max(&[1], true).maximum(&lo)
}
