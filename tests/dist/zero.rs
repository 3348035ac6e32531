//! ZeRO-1 (`DataParallel::sharded`, `ShardedOptimizer`) on CPU ranks:
//! the same steps as `DataParallel` with AdamW on groups of 2 and 3,
//! with the learning rate changed between steps; across processes the
//! same bits as in one process; each rank's optimizer state 1/n of
//! DataParallel's; and its errors.
//!
//! Tolerance: none on the CPU. A reduce-scatter's chunk is the
//! all-reduce's bits (both combine in f64 in rank order and round once),
//! and the AdamW update is elementwise and shared (`optim::AdamRule`), so
//! each element of a shard goes through the same operations on the same
//! values as in DataParallel. The GPU variants (`gpu.rs`) allow f32
//! rounding instead: NCCL may sum a reduce-scatter in another order than
//! an all-reduce.

use super::data_parallel::{loss, mlp};
use super::procs::{bits, child_of, put, Ranks};
use kiln::dist::{DataParallel, Group, ProcessEnv, ShardedOptimizer, ShardedRule};
use kiln::nn::Sequential;
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::prelude::*;
use std::time::Duration;

pub fn config() -> AdamConfig {
    AdamConfig { lr: 1e-2, ..AdamConfig::adamw() }
}

/// The MLP with its parameters in buckets of 2 KiB (several buckets, and
/// lengths that 2 and 3 ranks need padding for).
pub fn build_sharded(ctx: &Context) -> Result<(Sequential, ShardedOptimizer)> {
    let model = mlp(ctx)?;
    let opt = ShardedOptimizer::new(&model, ShardedRule::AdamW(config()), 2048)?;
    Ok((model, opt))
}

pub fn build_replicated(ctx: &Context) -> Result<(Sequential, AdamW)> {
    let model = mlp(ctx)?;
    let opt = AdamW::new(&model, config())?;
    Ok((model, opt))
}

/// Batch `k`: 12 rows (2 and 3 ranks split it) of 12 features, a class each.
pub fn batch(host: &Context, k: u64) -> (Tensor, Tensor) {
    let x = super::values(k + 100, 12 * 12);
    let y: Vec<i64> = (0..12).map(|i| ((i as u64 * 3 + k) % 5) as i64).collect();
    (host.tensor(&x, [12, 12]), host.tensor(&y, [12]))
}

/// Eight steps, the learning rate halved after the fourth; each of this
/// process's ranks' losses, then its parameters, as bits.
pub fn train<O: Optimizer + Send + 'static>(dp: &mut DataParallel<O>) -> Vec<String> {
    let host = Context::cpu();
    let ranks = dp.group().ranks();
    let mut out = vec![String::new(); ranks.len()];
    for k in 0..8 {
        if k == 4 {
            dp.set_lr(5e-3).unwrap();
        }
        let (x, y) = batch(&host, k);
        for (o, l) in out.iter_mut().zip(dp.step(&[&x, &y]).unwrap()) {
            *o += &bits(&[l.item::<f32>().unwrap()]);
        }
    }
    for (o, r) in out.iter_mut().zip(ranks) {
        for p in dp.parameters(r) {
            *o += &bits(&p.tensor().to_vec::<f32>().unwrap());
        }
    }
    out
}

pub fn params_of<O: Optimizer + Send + 'static>(dp: &DataParallel<O>, rank: usize) -> Vec<Vec<f32>> {
    dp.parameters(rank).iter().map(|p| p.tensor().to_vec::<f32>().unwrap()).collect()
}

fn seeded(n: usize) -> Vec<Context> {
    (0..n).map(|k| Context::cpu().with_seed(k as u64 + 1)).collect()
}

#[test]
fn sharded_adamw_takes_data_parallels_steps_on_2_and_3_ranks() {
    for n in [2, 3] {
        let mut dp = DataParallel::new(&seeded(n), build_replicated, loss).unwrap();
        let want = train(&mut dp);
        let mut zero = DataParallel::sharded(&seeded(n), build_sharded, loss).unwrap();
        let got = train(&mut zero);
        assert_eq!(got, want, "{n} ranks: ZeRO-1's losses and parameters differ from DataParallel's");
        for r in 1..n {
            assert_eq!(params_of(&zero, r), params_of(&zero, 0), "{n} ranks: rank {r} differs from rank 0");
        }
    }
}

#[test]
fn each_ranks_optimizer_state_is_a_nth_of_data_parallels() {
    let mut dp = DataParallel::new(&seeded(3), build_replicated, loss).unwrap();
    let full = dp.optimizer_state_bytes().unwrap();
    let n_params: usize = dp.parameters(0).iter().map(|p| p.numel()).sum();
    assert_eq!(full, vec![Some(2 * 4 * n_params + 8); 3], "AdamW: two f32 moments and an i64 step");
    train(&mut dp);
    for n in [2, 3] {
        let zero = DataParallel::sharded(&seeded(n), build_sharded, loss).unwrap();
        let sharded = zero.optimizer_state_bytes().unwrap();
        let full = (2 * 4 * n_params + 8) as f64;
        for (r, s) in sharded.iter().enumerate() {
            let s = s.unwrap() as f64;
            // Padding: at most n - 1 elements per bucket, two moments each.
            assert!(
                s >= full / n as f64 - 8.0 && s <= full / n as f64 + 0.05 * full / n as f64,
                "{n} ranks, rank {r}: {s} of {full}"
            );
        }
        assert!(sharded.iter().all(|s| *s == sharded[0]), "{sharded:?}: every rank holds as much");
    }
}

