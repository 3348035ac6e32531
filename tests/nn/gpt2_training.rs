//! Training GPT-2 (`benches/gpu_train_gpt.rs`'s workload, at toy sizes):
//! the fixture model's losses over 10 AdamW steps are PyTorch's
//! (`gpt2_training_reference.py`), on every device; a captured AdamW
//! `TrainStep` gives the losses and parameters of the same steps taken
//! one op at a time (backward, step, zero_grad), and the loss falls. On
//! CUDA the captured step replays its graph with no input copies once
//! captured.

use crate::gpt2::{devices, fixture};
use crate::gpt2_training_reference as reference;
use kiln::nn::gpt2::{Activation, Gpt2, Gpt2Config};
use kiln::nn::{self, Params};
use kiln::optim::{AdamConfig, AdamW, Optimizer, TrainStep};
use kiln::prelude::*;

use crate::splitmix;

const BATCH: usize = 3;
const SEQ: usize = 8;
const VOCAB: usize = 40;

fn config() -> Gpt2Config {
    Gpt2Config {
        vocab_size: VOCAB,
        n_positions: SEQ,
        n_embd: 32,
        n_layer: 2,
        n_head: 2,
        n_inner: 64,
        layer_norm_epsilon: 1e-5,
        activation: Activation::GeluTanh,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
    }
}

/// Token ids below `VOCAB`, a fixed pattern per seed.
fn tokens(ctx: &Context, seed: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<i64> = (0..n).map(|i| ((i * 7 + seed * 13 + i * i % 5) % VOCAB) as i64).collect();
    ctx.tensor(&v, shape)
}

fn loss(model: &Gpt2, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
    nn::cross_entropy(&model.forward(ids, None)?.reshape([BATCH * SEQ, VOCAB]), targets)
}

/// Every parameter's values, in `Params` order.
fn parameters(model: &Gpt2) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    model.visit(&mut |v| out.push(v.to_vec::<f32>().unwrap()));
    out
}

/// 12 steps of a fresh model, captured or op by op: losses, parameters,
/// and the graph input copies of the last 8 steps.
fn train(ctx: &Context, captured: bool) -> Result<(Vec<f32>, Vec<Vec<f32>>, u64)> {
    let model = Gpt2::new(ctx, "gpt", &config(), DType::F32)?;
    let opt = AdamW::new(&model, AdamConfig { lr: 3e-3, ..AdamConfig::adamw() })?;
    let ids = tokens(ctx, 1, &[BATCH, SEQ]);
    let targets = tokens(ctx, 2, &[BATCH * SEQ]);
    let (mut losses, mut copies) = (Vec::new(), 0);
    if captured {
        let mut step = TrainStep::new(ctx, opt, |b: &[Tensor]| loss(&model, &b[0], &b[1]));
        for _ in 0..12 {
            if losses.len() == 4 {
                copies = ctx.stats().graph_input_copies;
            }
            losses.push(step.call(&[&ids, &targets])?.item::<f32>()?);
        }
    } else {
        let mut opt = opt;
        for _ in 0..12 {
            let l = loss(&model, &ids, &targets)?;
            opt.backward(&l)?;
            opt.step()?;
            opt.zero_grad()?;
            losses.push(l.item::<f32>()?);
        }
    }
    Ok((losses, parameters(&model), ctx.stats().graph_input_copies - copies))
}

#[test]
fn a_captured_gpt2_adamw_step_equals_the_step_op_by_op_and_the_loss_falls() -> Result<()> {
    for (device, make) in devices() {
        // The emulator runs each CUDA thread as a host thread: two minutes
        // here, so CI leaves its captured steps to tests/runtime.
        if device == "cuda-emulated" {
            continue;
        }
        let (ctx_a, ctx_b) = (make().with_seed(5), make().with_seed(5));
        let (want_losses, want_params, _) = train(&ctx_a, false)?;
        let (got_losses, got_params, copies) = train(&ctx_b, true)?;
        for (i, (g, w)) in got_losses.iter().zip(&want_losses).enumerate() {
            assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{device}: step {i} loss {g} vs {w}");
        }
        assert!(want_losses[11] < want_losses[0] - 0.5, "{device}: the loss did not fall: {want_losses:?}");
        for (k, (g, w)) in got_params.iter().zip(&want_params).enumerate() {
            let worst = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-4, "{device}: parameter {k} differs by {worst}");
        }
        if device != "cpu" {
            let s = ctx_b.stats();
            assert!(s.graph_replays >= 8, "{device}: {s:?}");
            assert_eq!(copies, 0, "{device}: input copies in the last 8 steps");
            assert!(s.launches > 0, "{device}: {s:?}");
        }
    }
    Ok(())
}

