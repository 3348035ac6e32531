//! One process per GPU (`LOCAL_RANK`), joined from torchrun's environment
//! over the coordinator that hands out the NCCL id: NCCL collectives give
//! the in-process ranks' bits, data-parallel training follows the
//! in-process run, and a killed process fails the other (its
//! communicator aborted) within seconds. Needs two GPUs; skips without
//! them unless `KILN_REQUIRE_GPUS=2`.

use super::gpu::gpus;
use super::procs::{bits, child_of, kill_one, put, unbits, victim_or_survivor, Ranks};
use super::{on_ranks, values};
use kiln::dist::{DataParallel, Group, ProcessEnv};
use kiln::prelude::*;
use std::time::Duration;

/// A child's GPU and group.
fn join() -> (Context, Group, usize) {
    let env = ProcessEnv::from_env().unwrap();
    let ctx = Context::cuda(env.local_rank).unwrap().with_seed(env.rank as u64 + 1);
    let group = Group::join(&ctx, &env).unwrap();
    (ctx, group, env.rank)
}

/// f32 sums, means and a broadcast (two ranks' f32 sum rounds once, so
/// NCCL's and the CPU rendezvous's bits agree).
fn collectives(ctx: &Context, rank: usize) -> String {
    let x = ctx.tensor(&values(10 + rank as u64, 1000), [10, 100]);
    let mut out = bits(&x.all_reduce_sum().to_vec::<f32>().unwrap());
    out += &bits(&x.all_reduce_mean().to_vec::<f32>().unwrap());
    out += &bits(&ctx.tensor(&values(20 + rank as u64, 7), [7]).broadcast_from(1).to_vec::<f32>().unwrap());
    out
}

#[test]
fn nccl_collectives_across_two_processes_equal_in_process() {
    const NAME: &str = "gpu_procs::nccl_collectives_across_two_processes_equal_in_process";
    if let Some(dir) = child_of(NAME) {
        let (ctx, _group, rank) = join();
        return put(&dir, rank, &collectives(&ctx, rank));
    }
    if gpus(2).is_none() {
        return;
    }
    let cpus = [Context::cpu(), Context::cpu()];
    Group::new(&cpus).unwrap();
    let want = on_ranks(&cpus, |r, c| collectives(c, r));
    let mut ranks = Ranks::spawn(NAME, 2, &[], None);
    for r in 0..2 {
        ranks.wait_ok(r, Duration::from_secs(120));
    }
    for (r, want) in want.iter().enumerate() {
        if ranks.result(r) != *want {
            ranks.fail(&format!("rank {r}'s NCCL results differ from the in-process CPU rank's"));
        }
    }
}

/// Parameters after six AdamW steps (global batch 16, 8 per rank).
fn train(dp: &mut DataParallel<kiln::optim::AdamW>) -> Vec<Vec<f32>> {
    let host = Context::cpu();
    for k in 0..6u64 {
        let x = host.tensor(&values(k, 16 * 12), [16, 12]);
        let y: Vec<i64> = (0..16).map(|i| ((i as u64 * 7 + k) % 5) as i64).collect();
        dp.step(&[&x, &host.tensor(&y, [16])]).unwrap();
    }
    let r = dp.group().ranks().start;
    dp.parameters(r).iter().map(|p| p.tensor().to_vec::<f32>().unwrap()).collect()
}

#[test]
fn nccl_data_parallel_across_two_processes_follows_in_process() {
    const NAME: &str = "gpu_procs::nccl_data_parallel_across_two_processes_follows_in_process";
    if let Some(dir) = child_of(NAME) {
        let (_ctx, group, rank) = join();
        let mut dp =
            DataParallel::with_group(&group, super::data_parallel_build, super::data_parallel_loss).unwrap();
        let ps = train(&mut dp);
        return put(&dir, rank, &ps.iter().map(|p| bits(p)).collect::<String>());
    }
    if gpus(2).is_none() {
        return;
    }
    let a = Ranks::two_agree(NAME, "the two processes' replicas differ");
    let ctxs = [Context::cuda(0).unwrap().with_seed(1), Context::cuda(1).unwrap().with_seed(2)];
    let mut dp = DataParallel::new(&ctxs, super::data_parallel_build, super::data_parallel_loss).unwrap();
    let want = train(&mut dp);
    let got = unbits(&a);
    assert_eq!(got.len(), want.len());
    let mut worst = 0f64;
    for (g, w) in got.iter().zip(&want) {
        for (x, y) in g.iter().zip(w) {
            worst = worst.max((x - *y as f64).abs());
        }
    }
    eprintln!("largest difference from the in-process run: {worst:e}");
    assert!(worst <= 1e-4, "{worst}");
}

#[test]
fn nccl_a_killed_process_fails_the_other_within_seconds() {
    const NAME: &str = "gpu_procs::nccl_a_killed_process_fails_the_other_within_seconds";
    if let Some(dir) = child_of(NAME) {
        let env = ProcessEnv::from_env().unwrap();
        return victim_or_survivor(&Context::cuda(env.local_rank).unwrap(), &dir, 1);
    }
    if gpus(2).is_none() {
        return;
    }
    let (errs, took) = kill_one(NAME, 2, 1, true);
    assert!(errs[0].contains("the process group is broken: rank 1 (pid "), "{}", errs[0]);
    assert!(errs[0].contains("disconnected without leaving the group"), "{}", errs[0]);
    // The break aborts rank 0's communicator; its wait gives up at most
    // 10 s (group.rs's GRACE) after that.
    assert!(took < Duration::from_secs(30), "{took:?}");
}
