//! The user-facing side: what `with_autocast` changes and what it keeps,
//! and its misuse as golden messages.

use crate::snapshots;
use kiln::autocast::{GradScaler, ScalerConfig};
use kiln::optim::{Sgd, SgdConfig};
use kiln::prelude::*;

#[test]
fn reads_keep_their_recorded_dtype_and_products_run_in_bf16() -> Result<()> {
    let ctx = Context::cpu().with_seed(5).with_autocast(DType::BF16);
    assert_eq!(ctx.autocast(), Some(DType::BF16));
    let (x, w) = (ctx.randn([6, 40]), ctx.randn([40, 3]));
    let y = x.matmul(&w);
    assert_eq!(y.dtype(), DType::F32);
    let text = ctx.explain(&[&y])?;
    assert!(text.contains("bf16[6,3] = matmul"), "{text}");
    // f64 reference from the same inputs: within bf16 rounding of the
    // inputs and the result, not f32's.
    let (xv, wv) = (x.to_vec::<f32>()?, w.to_vec::<f32>()?);
    let got = y.to_vec::<f32>()?;
    let mut worst = 0.0f64;
    let mut differs = false;
    for i in 0..6 {
        for j in 0..3 {
            let exact: f64 = (0..40).map(|k| xv[i * 40 + k] as f64 * wv[k * 3 + j] as f64).sum();
            let norm: f64 = (0..40).map(|k| (xv[i * 40 + k] as f64 * wv[k * 3 + j] as f64).abs()).sum();
            let err = (got[i * 3 + j] as f64 - exact).abs();
            // Inputs rounded (2^-9 each, relative), the result rounded once.
            assert!(err <= norm * 2.0 * 2f64.powi(-8) + exact.abs() * 2f64.powi(-8), "[{i},{j}] {err} off");
            worst = worst.max(err);
            differs |= err > norm * 1e-6;
        }
    }
    assert!(differs, "the product is as exact as f32's (worst error {worst}): it did not run in bf16");
    Ok(())
}

#[test]
fn a_loop_under_autocast_compiles_once_and_keeps_f32_variables() -> Result<()> {
    let ctx = Context::cpu().with_seed(2).with_autocast(DType::BF16);
    let w = ctx.variable("w", ctx.randn([8, 1]) * 0.1)?;
    let (x, t) = (ctx.randn([32, 8]), ctx.randn([32, 1]));
    let mut losses = Vec::new();
    for _ in 0..6 {
        let e = x.matmul(&w) - &t;
        let loss = (&e * &e).mean(&[0, 1], false);
        let g = loss.backward()?;
        w.assign(&*w - &(g.get(&w).expect("a gradient") * 0.1))?;
        ctx.zero_grad();
        losses.push(loss.item::<f32>()?);
    }
    assert!(losses[5] < losses[0], "{losses:?}");
    assert_eq!(w.dtype(), DType::F32);
    // The first read compiles the step that also draws the initial values;
    // every later step is one plan.
    assert!(ctx.stats().compiles <= 3, "{:?}", ctx.stats().compiles);
    // The same graph without autocast is another plan.
    let plain = Context::cpu().with_seed(2);
    let a = plain.randn([4, 4]);
    let before = plain.stats().compiles;
    a.matmul(&a).to_vec::<f32>()?;
    assert_eq!(plain.stats().compiles, before + 1);
    Ok(())
}

#[test]
fn misuse_is_a_golden_message() {
    let ctx = Context::cpu().with_autocast(DType::F32);
    let err = ctx.ones([2]).to_vec::<f32>().unwrap_err();
    snapshots().bind(|| insta::assert_snapshot!("autocast-not-a-low-type", err.to_string()));

    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.ones([2])).unwrap();
    let sgd = || Sgd::new(&w, SgdConfig::default()).unwrap();
    let bad = [
        ScalerConfig { init_scale: 0.0, ..ScalerConfig::default() },
        ScalerConfig { growth_factor: 1.0, ..ScalerConfig::default() },
        ScalerConfig { backoff_factor: 1.5, ..ScalerConfig::default() },
        ScalerConfig { growth_interval: 0, ..ScalerConfig::default() },
    ];
    let messages: Vec<String> =
        bad.iter().map(|c| GradScaler::new(&ctx, sgd(), *c).err().expect("refused").to_string()).collect();
    snapshots().bind(|| insta::assert_snapshot!("grad-scaler-config", messages.join("\n")));
}
