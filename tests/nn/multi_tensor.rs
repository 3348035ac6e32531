//! Multi-tensor updates (the `horizontal` pass's launch groups: one
//! kernel or parallel loop for every small parameter's AdamW update)
//! against per-tensor ones (the pass off), and each parameter's three
//! AdamW updates as one kernel with three outputs (the `multi-output`
//! pass) against three kernels: the same script of training steps gives
//! the same bits on every device. The script interleaves two
//! captured plans (two batch shapes), steps taken op by op, learning rate
//! changes between calls, and snapshots of parameters held across steps
//! and read later.

use crate::gpt2::devices;
use kiln::nn::gpt2::{Activation, Gpt2, Gpt2Config};
use kiln::nn::{self, Params};
use kiln::optim::{AdamConfig, AdamW, Optimizer, TrainStep};
use kiln::prelude::*;

const VOCAB: usize = 40;

fn config() -> Gpt2Config {
    Gpt2Config {
        vocab_size: VOCAB,
        n_positions: 8,
        n_embd: 16,
        n_layer: 2,
        n_head: 2,
        n_inner: 32,
        layer_norm_epsilon: 1e-5,
        activation: Activation::GeluTanh,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
    }
}

/// Token ids below `VOCAB`, a fixed pattern per seed.
fn tokens(ctx: &Context, seed: usize, shape: [usize; 2]) -> (Tensor, Tensor) {
    let n = shape[0] * shape[1];
    let ids: Vec<i64> = (0..n).map(|i| ((i * 7 + seed * 13 + i * i % 5) % VOCAB) as i64).collect();
    let targets: Vec<i64> = (0..n).map(|i| ((i * 5 + seed * 3) % VOCAB) as i64).collect();
    (ctx.tensor(&ids, shape), ctx.tensor(&targets, [n]))
}

fn loss(model: &Gpt2, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let n = targets.numel();
    nn::cross_entropy(&model.forward(ids, None)?.reshape([n, VOCAB]), targets)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What a script leaves: every loss and held snapshot read (as bits), the
/// parameters at the end, and the nodes that ran in launch groups.
struct Outcome {
    reads: Vec<Vec<u32>>,
    params: Vec<Vec<u32>>,
    grouped: u64,
    launches: u64,
}

/// Runs `script` (one action per entry) on a fresh model.
fn run(ctx: &Context, script: &[u8]) -> Result<Outcome> {
    let model = Gpt2::new(ctx, "gpt", &config(), DType::F32)?;
    let opt = AdamW::new(&model, AdamConfig { lr: 3e-3, ..AdamConfig::adamw() })?;
    let batches = [tokens(ctx, 1, [2, 8]), tokens(ctx, 2, [3, 4])];
    let mut step = TrainStep::new(ctx, opt, |x: &[Tensor]| loss(&model, &x[0], &x[1]));
    let mut params: Vec<Variable> = Vec::new();
    model.visit(&mut |v| params.push(v.clone()));
    let mut reads = Vec::new();
    // (snapshot, its values when taken)
    let mut held: Vec<(Tensor, Vec<f32>)> = Vec::new();
    for (i, &action) in script.iter().enumerate() {
        match action % 6 {
            0 | 1 => {
                let (ids, targets) = &batches[(action % 2) as usize];
                reads.push(bits(&[step.call(&[ids, targets])?.item::<f32>()?]));
            }
            2 => {
                let (ids, targets) = &batches[i % 2];
                let l = loss(&model, ids, targets)?;
                let opt = step.optimizer();
                opt.backward(&l)?;
                opt.step()?;
                opt.zero_grad()?;
                reads.push(bits(&[l.item::<f32>()?]));
            }
            3 => step.optimizer().set_lr(1e-3 * (1 + i % 4) as f64)?,
            4 => {
                let p = &params[i % params.len()];
                held.push((p.detach(), p.to_vec::<f32>()?));
            }
            _ => {
                if let Some((snapshot, when_taken)) = held.pop() {
                    let now = snapshot.to_vec::<f32>()?;
                    assert_eq!(bits(&now), bits(&when_taken), "a held snapshot changed (action {i})");
                    reads.push(bits(&now));
                }
            }
        }
    }
    let params = params.iter().map(|p| p.to_vec::<f32>().map(|v| bits(&v))).collect::<Result<_>>()?;
    let stats = ctx.stats();
    Ok(Outcome { reads, params, grouped: stats.grouped_nodes, launches: stats.launches })
}

/// A fixed script: every action, in a mixed order.
fn script(len: usize) -> Vec<u8> {
    let mut rng = crate::splitmix::Rng(41);
    (0..len).map(|_| (rng.next() % 6) as u8).collect()
}

#[test]
fn grouped_updates_equal_per_tensor_updates_bit_for_bit() -> Result<()> {
    for (device, make) in devices() {
        // The emulator runs every CUDA thread as a host thread: fewer steps.
        let script = script(if device == "cuda-emulated" { 14 } else { 60 });
        let grouped = run(&make().with_seed(9), &script)?;
        let alone = run(&make().with_seed(9).with_passes("-horizontal"), &script)?;
        assert!(grouped.grouped > 0, "{device}: no node ran in a launch group");
        assert_eq!(alone.grouped, 0, "{device}: the pass was off");
        assert_eq!(grouped.reads.len(), alone.reads.len());
        for (k, (g, a)) in grouped.reads.iter().zip(&alone.reads).enumerate() {
            assert_eq!(g, a, "{device}: read {k} differs");
        }
        for (k, (g, a)) in grouped.params.iter().zip(&alone.params).enumerate() {
            assert_eq!(g, a, "{device}: parameter {k} differs at the end");
        }
    }
    Ok(())
}

#[test]
fn merged_updates_equal_separate_updates_bit_for_bit() -> Result<()> {
    for (device, make) in devices() {
        let script = script(if device == "cuda-emulated" { 14 } else { 60 });
        let merged = run(&make().with_seed(9), &script)?;
        let separate = run(&make().with_seed(9).with_passes("-multi-output"), &script)?;
        if device.starts_with("cuda") {
            assert!(
                merged.launches < separate.launches,
                "{device}: {} launches merged, {} separate",
                merged.launches,
                separate.launches
            );
        }
        assert_eq!(merged.reads.len(), separate.reads.len());
        for (k, (m, s)) in merged.reads.iter().zip(&separate.reads).enumerate() {
            assert_eq!(m, s, "{device}: read {k} differs");
        }
        for (k, (m, s)) in merged.params.iter().zip(&separate.params).enumerate() {
            assert_eq!(m, s, "{device}: parameter {k} differs at the end");
        }
    }
    Ok(())
}
