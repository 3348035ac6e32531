//! Training steps that update their variables in place (`assign` over a
//! realized value, `passes/assign.rs`): the results equal the uncaptured
//! copying loop whatever a reader holds, and on CUDA a captured step binds
//! the buffers it wrote last call, so it copies no parameter, moment or
//! step count into a graph slot (`Stats::graph_input_copies`).

use super::{data, devices, tol};
use kiln::nn::{self, Linear, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig, TrainStep};
use kiln::prelude::*;

fn mlp(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![Linear::new(ctx, "0", 8, 16)?.boxed(), ReLU.boxed(), Linear::new(ctx, "2", 16, 3)?.boxed()])
    })
}

fn batches(ctx: &Context) -> Vec<(Tensor, Tensor)> {
    (0..3)
        .map(|b| {
            let x = ctx.tensor(&data(32 * 8, 70 + b), [32, 8]);
            let y = ctx.tensor(&(0..32).map(|i| (i * 7 + b as i64) % 3).collect::<Vec<i64>>(), [32]);
            (x, y)
        })
        .collect()
}

fn values(ctx: &Context) -> Result<Vec<Vec<f32>>> {
    let ws = ctx.workspace();
    ws.names()
        .iter()
        .map(|n| ctx.get_variable(n))
        .filter(|v| v.as_ref().map_or(true, |v| v.dtype() == DType::F32))
        .map(|v| v?.to_vec::<f32>())
        .collect()
}

/// A captured AdamW and SGD-with-momentum step, 20 calls, the learning
/// rate lowered before call 12: after the first captures, each call
/// copies its two arguments and nothing else (the learning rate, a host
/// scalar, only on the call after it changed), and every loss and final
/// value equals the uncaptured loop's.
#[test]
fn a_captured_step_copies_no_parameter_or_optimizer_state() -> Result<()> {
    for (name, make) in devices() {
        for adam in [true, false] {
            let run = |captured: bool| -> Result<(Vec<f32>, Vec<Vec<f32>>, u64)> {
                let ctx = make().with_seed(5);
                let m = mlp(&ctx)?;
                let opt: Box<dyn Optimizer> = if adam {
                    Box::new(AdamW::new(&m, AdamConfig { lr: 0.01, ..AdamConfig::adamw() })?)
                } else {
                    Box::new(Sgd::new(&m, SgdConfig { lr: 0.05, momentum: 0.9, ..SgdConfig::default() })?)
                };
                let data = batches(&ctx);
                let mut losses = Vec::new();
                let mut copies = 0;
                if captured {
                    let mut step = TrainStep::new(&ctx, opt, |b: &[Tensor]| {
                        nn::cross_entropy(&m.forward(&b[0])?, &b[1])
                    });
                    for s in 0..20 {
                        let (x, y) = &data[s % 3];
                        if s == 12 {
                            step.optimizer().set_lr(0.004)?;
                        }
                        let before = ctx.stats().graph_input_copies;
                        losses.push(step.call(&[x, y])?.item::<f32>()?);
                        if s >= 4 {
                            copies += ctx.stats().graph_input_copies - before;
                        }
                    }
                } else {
                    let mut opt = opt;
                    for s in 0..20 {
                        let (x, y) = &data[s % 3];
                        if s == 12 {
                            opt.set_lr(0.004)?;
                        }
                        let loss = nn::cross_entropy(&m.forward(x)?, y)?;
                        loss.backward()?;
                        opt.step()?;
                        opt.zero_grad()?;
                        losses.push(loss.item::<f32>()?);
                    }
                }
                Ok((losses, values(&ctx)?, copies))
            };
            let (la, pa, _) = run(false)?;
            let (lb, pb, copies) = run(true)?;
            let what = format!("{name}, {}", if adam { "AdamW" } else { "SGD" });
            let t = tol(name);
            for (a, b) in la.iter().zip(&lb) {
                assert!(
                    (a - b).abs() as f64 <= t * a.abs().max(1.0) as f64,
                    "{what}: losses {la:?} vs {lb:?}"
                );
            }
            for (a, b) in pa.iter().zip(&pb) {
                let want: Vec<f64> = a.iter().map(|&v| v as f64).collect();
                super::close(b, &want, t, &format!("{what}: values"));
            }
            if name.starts_with("cuda") {
                // x and y, and the learning rate once (the call after it
                // changed): no parameter, moment, count or unchanged rate.
                assert_eq!(
                    copies,
                    16 * 2 + 1,
                    "{what}: 16 replays copy their x and y alone, and one new rate"
                );
            }
        }
    }
    Ok(())
}

