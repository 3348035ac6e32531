//! The fields of a Hugging Face `config.json` that a BERT encoder needs.

use crate::{Error, Result};
use std::path::Path;

/// A BERT encoder's sizes (Hugging Face's `BertConfig`, the fields used).
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Rows of the word embedding.
    pub vocab_size: usize,
    /// Width of every layer.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads (`hidden_size` must divide by it).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Rows of the position embedding (the longest input).
    pub max_position_embeddings: usize,
    /// Rows of the token-type embedding.
    pub type_vocab_size: usize,
    /// Layer norm epsilon.
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// all-MiniLM-L6-v2's sizes (for benchmarks with random weights).
    pub fn minilm_l6() -> BertConfig {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 384,
            num_hidden_layers: 6,
            num_attention_heads: 12,
            intermediate_size: 1536,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
        }
    }

    /// BERT-base's sizes (12 layers, 768 wide, 12 heads).
    pub fn base() -> BertConfig {
        BertConfig {
            hidden_size: 768,
            num_hidden_layers: 12,
            intermediate_size: 3072,
            ..BertConfig::minilm_l6()
        }
    }

    /// Reads a Hugging Face `config.json`. Its activation must be `gelu`
    /// (the erf form, which is what BERT checkpoints use).
    pub fn from_file(path: impl AsRef<Path>) -> Result<BertConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        BertConfig::from_json(&text).map_err(|e| match e {
            Error::Io(m) => Error::Io(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Parses the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<BertConfig> {
        let bad = |m: String| Error::Io(format!("BERT config: {m}"));
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let int = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(serde_json::Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| bad(format!("\"{k}\" is missing or not a non-negative integer")))
        };
        if let Some(act) = v.get("hidden_act").and_then(|a| a.as_str()) {
            if act != "gelu" {
                return Err(bad(format!(
                    "hidden_act \"{act}\" is not supported (kiln's BERT uses erf-GELU, \"gelu\")"
                )));
            }
        }
        let c = BertConfig {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size").unwrap_or(2),
            layer_norm_eps: v.get("layer_norm_eps").and_then(|e| e.as_f64()).unwrap_or(1e-12),
        };
        if c.num_attention_heads == 0 || c.hidden_size % c.num_attention_heads != 0 {
            return Err(bad(format!(
                "hidden_size {} does not divide into {} attention heads",
                c.hidden_size, c.num_attention_heads
            )));
        }
        Ok(c)
    }
}
