//! Reduce-scatter and all-gather on CPU ranks (groups of 2 and 3),
//! against an f64 reference, with inputs drawn fresh each run (the seed
//! is in every failure message), their gradients, and their errors.

use super::on_ranks;
use super::splitmix::Rng;
use kiln::dist::Group;
use kiln::prelude::*;

fn group(n: usize) -> Vec<Context> {
    let ctxs: Vec<Context> = (0..n).map(|k| Context::cpu().with_seed(k as u64)).collect();
    Group::new(&ctxs).unwrap();
    ctxs
}

/// A seed that differs every run, so the inputs are fresh each time.
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ std::process::id() as u64
}

/// `n` values in [-1, 1) from `rng`.
fn draw(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect()
}

#[test]
fn reduce_scatter_gives_each_rank_its_chunk_of_the_sum_and_mean() {
    for n in [2, 3] {
        let seed = fresh_seed();
        let mut rng = Rng(seed);
        let (rows, cols) = (6 * n, 5);
        let data: Vec<Vec<f32>> = (0..n).map(|_| draw(&mut rng, rows * cols)).collect();
        let sum: Vec<f64> = (0..rows * cols).map(|i| data.iter().map(|d| d[i] as f64).sum()).collect();
        let ctxs = group(n);
        let got = on_ranks(&ctxs, |r, ctx| {
            let x = ctx.tensor(&data[r], [rows, cols]);
            let (s, m) = (x.reduce_scatter_sum(), x.reduce_scatter_mean());
            assert_eq!(s.shape(), &[rows / n, cols]);
            (s.to_vec::<f32>().unwrap(), m.to_vec::<f32>().unwrap())
        });
        let chunk = rows / n * cols;
        for (r, (s, m)) in got.iter().enumerate() {
            for j in 0..chunk {
                let want = sum[r * chunk + j];
                let tol = 1e-6 * (1.0 + want.abs());
                assert!((s[j] as f64 - want).abs() <= tol, "seed {seed}, {n} ranks, rank {r} sum {j}");
                assert!(
                    (m[j] as f64 - want / n as f64).abs() <= tol,
                    "seed {seed}, {n} ranks, rank {r} mean {j}"
                );
            }
        }
        // Rank r's chunk is the all-reduce's bits (one combine on the host).
        let all = on_ranks(&ctxs, |r, ctx| {
            ctx.tensor(&data[r], [rows, cols]).all_reduce_sum().to_vec::<f32>().unwrap()
        });
        for (r, (s, _)) in got.iter().enumerate() {
            assert_eq!(s[..], all[r][r * chunk..(r + 1) * chunk], "seed {seed}, {n} ranks, rank {r}");
        }
    }
}

#[test]
fn all_gather_joins_every_ranks_tensor_in_rank_order() {
    for n in [2, 3] {
        let seed = fresh_seed();
        let mut rng = Rng(seed);
        let data: Vec<Vec<f32>> = (0..n).map(|_| draw(&mut rng, 4 * 3)).collect();
        let ints: Vec<Vec<i64>> = (0..n).map(|_| (0..5).map(|_| rng.next() as i64).collect()).collect();
        let ctxs = group(n);
        let got = on_ranks(&ctxs, |r, ctx| {
            let x = ctx.tensor(&data[r], [4, 3]).all_gather();
            assert_eq!(x.shape(), &[4 * n, 3]);
            let i = ctx.tensor(&ints[r], [5]).all_gather();
            (x.to_vec::<f32>().unwrap(), i.to_vec::<i64>().unwrap())
        });
        for (r, (x, i)) in got.iter().enumerate() {
            assert_eq!(*x, data.concat(), "seed {seed}, {n} ranks, rank {r}");
            assert_eq!(*i, ints.concat(), "seed {seed}, {n} ranks, rank {r}");
        }
    }
}

/// With loss_r = sum(c_r · reduce_scatter_sum(x_r)), every rank's
/// d loss / d x is every rank's `c` end to end (the all-gather of the
/// incoming gradients); with loss_r = sum(c_r · all_gather(x_r)), rank
/// k's is chunk k of the sum of every rank's `c`.
#[test]
fn the_gradients_of_reduce_scatter_and_all_gather_are_each_other() {
    let n = 3;
    let seed = fresh_seed();
    let mut rng = Rng(seed);
    let c_small: Vec<Vec<f32>> = (0..n).map(|_| draw(&mut rng, 2)).collect();
    let c_big: Vec<Vec<f32>> = (0..n).map(|_| draw(&mut rng, 2 * n)).collect();
    let ctxs = group(n);
    let grads = on_ranks(&ctxs, |r, ctx| {
        let x = ctx.variable("x", ctx.tensor(&draw(&mut Rng(r as u64), 2 * n), [2 * n])).unwrap();
        let loss = (x.reduce_scatter_sum() * ctx.tensor(&c_small[r], [2])).sum(&[0], false);
        let g_scatter = loss.backward().unwrap().get(&x).unwrap().to_vec::<f32>().unwrap();
        let y = ctx.variable("y", ctx.tensor(&draw(&mut Rng(r as u64), 2), [2])).unwrap();
        let loss = (y.all_gather() * ctx.tensor(&c_big[r], [2 * n])).sum(&[0], false);
        let g_gather = loss.backward().unwrap().get(&y).unwrap().to_vec::<f32>().unwrap();
        (g_scatter, g_gather)
    });
    for (r, (gs, gg)) in grads.iter().enumerate() {
        assert_eq!(*gs, c_small.concat(), "seed {seed}, rank {r}");
        for j in 0..2 {
            let want: f64 = c_big.iter().map(|c| c[r * 2 + j] as f64).sum();
            assert!((gg[j] as f64 - want).abs() < 1e-6, "seed {seed}, rank {r} element {j}");
        }
    }
}

/// Errors are the tensor's, recorded at the call, naming the sizes.
#[test]
fn a_dim_0_the_group_does_not_divide_is_an_error_naming_the_sizes() {
    let ctxs = group(3);
    let errs = on_ranks(&ctxs, |_, ctx| {
        let odd = ctx.zeros([4, 2]).reduce_scatter_sum().to_vec::<f32>().unwrap_err().to_string();
        let scalar = ctx.zeros([]).all_gather().to_vec::<f32>().unwrap_err().to_string();
        let int_mean =
            ctx.zeros_dtype([3], DType::I64).reduce_scatter_mean().to_vec::<i64>().unwrap_err().to_string();
        (odd, scalar, int_mean)
    });
    let (odd, scalar, int_mean) = &errs[0];
    let first = |s: &str| s.lines().next().unwrap_or_default().to_string();
    assert_eq!(
        first(odd),
        "shape error in reduce_scatter_sum: reduce_scatter_sum splits dim 0 of [4,2] into 3 equal chunks (one per rank), but 4 is not a multiple of 3; pad it"
    );
    assert!(odd.contains("tests/dist/scatter_gather.rs:"), "{odd}");
    assert_eq!(
        first(scalar),
        "shape error in all_gather: all_gather joins along dim 0, but the operand is a scalar"
    );
    assert_eq!(
        first(int_mean),
        "dtype error in reduce_scatter_mean: reduce_scatter_mean needs a float dtype, got i64; use reduce_scatter_sum"
    );
    let lone = Context::cpu();
    let err = lone.zeros([2]).all_gather().to_vec::<f32>().unwrap_err().to_string();
    assert!(err.starts_with("device error: all_gather on a context that is in no process group"), "{err}");
}
