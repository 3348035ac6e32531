//! NaN and ±inf through attention on every kernel path and backend
//! (issue 33): the CPU kernel, the CUDA-core kernels (f32 at head dim
//! 72 one row a thread, at 64 register-tiled) and the tensor-core kernel
//! (f16 and bf16, head dim 64; over 70 queries bf16 at 64, two query
//! tiles a warp, and at 128, the split schedule; f32 over 70 queries at
//! 64 and 128, 3xTF32), on the CPU,
//! the CUDA emulator and a GPU when there is one (see `nonfinite.rs`).
//!
//! PyTorch's semantics, which [`reference`] computes in f64:
//!
//! ```text
//! s_ij = removed(i, j) ? -inf : scale · (q_i · k_j) + add_ij
//! m_i  = NaN if any s_ij is NaN, else max_j s_ij
//! out_i = 0                                   if m_i = -inf (no key left)
//!       = Σ_j e^(s_ij - m_i) v_j / Σ_j e^(s_ij - m_i)   otherwise
//! ```
//!
//! So a NaN in query row i makes output row i NaN; a NaN in key j makes
//! every row that keeps key j NaN (a causal row before j does not keep
//! it); a NaN in value j makes every row that keeps key j NaN (its
//! weight is positive, or underflows to 0, and `0 · NaN` is NaN);
//! a score of `+inf` makes its row NaN (`e^(inf - inf)`); `-inf` from
//! the data is a weight of 0, and a row of them is zeros, as a row whose
//! keys are all removed (PyTorch's `_safe_softmax`; documented). A bool
//! mask replaces a removed score, an additive mask adds to it (so a NaN
//! score plus `-inf` is still NaN).
//!
//! What is not specified: the values of a removed key (`p = 0` times a
//! NaN or inf value) may or may not reach its row. PyTorch's backends
//! differ there too (the math path multiplies `0 · NaN`, flash skips
//! whole causal blocks); kiln's CPU kernel and one-row CUDA-core kernel
//! never read them, the tensor-core and register-tiled kernels multiply
//! within a tile. The reference marks those outputs `None`.

use super::nonfinite::{backends, read, report, same, tensor, tol};
use kiln::prelude::*;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// `[1, H, SQ, d]` queries over `[1, H, SK, d]` keys and values (`SQ` and
/// `SK` const parameters: 5 over 7 for the flash kernels, 70 over 75 for
/// the tensor-core kernel's two query tiles a warp, 5 over 40 and
/// 150 for the CUDA backend's split-key decode kernel, one chunk and two
/// with a short last one, 40 over 256 and 600 for the register-tiled f32
/// kernel with its keys split over 2 and 4 blocks).
const H: usize = 2;
const ROWS: usize = 5;
const SK: usize = 7;

/// The inputs of one case (row-major `[1, H, S, d]`), with the mask as
/// `keep[i][j]` (bool, broadcast over heads) or `add` (`[1, H, SQ, SK]`).
#[derive(Clone)]
struct Inputs {
    d: usize,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    keep: Option<Vec<bool>>,
    add: Option<Vec<f64>>,
    causal: bool,
}

fn at(h: usize, row: usize, c: usize, rows: usize, d: usize) -> usize {
    (h * rows + row) * d + c
}

