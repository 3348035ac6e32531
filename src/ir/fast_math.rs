//! Branch-free `f32` `exp`, `tanh` and `erf` that LLVM can auto-vectorize.
//!
//! # Why
//!
//! `f32::exp` and `f32::tanh` are scalar libm calls: a loop over a slice
//! calls them once per element and never vectorizes (`tanh` over 2^24
//! elements was ~20-40x slower than numpy). numpy and SLEEF use
//! vectorizable kernels instead: range reduction plus a short polynomial,
//! written with selects rather than branches. The functions here are that
//! kind of kernel, written as plain scalar Rust: only `+ - * /`, compares,
//! selects and integer bit operations, so the CPU backend's elementwise
//! loops (and their AVX2 copy) vectorize them.
//!
//! # Method
//!
//! The method is Cephes' (Stephen L. Moshier, Cephes Math Library, `expf.c`
//! and `tanhf.c`): the same range reduction, coefficients and thresholds;
//! the code is written here, branch-free.
//!
//! - `exp(x)`: `n = round(x / ln 2)`, `r = x - n ln 2` (ln 2 split in two so
//!   `n * C1` is exact), `exp(r) ~ 1 + r + r^2 P(r)` with Cephes' degree-5
//!   `P`, then scaled by `2^n` as two factors `2^(n/2)`, so that results in
//!   the subnormal range round once and overflow gives `inf` naturally.
//! - `erf(x)`: not Cephes; kiln's own fits, see [`erf_f32`].
//! - `tanh(x)`: on `|x|`, Cephes' odd polynomial for `|x| < 0.625`, else
//!   `1 - 2 / (exp(2|x|) + 1)` (exactly 1 once `|x|` is large); the sign of
//!   `x` is copied onto the result, so `tanh(-0) = -0`.
//!
//! # Accuracy and determinism
//!
//! Measured against `f64` std over every 997th finite `f32` bit pattern
//! plus edge cases (see the tests): `exp` within 0.98 ulp (0.94 before it used `mul_add`), `tanh` within
//! 1.22 ulp, `erf` within 1.54 ulp (the tests check a 2 ulp bound). Special values are exact:
//! `exp(-inf) = 0`, `exp(inf) = inf`, `exp(x > 88.72...) = inf`,
//! `tanh(+-inf) = +-1`, `erf(+-inf) = +-1`, NaN stays NaN.
//!
//! `exp` computes its range reduction and polynomial with fused
//! multiply-adds (`mul_add`): one rounding each instead of two, and on an
//! FMA CPU a third fewer instructions (the vectorized `exp` went from 0.79
//! to 0.50 ns per element on the 2-core development machine; softmax of
//! f32[8192,4096] from 29 to 25 ms). `mul_add` is correctly rounded
//! wherever it runs: an FMA instruction in the CPU backend's AVX2+FMA
//! loops (every float unary op has one), libm's `fmaf` in code compiled
//! for baseline x86-64 (constant folding, and the loops on a CPU without
//! FMA, where it is about 16x slower). So every path computes the same
//! bits, and Rust never contracts the other `a * b + c` (in `tanh`'s
//! polynomial) into an FMA.

