//! Host cost of the lazy path: recording ops and reading a cached plan.
//!
//! The graph is an elementwise chain on `f32[1]`, so the math is
//! negligible and what is timed is the host path: record; then for a read,
//! extract the subgraph, key it, look the plan up, bind the inputs, run,
//! turn the result into a buffer and collect the dead nodes. Every chain
//! step records exactly one node (`y * x`, `tanh`, `y + x`, `sigmoid`,
//! repeated, with `x` a realized `f32[1]`), so `n` ops are `n` recorded
//! nodes; the bench checks that count before it times anything.
//!
//! - `record/n`: recording the `n` ops, no read (the dead nodes are
//!   collected outside the timed region);
//! - `cached_read/n`: one read of a freshly recorded chain whose plan is
//!   already compiled (recording outside the timed region);
//! - `step/n`: both, what one iteration of a loop pays;
//! - `captured/n`: the chain as a captured step (`Context::capture`):
//!   one call and the read, nothing recorded; the host part is flat in
//!   `n`, what grows with `n` is the run itself.
//!
//! `benches/jax_baseline.py overhead` times the same chains under
//! `jax.jit` (a cached dispatch); `benches/side_by_side.sh` runs the two
//! alternately.
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use kiln::prelude::*;
use std::time::{Duration, Instant};

/// The chain lengths (recorded nodes per read).
const SIZES: [usize; 4] = [4, 40, 400, 4000];

/// Records `n` ops on `x`: one node each.
fn chain(x: &Tensor, n: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..n {
        y = match i % 4 {
            0 => &y * x,
            1 => y.tanh(),
            2 => &y + x,
            _ => y.sigmoid(),
        };
    }
    y
}

/// A context with a realized `x` and the plan of `chain(x, n)` compiled.
fn setup(n: usize) -> (Context, Tensor) {
    let ctx = Context::cpu().with_seed(1);
    let x = ctx.tensor(&[0.25f32], [1]);
    x.realize().expect("realize x");
    let before = ctx.stats().graph_nodes;
    let y = chain(&x, n);
    let recorded = ctx.stats().graph_nodes - before;
    assert_eq!(recorded, n, "chain({n}) must record {n} nodes");
    let value = y.to_vec::<f32>().expect("first read compiles");
    assert!(value[0].is_finite());
    (ctx, x)
}

fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("record");
    for n in SIZES {
        let (_ctx, x) = setup(n);
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let y = chain(&x, n);
                    total += t.elapsed();
                    drop(y);
                    // Any read collects the dropped chain.
                    x.to_vec::<f32>().expect("read x");
                }
                total
            })
        });
    }
    group.finish();
}

fn cached_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("cached_read");
    for n in SIZES {
        let (ctx, x) = setup(n);
        let compiles = ctx.stats().compiles;
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_batched(|| chain(&x, n), |y| y.to_vec::<f32>().expect("read"), BatchSize::PerIteration)
        });
        assert_eq!(ctx.stats().compiles, compiles, "every timed read must hit the plan cache");
    }
    group.finish();
}

fn step(c: &mut Criterion) {
    let mut group = c.benchmark_group("step");
    for n in SIZES {
        let (ctx, x) = setup(n);
        let compiles = ctx.stats().compiles;
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| chain(&x, n).to_vec::<f32>().expect("read"))
        });
        assert_eq!(ctx.stats().compiles, compiles, "every timed read must hit the plan cache");
    }
    group.finish();
}

fn captured(c: &mut Criterion) {
    let mut group = c.benchmark_group("captured");
    for n in SIZES {
        let (ctx, x) = setup(n);
        let mut step = ctx.capture(|a: &[Tensor]| Ok(vec![chain(&a[0], n)]));
        step.call(&[&x]).expect("records");
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| step.call(&[&x]).expect("call")[0].to_vec::<f32>().expect("read"))
        });
        assert_eq!(step.captures(), 1, "every timed call must replay");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_secs(1));
    targets = record, cached_read, step, captured
}
criterion_main!(benches);