/// Plain reads (uncaptured) that assign updates in place, with readers
/// holding old values: `detach`ed snapshots and ops recorded before the
/// assignment. Three variables of different sizes, a learning rate that
/// changes every step, and an EMA of each; every value a reader holds is
/// what program order says.
#[test]
fn in_place_updates_keep_every_value_a_reader_holds() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let sizes = [5usize, 64, 1000];
        let mut model: Vec<Vec<f32>> =
            sizes.iter().enumerate().map(|(i, &n)| data(n, 90 + i as u64)).collect();
        let mut ema_model = model.clone();
        let vars: Vec<Variable> = model
            .iter()
            .enumerate()
            .map(|(i, v)| ctx.variable(&format!("p{i}"), ctx.tensor(v, [v.len()])))
            .collect::<Result<_>>()?;
        let emas: Vec<Variable> = model
            .iter()
            .enumerate()
            .map(|(i, v)| ctx.variable(&format!("e{i}"), ctx.tensor(v, [v.len()])))
            .collect::<Result<_>>()?;
        let lr = ctx.variable("lr", ctx.scalar(0.5f32))?;
        let mut held = Vec::new();
        for step in 0..24 {
            let rate = 0.5 / (1.0 + step as f32);
            lr.assign(ctx.scalar(rate))?;
            for (i, p) in vars.iter().enumerate() {
                let g = data(sizes[i], 200 + step as u64 * 3 + i as u64);
                if (step + i) % 5 == 0 {
                    held.push((
                        p.detach(),
                        model[i].clone(),
                        format!("{name}: snapshot of p{i} at step {step}"),
                    ));
                }
                if (step + i) % 7 == 0 {
                    let doubled: Vec<f32> = model[i].iter().map(|v| v * 2.0).collect();
                    held.push((&**p * 2.0, doubled, format!("{name}: 2 p{i} recorded at step {step}")));
                }
                p.assign(&**p - &(ctx.tensor(&g, [sizes[i]]) * &*lr))?;
                for (v, gv) in model[i].iter_mut().zip(&g) {
                    *v -= gv * rate;
                }
                emas[i].assign(&*emas[i] * 0.9 + &**p * 0.1)?;
                for (e, v) in ema_model[i].iter_mut().zip(&model[i]) {
                    *e = *e * 0.9 + v * 0.1;
                }
            }
            if step % 3 == 2 {
                for i in 0..3 {
                    let want: Vec<f64> = model[i].iter().map(|&v| v as f64).collect();
                    super::close(
                        &vars[i].to_vec::<f32>()?,
                        &want,
                        1e-5,
                        &format!("{name}: p{i} at step {step}"),
                    );
                    let want: Vec<f64> = ema_model[i].iter().map(|&v| v as f64).collect();
                    super::close(
                        &emas[i].to_vec::<f32>()?,
                        &want,
                        1e-5,
                        &format!("{name}: e{i} at step {step}"),
                    );
                }
            }
        }
        for (t, want, what) in held {
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            super::close(&t.to_vec::<f32>()?, &want, 1e-5, &what);
        }
    }
    Ok(())
}

/// The recording call of a captured step writes a variable in place too:
/// recording gives each variable's value a buffer id of its own, and the
/// old id (read by nothing) must not keep a second hold on the bytes, or
/// the recording run writes over a copy of every variable it updates (a
/// GPT-2 decode step's recording held its KV cache twice; a training
/// step's, every parameter and moment). Peak memory over each call stays
/// within the variable plus the small write, on the CPU and the GPU (the
/// emulator copies on a plan's first run by design: `emulate/graphs.rs`).
#[test]
fn a_captured_step_writes_in_place_from_its_recording_call_on() -> Result<()> {
    for (name, make) in devices() {
        if name == "cuda-emulated" {
            continue;
        }
        let ctx = make();
        let n = 1 << 18;
        let cache = ctx.variable("cache", ctx.tensor(&data(n, 7), [n / 64, 64]))?;
        ctx.sync()?;
        let (c, v) = (ctx.clone(), cache.clone());
        let mut step = ctx.capture(move |args: &[Tensor]| {
            v.write_at(0, &args[0], &c.ones([1, 64]))?;
            Ok(vec![v.tensor().narrow(0, 0, 1).sum(&[0usize, 1], false)])
        });
        let held = ctx.stats().live_bytes;
        for k in 0..4i64 {
            ctx.reset_peak_bytes();
            step.call(&[&ctx.scalar(k)])?.remove(0).item::<f32>()?;
            let peak = ctx.stats().peak_bytes;
            assert!(
                peak < held + (n as u64 * 4) / 2,
                "{name}, call {k}: peak {peak} B with {held} B held before (the variable is {} B)",
                n * 4
            );
        }
        let got = cache.to_vec::<f32>()?;
        assert!(got[..4 * 64].iter().all(|&x| x == 1.0), "{name}: the first four rows were written");
        assert_eq!(got[4 * 64..], data(n, 7)[4 * 64..], "{name}: the rest is untouched");
    }
    Ok(())
}

