//! BERT encoders (Devlin et al.) and sentence embeddings from pretrained
//! Hugging Face checkpoints: the first model someone else trained that
//! kiln runs (issue 20). all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads)
//! is the reference: `examples/embed.rs` and `tests/bert` compare it with
//! sentence-transformers.
//!
//! - [`BertConfig`]: the `config.json` fields the encoder needs.
//! - [`Bert`]: embeddings (word + position + token type, layer norm),
//!   then post-norm encoder layers: self-attention as one
//!   [`Tensor::scaled_dot_product_attention`] node with a key-padding
//!   mask, the projections and the feed-forward as matmuls, erf-GELU.
//!   Parameters live in kiln's own scoped names (`bert/layer0/attention/
//!   query/weight`) in the dtype the model is built in (f32, bf16, f16).
//! - [`hf_name`]: the one table from Hugging Face tensor names to those
//!   names, for [`crate::nn::load_mapped`] (f16/bf16 checkpoints convert).
//! - [`mean_pool`] and [`normalize`]: sentence-transformers' pooling.
//! - `Tokenizer` (feature `tokenizers`): `tokenizer.json` through Hugging
//!   Face's own crate, batches padded to their longest sentence with an
//!   attention mask.

mod config;
mod model;
mod names;
mod pool;
#[cfg(feature = "tokenizers")]
mod tokenizer;

pub use config::BertConfig;
pub use model::Bert;
pub use names::hf_name;
pub use pool::{mean_pool, normalize};
#[cfg(feature = "tokenizers")]
pub use tokenizer::{Batch, Tokenizer};

use crate::Tensor;
use std::path::{Path, PathBuf};

/// The safetensors files of the checkpoint in a model folder:
/// `model.safetensors`, or else every `model-*.safetensors` (a sharded
/// checkpoint, or one split into parts to travel), in name order.
pub fn checkpoint_files(dir: &Path) -> crate::Result<Vec<PathBuf>> {
    let whole = dir.join("model.safetensors");
    if whole.exists() {
        return Ok(vec![whole]);
    }
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| crate::Error::Io(format!("cannot read {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model-") && n.ends_with(".safetensors"))
        })
        .collect();
    parts.sort();
    if parts.is_empty() {
        return Err(crate::Error::Io(format!(
            "{} has no model.safetensors (nor model-*.safetensors parts)",
            dir.display()
        )));
    }
    Ok(parts)
}
