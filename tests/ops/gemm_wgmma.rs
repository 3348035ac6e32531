//! The Hopper GEMM with the epilogue in its registers
//! (`codegen/gemm_wgmma.rs`): f16 and bf16 matmul bodies whose epilogue
//! cuBLASLt takes none of. It is on by default on sm_90 parts, so the
//! cases run on every backend under the default (on an sm_90 device each
//! plan must hold it exactly where the lowering's rule says: an epilogue
//! cuBLASLt cannot take, enough output tiles; elsewhere no plan may), then,
//! where CUDA device 0 is an sm_90 part, again in a child process of this
//! test binary with `KILN_CUDA_WGMMA_GEMM=0` (read when a plan is lowered;
//! setting it here would race with the other tests' threads), where no
//! plan may hold it and cuBLAS's path must give the same values. The
//! emulator (no `wgmma`) skips them.
//!
//! Each is checked against f64 with the unfused plan's roundings (the
//! product rounded to its dtype, then each epilogue op's result):
//!
//! - BERT's FFN up projection, `gelu(x wᵀ + b)` in bf16, over a batch of
//!   rows (one product of 2 x 700), with a last tile of rows (256) and of
//!   columns (128) short and `k` = 200 (a last step of 8);
//! - an f16 product scaled and cast to f32 over an odd number of columns
//!   (element stores) and over a multiple of 4 (vector stores), `k` = 72,
//!   with an inf and a NaN in `x` (their rows are ±inf and NaN);
//! - `gelu(x wᵀ + b) + r` in bf16 with a NaN in `x` (its row) and in the
//!   weight (its column), and `r` read at each output's own index;
//! - `cast<f32>(x wᵀ + b) + r + sᵀ` with an f32 `r` (the epilogue loads
//!   its eight columns as two runs of four) and an f32 `s` read transposed
//!   (no runs: one load an element), over 1416 columns (a last tile of 8);
//! - two bodies that stay on cuBLAS: `relu(x wᵀ + b)` (cuBLASLt's own
//!   epilogue) and a product too small to fill the card.

use crate::attention_wgmma::hopper;
use crate::reference::*;
use kiln::prelude::*;

/// `[m, k] x [n, k]ᵀ` in f64 (rows of `x` and `w` as flat vectors).
fn product(x: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            out[i * n + j] = xr.iter().zip(&w[j * k..(j + 1) * k]).map(|(a, b)| a * b).sum();
        }
    }
    out
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// Whether `t`'s plan holds the Hopper GEMM. Taken before `t` is read.
fn holds_gemm_wgmma(ctx: &Context, t: &Tensor, what: &str) -> bool {
    let report = ctx.report(&[t]).unwrap_or_else(|e| panic!("{what}: report: {e}"));
    report
        .kernel_sources()
        .iter()
        .any(|k| k.name.starts_with("gemm_wgmma") && k.source.contains("wgmma.mma_async"))
}

/// On an sm_90 device, the plan of `t` holds the kernel exactly where
/// `expected`; elsewhere it never does.
fn check_choice(ctx: &Context, t: &Tensor, expected: bool, what: &str) {
    let held = holds_gemm_wgmma(ctx, t, what);
    let opted_in = std::env::var("KILN_CUDA_WGMMA_GEMM").as_deref() != Ok("0");
    assert_eq!(held, hopper(ctx) && opted_in && expected, "{what}: does the plan hold the Hopper GEMM?");
}

const TEST: &str = "gemm_wgmma::hopper_gemm_epilogues_match_f64";
/// Set in the child (run with `KILN_CUDA_WGMMA_GEMM=0`).
const CHILD: &str = "KILN_TEST_WGMMA_GEMM_CHILD";

#[test]
fn hopper_gemm_epilogues_match_f64() {
    run_cases();
    if std::env::var(CHILD).is_ok() || !Context::cuda(0).is_ok_and(|ctx| hopper(&ctx)) {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--exact", TEST, "--nocapture"])
        .env("KILN_CUDA_WGMMA_GEMM", "0")
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && log.contains("1 passed"),
        "the child with KILN_CUDA_WGMMA_GEMM=0 failed:\n{log}"
    );
}

