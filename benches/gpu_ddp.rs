//! Data parallelism on several GPUs (issue 24): kiln's side of the table
//! that `benches/torch_ddp.py` completes (PyTorch DDP over NCCL, one
//! process per GPU, TF32 off), run in the same device call.
//!
//! Rows: the MLP 784-1024x3-10 AdamW training step (cross-entropy) at a
//! global batch of 8192: on one GPU (a plain captured `TrainStep`), then
//! with `kiln::dist::DataParallel` over every visible GPU (4096 rows per
//! GPU on two), each rank fed a shard already on its device (as a loader
//! per rank does). Throughput is samples per second from the median of
//! 30 wall-clock step times after 5 warm-ups (a step is timed to the read
//! of every rank's loss). With `--bf16`, the same under bf16 autocast.
//!
//!     cargo bench --features cuda --bench gpu_ddp [-- --bf16]
//!
//! Without two GPUs it says so and exits 0 (`KILN_REQUIRE_GPUS=2`: 1).

use kiln::dist::DataParallel;
use kiln::nn::{self, Module, Sequential};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;

use models::{median, mlp};

const GLOBAL: usize = 8192;

fn build(ctx: &Context) -> Result<(Sequential, AdamW)> {
    let model = mlp(ctx)?;
    let opt = AdamW::new(&model, AdamConfig { lr: 1e-3, ..AdamConfig::adamw() })?;
    Ok((model, opt))
}

fn shard(ctx: &Context, rows: usize, seed: u64) -> (Tensor, Tensor) {
    let c = ctx.clone().with_seed(seed);
    let x = c.randn([rows, 784]);
    let y = (c.rand([rows]) * 10.0).cast(DType::I64);
    (x, y)
}

fn time(mut step: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..5 {
        step()?;
    }
    let mut t = Vec::new();
    for _ in 0..30 {
        let start = Instant::now();
        step()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

fn main() -> Result<()> {
    let bf16 = std::env::args().any(|a| a == "--bf16");
    let gpus = kiln::dist::devices().len() - 1;
    let required = std::env::var("KILN_REQUIRE_GPUS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if gpus < 2 {
        eprintln!("gpu_ddp: needs 2 GPUs, {gpus} found");
        std::process::exit(if required >= 2 { 1 } else { 0 });
    }
    let precision = if bf16 { "bf16" } else { "f32" };
    let autocast = |ctx: Context| if bf16 { ctx.with_autocast(DType::BF16) } else { ctx };

    // One GPU, the whole batch.
    let one = autocast(Context::cuda(0)?.with_tf32(false));
    let (model, opt) = build(&one)?;
    let mut step = TrainStep::new(&one, opt, |b: &[Tensor]| nn::cross_entropy(&model.forward(&b[0])?, &b[1]));
    let (x, y) = shard(&one, GLOBAL, 1);
    let t1 = time(|| step.call(&[&x, &y])?.item::<f32>().map(|_| ()))?;
    println!(
        "kiln {precision} 1 GPU  batch {GLOBAL}: {:.3} ms/step, {:.0} samples/s",
        t1 * 1e3,
        GLOBAL as f64 / t1
    );
    drop(step);

    // Every GPU, a shard each.
    let ctxs: Vec<Context> =
        (0..gpus).map(|k| Context::cuda(k).map(|c| autocast(c.with_tf32(false)))).collect::<Result<_>>()?;
    let mut dp = DataParallel::new(&ctxs, build, |m: &Sequential, b: &[Tensor]| {
        nn::cross_entropy(&m.forward(&b[0])?, &b[1])
    })?;
    let shards: Vec<Vec<Tensor>> = ctxs
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let (x, y) = shard(c, GLOBAL / gpus, 10 + k as u64);
            vec![x, y]
        })
        .collect();
    let tn = time(|| {
        for l in dp.step_shards(&shards)? {
            l.item::<f32>()?;
        }
        Ok(())
    })?;
    println!(
        "kiln {precision} {gpus} GPUs batch {GLOBAL}: {:.3} ms/step, {:.0} samples/s, {:.2}x one GPU",
        tn * 1e3,
        GLOBAL as f64 / tn,
        t1 / tn
    );
    Ok(())
}
