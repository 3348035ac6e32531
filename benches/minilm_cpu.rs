//! The MiniLM encoder (6 layers, 384 wide, 12 heads; random weights of the
//! real shapes) at batch 8 × 128 tokens, f32, on the CPU: the median of 20
//! forward passes after 3 warm-up passes, wall time of the whole call.
//! `benches/torch_minilm_cpu.py` is PyTorch's side (run them alternately).
//!
//!     cargo bench --bench minilm_cpu

use kiln::nn::bert::{Bert, BertConfig};
use kiln::nn::Params;
use kiln::prelude::*;
use std::time::Instant;

fn main() -> Result<()> {
    let ctx = Context::cpu().with_seed(1);
    let config = BertConfig::minilm_l6();
    let model = Bert::new(&ctx, "bert", &config, DType::F32)?;
    let params = model.parameters();
    ctx.realize(&params.iter().map(|v| &**v).collect::<Vec<&Tensor>>())?;
    let (batch, seq) = (8, 128);
    let ids: Vec<i64> = (0..batch * seq).map(|i| (i * 7919 % config.vocab_size) as i64).collect();
    let ids = ctx.tensor(&ids, [batch, seq]);
    let mask = ctx.ones_dtype([batch, seq], DType::I64);
    ctx.realize(&[&ids, &mask])?;
    let t0 = Instant::now();
    model.forward(&ids, &mask)?.realize()?;
    let first = t0.elapsed().as_secs_f64() * 1e3;
    for _ in 0..3 {
        model.forward(&ids, &mask)?.realize()?;
    }
    let mut times: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            model.forward(&ids, &mask).and_then(|y| y.realize().map(|_| ()))?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "kiln MiniLM-L6 encoder 8x128 f32 (CPU, {} threads): first {first:.1} ms, median {:.2} ms, min {:.2} ms",
        rayon::current_num_threads(),
        times[times.len() / 2],
        times[0]
    );
    Ok(())
}
