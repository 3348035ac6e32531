//! Captured steps: equal to the same loop uncaptured, recording once per
//! signature, the cap, random numbers that advance, variables shared with
//! uncaptured code, and the misuses that are errors.

use super::{data, devices, tol};
use kiln::nn::{self, Dropout, Linear, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer, TrainStep};
use kiln::prelude::*;

/// A small MLP with dropout (random numbers every step) and AdamW.
fn model(ctx: &Context) -> Result<(Sequential, AdamW)> {
    let m = Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 8, 16)?.boxed(),
            ReLU.boxed(),
            Dropout::new(0.25)?.boxed(),
            Linear::new(ctx, "3", 16, 3)?.boxed(),
        ])
    })?;
    let opt = AdamW::new(&m, AdamConfig { lr: 0.01, ..AdamConfig::adamw() })?;
    Ok((m, opt))
}

/// Losses of `steps` steps and the final parameters, captured or not.
fn train(make: fn() -> Context, captured: bool, steps: usize) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
    let ctx = make().with_seed(3);
    let (m, mut opt) = model(&ctx)?;
    let batches: Vec<(Tensor, Tensor)> = (0..3)
        .map(|b| {
            let x = ctx.tensor(&data(32 * 8, 10 + b), [32, 8]);
            let y = ctx.tensor(&(0..32).map(|i| (i + b as i64) % 3).collect::<Vec<i64>>(), [32]);
            (x, y)
        })
        .collect();
    let mut losses = Vec::new();
    if captured {
        let mut step = TrainStep::new(&ctx, opt, |b: &[Tensor]| nn::cross_entropy(&m.forward(&b[0])?, &b[1]));
        for s in 0..steps {
            let (x, y) = &batches[s % 3];
            losses.push(step.call(&[x, y])?.item::<f32>()?);
        }
        assert_eq!(step.captures(), 1);
    } else {
        for s in 0..steps {
            let (x, y) = &batches[s % 3];
            let loss = nn::cross_entropy(&m.forward(x)?, y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            losses.push(loss.item::<f32>()?);
        }
    }
    let params = ctx.workspace().names().iter().map(|n| ctx.get_variable(n)).collect::<Result<Vec<_>>>()?;
    let values = params
        .iter()
        .filter(|v| v.dtype() == DType::F32)
        .map(|v| v.to_vec::<f32>())
        .collect::<Result<_>>()?;
    Ok((losses, values))
}

#[test]
fn a_captured_training_step_equals_the_uncaptured_loop() -> Result<()> {
    for (name, make) in devices() {
        let (la, pa) = train(make, false, 12)?;
        let (lb, pb) = train(make, true, 12)?;
        let t = tol(name);
        for (a, b) in la.iter().zip(&lb) {
            assert!((a - b).abs() as f64 <= t * a.abs().max(1.0) as f64, "{name}: losses {la:?} vs {lb:?}");
        }
        assert!(la[11] < la[0], "{name}: it learns ({la:?})");
        for (a, b) in pa.iter().zip(&pb) {
            let want: Vec<f64> = a.iter().map(|&v| v as f64).collect();
            super::close(b, &want, t, &format!("{name}: parameters"));
        }
    }
    Ok(())
}

#[test]
fn random_numbers_advance_every_call_as_the_uncaptured_loop_draws_them() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make().with_seed(9);
        let mut step = ctx.capture(|a: &[Tensor]| Ok(vec![ctx.rand([6]) + &a[0]]));
        let x = ctx.zeros([6]);
        let captured: Vec<Vec<f32>> =
            (0..4).map(|_| step.call(&[&x])?[0].to_vec::<f32>()).collect::<Result<_>>()?;
        let fresh = make().with_seed(9);
        let x2 = fresh.zeros([6]);
        let plain: Vec<Vec<f32>> =
            (0..4).map(|_| (fresh.rand([6]) + &x2).to_vec::<f32>()).collect::<Result<_>>()?;
        assert_ne!(captured[0], captured[1], "{name}: the same numbers twice");
        assert_eq!(captured, plain, "{name}");
    }
    Ok(())
}

#[test]
fn a_new_signature_records_again_up_to_the_cap_and_then_says_what_changed() -> Result<()> {
    let ctx = Context::cpu();
    let mut calls = 0;
    let mut step = ctx.capture(|a: &[Tensor]| {
        calls += 1;
        Ok(vec![&a[0] * 2.0])
    });
    step = step.with_cap(2);
    for n in [2usize, 3, 2, 3, 2] {
        let x = ctx.ones([n]);
        assert_eq!(step.call(&[&x])?[0].to_vec::<f32>()?, vec![2.0; n]);
    }
    assert_eq!((step.captures(), step.replays()), (2, 3));
    let err = step.call(&[&ctx.ones([4])]).unwrap_err().to_string();
    assert!(err.contains("argument 0 was f32[3], now f32[4]") && err.contains("with_cap"), "{err}");
    let err = step.call(&[&ctx.ones([3]), &ctx.ones([3])]).unwrap_err().to_string();
    assert!(err.contains("1 argument(s) before, 2 now"), "{err}");
    drop(step);
    assert_eq!(calls, 2, "the closure ran once per signature");
    Ok(())
}