/// PyTorch's attention in f64 (module docs); `None` where it is not
/// specified.
fn reference<const SQ: usize, const SK: usize>(x: &Inputs, scale: f64) -> Vec<Option<f64>> {
    let d = x.d;
    let mut out = Vec::with_capacity(H * SQ * d);
    for h in 0..H {
        for i in 0..SQ {
            let s: Vec<f64> = (0..SK)
                .map(|j| {
                    let kept = !(x.causal && j > i) && x.keep.as_ref().is_none_or(|m| m[i * SK + j]);
                    if !kept {
                        return -INF;
                    }
                    let dot: f64 = (0..d).map(|c| x.q[at(h, i, c, SQ, d)] * x.k[at(h, j, c, SK, d)]).sum();
                    scale * dot + x.add.as_ref().map_or(0.0, |a| a[(h * SQ + i) * SK + j])
                })
                .collect();
            let m = if s.iter().any(|x| x.is_nan()) { NAN } else { s.iter().fold(-INF, |m, &x| m.max(x)) };
            let p: Vec<f64> = s.iter().map(|&x| if x == -INF { 0.0 } else { (x - m).exp() }).collect();
            let l: f64 = p.iter().sum();
            for c in 0..d {
                let removed_nonfinite = (0..SK).any(|j| s[j] == -INF && !x.v[at(h, j, c, SK, d)].is_finite());
                if removed_nonfinite {
                    out.push(None);
                } else if m == -INF {
                    out.push(Some(0.0));
                } else {
                    let acc: f64 =
                        (0..SK).filter(|&j| s[j] != -INF).map(|j| p[j] * x.v[at(h, j, c, SK, d)]).sum();
                    out.push(Some(acc / l));
                }
            }
        }
    }
    out
}

/// Finite inputs of head dim `d`, O(1), from a fixed formula.
fn finite<const SQ: usize, const SK: usize>(d: usize) -> Inputs {
    let f = |n: usize, salt: usize| -> Vec<f64> {
        (0..n).map(|i| (((i * 29 + salt * 7) % 23) as f64 - 11.0) / 11.0).collect()
    };
    Inputs {
        d,
        q: f(H * SQ * d, 1),
        k: f(H * SK * d, 2),
        v: f(H * SK * d, 3),
        keep: None,
        add: None,
        causal: false,
    }
}

/// The cases of head dim `d`: a name and its inputs.
fn cases<const SQ: usize, const SK: usize>(d: usize) -> Vec<(&'static str, Inputs)> {
    let base = finite::<SQ, SK>(d);
    let with = |f: &dyn Fn(&mut Inputs)| {
        let mut x = base.clone();
        f(&mut x);
        x
    };
    let row_of = |v: &mut Vec<f64>, h: usize, row: usize, rows: usize, value: f64| {
        for c in 0..d {
            v[at(h, row, c, rows, d)] = value;
        }
    };
    let mut keep_all = vec![true; SQ * SK];
    for j in 0..SK {
        keep_all[3 * SK + j] = false; // query 3 keeps no key
    }
    keep_all[SK + 2] = false;
    vec![
        ("finite", base.clone()),
        ("NaN query row", with(&|x| row_of(&mut x.q, 1, 2, SQ, NAN))),
        ("one NaN in a query", with(&|x| x.q[at(0, 4, d - 1, SQ, d)] = NAN)),
        ("NaN query row, causal", with(&|x| (row_of(&mut x.q, 0, 0, SQ, NAN), x.causal = true).1)),
        ("NaN key", with(&|x| x.k[at(1, 2, 3, SK, d)] = NAN)),
        ("NaN key, causal", with(&|x| (x.k[at(1, 2, 3, SK, d)] = NAN, x.causal = true).1)),
        (
            "NaN key, bool mask removes it for query 1",
            with(&|x| (x.k[at(0, 2, 0, SK, d)] = NAN, x.keep = Some(keep_all.clone())).1),
        ),
        ("NaN value", with(&|x| x.v[at(0, 4, 5, SK, d)] = NAN)),
        ("NaN value, causal", with(&|x| (x.v[at(0, 4, 5, SK, d)] = NAN, x.causal = true).1)),
        (
            "NaN value of a key whose weight underflows to 0",
            with(&|x| {
                let mut add = vec![0.0; H * SQ * SK];
                add[(SQ + 2) * SK + 6] = -1000.0;
                x.add = Some(add);
                x.v[at(1, 6, 1, SK, d)] = NAN;
            }),
        ),
        ("+inf value", with(&|x| x.v[at(1, 1, 0, SK, d)] = INF)),
        (
            "+inf and -inf values in one column",
            with(&|x| (x.v[at(1, 1, 0, SK, d)] = INF, x.v[at(1, 5, 0, SK, d)] = -INF).1),
        ),
        ("+inf in a query (scores of both infinite signs)", with(&|x| x.q[at(0, 1, 0, SQ, d)] = INF)),
        ("-inf key row (products of both signs: NaN scores)", with(&|x| row_of(&mut x.k, 1, 6, SK, -INF))),
        ("a query keeping no key", with(&|x| x.keep = Some(keep_all.clone()))),
        (
            "NaN in an additive mask",
            with(&|x| {
                let mut add = vec![0.0; H * SQ * SK];
                add[(SQ + 3) * SK + 4] = NAN;
                x.add = Some(add);
            }),
        ),
        (
            "-inf additive mask over a whole row",
            with(&|x| {
                let mut add = vec![0.5; H * SQ * SK];
                for j in 0..SK {
                    add[2 * SK + j] = -INF;
                }
                x.add = Some(add);
            }),
        ),
        (
            "-inf additive mask plus a NaN score",
            with(&|x| {
                let mut add = vec![0.0; H * SQ * SK];
                add[4 * SK + 1] = -INF;
                x.add = Some(add);
                x.k[at(0, 1, 0, SK, d)] = NAN;
            }),
        ),
    ]
}

