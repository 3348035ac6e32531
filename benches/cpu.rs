//! CPU backend benchmarks. Compare with `python3 benches/numpy_baseline.py`
//! run in the same session (see README).
//!
//! - matmul 1024^3 f32;
//! - the 8-op elementwise chain on 2^24 f32, with fusion on and off
//!   (`with_passes("-fusion")`, what `KILN_PASSES=-fusion` does);
//! - softmax and layer norm over the last dim of [2048, 1024] f32, fusion
//!   on and off.
//!
//! Each read realizes one cached plan: the timed work is the plan's run.
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

/// A context with the default pipeline (`fused`) or without fusion.
fn context(fused: bool, seed: u64) -> Context {
    let ctx = Context::cpu().with_seed(seed);
    if fused {
        ctx
    } else {
        ctx.with_passes("-fusion")
    }
}

fn label(fused: bool) -> &'static str {
    if fused {
        "fused"
    } else {
        "unfused"
    }
}

fn elementwise_chain(c: &mut Criterion) {
    for fused in [true, false] {
        let ctx = context(fused, 2);
        let x = ctx.randn([1 << 24]);
        x.realize().expect("realize input");
        c.bench_function(&format!("chain8_2^24_f32/{}", label(fused)), |bench| {
            bench.iter(|| {
                chain(&x).realize().expect("chain");
            })
        });
    }
}

fn softmax_and_layer_norm(c: &mut Criterion) {
    for fused in [true, false] {
        let ctx = context(fused, 3);
        let x = ctx.randn([2048, 1024]);
        let w = ctx.randn([1024]);
        let b = ctx.randn([1024]);
        ctx.realize(&[&x, &w, &b]).expect("realize inputs");
        c.bench_function(&format!("softmax_2048x1024_f32/{}", label(fused)), |bench| {
            bench.iter(|| {
                x.softmax(1).realize().expect("softmax");
            })
        });
        c.bench_function(&format!("layer_norm_2048x1024_f32/{}", label(fused)), |bench| {
            bench.iter(|| {
                x.layer_norm(&w, &b, 1e-5).realize().expect("layer_norm");
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = matmul_1024, elementwise_chain, softmax_and_layer_norm
}
criterion_main!(benches);
