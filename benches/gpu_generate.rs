//! Issue 34's GPU targets, kiln's side (`benches/hf_generate.py` is Hugging
//! Face's, run in the same device call by `gpu_session.sh generate`).
//!
//! GPT-2 small's shapes (`Gpt2Config::gpt2_small`, random weights), TF32
//! off, with the KV-cache generator (`Gpt2::generator`):
//!
//! - decode, batch 1, a 16-token prompt: `(T(16 + 112) - T(16 + 1)) / 111`
//!   per token, the medians of 7 generations each, f32 and bf16, and the
//!   fraction of the weight-bandwidth bound (the weights read once per
//!   token at the card's measured copy bandwidth);
//! - prefill of a 512-token prompt (a generation of 1 token), median of 20;
//! - a batch of 8 prompts of lengths 5 to 200, 64 new tokens each:
//!   tokens per second;
//! - the first generated token after the model is made (compiling the
//!   prefill and decode plans with an empty kernel cache when
//!   `KILN_CACHE_DIR` is fresh);
//! - 1000 prompts of random lengths 1-512, 2 new tokens each: the plans
//!   compiled (the bound is one per prefill bucket plus the decode step);
//! - peak device memory of decoding next to the weights plus the cache.
//!
//! ```text
//! cargo bench --features cuda --bench gpu_generate [-- --profile | --profile-bf16]
//! cargo bench --features cuda --bench gpu_generate -- --profile-prefill
//! cargo bench --features cuda --bench gpu_generate -- --prefill
//! cargo bench --features cuda --bench gpu_generate -- --gemms
//! cargo bench --features cuda --bench gpu_generate -- --memory f32|bf16
//! ```
//!
//! `--prefill` times the 512-token prefill alone (f32, bf16); `--gemms`
//! its four GEMM shapes one by one.
//! `--profile*` print where a decode token's (or a 512-token prefill's)
//! device time goes, by op; `--memory` measures one configuration's peak
//! alone in its process (run it once per dtype): the peak while
//! decoding, counted from after the weights are made.
//!
//! Without a GPU it says so and exits 0 (with `KILN_REQUIRE_CUDA=1`, 1).

use kiln::nn::gpt2::{GenerateOptions, Gpt2, Gpt2Config};
use kiln::nn::Params;
use kiln::prelude::*;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;

use models::median;

fn prompt(len: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 50257) as u32
        })
        .collect()
}

/// Median seconds of `reps` generations.
fn time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

fn weight_bytes(model: &Gpt2) -> Result<u64> {
    let mut bytes = 0u64;
    for v in model.parameters() {
        bytes += (v.numel() * v.dtype().size()) as u64;
    }
    Ok(bytes)
}

/// Device memory bandwidth (bytes/s): a 256 MiB f32 tensor plus a
/// runtime scalar (so no rewrite removes the work), read and written once.
fn bandwidth(ctx: &Context) -> Result<f64> {
    let n = 64 << 20;
    let x = ctx.ones([n]);
    ctx.realize(&[&x])?;
    let secs = time(10, || {
        let y = &x + ctx.scalar(1.0f32);
        ctx.realize(&[&y])?;
        ctx.sync()
    })?;
    Ok(2.0 * 4.0 * n as f64 / secs)
}

/// Where a generation's device time goes, by op: `new` tokens after a
/// prompt of `len` in `dtype` (every node timed by CUDA events, launched
/// eagerly, so a short kernel's time includes its launch). 33 tokens of a
/// 16-token prompt are mostly decode steps; 1 token of 512 is a prefill.
fn print_profile(config: &Gpt2Config, dtype: DType, len: usize, new: usize) -> Result<()> {
    let ctx = Context::cuda(0)?.with_seed(0).with_tf32(false).with_profiling(true);
    let model = Gpt2::new(&ctx, "gpt2", config, dtype)?;
    let mut generator = model.generator(1, (len + new).next_power_of_two())?;
    let p = prompt(len, 1);
    generator.generate(&[&p], &GenerateOptions::greedy(new.min(4)))?;
    ctx.reset_profile();
    let started = Instant::now();
    generator.generate(&[&p], &GenerateOptions::greedy(new))?;
    let wall = started.elapsed().as_secs_f64() * 1e3;
    let p = ctx.profile();
    let runs = p.runs.len().max(1) as f64;
    println!(
        "profile, {dtype}: {} runs (a prefill, then decode steps), {wall:.2} ms wall in all",
        p.runs.len()
    );
    for r in p.by_op().iter().take(14) {
        println!(
            "    {:<44} {:>6.1} per run {:>9.4} ms per run {:>5.1}%",
            r.key,
            r.calls as f64 / runs,
            r.total_ms / runs,
            100.0 * r.share
        );
    }
    if new == 1 {
        // A prefill: its slowest nodes one by one (a layer's GEMMs and
        // attention, to set next to the same shapes in PyTorch).
        println!("  slowest nodes:");
        for r in p.by_node().iter().take(24) {
            println!("    {:<60} {:>4} calls {:>9.4} ms", r.key, r.calls, r.total_ms);
        }
    }
    Ok(())
}

