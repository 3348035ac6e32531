//! The GPU harness: kiln's side of the table that `benches/torch_baseline.py`
//! completes (PyTorch eager, torch.compile, torch.compile with
//! mode="reduce-overhead"), run in the same device call.
//!
//! For each workload: the first call's wall time (compile included), then
//! 5 warm-up calls, then the median of 50 calls each timed with CUDA
//! events around the whole call (recording the graph and reading the
//! result: what a user's loop pays), the peak of device bytes kiln held,
//! and the achieved GB/s (the fewest bytes the workload must move) or
//! TFLOP/s for the matmul. TF32 is off.
//!
//! Training steps (the MLP 784-1024x3-10 AdamW step at batch 512, the 16
//! LN-MLP blocks as an SGD step on an MSE loss) are timed the same way:
//! one call is forward, backward, the optimizer's update and reading the
//! loss, as a user's loop pays it.
//!
//!     cargo bench --features cuda --bench gpu            # prints a table
//!     KILN_BENCH_OUT=kiln.jsonl cargo bench ...          # also JSON lines
//!
//! Without a GPU it says so and exits 0 (with `KILN_REQUIRE_CUDA=1`, 1).

use kiln::nn::{self, LayerNorm, Linear, Module, ReLU, Residual, Sequential, GELU};
use kiln::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;
use std::io::Write;
use std::time::Instant;

/// One workload: how to build its inputs (realized once) and one call.
struct Workload {
    name: &'static str,
    /// Bytes a perfect implementation moves (inputs read once, outputs
    /// written once), or 0 for a compute-bound workload.
    bytes: f64,
    /// FLOPs, for the matmul.
    flops: f64,
    setup: fn(&Context) -> Result<Vec<Tensor>>,
    call: fn(&[Tensor]) -> Tensor,
}

fn realized(ts: Vec<Tensor>) -> Result<Vec<Tensor>> {
    for t in &ts {
        t.realize()?;
    }
    Ok(ts)
}

const N_ELEM: usize = 1 << 26;
const ROWS: usize = 8192;
const COLS: usize = 4096;
const D: usize = 256;
const HIDDEN: usize = 1024;
const BLOCKS: usize = 16;

fn workloads() -> Vec<Workload> {
    vec![
        Workload {
            name: "elementwise tanh(x*1.5+0.5)*sigmoid(x)+x*x, f32[2^26]",
            bytes: 2.0 * 4.0 * N_ELEM as f64,
            flops: 0.0,
            setup: |ctx| realized(vec![ctx.randn([N_ELEM])]),
            call: |t| (&t[0] * 1.5 + 0.5).tanh() * t[0].sigmoid() + &t[0] * &t[0],
        },
        Workload {
            name: "softmax, last dim of f32[8192,4096]",
            bytes: 2.0 * 4.0 * (ROWS * COLS) as f64,
            flops: 0.0,
            setup: |ctx| realized(vec![ctx.randn([ROWS, COLS])]),
            call: |t| t[0].softmax(1),
        },
        Workload {
            name: "layer norm (weight, bias), f32[8192,4096]",
            bytes: 2.0 * 4.0 * (ROWS * COLS) as f64,
            flops: 0.0,
            setup: |ctx| realized(vec![ctx.randn([ROWS, COLS]), ctx.randn([COLS]), ctx.randn([COLS])]),
            call: |t| t[0].layer_norm(&t[1], &t[2], 1e-5),
        },
        Workload {
            name: "16 blocks x + fc2(gelu(fc1(layer_norm(x)))), d=256, hidden 1024, x f32[64,256]",
            bytes: 4.0 * (BLOCKS * (2 * D * HIDDEN + HIDDEN + 3 * D) + 2 * 64 * D) as f64,
            flops: 0.0,
            setup: |ctx| {
                let mut ts = vec![ctx.randn([64, D])];
                for _ in 0..BLOCKS {
                    ts.push(ctx.ones([D]));
                    ts.push(ctx.zeros([D]));
                    ts.push(ctx.randn([D, HIDDEN]) * (1.0 / (D as f64).sqrt()));
                    ts.push(ctx.randn([HIDDEN]) * 0.01);
                    ts.push(ctx.randn([HIDDEN, D]) * (1.0 / (HIDDEN as f64).sqrt()));
                    ts.push(ctx.randn([D]) * 0.01);
                }
                realized(ts)
            },
            call: |t| {
                let mut x = t[0].clone();
                for b in t[1..].chunks(6) {
                    let h = (x.layer_norm(&b[0], &b[1], 1e-5).matmul(&b[2]) + &b[3]).gelu();
                    x = &x + (h.matmul(&b[4]) + &b[5]);
                }
                x
            },
        },
        Workload {
            name: "conv block relu(x + conv2(relu(conv1(x)))), 3x3, 64 ch, x f32[32,64,56,56]",
            bytes: 4.0 * (2 * 32 * 64 * 56 * 56 + 2 * 64 * 64 * 9) as f64,
            flops: 0.0,
            setup: |ctx| {
                realized(vec![
                    ctx.randn([32, 64, 56, 56]),
                    ctx.randn([64, 64, 3, 3]) * 0.05,
                    ctx.randn([64, 64, 3, 3]) * 0.05,
                ])
            },
            call: |t| (&t[0] + t[0].conv2d(&t[1], 1, 1, 1, 1).relu().conv2d(&t[2], 1, 1, 1, 1)).relu(),
        },
        Workload {
            name: "matmul 8192^3 bf16",
            bytes: 0.0,
            flops: 2.0 * 8192f64.powi(3),
            setup: |ctx| {
                realized(vec![
                    ctx.randn_dtype([8192, 8192], DType::BF16),
                    ctx.randn_dtype([8192, 8192], DType::BF16),
                ])
            },
            call: |t| t[0].matmul(&t[1]),
        },
    ]
}

