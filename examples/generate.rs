//! Trains a small character-level GPT on the Book of Genesis (King James
//! Version, 1,533 verses, public domain; `examples/data/genesis.txt.gz`,
//! extracted from Debian's `bible-kjv-text` package) and then writes new
//! text with it, sampled through a KV cache (`Gpt2::generator`: a prefill,
//! then one captured decode step per character).
//!
//!     cargo run --release --example generate
//!     cargo run --release --example generate -- --steps 2000 --prompt "And God said"
//!     cargo run --release --example generate -- --checkpoint path/to/gpt2 --prompt "Hello"
//!
//! Options: `--steps N` (training steps: 3000 on a GPU, about 15 s on an
//! H100 to a loss near 0.75 and text in Genesis's style; 300 on the CPU,
//! a few minutes on 2 cores, where the spelling is still half-learned),
//! `--batch N` (32 windows of
//! `--context` characters, 128: also the model's positions, so the prompt
//! and what it writes fit in it), `--lr X` (AdamW, 3e-3), `--tokens N`
//! (characters to write, at most what the context leaves; 300),
//! `--temperature X` (0.8), `--top-k N` (20),
//! `--seed N` (0), `--prompt TEXT`. With `--checkpoint DIR` (a Hugging
//! Face GPT-2 folder: config.json, model.safetensors, tokenizer.json) it
//! skips training and continues the prompt with that model instead.
//!
//! The model is `nn::gpt2::Gpt2` with a character vocabulary: 4 layers,
//! 128 wide, 4 heads. Every training step (forward, backward, AdamW) is
//! one captured step (`optim::TrainStep`).
use indicatif::{ProgressBar, ProgressStyle};
use kiln::data::Rng;
use kiln::nn::gpt2::{Activation, GenerateOptions, Gpt2, Gpt2Config};
use kiln::nn::sampling::Sampling;
use kiln::nn::{self, Params};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;
use std::io::Read;
use std::time::Instant;

struct Args {
    /// `None`: 3000 on a GPU, 300 on the CPU.
    steps: Option<usize>,
    batch: usize,
    context: usize,
    lr: f64,
    tokens: usize,
    temperature: f64,
    top_k: usize,
    seed: u64,
    prompt: Option<String>,
    checkpoint: Option<String>,
}

fn args() -> std::result::Result<Args, String> {
    let mut a = Args {
        steps: None,
        batch: 32,
        context: 128,
        lr: 3e-3,
        tokens: 300,
        temperature: 0.8,
        top_k: 20,
        seed: 0,
        prompt: None,
        checkpoint: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|_| format!("{flag}: not a number: {v}"));
        match flag.as_str() {
            "--steps" => a.steps = Some(num(value()?)? as usize),
            "--batch" => a.batch = num(value()?)? as usize,
            "--context" => a.context = num(value()?)? as usize,
            "--lr" => a.lr = num(value()?)?,
            "--tokens" => a.tokens = num(value()?)? as usize,
            "--temperature" => a.temperature = num(value()?)?,
            "--top-k" => a.top_k = num(value()?)? as usize,
            "--seed" => a.seed = num(value()?)? as u64,
            "--prompt" => a.prompt = Some(value()?),
            "--checkpoint" => a.checkpoint = Some(value()?),
            other => return Err(format!("unknown option {other} (see the example's docs)")),
        }
    }
    if a.batch == 0 || a.context < 2 || a.context > 512 {
        return Err("--batch must be positive and --context in 2..=512".into());
    }
    Ok(a)
}

/// The corpus and its characters.
fn corpus() -> Result<(String, Vec<char>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/genesis.txt.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path)?).read_to_string(&mut text)?;
    let mut chars: Vec<char> = text.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    Ok((text, chars))
}

