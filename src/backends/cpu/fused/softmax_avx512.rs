//! Softmax's row in 512-bit registers, for CPUs with AVX-512F.
//!
//! # Why
//!
//! In the AVX2 row kernel (`rows.rs`) the `exp(x - max)` loop was about
//! 70% of softmax's time and the division about 28% (RESULTS.md, issue
//! 38, tenth session): eight lanes an iteration, five of `exp`'s
//! constants reloaded each time (16 `ymm` registers do not hold them
//! all), the two-factor `2^n` scaling's integer steps, and `vdivps` at
//! its throughput. Here the `exp` loop does sixteen lanes an iteration,
//! reads its constants as broadcast memory operands (`{1to16}`, no
//! register and no separate load) and scales by `2^n` with one
//! `vscalefps`; the sum is a second loop over the row (in L1), which
//! also finds the least nonzero `exp`; and the division becomes a
//! multiply by the reciprocal with Markstein's correction where that is
//! proven to give the quotient's bits, and stays a division elsewhere.
//! (Adding into the `f64` partials inside the `exp` loop measured slower:
//! the conversions compete with `exp`'s multiply-adds.)
//!
//! # Why inline assembly
//!
//! As in `sgemm/avx512.rs`: Rust's AVX-512 intrinsics and target feature
//! are stable since 1.89, kiln's rust-version is 1.85, and `asm!` takes
//! AVX-512 instructions in any function as long as it names only
//! `zmm0`-`zmm15` (declared clobbered through `xmm0`-`xmm15`). Each block
//! ends with `vzeroupper`.
//!
//! # Results: the interpreter's bits
//!
//! **`exp`:** each lane runs `fast_math::exp_f32`'s operations in its
//! order with the same roundings (the same fused multiply-adds;
//! `fma(n, -c, r)` as `vfnmadd231ps`, the same exact product negated),
//! with two differences that give the same bits for softmax's arguments:
//! - *No upper clamp.* The argument is `x - max(x)`: at most zero, or
//!   NaN. `exp_f32` clamps to 89 only to keep `n` small.
//! - *`2^n` as one `vscalefps`.* `exp_f32` multiplies `e` (in
//!   `[0.7, 1.5]`) by `2^(n/2)` twice so that a subnormal result is
//!   rounded once: the first product is exact (a normal number times a
//!   power of two), so its result is `e * 2^n` rounded once.
//!   `vscalefps` computes `e * 2^floor(n)` rounded once (to nearest, into
//!   subnormals as the multiply does), and `n` is an integer: the same
//!   value, rounded the same way. A NaN `e` comes out as itself (the
//!   first operand's NaN, as the multiply passes it on).
//!
//! **The sum:** `lanes::sum_f64`'s sixteen partials: lane `j` of each
//! 16-float vector, converted to `f64`, added to partial `j` in order
//! (two 8-lane `f64` accumulators), then `lanes::combine`.
//!
//! **The division** `t / s`: with `y = RN(1/s)` and `y_lo = RN(1 - s y) y`
//! (`1 - s y` is exact in a fused multiply-add), `q = RN(t y + RN(t y_lo))`
//! is within half an ulp of `t / s` plus a relative `2^-45`, so within one
//! ulp; then `r = t - s q` is exact and `RN(q + r y)` is `RN(t / s)`
//! (Markstein's theorem, IBM J. Res. Dev. 34(1), 1990; Muller et al.,
//! *Handbook of Floating-Point Arithmetic*, the FMA-based division: it
//! needs `y` within half an ulp of `1/s`, `q` within one ulp, and no
//! underflow or overflow on the way). So a row takes it only when
//! `s` is in `[1, 2^30]` (softmax's `s` is at least 1, the max's own
//! `exp(0)`, or NaN) and every `t` is zero or in `[2^-60, 1]`; a row with
//! a `t` in `(0, 2^-60)` (an argument under about -41.6) or a NaN divides.
//! `tests::division_*` check it against `/` over every `t` of sampled
//! binades and reciprocals that are the furthest from `1/s`.
//!
//! `tests::exp_pass_*` check the `exp` and the sum against the scalar
//! definitions over `exp`'s whole range, its subnormal and zero results,
//! NaN and `-inf` lanes and every tail length; `tests/rows.rs` checks
//! whole rows against the interpreter.

use super::super::lanes;
use crate::ir::fast_math::{exp_f32, EXP_LO, EXP_P, LN2_HI, LN2_LO, ROUND_MAGIC};

