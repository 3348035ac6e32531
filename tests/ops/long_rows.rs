//! Rows too long for a kernel's registers (past 16 columns a thread of a
//! 1024-thread block: 16384): the CUDA row kernels read them from memory
//! in chunks and take a row's max and its sum of `exp(x - max)` in one
//! pass, rescaling the sum when the running max grows. The cases are the
//! ones that pass gets wrong if it is careless: `-inf` before any finite
//! value (its `exp(-inf - -inf)` must not poison the sum), the max late in
//! the row (every rescale taken), a row of only `-inf`, a `+inf` and a
//! NaN (PyTorch's NaN rows), against f64 on every backend.

use crate::nonfinite::{backends, expect, read, report, tensor, tol};
use crate::reference::{round, Rng};
use kiln::prelude::*;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;
const COLS: usize = 17_000;

/// The rows: random (normal, std 3), then the planted cases.
fn rows(rng: &mut Rng, dtype: DType) -> Vec<Vec<f64>> {
    let mut random = || -> Vec<f64> { (0..COLS).map(|_| round(dtype, rng.normal() * 3.0)).collect() };
    let mut late_max = random();
    late_max[COLS - 1] = 40.0;
    let mut inf_first = random();
    inf_first[..5000].fill(-INF);
    let mut pos_inf = random();
    pos_inf[9000] = INF;
    let mut nan = random();
    nan[12345] = NAN;
    let mut falling: Vec<f64> = (0..COLS).map(|i| round(dtype, 8.0 - i as f64 * 1e-3)).collect();
    for i in (7..COLS).step_by(97) {
        falling[i] = -INF;
    }
    vec![random(), late_max, inf_first, vec![-INF; COLS], pos_inf, nan, falling]
}

/// PyTorch's formula in f64: `m = max(x)` (NaN if any is), `lse = m +
/// ln Σ exp(x - m)`, `log_softmax = x - lse`.
fn log_softmax(row: &[f64]) -> Vec<f64> {
    let lse = log_sum_exp(row);
    row.iter().map(|&x| x - lse).collect()
}

fn log_sum_exp(row: &[f64]) -> f64 {
    let m = row.iter().fold(-INF, |m, &x| if m.is_nan() || x.is_nan() { NAN } else { m.max(x) });
    m + row.iter().map(|&x| (x - m).exp()).sum::<f64>().ln()
}

#[test]
fn softmax_of_rows_longer_than_registers_hold() {
    let mut failures = Vec::new();
    let mut rng = Rng::new(0x5eed_0038);
    for (name, ctx) in backends() {
        for dtype in [DType::F32, DType::BF16] {
            let ctx = ctx();
            let rows = rows(&mut rng, dtype);
            let x = tensor(&ctx, &rows.concat(), &[rows.len(), COLS], dtype);
            let x32 = x.cast(DType::F32);
            let (ls, sm) = (x32.log_softmax(1), x32.softmax(1));
            let sums = sm.sum(&[1], false);
            // The log-sum-exp as its formula: NaN for a row of only -inf
            // (`-inf - -inf`), where a fused kernel's shortcut could say -inf.
            let m = x32.max(&[1], true);
            let lse = (&x32 - &m).exp().sum(&[1], true).log() + &m;
            ctx.realize(&[&ls, &sm, &sums, &lse]).unwrap_or_else(|e| panic!("{name} {dtype}: {e}"));
            let want: Vec<Vec<f64>> = rows.iter().map(|r| log_softmax(r)).collect();
            let (got_ls, got_sm, got_sums, got_lse) = (read(&ls), read(&sm), read(&sums), read(&lse));
            let t = tol(DType::F32);
            for (r, want) in want.iter().enumerate() {
                let what = format!("{name} {dtype}: row {r}");
                let got = &got_ls[r * COLS..(r + 1) * COLS];
                failures.extend(expect(&format!("{what} log_softmax"), got, want, 8.0 * t));
                let want_sm: Vec<f64> = want.iter().map(|x| x.exp()).collect();
                let got = &got_sm[r * COLS..(r + 1) * COLS];
                // Relative: the probabilities are about 1 / COLS.
                let scaled = |v: &[f64]| v.iter().map(|p| p * COLS as f64).collect::<Vec<f64>>();
                failures.extend(expect(
                    &format!("{what} softmax · cols"),
                    &scaled(got),
                    &scaled(&want_sm),
                    8.0 * t,
                ));
                let want_sum = if want[0].is_nan() { NAN } else { 1.0 };
                failures.extend(expect(
                    &format!("{what} softmax row sum"),
                    &[got_sums[r]],
                    &[want_sum],
                    1e-4,
                ));
                let want_lse = log_sum_exp(&rows[r]);
                failures.extend(expect(&format!("{what} log-sum-exp"), &[got_lse[r]], &[want_lse], t));
            }
        }
    }
    report(&failures);
}
