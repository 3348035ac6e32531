//! Data-parallel training on CPU ranks (and emulated CUDA ranks): the
//! replicas stay bit-identical over 100 AdamW steps, and training on two
//! half batches follows training on the whole batch on one device.

use kiln::dist::DataParallel;
use kiln::nn::{self, Linear, Module, Params, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW};
use kiln::prelude::*;

/// A small MLP with four parameters tensors per layer pair.
pub fn mlp(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 12, 32)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "2", 32, 32)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "4", 32, 5)?.boxed(),
        ])
    })
}

pub fn build(ctx: &Context) -> Result<(Sequential, AdamW)> {
    let model = mlp(ctx)?;
    let opt = AdamW::new(&model, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() })?;
    Ok((model, opt))
}

pub fn loss(model: &Sequential, batch: &[Tensor]) -> Result<Tensor> {
    nn::cross_entropy(&model.forward(&batch[0])?, &batch[1])
}

/// Batch `k`: 16 rows of 12 features and their class.
fn batch(host: &Context, k: u64) -> (Tensor, Tensor) {
    let x = super::values(k, 16 * 12);
    let y: Vec<i64> = (0..16).map(|i| ((i as u64 * 7 + k) % 5) as i64).collect();
    (host.tensor(&x, [16, 12]), host.tensor(&y, [16]))
}

fn params_of(dp: &DataParallel<AdamW>, rank: usize) -> Vec<Vec<f32>> {
    dp.parameters(rank).iter().map(|p| p.tensor().to_vec::<f32>().unwrap()).collect()
}

fn train(ranks: &[Context], bucket_bytes: usize) -> (Vec<Vec<Vec<f32>>>, Vec<f32>) {
    let mut dp = DataParallel::new(ranks, build, loss).unwrap().with_bucket_bytes(bucket_bytes);
    let host = Context::cpu();
    let mut losses = Vec::new();
    for k in 0..100 {
        let (x, y) = batch(&host, k % 10);
        let ls = dp.step(&[&x, &y]).unwrap();
        let mean: f32 = ls.iter().map(|l| l.item::<f32>().unwrap()).sum::<f32>() / ls.len() as f32;
        losses.push(mean);
    }
    ((0..ranks.len()).map(|r| params_of(&dp, r)).collect(), losses)
}

/// Different seeds per rank: only the broadcast makes them start equal,
/// and only the all-reduce keeps them equal (each rank sees other data).
#[test]
fn replicas_stay_bit_identical_over_100_adamw_steps() {
    for bucket_bytes in [1, 4 << 20] {
        let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
        let (params, losses) = train(&ranks, bucket_bytes);
        assert_eq!(params[0], params[1], "bucket {bucket_bytes}: replicas diverged");
        assert!(losses[99] < 0.7 * losses[0], "bucket {bucket_bytes}: {} -> {}", losses[0], losses[99]);
        // One captured step per rank: the plans compile once.
        for r in &ranks {
            assert!(r.stats().compiles <= 4, "{} compiles", r.stats().compiles);
        }
    }
}

/// Gradients averaged in bf16 (`with_reduce_dtype`, PyTorch's
/// `bf16_compress_hook`): one SGD step moves each parameter by `lr` times
/// the average gradient rounded to bf16, so it differs from the f32
/// average's step by at most bf16's relative precision of that step
/// (and somewhere by more than nothing: the gradients were rounded); the
/// replicas stay bit-identical. A non-float dtype is refused.
#[test]
fn gradients_averaged_in_bf16_round_the_step_once() {
    use kiln::optim::{Sgd, SgdConfig};
    let build_sgd = |ctx: &Context| -> Result<(Sequential, Sgd)> {
        let model = mlp(ctx)?;
        let opt = Sgd::new(&model, SgdConfig { lr: 0.5, ..Default::default() })?;
        Ok((model, opt))
    };
    let host = Context::cpu();
    let (x, y) = batch(&host, 3);
    // Rank 0's parameters before the step, then each rank's after.
    type Values = Vec<Vec<f32>>;
    let step = |bf16: bool| -> (Values, Values, Values) {
        let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
        let mut dp = DataParallel::new(&ranks, build_sgd, loss).unwrap();
        if bf16 {
            dp = dp.with_reduce_dtype(DType::BF16).unwrap();
        }
        let read = |dp: &DataParallel<Sgd>, r: usize| -> Vec<Vec<f32>> {
            dp.parameters(r).iter().map(|p| p.tensor().to_vec::<f32>().unwrap()).collect()
        };
        let before = read(&dp, 0);
        dp.step(&[&x, &y]).unwrap();
        (before, read(&dp, 0), read(&dp, 1))
    };
    let (p0, wide, _) = step(false);
    let (q0, narrow, narrow1) = step(true);
    assert_eq!(p0, q0, "both runs start from rank 0's parameters");
    assert_eq!(narrow, narrow1, "replicas diverged");
    // Each rank's gradient is rounded before the sum, so where the ranks'
    // gradients cancel an element's error is relative to their size, not
    // to the average's: bound it by the tensor's largest step.
    let mut most = 0.0f32;
    for ((a, w), n) in p0.iter().zip(&wide).zip(&narrow) {
        let largest = a.iter().zip(w).map(|(a, w)| (a - w).abs()).fold(0.0f32, f32::max);
        for (w, n) in w.iter().zip(n) {
            let off = (n - w).abs();
            assert!(
                off <= largest * 2f32.powi(-6) + 1e-7,
                "a bf16 step is {off} off; the largest step {largest}"
            );
            most = most.max(off);
        }
    }
    assert!(most > 0.0, "the bf16 average changed nothing: were the gradients cast?");
    let ranks = [Context::cpu(), Context::cpu()];
    let err = DataParallel::new(&ranks, build, loss).unwrap().with_reduce_dtype(DType::I32).err();
    assert!(err.is_some_and(|e| e.to_string().contains("float dtype")));
}

