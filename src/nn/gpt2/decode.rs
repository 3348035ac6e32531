//! Generation with a KV cache: a prefill of the (left-padded) prompts,
//! then one captured decode step per token.
//!
//! - **The cache** is an [`crate::nn::KvCache`] of `[batch, heads,
//!   max_len, head_dim]` per layer. Its variables are named by their
//!   sizes (`<model>/kv_cache/b{batch}_len{max_len}`), so a second
//!   [`Generator`] of the same sizes on one context reuses them.
//! - **Prefill** runs the prompts as one plan: each row left-padded to a
//!   *bucket* (the longest prompt rounded up to a power of two, at least
//!   8), so prompts of any length compile one plan per bucket (at most
//!   8 for GPT-2's 1024 positions), not one per length. The mask hides
//!   the padding; the padding's own keys are written into the cache and
//!   never seen.
//! - **Decode** is a captured step ([`crate::Context::capture`]) of the
//!   token ids `[batch, 1]`, the cache index and the rows' starts: it
//!   writes the new keys and values at that index
//!   ([`crate::Variable::write_at`]), attends over the cache under the
//!   mask, and samples the next ids on the device. The index is an
//!   argument, so one recorded plan (one CUDA graph) serves every
//!   position; the ids it returns are the next call's argument, so they
//!   never leave the device except to be reported.
//!
//! The host reads each step's ids (`[batch]` i64, to stop rows at a stop
//! token and return them) one step behind the device: the step after a
//! token is queued before that token is read, so the device never waits
//! for the host's round trip (20-50 µs a token on an H100, a tenth of a
//! GPT-2 small step). When every row has stopped, that one queued step
//! is wasted; what it wrote into the cache lies past the positions any
//! later step reads before writing them. Sampling settings are part of
//! the recorded step: a generator keeps one decode step per [`Sampling`]
//! it has seen.

use super::model::{Attend, KeyValues, Positions};
use super::{GenerateOptions, Gpt2};
use crate::capture::Captured;
use crate::nn::sampling::{sample, Sampling};
use crate::nn::{check_arg, KvCache};
use crate::{Location, Result, Tensor};
use std::sync::Arc;

/// The smallest prefill bucket.
const MIN_BUCKET: usize = 8;

/// A decode step's closure.
type StepBody<'m> = Box<dyn FnMut(&[Tensor]) -> Result<Vec<Tensor>> + 'm>;
type Step<'m> = Captured<StepBody<'m>>;

/// A GPT-2 decoder with a KV cache for up to `batch` prompts and
/// `max_len` positions (prompt bucket plus new tokens): see the module
/// docs. Made by [`Gpt2::generator`].
pub struct Generator<'m> {
    model: &'m Gpt2,
    cache: Arc<KvCache>,
    steps: Vec<(Sampling, Step<'m>)>,
    /// The captured prefills (and their first sample), by sampling.
    prefills: Vec<(Sampling, Step<'m>)>,
}

impl Gpt2 {
    /// A generator with a KV cache of `batch` rows and `max_len`
    /// positions (at most the model's `n_positions`).
    #[track_caller]
    pub fn generator(&self, batch: usize, max_len: usize) -> Result<Generator<'_>> {
        let location = Location::caller();
        let op = "Gpt2::generator";
        let c = self.config();
        check_arg(batch > 0, op, location, || "a generator needs a batch of at least 1 row".into())?;
        check_arg(max_len > 0 && max_len <= c.n_positions, op, location, || {
            format!(
                "a cache of {max_len} positions; the model has {} (at most that, at least 1)",
                c.n_positions
            )
        })?;
        let ctx = self.context();
        let cache = ctx.scope(self.name(), |ctx| {
            ctx.scope("kv_cache", |ctx| {
                KvCache::new(
                    ctx,
                    &format!("b{batch}_len{max_len}"),
                    c.n_layer,
                    batch,
                    c.n_head,
                    max_len,
                    c.head_dim(),
                    self.dtype(),
                )
            })
        })?;
        Ok(Generator { model: self, cache: Arc::new(cache), steps: Vec::new(), prefills: Vec::new() })
    }
}

impl<'m> Generator<'m> {
    /// Rows of its cache.
    pub fn batch(&self) -> usize {
        self.cache.batch()
    }

    /// Positions of its cache.
    pub fn max_len(&self) -> usize {
        self.cache.max_len()
    }

