//! Regressions of captured steps (issue 33, defects 1 to 3): each failed
//! before its fix. A learning rate set between calls, a snapshot of a
//! variable taken outside the step, and a host read inside the closure.

use super::devices;
use kiln::capture::HostScalar;
use kiln::nn::{Ema, Params};
use kiln::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig, TrainStep};
use kiln::prelude::*;

/// Defect 1: the learning rate was uploaded inside `step()`, so the
/// captured plan bound the recording call's upload forever and `set_lr`
/// did nothing (the weight went to 0.0 instead of staying at 0.5).
#[test]
fn a_captured_train_step_follows_set_lr() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let w = ctx.variable("w", ctx.ones([1]))?;
        let opt = Sgd::new(&w, SgdConfig { lr: 0.5, ..Default::default() })?;
        let mut step = TrainStep::new(&ctx, opt, |_: &[Tensor]| Ok(w.sum_all()));
        step.call(&[])?;
        assert_eq!(w.to_vec::<f32>()?, vec![0.5], "{name}: the recording call");
        step.optimizer().set_lr(0.0)?;
        step.call(&[])?;
        assert_eq!(w.to_vec::<f32>()?, vec![0.5], "{name}: lr 0 must leave w alone");
        step.optimizer().set_lr(0.125)?;
        step.call(&[])?;
        assert_eq!(w.to_vec::<f32>()?, vec![0.375], "{name}: lr 0.125");
        assert_eq!(step.captures(), 1, "{name}: set_lr records nothing new");
    }
    Ok(())
}

/// Defect 1, AdamW: the learning rate and the decoupled decay (which reads
/// it) follow a schedule, as the uncaptured loop's do.
#[test]
fn a_captured_adamw_step_follows_a_learning_rate_schedule() -> Result<()> {
    for (name, make) in devices() {
        let run = |captured: bool| -> Result<Vec<f32>> {
            let ctx = make();
            let w = ctx.variable("w", ctx.tensor(&[1.0f32, -2.0, 0.5], [3]))?;
            let config = AdamConfig { lr: 0.1, weight_decay: 0.5, ..AdamConfig::adamw() };
            let mut opt = AdamW::new(&w, config)?;
            let loss = |_: &[Tensor]| Ok((&*w * &*w).sum_all());
            let schedule = [0.1, 0.0, 0.3, 0.05, 0.0, 0.2];
            if captured {
                let mut step = TrainStep::new(&ctx, opt, loss);
                for lr in schedule {
                    step.optimizer().set_lr(lr)?;
                    step.call(&[])?;
                }
            } else {
                for lr in schedule {
                    opt.set_lr(lr)?;
                    loss(&[])?.backward()?;
                    opt.step()?;
                    opt.zero_grad()?;
                }
            }
            w.to_vec::<f32>()
        };
        let (captured, uncaptured) = (run(true)?, run(false)?);
        for (c, u) in captured.iter().zip(&uncaptured) {
            assert!((c - u).abs() <= 1e-6 * u.abs().max(1.0), "{name}: {captured:?} vs {uncaptured:?}");
        }
    }
    Ok(())
}

/// Defect 1, EMA: a decay held by a host scalar reaches every replay.
#[test]
fn a_captured_ema_update_follows_its_decay() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let w = ctx.variable("w", ctx.tensor(&[2.0f32], [1]))?;
        let ema = Ema::new(&w)?;
        let decay = HostScalar::new(0.5);
        let mut step = ctx.capture(|_: &[Tensor]| {
            w.assign(&*w + 2.0)?;
            ema.update_from(&w, &decay)?;
            Ok(vec![])
        });
        let (mut wm, mut em) = (2.0f64, 2.0f64);
        for d in [0.5, 0.0, 0.9, 1.0, 0.25] {
            decay.set(d);
            step.call(&[])?;
            wm += 2.0;
            em = em * d + wm * (1.0 - d);
            let got = ema.parameters()[0].to_vec::<f32>()?[0] as f64;
            assert!((got - em).abs() < 1e-5 * em.abs(), "{name}: decay {d}: {got} vs {em}");
        }
    }
    Ok(())
}

