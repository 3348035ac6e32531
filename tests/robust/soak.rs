//! Soak and concurrency: a training-like loop (record a step, read its
//! loss, drop everything) keeps graph nodes, buffers, cached plans and
//! resident memory flat; eight threads reading one context all get the
//! right answer, with no deadlock. The long run (100,000 iterations) is
//! `KILN_SOAK_ITERATIONS=100000 cargo test --release --test robust soak --
//! --nocapture`; the suite runs a short one.

use kiln::nn::{self, Linear, Module};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;
use std::sync::Arc;

/// Resident set size of this process in bytes (Linux; 0 elsewhere).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

#[derive(Debug, PartialEq, Eq)]
struct Flat {
    graph_nodes: usize,
    buffers: usize,
    cached_plans: usize,
    compiles: u64,
}

#[test]
fn a_training_loop_stays_flat() -> Result<()> {
    let iterations: usize =
        std::env::var("KILN_SOAK_ITERATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000);
    let ctx = Context::cpu();
    let layer = Linear::new(&ctx, "fc", 16, 4)?;
    let mut opt = Sgd::new(&layer, SgdConfig { lr: 0.01, ..SgdConfig::default() })?;
    let checkpoints: Vec<usize> = [0, 10, iterations / 10, iterations / 2, iterations]
        .into_iter()
        .filter(|&i| i <= iterations)
        .collect();
    let mut seen = Vec::new();
    let mut first_loss = None;
    let mut last_loss = 0.0;
    for i in 0..=iterations {
        if checkpoints.contains(&i) {
            let s = ctx.stats();
            let flat = Flat {
                graph_nodes: s.graph_nodes,
                buffers: s.buffers,
                cached_plans: s.cached_plans,
                compiles: s.compiles,
            };
            eprintln!("soak: iteration {i:>7}: {flat:?}, resident {} KiB", resident_bytes() / 1024);
            seen.push((i, flat, resident_bytes()));
        }
        if i == iterations {
            break;
        }
        // A fixed linear target, fresh inputs every step.
        let x = ctx.randn([32, 16]);
        let target = x.sum(&[1], true) * 0.25;
        let loss = nn::mse(&layer.forward(&x)?, &target.broadcast_to([32, 4]))?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        let value = loss.to_vec::<f32>()?[0];
        assert!(value.is_finite(), "iteration {i}: loss {value}");
        first_loss.get_or_insert(value);
        last_loss = value;
    }
    assert!(last_loss < first_loss.unwrap_or(f32::MAX), "the loop learns: {first_loss:?} -> {last_loss}");
    // From the tenth iteration on, nothing the context holds may grow.
    let steady: Vec<&(usize, Flat, u64)> = seen.iter().filter(|(i, ..)| *i >= 10).collect();
    for w in steady.windows(2) {
        assert_eq!(w[0].1, w[1].1, "iterations {} and {}", w[0].0, w[1].0);
    }
    Ok(())
}

#[test]
fn eight_threads_read_one_context() -> Result<()> {
    let reads: usize =
        std::env::var("KILN_SOAK_THREAD_READS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    let ctx = Arc::new(Context::cpu());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let ctx = ctx.clone();
            std::thread::spawn(move || -> Result<()> {
                for i in 0..reads {
                    // Each thread's own values: a result that mixed up two
                    // threads' inputs or plans shows up as a wrong number.
                    let k = (t * 1_000 + i) as f32;
                    let x = ctx.tensor(&[k, 1.0, 2.0, 3.0], [4]);
                    let y = (&x * 2.0 + 1.0).relu().sum_all();
                    // Exact in f32: small integers throughout.
                    let want = 2.0 * (k + 6.0) + 4.0;
                    let got = y.to_vec::<f32>()?[0];
                    if got != want {
                        return Err(Error::Runtime(format!("thread {t} read {i}: {got}, want {want}")));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a reader thread panicked")?;
    }
    assert_eq!(ctx.stats().compiles, 1, "every thread's read is the same plan");
    Ok(())
}
