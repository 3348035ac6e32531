//! Text to token ids and back with Hugging Face's `tokenizers` crate: a
//! model's own `tokenizer.json` (normalizer, pre-tokenizer, model, special
//! token template, decoder) read by the library that wrote it, so the ids
//! are the Python library's ids. One wrapper for every model: BERT's
//! WordPiece with its `[CLS]` / `[SEP]` template, GPT-2's byte-level BPE
//! (which adds no special tokens and decodes back to the exact text).
//!
//! A batch is padded to its longest text (the padding a `tokenizer.json`
//! may fix, such as 128, is replaced) with an attention mask;
//! [`Tokenizer::from_file`] also cuts texts at a maximum length (an
//! encoder's), [`Tokenizer::untruncated`] never does (a decoder's prompt,
//! whose length the model checks).

use crate::{Context, Error, Result, Tensor};
use std::path::Path;
use tokenizers::{PaddingParams, PaddingStrategy, TruncationParams};

/// A Hugging Face tokenizer (`tokenizer.json`).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    max_len: Option<usize>,
}

/// A tokenized batch as tensors.
pub struct Batch {
    /// Token ids `[batch, seq]`, i64, padded with the pad id.
    pub ids: Tensor,
    /// `[batch, seq]` i64: 1 for a token, 0 for padding.
    pub mask: Tensor,
    /// Tokens per text, special tokens (`[CLS]`, `[SEP]`) included.
    pub lengths: Vec<usize>,
}

impl Tokenizer {
    /// Reads `tokenizer.json`; texts are cut at `max_len` tokens
    /// (sentence-transformers' `max_seq_length`: 256 for all-MiniLM-L6-v2).
    pub fn from_file(path: impl AsRef<Path>, max_len: usize) -> Result<Tokenizer> {
        Tokenizer::read(path.as_ref(), Some(max_len))
    }

    /// Reads `tokenizer.json`; texts are never cut (for a decoder's
    /// prompts: GPT-2's tokenizer).
    ///
    /// ```
    /// use kiln::nn::Tokenizer;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt2-tiny");
    /// let t = Tokenizer::untruncated(format!("{dir}/tokenizer.json"))?;
    /// let ids = t.ids("The kiln cools")?;
    /// assert_eq!(t.decode(&ids)?, "The kiln cools");
    /// assert_eq!(t.token_id("<|endoftext|>"), Some(0));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn untruncated(path: impl AsRef<Path>) -> Result<Tokenizer> {
        Tokenizer::read(path.as_ref(), None)
    }

    fn read(path: &Path, max_len: Option<usize>) -> Result<Tokenizer> {
        let mut inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Io(format!("cannot read the tokenizer {}: {e}", path.display())))?;
        let pad = inner.get_padding().cloned().unwrap_or_default();
        inner.with_padding(Some(PaddingParams { strategy: PaddingStrategy::BatchLongest, ..pad }));
        let cut = inner.get_truncation().cloned().unwrap_or_default();
        let truncation = max_len.map(|max_length| TruncationParams { max_length, ..cut });
        inner.with_truncation(truncation).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner, max_len })
    }

    /// The longest text, in tokens, a batch keeps (`None`: no limit).
    pub fn max_len(&self) -> Option<usize> {
        self.max_len
    }

    /// How many tokens there are, added (special) tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token (`"<|endoftext|>"`, `"[CLS]"`), if it has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The ids of one text, special tokens included.
    pub fn ids(&self, text: &str) -> Result<Vec<u32>> {
        let e = self.inner.encode(text, true).map_err(|e| Error::Io(format!("tokenizing {text:?}: {e}")))?;
        Ok(e.get_ids().to_vec())
    }

    /// The text of ids, special tokens kept (Hugging Face's `decode`
    /// default). Ids that end inside a multi-byte character decode to
    /// U+FFFD, as in Python.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| Error::Io(format!("decoding {} ids: {e}", ids.len())))
    }

    /// The texts as one padded batch on `ctx`.
    pub fn batch(&self, ctx: &Context, texts: &[&str]) -> Result<Batch> {
        let _span = tracing::info_span!("Tokenizer::batch", texts = texts.len()).entered();
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
