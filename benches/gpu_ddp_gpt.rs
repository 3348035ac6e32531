//! Data parallelism on a workload that should scale (issue 37, item 4):
//! GPT-2 small's training step (124M parameters, `L12 d768 T512
//! V50257`, AdamW, the cross-entropy of next-token logits, the loss read
//! every step) with a batch of 8 sequences per GPU, kiln's side of the
//! table that `benches/torch_ddp.py --gpt` completes in the same call.
//!
//! Rows, each a median of 20 wall-clock steps after 5 warm-ups:
//! - one GPU, a captured `TrainStep` on 8 sequences (`benches/
//!   gpu_train_gpt.rs`'s L12 row);
//! - `DataParallel` over every visible GPU, ranks as threads of this
//!   process, 8 sequences each, with gradient buckets of each size in
//!   `--buckets` (MiB; 4 is kiln's default, 25 PyTorch DDP's);
//! - the same with one process per GPU (`Group::from_env`, torchrun's
//!   environment; rank 0 reports, its steps meet the others' in the
//!   all-reduces).
//!
//! Scaling is throughput against one GPU: `N · t(1) / t(N)` (the target is
//! ≥ 1.9x on 2 GPUs, ≥ 3.6x on 4). With `--bf16` the same under bf16
//! autocast (f32 parameters); with `--reduce-bf16` the gradients are
//! averaged in bf16 (`DataParallel::with_reduce_dtype`, PyTorch's
//! `bf16_compress_hook`) on the rows with several GPUs.
//!
//!     cargo bench --features cuda --bench gpu_ddp_gpt [-- --bf16] [--buckets 4,25] [--reduce-bf16]
//!     cargo bench ... -- --profile   # also rank 0's node times by op (the all-reduces' own time), eager,
//!                                    # and each stream's timeline of one step (KILN_BENCH_TRACE=f.json: a Chrome trace)
//!
//! Without two GPUs it says so and exits 0 (`KILN_REQUIRE_GPUS=2`: 1).

use kiln::dist::DataParallel;
use kiln::nn::gpt2::{Gpt2, Gpt2Config};
use kiln::nn::{self};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;
#[path = "common/ranks.rs"]
mod ranks;
#[path = "../tests/support/splitmix.rs"]
mod splitmix;

/// Sequences per GPU.
const BATCH: usize = 8;

fn config() -> Gpt2Config {
    Gpt2Config { n_positions: 512, ..Gpt2Config::gpt2_small() }
}

fn build(ctx: &Context) -> Result<(Gpt2, AdamW)> {
    let model = Gpt2::new(ctx, "gpt", &config(), DType::F32)?;
    let opt = AdamW::new(&model, AdamConfig::adamw())?;
    Ok((model, opt))
}

/// The mean cross-entropy of `b[0]`'s next-token logits against `b[1]`.
fn loss(m: &Gpt2, b: &[Tensor]) -> Result<Tensor> {
    let logits = m.forward(&b[0], None)?;
    let (rows, vocab) = (b[1].shape()[0], logits.shape()[2]);
    nn::cross_entropy(&logits.reshape([rows, vocab]), &b[1])
}

/// A batch of random ids and targets for one rank, on its device.
fn batch(ctx: &Context, seed: u64) -> Result<Vec<Tensor>> {
    let c = config();
    let (seq, vocab) = (c.n_positions, c.vocab_size);
    let ids = |s: u64| {
        let mut rng = splitmix::Rng(s.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        (0..BATCH * seq).map(|_| (rng.next() % vocab as u64) as i64).collect::<Vec<_>>()
    };
    let x = ctx.tensor(&ids(2 * seed), [BATCH, seq]);
    let y = ctx.tensor(&ids(2 * seed + 1), [BATCH * seq]);
    ctx.realize(&[&x, &y])?;
    Ok(vec![x, y])
}

/// The median of 20 step times after 5 warm-ups, and the first and last
/// losses.
fn time(mut step: impl FnMut() -> Result<f32>) -> Result<(f64, f32, f32)> {
    for _ in 0..5 {
        step()?;
    }
    let (mut t, mut losses) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let start = Instant::now();
        losses.push(step()?);
        t.push(start.elapsed().as_secs_f64());
    }
    Ok((models::median(t), losses[0], losses[19]))
}

fn tokens_per_s(gpus: usize, t: f64) -> f64 {
    (gpus * BATCH * config().n_positions) as f64 / t
}

