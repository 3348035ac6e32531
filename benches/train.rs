//! One compiled training step: the quickstart MLP (x[64,784] -> 128 relu
//! -> 10, log-softmax cross-entropy on soft targets, f32) with `backward`
//! and a plain SGD update of its four variables through `assign`, the
//! learning rate a runtime scalar that changes every step. Each iteration
//! records the step and reads the loss: the whole host path (record,
//! extract, key, look up, bind) plus one planned run that computes the
//! loss, the gradients and the four updates. Compared side by side with
//! the same step unfused (`with_passes("-fusion")`) and with the forward
//! pass and loss alone. The step's plan line (arena, lower bound, naive)
//! is printed once.
//!
//! `train_step_mlp_784_1024x3_10_adamw` is the issue-10 comparison: an
//! MLP 784-1024-1024-1024-10 (ReLU) built from `kiln::nn`, batch 128,
//! cross-entropy on integer labels, AdamW through `kiln::optim`, f32;
//! each step takes the next of 64 fixed random batches (random labels, so
//! the loss never reaches 0 and the arithmetic stays out of subnormals);
//! `benches/jax_train_step.py` times the same step under `jax.jit`.
use criterion::{criterion_group, criterion_main, Criterion};
use kiln::nn::{self, Linear, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::prelude::*;

struct Model {
    params: [(Variable, Variable); 2],
}

fn setup(ctx: &Context) -> (Model, Tensor, Tensor) {
    let x = ctx.randn([64, 784]);
    let rows: Vec<f32> = (0..64 * 10).map(|i| if i % 10 == (i / 10) % 10 { 1.0 } else { 0.0 }).collect();
    let t = ctx.tensor(&rows, [64, 10]);
    ctx.realize(&[&x]).expect("inputs");
    let layer = |name: &str, n_in: usize, n_out: usize| {
        ctx.scope(name, |ctx| {
            let w = ctx.variable("w", ctx.randn([n_in, n_out]) * (1.0 / (n_in as f32).sqrt()))?;
            Ok((w, ctx.variable("b", ctx.zeros([n_out]))?))
        })
        .expect("variables")
    };
    let params = [layer("layer1", 784, 128), layer("layer2", 128, 10)];
    (Model { params }, x, t)
}

fn loss(model: &Model, x: &Tensor, t: &Tensor) -> Tensor {
    let [(w1, b1), (w2, b2)] = &model.params;
    let h = (x.matmul(w1) + b1).relu();
    let z = h.matmul(w2) + b2;
    -(t * &z.log_softmax(1)).sum(&[1], false).mean(&[0], false)
}

fn step(ctx: &Context, model: &Model, x: &Tensor, t: &Tensor, lr: f32) -> Tensor {
    let l = loss(model, x, t);
    let grads = l.backward().expect("backward");
    let lr = ctx.scalar(lr);
    for (v, g) in grads.iter() {
        v.assign(v - &(g * &lr)).expect("assign");
    }
    ctx.zero_grad();
    l
}

fn train_step(c: &mut Criterion) {
    for (name, ctx) in [
        ("train_step_mlp_784_128_10", Context::cpu().with_seed(3)),
        ("train_step_mlp_784_128_10_unfused", Context::cpu().with_seed(3).with_passes("-fusion")),
    ] {
        let (model, x, t) = setup(&ctx);
        step(&ctx, &model, &x, &t, 0.1).item::<f32>().expect("first step");
        let l = step(&ctx, &model, &x, &t, 0.1);
        let plan = ctx.explain(&[&l]).expect("explain");
        eprintln!("{name}: {}", plan.lines().next().unwrap_or_default());
        l.item::<f32>().expect("second step");
        let mut k = 0u32;
        c.bench_function(name, |bench| {
            bench.iter(|| {
                k += 1;
                step(&ctx, &model, &x, &t, 0.1 / (1.0 + k as f32 * 1e-3)).item::<f32>().expect("step")
            })
        });
        let s = ctx.stats();
        eprintln!(
            "{name}: {} compiles, {} cache hits, {} graph nodes",
            s.compiles, s.cache_hits, s.graph_nodes
        );
    }
    let ctx = Context::cpu().with_seed(3);
    let (model, x, t) = setup(&ctx);
    ctx.sync().expect("init");
    c.bench_function("forward_loss_mlp_784_128_10", |bench| {
        bench.iter(|| loss(&model, &x, &t).item::<f32>().expect("loss"))
    });
}

/// Batches in the AdamW row's pool (see `big_mlp_adamw`); the same in
/// `benches/jax_train_step.py`.
const POOL: usize = 64;

fn big_mlp_adamw(c: &mut Criterion) {
    let ctx = Context::cpu().with_seed(5);
    let model = Sequential::new(&ctx, "mlp", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 784, 1024)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "2", 1024, 1024)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "4", 1024, 1024)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "6", 1024, 10)?.boxed(),
        ])
    })
    .expect("model");
    let mut opt = AdamW::new(&model, AdamConfig::adamw()).expect("optimizer");
    // A pool of POOL batches (normal inputs, uniformly random labels), one
    // per step in turn. One batch reused every step was memorized: the
    // loss was 0 after 20 steps, and from then on the step measured
    // subnormal arithmetic (35 ms at step 10, 1.9 s at step 59; issue 38).
    // 64 x 128 random labels are far more than the steps criterion runs
    // can memorize, so the loss stays near ln 10 and the gradients normal.
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let pool: Vec<(Tensor, Tensor)> = (0..POOL)
        .map(|_| {
            let labels: Vec<i64> = (0..128)
                .map(|_| {
                    seed =
                        seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ((seed >> 33) % 10) as i64
                })
                .collect();
            (ctx.randn([128, 784]), ctx.tensor(&labels, [128]))
        })
        .collect();
    ctx.realize(&pool.iter().flat_map(|(x, y)| [x, y]).collect::<Vec<_>>()).expect("inputs");
    let mut i = 0;
    let mut step = || {
        let (x, y) = &pool[i % POOL];
        i += 1;
        let loss = nn::cross_entropy(&model.forward(x).expect("forward"), y).expect("loss");
        loss.backward().expect("backward");
        opt.step().expect("step");
        opt.zero_grad().expect("zero_grad");
        loss
    };
    step().item::<f32>().expect("first step");
    let l = step();
    let plan = ctx.explain(&[&l]).expect("explain");
    eprintln!("train_step_mlp_784_1024x3_10_adamw: {}", plan.lines().next().unwrap_or_default());
    l.item::<f32>().expect("second step");
    let mut last = 0.0;
    c.bench_function("train_step_mlp_784_1024x3_10_adamw", |bench| {
        bench.iter(|| last = step().item::<f32>().expect("step"))
    });
    let s = ctx.stats();
    eprintln!(
        "train_step_mlp_784_1024x3_10_adamw: {} compiles, {} cache hits, {i} steps, last loss {last:.4}",
        s.compiles, s.cache_hits
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = train_step, big_mlp_adamw
}
criterion_main!(benches);