/// One bucket holding one big parameter and a small one: flat sharding
/// cuts the big one, so the ranks' state is equal (per-parameter
/// ownership would put it all on one rank).
#[test]
fn one_huge_parameter_is_split_evenly() {
    let ctxs = seeded(3);
    Group::new(&ctxs).unwrap();
    let lens: Vec<Vec<usize>> = super::on_ranks(&ctxs, |_, ctx| {
        let big = ctx.variable("embedding", ctx.zeros([1000, 4])).unwrap();
        let small = ctx.variable("bias", ctx.zeros([7])).unwrap();
        let opt = ShardedOptimizer::adamw(&vec![big, small], config()).unwrap();
        assert_eq!(opt.state_bytes(), Some(2 * 4 * 1336 + 8));
        opt.shard_lens()
    });
    assert_eq!(lens, vec![vec![1336]; 3], "4007 elements, padded to 4008, a third each");
}

#[test]
fn sharded_across_processes_equals_in_process_bit_for_bit() {
    const NAME: &str = "zero::sharded_across_processes_equals_in_process_bit_for_bit";
    if let Some(dir) = child_of(NAME) {
        let env = ProcessEnv::from_env().unwrap();
        let ctx = Context::cpu().with_seed(env.rank as u64 + 1);
        let group = Group::join(&ctx, &env).unwrap();
        let mut zero = DataParallel::sharded_with_group(&group, build_sharded, loss).unwrap();
        put(&dir, env.rank, &train(&mut zero)[0]);
        return;
    }
    let mut ranks = Ranks::spawn(NAME, 3, &[], None);
    let mut zero = DataParallel::sharded(&seeded(3), build_sharded, loss).unwrap();
    let want = train(&mut zero);
    for r in 0..3 {
        ranks.wait_ok(r, Duration::from_secs(90));
    }
    for (r, want) in want.iter().enumerate() {
        if ranks.result(r) != *want {
            ranks.fail(&format!("rank {r}'s losses or parameters differ from the in-process rank's"));
        }
    }
}

#[test]
fn misuse_is_an_error_saying_what_and_where() {
    let lone = Context::cpu();
    let model = mlp(&lone).unwrap();
    let err = ShardedOptimizer::adamw(&model, config()).err().unwrap().to_string();
    assert!(
        err.starts_with("invalid argument to ShardedOptimizer::new: the parameters' context (cpu (context ")
            && err.contains(") is in no process group; make the ranks a kiln::dist::Group first (DataParallel::sharded does)\n  at tests/dist/zero.rs:"),
        "{err}"
    );
    let ctxs = seeded(2);
    Group::new(&ctxs).unwrap();
    let errs = super::on_ranks(&ctxs, |_, ctx| {
        let bad_lr = ShardedOptimizer::adamw(&mlp(ctx).unwrap(), AdamConfig { lr: -1.0, ..config() });
        let bad_lr = bad_lr.err().unwrap().to_string();
        let used = ctx.variable("used", ctx.ones([4])).unwrap();
        let unused = ctx.variable("unused", ctx.ones([4])).unwrap();
        let mut opt = ShardedOptimizer::adamw(&vec![used.clone(), unused], config()).unwrap();
        used.tensor().sum(&[0], false).backward().unwrap();
        let missing = opt.step().unwrap_err().to_string();
        (bad_lr, missing)
    });
    let (bad_lr, missing) = &errs[0];
    assert!(
        bad_lr.starts_with("invalid argument to ShardedOptimizer::new: the learning rate must be finite and >= 0, got -1\n  at tests/dist/zero.rs:"),
        "{bad_lr}"
    );
    assert!(
        missing.starts_with("invalid argument to ShardedOptimizer::step: parameter \"unused\" has no gradient but others do; a sharded optimizer updates each bucket's parameters together, so give it only the parameters that train\n  at tests/dist/zero.rs:"),
        "{missing}"
    );
}

#[cfg(feature = "cuda-emulator")]
#[test]
fn emulated_cuda_ranks_run_the_lowered_scatter_and_gather() {
    if std::env::var("KILN_TEST_EMULATE").is_err() {
        eprintln!("skipped: set KILN_TEST_EMULATE=1 to run the emulator");
        return;
    }
    let emulated = || [Context::cuda_emulated().with_seed(1), Context::cuda_emulated().with_seed(2)];
    let mut zero = DataParallel::sharded(&emulated(), build_sharded, loss).unwrap();
    train(&mut zero);
    let mut dp = DataParallel::new(&emulated(), build_replicated, loss).unwrap();
    train(&mut dp);
    assert_eq!(params_of(&zero, 0), params_of(&zero, 1));
    assert_eq!(params_of(&zero, 0), params_of(&dp, 0), "the same lowered kernels, the same combine");
}
