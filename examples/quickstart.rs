//! The first program in the README: a small MLP layer and softmax, recorded
//! lazily, run when a value is read, and the optimized graph printed; then
//! a two-layer MLP forward pass with a cross-entropy loss, whose planned
//! memory (arena, lower bound, one allocation per value) is printed too.
//! It runs on the best device here: CUDA device 0 when there is one (and
//! kiln was built with `--features cuda`), else the CPU.
use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    let ctx = Context::best().with_seed(7);
    println!("device: {}", ctx.device_description());
    let x = ctx.randn([64, 784]); // f32 by default
    let w = ctx.randn([784, 128]) * 0.05;
    let b = ctx.zeros([128]);
    let h = (x.matmul(&w) + &b).relu(); // nothing runs yet
    let p = h.softmax(1);
    let rows: Vec<f32> = p.sum(&[1], false).to_vec()?; // runs here
    assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-5));
    println!("{}", ctx.explain(&[&p])?); // optimized IR as text

    // Forward + loss: cross-entropy against soft targets.
    let w2 = ctx.randn([128, 10]) * 0.1;
    let b2 = ctx.randn([10]) * 0.1;
    let logits = h.matmul(&w2) + &b2;
    let targets = ctx.randn([64, 10]).softmax(1);
    let loss = (logits.log_softmax(1) * &targets).sum(&[1], false).mean(&[0], false).neg();
    // Explain before reading: a read makes the loss a realized buffer.
    let plan = ctx.explain(&[&loss])?;
    let value: f32 = loss.item()?;
    assert!(value.is_finite() && value > 0.0);
    let kernels = plan.lines().filter(|l| l.starts_with('%') && !l.contains("= input")).count();
    println!("MLP forward + loss = {value:.4}, {kernels} top-level nodes; memory plan:");
    println!("{}", plan.lines().next().unwrap_or_default());
    let s = ctx.stats();
    println!(
        "plans compiled: {}, cache hits: {}, kernels compiled: {} (from the disk cache: {})",
        s.compiles, s.cache_hits, s.kernel_compiles, s.kernel_disk_hits
    );
    Ok(())
}