    /// The continuation of each prompt (at most [`Generator::batch`] of
    /// them), as [`Gpt2::generate`] describes, computed with the cache.
    /// The longest prompt plus `max_new_tokens` must fit the cache
    /// ([`Generator::max_len`]): an error names the lengths otherwise.
    #[track_caller]
    pub fn generate<P: AsRef<[u32]>>(
        &mut self,
        prompts: &[P],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        self.generate_at(prompts, options, "Generator::generate", Location::caller())
    }

    pub(super) fn generate_at<P: AsRef<[u32]>>(
        &mut self,
        prompts: &[P],
        options: &GenerateOptions,
        op: &'static str,
        location: Location,
    ) -> Result<Vec<Vec<u32>>> {
        let model = self.model;
        let width = model.check_request(prompts, options, op, location)?;
        let (rows, batch) = (prompts.len(), self.batch());
        check_arg(rows <= batch, op, location, || {
            format!("{rows} prompts for a generator of {batch} rows; make one with a larger batch")
        })?;
        let (new, max_len) = (options.max_new_tokens, self.max_len());
        check_arg(width + new <= max_len, op, location, || {
            format!(
                "the longest prompt has {width} tokens and {new} new tokens are asked for: {} positions, more than the cache's {max_len}",
                width + new
            )
        })?;
        let bucket = bucket(width, max_len - new);
        let mut out = vec![Vec::with_capacity(new); rows];
        if new == 0 {
            return Ok(out);
        }
        let _span = tracing::info_span!("Generator::generate", rows, prompt = width, bucket, new).entered();
        let ctx = model.context();
        // Left-padded prompts; rows past the prompts are padding only.
        let mut ids = vec![0i64; batch * bucket];
        let mut starts = vec![bucket as i64; batch];
        for (r, p) in prompts.iter().enumerate() {
            let p = p.as_ref();
            starts[r] = (bucket - p.len()) as i64;
            for (k, &t) in p.iter().enumerate() {
                ids[r * bucket + bucket - p.len() + k] = t as i64;
            }
        }
        // A row of padding only attends to its last key, so it stays finite.
        for s in starts.iter_mut().skip(rows) {
            *s = bucket as i64 - 1;
        }
        let starts = ctx.tensor(&starts, [batch]);
        let ids = ctx.tensor(&ids, [batch, bucket]);
        let mut next = if bucket.is_power_of_two() {
            self.prefill_step(&options.sampling).call(&[&ids, &starts])?.remove(0)
        } else {
            let next = sample(&prefill(model, &self.cache, &ids, &starts)?, &options.sampling)?;
            // Launched on its own now, as reading it would: the first
            // step's call would otherwise realize the prefill with its
            // arguments, a plan of its own (1000 prompts of lengths 1-512
            // compiled 16 plans instead of 9).
            next.realize()?;
            next
        };
        let step = self.step(&options.sampling);
        let mut done = vec![false; rows];
        for t in 0..new {
            // The step after token `t` is queued before the host reads
            // token `t`: its argument is already on the device, so the
            // device goes on while the ids come back (see the module docs).
            let after = match t + 1 < new {
                true => Some(step.call(&[&next, &ctx.scalar((bucket + t) as i64), &starts])?.remove(0)),
                false => None,
            };
            let ids = next.to_vec::<i64>()?;
            for (r, &id) in ids.iter().take(rows).enumerate() {
                if !done[r] {
                    let id = id as u32;
                    out[r].push(id);
                    done[r] = options.stop_tokens.contains(&id);
                }
            }
            match after {
                Some(after) if !done.iter().all(|&d| d) => next = after,
                _ => break,
            }
        }
        Ok(out)
    }

