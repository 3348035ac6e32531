//! Issue 34's CPU row, kiln's side: GPT-2 small's shapes (random weights,
//! f32) decoding with the KV cache on this machine's CPU, batch 1, a
//! 16-token prompt: `(T(16 + 33) - T(16 + 1)) / 32` per token, medians of
//! 3 generations. `benches/hf_generate_cpu.py` is PyTorch eager with Hugging
//! Face's cache, measured the same way; run them back to back (kiln, HF,
//! kiln, HF) and quote the medians:
//!
//!     cargo bench --bench generate_cpu; python3 benches/hf_generate_cpu.py

use kiln::nn::gpt2::{GenerateOptions, Gpt2, Gpt2Config};
use kiln::prelude::*;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let ctx = Context::cpu().with_seed(0);
    let model = Gpt2::new(&ctx, "gpt2", &Gpt2Config::gpt2_small(), DType::F32)?;
    let mut generator = model.generator(1, 128)?;
    let prompt: Vec<u32> = (0..16u32).map(|i| (i * 7919) % 50257).collect();
    generator.generate(&[&prompt], &GenerateOptions::greedy(3))?;
    let mut time = |n: usize| -> Result<f64> {
        let mut t = Vec::new();
        for _ in 0..3 {
            let start = Instant::now();
            generator.generate(&[&prompt], &GenerateOptions::greedy(n))?;
            t.push(start.elapsed().as_secs_f64());
        }
        Ok(median(t))
    };
    let (short, long) = (time(1)?, time(33)?);
    println!(
        "kiln cpu f32 decode: {:.1} ms/token; prefill 16 + 1 token {:.1} ms ({} threads)",
        (long - short) / 32.0 * 1e3,
        short * 1e3,
        rayon::current_num_threads()
    );
    Ok(())
}