#[test]
fn variables_are_shared_with_uncaptured_code_in_program_order() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let w = ctx.variable("w", ctx.tensor(&[1.0f32, 2.0], [2]))?;
        let bias = ctx.tensor(&[0.5f32, -0.5], [2]); // a constant of the step
        let mut step = ctx.capture(|a: &[Tensor]| {
            let out = &a[0] * &*w + &bias;
            w.assign(&*w * 2.0)?;
            Ok(vec![out])
        });
        let mut model = [1.0f64, 2.0];
        for k in 0..20 {
            let x = ctx.tensor(&[k as f32, 1.0], [2]);
            let out = step.call(&[&x])?[0].to_vec::<f32>()?;
            assert_eq!(out, vec![(k as f64 * model[0] + 0.5) as f32, (model[1] - 0.5) as f32], "{name} {k}");
            model = [model[0] * 2.0, model[1] * 2.0];
            if k % 5 == 4 {
                // An assignment outside the step: the next call sees it.
                w.assign(&*w - 1.0)?;
                model = [model[0] - 1.0, model[1] - 1.0];
            }
            if k % 3 == 0 {
                assert_eq!(w.to_vec::<f32>()?, vec![model[0] as f32, model[1] as f32], "{name} {k}");
            }
        }
    }
    Ok(())
}

#[test]
fn a_step_that_returns_its_argument_or_nothing_computed() -> Result<()> {
    let ctx = Context::cpu();
    let mut step = ctx.capture(|a: &[Tensor]| Ok(vec![a[0].clone()]));
    for k in 0..3 {
        let x = ctx.tensor(&[k as f32], [1]);
        assert_eq!(step.call(&[&x])?[0].to_vec::<f32>()?, vec![k as f32]);
    }
    Ok(())
}

#[test]
fn misuse_is_an_error_that_says_what_to_do() -> Result<()> {
    let ctx = Context::cpu();
    let mut step = ctx.capture(|a: &[Tensor]| {
        let v = ctx.variable("late", ctx.zeros([1]))?;
        Ok(vec![&a[0] + &*v])
    });
    let err = step.call(&[&ctx.ones([1])]).unwrap_err().to_string();
    assert!(err.contains("created variable(s) late") && err.contains("before capturing"), "{err}");

    let w = ctx.variable("w", ctx.ones([2]))?;
    let mut keeps = ctx.capture(|a: &[Tensor]| {
        let loss = (&a[0] * &*w).sum_all();
        loss.backward()?;
        Ok(vec![loss])
    });
    let err = keeps.call(&[&ctx.ones([2])]).unwrap_err().to_string();
    assert!(err.contains("gradients held") && err.contains("zero_grad"), "{err}");
    ctx.zero_grad();

    (&*w * 3.0).sum_all().backward()?;
    let mut plain = ctx.capture(|a: &[Tensor]| Ok(vec![&a[0] * 2.0]));
    let err = plain.call(&[&ctx.ones([2])]).unwrap_err().to_string();
    assert!(err.contains("gradients are held (grad)"), "{err}");
    ctx.zero_grad();
    assert_eq!(plain.call(&[&ctx.ones([2])])?[0].to_vec::<f32>()?, vec![2.0; 2]);

    let other = Context::cpu();
    let err = plain.call(&[&other.ones([2])]).unwrap_err().to_string();
    assert!(err.contains("the tensor belongs to cpu (context") && err.contains(".to(&ctx)"), "{err}");
    Ok(())
}

/// Two captured steps and uncaptured reads over shared variables, in a
/// pseudo-random order for many iterations, against an f64 model.
#[test]
fn captured_steps_interleaved_with_each_other_and_uncaptured_reads() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let a = ctx.variable("a", ctx.tensor(&data(4, 1), [4]))?;
        let b = ctx.variable("b", ctx.tensor(&data(4, 2), [4]))?;
        let mut grow = ctx.capture(|x: &[Tensor]| {
            a.assign(&*a * 0.5 + &x[0])?;
            Ok(vec![(&*a * &*b).sum_all()])
        });
        let mut mix = ctx.capture(|_: &[Tensor]| {
            b.assign(&*b * 0.25 + &*a)?;
            Ok(vec![&*b - 1.0])
        });
        let mut ma: Vec<f64> = data(4, 1).iter().map(|&v| v as f64).collect();
        let mut mb: Vec<f64> = data(4, 2).iter().map(|&v| v as f64).collect();
        let mut held = Vec::new();
        for it in 0..150u64 {
            let x = data(4, 100 + it);
            match (it * 7 + it / 3) % 4 {
                0 | 1 => {
                    let out = grow.call(&[&ctx.tensor(&x, [4])])?;
                    for i in 0..4 {
                        ma[i] = ma[i] * 0.5 + x[i] as f64;
                    }
                    let want: f64 = ma.iter().zip(&mb).map(|(p, q)| p * q).sum();
                    held.push((out[0].clone(), vec![want]));
                }
                2 => {
                    let out = mix.call(&[])?;
                    for i in 0..4 {
                        mb[i] = mb[i] * 0.25 + ma[i];
                    }
                    held.push((out[0].clone(), mb.iter().map(|v| v - 1.0).collect()));
                }
                _ => {
                    let out = (&*a + &*b).to_vec::<f32>()?;
                    let want: Vec<f64> = ma.iter().zip(&mb).map(|(p, q)| p + q).collect();
                    super::close(&out, &want, 1e-5, &format!("{name} it {it}: a + b"));
                }
            }
            // Read results late, some many calls later.
            if held.len() > 5 {
                let (t, want) = held.remove(it as usize % 5);
                super::close(&t.to_vec::<f32>()?, &want, 1e-4, &format!("{name} it {it}: a held result"));
            }
        }
        assert_eq!(grow.captures() + mix.captures(), 2);
    }
    Ok(())
}
