//! CPU backend benchmarks: matmul 1024^3 f32 and an 8-op elementwise chain
//! on 2^24 f32. Compare with `python3 benches/numpy_baseline.py` run in the
//! same session (see README).
use criterion::{criterion_group, criterion_main, Criterion};
use kiln::prelude::*;

fn matmul_1024(c: &mut Criterion) {
    let ctx = Context::cpu().with_seed(1);
    let a = ctx.randn([1024, 1024]);
    let b = ctx.randn([1024, 1024]);
    ctx.realize(&[&a, &b]).expect("realize inputs");
    c.bench_function("matmul_1024_f32", |bench| {
        bench.iter(|| {
            let out = a.matmul(&b);
            out.realize().expect("matmul");
        })
    });
}

/// The chain numpy writes as `np.tanh(np.exp(-np.abs(x * 2.0 + 1.0)) * x - 0.5)`:
/// mul, add, abs, neg, exp, mul, sub, tanh.
fn chain(x: &Tensor) -> Tensor {
    ((x * 2.0 + 1.0).abs().neg().exp() * x - 0.5).tanh()
}

fn elementwise_chain(c: &mut Criterion) {
    let ctx = Context::cpu().with_seed(2);
    let x = ctx.randn([1 << 24]);
    x.realize().expect("realize input");
    c.bench_function("chain8_2^24_f32", |bench| {
        bench.iter(|| {
            chain(&x).realize().expect("chain");
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = matmul_1024, elementwise_chain
}
criterion_main!(benches);
