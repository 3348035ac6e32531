//! NaN and ±inf through every op with a kernel of its own (issue 33): the
//! elementwise ops and the fused epilogues, the reductions, softmax,
//! log-softmax, the layer norm and matmul, on every backend: the CPU, the
//! CUDA emulator (with `--features cuda-emulator`, as CI runs, whatever
//! `KILN_TEST_EMULATE` says) and a GPU when there is one (with
//! `KILN_REQUIRE_CUDA=1` a missing GPU fails). Attention has its own
//! file (`attention_nonfinite.rs`).
//!
//! The expected values are PyTorch's, written out here rather than
//! computed by a reference that could share a kernel's mistake. PyTorch
//! computes every op by its textbook formula in IEEE arithmetic, so:
//!
//! - a NaN operand gives NaN (`relu(NaN)`, `max([1, NaN])`,
//!   `maximum(NaN, 0)` are NaN, never the other operand);
//! - `inf - inf`, `0 · inf` and `inf / inf` are NaN wherever a formula
//!   makes them: `sum([inf, -inf])`, `gelu(-inf) = -inf · Φ(-inf)`, and
//!   softmax of a row holding `+inf` (`exp(inf - inf)`) or only `-inf`
//!   (`-inf - -inf`), and the layer norm of a row with an inf;
//! - `argmax` takes the first NaN as the maximum, else the first maximum;
//! - matmul sums every product, so a NaN in a row of `a` makes its whole
//!   output row NaN, and `inf · 0` in a product is NaN.
//!
//! Every op of one dtype runs in one realize (one plan: one g++ build on
//! the emulator).

use kiln::prelude::*;
use std::sync::OnceLock;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// A backend: its name and a fresh context on it.
pub type Backend = (&'static str, fn() -> Context);

/// The CPU, the CUDA emulator (feature `cuda-emulator`) and CUDA device 0
/// when a GPU answers; without one the GPU is skipped with a message, and
/// with `KILN_REQUIRE_CUDA=1` that is a failure.
pub fn backends() -> Vec<Backend> {
    static GPU: OnceLock<bool> = OnceLock::new();
    let mut out: Vec<Backend> = vec![("cpu", Context::cpu)];
    #[cfg(feature = "cuda-emulator")]
    out.push(("cuda-emulated", Context::cuda_emulated));
    let gpu = *GPU.get_or_init(|| match Context::cuda(0) {
        Ok(_) => true,
        Err(e) => {
            if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
            }
            eprintln!(
                "tests/ops/nonfinite: CUDA skipped ({})",
                e.to_string().lines().next().unwrap_or_default()
            );
            false
        }
    });
    if gpu {
        out.push(("cuda", || Context::cuda(0).unwrap_or_else(|e| panic!("CUDA went away: {e}"))));
    }
    out
}

/// Whether `got` is `want` for a result of `dtype`: NaN for NaN, the same
/// infinity for an infinity, else within `tol · (1 + |want|)` (`want`'s
/// sign of zero is not checked).
pub fn same(got: f64, want: f64, tol: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want.is_infinite() {
        got == want
    } else {
        (got - want).abs() <= tol * (1.0 + want.abs())
    }
}

/// The relative tolerance of a result computed in `dtype` from O(1) data.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        DType::F32 => 1e-5,
        _ => 1e-12,
    }
}

/// Compares every element: `None` when all match, else a message that
/// lists each element that differs.
pub fn expect(what: &str, got: &[f64], want: &[f64], tol: f64) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{what}: {} elements, want {}", got.len(), want.len()));
    }
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !same(**g, **w, tol))
        .take(8)
        .map(|(i, (g, w))| format!("[{i}] got {g}, want {w}"))
        .collect();
    (!bad.is_empty()).then(|| format!("{what}:\n    {}", bad.join("\n    ")))
}

/// Fails with every message of `failures` (all of them, so one run shows
/// everything a backend gets wrong).
#[track_caller]
pub fn report(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} cases differ from PyTorch's semantics:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// A float tensor's values as f64, whatever its float dtype.
pub fn read(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::I64 => t.to_vec::<i64>().unwrap().into_iter().map(|x| x as f64).collect(),
        _ => t.cast(DType::F32).to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
    }
}

/// The elementwise inputs.
const X: [f64; 6] = [NAN, INF, -INF, -1.0, 0.0, 2.0];

