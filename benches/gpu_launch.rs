//! The launch-bound rows of the GPU table (issue 18): where the host and
//! launches dominate, each uncaptured (recorded every call) and captured
//! (`Context::capture` / `optim::TrainStep`: recorded once, replayed).
//! `benches/torch_baseline.py --launch` is PyTorch's side, in the same call.
//!
//! - an N-op elementwise chain on f32[1] (N = 4, 40, 400, 4000), one call
//!   at a time: each call reads its result (`item`), wall time per call;
//! - 16 LN-MLP blocks (d=256, hidden 1024, x f32[64,256]), inference;
//! - the MLP 784-1024x3-10 AdamW step at batch 512 and the 16 blocks as
//!   an SGD step on an MSE loss, each call reading the loss;
//! - 100 uncaptured training steps reading the loss every 10th: wall time
//!   next to host time (the steps' calls with nothing waiting: 128 runs
//!   may be in flight) and device time (each step alone, CUDA events).
//! - host copies: the host time of uploading an f32[512,784] batch while
//!   a ~5 ms plan runs, next to the same upload on an idle device; and a
//!   data loader's loop (100 captured AdamW steps, each on a batch
//!   uploaded from host memory that call, the loss read every 10th) next
//!   to the same steps on a batch already on the device.
//!
//! Medians of 50 calls after 5 warm-ups; CUDA events around each call for
//! the model rows (what the device spends from the first launch to the
//! read, host gaps included), host wall time for the chain.
//!
//!     cargo bench --features cuda --bench gpu_launch
//!     KILN_BENCH_OUT=kiln.jsonl cargo bench ...   # also JSON lines
//!     ncu --profile-from-start off --metrics gpu__time_duration.sum \
//!         target/.../gpu_launch --ncu plain "SGD, MSE"  # every kernel's time
//!
//! `--ncu plain|captured` runs the model rows' calls of one kind for ncu
//! (see [`ncu_calls`]): where the device time of a launch-bound row goes,
//! kernel by kernel. `Context::with_profiling` is not used for that: its
//! CUDA events sit between launches, and when the host is what the device
//! waits for, an event pair times the launch latency too (measured: the 32
//! GEMMs of the 16-block inference timed 0.76 ms by events, inside calls
//! that take 0.36 ms captured).
//!
//! Without a GPU it says so and exits 0 (`KILN_REQUIRE_CUDA=1`: 1).

use kiln::nn::{self, Module};
use kiln::optim::{AdamConfig, AdamW, Sgd, SgdConfig, TrainStep};
use kiln::prelude::*;
use std::io::Write;
use std::time::Instant;

#[path = "common/models.rs"]
mod models;

use models::{blocks, median, mlp, D};

/// One output row (and its JSON line).
fn row(out: &mut Option<std::fs::File>, workload: &str, imp: &str, ms: f64, extra: &str) {
    println!("{workload:<78} {imp:<22} {ms:>10.4} ms {extra}");
    if let Some(f) = out.as_mut() {
        let _ = writeln!(
            f,
            "{{\"impl\":\"{imp}\",\"workload\":\"{workload}\",\"median_ms\":{ms:.5},\"note\":\"{extra}\"}}"
        );
    }
}

fn chain(x: &Tensor, n: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..n {
        y = match i % 4 {
            0 => &y * 1.0001,
            1 => &y + 0.001,
            2 => y.sin(),
            _ => &y - 0.0005,
        };
    }
    y
}

/// Wall milliseconds per call of `f`, median of 50 after 5 warm-ups.
fn wall(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..5 {
        f()?;
    }
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(times))
}

/// Device-timed milliseconds per call (CUDA events around the call).
fn events(ctx: &Context, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut timer = ctx.device_timer()?.ok_or_else(|| Error::Backend("no device timer".into()))?;
    for _ in 0..5 {
        f()?;
    }
    let mut times = Vec::new();
    for _ in 0..50 {
        timer.start()?;
        f()?;
        times.push(timer.stop()?);
    }
    Ok(median(times))
}

