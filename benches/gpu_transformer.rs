//! Issue 20's GPU targets, kiln's side (`benches/torch_transformer.py` is
//! PyTorch's, run in the same device call by `gpu_session.sh transformer`):
//!
//! - attention alone, `[32, 12, 512, 64]` and `[8, 16, 2048, 128]`: f16
//!   and bf16 with and without a causal mask (against SDPA's flash
//!   backend), f32 (against its efficient and math backends);
//! - attention's forward and backward together, the same shapes, f16 and
//!   bf16 (against SDPA's flash forward and backward, eager): the three
//!   gradients of `out` seeded with a fixed `g`;
//! - the MiniLM encoder (6 layers, 384 wide, 12 heads) at batch 64 × 128
//!   tokens, f32 and bf16, random weights of the real shapes;
//! - a BERT-base-sized encoder (12 layers, 768, 12 heads) at 32 × 128, bf16,
//!   and with f32 weights under `with_autocast(bf16)`;
//! - BERT-base's FFN up projection alone (`linear ...`): the product, with
//!   a bias, with a bias and the erf GELU, 8 layers a captured call.
//!
//! Each: the first call's wall time (a cold kernel cache when
//! `KILN_CACHE_DIR` is fresh), 5 warm-up calls, then the median of 50 calls
//! timed with CUDA events around the whole call (record, run, wait). TF32
//! is off unless `--tf32` (`Context::with_tf32`: f32 products on tf32
//! tensor cores, the bound a tensor-core f32 GEMM works under).
//! `KILN_BENCH_OUT=file.jsonl` also writes JSON lines.
//!
//!     cargo bench --features cuda --bench gpu_transformer [name filter]
//!
//! `--profile` also runs each workload 5 more times with kiln's profiler
//! on (every node timed by CUDA events, launched eagerly) and prints where
//! the device time goes, by op.
//!
//! `--captured` runs the encoders as captured steps (`Context::capture`:
//! the forward recorded once, then replayed without recording, as
//! torch.compile traces once); by default each call records the model's
//! ops again, as eager-looking code does.
//!
//! `--host` also splits 50 more calls on the host's clock: recording the
//! call (`call()`, the model's ops into a graph) and `realize` (the plan
//! found, launched, waited for), medians of each, next to the device
//! median: what of a call's time is not its kernels.
//!
//! Without a GPU it says so and exits 0 (with `KILN_REQUIRE_CUDA=1`, 1).

use kiln::nn::bert::{Bert, BertConfig};
use kiln::prelude::*;
use std::io::Write;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;

use models::median;

type Call = Box<dyn FnMut() -> Result<Tensor>>;
type Make = Box<dyn Fn(&Context) -> Result<Call>>;

struct Workload {
    name: String,
    /// FLOPs of one call (matmuls and attention's two products).
    flops: f64,
    make: Make,
}

/// Attention's `[batch, heads, seq, head dim]` shapes: BERT-base's and
/// GPT-2's (512 tokens, head dim 64), and a long-sequence one with
/// Llama's head dim (2048 tokens, 128), the two.
const SHAPES: [[usize; 4]; 2] = [[32, 12, 512, 64], [8, 16, 2048, 128]];

fn shape_name([b, h, s, d]: [usize; 4]) -> String {
    format!("[{b},{h},{s},{d}]")
}

fn attention(shape: [usize; 4], dtype: DType, causal: bool) -> Workload {
    let [b, h, s, d] = shape;
    // 4 b h s² d, halved by a causal mask.
    let flops = 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
    Workload {
        name: format!("attention {} {dtype}{}", shape_name(shape), if causal { " causal" } else { "" }),
        flops,
        make: Box::new(move |ctx| {
            let q = ctx.randn_dtype(shape, dtype);
            let k = ctx.randn_dtype(shape, dtype);
            let v = ctx.randn_dtype(shape, dtype);
            ctx.realize(&[&q, &k, &v])?;
            Ok(Box::new(move || Ok(q.scaled_dot_product_attention(&k, &v, None, causal, None))))
        }),
    }
}

/// Forward and backward: `dq, dk, dv` of `attention(q, k, v)` seeded with
/// `g` (`Tensor::backward_with`, as PyTorch's `out.backward(g)`).
fn attention_train(shape: [usize; 4], dtype: DType, causal: bool) -> Workload {
    let [b, h, s, d] = shape;
    // The forward's 4 b h s² d and the backward's 2.5 times that
    // (FlashAttention's count), halved by a causal mask.
    let flops = 3.5 * 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
    Workload {
        name: format!(
            "attention fwd+bwd {} {dtype}{}",
            shape_name(shape),
            if causal { " causal" } else { "" }
        ),
        flops,
        make: Box::new(move |ctx| {
            let q = ctx.variable("q", ctx.randn_dtype(shape, dtype))?;
            let k = ctx.variable("k", ctx.randn_dtype(shape, dtype))?;
            let v = ctx.variable("v", ctx.randn_dtype(shape, dtype))?;
            let g = ctx.randn_dtype(shape, dtype);
            ctx.realize(&[&*q, &*k, &*v, &g])?;
            let ctx = ctx.clone();
            Ok(Box::new(move || {
                ctx.zero_grad();
                let out = q.scaled_dot_product_attention(&k, &v, None, causal, None);
                let grads = out.backward_with(&g)?;
                let missing = || Error::Backend("attention's backward gave no gradient".into());
                let got: Vec<Tensor> = [&q, &k, &v]
                    .iter()
                    .map(|x| grads.get(x).cloned().ok_or_else(missing))
                    .collect::<Result<_>>()?;
                ctx.realize(&got.iter().collect::<Vec<_>>())?;
                Ok(got[0].clone())
            }))
        }),
    }
}

