//! Text to token ids with Hugging Face's `tokenizers` crate: the model's
//! own `tokenizer.json` (normalizer, pre-tokenizer, WordPiece, `[CLS]` /
//! `[SEP]` template) read by the library that wrote it, so the ids are
//! the Python library's ids. A batch is padded to its longest sentence
//! (the padding a `tokenizer.json` may fix, such as 128, is replaced) and
//! truncated at a maximum length, with an attention mask.

use crate::{Context, Error, Result, Tensor};
use std::path::Path;
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

/// A Hugging Face tokenizer (`tokenizer.json`).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_len: usize,
}

/// A tokenized batch as tensors.
pub struct Batch {
    /// Token ids `[batch, seq]`, i64, padded with the pad id.
    pub ids: Tensor,
    /// `[batch, seq]` i64: 1 for a token, 0 for padding.
    pub mask: Tensor,
    /// Tokens per sentence, `[CLS]` and `[SEP]` included.
    pub lengths: Vec<usize>,
}

impl Tokenizer {
    /// Reads `tokenizer.json`; sentences are cut at `max_len` tokens
    /// (sentence-transformers' `max_seq_length`: 256 for all-MiniLM-L6-v2).
    pub fn from_file(path: impl AsRef<Path>, max_len: usize) -> Result<Tokenizer> {
        let path = path.as_ref();
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Io(format!("cannot read the tokenizer {}: {e}", path.display())))?;
        let pad = inner.get_padding().cloned().unwrap_or_default();
        inner.with_padding(Some(PaddingParams { strategy: PaddingStrategy::BatchLongest, ..pad }));
        let trunc = inner.get_truncation().cloned().unwrap_or_default();
        inner
            .with_truncation(Some(TruncationParams { max_length: max_len, ..trunc }))
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner, max_len })
    }

    /// The longest sentence, in tokens, a batch keeps.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The ids of one sentence, special tokens included.
    pub fn ids(&self, text: &str) -> Result<Vec<u32>> {
        let e = self.inner.encode(text, true).map_err(|e| Error::Io(format!("tokenizing {text:?}: {e}")))?;
        Ok(e.get_ids().to_vec())
    }

    /// The sentences as one padded batch on `ctx`.
    pub fn batch(&self, ctx: &Context, texts: &[&str]) -> Result<Batch> {
        let _span = tracing::info_span!("Tokenizer::batch", sentences = texts.len()).entered();
        let enc = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::Io(format!("tokenizing a batch: {e}")))?;
        let seq = enc.first().map_or(0, |e| e.get_ids().len());
        let mut ids = Vec::with_capacity(texts.len() * seq);
        let mut mask = Vec::with_capacity(texts.len() * seq);
        let mut lengths = Vec::with_capacity(texts.len());
        for e in &enc {
            ids.extend(e.get_ids().iter().map(|&i| i as i64));
            mask.extend(e.get_attention_mask().iter().map(|&m| m as i64));
            lengths.push(e.get_attention_mask().iter().filter(|&&m| m != 0).count());
        }
        Ok(Batch {
            ids: ctx.tensor(&ids, [texts.len(), seq]),
            mask: ctx.tensor(&mask, [texts.len(), seq]),
            lengths,
        })
    }
}