/// `--ncu plain|captured`: the model rows run 3 calls of one kind between
/// `cuProfilerStart` and `cuProfilerStop` (after 3 warm-ups), untimed, for
/// `ncu --profile-from-start off` to time every kernel of those calls.
fn ncu_calls(mut f: impl FnMut() -> Result<()>) -> Result<()> {
    for _ in 0..3 {
        f()?;
    }
    // SAFETY: plain driver calls with no arguments; profiling brackets
    // whatever the process does between them.
    unsafe { cudarc::driver::sys::cuProfilerStart() };
    for _ in 0..3 {
        f()?;
    }
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::cuProfilerStop() };
    Ok(())
}

fn main() -> Result<()> {
    let probe = match Context::cuda(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("benches/gpu_launch: no CUDA device ({e})");
            let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
            std::process::exit(if required { 1 } else { 0 });
        }
    };
    println!("device: {}", probe.device_description());
    drop(probe);
    let mut out = std::env::var("KILN_BENCH_OUT").ok().and_then(|p| std::fs::File::create(p).ok());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ncu = args.iter().position(|a| a == "--ncu").and_then(|k| args.get(k + 1)).cloned();
    let only = args
        .iter()
        .enumerate()
        .find(|(k, a)| !a.starts_with('-') && (*k == 0 || args[k - 1] != "--ncu"))
        .map(|(_, a)| a.clone());
    let ncu_captured = ncu.as_deref() == Some("captured");
    let wants = |w: &str| only.as_deref().is_none_or(|o| w.contains(o));

    for n in [4usize, 40, 400, 4000] {
        let name = format!("chain of {n} elementwise ops on f32[1], one call at a time");
        if !wants(&name) {
            continue;
        }
        if ncu.is_some() {
            continue;
        }
        let ctx = Context::cuda(0)?;
        let x = ctx.tensor(&[0.5f32], [1]);
        let ms = wall(|| chain(&x, n).item::<f32>().map(|_| ()))?;
        row(&mut out, &name, "kiln", ms, "recorded every call");
        let mut step = ctx.capture(|a: &[Tensor]| Ok(vec![chain(&a[0], n)]));
        let ms = wall(|| step.call(&[&x])?[0].item::<f32>().map(|_| ()))?;
        row(&mut out, &name, "kiln captured", ms, "");
    }

    let name = "16 blocks x + fc2(gelu(fc1(layer_norm(x)))), d=256, hidden 1024, x f32[64,256]";
    if wants(name) {
        let ctx = Context::cuda(0)?.with_seed(1);
        let model = blocks(&ctx)?;
        let x = ctx.randn([64, D]);
        ctx.realize(&[&x])?;
        ctx.sync()?;
        if ncu.is_some() {
            let mut step = ctx.capture(|a: &[Tensor]| Ok(vec![model.forward(&a[0])?]));
            ncu_calls(|| match ncu_captured {
                true => step.call(&[&x])?[0].realize().map(|_| ()),
                false => model.forward(&x)?.realize().map(|_| ()),
            })?;
            return Ok(());
        }
        let ms = events(&ctx, || model.forward(&x)?.realize().map(|_| ()))?;
        row(&mut out, name, "kiln", ms, "");
        let mut step = ctx.capture(|a: &[Tensor]| Ok(vec![model.forward(&a[0])?]));
        let ms = events(&ctx, || step.call(&[&x])?[0].realize().map(|_| ()))?;
        let s = ctx.stats();
        row(&mut out, name, "kiln captured", ms, &format!("{} input copies", s.graph_input_copies));
    }

    type Make =
        fn(&Context) -> Result<(Box<dyn FnMut() -> Result<Tensor>>, Box<dyn FnMut() -> Result<Tensor>>)>;
    let steps: Vec<(&str, Make)> = vec![
        ("train step: MLP 784-1024x3-10, AdamW, cross-entropy, batch 512", |ctx| {
            let model = std::sync::Arc::new(mlp(ctx)?);
            let x = ctx.randn([512, 784]);
            let labels: Vec<i64> = (0..512).map(|i| (i * 7 % 10) as i64).collect();
            let y = ctx.tensor(&labels, [512]);
            ctx.realize(&[&x, &y])?;
            let mut opt = AdamW::new(&*model, AdamConfig::adamw())?;
            let (m1, x1, y1) = (model.clone(), x.clone(), y.clone());
            let plain = move || -> Result<Tensor> {
                let loss = nn::cross_entropy(&m1.forward(&x1)?, &y1)?;
                loss.backward()?;
                kiln::optim::Optimizer::step(&mut opt)?;
                kiln::optim::Optimizer::zero_grad(&opt)?;
                Ok(loss)
            };
            let opt2 = AdamW::new(&*model, AdamConfig::adamw())?;
            let m2 = model.clone();
            let mut step =
                TrainStep::new(ctx, opt2, move |b: &[Tensor]| nn::cross_entropy(&m2.forward(&b[0])?, &b[1]));
            let captured = move || step.call(&[&x, &y]);
            Ok((Box::new(plain), Box::new(captured)))
        }),
        ("train step: 16 blocks x + fc2(gelu(fc1(layer_norm(x)))), SGD, MSE, x f32[64,256]", |ctx| {
            let model = std::sync::Arc::new(blocks(ctx)?);
            let x = ctx.randn([64, D]);
            let target = ctx.randn([64, D]);
            ctx.realize(&[&x, &target])?;
            let cfg = SgdConfig { lr: 1e-3, ..SgdConfig::default() };
            let mut opt = Sgd::new(&*model, cfg)?;
            let (m1, x1, t1) = (model.clone(), x.clone(), target.clone());
            let plain = move || -> Result<Tensor> {
                let loss = nn::mse(&m1.forward(&x1)?, &t1)?;
                loss.backward()?;
                kiln::optim::Optimizer::step(&mut opt)?;
                kiln::optim::Optimizer::zero_grad(&opt)?;
                Ok(loss)
            };
            let m2 = model.clone();
            let mut step = TrainStep::new(ctx, Sgd::new(&*model, cfg)?, move |b: &[Tensor]| {
                nn::mse(&m2.forward(&b[0])?, &b[1])
            });
            let captured = move || step.call(&[&x, &target]);
            Ok((Box::new(plain), Box::new(captured)))
        }),
    ];
    for (name, make) in steps {
        if !wants(name) {
            continue;
        }
        let ctx = Context::cuda(0)?.with_seed(1);
        let (mut plain, mut captured) = make(&ctx)?;
        ctx.sync()?;
        if ncu.is_some() {
            return ncu_calls(|| match ncu_captured {
                true => captured()?.item::<f32>().map(|_| ()),
                false => plain()?.item::<f32>().map(|_| ()),
            });
        }
        let ms = events(&ctx, || plain()?.item::<f32>().map(|_| ()))?;
        row(&mut out, name, "kiln", ms, "");
        let before = ctx.stats().graph_input_copies;
        let ms = events(&ctx, || captured()?.item::<f32>().map(|_| ()))?;
        let copies = (ctx.stats().graph_input_copies - before) as f64 / 55.0;
        row(&mut out, name, "kiln captured", ms, &format!("{copies:.0} input copies per step"));

        // 100 uncaptured steps reading the loss every 10th: wall vs host vs device.
        let loop_name = format!("100 steps, loss read every 10th: {}", &name[12..]);
        let mut device = 0.0;
        let mut timer = ctx.device_timer()?.ok_or_else(|| Error::Backend("no device timer".into()))?;
        for _ in 0..100 {
            timer.start()?;
            plain()?.realize()?;
            device += timer.stop()?;
        }
        let free = ctx.clone().with_max_in_flight(128);
        let mut host = 0.0;
        for _ in 0..100 {
            let t = Instant::now();
            let loss = plain()?;
            free.realize(&[&loss])?;
            host += t.elapsed().as_secs_f64() * 1e3;
        }
        free.sync()?;
        let bounded = ctx.clone().with_max_in_flight(2);
        let t = Instant::now();
        for i in 0..100 {
            let loss = plain()?;
            if i % 10 == 9 {
                loss.item::<f32>()?;
            } else {
                bounded.realize(&[&loss])?;
            }
        }
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        let ratio = wall_ms / host.max(device);
        row(
            &mut out,
            &loop_name,
            "kiln",
            wall_ms,
            &format!("host {host:.2} ms, device {device:.2} ms, wall/max {ratio:.2}"),
        );
    }

    let name = "upload f32[512,784] from host memory while a 5 ms plan runs: host time of the call";
    if wants(name) {
        let ctx = Context::cuda(0)?.with_seed(1);
        let a = ctx.randn([2048, 2048]);
        ctx.realize(&[&a])?;
        let batch = vec![0.25f32; 512 * 784];
        let long = || {
            let mut h = a.clone();
            for _ in 0..16 {
                h = h.matmul(&a) * 1e-3;
            }
            h
        };
        long().realize()?;
        ctx.sync()?;
        let idle = wall(|| ctx.tensor(&batch, [512, 784]).realize().map(|_| ()))?;
        ctx.sync()?;
        let mut times = Vec::new();
        for _ in 0..50 {
            let running = long();
            running.realize()?;
            let t = Instant::now();
            let x = ctx.tensor(&batch, [512, 784]);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            ctx.sync()?;
            drop((x, running));
        }
        let busy = median(times);
        let plan = events(&ctx, || long().realize().map(|_| ()))?;
        row(&mut out, name, "kiln", busy, &format!("idle device {idle:.4} ms, the plan {plan:.2} ms"));
    }

    let name = "data loader loop: 100 captured AdamW steps (MLP, batch 512), a batch uploaded each step";
    if wants(name) {
        let ctx = Context::cuda(0)?.with_seed(1);
        let model = std::sync::Arc::new(mlp(&ctx)?);
        let labels: Vec<i64> = (0..512).map(|i| (i * 7 % 10) as i64).collect();
        let y = ctx.tensor(&labels, [512]);
        let batches: Vec<Vec<f32>> = (0..4)
            .map(|k| (0..512 * 784).map(|i| ((i * 31 + k * 17) % 255) as f32 / 255.0).collect())
            .collect();
        let m = model.clone();
        let mut step =
            TrainStep::new(&ctx, AdamW::new(&*model, AdamConfig::adamw())?, move |b: &[Tensor]| {
                nn::cross_entropy(&m.forward(&b[0])?, &b[1])
            });
        let resident = ctx.tensor(&batches[0], [512, 784]);
        for _ in 0..5 {
            step.call(&[&resident, &y])?.item::<f32>()?;
        }
        let mut loop_of = |upload: bool| -> Result<f64> {
            let t = Instant::now();
            for i in 0..100 {
                let x = if upload { ctx.tensor(&batches[i % 4], [512, 784]) } else { resident.clone() };
                let loss = step.call(&[&x, &y])?;
                if i % 10 == 9 {
                    loss.item::<f32>()?;
                }
            }
            ctx.sync()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        let mut with = Vec::new();
        let mut without = Vec::new();
        for _ in 0..5 {
            with.push(loop_of(true)?);
            without.push(loop_of(false)?);
        }
        let (with, without) = (median(with), median(without));
        let extra = format!("batch already on the device {without:.2} ms, ratio {:.3}", with / without);
        row(&mut out, name, "kiln", with, &extra);
    }
    Ok(())
}