/// Runs every case of `dtype` and head dim `d` on `ctx` in one plan and
/// compares each output with [`reference`] of the inputs rounded to
/// `dtype`.
fn run_cases<const SQ: usize, const SK: usize>(
    backend: &str,
    ctx: &Context,
    dtype: DType,
    d: usize,
    failures: &mut Vec<String>,
) {
    let scale = 1.0 / (d as f64).sqrt();
    let round = |v: &[f64]| -> Vec<f64> { read(&tensor(&Context::cpu(), v, &[v.len()], dtype)) };
    let cases = cases::<SQ, SK>(d);
    let mut outs = Vec::new();
    for (_, x) in &cases {
        let q = tensor(ctx, &x.q, &[1, H, SQ, d], dtype);
        let k = tensor(ctx, &x.k, &[1, H, SK, d], dtype);
        let v = tensor(ctx, &x.v, &[1, H, SK, d], dtype);
        let mask = match (&x.keep, &x.add) {
            (Some(keep), _) => Some(ctx.tensor(keep, [1, 1, SQ, SK])),
            (None, Some(add)) => Some(tensor(ctx, add, &[1, H, SQ, SK], dtype)),
            (None, None) => None,
        };
        outs.push(q.scaled_dot_product_attention(&k, &v, mask.as_ref(), x.causal, None));
    }
    ctx.realize(&outs.iter().collect::<Vec<_>>()).unwrap_or_else(|e| panic!("{backend} {dtype}: {e}"));
    let t = 4.0 * tol(dtype);
    for ((name, x), out) in cases.iter().zip(&outs) {
        let rounded = Inputs {
            q: round(&x.q),
            k: round(&x.k),
            v: round(&x.v),
            add: x.add.as_ref().map(|a| round(a)),
            ..x.clone()
        };
        let want = reference::<SQ, SK>(&rounded, scale);
        let got = read(out);
        let bad: Vec<String> = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| w.is_some_and(|w| !same(**g, w, t)))
            .take(12)
            .map(|(e, (g, w))| {
                let (h, i, c) = (e / (SQ * d), e / d % SQ, e % d);
                format!("[head {h}, query {i}, col {c}] got {g}, want {}", w.unwrap())
            })
            .collect();
        if !bad.is_empty() {
            failures.push(format!(
                "{backend}: attention, {name}, {dtype}, head dim {d}:\n    {}",
                bad.join("\n    ")
            ));
        }
    }
}

