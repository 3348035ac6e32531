//! All-reduce and broadcast on CPU ranks, checked against an f64
//! reference, over many interleaved plans and iterations.

use super::{on_ranks, values};
use kiln::dist::Group;
use kiln::prelude::*;

fn ranks(n: usize) -> Vec<Context> {
    (0..n).map(|k| Context::cpu().with_seed(k as u64)).collect()
}

#[test]
fn all_reduce_sum_and_mean_match_an_f64_reference() {
    let ctxs = ranks(3);
    Group::new(&ctxs).unwrap();
    let n = 1000;
    let data: Vec<Vec<f32>> = (0..3).map(|r| values(r as u64 + 10, n)).collect();
    let want_sum: Vec<f64> = (0..n).map(|i| data.iter().map(|d| d[i] as f64).sum()).collect();
    let got = on_ranks(&ctxs, |r, ctx| {
        let x = ctx.tensor(&data[r], [10, 100]);
        let s = x.all_reduce_sum().to_vec::<f32>().unwrap();
        let m = x.all_reduce_mean().to_vec::<f32>().unwrap();
        (s, m)
    });
    for (s, m) in &got {
        for i in 0..n {
            assert!((s[i] as f64 - want_sum[i]).abs() <= 1e-6 * (1.0 + want_sum[i].abs()), "sum {i}");
            assert!((m[i] as f64 - want_sum[i] / 3.0).abs() <= 1e-6 * (1.0 + want_sum[i].abs()), "mean {i}");
        }
    }
    // Every rank holds the same bits.
    assert_eq!(got[0], got[1]);
    assert_eq!(got[1], got[2]);
}

#[test]
fn broadcast_gives_every_rank_the_roots_value() {
    let ctxs = ranks(3);
    Group::new(&ctxs).unwrap();
    let got = on_ranks(&ctxs, |r, ctx| {
        let x = ctx.tensor(&values(r as u64, 6), [2, 3]);
        x.broadcast_from(2).to_vec::<f32>().unwrap()
    });
    for g in got {
        assert_eq!(g, values(2, 6));
    }
}

/// Cached plans with collectives, three of them interleaved over many
/// iterations, with fresh data each time: a replayed plan that read a
/// stale operand or a round paired with the wrong one shows here.
#[test]
fn interleaved_plans_stay_paired_over_many_iterations() {
    let ctxs = ranks(2);
    Group::new(&ctxs).unwrap();
    let results = on_ranks(&ctxs, |r, ctx| {
        let mut out = Vec::new();
        for it in 0..40u64 {
            let a = ctx.tensor(&values(100 * it + r as u64, 8), [8]);
            let b = ctx.tensor(&values(7000 + 100 * it + r as u64, 4), [2, 2]);
            let sa = (a.all_reduce_sum() * 2.0).to_vec::<f32>().unwrap();
            let mb = b.exp().all_reduce_mean().to_vec::<f32>().unwrap();
            let bc = a.broadcast_from(1).sum(&[0], false).to_vec::<f32>().unwrap();
            out.push((sa, mb, bc));
        }
        (out, ctx.stats().compiles)
    });
    for it in 0..40u64 {
        let a: Vec<Vec<f32>> = (0..2).map(|r| values(100 * it + r, 8)).collect();
        let b: Vec<Vec<f32>> = (0..2).map(|r| values(7000 + 100 * it + r, 4)).collect();
        for (ranked, _) in &results {
            let (sa, mb, bc) = &ranked[it as usize];
            for i in 0..8 {
                let want = 2.0 * (a[0][i] as f64 + a[1][i] as f64);
                assert!((sa[i] as f64 - want).abs() < 1e-5, "iteration {it} sum {i}");
            }
            for i in 0..4 {
                let want = ((b[0][i] as f64).exp() + (b[1][i] as f64).exp()) / 2.0;
                assert!((mb[i] as f64 - want).abs() < 1e-5, "iteration {it} mean {i}");
            }
            let want: f64 = a[1].iter().map(|&v| v as f64).sum();
            assert!((bc[0] as f64 - want).abs() < 1e-5, "iteration {it} broadcast");
        }
    }
    // Three plans each, compiled once.
    assert!(
        results.iter().all(|(_, compiles)| *compiles <= 4),
        "{:?}",
        results.iter().map(|r| r.1).collect::<Vec<_>>()
    );
}

/// The gradient through an all-reduce sum is the all-reduce sum of the
/// ranks' gradients: with loss_r = sum(c_r * all_reduce_sum(x_r)), every
/// rank's d loss / d x is c_0 + c_1 (summed over ranks).
#[test]
fn the_gradient_of_an_all_reduce_sums_the_ranks_gradients() {
    let ctxs = ranks(2);
    Group::new(&ctxs).unwrap();
    let c: Vec<Vec<f32>> = (0..2).map(|r| values(50 + r, 5)).collect();
    let grads = on_ranks(&ctxs, |r, ctx| {
        let x = ctx.variable("x", ctx.tensor(&values(r as u64, 5), [5])).unwrap();
        let loss = (x.all_reduce_sum() * ctx.tensor(&c[r], [5])).sum(&[0], false);
        let g = loss.backward().unwrap();
        g.get(&x).unwrap().to_vec::<f32>().unwrap()
    });
    for g in grads {
        for i in 0..5 {
            assert!((g[i] - (c[0][i] + c[1][i])).abs() < 1e-6, "{i}: {} vs {}", g[i], c[0][i] + c[1][i]);
        }
    }
}

#[test]
fn a_group_of_one_is_the_identity() {
    let ctx = Context::cpu();
    Group::new(std::slice::from_ref(&ctx)).unwrap();
    assert_eq!((ctx.rank(), ctx.world_size()), (Some(0), Some(1)));
    let x = ctx.tensor(&values(3, 4), [4]);
    assert_eq!(x.all_reduce_mean().to_vec::<f32>().unwrap(), values(3, 4));
}
