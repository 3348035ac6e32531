//! Text generation: a batch of prompts continued token by token, each
//! token chosen on the device by [`crate::nn::sampling::sample`].
//!
//! [`Gpt2::generate`] runs with a KV cache ([`super::Generator`]: a
//! prefill, then one captured decode step per token). This file holds the
//! options, the checks every path shares, and [`Gpt2::generate_uncached`],
//! the path without a cache that the cached one is tested against:
//!
//! **One plan per call.** Every step runs the whole forward pass over a
//! window of fixed width: the longest prompt plus `max_new_tokens`,
//! rounded up to a power of two (at most `n_positions`). Prompts are
//! left-padded to the longest (padding removed from attention by a key
//! mask, positions counted over the real tokens, as Hugging Face's
//! `generate` does), the tokens not generated yet sit to the right,
//! where the causal mask hides them from every position that is read,
//! and the logits are taken at the last filled column through a runtime
//! index. Only the ids (uploaded) and that index change between steps,
//! so the steps of a call share one compiled plan.
//!
//! Per step the host reads only the chosen ids (`[batch]` i64), to stop
//! rows at a stop token and to place the ids in the next window.

use super::model::{Attend, Positions};
use super::Gpt2;
use crate::attention::key_padding_mask;
use crate::nn::check_arg;
use crate::nn::sampling::{sample, Sampling};
use crate::{Error, Location, Result};

/// What [`Gpt2::generate`] does.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to generate per prompt at most (fewer when a stop token comes).
    pub max_new_tokens: usize,
    /// How each token is chosen (greedy by default).
    pub sampling: Sampling,
    /// Tokens that end a prompt's continuation; the stop token is the
    /// last one returned. Empty: always `max_new_tokens`.
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateOptions {
    /// 20 greedy tokens (Hugging Face's default length), no stop token.
    fn default() -> GenerateOptions {
        GenerateOptions { max_new_tokens: 20, sampling: Sampling::greedy(), stop_tokens: Vec::new() }
    }
}

impl GenerateOptions {
    /// `max_new_tokens` greedy tokens, no stop token.
    pub fn greedy(max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions { max_new_tokens, ..GenerateOptions::default() }
    }

    /// `max_new_tokens` tokens drawn as `sampling` says, no stop token.
    pub fn sampled(max_new_tokens: usize, sampling: Sampling) -> GenerateOptions {
        GenerateOptions { max_new_tokens, sampling, stop_tokens: Vec::new() }
    }

    /// The same, ending a continuation at any of `tokens`.
    pub fn with_stop_tokens(self, tokens: &[u32]) -> GenerateOptions {
        GenerateOptions { stop_tokens: tokens.to_vec(), ..self }
    }
}

impl Gpt2 {
    /// The continuation of each prompt (token ids; the prompt not
    /// included): up to `max_new_tokens` tokens, ending early at a stop
    /// token (included). Prompts of different lengths run as one batch.
    ///
    /// Errors ([`Error::Argument`], naming the lengths): no prompts, an
    /// empty prompt, a prompt or a prompt plus `max_new_tokens` longer
    /// than the model's `n_positions`, a token id outside the vocabulary,
    /// sampling numbers out of range.
    ///
    /// It runs with a KV cache ([`Gpt2::generator`], sized for the call:
    /// the longest prompt's bucket plus `max_new_tokens`, rounded up to a
    /// power of two, so that calls of nearby sizes share its variables
    /// and plans); keep a [`super::Generator`] to reuse one explicitly.
    ///
    /// Sampling draws from the context's random numbers: the same seed
    /// ([`crate::Context::with_seed`]) and the same program give the same
    /// tokens.
    #[track_caller]
    pub fn generate<P: AsRef<[u32]>>(
        &self,
        prompts: &[P],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        let location = Location::caller();
        let op = "Gpt2::generate";
        let width = self.check_request(prompts, options, op, location)?;
        let need = width + options.max_new_tokens;
        let sized = (super::decode::bucket(width, usize::MAX) + options.max_new_tokens).next_power_of_two();
        let max_len = sized.min(self.config().n_positions).max(need);
        self.generator(prompts.len(), max_len)?.generate_at(prompts, options, op, location)
    }

