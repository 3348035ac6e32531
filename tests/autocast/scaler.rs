//! The f16 loss scaler: a step whose gradients hold an inf or NaN changes
//! no parameter and no optimizer state and halves the scale; finite steps
//! count up and double it after the interval; all of it inside the
//! step's one plan, captured or not.

use kiln::autocast::{GradScaler, ScalerConfig};
use kiln::nn::{self, Linear, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer, TrainStep};
use kiln::prelude::*;

fn model(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![Linear::new(ctx, "0", 6, 16)?.boxed(), ReLU.boxed(), Linear::new(ctx, "2", 16, 3)?.boxed()])
    })
}

/// Every variable's values, by name (parameters, AdamW's moments and
/// step, the scaler's state).
fn state(ctx: &Context) -> Result<Vec<(String, Vec<f64>)>> {
    ctx.variables().iter().map(|v| Ok((v.name(), v.cast(DType::F64).to_vec::<f64>()?))).collect()
}

fn value(ctx: &Context, name: &str) -> Result<Vec<f64>> {
    Ok(state(ctx)?.into_iter().find(|(n, _)| n == name).expect("a variable of that name").1)
}

fn batch(ctx: &Context, poison: Option<f32>) -> (Tensor, Tensor) {
    let mut xs: Vec<f32> = (0..8 * 6).map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0).collect();
    if let Some(p) = poison {
        xs[7] = p;
    }
    let labels: Vec<i64> = (0..8).map(|i| (i % 3) as i64).collect();
    (ctx.tensor(&xs, [8, 6]), ctx.tensor(&labels, [8]))
}

/// One uncaptured step of `opt` on a batch; returns the loss.
fn step(m: &Sequential, opt: &mut impl Optimizer, x: &Tensor, y: &Tensor) -> Result<f32> {
    let loss = nn::cross_entropy(&m.forward(x)?, y)?;
    opt.backward(&loss)?;
    opt.step()?;
    opt.zero_grad()?;
    loss.item::<f32>()
}

fn config() -> ScalerConfig {
    ScalerConfig { init_scale: 256.0, growth_interval: 3, ..ScalerConfig::default() }
}

#[test]
fn a_step_with_an_inf_or_nan_is_skipped_and_halves_the_scale() -> Result<()> {
    for poison in [f32::INFINITY, f32::NAN] {
        let ctx = Context::cpu().with_seed(4).with_autocast(DType::F16);
        let m = model(&ctx)?;
        let mut opt = GradScaler::new(&ctx, AdamW::new(&m, AdamConfig::adamw())?, config())?;
        let (x, y) = batch(&ctx, None);
        step(&m, &mut opt, &x, &y)?;
        step(&m, &mut opt, &x, &y)?;
        let before = state(&ctx)?;
        assert_eq!(value(&ctx, "grad_scaler/growth_tracker")?, [2.0]);
        let (bad, _) = batch(&ctx, Some(poison));
        let loss = step(&m, &mut opt, &bad, &y)?;
        assert!(!loss.is_finite(), "the poisoned batch gave a finite loss {loss}");
        let after = state(&ctx)?;
        for ((name, a), (_, b)) in before.iter().zip(&after) {
            match name.as_str() {
                "grad_scaler/scale" => assert_eq!(b, &[128.0], "{poison}: the scale did not halve"),
                "grad_scaler/growth_tracker" => assert_eq!(b, &[0.0], "{poison}: the count did not restart"),
                // Parameters, moments and AdamW's step count: bit for bit.
                _ => assert!(
                    a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{poison}: {name} changed on a skipped step"
                ),
            }
        }
        // The next finite step updates again.
        step(&m, &mut opt, &x, &y)?;
        assert_eq!(value(&ctx, "adamw/step")?, [3.0]);
        assert_eq!(value(&ctx, "grad_scaler/growth_tracker")?, [1.0]);
    }
    Ok(())
}

