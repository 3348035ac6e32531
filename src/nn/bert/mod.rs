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
//! - `Tokenizer` (feature `tokenizers`; [`crate::nn::Tokenizer`], shared
//!   with GPT-2): `tokenizer.json` through Hugging Face's own crate,
//!   batches padded to their longest sentence with an attention mask.

mod config;
mod model;
mod names;
mod pool;

/// The model folder's safetensors files ([`crate::nn::checkpoint_files`]).
pub use crate::nn::checkpoint_files;
#[cfg(feature = "tokenizers")]
pub use crate::nn::{Batch, Tokenizer};
pub use config::BertConfig;
pub use model::Bert;
pub use names::hf_name;
pub use pool::{mean_pool, normalize};
