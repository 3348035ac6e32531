//! NCCL on real devices. With one GPU: a group of one (a real NCCL
//! communicator of one rank), whose all-reduce runs in a captured CUDA
//! graph over many replays. With two or more: all-reduce and
//! data-parallel training across devices. Without a GPU each test says so
//! and returns; `KILN_REQUIRE_CUDA=1` makes a missing GPU a failure, and
//! `KILN_REQUIRE_GPUS=2` a missing second GPU.

use super::{on_ranks, values};
use kiln::dist::{DataParallel, Group};
use kiln::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub fn gpus(n: usize) -> Option<Vec<Context>> {
    let available = kiln::dist::devices().len() - 1;
    let required = std::env::var("KILN_REQUIRE_GPUS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    let require_cuda = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    if available < n {
        if required >= n || (require_cuda && available == 0) {
            panic!("{n} GPU(s) required, {available} found");
        }
        eprintln!("skipped: needs {n} GPU(s), {available} found");
        return None;
    }
    match (0..n).map(Context::cuda).collect::<Result<Vec<_>>>() {
        Ok(c) => Some(c),
        Err(e) if require_cuda => panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// A 1-rank NCCL group: the all-reduce is NCCL's call in the plan's
/// stream order, captured and replayed with fresh inputs every time.
#[test]
fn nccl_one_rank_all_reduce_replays_with_fresh_inputs() {
    let Some(ctxs) = gpus(1) else { return };
    let ctx = &ctxs[0];
    Group::new(&ctxs).unwrap();
    for it in 0..30u64 {
        let a = values(it, 300);
        let b = values(1000 + it, 64);
        let x = ctx.tensor(&a, [300]);
        let y = ctx.tensor(&b, [8, 8]);
        let s = (x.all_reduce_sum() * 2.0).to_vec::<f32>().unwrap();
        let m = y.exp().all_reduce_mean().broadcast_from(0).to_vec::<f32>().unwrap();
        for i in 0..300 {
            assert!((s[i] - 2.0 * a[i]).abs() < 1e-6, "iteration {it}: {i}");
        }
        for i in 0..64 {
            assert!((m[i] - b[i].exp()).abs() < 1e-5, "iteration {it}: {i}");
        }
    }
    let st = ctx.stats();
    assert!(st.graph_replays > 0, "{st:?}");
}

fn dp_build(ctx: &Context) -> Result<(kiln::nn::Sequential, kiln::optim::AdamW)> {
    super::data_parallel_build(ctx)
}

/// Data parallel over NCCL: replicas stay bit-identical (and on one GPU,
/// a group of one trains as the plain model would).
#[test]
fn nccl_data_parallel_replicas_stay_identical() {
    let n = (kiln::dist::devices().len() - 1).clamp(1, 2);
    let Some(ctxs) = gpus(n) else { return };
    let mut dp = DataParallel::new(&ctxs, dp_build, super::data_parallel_loss).unwrap();
    let host = Context::cpu();
    let mut first = None;
    let mut last = 0.0;
    for k in 0..100u64 {
        let x = host.tensor(&values(k % 10, 16 * 12), [16, 12]);
        let y: Vec<i64> = (0..16).map(|i| ((i as u64 * 7 + k % 10) % 5) as i64).collect();
        let ls = dp.step(&[&x, &host.tensor(&y, [16])]).unwrap();
        last = ls.iter().map(|l| l.item::<f32>().unwrap()).sum::<f32>() / n as f32;
        first.get_or_insert(last);
    }
    assert!(last < 0.7 * first.unwrap(), "{first:?} -> {last}");
    let params: Vec<Vec<Vec<f32>>> = (0..n)
        .map(|r| dp.parameters(r).iter().map(|p| p.tensor().to_vec::<f32>().unwrap()).collect())
        .collect();
    assert!(params.iter().all(|p| *p == params[0]), "replicas diverged");
}

/// Two devices: a real two-rank all-reduce, interleaved plans.
#[test]
fn nccl_two_ranks_all_reduce() {
    let Some(ctxs) = gpus(2) else { return };
    Group::new(&ctxs).unwrap();
    let got = on_ranks(&ctxs, |r, ctx| {
        (0..20u64)
            .map(|it| {
                ctx.tensor(&values(10 * it + r as u64, 1000), [1000])
                    .all_reduce_sum()
                    .to_vec::<f32>()
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    for it in 0..20u64 {
        let (a, b) = (values(10 * it, 1000), values(10 * it + 1, 1000));
        for i in 0..1000 {
            assert_eq!(got[0][it as usize][i], a[i] + b[i], "iteration {it}");
        }
        assert_eq!(got[0][it as usize], got[1][it as usize]);
    }
}

/// Rank 1's run fails (a bad gather index feeding its all-reduce) and
/// rank 1 stops, while rank 0 goes on to its next collective. NCCL has no
/// timeout: before the abort path rank 0 spun in NCCL forever. Now rank
/// 1's failure breaks the group, every communicator is aborted, and rank
/// 0 gets an error naming rank 1 (at its iteration 3 or 4, whichever it
/// reaches first), well within the watchdog.
#[test]
fn nccl_a_rank_failing_before_its_collective_breaks_the_group() {
    let Some(ctxs) = gpus(2) else { return };
    Group::with_timeout(&ctxs, Duration::from_secs(20)).unwrap();
    // Where each rank is (iteration * 10, + 2 while reading, + 3 after),
    // for the watchdog's message.
    let progress: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let (tx, rx) = std::sync::mpsc::channel();
    let seen = progress.clone();
    std::thread::spawn(move || {
        let got = on_ranks(&ctxs, |r, ctx| {
            let table = ctx.tensor(&values(1, 8), [8]);
            for it in 0..6usize {
                let index: Vec<i64> =
                    (0..4).map(|i| if r == 1 && it == 3 && i == 2 { 99 } else { i }).collect();
                let picked = table.gather(0, &ctx.tensor(&index, [4]));
                let summed = picked.all_reduce_sum();
                seen[r].store(it * 10 + 2, Ordering::SeqCst);
                let read = summed.to_vec::<f32>();
                seen[r].store(it * 10 + 3, Ordering::SeqCst);
                if let Err(e) = read {
                    return (it, e.to_string());
                }
            }
            (usize::MAX, String::new())
        });
        let _ = tx.send(got);
    });
    let got = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
        let at = |r: usize| {
            let p = progress[r].load(Ordering::SeqCst);
            format!(
                "rank {r} at iteration {}, {}",
                p / 10,
                if p % 10 == 2 { "reading" } else { "past its read" }
            )
        };
        panic!("watchdog: a rank hung for 120 s ({}; {})", at(0), at(1))
    });
    eprintln!(
        "rank 0 at iteration {}: {}\nrank 1 at iteration {}: {}",
        got[0].0, got[0].1, got[1].0, got[1].1
    );
    assert_eq!(got[1].0, 3, "{}", got[1].1);
    assert!(got[1].1.contains("index 99 is out of range"), "{}", got[1].1);
    assert!(got[0].0 == 3 || got[0].0 == 4, "rank 0 failed at iteration {}: {}", got[0].0, got[0].1);
    assert!(
        got[0].1.contains("the process group is broken: rank 1 (cuda:1) failed a run with collectives")
            && got[0].1.contains("index 99 is out of range"),
        "{}",
        got[0].1
    );
}
