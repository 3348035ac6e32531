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
        // Finite in f64, inf in f32 (where the scale is kept).
        ScalerConfig { init_scale: 1e39, ..ScalerConfig::default() },
        ScalerConfig { growth_factor: 1.0, ..ScalerConfig::default() },
        ScalerConfig { backoff_factor: 1.5, ..ScalerConfig::default() },
        ScalerConfig { growth_interval: 0, ..ScalerConfig::default() },
    ];
    let messages: Vec<String> =
        bad.iter().map(|c| GradScaler::new(&ctx, sgd(), *c).err().expect("refused").to_string()).collect();
    snapshots().bind(|| insta::assert_snapshot!("grad-scaler-config", messages.join("\n")));
}

/// `scope_with_autocast`: only the scope's products (and its gradients')
/// run in bf16, the root's stay f32 (exact to f32), a scope inside turns
/// it off again, every read keeps its f32 dtype, and a loop over the
/// same scopes compiles once. Misuse (a non-low type; re-entering with
/// another setting) is an error naming the scope.
#[test]
fn a_scope_with_autocast_runs_only_its_own_products_low() -> Result<()> {
    let ctx = Context::cpu().with_seed(11);
    let x = ctx.randn([5, 32]);
    let w1 = ctx.variable("w1", ctx.randn([32, 16]) * 0.2)?;
    let w2 = ctx.variable("w2", ctx.randn([16, 4]) * 0.2)?;
    let w3 = ctx.variable("w3", ctx.randn([4, 4]) * 0.2)?;
    let step = || -> Result<(Tensor, Tensor, Tensor)> {
        let h = ctx.scope_with_autocast("encoder", Some(DType::BF16), |ctx| {
            let h = x.matmul(&w1);
            // Off again inside: this product stays f32.
            let inner = ctx.scope_with_autocast("exact", None, |_| Ok(h.matmul(&w2)))?;
            Ok(inner)
        })?;
        let y = h.matmul(&w3);
        let loss = (&y * &y).mean(&[0, 1], false);
        Ok((h, y, loss))
    };
    let (h, y, loss) = step()?;
    assert_eq!((h.dtype(), y.dtype(), loss.dtype()), (DType::F32, DType::F32, DType::F32));
    let grads = loss.backward()?;
    let g1 = grads.get(&w1).expect("a gradient of w1");
    let text = ctx.explain(&[&y, g1])?;
    assert!(text.contains("region encoder autocast=bf16"), "{text}");
    assert!(text.contains("region encoder/exact autocast=off"), "{text}");
    // The encoder's product and its weight's gradient product are bf16;
    // the others are f32.
    let low = text.lines().filter(|l| l.contains("bf16[") && l.contains("= matmul")).count();
    let high = text.lines().filter(|l| l.contains(" f32[") && l.contains("= matmul")).count();
    assert!(low >= 2 && high >= 2, "{low} bf16 and {high} f32 products:\n{text}");

    // Values: the first product in bf16, everything after it exact in f32
    // from that product's values.
    let (xv, w1v, w2v, w3v) =
        (x.to_vec::<f32>()?, w1.to_vec::<f32>()?, w2.to_vec::<f32>()?, w3.to_vec::<f32>()?);
    let mm = |a: &[f64], b: &[f32], n: usize, k: usize, m: usize| -> Vec<f64> {
        (0..n * m).map(|i| (0..k).map(|l| a[(i / m) * k + l] * b[l * m + i % m] as f64).sum()).collect()
    };
    let x64: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
    let first = mm(&x64, &w1v, 5, 32, 16);
    let first_norm: Vec<f64> = {
        let ax: Vec<f64> = x64.iter().map(|v| v.abs()).collect();
        let aw: Vec<f32> = w1v.iter().map(|v| v.abs()).collect();
        mm(&ax, &aw, 5, 32, 16)
    };
    let got_h = h.to_vec::<f32>()?;
    let hv: Vec<f64> = got_h.iter().map(|&v| v as f64).collect();
    let mut differs = false;
    // h = (x w1) w2 with x w1 in bf16: compare with the f64 product of the
    // bf16-rounded first product's bound.
    let second = mm(&first, &w2v, 5, 16, 4);
    let second_norm = {
        let aw: Vec<f32> = w2v.iter().map(|v| v.abs()).collect();
        mm(&first_norm, &aw, 5, 16, 4)
    };
    for i in 0..20 {
        let err = (hv[i] - second[i]).abs();
        assert!(err <= second_norm[i] * 3.0 * 2f64.powi(-8) + 1e-6, "h[{i}] {err} off");
        differs |= err > second_norm[i] * 1e-6;
    }
    assert!(differs, "the encoder's product is as exact as f32's: it did not run in bf16");
    // The root's product is f32 from h's values.
    let yv = y.to_vec::<f32>()?;
    let want = mm(&hv, &w3v, 5, 4, 4);
    for i in 0..20 {
        assert!((yv[i] as f64 - want[i]).abs() <= 1e-5 * want[i].abs().max(1.0), "y[{i}] is not f32-exact");
    }

    // The same scopes again: the loop's later steps compile nothing new.
    let compiles = ctx.stats().compiles;
    for _ in 0..3 {
        let (_, _, loss) = step()?;
        loss.item::<f32>()?;
    }
    assert!(ctx.stats().compiles <= compiles + 1, "{} -> {}", compiles, ctx.stats().compiles);

    // Misuse.
    let err = ctx.scope_with_autocast("encoder", Some(DType::F16), |_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("scope \"encoder\" was entered with autocast bf16 before, now with f16"), "{err}");
    let err = ctx.scope_with_autocast("half", Some(DType::F64), |_| Ok(())).unwrap_err().to_string();
    assert!(err.contains("not f64") && err.contains("scope \"half\""), "{err}");
    // A plain scope re-enters with the setting.
    let y2 = ctx.scope("encoder", |_| Ok(x.matmul(&w1)))?;
    assert!(ctx.explain(&[&y2])?.contains("bf16[5,16] = matmul"));
    Ok(())
}