    /// [`Gpt2::generate`] without a cache: each step recomputes a window
    /// of fixed width (see the module docs). The same tokens, at the cost
    /// of a full forward pass per token: the reference the cached path is
    /// tested against.
    #[track_caller]
    pub fn generate_uncached<P: AsRef<[u32]>>(
        &self,
        prompts: &[P],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        let location = Location::caller();
        let width = self.check_request(prompts, options, "Gpt2::generate_uncached", location)?;
        let c = self.config();
        let (n_pos, new) = (c.n_positions, options.max_new_tokens);
        let b = prompts.len();
        let mut out = vec![Vec::with_capacity(new); b];
        if new == 0 {
            return Ok(out);
        }
        let _span = tracing::info_span!("Gpt2::generate", batch = b, prompt = width, new).entered();
        let ctx = self.context();
        // The window: the prompts, left-padded, then room for the new tokens.
        let len = (width + new).next_power_of_two().min(n_pos);
        let mut ids = vec![0i64; b * len];
        let mut positions = vec![0i64; b * len];
        let mut real = vec![true; b * len];
        for (r, p) in prompts.iter().enumerate() {
            let p = p.as_ref();
            let pad = width - p.len();
            for col in 0..len {
                let k = r * len + col;
                if col < pad {
                    real[k] = false;
                } else {
                    positions[k] = (col - pad) as i64;
                    if let Some(&t) = p.get(col - pad) {
                        ids[k] = t as i64;
                    }
                }
            }
        }
        let padded = real.iter().any(|r| !r);
        let positions = ctx.tensor(&positions, [b, len]);
        let attend =
            Attend { causal: true, mask: padded.then(|| key_padding_mask(&ctx.tensor(&real, [b, len]))) };
        let mut done = vec![false; b];
        for col in width..width + new {
            let window = ctx.tensor(&ids, [b, len]);
            let last = ctx.tensor(&[(col - 1) as i64], [1]);
            let h = self.hidden(&window, Positions::Given(&positions), &attend, &mut |_, kv| Ok(kv))?;
            let logits = self.lm_head(&h.index_select(1, &last).reshape([b, c.n_embd]))?;
            let next = sample(&logits, &options.sampling)?.to_vec::<i64>()?;
            for (r, &t) in next.iter().enumerate() {
                ids[r * len + col] = t;
                if !done[r] {
                    let t = t as u32;
                    out[r].push(t);
                    done[r] = options.stop_tokens.contains(&t);
                }
            }
            if done.iter().all(|&d| d) {
                break;
            }
        }
        Ok(out)
    }

    /// Checks a generation request: sampling settings, at least one
    /// prompt, none empty, none longer than the model's positions (with
    /// the new tokens), every token in the vocabulary. Returns the longest
    /// prompt's length.
    pub(super) fn check_request<P: AsRef<[u32]>>(
        &self,
        prompts: &[P],
        options: &GenerateOptions,
        op: &'static str,
        location: Location,
    ) -> Result<usize> {
        let c = self.config();
        let (n_pos, vocab) = (c.n_positions, c.vocab_size);
        options.sampling.check(op, location)?;
        check_arg(!prompts.is_empty(), op, location, || "no prompts to continue".into())?;
        for (i, p) in prompts.iter().enumerate() {
            let p = p.as_ref();
            check_arg(!p.is_empty(), op, location, || {
                format!(
                    "prompt {i} is empty (0 tokens); a continuation needs at least 1 token to start from (Hugging Face starts from <|endoftext|>)"
                )
            })?;
            check_arg(p.len() <= n_pos, op, location, || {
                format!("prompt {i} has {} tokens, more than the model's {n_pos} positions", p.len())
            })?;
            if let Some(&bad) = p.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::Argument {
                    op,
                    message: format!("prompt {i} holds token {bad}, outside the vocabulary of {vocab}"),
                    location,
                });
            }
        }
        let width = prompts.iter().map(|p| p.as_ref().len()).max().unwrap_or(0);
        let new = options.max_new_tokens;
        check_arg(width + new <= n_pos, op, location, || {
            format!(
                "{width} prompt tokens plus {new} new ones are {} positions, more than the model's {n_pos}; ask for at most {} new tokens",
                width + new,
                n_pos - width
            )
        })?;
        Ok(width)
    }
}
