//! The fields of a Hugging Face GPT-2 `config.json` that the model needs.

use crate::{Error, Result};
use std::path::Path;

/// The feed-forward activation (`activation_function` in `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`: GPT-2's own
    /// (`gelu_new`, also spelled `gelu_pytorch_tanh` and `gelu_fast`).
    GeluTanh,
    /// `x Φ(x)` with the exact normal CDF (`gelu`).
    Gelu,
    /// `max(x, 0)` (`relu`).
    Relu,
    /// `x sigmoid(x)` (`silu`, `swish`).
    Silu,
}

impl Activation {
    /// The activation of a Hugging Face name, or `None`.
    pub fn from_hf(name: &str) -> Option<Activation> {
        Some(match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            _ => return None,
        })
    }
}

/// A GPT-2 model's sizes (Hugging Face's `GPT2Config`, the fields used).
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Rows of the token embedding (and columns of the logits).
    pub vocab_size: usize,
    /// Rows of the position embedding: the longest sequence.
    pub n_positions: usize,
    /// Width of every layer.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads (`n_embd` must divide by it).
    pub n_head: usize,
    /// Width of the feed-forward layer (`n_inner`, default `4 n_embd`).
    pub n_inner: usize,
    /// Layer norm epsilon.
    pub layer_norm_epsilon: f64,
    /// The feed-forward activation.
    pub activation: Activation,
    /// Scores are divided by `√head_dim` (`scale_attn_weights`, default true).
    pub scale_attn_weights: bool,
    /// Layer `i`'s scores are also divided by `i + 1`
    /// (`scale_attn_by_inverse_layer_idx`, default false).
    pub scale_attn_by_inverse_layer_idx: bool,
}

impl Gpt2Config {
    /// GPT-2 small's sizes (124M parameters), for benchmarks with random weights.
    pub fn gpt2_small() -> Gpt2Config {
        Gpt2Config {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            n_inner: 3072,
            layer_norm_epsilon: 1e-5,
            activation: Activation::GeluTanh,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
        }
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Gpt2Config> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        Gpt2Config::from_json(&text).map_err(|e| match e {
            Error::Io(m) => Error::Io(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Parses the text of a `config.json`. Options the model does not
    /// implement are errors, never silently ignored: an untied LM head
    /// (`tie_word_embeddings: false`), `reorder_and_upcast_attn`, cross
    /// attention, an unknown activation.
    pub fn from_json(text: &str) -> Result<Gpt2Config> {
        let bad = |m: String| Error::Io(format!("GPT-2 config: {m}"));
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let int = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(serde_json::Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| bad(format!("\"{k}\" is missing or not a non-negative integer")))
        };
        let flag = |k: &str, default: bool| v.get(k).and_then(serde_json::Value::as_bool).unwrap_or(default);
        let act_name = v.get("activation_function").and_then(|a| a.as_str()).unwrap_or("gelu_new");
        let activation = Activation::from_hf(act_name).ok_or_else(|| {
            bad(format!(
                "activation_function \"{act_name}\" is not supported (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu, silu, swish are)"
            ))
        })?;
        for (key, default, why) in [
            ("tie_word_embeddings", true, "an LM head of its own (tie_word_embeddings: false)"),
            ("reorder_and_upcast_attn", false, "reorder_and_upcast_attn"),
            ("add_cross_attention", false, "cross attention (add_cross_attention)"),
        ] {
            if flag(key, default) != default {
                return Err(bad(format!("{why} is not supported")));
            }
        }
        let n_embd = int("n_embd")?;
        let n_inner = match v.get("n_inner") {
            None | Some(serde_json::Value::Null) => 4 * n_embd,
            Some(_) => int("n_inner")?,
        };
        let c = Gpt2Config {
            vocab_size: int("vocab_size")?,
            n_positions: int("n_positions")?,
            n_embd,
            n_layer: int("n_layer")?,
            n_head: int("n_head")?,
            n_inner,
            layer_norm_epsilon: v.get("layer_norm_epsilon").and_then(|e| e.as_f64()).unwrap_or(1e-5),
            activation,
            scale_attn_weights: flag("scale_attn_weights", true),
            scale_attn_by_inverse_layer_idx: flag("scale_attn_by_inverse_layer_idx", false),
        };
        if c.n_head == 0 || c.n_embd % c.n_head != 0 {
            return Err(bad(format!(
                "n_embd {} does not divide into {} attention heads",
                c.n_embd, c.n_head
            )));
        }
        Ok(c)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }
}
