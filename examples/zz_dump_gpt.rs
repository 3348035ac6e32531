use kiln::nn;
use kiln::nn::gpt2::{Gpt2, Gpt2Config};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;
fn main() -> Result<()> {
    let ctx = Context::cuda_emulated().with_seed(1).with_tf32(false);
    let mut cfg = Gpt2Config::gpt2_small();
    cfg.n_layer = 1;
    cfg.n_embd = 64;
    cfg.n_head = 4;
    cfg.n_inner = 256;
    cfg.vocab_size = 2048;
    cfg.n_positions = 32;
    let model = Gpt2::new(&ctx, "gpt", &cfg, DType::F32)?;
    let opt = AdamW::new(&model, AdamConfig::adamw())?;
    let (b, t, v) = (32usize, 64usize, 8192usize);
    let ids = ctx.tensor(&vec![1i64; b * t], [b, t]);
    let targets = ctx.tensor(&vec![2i64; b * t], [b * t]);
    let mut step = TrainStep::new(&ctx, opt, move |x: &[Tensor]| {
        nn::cross_entropy(&model.forward(&x[0], None)?.reshape([b * t, v]), &x[1])
    });
    for _ in 0..1 {
        println!("{}", step.call(&[&ids, &targets])?.item::<f32>()?);
    }
    Ok(())
}