/// `gelu(-1)` and `gelu(2)` (`x Φ(x)`).
const GELU_M1: f64 = -0.158_655_253_931_457_07;
const GELU_2: f64 = 1.954_499_736_103_641_6;
/// `gelu_tanh(-1)` and `gelu_tanh(2)`.
const GELU_TANH_M1: f64 = -0.158_808_009_391_723_24;
const GELU_TANH_2: f64 = 1.954_597_694_087_775;
const SIG_M1: f64 = 0.268_941_421_369_995_1;
const SIG_2: f64 = 0.880_797_077_977_882_3;

/// An op of one tensor.
type Op = fn(&Tensor) -> Tensor;

/// One case: a name, the op on a tensor of `X`, and PyTorch's output.
type Unary = (&'static str, Op, [f64; 6]);

fn unary_cases() -> Vec<Unary> {
    let e = std::f64::consts::E;
    vec![
        ("relu", |x| x.relu(), [NAN, INF, 0.0, 0.0, 0.0, 2.0]),
        // gelu(+inf): x Φ(x) = inf · 1. (PyTorch's vectorized CPU kernel
        // gives NaN there, pytorch#185770, a bug; the formula is inf.)
        ("gelu", |x| x.gelu(), [NAN, INF, NAN, GELU_M1, 0.0, GELU_2]),
        // silu(-inf) = -inf · sigmoid(-inf) = -inf / (1 + inf): NaN.
        ("silu", |x| x.silu(), [NAN, INF, NAN, -SIG_M1, 0.0, 2.0 * SIG_2]),
        // gelu_tanh(-inf) = -inf (1 + tanh(-inf)) / 2 = -inf · 0: NaN, as
        // PyTorch's `gelu(approximate="tanh")` gives.
        ("gelu_tanh", |x| x.gelu_tanh(), [NAN, INF, NAN, GELU_TANH_M1, 0.0, GELU_TANH_2]),
        ("sigmoid", |x| x.sigmoid(), [NAN, 1.0, 0.0, SIG_M1, 0.5, SIG_2]),
        ("tanh", |x| x.tanh(), [NAN, 1.0, -1.0, -(1.0f64.tanh()), 0.0, 2.0f64.tanh()]),
        ("exp", |x| x.exp(), [NAN, INF, 0.0, 1.0 / e, 1.0, e * e]),
        ("log", |x| x.log(), [NAN, INF, NAN, NAN, -INF, 2.0f64.ln()]),
        ("sqrt", |x| x.sqrt(), [NAN, INF, NAN, NAN, 0.0, 2.0f64.sqrt()]),
        ("rsqrt", |x| x.rsqrt(), [NAN, 0.0, NAN, NAN, INF, 0.5f64.sqrt()]),
        ("recip", |x| x.recip(), [NAN, 0.0, 0.0, -1.0, INF, 0.5]),
        ("abs", |x| x.abs(), [NAN, INF, INF, 1.0, 0.0, 2.0]),
        ("neg", |x| x.neg(), [NAN, -INF, INF, 1.0, 0.0, -2.0]),
        ("maximum(x, 0)", |x| x.maximum(0.0), [NAN, INF, 0.0, 0.0, 0.0, 2.0]),
        ("minimum(x, 0)", |x| x.minimum(0.0), [NAN, 0.0, -INF, -1.0, 0.0, 0.0]),
        ("x * 0", |x| x * 0.0, [NAN, NAN, NAN, 0.0, 0.0, 0.0]),
        ("x - x", |x| x.sub(x), [NAN, NAN, NAN, 0.0, 0.0, 0.0]),
        ("relu(x) + 1 (fused)", |x| x.relu() + 1.0, [NAN, INF, 1.0, 1.0, 1.0, 3.0]),
        ("x > 0 ? x : 0", |x| x.gt(0.0).where_cond(x, 0.0), [0.0, INF, 0.0, 0.0, 0.0, 2.0]),
    ]
}

/// Rows for the reductions (over the last dim).
const ROWS: [[f64; 3]; 6] = [
    [1.0, NAN, 3.0],
    [1.0, INF, 3.0],
    [-INF, INF, 0.0],
    [-INF, -INF, -INF],
    [2.0, -INF, 1.0],
    [1.0, 2.0, 3.0],
];

/// One reduction case and PyTorch's value per row of [`ROWS`] (rows of
/// three for softmax, log-softmax and the layer norm).
type RowCase = (&'static str, Op, Vec<f64>);

fn row_cases() -> Vec<RowCase> {
    // softmax([2, -inf, 1]) and log_softmax of it.
    let z = 1.0 + (-1.0f64).exp();
    let (p0, p2) = (1.0 / z, (-1.0f64).exp() / z);
    let s3 = [(-2.0f64).exp(), (-1.0f64).exp(), 1.0];
    let z3: f64 = s3.iter().sum();
    let ln = |x: &[f64; 3]| -> f64 { (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]) / 3.0 };
    let norm = 1.0 / (ln(&[-1.0, 0.0, 1.0]) + 1e-5).sqrt();
    vec![
        ("sum", |x| x.sum(&[1], false), vec![NAN, INF, NAN, -INF, -INF, 6.0]),
        ("mean", |x| x.mean(&[1], false), vec![NAN, INF, NAN, -INF, -INF, 2.0]),
        ("max", |x| x.max(&[1], false), vec![NAN, INF, INF, -INF, 2.0, 3.0]),
        ("min", |x| x.min(&[1], false), vec![NAN, 1.0, -INF, -INF, -INF, 1.0]),
        ("argmax", |x| x.argmax(1, false), vec![1.0, 1.0, 1.0, 0.0, 0.0, 2.0]),
        (
            "softmax",
            |x| x.softmax(1),
            [[NAN; 3], [NAN; 3], [NAN; 3], [NAN; 3], [p0, 0.0, p2], [s3[0] / z3, s3[1] / z3, s3[2] / z3]]
                .concat(),
        ),
        (
            "log_softmax",
            |x| x.log_softmax(1),
            [
                [NAN; 3],
                [NAN; 3],
                [NAN; 3],
                [NAN; 3],
                [-z.ln(), -INF, -1.0 - z.ln()],
                [-2.0 - z3.ln(), -1.0 - z3.ln(), -z3.ln()],
            ]
            .concat(),
        ),
        (
            "layer_norm",
            |x| {
                let ctx = x.context().expect("a live tensor").clone();
                x.layer_norm(&ctx.ones_dtype([3], x.dtype()), &ctx.zeros_dtype([3], x.dtype()), 1e-5)
            },
            [[NAN; 3], [NAN; 3], [NAN; 3], [NAN; 3], [NAN; 3], [-norm, 0.0, norm]].concat(),
        ),
    ]
}

/// `values` as a tensor of `dtype` (through f32 for the low types).
pub fn tensor(ctx: &Context, values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    if dtype == DType::F64 {
        return ctx.tensor(values, shape.to_vec());
    }
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    ctx.tensor(&v, shape.to_vec()).cast(dtype)
}

/// The ops of [`unary_cases`] and [`row_cases`] on `dtype`, one plan.
fn elementwise_and_rows(name: &str, ctx: &Context, dtype: DType, failures: &mut Vec<String>) {
    let x = tensor(ctx, &X, &[6], dtype);
    let rows = tensor(ctx, &ROWS.concat(), &[6, 3], dtype);
    // A long row (more than a block of threads) with one NaN, one +inf
    // row and one finite: the reductions' tree paths.
    let n = 3000;
    let mut long = vec![0.0; 3 * n];
    for (i, x) in long.iter_mut().enumerate() {
        *x = ((i * 37 % 101) as f64 - 50.0) / 25.0;
    }
    long[1777] = NAN;
    long[n + 2222] = INF;
    let long_t = tensor(ctx, &long, &[3, n], dtype);
    let (unary, rowc) = (unary_cases(), row_cases());
    let mut outs: Vec<Tensor> = unary.iter().map(|(_, f, _)| f(&x)).collect();
    outs.extend(rowc.iter().map(|(_, f, _)| f(&rows)));
    let long_ops: [(&str, Op); 5] = [
        ("max", |x| x.max(&[1], false)),
        ("min", |x| x.min(&[1], false)),
        ("sum", |x| x.sum(&[1], false)),
        ("argmax", |x| x.argmax(1, false)),
        ("softmax row NaNs", |x| {
            let p = x.softmax(1);
            p.ne(&p).cast(DType::F32).sum(&[1], false)
        }),
    ];
    outs.extend(long_ops.iter().map(|(_, f)| f(&long_t)));
    ctx.realize(&outs.iter().collect::<Vec<_>>()).unwrap_or_else(|e| panic!("{name} {dtype}: {e}"));
    let t = tol(dtype);
    let mut got = outs.iter().map(read);
    for (op, _, want) in &unary {
        failures.extend(expect(&format!("{name}: {op} on {dtype} of {X:?}"), &got.next().unwrap(), want, t));
    }
    for (op, _, want) in &rowc {
        let what = format!("{name}: {op} on {dtype} of the rows {ROWS:?}");
        failures.extend(expect(&what, &got.next().unwrap(), want, 4.0 * t));
    }
    let finite = &long[2 * n..];
    let wmax = finite.iter().fold(-INF, |m: f64, &x| m.max(x));
    let wmin = finite.iter().fold(INF, |m: f64, &x| m.min(x));
    let first = finite.iter().position(|&x| x == wmax).unwrap() as f64;
    let sum: f64 = finite.iter().sum();
    let long_want: [(&str, [f64; 3], f64); 5] = [
        ("max", [NAN, INF, wmax], t),
        ("min", [NAN, wmin, wmin], t),
        ("sum", [NAN, INF, sum], 8.0 * t * (n as f64).sqrt()),
        ("argmax", [1777.0, 2222.0, first], 0.0),
        ("softmax row NaNs", [n as f64, n as f64, 0.0], 0.0),
    ];
    for (op, want, tol) in long_want {
        let what = format!("{name}: {op} on {dtype} over rows of {n}");
        failures.extend(expect(&what, &got.next().unwrap(), &want, tol));
    }
}

#[test]
fn nan_and_inf_through_elementwise_ops_and_reductions_on_every_backend() {
    let mut failures = Vec::new();
    for (name, ctx) in backends() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            elementwise_and_rows(name, &ctx(), dtype, &mut failures);
        }
    }
    report(&failures);
}