fn main() -> Result<()> {
    let args = args().unwrap_or_else(|e| {
        eprintln!("generate: {e}");
        std::process::exit(2);
    });
    let ctx = Context::best().with_seed(args.seed);
    let sampling = Sampling::temperature(args.temperature).with_top_k(args.top_k);
    if let Some(dir) = &args.checkpoint {
        return continue_with_checkpoint(&ctx, dir, &args, sampling);
    }
    let (text, chars) = corpus()?;
    let ids: Vec<i64> = text.chars().map(|c| chars.binary_search(&c).unwrap_or(0) as i64).collect();
    let config = Gpt2Config {
        vocab_size: chars.len(),
        // Positions past the training windows would be untrained rows of
        // the position embedding: the model holds exactly `--context`.
        n_positions: args.context,
        n_embd: 128,
        n_layer: 4,
        n_head: 4,
        n_inner: 512,
        layer_norm_epsilon: 1e-5,
        activation: Activation::GeluTanh,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
    };
    let steps = args.steps.unwrap_or(if ctx.device() == "cpu" { 300 } else { 3000 });
    let model = Gpt2::new(&ctx, "chargpt", &config, DType::F32)?;
    println!(
        "device: {}; {} characters of Genesis, {} distinct; a GPT of {} parameters; {} steps of {} x {} characters",
        ctx.device_description(),
        ids.len(),
        chars.len(),
        model.num_parameters(),
        steps,
        args.batch,
        args.context
    );
    let opt = AdamW::new(&model, AdamConfig { lr: args.lr, ..AdamConfig::adamw() })?;
    let (vocab, b, s) = (chars.len(), args.batch, args.context);
    let loss_of = |batch: &[Tensor]| -> Result<Tensor> {
        let logits = model.forward(&batch[0], None)?;
        nn::cross_entropy(&logits.reshape([b * s, vocab]), &batch[1].reshape([b * s]))
    };
    let mut step = TrainStep::new(&ctx, opt, loss_of);
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rng = Rng::new(1);
    let started = Instant::now();
    let mut smoothed = None;
    for i in 0..steps {
        let (mut x, mut y) = (Vec::with_capacity(b * s), Vec::with_capacity(b * s));
        for _ in 0..b {
            let at = rng.below(ids.len() - s - 1);
            x.extend_from_slice(&ids[at..at + s]);
            y.extend_from_slice(&ids[at + 1..at + s + 1]);
        }
        let loss = step.call(&[&ctx.tensor(&x, [b, s]), &ctx.tensor(&y, [b, s])])?;
        // Reading the loss waits for the step; every 10th is enough for the bar.
        if i % 10 == 0 || i + 1 == steps {
            let l = loss.item::<f32>()? as f64;
            let avg = smoothed.map_or(l, |m: f64| 0.8 * m + 0.2 * l);
            smoothed = Some(avg);
            let rate = ((i + 1) * b * s) as f64 / started.elapsed().as_secs_f64();
            bar.set_message(format!("loss {avg:.3}  {rate:.0} characters/s"));
        }
        bar.inc(1);
    }
    bar.finish();
    println!("trained in {:.1} s; loss {:.3}", started.elapsed().as_secs_f64(), smoothed.unwrap_or(f64::NAN));
    let prompt = args.prompt.clone().unwrap_or_else(|| "And God said".into());
    let encoded: Vec<u32> = prompt.chars().map(|c| chars.binary_search(&c).unwrap_or(0) as u32).collect();
    if encoded.is_empty() {
        eprintln!("generate: the prompt is empty");
        std::process::exit(2);
    }
    if encoded.len() >= s {
        eprintln!("generate: the prompt has {} characters; the model holds {s} (--context)", encoded.len());
        std::process::exit(2);
    }
    // An absolute-position model writes at most its context: what is
    // left of it after the prompt.
    let tokens = args.tokens.min(s - encoded.len());
    let mut generator = model.generator(1, s)?;
    let t0 = Instant::now();
    let options = GenerateOptions::sampled(tokens, sampling);
    let out = generator.generate(&[&encoded], &options)?;
    let secs = t0.elapsed().as_secs_f64();
    let written: String = out[0].iter().map(|&t| chars[t as usize]).collect();
    println!(
        "--- {prompt}{written}\n--- {} characters in {:.2} s ({:.0}/s, with the KV cache)",
        out[0].len(),
        secs,
        out[0].len() as f64 / secs
    );
    Ok(())
}

/// Continues the prompt with a Hugging Face GPT-2 checkpoint folder.
fn continue_with_checkpoint(ctx: &Context, dir: &str, args: &Args, sampling: Sampling) -> Result<()> {
    let model = Gpt2::from_pretrained(ctx, dir, DType::F32)?;
    let tokenizer = nn::Tokenizer::untruncated(format!("{dir}/tokenizer.json"))?;
    let prompt = args.prompt.clone().unwrap_or_else(|| "In the beginning".into());
    let ids = tokenizer.ids(&prompt)?;
    let stop: Vec<u32> = tokenizer.token_id("<|endoftext|>").into_iter().collect();
    let room = model.config().n_positions.saturating_sub(ids.len());
    let options = GenerateOptions::sampled(args.tokens.min(room), sampling).with_stop_tokens(&stop);
    let t0 = Instant::now();
    let out = model.generate(&[&ids], &options)?;
    println!("{prompt}{}", tokenizer.decode(&out[0])?);
    println!("--- {} tokens in {:.2} s", out[0].len(), t0.elapsed().as_secs_f64());
    Ok(())
}
