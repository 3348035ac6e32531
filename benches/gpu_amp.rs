//! Mixed precision on the GPU (issue 22): kiln's side of the table that
//! `benches/torch_amp.py` completes (PyTorch `torch.autocast` +
//! `GradScaler` for f16, in eager, torch.compile and reduce-overhead), run
//! in the same device call.
//!
//! Rows: the MLP 784-1024x3-10 AdamW training step (cross-entropy) at
//! batch 512 and 4096, in f32, bf16 autocast and f16 autocast with the
//! dynamic loss scaler (`kiln::autocast::GradScaler`); with `--all`
//! also digits' CNN step at batch 256 and the 16 LN-MLP blocks' SGD step
//! (the other targets). Each row is one fresh context and one
//! captured step (`optim::TrainStep`), timed as a user's loop pays it:
//! CUDA events around the call and the read of the loss, the median of 50
//! calls after 5 warm-ups. Then the peak of device bytes the context held
//! (`Stats::peak_bytes`: parameters, optimizer state, the scaler, the
//! plan's arena; nothing else ran on it), and the same for a context that
//! records every step instead of replaying (`kiln` rows). TF32 is off.
//!
//!     cargo bench --features cuda --bench gpu_amp [-- --all] [substring]
//!     KILN_BENCH_OUT=kiln_amp.jsonl cargo bench ...   # also JSON lines
//!
//! Without a GPU it says so and exits 0 (`KILN_REQUIRE_CUDA=1`: 1).

use kiln::autocast::{GradScaler, ScalerConfig};
use kiln::nn::{self, Conv2d, Conv2dOptions, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig, TrainStep};
use kiln::prelude::*;
use std::io::Write;

#[path = "common/models.rs"]
mod models;

use models::{blocks, median, mlp, D};

/// A JSON number, or `null` for a NaN or infinity (JSON has neither).
fn json_number(v: f32) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

/// digits' CNN (examples/digits.rs, without dropout).
fn cnn(ctx: &Context) -> Result<Sequential> {
    let same = Conv2dOptions { padding: 1, ..Default::default() };
    Sequential::new(ctx, "cnn", |ctx| {
        Ok(vec![
            Conv2d::with_options(ctx, "0", 1, 16, 3, same)?.boxed(),
            ReLU.boxed(),
            MaxPool2d::new(2).boxed(),
            Conv2d::with_options(ctx, "3", 16, 32, 3, same)?.boxed(),
            ReLU.boxed(),
            MaxPool2d::new(2).boxed(),
            Flatten.boxed(),
            Linear::new(ctx, "8", 128, 10)?.boxed(),
        ])
    })
}

/// The precision of a row: f32, or autocast to bf16 or f16.
#[derive(Clone, Copy)]
enum Precision {
    F32,
    Bf16,
    F16,
}

impl Precision {
    fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16 autocast",
            Precision::F16 => "f16 autocast + GradScaler",
        }
    }

    fn context(self) -> Result<Context> {
        let ctx = Context::cuda(0)?.with_seed(1).with_tf32(false);
        Ok(match self {
            Precision::F32 => ctx,
            Precision::Bf16 => ctx.with_autocast(DType::BF16),
            Precision::F16 => ctx.with_autocast(DType::F16),
        })
    }

    /// The optimizer a row steps with: f16 wraps it in the loss scaler.
    fn optimizer<O: Optimizer + 'static>(self, ctx: &Context, opt: O) -> Result<Box<dyn Optimizer>> {
        Ok(match self {
            Precision::F16 => Box::new(GradScaler::new(ctx, opt, ScalerConfig::default())?),
            _ => Box::new(opt),
        })
    }
}

/// One training step, returning the loss to read.
type Step = Box<dyn FnMut() -> Result<Tensor>>;

/// Makes a step on a context, in a precision, captured or not.
type MakeStep = Box<dyn Fn(&Context, Precision, bool) -> Result<Step>>;

/// A workload: its name, and how to make one training step (returning
/// the loss) on a context, captured or recorded every call.
struct Workload {
    name: String,
    make: MakeStep,
}

/// Labels `i * 7 mod classes`, as torch_amp.py makes them.
fn labels(ctx: &Context, n: usize) -> Tensor {
    let l: Vec<i64> = (0..n).map(|i| (i * 7 % 10) as i64).collect();
    ctx.tensor(&l, [n])
}

/// A step of `model` on `loss(model(x), y)`, captured or not.
fn stepper(
    ctx: &Context,
    model: Sequential,
    mut opt: Box<dyn Optimizer>,
    x: Tensor,
    y: Tensor,
    loss: fn(&Tensor, &Tensor) -> Result<Tensor>,
    captured: bool,
) -> Result<Step> {
    ctx.realize(&[&x, &y])?;
    if captured {
        let mut step = TrainStep::new(ctx, opt, move |b: &[Tensor]| loss(&model.forward(&b[0])?, &b[1]));
        Ok(Box::new(move || step.call(&[&x, &y])))
    } else {
        Ok(Box::new(move || {
            let l = loss(&model.forward(&x)?, &y)?;
            opt.backward(&l)?;
            opt.step()?;
            opt.zero_grad()?;
            Ok(l)
        }))
    }
}

