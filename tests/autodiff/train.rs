//! Training through variables, `backward` and `assign`: an MLP's whole
//! step (forward, backward, SGD update) is one recorded graph that
//! compiles once and runs as one plan. Snapshots show that step fused and
//! planned; a 1,000-step loop with a changing learning rate learns and
//! keeps compiles and the graph flat.

use crate::snapshots;
use kiln::prelude::*;

/// A two-layer perceptron whose parameters live in `layer1` / `layer2`.
struct Mlp {
    layers: Vec<(Variable, Variable)>,
}

impl Mlp {
    /// Finds (or, the first time, makes) the parameters.
    fn new(ctx: &Context, sizes: &[usize]) -> Result<Mlp> {
        let mut layers = Vec::new();
        for (i, pair) in sizes.windows(2).enumerate() {
            let (n_in, n_out) = (pair[0], pair[1]);
            layers.push(ctx.scope(&format!("layer{}", i + 1), |ctx| {
                let scale = (1.0 / n_in as f64).sqrt() as f32;
                Ok((
                    ctx.variable("w", ctx.randn([n_in, n_out]) * scale)?,
                    ctx.variable("b", ctx.zeros([n_out]))?,
                ))
            })?);
        }
        Ok(Mlp { layers })
    }

    fn forward(&self, ctx: &Context, x: &Tensor, act: fn(&Tensor) -> Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let last = self.layers.len() - 1;
        for (i, (w, b)) in self.layers.iter().enumerate() {
            h = ctx.scope(&format!("layer{}", i + 1), |_| {
                let z = h.matmul(w) + b;
                Ok(if i < last { act(&z) } else { z })
            })?;
        }
        Ok(h)
    }
}

/// Plain SGD: `v -= lr * grad` for every variable with a gradient, then
/// the gradients are released (before the read, so the step's plan never
/// writes them out).
fn sgd(ctx: &Context, grads: &Gradients, lr: &Tensor) -> Result<()> {
    for (v, g) in grads.iter() {
        v.assign(v - &(g * lr))?;
    }
    ctx.zero_grad();
    Ok(())
}

/// One classification step of the MLP on `x` with soft targets `t`:
/// cross-entropy, backward, SGD. Returns the loss (not yet read).
fn classify_step(ctx: &Context, mlp: &Mlp, x: &Tensor, t: &Tensor, lr: f32) -> Result<Tensor> {
    let z = ctx.scope("model", |ctx| mlp.forward(ctx, x, Tensor::relu))?;
    let loss = ctx.scope("loss", |_| Ok(-(t * &z.log_softmax(1)).sum(&[1], false).mean(&[0], false)))?;
    let grads = loss.backward()?;
    ctx.scope("sgd", |ctx| sgd(ctx, &grads, &ctx.scalar(lr)))?;
    Ok(loss)
}

fn soft_targets(ctx: &Context, rows: usize, classes: usize) -> Tensor {
    let data: Vec<f32> =
        (0..rows * classes).map(|i| if i % classes == (i / classes) % classes { 1.0 } else { 0.0 }).collect();
    ctx.tensor(&data, [rows, classes])
}

/// Records the steady-state step (after one step has run) on a context.
fn recorded_step(ctx: &Context) -> Result<Tensor> {
    let x = ctx.randn([8, 16]);
    x.realize()?;
    let t = soft_targets(ctx, 8, 10);
    let mlp = ctx.scope("model", |ctx| Mlp::new(ctx, &[16, 32, 10]))?;
    classify_step(ctx, &mlp, &x, &t, 0.1)?.item::<f32>()?;
    classify_step(ctx, &mlp, &x, &t, 0.05)
}

/// The whole step through the whole pipeline: the forward pass, the
/// `grad/...` regions and the SGD updates fused into few kernels and
/// planned in one arena (the plan line compares it with its lower bound).
#[test]
fn mlp_step_fused_and_planned() -> Result<()> {
    let ctx = Context::cpu().with_seed(11);
    let loss = recorded_step(&ctx)?;
    let planned = ctx.explain(&[&loss])?;
    let plan_line = planned.lines().next().unwrap_or_default().to_string();
    assert!(plan_line.starts_with("plan schedule streams=1 arena="), "{plan_line}");
    assert!(planned.contains("@grad/model/layer1"), "{planned}");
    // 1 loss + 4 updated variables.
    assert_eq!(planned.lines().last().unwrap().matches('%').count(), 5, "{planned}");
    snapshots().bind(|| insta::assert_snapshot!("train__mlp_step_planned", planned));
    // Reading the loss runs it as one plan, and every update lands there.
    let (compiles, hits) = (ctx.stats().compiles, ctx.stats().cache_hits);
    assert!(ctx.workspace().variables.iter().all(|v| v.pending));
    loss.item::<f32>()?;
    assert_eq!((ctx.stats().compiles, ctx.stats().cache_hits), (compiles + 1, hits));
    assert!(ctx.workspace().variables.iter().all(|v| !v.pending));
    Ok(())
}