/// One step of `dp` over `shards`: rank 0's loss, every rank's read.
fn dp_step<O: kiln::optim::Optimizer + Send + 'static>(
    dp: &mut DataParallel<O>,
    shards: &[Vec<Tensor>],
) -> Result<f32> {
    let mut first = None;
    for l in dp.step_shards(shards)? {
        let v = l.item::<f32>()?;
        first.get_or_insert(v);
    }
    Ok(first.unwrap_or(f32::NAN))
}

/// `dp` averaging in bf16 with `--reduce-bf16` (module docs).
fn reduce_dtype(dp: DataParallel<AdamW>) -> Result<DataParallel<AdamW>> {
    if std::env::args().any(|a| a == "--reduce-bf16") {
        dp.with_reduce_dtype(DType::BF16)
    } else {
        Ok(dp)
    }
}

/// What a process of the last row runs (see the module docs).
fn rank_process(precision: &str, bucket_mib: usize) -> Result<()> {
    let env = kiln::dist::ProcessEnv::from_env()?;
    let mut ctx = Context::cuda(env.local_rank)?.with_tf32(false);
    if precision == "bf16" {
        ctx = ctx.with_autocast(DType::BF16);
    }
    let group = kiln::dist::Group::join(&ctx, &env)?;
    let mut dp =
        reduce_dtype(DataParallel::with_group(&group, build, loss)?.with_bucket_bytes(bucket_mib << 20))?;
    let shards = vec![batch(&ctx, 10 + env.rank as u64)?];
    let (tn, first, last) = time(|| dp_step(&mut dp, &shards))?;
    if env.rank == 0 {
        let t1: f64 =
            std::env::var("KILN_DDP_ONE_GPU_S").ok().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        let n = env.world_size;
        println!(
            "kiln {precision} {n} GPUs, a process each, buckets {bucket_mib} MiB: {:.3} ms/step, {:.0} tokens/s, scaling {:.2}x, loss {first:.4} -> {last:.4}",
            tn * 1e3,
            tokens_per_s(n, tn),
            n as f64 * t1 / tn
        );
    }
    Ok(())
}

/// Rank 0's device time by op over 3 steps of `DataParallel` with
/// profiling on (each node timed by CUDA events, plans launched eagerly,
/// so the all-reduces' time is their own, not hidden behind the backward).
fn profile(gpus: usize, autocast: &dyn Fn(Context) -> Context, mib: usize) -> Result<()> {
    let ctxs: Vec<Context> = (0..gpus)
        .map(|k| Context::cuda(k).map(|c| autocast(c.with_tf32(false).with_profiling(true))))
        .collect::<Result<_>>()?;
    let mut dp = reduce_dtype(DataParallel::new(&ctxs, build, loss)?.with_bucket_bytes(mib << 20))?;
    let shards: Vec<Vec<Tensor>> =
        ctxs.iter().enumerate().map(|(k, c)| batch(c, 10 + k as u64)).collect::<Result<_>>()?;
    for _ in 0..3 {
        dp_step(&mut dp, &shards)?;
    }
    ctxs[0].reset_profile();
    for _ in 0..3 {
        dp_step(&mut dp, &shards)?;
    }
    let p = ctxs[0].profile();
    println!("profile, rank 0, buckets {mib} MiB, per step:");
    for r in p.by_op().iter().take(14) {
        println!("    {:<40} {:>7.1} nodes {:>9.4} ms", r.key, r.calls as f64 / 3.0, r.total_ms / 3.0);
    }
    // The last step's runs: where each stream is busy, and how much of the
    // all-reduces runs after the last compute node (what the backward did
    // not hide).
    let per_step = p.runs.len() / 3;
    for run in &p.runs[p.runs.len() - per_step..] {
        timeline(run);
    }
    if let Ok(path) = std::env::var("KILN_BENCH_TRACE") {
        p.write_chrome_trace(&path)?;
        println!("chrome trace of rank 0's profiled runs: {path}");
    }
    Ok(())
}