    /// The prefill of `sampling` and its first sample, a captured step of
    /// the prompts `[batch, bucket]` and the rows' starts, recorded once
    /// per bucket: a prefill recorded each call cost the host about a
    /// millisecond on GPT-2 small (its 400-odd ops recorded, keyed and
    /// bound every call), as much as the device's work for a short prompt.
    /// Only power-of-two buckets come here: at most 8 of them for 1024
    /// positions, within the captured step's cap; the others (a bucket
    /// cut to the room left in the cache) run uncaptured.
    fn prefill_step(&mut self, sampling: &Sampling) -> &mut Step<'m> {
        let (model, cache) = (self.model, self.cache.clone());
        step_for(&mut self.prefills, sampling, |sampling| {
            let f: StepBody<'m> = Box::new(move |args: &[Tensor]| {
                Ok(vec![sample(&prefill(model, &cache, &args[0], &args[1])?, &sampling)?])
            });
            let cap = model.config().n_positions.max(MIN_BUCKET).ilog2() as usize + 1;
            model.context().capture(f).with_cap(cap)
        })
    }

    /// The decode step of `sampling`, recorded on its first call.
    fn step(&mut self, sampling: &Sampling) -> &mut Step<'m> {
        let (model, cache) = (self.model, self.cache.clone());
        step_for(&mut self.steps, sampling, |sampling| {
            let f: StepBody<'m> = Box::new(move |args: &[Tensor]| {
                let ids = args[0].reshape([cache.batch(), 1]);
                let logits = logits_after(model, &cache, &ids, &args[1], &args[2])?;
                Ok(vec![sample(&logits, &sampling)?])
            });
            model.context().capture(f)
        })
    }
}

/// The step of `sampling` in `steps`, made by `make` (given its own copy
/// of the settings) the first time.
fn step_for<'a, 'm>(
    steps: &'a mut Vec<(Sampling, Step<'m>)>,
    sampling: &Sampling,
    make: impl FnOnce(Sampling) -> Step<'m>,
) -> &'a mut Step<'m> {
    let k = match steps.iter().position(|(s, _)| s == sampling) {
        Some(k) => k,
        None => {
            steps.push((sampling.clone(), make(sampling.clone())));
            steps.len() - 1
        }
    };
    &mut steps[k].1
}

/// The logits `[batch, vocab]` at the last column of the prompts
/// `[batch, bucket]`, with their keys and values written at 0.
///
/// The prompts attend over their own keys and values (the cache's
/// first `bucket` positions, which they are also written to), causal
/// and with the left padding masked, not over the whole cache under
/// the decode step's mask: a 512-token prompt in a 1024-position cache
/// then computes a quarter of the scores (half the keys, and the
/// kernel skips the blocks above the diagonal). On an H100 in f32 the
/// whole-cache form spent 6.4 of a 12.8 ms prefill in attention.
fn prefill(model: &Gpt2, cache: &KvCache, ids: &Tensor, starts: &Tensor) -> Result<Tensor> {
    let ctx = model.context();
    let (b, s) = (ids.shape()[0], ids.shape()[1]);
    let zero = ctx.scalar(0i64);
    let positions = cache.positions(&zero, s, starts);
    let keys = ctx.arange(0i64, s as i64, 1).reshape([1, s]);
    let real = keys.ge(starts.reshape([b, 1])).reshape([b, 1, 1, s]);
    let attend = Attend { causal: true, mask: Some(real) };
    let h = model.hidden(ids, Positions::Given(&positions), &attend, &mut |layer, kv: KeyValues| {
        cache.append_stacked(layer, &zero, &kv.both())?;
        Ok(kv)
    })?;
    let last = h.narrow(1, s - 1, 1).reshape([b, model.config().n_embd]);
    model.lm_head(&last)
}

/// The logits `[batch, vocab]` of the decode step's `ids` (`[batch, 1]`),
/// written into the cache at index `at` (0-d i64), each row's sequence
/// starting at `starts[row]`, attending over the whole cache.
fn logits_after(model: &Gpt2, cache: &KvCache, ids: &Tensor, at: &Tensor, starts: &Tensor) -> Result<Tensor> {
    let (b, s) = (ids.shape()[0], ids.shape()[1]);
    let positions = cache.positions(at, s, starts);
    let attend = Attend { causal: false, mask: Some(cache.visible(at, s, starts)) };
    let h = model.hidden(ids, Positions::Given(&positions), &attend, &mut |layer, kv: KeyValues| {
        let (keys, values) = cache.append_stacked(layer, at, &kv.both())?;
        Ok(KeyValues::new(keys, values))
    })?;
    let last = h.narrow(1, s - 1, 1).reshape([b, model.config().n_embd]);
    model.lm_head(&last)
}

/// The prefill length of prompts up to `width` tokens, leaving `room`
/// positions at most: a power of two of at least [`MIN_BUCKET`], unless
/// that does not fit `room` (then `room`, or `width` itself when even
/// `room` is shorter: the caller checked that `width` fits).
pub(super) fn bucket(width: usize, room: usize) -> usize {
    width.next_power_of_two().max(MIN_BUCKET).min(room).max(width)
}
