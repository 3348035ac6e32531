//! CPU backend benchmarks. Compare with `benches/jax_baseline.py` (jax.jit
//! and numpy) run alternately in the same session: `benches/side_by_side.sh`.
//!
//! - matmul 1024^3 f32;
//! - the encoder's products (MiniLM-L6 at batch 8 x 128: 1024 rows, k and
//!   n of 384 and 1536, the weight read through `w.t()` as `Linear`
//!   reads it), with criterion's throughput in elements set to the
//!   product's FLOPs, so "elem/s" reads as FLOP/s;
//! - an MLP forward pass (784-1024-1024-1024-10, batch 128, relu);
//! - the 8-op elementwise chain on 2^24 f32, with fusion on and off
//!   (`with_passes("-fusion")`, what `KILN_PASSES=-fusion` does), and
//!   `tanh(x*1.5+0.5)*sigmoid(x) + x*x`;
//! - softmax and layer norm over the last dim of [2048, 1024] and
//!   [8192, 4096] f32 (the smaller with fusion on and off), next to
//!   `copy`: a plain two-thread copy of the same bytes into an already
//!   written buffer, the machine's copy bandwidth the row kernels are
//!   measured against (a row kernel also reads its input once and writes
//!   its output once).
//!
//! - fused elementwise bodies (an AdamW update with three outputs, an
//!   `exp`/`sigmoid` body) at 4K, 64K and 1M elements, as generated code
//!   and interpreted (`KILN_CPU_CODEGEN=0`), side by side in one run.
//!
//! Each read realizes one cached plan: the timed work is the plan's run.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

/// `[8, 128, k] x w.t()` for `w: [n, k]`, MiniLM-L6's linear layers at
/// batch 8 x 128 (the attention projections, the feed-forward's two).
fn matmul_encoder(c: &mut Criterion) {
    let ctx = Context::cpu().with_seed(6);
    let mut group = c.benchmark_group("matmul_encoder");
    for (k, n) in [(384, 384), (384, 1536), (1536, 384)] {
        let x = ctx.randn([8, 128, k]);
        let w = ctx.randn([n, k]);
        ctx.realize(&[&x, &w]).expect("realize inputs");
        group.throughput(Throughput::Elements((2 * 1024 * k * n) as u64));
        group.bench_function(format!("1024x{k}x{n}_wt_f32"), |bench| {
            bench.iter(|| {
                x.matmul(&w.t()).realize().expect("matmul");
            })
        });
    }
    group.finish();
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
    for (rows, cols) in [(2048, 1024), (8192, 4096)] {
        for fused in [true, false] {
            if !fused && rows > 2048 {
                continue;
            }
            let ctx = context(fused, 3);
            let x = ctx.randn([rows, cols]);
            let w = ctx.randn([cols]);
            let b = ctx.randn([cols]);
            ctx.realize(&[&x, &w, &b]).expect("realize inputs");
            let suffix = if fused { String::new() } else { "/unfused".to_string() };
            c.bench_function(&format!("softmax_{rows}x{cols}_f32{suffix}"), |bench| {
                bench.iter(|| {
                    x.softmax(1).realize().expect("softmax");
                })
            });
            c.bench_function(&format!("layer_norm_{rows}x{cols}_f32{suffix}"), |bench| {
                bench.iter(|| {
                    x.layer_norm(&w, &b, 1e-5).realize().expect("layer_norm");
                })
            });
        }
        // The machine's copy bandwidth for the same bytes: two threads
        // (one per core, as the kernels use), each copying half.
        let src: Vec<f32> = (0..rows * cols).map(|i| (i % 1013) as f32).collect();
        let mut dst = vec![0f32; rows * cols];
        c.bench_function(&format!("copy_{rows}x{cols}_f32"), |bench| {
            bench.iter(|| {
                let half = src.len() / 2;
                let (d0, d1) = dst.split_at_mut(half);
                std::thread::scope(|s| {
                    s.spawn(|| d1.copy_from_slice(&src[half..]));
                    d0.copy_from_slice(&src[..half]);
                });
                std::hint::black_box(&dst);
            })
        });
    }
}