fn run_cases() {
    each_backend(|| {
        // The emulator has no `wgmma`: its plans run these products on
        // cuBLAS's path, which the linalg cases check, at 20 s here.
        if emulated() {
            return;
        }
        let mut rng = Rng::new(4207);
        ffn_up(&mut rng);
        scaled_cast(&mut rng);
        residual_with_nans(&mut rng);
        mixed_operands(&mut rng);
        kept_on_cublas(&mut rng);
    });
}

/// `gelu(x wᵀ + b)` in bf16 over `[2, 700, 200] x [1420, 200]ᵀ`.
fn ffn_up(rng: &mut Rng) {
    let (dt, bt, s, k, n) = (DType::BF16, 2, 700, 200, 1420);
    let ctx = dev();
    let x = rand_f(rng, dt, &[bt, s, k], 1.0);
    let w = rand_f(rng, dt, &[n, k], 0.1);
    let b = rand_f(rng, dt, &[n], 1.0);
    let y = (tensor_f(&ctx, dt, &x).matmul(&tensor_f(&ctx, dt, &w).t()) + tensor_f(&ctx, dt, &b)).gelu();
    let what = "gelu(x wᵀ + b), bf16 [2,700,200] x [1420,200]ᵀ";
    check_choice(&ctx, &y, true, what);
    let p = product(&x.to_vec(), &w.to_vec(), bt * s, n, k);
    let bv = b.to_vec();
    let want: Vec<f64> =
        p.iter().enumerate().map(|(i, &v)| gelu(round(dt, round(dt, v) + bv[i % n]))).collect();
    check_f(&y, dt, &Nd::new(want, &[bt, s, n]), 1.0, what);
}

/// `cast<f32>((x wᵀ) * 0.5)` in f16 over `[1030, 72] x [n, 72]ᵀ`, an inf
/// in row 5 of `x` and a NaN in row 7: `n` = 1701 (odd: element stores,
/// and a row's last columns one at a time) and 1704 (stores of four).
fn scaled_cast(rng: &mut Rng) {
    for n in [1701, 1704] {
        let (dt, m, k) = (DType::F16, 1030, 72);
        let ctx = dev();
        let mut xv = rand_f(rng, dt, &[m, k], 1.0).to_vec();
        xv[5 * k + 3] = f64::INFINITY;
        xv[7 * k + 10] = f64::NAN;
        let x = Nd::new(xv, &[m, k]);
        let w = rand_f(rng, dt, &[n, k], 1.0);
        let y = ((tensor_f(&ctx, dt, &x).matmul(&tensor_f(&ctx, dt, &w).t())) * 0.5).cast(DType::F32);
        let what = format!("cast<f32>((x wᵀ) * 0.5), f16 [1030,72] x [{n},72]ᵀ");
        check_choice(&ctx, &y, true, &what);
        let p = product(&x.to_vec(), &w.to_vec(), m, n, k);
        let want: Vec<f64> = p.iter().map(|&v| round(dt, round(dt, v) * 0.5)).collect();
        assert!(want[5 * n..6 * n].iter().all(|v| v.is_infinite()) && want[7 * n].is_nan());
        // f32 elements holding f16 values: one f16 ulp where the f32 sum and
        // the f64 one round the product apart.
        assert_eq!(y.dtype(), DType::F32, "{what}");
        assert_close(&read_f(&y).to_vec(), &want, dt, 1.0, &what);
    }
}

/// `gelu(x wᵀ + b) + r` in bf16 over `[2, 600, 136] x [1800, 136]ᵀ`, a NaN
/// in `x` (its row) and in `w` (its column).
fn residual_with_nans(rng: &mut Rng) {
    let (dt, bt, s, k, n) = (DType::BF16, 2, 600, 136, 1800);
    let ctx = dev();
    let mut xv = rand_f(rng, dt, &[bt, s, k], 1.0).to_vec();
    xv[(600 + 17) * k + 40] = f64::NAN;
    let mut wv = rand_f(rng, dt, &[n, k], 0.1).to_vec();
    wv[33 * k + 5] = f64::NAN;
    let (x, w) = (Nd::new(xv, &[bt, s, k]), Nd::new(wv, &[n, k]));
    let b = rand_f(rng, dt, &[n], 1.0);
    let r = rand_f(rng, dt, &[bt, s, n], 1.0);
    let up = tensor_f(&ctx, dt, &x).matmul(&tensor_f(&ctx, dt, &w).t()) + tensor_f(&ctx, dt, &b);
    let y = up.gelu() + tensor_f(&ctx, dt, &r);
    let what = "gelu(x wᵀ + b) + r, bf16 [2,600,136] x [1800,136]ᵀ, NaN in x and w";
    check_choice(&ctx, &y, true, what);
    let p = product(&x.to_vec(), &w.to_vec(), bt * s, n, k);
    let (bv, rv) = (b.to_vec(), r.to_vec());
    let want: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(i, &v)| round(dt, gelu(round(dt, round(dt, v) + bv[i % n]))) + rv[i])
        .collect();
    assert!(want[617 * n].is_nan() && want[33].is_nan() && !want[34].is_nan());
    check_f(&y, dt, &Nd::new(want, &[bt, s, n]), 1.0, what);
}

