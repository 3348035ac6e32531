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
//! Next to the `DataParallel` row, ZeRO-1 (`DataParallel::sharded` with a
//! `ShardedOptimizer`, AdamW with the same settings, issue 37): its step
//! time, the ratio to `DataParallel`'s, and each GPU's optimizer state
//! (`optimizer_state_bytes`) against `DataParallel`'s (targets: at most
//! 1.1x the step time, at most 1/N + 5% of the state).
//! The last row is the same `DataParallel` step with one process per GPU
//! (issue 37): the bench starts itself once per GPU with torchrun's
//! environment, each process joins with `Group::from_env` and trains on
//! its shard, and rank 0 reports (steps meet in the all-reduces, so its
//! step time is the group's).
//!
//!     cargo bench --features cuda --bench gpu_ddp [-- --bf16]
//!
//! Without two GPUs it says so and exits 0 (`KILN_REQUIRE_GPUS=2`: 1).

use kiln::dist::{DataParallel, ShardedOptimizer};
use kiln::nn::{self, Module, Sequential};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;
#[path = "common/ranks.rs"]
mod ranks;

use models::{median, mlp};

const GLOBAL: usize = 8192;

fn build(ctx: &Context) -> Result<(Sequential, AdamW)> {
    let model = mlp(ctx)?;
    let opt = AdamW::new(&model, AdamConfig { lr: 1e-3, ..AdamConfig::adamw() })?;
    Ok((model, opt))
}

fn build_sharded(ctx: &Context) -> Result<(Sequential, ShardedOptimizer)> {
    let model = mlp(ctx)?;
    let opt = ShardedOptimizer::adamw(&model, AdamConfig { lr: 1e-3, ..AdamConfig::adamw() })?;
    Ok((model, opt))
}

fn loss(m: &Sequential, b: &[Tensor]) -> Result<Tensor> {
    nn::cross_entropy(&m.forward(&b[0])?, &b[1])
}

/// A shard per rank, each on its rank's device.
fn shards(ctxs: &[Context]) -> Vec<Vec<Tensor>> {
    let gpus = ctxs.len();
    ctxs.iter()
        .enumerate()
        .map(|(k, c)| {
            let (x, y) = shard(c, GLOBAL / gpus, 10 + k as u64);
            vec![x, y]
        })
        .collect()
}

/// The median step time of `dp` on `shards`, and its first rank's
/// optimizer state in MiB.
fn time_dp<O: kiln::optim::Optimizer + Send + 'static>(
    dp: &mut DataParallel<O>,
    shards: &[Vec<Tensor>],
) -> Result<(f64, f64)> {
    let t = time(|| {
        for l in dp.step_shards(shards)? {
            l.item::<f32>()?;
        }
        Ok(())
    })?;
    let state = dp.optimizer_state_bytes()?.first().copied().flatten().unwrap_or(0);
    Ok((t, state as f64 / (1 << 20) as f64))
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

/// What a process of the last row runs (see the module docs).
fn rank_process(bf16: bool) -> Result<()> {
    let env = kiln::dist::ProcessEnv::from_env()?;
    let ctx = Context::cuda(env.local_rank)?.with_tf32(false);
    let ctx = if bf16 { ctx.with_autocast(DType::BF16) } else { ctx };
    let group = kiln::dist::Group::join(&ctx, &env)?;
    let mut dp = DataParallel::with_group(&group, build, loss)?;
    let (x, y) = shard(&ctx, GLOBAL / env.world_size, 10 + env.rank as u64);
    let shards = vec![vec![x, y]];
    let tn = time(|| {
        for l in dp.step_shards(&shards)? {
            l.item::<f32>()?;
        }
        Ok(())
    })?;
    if env.rank == 0 {
        let t1: f64 =
            std::env::var("KILN_DDP_ONE_GPU_S").ok().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        println!(
            "kiln {} {} GPUs batch {GLOBAL}, a process each: {:.3} ms/step, {:.0} samples/s, {:.2}x one GPU",
            if bf16 { "bf16" } else { "f32" },
            env.world_size,
            tn * 1e3,
            GLOBAL as f64 / tn,
            t1 / tn
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let bf16 = std::env::args().any(|a| a == "--bf16");
    if std::env::args().any(|a| a == "--rank-process") {
        return rank_process(bf16);
    }
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
    let gpu_contexts = || -> Result<Vec<Context>> {
        (0..gpus).map(|k| Context::cuda(k).map(|c| autocast(c.with_tf32(false)))).collect()
    };
    let ctxs = gpu_contexts()?;
    let mut dp = DataParallel::new(&ctxs, build, loss)?;
    let (tn, dp_state) = time_dp(&mut dp, &shards(&ctxs))?;
    println!(
        "kiln {precision} {gpus} GPUs batch {GLOBAL}: {:.3} ms/step, {:.0} samples/s, {:.2}x one GPU, optimizer state {dp_state:.2} MiB/GPU",
        tn * 1e3,
        GLOBAL as f64 / tn,
        t1 / tn
    );
    drop((dp, ctxs));

    // ZeRO-1 on every GPU, the same shards.
    let ctxs = gpu_contexts()?;
    let mut zero = DataParallel::sharded(&ctxs, build_sharded, loss)?;
    let (tz, zero_state) = time_dp(&mut zero, &shards(&ctxs))?;
    println!(
        "kiln {precision} {gpus} GPUs batch {GLOBAL} ZeRO-1: {:.3} ms/step, {:.0} samples/s, {:.2}x DataParallel's step time, optimizer state {zero_state:.2} MiB/GPU ({:.3} of DataParallel's; 1/{gpus} = {:.3})",
        tz * 1e3,
        GLOBAL as f64 / tz,
        tz / tn,
        zero_state / dp_state,
        1.0 / gpus as f64
    );
    drop((zero, ctxs, x, y, one));
    let args: &[&str] = if bf16 { &["--rank-process", "--bf16"] } else { &["--rank-process"] };
    ranks::spawn_ranks(gpus, args, &[("KILN_DDP_ONE_GPU_S", t1.to_string())])
}