/// One step of a training loop: returns the loss to read.
type Step = Box<dyn FnMut() -> Result<Tensor>>;

/// A training step: made once per context, then called repeatedly (each
/// call one step, returning the loss to read).
struct TrainStep {
    name: &'static str,
    make: fn(&Context) -> Result<Step>,
}

fn train_steps() -> Vec<TrainStep> {
    vec![
        TrainStep {
            name: "train step: MLP 784-1024x3-10, AdamW, cross-entropy, batch 512",
            make: |ctx| {
                let model = Sequential::new(ctx, "mlp", |ctx| {
                    Ok(vec![
                        Linear::new(ctx, "0", 784, 1024)?.boxed(),
                        ReLU.boxed(),
                        Linear::new(ctx, "2", 1024, 1024)?.boxed(),
                        ReLU.boxed(),
                        Linear::new(ctx, "4", 1024, 1024)?.boxed(),
                        ReLU.boxed(),
                        Linear::new(ctx, "6", 1024, 10)?.boxed(),
                    ])
                })?;
                let mut opt = AdamW::new(&model, AdamConfig::adamw())?;
                let x = ctx.randn([512, 784]);
                let labels: Vec<i64> = (0..512).map(|i| (i * 7 % 10) as i64).collect();
                let y = ctx.tensor(&labels, [512]);
                ctx.realize(&[&x, &y])?;
                Ok(Box::new(move || {
                    let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
                    loss.backward()?;
                    opt.step()?;
                    opt.zero_grad()?;
                    Ok(loss)
                }))
            },
        },
        TrainStep {
            name: "train step: 16 blocks x + fc2(gelu(fc1(layer_norm(x)))), SGD, MSE, x f32[64,256]",
            make: |ctx| {
                let model = Sequential::new(ctx, "blocks", |ctx| {
                    (0..BLOCKS)
                        .map(|b| {
                            let block = Sequential::new(ctx, &format!("{b}"), |ctx| {
                                Ok(vec![
                                    LayerNorm::new(ctx, "ln", D)?.boxed(),
                                    Linear::new(ctx, "fc1", D, HIDDEN)?.boxed(),
                                    GELU.boxed(),
                                    Linear::new(ctx, "fc2", HIDDEN, D)?.boxed(),
                                ])
                            })?;
                            Ok(Residual::new(block).boxed())
                        })
                        .collect()
                })?;
                let mut opt = Sgd::new(&model, SgdConfig { lr: 1e-3, ..SgdConfig::default() })?;
                let x = ctx.randn([64, D]);
                let target = ctx.randn([64, D]);
                ctx.realize(&[&x, &target])?;
                Ok(Box::new(move || {
                    let loss = nn::mse(&model.forward(&x)?, &target)?;
                    loss.backward()?;
                    opt.step()?;
                    opt.zero_grad()?;
                    Ok(loss)
                }))
            },
        },
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let ctx0 = match Context::cuda(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("benches/gpu: no CUDA device ({e})");
            let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            std::process::exit(if required { 1 } else { 0 });
        }
    };
    println!("device: {}", ctx0.device_description());
    drop(ctx0);
    let mut out = std::env::var("KILN_BENCH_OUT").ok().and_then(|p| std::fs::File::create(p).ok());
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    println!(
        "{:<82} {:>11} {:>10} {:>10} {:>10} {:>8}",
        "workload (kiln)", "first ms", "median ms", "peak MiB", "GB/s", "TFLOP/s"
    );
    for w in workloads() {
        if only.as_deref().is_some_and(|o| !w.name.contains(o)) {
            continue;
        }
        let ctx = Context::cuda(0)?.with_seed(1);
        let inputs = (w.setup)(&ctx)?;
        let mut timer = ctx.device_timer()?.expect("a CUDA context has a device timer");
        let t0 = Instant::now();
        (w.call)(&inputs).realize()?;
        let first_ms = t0.elapsed().as_secs_f64() * 1e3;
        for _ in 0..5 {
            (w.call)(&inputs).realize()?;
        }
        let mut times = Vec::new();
        for _ in 0..50 {
            timer.start()?;
            let y = (w.call)(&inputs);
            y.realize()?;
            times.push(timer.stop()?);
        }
        let ms = median(times);
        let peak = ctx.stats().peak_bytes as f64 / (1 << 20) as f64;
        let gbs = if w.bytes > 0.0 { w.bytes / (ms * 1e-3) / 1e9 } else { 0.0 };
        let tflops = if w.flops > 0.0 { w.flops / (ms * 1e-3) / 1e12 } else { 0.0 };
        println!("{:<82} {first_ms:>11.2} {ms:>10.3} {peak:>10.1} {gbs:>10.1} {tflops:>8.1}", w.name);
        let s = ctx.stats();
        if let Some(f) = out.as_mut() {
            let _ = writeln!(
                f,
                "{{\"impl\":\"kiln\",\"workload\":\"{}\",\"first_ms\":{first_ms:.3},\"median_ms\":{ms:.4},\"peak_mib\":{peak:.1},\"gbs\":{gbs:.1},\"tflops\":{tflops:.1},\"compiles\":{},\"kernels\":{},\"compile_ms\":{:.1},\"nvrtc_ms\":{:.1}}}",
                w.name,
                s.compiles,
                s.kernel_compiles,
                s.compile_time.as_secs_f64() * 1e3,
                s.kernel_compile_time.as_secs_f64() * 1e3
            );
        }
    }
    for w in train_steps() {
        if only.as_deref().is_some_and(|o| !w.name.contains(o)) {
            continue;
        }
        let ctx = Context::cuda(0)?.with_seed(1);
        let mut step = (w.make)(&ctx)?;
        ctx.sync()?;
        let mut timer = ctx.device_timer()?.expect("a CUDA context has a device timer");
        let t0 = Instant::now();
        step()?.item::<f32>()?;
        let first_ms = t0.elapsed().as_secs_f64() * 1e3;
        for _ in 0..5 {
            step()?.item::<f32>()?;
        }
        let mut times = Vec::new();
        for _ in 0..50 {
            timer.start()?;
            step()?.item::<f32>()?;
            times.push(timer.stop()?);
        }
        let ms = median(times);
        let s = ctx.stats();
        let peak = s.peak_bytes as f64 / (1 << 20) as f64;
        println!("{:<82} {first_ms:>11.2} {ms:>10.3} {peak:>10.1} {:>10} {:>8}", w.name, "-", "-");
        println!(
            "    {} compiles, {} cache hits, {} graphs captured, {} replays, {} input copies",
            s.compiles, s.cache_hits, s.graph_captures, s.graph_replays, s.graph_input_copies
        );
        if let Some(f) = out.as_mut() {
            let _ = writeln!(
                f,
                "{{\"impl\":\"kiln\",\"workload\":\"{}\",\"first_ms\":{first_ms:.3},\"median_ms\":{ms:.4},\"peak_mib\":{peak:.1},\"gbs\":0,\"tflops\":0,\"compiles\":{},\"kernels\":{},\"compile_ms\":{:.1},\"nvrtc_ms\":{:.1}}}",
                w.name,
                s.compiles,
                s.kernel_compiles,
                s.compile_time.as_secs_f64() * 1e3,
                s.kernel_compile_time.as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}
