//! Cold start: `Context::warm_up` compiles without running, the read after
//! it compiles nothing; `Stats` says how long compiling took; on CUDA two
//! plans that share kernels compile them once, and many threads compiling
//! on one context at once get their own right values.

use super::{data, devices};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

#[test]
fn warm_up_compiles_without_running_and_the_read_after_it_compiles_nothing() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let x = ctx.tensor(&data(256, 1), [16, 16]);
        let y = (x.matmul(&x) * 0.25).tanh().sum(&[1], false);
        assert_eq!(ctx.stats().last_compile, None, "{name}: nothing compiled yet");
        let ran = ctx.stats().nodes_executed;
        ctx.warm_up(&[&y])?;
        let s = ctx.stats();
        assert_eq!(s.compiles, 1, "{name}");
        assert_eq!(s.nodes_executed, ran, "{name}: warm_up ran something");
        let t = s.last_compile.expect("a compile time");
        assert!(t.total() > std::time::Duration::ZERO && s.compile_time >= t.total(), "{name}: {t:?}");
        let got = y.to_vec::<f32>()?;
        assert_eq!(ctx.stats().compiles, 1, "{name}: the read compiled again");
        let xs = data(256, 1);
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..16)
                .map(|j| {
                    let v: f64 = (0..16).map(|k| xs[i * 16 + k] as f64 * xs[k * 16 + j] as f64).sum();
                    (v * 0.25).tanh()
                })
                .sum();
            assert!((*g as f64 - want).abs() < 1e-4, "{name}: row {i}: {g} vs {want}");
        }
        // A failed tensor's error, at the warm-up.
        let bad = x.matmul(&ctx.zeros([3, 3]));
        assert!(ctx.warm_up(&[&bad]).is_err(), "{name}: a failed tensor warmed up");
    }
    Ok(())
}

/// A training step warmed up through its loss: the plan a read of the
/// loss runs includes the optimizer's pending updates, so the first real
/// step compiles nothing.
#[test]
fn a_training_step_warmed_up_through_its_loss_compiles_nothing_at_its_first_step() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make().with_seed(3);
        let model = kiln::nn::Linear::new(&ctx, "fc", 8, 4)?;
        let mut opt = Sgd::new(&model, SgdConfig { lr: 0.1, ..SgdConfig::default() })?;
        let x = ctx.tensor(&data(32, 2), [4, 8]);
        let t = ctx.tensor(&data(16, 3), [4, 4]);
        let step = |opt: &mut Sgd| -> Result<Tensor> {
            use kiln::nn::Module;
            let loss = kiln::nn::mse(&model.forward(&x)?, &t)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            Ok(loss)
        };
        let loss = step(&mut opt)?;
        ctx.warm_up(&[&loss])?;
        let compiled = ctx.stats().compiles;
        let first = loss.item::<f32>()?;
        assert_eq!(ctx.stats().compiles, compiled, "{name}: the warmed-up step compiled again");
        let second = step(&mut opt)?.item::<f32>()?;
        assert!(second < first, "{name}: the step did not train ({first} then {second})");
    }
    Ok(())
}

/// On CUDA: the same graph compiled as a second plan (CUDA graphs off is
/// another plan key) loads every kernel from the first plan's cache and
/// compiles none.
#[test]
fn two_plans_sharing_kernels_compile_them_once() -> Result<()> {
    for (name, make) in devices() {
        if name != "cuda" {
            continue;
        }
        let ctx = make();
        // A constant no earlier run used: its kernels are new to the cache.
        let c = 1.0 + (std::process::id() % 997) as f32 / 1000.0;
        let x = ctx.tensor(&data(4096, 9), [64, 64]);
        let y = || ((&x * c).sin() + 1.0).sum(&[1], false).exp();
        let want = y().to_vec::<f32>()?;
        let first = ctx.stats();
        assert!(first.kernel_compiles + first.kernel_disk_hits > 0, "{name}: no kernel was built");
        let ctx = ctx.with_cuda_graphs(false);
        assert_eq!(y().to_vec::<f32>()?, want, "{name}: the second plan's values");
        let second = ctx.stats();
        assert_eq!(second.compiles, first.compiles + 1, "{name}: the second plan was not compiled");
        assert_eq!(second.kernel_compiles, first.kernel_compiles, "{name}: a shared kernel compiled twice");
        assert!(second.kernel_memory_hits > first.kernel_memory_hits, "{name}: no kernel came from memory");
    }
    Ok(())
}

/// Eight threads compile and read different graphs on one context at once
/// (on CUDA, the plans compile one at a time under the context's lock, each
/// as a few NVRTC programs on threads of its own, while the other threads
/// wait and then read):
/// every value is its own graph's.
#[test]
fn threads_compiling_on_one_context_at_once_get_their_own_values() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let x = ctx.tensor(&data(1024, 5), [1024]);
        let salt = (std::process::id() % 991) as f32 / 1000.0;
        std::thread::scope(|s| -> Result<()> {
            let handles: Vec<_> = (0..8)
                .map(|k| {
                    let (ctx, x) = (&ctx, &x);
                    s.spawn(move || -> Result<()> {
                        let c = 0.5 + k as f32 * 0.125 + salt;
                        let y = (x * c).tanh() + (x * (c + 1.0)).sin();
                        ctx.warm_up(&[&y])?;
                        let got = y.to_vec::<f32>()?;
                        for (i, (g, v)) in got.iter().zip(data(1024, 5)).enumerate() {
                            let want = ((v * c) as f64).tanh() + ((v * (c + 1.0)) as f64).sin();
                            assert!(
                                (*g as f64 - want).abs() < 1e-5,
                                "{name}: thread {k}, [{i}]: {g} vs {want}"
                            );
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("a compiling thread panicked")?;
            }
            Ok(())
        })?;
    }
    Ok(())
}