/// The `.kir` pass cases of the step are the graph the context records:
/// the fusion case is the step after the canonical passes, and stays in
/// sync with this code.
#[test]
fn the_step_pass_case_is_the_recorded_step() -> Result<()> {
    let ctx =
        Context::cpu().with_seed(11).with_passes("-remat,-fusion,-schedule,-horizontal,-streams,-memory");
    let loss = recorded_step(&ctx)?;
    let canonical = ctx.explain(&[&loss])?;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/passes/fusion/mlp-train-step.kir");
    if std::env::var_os("KILN_BLESS_CASES").is_some() {
        let header = "test fusion\n\
            ;; A whole training step as the context records it (tests/autodiff/train.rs):\n\
            ;; an MLP 16 -> 32 (relu) -> 10, log-softmax cross-entropy, its backward\n\
            ;; pass (the grad/... regions) and the SGD updates of the four variables\n\
            ;; (the outputs after the loss), after the canonical passes. Fusion puts\n\
            ;; layer 1's bias into its matmul (relu stays a node of its own: the\n\
            ;; backward pass also reads the pre-activation, for relu's mask), the\n\
            ;; softmax rows into reduction nodes, relu's mask into the matmul of\n\
            ;; layer 1's backward pass, and each weight update into the matmul that\n\
            ;; computes that weight's gradient (SGD as a GEMM epilogue). The bias\n\
            ;; gradients are column sums, which no reduction group takes (they\n\
            ;; reduce a leading dim), so they and their updates stay small kernels.\n";
        std::fs::write(path, format!("{header}{canonical}")).unwrap();
    }
    let case = kiln::ir::text::parse_test_file(&std::fs::read_to_string(path).unwrap())?;
    assert_eq!(kiln::ir::text::print(&case.graph), canonical, "regenerate {path} from this test's graph");
    Ok(())
}

#[test]
fn a_thousand_sgd_steps_with_a_changing_learning_rate() -> Result<()> {
    let ctx = Context::cpu().with_seed(2024);
    // Regression onto a fixed random function of the inputs.
    let x = ctx.randn([64, 8]);
    x.realize()?;
    let a = ctx.randn([8, 3]);
    let target = x.matmul(&a).sin();
    target.realize()?;
    drop(a);
    let mlp = ctx.scope("model", |ctx| Mlp::new(ctx, &[8, 32, 3]))?;
    let mut losses = Vec::new();
    let mut graph_sizes = Vec::new();
    let steps = 1000;
    for step in 0..steps {
        // A cosine schedule: a new learning rate every step.
        let lr = 0.02 + 0.18 * 0.5 * (1.0 + (std::f32::consts::PI * step as f32 / steps as f32).cos());
        let y = ctx.scope("model", |ctx| mlp.forward(ctx, &x, Tensor::tanh))?;
        let diff = &y - &target;
        let loss = (&diff * &diff).mean(&[0, 1], false);
        let grads = loss.backward()?;
        sgd(&ctx, &grads, &ctx.scalar(lr))?;
        losses.push(loss.item::<f32>()?);
        graph_sizes.push(ctx.stats().graph_nodes);
    }
    let stats = ctx.stats();
    let (first, last) = (losses[0], losses[steps - 1]);
    println!(
        "1000 SGD steps: loss {first:.4} -> {last:.4}; compiles {}, cache hits {}, graph nodes at steps 10/500/1000: {}/{}/{}",
        stats.compiles, stats.cache_hits, graph_sizes[9], graph_sizes[499], graph_sizes[999]
    );
    // Without the updates the loss stays at the first value.
    assert!(last < 0.1 * first, "loss {first} -> {last}");
    assert!(stats.compiles <= 4, "{} compiles", stats.compiles);
    assert_eq!(graph_sizes[9], graph_sizes[999], "the graph grows: {graph_sizes:?}");
    Ok(())
}

/// Accumulating over micro-batches gives the full batch's gradient: two
/// backward passes before the update, each of half the batch.
#[test]
fn gradient_accumulation_over_micro_batches() -> Result<()> {
    let ctx = Context::cpu().with_seed(9);
    let x = ctx.randn([8, 4]);
    x.realize()?;
    let w = ctx.variable("w", ctx.randn([4, 2]))?;
    let loss_of = |rows: &Tensor| rows.matmul(&w).tanh().sum_all();
    let full = loss_of(&x).backward()?.get(&w).unwrap().to_vec::<f32>()?;
    ctx.zero_grad();
    loss_of(&x.narrow(0, 0, 4)).backward()?;
    // A read between the two: the held gradient becomes a buffer, and the
    // second pass adds to it.
    ctx.sync()?;
    assert!(!ctx.workspace().get("w").unwrap().pending);
    let acc = loss_of(&x.narrow(0, 4, 4)).backward()?.get(&w).unwrap().to_vec::<f32>()?;
    for (a, f) in acc.iter().zip(&full) {
        assert!((a - f).abs() < 1e-5, "{acc:?} vs {full:?}");
    }
    assert_eq!(ctx.grad(&w).unwrap().to_vec::<f32>()?, acc);
    Ok(())
}