/// One run's per-stream timeline (module docs): each stream's span and
/// busy time, each collective's start and length, and the collectives'
/// time after the last compute node ends.
fn timeline(run: &kiln::profile::RunProfile) {
    let is_collective =
        |op: &str| op.starts_with("all_") || op.starts_with("reduce_scatter") || op == "collective";
    let mut streams: std::collections::BTreeMap<u32, (f64, f64, f64, usize)> = Default::default();
    for n in &run.nodes {
        let e = streams.entry(n.stream).or_insert((f64::MAX, 0.0, 0.0, 0));
        e.0 = e.0.min(n.start_us);
        e.1 = e.1.max(n.start_us + n.dur_us);
        e.2 += n.dur_us;
        e.3 += 1;
    }
    let compute_end =
        run.nodes.iter().filter(|n| !is_collective(&n.op)).map(|n| n.start_us + n.dur_us).fold(0.0, f64::max);
    println!(
        "  timeline of one run (plan {:016x}, {} nodes, wall {:.3} ms):",
        run.plan,
        run.nodes.len(),
        run.wall_us / 1e3
    );
    for (s, (first, last, busy, count)) in &streams {
        println!(
            "    stream {s}: {count} nodes, {:.3} to {:.3} ms, busy {:.3} ms",
            first / 1e3,
            last / 1e3,
            busy / 1e3
        );
    }
    let mut after = 0.0;
    for n in run.nodes.iter().filter(|n| is_collective(&n.op)) {
        let end = n.start_us + n.dur_us;
        after += (end - n.start_us.max(compute_end)).max(0.0);
        println!(
            "    %{:<5} {:<16} stream {} {:>8.3} ms +{:.3} ms",
            n.node,
            n.op,
            n.stream,
            n.start_us / 1e3,
            n.dur_us / 1e3
        );
    }
    println!(
        "    compute ends at {:.3} ms; collective time after it: {:.3} ms",
        compute_end / 1e3,
        after / 1e3
    );
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<()> {
    let precision = if std::env::args().any(|a| a == "--bf16") { "bf16" } else { "f32" };
    let buckets: Vec<usize> =
        arg("--buckets").unwrap_or_else(|| "4,25".into()).split(',').filter_map(|b| b.parse().ok()).collect();
    if std::env::args().any(|a| a == "--rank-process") {
        return rank_process(precision, buckets.last().copied().unwrap_or(4));
    }
    let gpus = kiln::dist::devices().len() - 1;
    let required = std::env::var("KILN_REQUIRE_GPUS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if gpus < 2 {
        eprintln!("gpu_ddp_gpt: needs 2 GPUs, {gpus} found");
        std::process::exit(if required >= 2 { 1 } else { 0 });
    }
    let autocast = |ctx: Context| if precision == "bf16" { ctx.with_autocast(DType::BF16) } else { ctx };

    // One GPU, one rank's batch.
    let one = autocast(Context::cuda(0)?.with_tf32(false));
    let (model, opt) = build(&one)?;
    let mut step = TrainStep::new(&one, opt, move |b: &[Tensor]| loss(&model, b));
    let b = batch(&one, 10)?;
    let (t1, first, last) = time(|| step.call(&[&b[0], &b[1]])?.item::<f32>())?;
    println!(
        "kiln {precision} 1 GPU: {:.3} ms/step, {:.0} tokens/s, loss {first:.4} -> {last:.4}",
        t1 * 1e3,
        tokens_per_s(1, t1)
    );
    drop((step, b, one));

    // Every GPU, ranks as threads, per bucket size.
    for &mib in &buckets {
        let ctxs: Vec<Context> = (0..gpus)
            .map(|k| Context::cuda(k).map(|c| autocast(c.with_tf32(false))))
            .collect::<Result<_>>()?;
        let mut dp = reduce_dtype(DataParallel::new(&ctxs, build, loss)?.with_bucket_bytes(mib << 20))?;
        let shards: Vec<Vec<Tensor>> =
            ctxs.iter().enumerate().map(|(k, c)| batch(c, 10 + k as u64)).collect::<Result<_>>()?;
        let (tn, first, last) = time(|| dp_step(&mut dp, &shards))?;
        println!(
            "kiln {precision} {gpus} GPUs, threads, buckets {mib} MiB: {:.3} ms/step, {:.0} tokens/s, scaling {:.2}x, loss {first:.4} -> {last:.4}",
            tn * 1e3,
            tokens_per_s(gpus, tn),
            gpus as f64 * t1 / tn
        );
    }

    if std::env::args().any(|a| a == "--profile") {
        profile(gpus, &autocast, buckets.last().copied().unwrap_or(4))?;
    }

    // Every GPU, a process each, the last bucket size.
    let mut args = vec!["--rank-process", "--buckets"];
    let last = buckets.last().copied().unwrap_or(4).to_string();
    args.push(&last);
    if precision == "bf16" {
        args.push("--bf16");
    }
    if std::env::args().any(|a| a == "--reduce-bf16") {
        args.push("--reduce-bf16");
    }
    ranks::spawn_ranks(gpus, &args, &[("KILN_DDP_ONE_GPU_S", t1.to_string())])
}
