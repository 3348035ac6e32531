//! Compile time of the full pass pipeline on a 10,000-node graph: a deep
//! residual MLP unrolled (each block: matmul, bias, gelu, residual add,
//! layer norm; 22 nodes), as recorded by the user API. The timed call is
//! `Context::optimized_graph`: extraction plus every pass, no backend.
use criterion::{criterion_group, criterion_main, Criterion};
use kiln::prelude::*;

/// Records `blocks` residual blocks of width 64 on a batch of 8; returns the
/// context and the output.
fn deep_mlp(blocks: usize) -> (Context, Tensor) {
    let ctx = Context::cpu().with_seed(7);
    let width = 64;
    let mut h = ctx.randn([8, width]);
    for _ in 0..blocks {
        let w = ctx.randn([width, width]);
        let b = ctx.randn([width]);
        let (gamma, beta) = (ctx.randn([width]), ctx.randn([width]));
        let y = (h.matmul(&w) + &b).gelu() + &h;
        h = y.layer_norm(&gamma, &beta, 1e-5);
    }
    (ctx, h)
}

fn compile_10k(c: &mut Criterion) {
    let (ctx, out) = deep_mlp(455);
    let recorded = ctx.stats().graph_nodes;
    let optimized = ctx.optimized_graph(&[&out]).expect("compiles");
    eprintln!("deep MLP: {recorded} recorded nodes, {} after the pipeline", optimized.topo_order().len());
    c.bench_function("compile_deep_mlp_10k_nodes", |bench| {
        bench.iter(|| ctx.optimized_graph(&[&out]).expect("compiles"))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = compile_10k
}
criterion_main!(benches);