/// Defect 2: every plan input whose buffer was a variable's was bound to
/// the variable's latest value, so a snapshot taken outside the step
/// (`detach`, or an unrealized `&*w * 2.0`) followed the variable.
#[test]
fn an_outside_snapshot_of_a_variable_keeps_its_value() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let w = ctx.variable("w", ctx.ones([2]))?;
        let start = w.detach();
        let doubled = &*w * 2.0; // not computed yet
        let mut step = ctx.capture(|_: &[Tensor]| {
            w.assign(&*w + 1.0)?;
            Ok(vec![&start * 1.0, &doubled + 0.0, &*w * 1.0])
        });
        for k in 0..4 {
            let out = step.call(&[])?;
            assert_eq!(out[0].to_vec::<f32>()?, vec![1.0; 2], "{name} call {k}: the detached snapshot");
            assert_eq!(out[1].to_vec::<f32>()?, vec![2.0; 2], "{name} call {k}: the unrealized read");
            assert_eq!(out[2].to_vec::<f32>()?, vec![2.0 + k as f32; 2], "{name} call {k}: the variable");
        }
        assert_eq!(w.to_vec::<f32>()?, vec![5.0; 2], "{name}");
    }
    Ok(())
}

/// Defect 3: a host read inside the closure ran its own plan, which the
/// replay never ran again, so the assignments before it were lost (`w`
/// was 1.0 after 3 calls, not 3.0). It is an error at the read now.
#[test]
fn a_host_read_inside_a_captured_step_is_an_error_at_the_read() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let w = ctx.variable("w", ctx.zeros([1]))?;
        let mut step = ctx.capture(|_: &[Tensor]| {
            w.assign(&*w + 1.0)?;
            w.to_vec::<f32>()?;
            Ok(vec![&*w * 2.0])
        });
        let err = step.call(&[]).unwrap_err();
        assert!(matches!(err, Error::Workspace { op: "captured step", .. }), "{name}: {err:?}");
        snap("capture_host_read", &err);
        // Nothing was captured, and the recording call's assignment is
        // still pending, as any recorded assignment: it runs with the next
        // read, once.
        assert_eq!(w.to_vec::<f32>()?, vec![1.0], "{name}");
        // Every kind of read says so, and reads outside a step still work.
        let mut reads = ctx.capture(|_: &[Tensor]| {
            w.item::<f32>()?;
            Ok(vec![])
        });
        assert!(reads.call(&[]).is_err(), "{name}: item");
        let mut syncs = ctx.capture(|_: &[Tensor]| {
            ctx.sync()?;
            Ok(vec![])
        });
        assert!(syncs.call(&[]).is_err(), "{name}: sync");
        assert_eq!(w.to_vec::<f32>()?, vec![1.0], "{name}");
    }
    Ok(())
}

/// A host read on another thread while a step records is not the step's.
#[test]
fn a_read_on_another_thread_while_a_step_records_is_allowed() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.tensor(&[3.0f32], [1]);
    let mut step = ctx.capture(|a: &[Tensor]| {
        let other = std::thread::scope(|s| s.spawn(|| (&x * 2.0).to_vec::<f32>()).join().expect("no panic"));
        assert_eq!(other?, vec![6.0]);
        Ok(vec![&a[0] + 1.0])
    });
    assert_eq!(step.call(&[&x])?[0].to_vec::<f32>()?, vec![4.0]);
    Ok(())
}

/// Snapshots `err`'s message as `snapshots/errors__<name>.snap`.
fn snap(name: &str, err: &Error) {
    let msg = err.to_string();
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| insta::assert_snapshot!(format!("errors__{name}"), msg));
}
