//! The exact GELU of every f16 and bf16 value (all 65,536 bit patterns
//! each: zeros, subnormals, the largest finite values, infinities and
//! NaNs): the generated CUDA kernels compute it branch-free from erfc's
//! Chebyshev fit for results rounded to 16 bits (`kiln.cuh`,
//! `gelu_erf_half`), the CPU from its f32 erf. Against `x · erfc(-x/√2)
//! / 2` in f64, which stays accurate in the negative tail where `1 +
//! erf` cancels. The CUDA kernels are held to one ulp everywhere the
//! result is a normal number; the erf form misses that for 182 bf16
//! inputs below -4 (the CPU's, held to the dtype's tolerance only).

use crate::reference::*;
use kiln::prelude::*;

/// Every value of the 16-bit float `dtype`, as f64.
fn every_value(dtype: DType) -> Vec<f64> {
    (0..=u16::MAX)
        .map(|b| match dtype {
            DType::BF16 => half::bf16::from_bits(b).to_f64(),
            _ => half::f16::from_bits(b).to_f64(),
        })
        .collect()
}

/// The distance from `got` to `want` (both of `dtype`) in units of the
/// last place at `want`.
fn ulps(got: f64, want: f64, dtype: DType) -> f64 {
    let mantissa = if dtype == DType::BF16 { 7 } else { 10 };
    let exponent = want.abs().log2().floor() as i32;
    (got - want).abs() / 2f64.powi(exponent - mantissa)
}

#[test]
fn gelu_of_every_half_value_matches_f64() {
    each_backend(|| {
        let ctx = dev();
        for dtype in [DType::BF16, DType::F16] {
            let xs = every_value(dtype);
            let x = Nd::new(xs.clone(), &[xs.len()]);
            let y = tensor_f(&ctx, dtype, &x).gelu();
            let want = x.map(|v| 0.5 * v * libm::erfc(-v / std::f64::consts::SQRT_2));
            let what = format!("gelu of every {dtype} value on {}", ctx.device());
            // Relative where |gelu| is over 1e-3; absolute below, where the
            // CPU's `1 + erf` form loses the tail to cancellation.
            check_f(&y, dtype, &want, 1e-3, &what);
            if !ctx.device().starts_with("cuda") {
                continue;
            }
            // The generated kernels: within one unit in the last place of
            // the correctly rounded value wherever that is a normal number.
            let got = read_f(&y).to_vec();
            let smallest_normal = if dtype == DType::BF16 { 2f64.powi(-126) } else { 2f64.powi(-14) };
            let mut worst = (0.0, 0.0, 0.0);
            let mut inexact = 0;
            for (&g, &w) in got.iter().zip(&want.to_vec()) {
                let w = round(dtype, w);
                if !w.is_finite() || w.abs() < smallest_normal {
                    continue;
                }
                let u = ulps(g, w, dtype);
                inexact += (u != 0.0) as usize;
                if u > worst.0 {
                    worst = (u, g, w);
                }
            }
            assert!(worst.0 <= 1.0, "{what}: {} ulps (got {:e}, want {:e})", worst.0, worst.1, worst.2);
            // Not the correctly rounded value: where the exact one lies
            // within the formula's error of a rounding boundary.
            assert!(inexact * 100 < got.len(), "{what}: {inexact} results not correctly rounded");
        }
    });
}