/// An AdamW model, an Adam model and an EMA trained interleaved (three
/// plans; steps of one model back to back and alternating), twice: once
/// with nothing else holding the variables, so the CPU writes every
/// update over its variable's own bytes (`backends/cpu/over.rs`), and once
/// holding snapshots (`detach`) of a changing subset of the parameters,
/// moments and step counts, which makes those outputs copy while the
/// other outputs of the same fused node still write in place. Every loss
/// and final value is the same bits either way, every snapshot reads the
/// bits its variable had when it was taken, and the first way allocates
/// less than half a copy of a model's parameters and moments per step.
#[test]
fn cpu_adam_in_place_equals_the_copying_step_bit_for_bit() -> Result<()> {
    use std::collections::HashMap;
    struct Run {
        losses: Vec<f32>,
        finals: Vec<Vec<f32>>,
        /// Every variable before every step (the run that holds nothing).
        seen: Vec<HashMap<String, Vec<f32>>>,
        /// (step, variable, what its snapshot read at the end).
        snaps: Vec<(usize, String, Vec<f32>)>,
        /// Bytes allocated by model a's steps, per byte of its state.
        per_state_byte: f64,
    }
    let run = |hold: bool| -> Result<Run> {
        let ctx = Context::cpu().with_seed(11);
        let a = mlp(&ctx)?;
        let b = ctx.scope("b", |ctx| {
            Sequential::new(ctx, "mlp", |ctx| {
                Ok(vec![
                    Linear::new(ctx, "0", 8, 64)?.boxed(),
                    ReLU.boxed(),
                    Linear::new(ctx, "2", 64, 3)?.boxed(),
                ])
            })
        })?;
        let mut opt_a: Box<dyn Optimizer> =
            Box::new(AdamW::new(&a, AdamConfig { lr: 0.01, ..AdamConfig::adamw() })?);
        let adam = AdamConfig { lr: 0.003, weight_decay: 0.1, ..AdamConfig::adamw() };
        let mut opt_b: Box<dyn Optimizer> = Box::new(kiln::optim::Adam::new(&b, adam)?);
        let ema = ctx.variable("ema", ctx.zeros([16, 8]))?;
        let w0 = ctx.get_variable("mlp/0/weight")?;
        let data = batches(&ctx);
        let names: Vec<String> = ctx.workspace().names().into_iter().map(String::from).collect();
        let state_a: usize = names
            .iter()
            .filter(|n| !n.contains("b/") && n.contains("mlp/"))
            .map(|n| Ok(ctx.get_variable(n)?.numel() * 4))
            .sum::<Result<usize>>()?;
        let mut out =
            Run { losses: vec![], finals: vec![], seen: vec![], snaps: vec![], per_state_byte: 0.0 };
        let mut held: Vec<(usize, String, Tensor)> = Vec::new();
        let (mut allocated, mut steps_a) = (0u64, 0u64);
        for s in 0..30usize {
            if hold && s % 4 != 3 {
                for (i, n) in names.iter().enumerate() {
                    if (i + s) % 3 == 0 {
                        held.push((s, n.clone(), ctx.get_variable(n)?.detach()));
                    }
                }
            }
            if !hold {
                let mut now = HashMap::new();
                for n in &names {
                    let v = ctx.get_variable(n)?;
                    if v.dtype() == DType::F32 {
                        now.insert(n.clone(), v.to_vec::<f32>()?);
                    }
                }
                out.seen.push(now);
            }
            let before = ctx.stats().bytes_allocated;
            let (x, y) = &data[s % 3];
            let on_a = s % 5 < 3;
            let (model, opt) = if on_a { (&a, &mut opt_a) } else { (&b, &mut opt_b) };
            let loss = nn::cross_entropy(&model.forward(x)?, y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            if s % 2 == 0 {
                ema.assign(&*ema * 0.9 + &*w0 * 0.1)?;
            }
            out.losses.push(loss.item::<f32>()?);
            if s >= 10 && on_a {
                allocated += ctx.stats().bytes_allocated - before;
                steps_a += 1;
            }
        }
        out.finals = values(&ctx)?;
        for (s, n, t) in held {
            if t.dtype() == DType::F32 {
                out.snaps.push((s, n, t.to_vec::<f32>()?));
            }
        }
        out.per_state_byte = allocated as f64 / (steps_a.max(1) as f64 * state_a as f64);
        Ok(out)
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let free = run(false)?;
    let holding = run(true)?;
    assert_eq!(bits(&free.losses), bits(&holding.losses), "losses");
    assert_eq!(free.finals.len(), holding.finals.len());
    for (i, (a, b)) in free.finals.iter().zip(&holding.finals).enumerate() {
        assert_eq!(bits(a), bits(b), "final value of variable {i}");
    }
    assert!(holding.snaps.len() > 100, "{} snapshots", holding.snaps.len());
    for (s, n, got) in &holding.snaps {
        assert_eq!(bits(got), bits(&free.seen[*s][n]), "snapshot of {n} taken before step {s}");
    }
    assert!(
        free.per_state_byte < 0.5,
        "an in-place Adam step allocated {:.2} bytes per byte of its parameters and moments",
        free.per_state_byte
    );
    Ok(())
}