/// The prefill's four GEMM shapes (a 512-token prompt through one GPT-2
/// small block: qkv, attention projection, MLP up and down), each
/// `x · wᵀ + b` as the model runs it (weights `[out, in]`) and `x · w + b`
/// (HF's Conv1D layout `[in, out]`), f32, TF32 off: the median device time
/// of 30 eager runs (CUDA events), next to `hf_generate.py --gemms`.
fn print_gemms(ctx: &Context) -> Result<()> {
    let ctx = ctx.clone().with_profiling(true);
    let (m, d) = (512usize, 768usize);
    for (what, k, n) in [("qkv", d, 3 * d), ("proj", d, d), ("up", d, 4 * d), ("down", 4 * d, d)] {
        let x = ctx.randn([m, k]);
        let b = ctx.randn([n]);
        for (layout, w) in [("x·wT+b", ctx.randn([n, k])), ("x·w+b", ctx.randn([k, n]))] {
            ctx.realize(&[&x, &b, &w])?;
            let wt = if layout == "x·wT+b" { w.t() } else { w.clone() };
            let mut times = Vec::new();
            for rep in 0..33 {
                ctx.reset_profile();
                let y = x.matmul(&wt) + &b;
                ctx.realize(&[&y])?;
                if rep >= 3 {
                    times.push(ctx.profile().node_ms());
                }
            }
            let ms = median(times);
            let tflops = 2.0 * (m * k * n) as f64 / (ms * 1e-3) / 1e12;
            println!("gemm {what:<5} {m}x{k}x{n} {layout:<7} {:7.1} us  {tflops:5.1} TFLOP/s", ms * 1e3);
        }
    }
    Ok(())
}

/// The peak device memory of decoding in `dtype`, alone in this process:
/// counted from after the weights are made and their random
/// initializer's plan is dropped ([`Context::clear_plans`]: a loaded
/// checkpoint has no such plan), over a 16-token prompt and 112 new
/// tokens with a 128-position cache, next to the weights plus the cache.
/// Prints what is held at each stage, to say where memory goes.
fn print_memory(ctx: &Context, config: &Gpt2Config, dtype: DType) -> Result<()> {
    let mb = |b: u64| b as f64 / 1e6;
    let stage = |what: &str| {
        let s = ctx.stats();
        println!(
            "{dtype} memory, {what}: live {:.1} MB, peak {:.1} MB, {} cached plans",
            mb(s.live_bytes),
            mb(s.peak_bytes),
            s.cached_plans
        );
    };
    let model = Gpt2::new(ctx, "gpt2", config, dtype)?;
    ctx.sync()?;
    stage("weights made");
    ctx.clear_plans();
    let weights = weight_bytes(&model)?;
    let held = ctx.stats().live_bytes;
    ctx.reset_peak_bytes();
    stage("initializer dropped");
    let mut generator = model.generator(1, 128)?;
    stage("cache made");
    let c = model.config();
    let cache = (2 * c.n_layer * c.n_head * 128 * c.head_dim() * dtype.size()) as u64;
    let p16 = prompt(16, 1);
    generator.generate(&[&p16], &GenerateOptions::greedy(1))?;
    stage("after a prefill");
    generator.generate(&[&p16], &GenerateOptions::greedy(3))?;
    stage("after 2 decode steps");
    for _ in 0..3 {
        generator.generate(&[&p16], &GenerateOptions::greedy(112))?;
    }
    ctx.sync()?;
    stage("after 3 generations");
    let peak = ctx.stats().peak_bytes;
    println!(
        "{dtype} memory: peak {:.1} MB while decoding; weights {:.1} MB + cache {:.1} MB = {:.1} MB, so {:+.1}% over (held before decoding: {:.1} MB)",
        mb(peak),
        mb(weights),
        mb(cache),
        mb(weights + cache),
        100.0 * (peak as f64 / (weights + cache) as f64 - 1.0),
        mb(held)
    );
    Ok(())
}