/// `a b (+ bias)` in f64, summing every product.
fn matmul_ref(a: &[f64], b: &[f64], bias: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|e| a[i * k + e] * b[e * n + j]).sum::<f64>() + bias[j];
        }
    }
    out
}

/// Matmul and its fused epilogues (bias, relu, gelu) with a NaN, an inf
/// meeting a zero (NaN) and an inf meeting non-zeros (inf) in `a`, and a
/// NaN in `b` (one output column NaN), at sizes of the GEMM libraries'
/// real paths (more than one block) and in every float dtype.
#[test]
fn nan_and_inf_through_matmul_and_its_epilogues_on_every_backend() {
    let (m, k, n) = (40, 48, 24);
    let mut a: Vec<f64> = (0..m * k).map(|i| ((i * 13 % 17) as f64 - 8.0) / 8.0).collect();
    let mut b: Vec<f64> = (0..k * n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect();
    let bias: Vec<f64> = (0..n).map(|j| j as f64 / 8.0).collect();
    a[3 * k + 5] = NAN; // row 3: NaN
    a[7 * k + 9] = INF; // row 7: inf meets b[9, :]
    for j in 0..n {
        b[9 * n + j] = if j % 3 == 0 { 0.0 } else { 1.0 }; // inf · 0: NaN
    }
    a[11 * k + 2] = -INF; // row 11: -inf meets b[2, :] of both signs
    b[20 * n + 13] = NAN; // column 13: NaN
    let plain = matmul_ref(&a, &b, &vec![0.0; n], m, k, n);
    let biased = matmul_ref(&a, &b, &bias, m, k, n);
    let relu: Vec<f64> = biased.iter().map(|&x| if x.is_nan() { x } else { x.max(0.0) }).collect();
    assert!(
        plain[3 * n].is_nan() && plain[7 * n].is_nan() && plain[7 * n + 1] == INF,
        "the case as designed"
    );
    let mut failures = Vec::new();
    for (name, ctx) in backends() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            let ctx = ctx();
            let (ta, tb) = (tensor(&ctx, &a, &[m, k], dtype), tensor(&ctx, &b, &[k, n], dtype));
            let tbias = tensor(&ctx, &bias, &[n], dtype);
            let p = ta.matmul(&tb);
            let outs = [p.clone(), &p + &tbias, (&p + &tbias).relu(), (&p + &tbias).gelu()];
            ctx.realize(&outs.iter().collect::<Vec<_>>()).unwrap_or_else(|e| panic!("{name} {dtype}: {e}"));
            let t = 8.0 * tol(dtype) * (k as f64).sqrt();
            failures.extend(expect(&format!("{name}: matmul on {dtype}"), &read(&outs[0]), &plain, t));
            failures.extend(expect(
                &format!("{name}: matmul + bias on {dtype}"),
                &read(&outs[1]),
                &biased,
                t,
            ));
            let what = format!("{name}: relu(matmul + bias) on {dtype}");
            failures.extend(expect(&what, &read(&outs[2]), &relu, t));
            // gelu of the special values only (its finite values are
            // tested elsewhere): NaN stays NaN, +inf stays +inf, -inf is NaN.
            let g = read(&outs[3]);
            for (i, &w) in biased.iter().enumerate() {
                let ok = match w {
                    w if w.is_nan() || w == -INF => g[i].is_nan(),
                    INF => g[i] == INF,
                    _ => g[i].is_finite(),
                };
                if !ok {
                    failures.push(format!(
                        "{name}: gelu(matmul + bias) on {dtype} [{i}]: got {}, want gelu({w})",
                        g[i]
                    ));
                }
            }
        }
    }
    report(&failures);
}