#[test]
fn an_overflowing_scale_is_caught_in_f16_and_backs_off() -> Result<()> {
    // 2^30 times the loss gradient overflows f16 (65504) where the backward
    // products cast it down: the gradients are inf, although every input
    // is finite.
    let ctx = Context::cpu().with_seed(4).with_autocast(DType::F16);
    let m = model(&ctx)?;
    let cfg = ScalerConfig { init_scale: 2f64.powi(30), ..config() };
    let mut opt = GradScaler::new(&ctx, AdamW::new(&m, AdamConfig::adamw())?, cfg)?;
    let (x, y) = batch(&ctx, None);
    let w = value(&ctx, "mlp/0/weight")?;
    let loss = step(&m, &mut opt, &x, &y)?;
    assert!(loss.is_finite());
    assert_eq!(value(&ctx, "mlp/0/weight")?, w, "an overflowed step changed the weights");
    assert_eq!(value(&ctx, "grad_scaler/scale")?, [2f64.powi(29)]);
    assert_eq!(value(&ctx, "adamw/step")?, [0.0]);
    // The same scale in bf16 (f32's range) does not overflow.
    let ctx = Context::cpu().with_seed(4).with_autocast(DType::BF16);
    let m = model(&ctx)?;
    let mut opt = GradScaler::new(&ctx, AdamW::new(&m, AdamConfig::adamw())?, cfg)?;
    let (x, y) = batch(&ctx, None);
    step(&m, &mut opt, &x, &y)?;
    assert_eq!(value(&ctx, "adamw/step")?, [1.0]);
    Ok(())
}

#[test]
fn the_scale_grows_after_the_interval_of_finite_steps() -> Result<()> {
    let ctx = Context::cpu().with_seed(4).with_autocast(DType::F16);
    let m = model(&ctx)?;
    let mut opt = GradScaler::new(&ctx, AdamW::new(&m, AdamConfig::adamw())?, config())?;
    let (x, y) = batch(&ctx, None);
    let mut seen = Vec::new();
    for _ in 0..7 {
        step(&m, &mut opt, &x, &y)?;
        seen.push((value(&ctx, "grad_scaler/scale")?[0], value(&ctx, "grad_scaler/growth_tracker")?[0]));
    }
    let want =
        [(256.0, 1.0), (256.0, 2.0), (512.0, 0.0), (512.0, 1.0), (512.0, 2.0), (1024.0, 0.0), (1024.0, 1.0)];
    assert_eq!(seen, want);
    Ok(())
}

/// The scaled, unscaled and updated values of a finite step are those of
/// the same step without the scaler, up to the scaling's rounding: a
/// power-of-two scale is exact, so in f32 (no autocast) they are equal.
#[test]
fn a_power_of_two_scale_changes_no_bit_of_an_f32_step() -> Result<()> {
    let run = |scaled: bool| -> Result<Vec<(String, Vec<f64>)>> {
        let ctx = Context::cpu().with_seed(9);
        let m = model(&ctx)?;
        let adam = AdamW::new(&m, AdamConfig::adamw())?;
        let (x, y) = batch(&ctx, None);
        if scaled {
            let mut opt = GradScaler::new(&ctx, adam, config())?;
            for _ in 0..3 {
                step(&m, &mut opt, &x, &y)?;
            }
        } else {
            let mut opt = adam;
            for _ in 0..3 {
                step(&m, &mut opt, &x, &y)?;
            }
        }
        Ok(state(&ctx)?.into_iter().filter(|(n, _)| !n.starts_with("grad_scaler")).collect())
    };
    assert_eq!(run(true)?, run(false)?);
    Ok(())
}

/// In a captured TrainStep the scaler's decisions happen on the device:
/// the captured steps give the values of uncaptured ones, skip included.
#[test]
fn a_captured_step_skips_and_grows_as_an_uncaptured_one() -> Result<()> {
    let batches = |ctx: &Context| -> Vec<(Tensor, Tensor)> {
        (0..8).map(|k| batch(ctx, if k == 4 { Some(f32::INFINITY) } else { None })).collect()
    };
    let plain = {
        let ctx = Context::cpu().with_seed(6).with_autocast(DType::F16);
        let m = model(&ctx)?;
        let mut opt = GradScaler::new(&ctx, AdamW::new(&m, AdamConfig::adamw())?, config())?;
        let mut losses = Vec::new();
        for (x, y) in batches(&ctx) {
            losses.push(step(&m, &mut opt, &x, &y)?.to_bits());
        }
        (losses, state(&ctx)?)
    };
    let captured = {
        let ctx = Context::cpu().with_seed(6).with_autocast(DType::F16);
        let m = model(&ctx)?;
        let opt = GradScaler::new(&ctx, AdamW::new(&m, AdamConfig::adamw())?, config())?;
        let mut train =
            TrainStep::new(&ctx, opt, |b: &[Tensor]| nn::cross_entropy(&m.forward(&b[0])?, &b[1]));
        let mut losses = Vec::new();
        for (x, y) in batches(&ctx) {
            losses.push(train.call(&[&x, &y])?.item::<f32>()?.to_bits());
        }
        assert_eq!(train.captures(), 1);
        (losses, state(&ctx)?)
    };
    assert_eq!(plain, captured);
    // Steps 0-2 finite (the scale grew at the third, to 512), step 3
    // finite, step 4 skipped (halved to 256), steps 5-7 finite (grew again
    // at the third, to 512).
    assert_eq!(captured.1.iter().find(|(n, _)| n == "grad_scaler/scale").map(|s| s.1[0]), Some(512.0));
    assert_eq!(captured.1.iter().find(|(n, _)| n == "adamw/step").map(|s| s.1[0]), Some(7.0));
    Ok(())
}