fn main() -> Result<()> {
    let ctx = match Context::cuda(0) {
        Ok(c) => c.with_seed(0).with_tf32(false),
        Err(e) => {
            eprintln!("gpu_generate: no GPU ({e})");
            if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                std::process::exit(1);
            }
            return Ok(());
        }
    };
    println!("device: {}", ctx.device_description());
    let config = Gpt2Config::gpt2_small();
    let args: Vec<String> = std::env::args().collect();
    if let Some(k) = args.iter().position(|a| a == "--memory") {
        let dtype = if args.get(k + 1).is_some_and(|d| d == "bf16") { DType::BF16 } else { DType::F32 };
        return print_memory(&ctx, &config, dtype);
    }
    if args.iter().any(|a| a == "--gemms") {
        return print_gemms(&ctx);
    }
    if args.iter().any(|a| a == "--prefill") {
        // The prefill rows alone (a shorter call, next to
        // `hf_generate.py --only prefill`).
        // With `--ncu`, f32 only: 3 prefills between cuProfilerStart and
        // cuProfilerStop, for `ncu --profile-from-start off` (every kernel).
        let ncu = args.iter().any(|a| a == "--ncu");
        for dtype in [DType::F32, DType::BF16] {
            let model = Gpt2::new(&ctx, &format!("gpt2_{dtype}"), &config, dtype)?;
            let mut long_gen = model.generator(1, 1024)?;
            let p512 = prompt(512, 2);
            long_gen.generate(&[&p512], &GenerateOptions::greedy(1))?;
            if ncu {
                long_gen.generate(&[&p512], &GenerateOptions::greedy(1))?;
                // SAFETY: plain driver calls with no arguments.
                unsafe { cudarc::driver::sys::cuProfilerStart() };
                for _ in 0..3 {
                    long_gen.generate(&[&p512], &GenerateOptions::greedy(1))?;
                }
                // SAFETY: as above.
                unsafe { cudarc::driver::sys::cuProfilerStop() };
                return Ok(());
            }
            let prefill = time(20, || long_gen.generate(&[&p512], &GenerateOptions::greedy(1)).map(drop))?;
            println!("{dtype} prefill 512: {:.2} ms (with its first token)", prefill * 1e3);
        }
        return Ok(());
    }
    let bw = bandwidth(&ctx)?;
    println!("copy bandwidth: {:.0} GB/s", bw / 1e9);
    if args.iter().any(|a| a == "--profile") {
        return print_profile(&config, DType::F32, 16, 33);
    }
    if args.iter().any(|a| a == "--profile-bf16") {
        return print_profile(&config, DType::BF16, 16, 33);
    }
    if args.iter().any(|a| a == "--profile-prefill") {
        return print_profile(&config, DType::F32, 512, 1);
    }
    for dtype in [DType::F32, DType::BF16] {
        let made = Instant::now();
        let model = Gpt2::new(&ctx, &format!("gpt2_{dtype}"), &config, dtype)?;
        ctx.sync()?;
        let built = made.elapsed().as_secs_f64();
        let weights = weight_bytes(&model)?;
        let mut generator = model.generator(1, 128)?;
        let p16 = prompt(16, 1);
        let first = Instant::now();
        generator.generate(&[&p16], &GenerateOptions::greedy(2))?;
        let first = first.elapsed().as_secs_f64();
        let short = time(7, || generator.generate(&[&p16], &GenerateOptions::greedy(1)).map(drop))?;
        let before = ctx.stats();
        let long = time(7, || generator.generate(&[&p16], &GenerateOptions::greedy(112)).map(drop))?;
        let after = ctx.stats();
        let per = |a: u64, b: u64| (a - b) as f64 / (7.0 * 111.0);
        println!(
            "{dtype} per decode token: {:.2} graph replays, {:.2} graph input copies, {:.1} nodes executed, {:.2} compiles; live after decoding {:.0} MB",
            per(after.graph_replays, before.graph_replays),
            per(after.graph_input_copies, before.graph_input_copies),
            per(after.nodes_executed, before.nodes_executed),
            per(after.compiles, before.compiles),
            after.live_bytes as f64 / 1e6
        );
        let per_token = (long - short) / 111.0;
        let bound = weights as f64 / bw;
        println!(
            "{dtype} decode: {:.3} ms/token (weights {:.0} MB, bound {:.3} ms: {:.0}% of it); prefill 16 + 1 token {:.2} ms; first 2 tokens {:.2} s after a {:.2} s build",
            per_token * 1e3,
            weights as f64 / 1e6,
            bound * 1e3,
            100.0 * bound / per_token,
            short * 1e3,
            first,
            built
        );
        let stats = ctx.stats();
        println!(
            "{dtype} peak device memory {:.0} MB (weights {:.0} MB)",
            stats.peak_bytes as f64 / 1e6,
            weights as f64 / 1e6
        );
        let mut long_gen = model.generator(1, 1024)?;
        let p512 = prompt(512, 2);
        long_gen.generate(&[&p512], &GenerateOptions::greedy(1))?;
        let prefill = time(20, || long_gen.generate(&[&p512], &GenerateOptions::greedy(1)).map(drop))?;
        println!("{dtype} prefill 512: {:.2} ms (with its first token)", prefill * 1e3);
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(5 + i * 195 / 7, 10 + i as u64)).collect();
        let mut batch = model.generator(8, 512)?;
        batch.generate(&prompts, &GenerateOptions::greedy(2))?;
        let secs = time(5, || batch.generate(&prompts, &GenerateOptions::greedy(64)).map(drop))?;
        println!("{dtype} batch 8 (lengths 5-200) x 64 tokens: {:.0} tokens/s", 8.0 * 64.0 / secs);
        if dtype == DType::F32 {
            let before = ctx.stats().compiles;
            let mut gen = model.generator(4, 1024)?;
            let mut rng = 12345u64;
            for i in 0..1000 {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let len = 1 + (rng >> 33) as usize % 512;
                gen.generate(&[prompt(len, i)], &GenerateOptions::greedy(2))?;
            }
            println!("1000 prompts of lengths 1-512: {} plans compiled", ctx.stats().compiles - before);
        }
    }
    Ok(())
}
