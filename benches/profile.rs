//! What profiling costs: a cached read of a chain of `n` unfused steps
//! (`-fusion`, so every op is one step of the plan and the per-step
//! profiling check runs `n` times) on `f32[1]`, where the host path is
//! all there is to time, with profiling off and on.
//!
//! Off, a plan has no recorder: what is left on its path is one `Option`
//! test per step and one per read (`backends/cpu/run.rs`,
//! `context/realize.rs`), so `off` should match the `cached_read` of
//! `benches/overhead.rs` before profiling existed, within noise. On, each
//! step reads the clock twice and takes a mutex, and each read collects
//! the run's times.
//!
//! Measured (2-core EPYC, criterion medians, 30 samples): `off/40`
//! 117.3 µs and `off/400` 551.9 µs on this branch; the same bench with
//! the profiling calls removed, on the commit before profiling existed
//! (615d9a1), 119.6 µs and 552.8 µs (criterion: no change, p = 0.81 and
//! 0.99; the noise here is ±15%). `on/40` 140.4 µs, `on/400` 917.2 µs.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kiln::prelude::*;
use std::time::Duration;

const SIZES: [usize; 2] = [40, 400];

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

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("profiling");
    g.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for on in [false, true] {
        let ctx = Context::cpu().with_passes("-fusion").with_profiling(on);
        let x = ctx.tensor(&[0.5f32], [1]);
        for n in SIZES {
            chain(&x, n).to_vec::<f32>().expect("warm-up read");
            let name = if on { "on" } else { "off" };
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                b.iter_batched(
                    || chain(&x, n),
                    |y| y.to_vec::<f32>().expect("read"),
                    criterion::BatchSize::SmallInput,
                )
            });
            ctx.reset_profile();
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