fn workloads(all: bool) -> Vec<Workload> {
    let mut w: Vec<Workload> = [512usize, 4096]
        .into_iter()
        .map(|batch| Workload {
            name: format!("train step: MLP 784-1024x3-10, AdamW, cross-entropy, batch {batch}"),
            make: Box::new(move |ctx, p, captured| {
                let model = mlp(ctx)?;
                let opt = p.optimizer(ctx, AdamW::new(&model, AdamConfig::adamw())?)?;
                let (x, y) = (ctx.randn([batch, 784]), labels(ctx, batch));
                stepper(ctx, model, opt, x, y, nn::cross_entropy, captured)
            }),
        })
        .collect();
    if all {
        w.push(Workload {
            name: "train step: digits CNN (conv16-conv32-linear), AdamW, cross-entropy, batch 256".into(),
            make: Box::new(|ctx, p, captured| {
                let model = cnn(ctx)?;
                let opt = p.optimizer(ctx, AdamW::new(&model, AdamConfig::adamw())?)?;
                let (x, y) = (ctx.randn([256, 1, 8, 8]), labels(ctx, 256));
                stepper(ctx, model, opt, x, y, nn::cross_entropy, captured)
            }),
        });
        w.push(Workload {
            name: "train step: 16 blocks x + fc2(gelu(fc1(layer_norm(x)))), SGD, MSE, x f32[64,256]".into(),
            make: Box::new(|ctx, p, captured| {
                let model = blocks(ctx)?;
                let opt =
                    p.optimizer(ctx, Sgd::new(&model, SgdConfig { lr: 1e-3, ..SgdConfig::default() })?)?;
                let (x, t) = (ctx.randn([64, D]), ctx.randn([64, D]));
                stepper(ctx, model, opt, x, t, nn::mse, captured)
            }),
        });
    }
    w
}

fn main() -> Result<()> {
    let probe = match Context::cuda(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("benches/gpu_amp: no CUDA device ({e})");
            let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            std::process::exit(if required { 1 } else { 0 });
        }
    };
    println!("device: {}", probe.device_description());
    drop(probe);
    let mut out = std::env::var("KILN_BENCH_OUT").ok().and_then(|p| std::fs::File::create(p).ok());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let all = args.iter().any(|a| a == "--all");
    let only = args.iter().find(|a| !a.starts_with('-')).cloned();
    println!(
        "{:<84} {:<28} {:>10} {:>10} {:>10}",
        "workload", "implementation", "median ms", "peak MiB", "first ms"
    );
    for w in workloads(all) {
        if only.as_deref().is_some_and(|o| !w.name.contains(o)) {
            continue;
        }
        for p in [Precision::F32, Precision::Bf16, Precision::F16] {
            for captured in [true, false] {
                let imp = format!("kiln{} {}", if captured { " captured" } else { "" }, p.name());
                let ctx = p.context()?;
                let mut step = (w.make)(&ctx, p, captured)?;
                ctx.sync()?;
                let t0 = std::time::Instant::now();
                let first_loss = step()?.item::<f32>()?;
                let first_ms = t0.elapsed().as_secs_f64() * 1e3;
                let mut timer =
                    ctx.device_timer()?.ok_or_else(|| Error::Backend("no device timer".into()))?;
                for _ in 0..5 {
                    step()?.item::<f32>()?;
                }
                let mut times = Vec::new();
                let mut last = 0.0;
                for _ in 0..50 {
                    timer.start()?;
                    last = step()?.item::<f32>()?;
                    times.push(timer.stop()?);
                }
                let ms = median(times);
                let s = ctx.stats();
                let peak = s.peak_bytes as f64 / (1 << 20) as f64;
                println!("{:<84} {imp:<28} {ms:>10.4} {peak:>10.1} {first_ms:>10.1}", w.name);
                println!(
                    "    loss {first_loss:.4} -> {last:.4} after 56 steps; {} compiles, {} graphs captured, {} input copies",
                    s.compiles, s.graph_captures, s.graph_input_copies
                );
                if let Some(f) = out.as_mut() {
                    let _ = writeln!(
                        f,
                        "{{\"impl\":\"{imp}\",\"workload\":\"{}\",\"median_ms\":{ms:.5},\"peak_mib\":{peak:.1},\"first_ms\":{first_ms:.1},\"loss_first\":{},\"loss_last\":{}}}",
                        w.name,
                        json_number(first_loss),
                        json_number(last)
                    );
                }
            }
        }
    }
    Ok(())
}