/// Ten AdamW steps on the fixture model (weights ten times GPT-2's
/// initial scale, biases set) give PyTorch's losses: the forward pass,
/// every gradient (attention's, the tied embedding's two uses) and the
/// update, compounded over the steps.
#[test]
fn gpt2_adamw_training_follows_pytorch_losses() -> Result<()> {
    for (device, make) in devices() {
        if device == "cuda-emulated" {
            continue;
        }
        let ctx = make();
        let model = Gpt2::from_pretrained(&ctx, fixture(), DType::F32)?;
        let vocab = model.config().vocab_size;
        let (b, t) = (reference::BATCH, reference::SEQ);
        let ids: Vec<i64> = (0..b * t).map(|i| ((i * 37 + 11) % vocab) as i64).collect();
        let targets: Vec<i64> = (0..b * t).map(|i| ((i * 53 + 7) % vocab) as i64).collect();
        let (ids, targets) = (ctx.tensor(&ids, [b, t]), ctx.tensor(&targets, [b * t]));
        let opt = AdamW::new(&model, AdamConfig::adamw())?;
        let mut step = TrainStep::new(&ctx, opt, |x: &[Tensor]| {
            nn::cross_entropy(&model.forward(&x[0], None)?.reshape([b * t, vocab]), &x[1])
        });
        for (i, want) in reference::LOSSES.iter().enumerate() {
            let got = f64::from(step.call(&[&ids, &targets])?.item::<f32>()?);
            // f32 sums in another order, compounded by Adam over the steps.
            assert!(
                (got - want).abs() <= 2e-4 * want.abs(),
                "{device}: step {i}: loss {got}, PyTorch {want}"
            );
        }
    }
    Ok(())
}

/// splitmix64 token ids below `vocab` (as `benches/gpu_train_gpt.rs`).
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut rng = splitmix::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..n).map(|_| (rng.next() % vocab as u64) as i64).collect()
}

/// 30 captured AdamW steps of a GPT-2 at the bench's smallest sizes
/// (2 layers of width 128, two 64-wide heads, batch 8, 8192 tokens: a
/// 4 MiB embedding and 16 MiB of logits, so blocks are carved from shared
/// segments and the workspace grows), from the same seed: every step's
/// loss.
fn bench_sized_losses(ctx: &Context, captured: bool) -> Result<Vec<f32>> {
    // KILN_TRAIN_CHECK="layers,width,seq,batch,vocab" checks other sizes
    // (the bench's: 2,128,64,32,8192 and 12,768,512,8,50257).
    let sizes: Vec<usize> = std::env::var("KILN_TRAIN_CHECK")
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_default();
    let [layers, width, seq, batch, vocab] = sizes[..].try_into().unwrap_or([2, 128, 64, 8, 8192]);
    let steps = if sizes.is_empty() { 30 } else { 10 };
    let config = Gpt2Config {
        vocab_size: vocab,
        n_positions: seq,
        n_embd: width,
        n_layer: layers,
        n_head: width / 64,
        n_inner: 4 * width,
        ..config()
    };
    let model = Gpt2::new(ctx, "gpt", &config, DType::F32)?;
    let opt = AdamW::new(&model, AdamConfig::adamw())?;
    let ids = ctx.tensor(&random_tokens(batch * seq, vocab, 1), [batch, seq]);
    let targets = ctx.tensor(&random_tokens(batch * seq, vocab, 2), [batch * seq]);
    let loss = |ids: &Tensor, targets: &Tensor| {
        nn::cross_entropy(&model.forward(ids, None)?.reshape([batch * seq, vocab]), targets)
    };
    let mut losses = Vec::new();
    if captured {
        let mut step = TrainStep::new(ctx, opt, |b: &[Tensor]| loss(&b[0], &b[1]));
        for _ in 0..steps {
            losses.push(step.call(&[&ids, &targets])?.item::<f32>()?);
        }
    } else {
        let mut opt = opt;
        for _ in 0..steps {
            let l = loss(&ids, &targets)?;
            opt.backward(&l)?;
            opt.step()?;
            opt.zero_grad()?;
            losses.push(l.item::<f32>()?);
        }
    }
    Ok(losses)
}

/// The GPU follows the CPU step for step over 30 steps at sizes where
/// memory and library state matter (see [`bench_sized_losses`]):
/// captured and replayed, captured without CUDA graphs, and op by op.
/// Random weights are the same on both (one counter-based generator).
#[test]
fn gpu_training_follows_the_cpu_at_bench_sizes() -> Result<()> {
    let gpus: Vec<_> = devices().into_iter().filter(|(d, _)| *d == "cuda").collect();
    if gpus.is_empty() {
        return Ok(());
    }
    let want = bench_sized_losses(&Context::cpu().with_seed(1), true)?;
    let make = gpus[0].1;
    let runs = [
        ("captured", bench_sized_losses(&make().with_seed(1), true)?),
        ("captured, no CUDA graphs", bench_sized_losses(&make().with_seed(1).with_cuda_graphs(false), true)?),
        ("op by op", bench_sized_losses(&make().with_seed(1), false)?),
    ];
    let mut failed = Vec::new();
    for (name, got) in &runs {
        eprintln!("{name}: {got:?}");
        if let Some(i) = (0..want.len()).find(|&i| (got[i] - want[i]).abs() > 1e-3 * want[i].abs()) {
            failed.push(format!("{name}: step {i}: {} vs the CPU's {}", got[i], want[i]));
        }
    }
    eprintln!("cpu: {want:?}");
    assert!(failed.is_empty(), "{failed:#?}");
    Ok(())
}
