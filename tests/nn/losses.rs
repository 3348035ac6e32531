//! Losses against f64 math, including logits large enough that a naive
//! `log(softmax)` or `log(sigmoid)` overflows in f32.

use crate::{close, host};
use kiln::nn;
use kiln::prelude::*;

/// `-Σ_c q_c log softmax(z)_c`, averaged over rows, with
/// `q = (1 - eps)·onehot + eps / C`.
fn ce_ref(z: &[f64], classes: usize, t: &[i64], eps: f64) -> f64 {
    let mut total = 0.0;
    for (row, &y) in z.chunks(classes).zip(t) {
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        for (c, v) in row.iter().enumerate() {
            let q = eps / classes as f64 + if c as i64 == y { 1.0 - eps } else { 0.0 };
            total -= q * (v - lse);
        }
    }
    total / t.len() as f64
}

#[test]
fn cross_entropy_with_and_without_label_smoothing() -> Result<()> {
    let ctx = Context::cpu().with_seed(11);
    // Logits up to ±60: exp overflows f32 without the max subtracted.
    let z = ctx.randn([6, 5]) * 20.0;
    z.realize()?;
    let zv = host(&z);
    let t = [0i64, 4, 2, 2, 1, 3];
    let targets = ctx.tensor(&t, [6]);
    for eps in [0.0, 0.1, 1.0] {
        let loss = nn::cross_entropy_smoothed(&z, &targets, eps)?.item::<f32>()? as f64;
        let want = ce_ref(&zv, 5, &t, eps);
        assert!(
            loss.is_finite() && (loss - want).abs() < 1e-5 * want.abs().max(1.0),
            "eps {eps}: {loss} vs {want}"
        );
    }
    let plain = nn::cross_entropy(&z, &targets.cast(DType::I32))?.item::<f32>()? as f64;
    assert!((plain - ce_ref(&zv, 5, &t, 0.0)).abs() < 1e-4);
    // In f64 the match is tight.
    let z64 = z.cast(DType::F64);
    let l64 = nn::cross_entropy_smoothed(&z64, &targets, 0.1)?.item::<f64>()?;
    assert!((l64 - ce_ref(&zv, 5, &t, 0.1)).abs() < 1e-12);
    Ok(())
}

#[test]
fn cross_entropy_gradient_is_softmax_minus_target() -> Result<()> {
    let ctx = Context::cpu().with_seed(12);
    let z = ctx.variable("z", ctx.randn_dtype([3, 4], DType::F64) * 3.0)?;
    let t = [1i64, 3, 0];
    let loss = nn::cross_entropy_smoothed(&z, &ctx.tensor(&t, [3]), 0.2)?;
    let g = host(loss.backward()?.get(&z).unwrap());
    let zv = host(&z);
    let mut want = Vec::new();
    for (row, &y) in zv.chunks(4).zip(&t) {
        let s: f64 = row.iter().map(|v| v.exp()).sum();
        for (c, v) in row.iter().enumerate() {
            let q = 0.2 / 4.0 + if c as i64 == y { 0.8 } else { 0.0 };
            want.push((v.exp() / s - q) / 3.0);
        }
    }
    close(&g, &want, 1e-12, 1e-10);
    Ok(())
}

#[test]
fn mse_is_the_mean_squared_difference() -> Result<()> {
    let ctx = Context::cpu().with_seed(13);
    let (a, b) = (ctx.randn([4, 3]), ctx.randn([4, 3]));
    ctx.realize(&[&a, &b])?;
    let want = host(&a).iter().zip(host(&b)).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / 12.0;
    let got = nn::mse(&a, &b)?.item::<f32>()? as f64;
    assert!((got - want).abs() < 1e-6 * want.max(1.0));
    Ok(())
}

#[test]
fn binary_cross_entropy_with_logits_is_stable_for_large_logits() -> Result<()> {
    let ctx = Context::cpu().with_seed(14);
    let x = ctx.randn([5, 4]) * 40.0; // e^x overflows f32 past 88
    let y = ctx.rand([5, 4]);
    ctx.realize(&[&x, &y])?;
    let (xv, yv) = (host(&x), host(&y));
    // log(1 + e^x) - x·y, computed stably in f64.
    let want =
        xv.iter().zip(&yv).map(|(x, y)| x.max(0.0) - x * y + (-x.abs()).exp().ln_1p()).sum::<f64>() / 20.0;
    let got = nn::binary_cross_entropy_with_logits(&x, &y)?.item::<f32>()? as f64;
    assert!(got.is_finite() && (got - want).abs() < 1e-5 * want.abs().max(1.0), "{got} vs {want}");
    Ok(())
}