/// `tanh(x*1.5+0.5)*sigmoid(x) + x*x` on 2^24 f32 (the chain).
fn tanh_sigmoid_chain(c: &mut Criterion) {
    let ctx = context(true, 2);
    let x = ctx.randn([1 << 24]);
    x.realize().expect("realize input");
    c.bench_function("chain_tanh_sigmoid_2^24_f32", |bench| {
        bench.iter(|| {
            ((&x * 1.5 + 0.5).tanh() * x.sigmoid() + &x * &x).realize().expect("chain");
        })
    });
}

/// An MLP forward pass: 784-1024-1024-1024-10, batch 128, relu after each
/// hidden layer (weights and input realized, as jax's are device arrays).
fn mlp_forward(c: &mut Criterion) {
    let ctx = Context::cpu().with_seed(4);
    let sizes = [784, 1024, 1024, 1024, 10];
    let mut params = Vec::new();
    for win in sizes.windows(2) {
        let w = ctx.randn([win[0], win[1]]) * (1.0 / (win[0] as f64).sqrt());
        let b = ctx.randn([win[1]]) * 0.1;
        params.push((w, b));
    }
    let x = ctx.randn([128, 784]);
    for (w, b) in &params {
        ctx.realize(&[w, b]).expect("realize params");
    }
    x.realize().expect("realize input");
    c.bench_function("mlp_forward_b128", |bench| {
        bench.iter(|| {
            let mut h = x.clone();
            for (k, (w, b)) in params.iter().enumerate() {
                h = h.matmul(w) + b;
                if k + 1 < params.len() {
                    h = h.relu();
                }
            }
            h.realize().expect("mlp");
        })
    });
}

/// A CPU context whose fused bodies run as generated code (`true`) or
/// interpreted: the backend reads `KILN_CPU_CODEGEN` when it is made
/// (`all`: exp bodies too, which the default leaves interpreted).
fn codegen_context(generated: bool, seed: u64) -> Context {
    std::env::set_var("KILN_CPU_CODEGEN", if generated { "all" } else { "0" });
    let ctx = Context::cpu().with_seed(seed);
    std::env::remove_var("KILN_CPU_CODEGEN");
    ctx
}

/// Generated code against the interpreter on the same fused bodies.
fn codegen_vs_interpreter(c: &mut Criterion) {
    for n in [1usize << 12, 1 << 16, 1 << 20] {
        for generated in [true, false] {
            let label = if generated { "generated" } else { "interpreted" };
            let ctx = codegen_context(generated, 5);
            let (p, g, m, v) = (ctx.randn([n]), ctx.randn([n]), ctx.randn([n]), ctx.randn([n]).abs());
            ctx.realize(&[&p, &g, &m, &v]).expect("realize inputs");
            c.bench_function(&format!("adamw_update_{n}_f32/{label}"), |bench| {
                bench.iter(|| {
                    let m2 = &m * 0.9 + &g * 0.1;
                    let v2 = &v * 0.999 + &g * &g * 0.001;
                    let p2 = &p - m2.clone() / (v2.sqrt() + 1e-8) * 0.01;
                    ctx.realize(&[&p2, &m2, &v2]).expect("adamw");
                })
            });
            c.bench_function(&format!("exp_sigmoid_{n}_f32/{label}"), |bench| {
                bench.iter(|| {
                    ((&p * 0.5).exp() * g.sigmoid() + &m).realize().expect("exp sigmoid");
                })
            });
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = matmul_1024, matmul_encoder, mlp_forward, elementwise_chain, tanh_sigmoid_chain, softmax_and_layer_norm,
        codegen_vs_interpreter
}
criterion_main!(benches);