/// An encoder of `dtype` weights; under `autocast` (f32 weights) its
/// products run in that low type (`Context::with_autocast`).
fn encoder(
    label: &str,
    config: BertConfig,
    batch: usize,
    seq: usize,
    dtype: DType,
    autocast: Option<DType>,
) -> Workload {
    let (w, l, f) = (config.hidden_size, config.num_hidden_layers, config.intermediate_size);
    let tokens = (batch * seq) as f64;
    let flops =
        l as f64 * (2.0 * tokens * (4 * w * w + 2 * w * f) as f64 + 4.0 * (batch * seq * seq * w) as f64);
    let low = autocast.map(|d| format!(" autocast {d}")).unwrap_or_default();
    Workload {
        name: format!("{label} encoder {batch}x{seq} {dtype}{low}"),
        flops,
        make: Box::new(move |ctx| {
            if let Some(low) = autocast {
                let _ = ctx.clone().with_autocast(low);
            }
            let model = Bert::new(ctx, "bert", &config, dtype)?;
            let params = kiln::nn::Params::parameters(&model);
            ctx.realize(&params.iter().map(|v| &**v).collect::<Vec<&Tensor>>())?;
            let ids: Vec<i64> = (0..batch * seq).map(|i| (i * 7919 % config.vocab_size) as i64).collect();
            let ids = ctx.tensor(&ids, [batch, seq]);
            let mask = ctx.ones_dtype([batch, seq], DType::I64);
            ctx.realize(&[&ids, &mask])?;
            if !std::env::args().any(|a| a == "--captured") {
                return Ok(Box::new(move || model.forward(&ids, &mask)));
            }
            // Recorded once and replayed, as torch.compile traces once.
            let mut step = ctx.capture(move |args: &[Tensor]| Ok(vec![model.forward(&args[0], &args[1])?]));
            Ok(Box::new(move || Ok(step.call(&[&ids, &mask])?.remove(0))))
        }),
    }
}

/// BERT-base's FFN up projection on its own, `[4096, 768] x [3072, 768]ᵀ`
/// in bf16 (32 x 128 tokens), 8 independent layers a call (so that the
/// call's host work hides behind the products), captured: the product
/// alone, with cuBLASLt's bias epilogue, scaled (an epilogue of one
/// multiply: what the Hopper GEMM's products cost), and with the bias and the erf
/// GELU (the scaled and GELU rows run on the Hopper GEMM on sm_90;
/// `KILN_CUDA_WGMMA_GEMM=0` for cuBLAS and a separate kernel). Issue 36's target: the last at
/// least 90% of the first's speed.
fn linear(epilogue: &'static str) -> Workload {
    const LAYERS: usize = 8;
    let (m, k, n) = (4096, 768, 3072);
    Workload {
        name: format!("linear {epilogue} [4096,768]x[3072,768]^T x{LAYERS} bf16"),
        flops: (LAYERS * 2 * m * k * n) as f64,
        make: Box::new(move |ctx| {
            let dt = DType::BF16;
            let x = ctx.randn_dtype([m, k], dt);
            let ws: Vec<Tensor> = (0..LAYERS).map(|_| ctx.randn_dtype([n, k], dt) * 0.03).collect();
            let bs: Vec<Tensor> = (0..LAYERS).map(|_| ctx.randn_dtype([n], dt)).collect();
            let mut all: Vec<&Tensor> = vec![&x];
            all.extend(ws.iter().chain(&bs));
            ctx.realize(&all)?;
            let mut step = ctx.capture(move |args: &[Tensor]| {
                let x = &args[0];
                Ok((0..LAYERS)
                    .map(|l| {
                        let p = x.matmul(&ws[l].t());
                        match epilogue {
                            "alone" => p,
                            "bias" => p + &bs[l],
                            "scale" => p * 2.0,
                            _ => (p + &bs[l]).gelu(),
                        }
                    })
                    .collect())
            });
            Ok(Box::new(move || Ok(step.call(&[&x])?.remove(0))))
        }),
    }
}

