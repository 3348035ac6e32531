//! GPT-style decoder training on the GPU (issue 35): kiln's side of the
//! table that `benches/torch_train_gpt.py` completes in the same call
//! (PyTorch `nn.Module`s, `torch.optim.AdamW` default and fused, eager,
//! torch.compile and reduce-overhead).
//!
//! The model is `nn::gpt2::Gpt2` with random weights (GPT-2's
//! architecture: pre-LN blocks, tanh GELU, causal attention, the LM head
//! tied to the token embedding), trained as its users train it: a
//! captured `optim::TrainStep` of `AdamW` (PyTorch's defaults) on the
//! cross-entropy of next-token logits, one fixed batch of random token ids
//! and targets, the loss read every step. Three configurations, each in f32
//! (TF32 off) and under bf16 autocast (f32 parameters, as
//! `torch.autocast`):
//!
//! - `L2 d128 T64 B32 V8192`: launch-bound;
//! - `L4 d256 T128 B16 V8192`: the small decoder;
//! - `L12 d768 T512 B8 V50257`: GPT-2 small's sizes.
//!
//! Each row is a fresh context. One call = `step.call` and the read of the
//! loss, wall time, the median of 30 after 5 warm-ups (`first ms` is the
//! first call: compile and capture). Peak MiB is `Stats::peak_bytes` over
//! the timed steps (parameters, gradients, AdamW's moments, the step's
//! arena; `torch.cuda.max_memory_allocated` on PyTorch's side), launches
//! and input copies per step are `Stats::launches` and
//! `Stats::graph_input_copies` over them.
//!
//!     cargo bench --features cuda --bench gpu_train_gpt [-- SUBSTRING] [--steps N] [--precisions f32,bf16]
//!     KILN_BENCH_OUT=kiln_train.jsonl cargo bench ...   # also JSON lines
//!     cargo bench ... -- L12 --precisions bf16 --profile  # where a step's time goes
//!     KILN_PROFILE_NODES=200 KILN_DUMP=dump cargo bench ... --profile  # the 200 slowest nodes, numbered as the plan's 19-memory.kir
//!     cargo bench ... -- --gemms   # the LM head's GEMMs alone
//!     cargo bench ... -- L12 --streams 2   # independent work over 2 streams (default 1)
//!
//! Without a GPU it says so and exits 0 (`KILN_REQUIRE_CUDA=1`: 1).

use kiln::nn::gpt2::{Activation, Gpt2, Gpt2Config};
use kiln::nn::{self};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;
use std::io::Write;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;
#[path = "../tests/support/splitmix.rs"]
mod splitmix;

/// One decoder's sizes.
struct Shape {
    layers: usize,
    width: usize,
    seq: usize,
    batch: usize,
    vocab: usize,
}

impl Shape {
    /// The name both sides print (`L4 d256 T128 B16 V8192`).
    fn name(&self) -> String {
        let Shape { layers, width, seq, batch, vocab } = self;
        format!("L{layers} d{width} T{seq} B{batch} V{vocab}")
    }

    /// GPT-2's configuration at these sizes: 64-wide heads.
    fn config(&self) -> Gpt2Config {
        Gpt2Config {
            vocab_size: self.vocab,
            n_positions: self.seq,
            n_embd: self.width,
            n_layer: self.layers,
            n_head: self.width / 64,
            n_inner: 4 * self.width,
            layer_norm_epsilon: 1e-5,
            activation: Activation::GeluTanh,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
        }
    }
}

const SHAPES: [Shape; 3] = [
    Shape { layers: 2, width: 128, seq: 64, batch: 32, vocab: 8192 },
    Shape { layers: 4, width: 256, seq: 128, batch: 16, vocab: 8192 },
    Shape { layers: 12, width: 768, seq: 512, batch: 8, vocab: 50257 },
];

/// `n` token ids below `vocab` (splitmix64 from `seed`).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut rng = splitmix::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n).map(|_| (rng.next() % vocab as u64) as i64).collect()
}

/// What one row measured.
struct Row {
    first_ms: f64,
    median_ms: f64,
    peak_mib: f64,
    launches: f64,
    copies: f64,
    loss_first: f32,
    loss_last: f32,
}