/// Two ranks on half batches each take the step one device takes on the
/// whole batch (the mean of the halves' mean gradients is the whole
/// batch's), up to float rounding.
#[test]
fn two_ranks_follow_one_device_on_the_whole_batch() {
    let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
    let (params, _) = train(&ranks, 4 << 20);
    let one = Context::cpu().with_seed(1);
    let (model, opt) = build(&one).unwrap();
    let host = Context::cpu();
    let mut step = kiln::optim::TrainStep::new(&one, opt, |b: &[Tensor]| loss(&model, b));
    for k in 0..100 {
        let (x, y) = batch(&host, k % 10);
        step.call(&[&x.to(&one), &y.to(&one)]).unwrap();
    }
    for (p, d) in model.parameters().iter().zip(&params[0]) {
        let v = p.tensor().to_vec::<f32>().unwrap();
        for (a, b) in v.iter().zip(d) {
            assert!((a - b).abs() < 2e-3, "{}: {a} vs {b}", p.name());
        }
    }
}

#[cfg(feature = "cuda-emulator")]
#[test]
fn emulated_cuda_ranks_run_the_lowered_collectives() {
    if std::env::var("KILN_TEST_EMULATE").is_err() {
        eprintln!("skipped: set KILN_TEST_EMULATE=1 to run the emulator");
        return;
    }
    let ranks = [Context::cuda_emulated().with_seed(1), Context::cuda_emulated().with_seed(2)];
    let mut dp = DataParallel::new(&ranks, build, loss).unwrap();
    let host = Context::cpu();
    for k in 0..5 {
        let (x, y) = batch(&host, k);
        dp.step(&[&x, &y]).unwrap();
    }
    assert_eq!(params_of(&dp, 0), params_of(&dp, 1));
}

/// Each rank's steps run on one thread of its own, the same every step
/// (not a thread per rank per step), and dropping the `DataParallel`
/// ends those threads, dropping the replicas (their loss closures) there.
#[test]
fn each_rank_steps_on_one_persistent_thread() {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
    let s = seen.clone();
    let mut dp = DataParallel::new(&ranks, build, move |model: &Sequential, batch: &[Tensor]| {
        let t = std::thread::current();
        s.lock().unwrap().insert(format!("{:?} {}", t.id(), t.name().unwrap_or("?")));
        loss(model, batch)
    })
    .unwrap();
    let host = Context::cpu();
    for k in 0..5 {
        let (x, y) = batch(&host, k);
        dp.step(&[&x, &y]).unwrap();
    }
    let names: Vec<String> =
        seen.lock().unwrap().iter().map(|s| s.split(' ').nth(1).unwrap().to_string()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["kiln-rank-0", "kiln-rank-1"], "{:?}", seen.lock().unwrap());
    assert!(Arc::strong_count(&seen) > 1);
    drop(dp);
    assert_eq!(Arc::strong_count(&seen), 1, "the replicas' loss closures were dropped with their threads");
}

/// GPT-2 is a [`Module`] (its `forward` is the logits of unpadded ids),
/// so it trains data parallel as any module does: a small decoder over
/// two CPU ranks, each on its own sequences, keeps bit-identical replicas
/// and lowers its loss (the model of `benches/gpu_ddp_gpt.rs`, small).
#[test]
fn gpt2_trains_data_parallel_as_a_module() {
    use kiln::nn::gpt2::{Gpt2, Gpt2Config};
    let config = Gpt2Config {
        vocab_size: 40,
        n_positions: 8,
        n_embd: 64,
        n_layer: 1,
        n_head: 2,
        n_inner: 128,
        ..Gpt2Config::gpt2_small()
    };
    let build = move |ctx: &Context| -> Result<(Gpt2, AdamW)> {
        let model = Gpt2::new(ctx, "gpt", &config, DType::F32)?;
        let opt = AdamW::new(&model, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() })?;
        Ok((model, opt))
    };
    let loss = |m: &Gpt2, b: &[Tensor]| -> Result<Tensor> {
        let logits = Module::forward(m, &b[0])?;
        nn::cross_entropy(&logits.reshape([16, 40]), &b[1])
    };
    let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
    let mut dp = DataParallel::new(&ranks, build, loss).unwrap();
    let shards: Vec<Vec<Tensor>> = ranks
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let ids: Vec<i64> = (0..16).map(|i| ((i * 7 + r * 3) % 40) as i64).collect();
            let next: Vec<i64> = (0..16).map(|i| ((i * 7 + r * 3 + 5) % 40) as i64).collect();
            vec![c.tensor(&ids, [2, 8]), c.tensor(&next, [16])]
        })
        .collect();
    let mut losses = Vec::new();
    for _ in 0..30 {
        let ls = dp.step_shards(&shards).unwrap();
        losses.push(ls.iter().map(|l| l.item::<f32>().unwrap()).sum::<f32>() / 2.0);
    }
    let params = |r: usize| -> Vec<Vec<f32>> {
        dp.parameters(r).iter().map(|p| p.tensor().to_vec::<f32>().unwrap()).collect()
    };
    assert_eq!(params(0), params(1), "replicas diverged");
    assert!(losses[29] < 0.5 * losses[0], "loss {} -> {}", losses[0], losses[29]);
}