/// `cast<f32>(x wᵀ + b) + r + sᵀ`, bf16 products over `[1030, 96] x [1416,
/// 96]ᵀ`: the bias (bf16) and `r` (f32) are read as runs of the eight
/// columns a thread takes, `s` (f32 `[1416, 1030]`, transposed) one
/// element at a time.
fn mixed_operands(rng: &mut Rng) {
    let (dt, m, k, n) = (DType::BF16, 1030, 96, 1416);
    let ctx = dev();
    let x = rand_f(rng, dt, &[m, k], 1.0);
    let w = rand_f(rng, dt, &[n, k], 0.1);
    let b = rand_f(rng, dt, &[n], 1.0);
    let r = rand_f(rng, DType::F32, &[m, n], 1.0);
    let st = rand_f(rng, DType::F32, &[n, m], 1.0);
    let up = tensor_f(&ctx, dt, &x).matmul(&tensor_f(&ctx, dt, &w).t()) + tensor_f(&ctx, dt, &b);
    let y = up.cast(DType::F32) + tensor_f(&ctx, DType::F32, &r) + tensor_f(&ctx, DType::F32, &st).t();
    let what = "cast<f32>(x wᵀ + b) + r + sᵀ, bf16 [1030,96] x [1416,96]ᵀ, r and s f32";
    check_choice(&ctx, &y, true, what);
    let p = product(&x.to_vec(), &w.to_vec(), m, n, k);
    let (bv, rv, sv) = (b.to_vec(), r.to_vec(), st.to_vec());
    let want: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(i, &v)| round(dt, round(dt, v) + bv[i % n]) + rv[i] + sv[(i % n) * m + i / n])
        .collect();
    assert_eq!(y.dtype(), DType::F32, "{what}");
    // The bf16 sum's rounding (one bf16 ulp where the f32 and the f64
    // products round apart) bounds the error; the f32 adds are far finer.
    assert_close(&read_f(&y).to_vec(), &want, dt, 1.0, what);
}

/// `relu(x wᵀ + b)` (cuBLASLt's epilogue) and a GELU over 4 output tiles
/// (too few to fill the card) stay on cuBLAS, and are right there too.
fn kept_on_cublas(rng: &mut Rng) {
    let dt = DType::BF16;
    for (m, n, relu) in [(1400, 1420, true), (256, 512, false)] {
        let k = 64;
        let ctx = dev();
        let x = rand_f(rng, dt, &[m, k], 1.0);
        let w = rand_f(rng, dt, &[n, k], 0.1);
        let b = rand_f(rng, dt, &[n], 1.0);
        let up = tensor_f(&ctx, dt, &x).matmul(&tensor_f(&ctx, dt, &w).t()) + tensor_f(&ctx, dt, &b);
        let y = if relu { up.relu() } else { up.gelu() };
        let what = format!("{}(x wᵀ + b), bf16 [{m},{k}] x [{n},{k}]ᵀ", if relu { "relu" } else { "gelu" });
        check_choice(&ctx, &y, false, &what);
        let p = product(&x.to_vec(), &w.to_vec(), m, n, k);
        let bv = b.to_vec();
        let act = |v: f64| if relu { v.max(0.0) } else { gelu(v) };
        let want: Vec<f64> =
            p.iter().enumerate().map(|(i, &v)| act(round(dt, round(dt, v) + bv[i % n]))).collect();
        check_f(&y, dt, &Nd::new(want, &[m, n]), 1.0, &what);
    }
}