/// Trains `shape` for `steps` timed steps in `precision` on a fresh context.
fn train(shape: &Shape, precision: &str, steps: usize, profile: bool, streams: u32) -> Result<Row> {
    let mut ctx =
        Context::cuda(0)?.with_seed(1).with_tf32(false).with_profiling(profile).with_streams(streams);
    if precision == "bf16" {
        ctx = ctx.with_autocast(DType::BF16);
    }
    let model = Gpt2::new(&ctx, "gpt", &shape.config(), DType::F32)?;
    let opt = AdamW::new(&model, AdamConfig::adamw())?;
    let (rows, vocab) = (shape.batch * shape.seq, shape.vocab);
    let ids = ctx.tensor(&tokens(rows, vocab, 1), [shape.batch, shape.seq]);
    let targets = ctx.tensor(&tokens(rows, vocab, 2), [rows]);
    ctx.realize(&[&ids, &targets])?;
    let mut step = TrainStep::new(&ctx, opt, move |b: &[Tensor]| {
        nn::cross_entropy(&model.forward(&b[0], None)?.reshape([rows, vocab]), &b[1])
    });
    ctx.sync()?;
    let t0 = Instant::now();
    step.call(&[&ids, &targets])?.item::<f32>()?;
    let first_ms = t0.elapsed().as_secs_f64() * 1e3;
    for _ in 0..5 {
        step.call(&[&ids, &targets])?.item::<f32>()?;
    }
    ctx.sync()?;
    if profile {
        print_profile(&ctx, || step.call(&[&ids, &targets])?.item::<f32>(), shape, precision)?;
    }
    ctx.reset_peak_bytes();
    let before = ctx.stats();
    let (mut times, mut losses) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    for _ in 0..steps {
        let t = Instant::now();
        losses.push(step.call(&[&ids, &targets])?.item::<f32>()?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let after = ctx.stats();
    let per_step = |a: u64, b: u64| (a - b) as f64 / steps as f64;
    Ok(Row {
        first_ms,
        median_ms: models::median(times),
        peak_mib: after.peak_bytes as f64 / (1 << 20) as f64,
        launches: per_step(after.launches, before.launches),
        copies: per_step(after.graph_input_copies, before.graph_input_copies),
        loss_first: losses[0],
        loss_last: losses[steps - 1],
    })
}

/// Where a step's device time goes (`--profile`): every node timed by
/// CUDA events over 3 steps launched eagerly (a profiled plan is not
/// captured, so a short kernel's time includes its launch), by op and the
/// slowest nodes one by one.
fn print_profile(
    ctx: &Context,
    mut step: impl FnMut() -> Result<f32>,
    shape: &Shape,
    precision: &str,
) -> Result<()> {
    ctx.reset_profile();
    for _ in 0..3 {
        step()?;
    }
    let p = ctx.profile();
    let runs = p.runs.len().max(1) as f64;
    let total: f64 = p.by_op().iter().map(|r| r.total_ms).sum::<f64>() / runs;
    println!("profile {} {precision}: {} runs, {total:.3} ms of nodes per run", shape.name(), p.runs.len());
    for r in p.by_op().iter().take(24) {
        println!(
            "    {:<44} {:>7.1} per run {:>9.4} ms per run {:>5.1}%",
            r.key,
            r.calls as f64 / runs,
            r.total_ms / runs,
            100.0 * r.share
        );
    }
    // `KILN_PROFILE_NODES=N` lists more (node numbers are those of the
    // plan's `KILN_DUMP` file `19-memory.kir`).
    let nodes = std::env::var("KILN_PROFILE_NODES").ok().and_then(|n| n.parse().ok()).unwrap_or(30);
    println!("  slowest nodes:");
    for r in p.by_node().iter().take(nodes) {
        println!("    {:<70} {:>4} calls {:>9.4} ms", r.key, r.calls, r.total_ms);
    }
    Ok(())
}

/// One of `print_gemms`' products, recorded afresh per run.
type Product<'a> = Box<dyn Fn() -> Tensor + 'a>;

/// The LM head's three GEMMs at GPT-2 small's training shapes (`--gemms`),
/// bf16 as autocast runs them: the logits `x · wᵀ` widened to f32 (and
/// kept bf16), the input's gradient `g · w` and the weight's `gᵀ · x`,
/// with GPT-2's vocabulary (50257: rows of logits not 16-byte aligned),
/// padded to a multiple of 8 (50264, what `Gpt2::lm_head` does) and
/// nanoGPT's padded one (50304): the median device time of 20 eager
/// runs (CUDA events).
fn print_gemms() -> Result<()> {
    let ctx = Context::cuda(0)?.with_seed(3).with_tf32(false).with_profiling(true);
    let (rows, width) = (4096usize, 768usize);
    for vocab in [50257usize, 50264, 50304] {
        let x = ctx.randn([rows, width]).cast(DType::BF16);
        let w = ctx.randn([vocab, width]).cast(DType::BF16);
        let g = ctx.randn([rows, vocab]).cast(DType::BF16);
        ctx.realize(&[&x, &w, &g])?;
        let cases: [(&str, Product); 4] = [
            ("logits x·wT -> f32", Box::new(|| x.matmul(&w.t()).cast(DType::F32))),
            ("logits x·wT bf16", Box::new(|| x.matmul(&w.t()))),
            ("dx g·w", Box::new(|| g.matmul(&w))),
            ("dw gT·x", Box::new(|| g.t().matmul(&x))),
        ];
        for (what, f) in &cases {
            let mut times = Vec::new();
            for rep in 0..23 {
                ctx.reset_profile();
                let y = f();
                ctx.realize(&[&y])?;
                if rep >= 3 {
                    times.push(ctx.profile().node_ms());
                }
            }
            let ms = models::median(times);
            let tflops = 2.0 * (rows * width * vocab) as f64 / (ms * 1e-3) / 1e12;
            println!("gemm V{vocab} {what:<20} {:8.1} us {tflops:6.1} TFLOP/s", ms * 1e3);
        }
    }
    Ok(())
}

/// A JSON number, or `null` for a NaN or infinity (JSON has neither).
fn json_number(v: f32) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

fn main() -> Result<()> {
    let probe = match Context::cuda(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("benches/gpu_train_gpt: no CUDA device ({e})");
            let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            std::process::exit(if required { 1 } else { 0 });
        }
    };
    println!("device: {}", probe.device_description());
    drop(probe);
    let mut out = std::env::var("KILN_BENCH_OUT").ok().and_then(|p| std::fs::File::create(p).ok());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|k| args.get(k + 1)).cloned();
    let steps = value("--steps").and_then(|s| s.parse().ok()).unwrap_or(30usize).max(1);
    if args.iter().any(|a| a == "--gemms") {
        return print_gemms();
    }
    let profile = args.iter().any(|a| a == "--profile");
    let streams = value("--streams").and_then(|s| s.parse().ok()).unwrap_or(1u32);
    let precisions = value("--precisions").unwrap_or_else(|| "f32,bf16".into());
    let only = args
        .iter()
        .enumerate()
        .find(|(k, a)| !a.starts_with('-') && (*k == 0 || !args[k - 1].starts_with("--")))
        .map(|(_, a)| a.clone());
    println!(
        "{:<26} {:<6} {:>10} {:>10} {:>10} {:>10} {:>8}  loss",
        "configuration", "", "median ms", "first ms", "peak MiB", "launches", "copies"
    );
    for shape in &SHAPES {
        let name = shape.name();
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        for precision in precisions.split(',') {
            let r = train(shape, precision, steps, profile, streams)?;
            println!(
                "{name:<26} {precision:<6} {:>10.3} {:>10.1} {:>10.1} {:>10.1} {:>8.2}  {:.4} -> {:.4}",
                r.median_ms, r.first_ms, r.peak_mib, r.launches, r.copies, r.loss_first, r.loss_last
            );
            if let Some(f) = out.as_mut() {
                let _ = writeln!(
                    f,
                    "{{\"config\":\"{name}\",\"precision\":\"{precision}\",\"impl\":\"kiln captured\",\"median_ms\":{:.5},\"first_ms\":{:.1},\"peak_mib\":{:.1},\"launches_per_step\":{:.1},\"input_copies_per_step\":{:.2},\"loss_first\":{},\"loss_last\":{}}}",
                    r.median_ms,
                    r.first_ms,
                    r.peak_mib,
                    r.launches,
                    r.copies,
                    json_number(r.loss_first),
                    json_number(r.loss_last)
                );
            }
        }
    }
    Ok(())
}