fn workloads() -> Vec<Workload> {
    let mut out = Vec::new();
    for shape in SHAPES {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            for causal in [false, true] {
                out.push(attention(shape, dtype, causal));
            }
        }
        for dtype in [DType::F16, DType::BF16] {
            for causal in [false, true] {
                out.push(attention_train(shape, dtype, causal));
            }
        }
    }
    for epilogue in ["alone", "bias", "scale", "bias gelu"] {
        out.push(linear(epilogue));
    }
    out.push(encoder("MiniLM-L6", BertConfig::minilm_l6(), 64, 128, DType::F32, None));
    out.push(encoder("MiniLM-L6", BertConfig::minilm_l6(), 64, 128, DType::BF16, None));
    out.push(encoder("BERT-base", BertConfig::base(), 32, 128, DType::BF16, None));
    out.push(encoder("BERT-base", BertConfig::base(), 32, 128, DType::F32, Some(DType::BF16)));
    out
}

fn main() -> Result<()> {
    let ctx0 = match Context::cuda(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("benches/gpu_transformer: no CUDA device ({e})");
            let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            std::process::exit(if required { 1 } else { 0 });
        }
    };
    println!("device: {}", ctx0.device_description());
    drop(ctx0);
    let mut out = std::env::var("KILN_BENCH_OUT").ok().and_then(|p| std::fs::File::create(p).ok());
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let profile = std::env::args().any(|a| a == "--profile");
    let host = std::env::args().any(|a| a == "--host");
    let tf32 = std::env::args().any(|a| a == "--tf32");
    println!(
        "{:<48} {:>10} {:>10} {:>9} {:>8}",
        "workload (kiln)", "first ms", "median ms", "peak MiB", "TFLOP/s"
    );
    for w in workloads() {
        if only.as_deref().is_some_and(|o| !w.name.contains(o)) {
            continue;
        }
        let ctx = Context::cuda(0)?.with_seed(1).with_tf32(tf32);
        let mut call = (w.make)(&ctx)?;
        ctx.sync()?;
        let mut timer = ctx.device_timer()?.ok_or_else(|| Error::Backend("no device timer".into()))?;
        let t0 = Instant::now();
        call()?.realize()?;
        let first_ms = t0.elapsed().as_secs_f64() * 1e3;
        for _ in 0..5 {
            call()?.realize()?;
        }
        let mut times = Vec::new();
        for _ in 0..50 {
            timer.start()?;
            call()?.realize()?;
            times.push(timer.stop()?);
        }
        let ms = median(times);
        let s = ctx.stats();
        let peak = s.peak_bytes as f64 / (1 << 20) as f64;
        let tflops = w.flops / (ms * 1e-3) / 1e12;
        println!("{:<48} {first_ms:>10.1} {ms:>10.3} {peak:>9.0} {tflops:>8.1}", w.name);
        if s.gemm_shapes_timed > 0 {
            println!(
                "  GEMM tuning: {} shapes timed, {} guesses replaced",
                s.gemm_shapes_timed, s.gemm_guesses_replaced
            );
        }
        if let Some(f) = out.as_mut() {
            let _ = writeln!(
                f,
                "{{\"impl\":\"kiln\",\"workload\":\"{}\",\"first_ms\":{first_ms:.3},\"median_ms\":{ms:.4},\"peak_mib\":{peak:.1},\"tflops\":{tflops:.2},\"compiles\":{},\"kernels\":{}}}",
                w.name, s.compiles, s.kernel_compiles
            );
        }
        if host {
            let (mut record, mut run) = (Vec::new(), Vec::new());
            for _ in 0..50 {
                let t0 = Instant::now();
                let y = call()?;
                let t1 = Instant::now();
                y.realize()?;
                record.push((t1 - t0).as_secs_f64() * 1e3);
                run.push(t1.elapsed().as_secs_f64() * 1e3);
            }
            let (record, run) = (median(record), median(run));
            println!(
                "  host: record {record:.3} ms, realize {run:.3} ms (sum {:.3}; device median {ms:.3})",
                record + run
            );
        }
        if profile {
            print_profile(&w, tf32)?;
        }
    }
    Ok(())
}

/// Where one call's device time goes, by op, over 5 profiled calls.
fn print_profile(w: &Workload, tf32: bool) -> Result<()> {
    let ctx = Context::cuda(0)?.with_seed(1).with_profiling(true).with_tf32(tf32);
    let mut call = (w.make)(&ctx)?;
    call()?.realize()?;
    ctx.reset_profile();
    for _ in 0..5 {
        call()?.realize()?;
    }
    let p = ctx.profile();
    let runs = p.runs.len().max(1) as f64;
    println!("  profile of {} ({} runs): wall {:.3} ms per call", w.name, p.runs.len(), p.wall_ms() / runs);
    for r in p.by_op().iter().take(12) {
        println!(
            "    {:<40} {:>5} per call {:>9.3} ms per call {:>5.1}%",
            r.key,
            r.calls as f64 / runs,
            r.total_ms / runs,
            100.0 * r.share
        );
    }
    Ok(())
}