/// True when this CPU (and its OS, which must save the 512-bit state) can
/// run [`softmax_row`].
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One softmax row of `x` into `y`, `exp(x - max)` in `tmp` (all three
/// as long): the bits of `rows.rs`'s `softmax_plain`.
///
/// # Safety
/// [`available`] must be true.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn softmax_row(x: &[f32], y: &mut [f32], tmp: &mut [f32]) {
    assert!(x.len() == y.len() && x.len() == tmp.len(), "softmax_row: rows of different lengths");
    let m = lanes::extreme(x, true);
    // SAFETY: the CPU supports avx512f, avx2 and fma (the caller's
    // contract); `m` is `x`'s max, as `exp_sub` asks.
    unsafe {
        exp_sub(x, m, tmp);
        let (s, least) = sum_least(tmp);
        let s = s as f32;
        if markstein_holds(s, least) {
            divide_markstein(tmp, s, y);
        } else {
            divide(tmp, s, y);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn softmax_row(_: &[f32], _: &mut [f32], _: &mut [f32]) {
    unreachable!("the AVX-512 softmax is only called where `available()`")
}

/// `exp_f32`'s constants, at the byte offsets the assembly names (4 each).
#[cfg(target_arch = "x86_64")]
static K: [f32; 12] = [
    std::f32::consts::LOG2_E, // 0
    LN2_HI,                   // 4
    LN2_LO,                   // 8
    EXP_P[0],                 // 12: the polynomial, highest degree first
    EXP_P[1],                 // 16
    EXP_P[2],                 // 20
    EXP_P[3],                 // 24
    EXP_P[4],                 // 28
    EXP_P[5],                 // 32
    1.0,                      // 36
    EXP_LO,                   // 40
    ROUND_MAGIC,              // 44
];

/// `t[i] = exp_f32(x[i] - m)` for every `i`, to the bit.
///
/// `m` must be `x`'s max as `lanes::extreme` gives it (so every `x[i] - m`
/// is at most zero or NaN: the loop has no upper clamp); `t` is as long
/// as `x`.
///
/// # Safety
/// [`available`] must be true.
#[cfg(target_arch = "x86_64")]
unsafe fn exp_sub(x: &[f32], m: f32, t: &mut [f32]) {
    use std::arch::asm;
    assert_eq!(x.len(), t.len(), "exp_sub: x and t differ in length");
    let chunks = x.len() / lanes::LANES;
    if chunks > 0 {
        // SAFETY: the loop reads `chunks * 16` floats from `x` and writes
        // as many to `t` (both that long, checked above), and reads `K`'s
        // 12 floats and `m`. Only zmm0-15 (declared through xmm0-15) and
        // the named general registers change; `vzeroupper` clears the
        // upper halves before returning.
        unsafe {
            asm!(
                "vbroadcastss zmm15, dword ptr [{k} + 40]",
                "2:",
                // d = max(EXP_LO, x - m), a NaN `d` kept (the second
                // operand is returned when the compare is false).
                "vmovups zmm0, zmmword ptr [{x}]",
                "vsubps zmm0, zmm0, dword ptr [{mp}]{{1to16}}",
                "vmaxps zmm0, zmm15, zmm0",
                // n = round(d log2 e) through the magic sum.
                "vbroadcastss zmm1, dword ptr [{k}]",
                "vfmadd213ps zmm1, zmm0, dword ptr [{k} + 44]{{1to16}}",
                "vsubps zmm2, zmm1, dword ptr [{k} + 44]{{1to16}}",
                // r = d - n ln2_hi - n ln2_lo; z = r^2.
                "vfnmadd231ps zmm0, zmm2, dword ptr [{k} + 4]{{1to16}}",
                "vfnmadd231ps zmm0, zmm2, dword ptr [{k} + 8]{{1to16}}",
                "vmulps zmm1, zmm0, zmm0",
                // p = P(r) by Horner, then e = p z + r + 1.
                "vbroadcastss zmm3, dword ptr [{k} + 12]",
                "vfmadd213ps zmm3, zmm0, dword ptr [{k} + 16]{{1to16}}",
                "vfmadd213ps zmm3, zmm0, dword ptr [{k} + 20]{{1to16}}",
                "vfmadd213ps zmm3, zmm0, dword ptr [{k} + 24]{{1to16}}",
                "vfmadd213ps zmm3, zmm0, dword ptr [{k} + 28]{{1to16}}",
                "vfmadd213ps zmm3, zmm0, dword ptr [{k} + 32]{{1to16}}",
                "vfmadd213ps zmm3, zmm1, zmm0",
                "vaddps zmm3, zmm3, dword ptr [{k} + 36]{{1to16}}",
                // e 2^n, rounded once.
                "vscalefps zmm3, zmm3, zmm2",
                "vmovups zmmword ptr [{t}], zmm3",
                "add {x}, 64",
                "add {t}, 64",
                "dec {n}",
                "jnz 2b",
                "vzeroupper",
                x = inout(reg) x.as_ptr() => _,
                t = inout(reg) t.as_mut_ptr() => _,
                n = inout(reg) chunks => _,
                k = in(reg) K.as_ptr(),
                mp = in(reg) &m,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                out("xmm15") _,
                options(nostack),
            );
        }
    }
    let done = chunks * lanes::LANES;
    for (o, &v) in t[done..].iter_mut().zip(&x[done..]) {
        *o = exp_f32(v - m);
    }
}

/// `lanes::sum_f64(t)` to the bit, and the least of `t`'s bit patterns
/// minus one (wrapping: a zero counts as the largest), which says whether
/// any `t` lies in `(0, 2^-60)`.
///
/// # Safety
/// [`available`] must be true.
#[cfg(target_arch = "x86_64")]
unsafe fn sum_least(t: &[f32]) -> (f64, u32) {
    use std::arch::asm;
    let chunks = t.len() / lanes::LANES;
    let mut p = [0f64; lanes::LANES];
    let mut least = [u32::MAX; lanes::LANES];
    if chunks > 0 {
        // SAFETY: the loop reads `chunks * 16` floats from `t` and writes
        // `p`'s 16 doubles and `least`'s 16 words. Only zmm0-15 (declared
        // through xmm0-15) and the named general registers change;
        // `vzeroupper` clears the upper halves before returning.
        unsafe {
            asm!(
                // zmm13, zmm14 = partials 0-7, 8-15; zmm12 = the least
                // bits - 1 per lane; zmm11 = -1 in every lane.
                "vxorpd xmm13, xmm13, xmm13",
                "vxorpd xmm14, xmm14, xmm14",
                "vpternlogd zmm12, zmm12, zmm12, 0xff",
                "vpternlogd zmm11, zmm11, zmm11, 0xff",
                "2:",
                "vpaddd zmm0, zmm11, zmmword ptr [{t}]",
                "vpminud zmm12, zmm12, zmm0",
                "vcvtps2pd zmm1, ymmword ptr [{t}]",
                "vaddpd zmm13, zmm13, zmm1",
                "vcvtps2pd zmm2, ymmword ptr [{t} + 32]",
                "vaddpd zmm14, zmm14, zmm2",
                "add {t}, 64",
                "dec {n}",
                "jnz 2b",
                "vmovupd zmmword ptr [{p}], zmm13",
                "vmovupd zmmword ptr [{p} + 64], zmm14",
                "vmovdqu32 zmmword ptr [{least}], zmm12",
                "vzeroupper",
                t = inout(reg) t.as_ptr() => _,
                n = inout(reg) chunks => _,
                p = in(reg) p.as_mut_ptr(),
                least = in(reg) least.as_mut_ptr(),
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm11") _,
                out("xmm12") _, out("xmm13") _, out("xmm14") _,
                options(nostack),
            );
        }
    }
    let done = chunks * lanes::LANES;
    for (j, &v) in t[done..].iter().enumerate() {
        p[j] += v as f64;
        least[j] = least[j].min(v.to_bits().wrapping_sub(1));
    }
    (lanes::combine(p), least.into_iter().min().unwrap_or(u32::MAX))
}

/// `2^-60`'s bits: a `t` under it (and not zero) divides.
const T_LEAST: u32 = 0x2180_0000;
/// `2^30`: an `s` over it divides.
const S_MOST: f32 = 1_073_741_824.0;

/// Whether [`divide_markstein`] gives `t / s`'s bits for every `t` of a
/// row whose [`sum_least`] is `least` (see the module docs): `s` in
/// `[1, 2^30]` and every `t` zero or at least `2^-60` (softmax's `t` are
/// at most 1).
fn markstein_holds(s: f32, least: u32) -> bool {
    (1.0..=S_MOST).contains(&s) && least >= T_LEAST - 1
}

/// `y[i] = t[i] / s` as a multiply by the reciprocal and Markstein's
/// correction: the quotient's bits where [`markstein_holds`].
///
/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn divide_markstein(t: &[f32], s: f32, y: &mut [f32]) {
    let y_hi = 1.0 / s;
    let y_lo = (-s).mul_add(y_hi, 1.0) * y_hi;
    for (o, &v) in y.iter_mut().zip(t) {
        let q = v.mul_add(y_hi, v * y_lo);
        let r = (-q).mul_add(s, v);
        *o = r.mul_add(y_hi, q);
    }
}

/// `y[i] = t[i] / s`.
///
/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn divide(t: &[f32], s: f32, y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(t) {
        *o = v / s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp_sub` and `sum_least` against the scalar definitions, to the
    /// bit (any NaN matching any NaN); `what` names the case.
    fn check(x: &[f32], m: f32, what: &str) {
        let want: Vec<f32> = x.iter().map(|&v| exp_f32(v - m)).collect();
        let mut got = vec![f32::NAN; x.len()];
        // SAFETY: the callers check `available()`.
        let (sum, least) = unsafe {
            exp_sub(x, m, &mut got);
            sum_least(&got)
        };
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            assert!(ok, "{what}: element {i}, exp({:e} - {m:e}): got {g:e}, want {w:e}", x[i]);
        }
        let s = lanes::sum_f64(&want);
        assert!(
            sum.to_bits() == s.to_bits() || (sum.is_nan() && s.is_nan()),
            "{what}: sum {sum:e}, want {s:e}"
        );
        let l = want.iter().map(|v| v.to_bits().wrapping_sub(1)).min().unwrap_or(u32::MAX);
        assert_eq!(least, l, "{what}: least");
    }

    #[test]
    fn exp_pass_matches_exp_f32_over_its_whole_range() {
        if !available() {
            return;
        }
        // Every 61st f32 from -0 down to -120: results near 1, the
        // normal range, the subnormal results (-87.34 to -103.97, where
        // `exp_f32` rounds its two-factor product once) and zeros.
        let x: Vec<f32> = (0x8000_0000u32..0xc2f0_0000).step_by(61).map(f32::from_bits).collect();
        check(&x, 0.0, "sweep, m = 0");
        // The same arguments as x - m with x and m of other sizes.
        let m = 100.0;
        let shifted: Vec<f32> = x.iter().step_by(7).map(|&d| d + m).collect();
        check(&shifted, m, "sweep, m = 100");
    }

    #[test]
    fn exp_pass_edges_specials_and_tails() {
        if !available() {
            return;
        }
        let edges = [
            0.0,
            -0.0,
            -1e-45,
            -1e-40,
            -f32::MIN_POSITIVE,
            -0.346_573_6, // ln 2 / 2, where n changes
            -0.346_573_63,
            -87.33,
            -87.336_54, // ln(2^-126): the last normal result
            -87.34,
            -100.0,
            -103.27, // 2^-149, the least subnormal
            -103.97,
            -103.972_08, // ln(2^-150): rounds to 0 or 2^-149
            -104.0,
            -104.5,
            -1e30,
            f32::MIN,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        // Every length up to five vectors (each tail of the 16-lane loop),
        // each edge at every lane position in turn.
        for len in 0..80 {
            for shift in [0, 5, 16] {
                let x: Vec<f32> = (0..len).map(|i| edges[(i + shift) % edges.len()]).collect();
                check(&x, 0.0, &format!("edges, length {len}, shift {shift}"));
            }
        }
        // A row with a NaN: its max is NaN, every lane NaN.
        let mut x: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 - 3.0).collect();
        x[17] = f32::NAN;
        check(&x, lanes::extreme(&x, true), "a row with a NaN");
        // +inf in the row: inf - inf is NaN, the rest exp(-inf) = 0.
        x[17] = f32::INFINITY;
        check(&x, f32::INFINITY, "a row with +inf");
        // All -inf: -inf - -inf is NaN.
        check(&[f32::NEG_INFINITY; 33], f32::NEG_INFINITY, "a row of -inf");
        // Random rows against their max, as softmax calls it.
        for (len, scale) in [(1024usize, 1.0f32), (1000, 30.0), (4099, 3.0)] {
            let x: Vec<f32> = (0..len).map(|i| (((i * 7919) % 1013) as f32 / 1013.0 - 0.5) * scale).collect();
            check(&x, lanes::extreme(&x, true), &format!("random row of {len}, scale {scale}"));
        }
    }

    /// `divide_markstein(t, s)` against `t / s` for every `t`, to the bit.
    fn same_quotients(t: &[f32], s: f32) {
        let mut got = vec![0f32; t.len()];
        // SAFETY: the callers check `available()` (avx2 and fma).
        unsafe { divide_markstein(t, s, &mut got) };
        for (&v, g) in t.iter().zip(&got) {
            assert_eq!(g.to_bits(), (v / s).to_bits(), "{v:e} / {s:e}: got {g:e}, want {:e}", v / s);
        }
    }

    #[test]
    fn division_by_markstein_matches_the_quotient_where_it_is_taken() {
        if !available() {
            return;
        }
        // Divisors whose f32 reciprocal is the furthest from 1/s (the
        // theorem's worst case), every 65537th mantissa, and edges: the
        // binade [1, 2) scaled to softmax's sums and the bound 2^30.
        let mut worst: Vec<(f64, f32)> = (0..1u32 << 23)
            .step_by(3)
            .map(|k| {
                let s = f32::from_bits(0x3f80_0000 | k);
                let y = 1.0 / s;
                let ulp = f32::from_bits(y.to_bits() + 1) as f64 - y as f64;
                ((y as f64 - 1.0 / s as f64).abs() / ulp, s)
            })
            .collect();
        worst.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mantissas = worst
            .iter()
            .take(6)
            .map(|w| w.1)
            .chain((0..1u32 << 23).step_by(65_537).map(|k| f32::from_bits(0x3f80_0000 | k)));
        let divisors: Vec<f32> = mantissas
            .flat_map(|s| [s, s * 2.0, s * 1024.0])
            .chain([1.0, 1.000_000_1, 1.999_999_9, 3.0, 1000.0, 1024.0, S_MOST])
            .collect();
        // Every t of [0.5, 1) (every mantissa), against the worst six;
        // every 997th t of [2^-60, 1] and zero against the rest.
        let binade: Vec<f32> = (0x3f00_0000u32..0x3f80_0000).map(f32::from_bits).collect();
        let range: Vec<f32> =
            (T_LEAST..=0x3f80_0000).step_by(997).map(f32::from_bits).chain([0.0, 1.0]).collect();
        for (i, &s) in divisors.iter().enumerate() {
            assert!(markstein_holds(s, T_LEAST - 1), "{s:e} is in range");
            same_quotients(if i < 18 { &binade } else { &range }, s);
        }
    }

    #[test]
    fn division_outside_the_theorem_divides() {
        // Where the reciprocal is not taken: a t in (0, 2^-60), a sum
        // outside [1, 2^30] or NaN.
        assert!(!markstein_holds(1.5, T_LEAST - 2));
        assert!(!markstein_holds(1.5, 0));
        assert!(markstein_holds(1.5, u32::MAX), "zeros are fine");
        for s in [0.999_999_94, S_MOST * 2.0, f32::INFINITY, f32::NAN] {
            assert!(!markstein_holds(s, u32::MAX), "{s:e}");
        }
        if !available() {
            return;
        }
        // Whole rows through `softmax_row`, against the scalar row:
        // arguments down to -60 (exps under 2^-60 and subnormal ones),
        // so these rows take the division; and rows of -inf masks
        // (zeros), which take the reciprocal.
        for (len, scale, mask) in [(1024usize, 60.0f32, false), (333, 200.0, false), (1024, 4.0, true)] {
            let x: Vec<f32> = (0..len)
                .map(|i| match i % 5 {
                    0 if mask => f32::NEG_INFINITY,
                    _ => (((i * 7919) % 1013) as f32 / 1013.0 - 0.5) * scale,
                })
                .collect();
            let m = lanes::extreme(&x, true);
            let t: Vec<f32> = x.iter().map(|&v| exp_f32(v - m)).collect();
            let s = lanes::sum_f64(&t) as f32;
            let (mut y, mut tmp) = (vec![0f32; len], vec![0f32; len]);
            // SAFETY: `available()` (checked above).
            unsafe { softmax_row(&x, &mut y, &mut tmp) };
            for (i, (g, &v)) in y.iter().zip(&t).enumerate() {
                assert_eq!(g.to_bits(), (v / s).to_bits(), "row {len}/{scale}/{mask}: element {i}");
            }
        }
    }
}