/// A GELU whose input is exactly 0 (a zero row through a bias-free
/// product) has a finite gradient in f16 too: autodiff's guard for
/// `gelu(x) / x` is an f32 constant (1e-18) that f16 cannot hold, so the
/// autocast pass keeps the guard's compare in f32. When the compare ran
/// in f16 (`|x| < 0`) every step of a GELU model was skipped: the 16-block
/// benchmark never trained under f16.
#[test]
fn a_gelu_at_zero_does_not_skip_f16_steps() -> Result<()> {
    let ctx = Context::cpu().with_seed(5).with_autocast(DType::F16);
    let w = ctx.variable("w", ctx.randn([6, 8]))?;
    let mut opt = GradScaler::new(
        &ctx,
        kiln::optim::Sgd::new(&w, kiln::optim::SgdConfig { lr: 0.1, ..Default::default() })?,
        config(),
    )?;
    let mut xs: Vec<f32> = (0..4 * 6).map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0).collect();
    xs[..6].fill(0.0);
    let x = ctx.tensor(&xs, [4, 6]);
    let w0 = w.to_vec::<f32>()?;
    for _ in 0..2 {
        let h = x.matmul(&w).gelu();
        let loss = (&h * &h).mean(&[0, 1], false);
        opt.backward(&loss)?;
        opt.step()?;
        opt.zero_grad()?;
    }
    assert_eq!(value(&ctx, "grad_scaler/growth_tracker")?, [2.0], "both steps were finite");
    assert_eq!(value(&ctx, "grad_scaler/scale")?, [256.0]);
    assert_ne!(w.to_vec::<f32>()?, w0, "the steps updated the weight");
    Ok(())
}

/// Issue 33, defect 8: a scale that grows past f32's range became inf,
/// and from then on every step was skipped (`0 · inf` is NaN, and
/// `inf · backoff` is inf again), so training stopped silently. PyTorch
/// grows the scale only when the grown scale is finite: it stays at
/// 2^127 here (the tracker restarts all the same), and a real step after
/// it still updates.
#[test]
fn the_scale_stops_growing_below_overflow_and_later_steps_still_update() -> Result<()> {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.ones([2]))?;
    let sgd = kiln::optim::Sgd::new(&w, kiln::optim::SgdConfig { lr: 0.5, ..Default::default() })?;
    let cfg = ScalerConfig { init_scale: 2f64.powi(120), growth_interval: 1, ..ScalerConfig::default() };
    let mut opt = GradScaler::new(&ctx, sgd, cfg)?;
    let mut seen = Vec::new();
    for _ in 0..12 {
        opt.backward(&(&*w * 0.0).sum_all())?;
        opt.step()?;
        opt.zero_grad()?;
        seen.push(value(&ctx, "grad_scaler/scale")?[0].log2());
    }
    assert_eq!(seen, [121.0, 122.0, 123.0, 124.0, 125.0, 126.0, 127.0, 127.0, 127.0, 127.0, 127.0, 127.0]);
    assert_eq!(value(&ctx, "grad_scaler/growth_tracker")?, [0.0]);
    assert_eq!(w.to_vec::<f32>()?, [1.0, 1.0], "zero gradients moved the weight");
    opt.backward(&(&*w * 0.25).sum_all())?;
    opt.step()?;
    opt.zero_grad()?;
    assert_eq!(
        w.to_vec::<f32>()?,
        [0.875, 0.875],
        "a finite step after the scale stopped growing was skipped"
    );
    Ok(())
}
