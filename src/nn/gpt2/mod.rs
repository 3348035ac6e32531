//! GPT-2 (Radford et al.) from Hugging Face `GPT2LMHeadModel` checkpoints,
//! and text generation with it (issue 34). The tests compare it with
//! `transformers` itself on a checkpoint `transformers` wrote
//! (`tests/fixtures/gpt2-tiny`, from `tests/nn/gpt2_fixture.py`): logits
//! within 1e-4 in f32 and 64 identical greedy tokens. No pretrained
//! weights can be downloaded where kiln is built, so the loader is tested
//! on that random-weight checkpoint; a real `gpt2` folder loads the same way.
//!
//! - [`Gpt2Config`]: the `config.json` fields the model needs (the
//!   `gelu_new` tanh activation is GPT-2's; options it does not implement
//!   are errors).
//! - [`Gpt2`]: token + position embeddings, pre-norm blocks whose
//!   attention is one [`crate::Tensor::scaled_dot_product_attention`]
//!   node (causal, with a key-padding mask for left-padded batches), the
//!   Conv1D projections as `x Wᵀ + b` (`W` held `[out, in]`), a final layer norm, and logits
//!   `h · wteᵀ` (the LM head is tied to the token embedding). Parameters
//!   live in kiln's own scoped names (`gpt2/layer0/attention/qkv/weight`)
//!   in the dtype the model is built in.
//! - [`hf_name`]: the one table from Hugging Face tensor names to those
//!   names (and which load transposed), for [`crate::nn::load_mapped`]; [`Gpt2::from_pretrained`]
//!   reads a model folder with it.
//! - [`Gpt2::generate`]: greedy or sampled continuations of a batch of
//!   prompts ([`crate::nn::sampling`]: temperature, top-k, top-p, chosen
//!   on the device and seeded by the context), stop tokens, a maximum
//!   length. Each step recomputes a fixed-width window (one compiled plan
//!   per call); a KV cache will replace that ([`KeyValues`] and
//!   [`Gpt2::hidden`]'s hook are the seam).
//! - Tokens: GPT-2's byte-level BPE through [`crate::nn::Tokenizer`]
//!   (feature `tokenizers`), read from `tokenizer.json`.
//!
//! ```
//! # #[cfg(feature = "tokenizers")] {
//! use kiln::prelude::*;
//! use kiln::nn::gpt2::{GenerateOptions, Gpt2};
//! use kiln::nn::sampling::Sampling;
//! use kiln::nn::Tokenizer;
//!
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt2-tiny");
//! let ctx = Context::cpu().with_seed(7);
//! let model = Gpt2::from_pretrained(&ctx, dir, DType::F32)?;
//! let tokenizer = Tokenizer::untruncated(format!("{dir}/tokenizer.json"))?;
//! let prompt = tokenizer.ids("The kiln cools")?;
//! // Eight greedy tokens, then eight sampled ones.
//! let greedy = model.generate(&[&prompt], &GenerateOptions::greedy(8))?;
//! let options = GenerateOptions::sampled(8, Sampling::temperature(0.8).with_top_k(40).with_top_p(0.95));
//! let sampled = model.generate(&[&prompt], &options)?;
//! assert_eq!((greedy[0].len(), sampled[0].len()), (8, 8));
//! let text = tokenizer.decode(&greedy[0])?;
//! # let _ = text;
//! # }
//! # Ok::<(), kiln::Error>(())
//! ```

mod config;
mod decode;
mod generate;
mod model;
mod names;

pub use config::{Activation, Gpt2Config};
pub use decode::Generator;
pub use generate::GenerateOptions;
pub use model::{Attend, Gpt2, KeyValues, Positions, HEAD_ALIGN, PAD_HEAD_ROWS};
pub use names::hf_name;