/// Every kernel path: the CPU kernel on the CPU, on CUDA (and the
/// emulator) the CUDA-core kernels (f32 at head dim 72 and 64, f16 at
/// 40), the tensor-core kernel (f16 and bf16 at head dim 64), over 40 and 150
/// keys the split-key kernel (`codegen/attention_decode.rs`), and over 256
/// and 600 the register-tiled kernel's split keys (`codegen/attention_simt.rs`).
#[test]
fn nan_and_inf_through_attention_on_every_kernel_and_backend() {
    let mut failures = Vec::new();
    for (backend, ctx) in backends() {
        for (dtype, d) in [
            (DType::F32, 72),
            (DType::F32, 64),
            (DType::F16, 40),
            (DType::F16, 64),
            (DType::BF16, 64),
            (DType::F64, 8),
        ] {
            run_cases::<ROWS, SK>(backend, &ctx(), dtype, d, &mut failures);
        }
        // A few query rows over many keys: the split-key kernel on CUDA
        // (the CPU has none). The emulator runs the one-chunk case only:
        // the others cost CI most of a minute there; the GPU runs them all.
        if backend != "cpu" {
            run_cases::<ROWS, 40>(backend, &ctx(), DType::F16, 40, &mut failures);
        }
        if backend == "cuda" {
            for (dtype, d) in [(DType::F32, 72), (DType::BF16, 64), (DType::F64, 8)] {
                run_cases::<ROWS, 150>(backend, &ctx(), dtype, d, &mut failures);
            }
        }
        // More than 64 query rows: bf16 heads of 64 take two query tiles a
        // warp, heads of 128 the split schedule (queries in shared memory).
        // The NaN and inf keys and values reach every tile's rows.
        // f32 heads over as many rows take the 3xTF32 tensor-core kernel
        // (tiles of 64 keys at head dim 64, 32 at 128), whose inputs are
        // split in two: an infinite one must stay itself plus 0.
        for d in [64, 128] {
            run_cases::<70, 75>(backend, &ctx(), DType::BF16, d, &mut failures);
            run_cases::<70, 75>(backend, &ctx(), DType::F32, d, &mut failures);
        }
        // Many query rows over many keys in f32: the register-tiled kernel
        // with each query block's keys split over 2 blocks (4 on the GPU
        // only), merged by the last to arrive.
        run_cases::<40, 256>(backend, &ctx(), DType::F32, 64, &mut failures);
        if backend == "cuda" {
            run_cases::<40, 600>(backend, &ctx(), DType::F32, 32, &mut failures);
        }
    }
    report(&failures);
}

/// Issue 33, defect 7: a NaN query row came out as zeros on the CPU
/// kernel and the CUDA-core kernel (the tensor-core kernel gave NaN, as
/// PyTorch does). Every output element of that row must be NaN, and the
/// other rows untouched, on every kernel.
#[test]
fn attention_keeps_a_nan_query_row_nan_on_every_kernel() -> Result<()> {
    let mut failures = Vec::new();
    for (backend, ctx) in backends() {
        for (dtype, d) in [(DType::F32, 72), (DType::F32, 64), (DType::F16, 64), (DType::F32, 8)] {
            let ctx = ctx();
            let x = finite::<ROWS, SK>(d);
            let mut q = x.q.clone();
            for c in 0..d {
                q[at(1, 2, c, ROWS, d)] = NAN;
            }
            let t = |v: &[f64], s: usize| tensor(&ctx, v, &[1, H, s, d], dtype);
            let out = t(&q, ROWS).scaled_dot_product_attention(&t(&x.k, SK), &t(&x.v, SK), None, false, None);
            let got = read(&out);
            if let Some((e, g)) = got.iter().enumerate().find(|(e, g)| (e / d == ROWS + 2) != g.is_nan()) {
                failures.push(format!(
                    "{backend} {dtype} head dim {d}: element {e} (head {}, query {}) is {g}",
                    e / (ROWS * d),
                    e / d % ROWS
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "the NaN query row (head 1, query 2) must be all NaN and the other rows finite:\n  {}",
        failures.join("\n  ")
    );
    Ok(())
}