/// `log2(e)`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` high part (few significant bits, so `n * C1` is exact).
pub(crate) const LN2_HI: f32 = 0.693_359_4;
/// `ln 2` low part: `ln 2 - LN2_HI`.
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 * 2^23`: adding and subtracting it rounds to the nearest integer,
/// and the sum's low mantissa bits hold that integer.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;
/// Above this `exp` is `inf` (`ln(f32::MAX) = 88.7228...`): the clamp keeps
/// `n` small while still overflowing.
pub(crate) const EXP_HI: f32 = 89.0;
/// Below this `exp` rounds to 0 (`ln(2^-150) = -103.97...`).
pub(crate) const EXP_LO: f32 = -104.0;

/// `exp`'s polynomial `P(r)`, highest degree first (Cephes' `expf`; its
/// last, 5.0000001201e-1, is 0.5 in `f32`). The CPU backend's generated
/// `exp` (`codegen/emit.rs`) and its AVX-512 softmax read these too.
pub(crate) const EXP_P: [f32; 6] =
    [1.987_569_1e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `x` clamped to `[lo, hi]`, NaN passing through (selects, no branches).
#[inline(always)]
fn clamp_nan(x: f32, lo: f32, hi: f32) -> f32 {
    let x = if x > hi { hi } else { x };
    if x < lo {
        lo
    } else {
        x
    }
}

/// `2^k` for `-126 <= k <= 127`, from the exponent bits.
#[inline(always)]
fn pow2i(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32).wrapping_shl(23))
}

/// `e^x` in `f32`, within 1 ulp (Cephes `expf` method, branch-free).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = clamp_nan(x, EXP_LO, EXP_HI);
    // n = round(x log2 e), |n| <= 150: the magic sum's low bits are n.
    let big = x.mul_add(LOG2E, ROUND_MAGIC);
    let n = big - ROUND_MAGIC;
    let ni = (big.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    // With one rounding, `x - n * LN2_HI` is exact (Cody-Waite) and so is
    // the rest of the reduction to within the low part's rounding.
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let z = r * r;
    let [p0, p1, p2, p3, p4, p5] = EXP_P;
    let p = p0.mul_add(r, p1).mul_add(r, p2).mul_add(r, p3).mul_add(r, p4).mul_add(r, p5);
    let e = p.mul_add(z, r) + 1.0;
    // 2^n as two factors: each is a normal number, so the only rounding
    // past the polynomial is the last product (into subnormals or inf).
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    e * pow2i(n1) * pow2i(n2)
}

/// Below this `|x|` tanh uses the odd polynomial.
const TANH_POLY: f32 = 0.625;

/// `tanh(x)` in `f32`, within 1.3 ulp (Cephes `tanhf` method, branch-free).
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let sign = x.to_bits() & 0x8000_0000;
    let a = f32::from_bits(x.to_bits() & 0x7fff_ffff);
    // |x| < 0.625: x + x^3 P(x^2).
    let z = a * a;
    let p =
        (((-5.704_988_7e-3 * z + 2.063_909e-2) * z - 5.373_971_6e-2) * z + 1.333_144_2e-1) * z - 3.333_328e-1;
    let small = p * z * a + a;
    // Otherwise 1 - 2 / (e^(2|x|) + 1): exactly 1 for large |x| (and inf).
    let large = 1.0 - 2.0 / (exp_f32(a + a) + 1.0);
    let t = if a < TANH_POLY { small } else { large };
    // NaN: both candidates are NaN. The sign of x goes back on (tanh is odd).
    f32::from_bits(t.to_bits() | sign)
}

/// Below this `|x|` erf uses the odd polynomial (`0.921875`, FreeBSD's
/// `erff` split).
const ERF_POLY: f32 = 0.921_875;
/// Past this `|x|` erf is 1 in `f32` (`1 - erfc(4) = 1 - 1.5e-8` rounds
/// to 1); the `erfc` fit ends here.
const ERF_ONE: f32 = 4.0;
/// The centre of the `erfc` fit's variable, `u = |x| - ERF_MID`.
const ERF_MID: f32 = 2.46;

/// `erf(x)` in `f32`, within 1.6 ulp (branch-free, so GELU's loops
/// vectorize; libm's `erff` was a call per element, 4.5% of MiniLM's CPU
/// forward in `perf`).
///
/// - `|x| < 0.921875`: `x + x Q(x^2)`, `Q` a degree-6 fit of
///   `erf(x)/x - 1` (relative error 4e-10 in `f64`); the fused
///   multiply-add keeps the rounding of `Q`'s terms small against `x`.
/// - Otherwise `1 - e^(-x^2 + R(|x| - 2.46))`, `R` a degree-9 fit of
///   `ln erfc(x) + x^2` on `[0.921875, 4]` (absolute error 7e-9), with
///   [`exp_f32`]; `|x|` is clamped to 4, where the result is 1.
///
/// The coefficients were fitted for kiln (weighted least squares on
/// Chebyshev nodes against `mpmath`, then rounded to `f32`). Special
/// values are exact: `erf(±0) = ±0`, `erf(±inf) = ±1`, NaN stays NaN.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let sign = x.to_bits() & 0x8000_0000;
    let a = f32::from_bits(x.to_bits() & 0x7fff_ffff);
    let t = x * x;
    let q = 8.370_091e-5f32
        .mul_add(t, -8.142_701_7e-4)
        .mul_add(t, 5.201_032e-3)
        .mul_add(t, -2.685_939_9e-2)
        .mul_add(t, 1.128_369_6e-1)
        .mul_add(t, -3.761_263_5e-1)
        .mul_add(t, 1.283_792_3e-1);
    let small = x.mul_add(q, x);
    // NaN is not above 4, so it passes through to `big`.
    let b = if a > ERF_ONE { ERF_ONE } else { a };
    let u = b - ERF_MID;
    let r = (-2.733_133_4e-8f32)
        .mul_add(u, 1.614_321_6e-6)
        .mul_add(u, -1.367_967_4e-5)
        .mul_add(u, 8.119_2e-5)
        .mul_add(u, -4.394_331_8e-4)
        .mul_add(u, 2.251_079e-3)
        .mul_add(u, -1.121_159_3e-2)
        .mul_add(u, 5.743_044e-2)
        .mul_add(u, -3.572_219e-1)
        .mul_add(u, -1.542_617_6);
    let big = f32::from_bits((1.0 - exp_f32((-b).mul_add(b, r))).to_bits() | sign);
    if a < ERF_POLY {
        small
    } else {
        big
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 997th finite f32 bit pattern (both signs), plus edge cases.
    fn sweep() -> impl Iterator<Item = f32> {
        let edges = [
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e-45,
            1e-30,
            0.5,
            0.625,
            0.624_999_94,
            1.0,
            9.0,
            10.0,
            44.0,
            88.0,
            88.72,
            88.722_83,
            88.722_84,
            88.8,
            89.0,
            -87.33,
            -87.34,
            -100.0,
            -103.9,
            -103.97,
            -104.0,
            -110.0,
            f32::MAX,
        ];
        let pos = (0..0x7f80_0000u32).step_by(997).map(f32::from_bits);
        pos.chain(edges).flat_map(|v| [v, -v])
    }

    /// Error in f32 ulps of `got` against the exact-ish f64 `want`
    /// (the ulp is that of `want` rounded to f32; at least 2^-149).
    fn ulps(got: f32, want: f64) -> f64 {
        if got as f64 == want {
            return 0.0;
        }
        let w = want as f32;
        if w.is_infinite() {
            return if got == w { 0.0 } else { f64::INFINITY };
        }
        let e = (w.abs().max(f32::MIN_POSITIVE) as f64).log2().floor();
        (got as f64 - want).abs() / 2f64.powf(e - 23.0)
    }

    fn max_ulps(f: fn(f32) -> f32, g: fn(f64) -> f64) -> (f64, f32) {
        let mut worst = (0.0, 0.0);
        for x in sweep() {
            let (got, want) = (f(x), g(x as f64));
            let u = ulps(got, want);
            if u > worst.0 {
                worst = (u, x);
            }
        }
        worst
    }

    #[test]
    fn exp_within_2_ulp() {
        let (u, at) = max_ulps(exp_f32, f64::exp);
        assert!(u <= 2.0, "exp: {u} ulp at {at:e}");
    }

    #[test]
    fn tanh_within_2_ulp() {
        let (u, at) = max_ulps(tanh_f32, f64::tanh);
        assert!(u <= 2.0, "tanh: {u} ulp at {at:e}");
    }

    #[test]
    fn erf_within_2_ulp() {
        let (u, at) = max_ulps(erf_f32, libm::erf);
        assert!(u <= 2.0, "erf: {u} ulp at {at:e}");
    }

    #[test]
    fn erf_special_values() {
        assert_eq!(erf_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(erf_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        for x in [4.0f32, 5.0, 1e10, f32::MAX] {
            assert_eq!(erf_f32(x), 1.0, "erf({x})");
            assert_eq!(erf_f32(-x), -1.0, "erf(-{x})");
        }
        assert_eq!(erf_f32(1e-30), 1.128_379_2e-30);
        assert_eq!(erf_f32(-1e-45), -1e-45);
    }

    #[test]
    fn exp_special_values() {
        assert_eq!(exp_f32(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(88.722_84), f32::INFINITY);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(88.722_83).is_finite());
        assert_eq!(exp_f32(-104.0).to_bits(), 0);
        assert_eq!(exp_f32(-1000.0).to_bits(), 0);
        // subnormal results, within 1 ulp (2^-149) of the reference
        let s = exp_f32(-100.0);
        assert!(s > 0.0 && s < f32::MIN_POSITIVE);
        assert!(ulps(s, (-100f64).exp()) <= 1.0);
    }

    #[test]
    fn tanh_special_values() {
        assert_eq!(tanh_f32(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert!(tanh_f32(f32::NAN).is_nan());
        for x in [9.1f32, 10.0, 20.0, 44.0, 50.0, 1e10, f32::MAX] {
            assert_eq!(tanh_f32(x), 1.0, "tanh({x})");
            assert_eq!(tanh_f32(-x), -1.0, "tanh(-{x})");
        }
        assert_eq!(tanh_f32(1e-30), 1e-30);
        assert_eq!(tanh_f32(-1e-45), -1e-45);
    }
}
