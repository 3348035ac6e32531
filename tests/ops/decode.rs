//! The shapes of a decode step, which the CUDA backend runs on kernels of
//! their own (issue 34): attention of a few query rows over many keys
//! (`codegen/attention_decode.rs`, split over chunks of 128 keys) and
//! products of a few rows by a weight (`codegen/gemv.rs`, with the matmul
//! body's epilogue in registers). Every case is checked against f64 on
//! fresh random inputs, on every backend `each_backend` runs.

use super::reference::*;
use kiln::prelude::*;

/// `softmax(scale q kᵀ + add) v` in f64 with a per-query bool mask
/// `keep[b, 0, i, j]`; a row with every key removed is zeros.
fn attention_ref(
    q: &Nd<f64>,
    k: &Nd<f64>,
    v: &Nd<f64>,
    keep: Option<&Nd<i64>>,
    add: Option<&Nd<f64>>,
    causal: bool,
    scale: f64,
) -> Nd<f64> {
    let (sk, d, dv) = (k.shape[2], q.shape[3], v.shape[3]);
    let (b, h, sq) = (q.shape[0], q.shape[1], q.shape[2]);
    Nd::from_fn(&[b, h, sq, dv], |ix| {
        let (bi, hi, i, c) = (ix[0], ix[1], ix[2], ix[3]);
        let mut s = Vec::new();
        for j in 0..sk {
            if causal && j > i || keep.is_some_and(|m| m.get(&[bi, 0, i, j]) == 0) {
                continue;
            }
            let dot: f64 = (0..d).map(|e| q.get(&[bi, hi, i, e]) * k.get(&[bi, hi, j, e])).sum();
            s.push((j, dot * scale + add.map_or(0.0, |a| a.get(&[bi, hi, i, j]))));
        }
        let m = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return 0.0;
        }
        let l: f64 = s.iter().map(|x| (x.1 - m).exp()).sum();
        s.iter().map(|&(j, x)| (x - m).exp() / l * v.get(&[bi, hi, j, c])).sum()
    })
}

/// One to three query rows over one chunk of keys (33, 64) and over three
/// with a short last one (300), GPT-2's head dim and odd ones: a KV
/// cache's mask (left padding: row `b` keeps keys `start[b] <= j <=
/// offset + i`; batch row 1 starts past every key, so it keeps none and
/// its output is zeros), causal, additive, none.
#[test]
fn few_query_attention_matches_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3401);
        for (sq, sk, d, dv) in [(1, 64, 64, 64), (2, 300, 24, 40), (3, 33, 8, 8)] {
            for dtype in FLOATS {
                let (b, h) = (2, 2);
                let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
                let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
                let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
                let (tq, tk, tv) =
                    (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
                let scale = 1.0 / (d as f64).sqrt();
                let offset = sk - sq - 1;
                let start = [3usize, sk + 5];
                let keep =
                    Nd::from_fn(&[b, 1, sq, sk], |i| (start[i[0]] <= i[3] && i[3] <= offset + i[2]) as i64);
                let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
                let cases: [(&str, Option<Tensor>, bool, Nd<f64>); 4] = [
                    ("plain", None, false, attention_ref(&q, &k, &v, None, None, false, scale)),
                    ("causal", None, true, attention_ref(&q, &k, &v, None, None, true, scale)),
                    (
                        "cache mask, left padding, a row keeping no key",
                        Some(tensor_i(&ctx, DType::Bool, &keep)),
                        false,
                        attention_ref(&q, &k, &v, Some(&keep), None, false, scale),
                    ),
                    (
                        "additive",
                        Some(tensor_f(&ctx, dtype, &add)),
                        false,
                        attention_ref(&q, &k, &v, None, Some(&add), false, scale),
                    ),
                ];
                for (name, mask, causal, want) in cases {
                    let got = tq.scaled_dot_product_attention(&tk, &tv, mask.as_ref(), causal, None);
                    let tol = if dtype == DType::F64 { 1.0 } else { 4.0 };
                    check_f(
                        &got,
                        dtype,
                        &want,
                        tol,
                        &format!("attention {sq}x{sk} d {d}/{dv} {name} on {dtype}"),
                    );
                }
            }
        }
        // Heads of a [b, s, h, d] projection (a permuted view), as GPT-2's
        // queries arrive, over a cache [b, h, s, d].
        let x = rand_f(&mut rng, DType::F32, &[1, 1, 4, 16], 1.0);
        let t = tensor_f(&ctx, DType::F32, &x).permute(&[0, 2, 1, 3]);
        let k = rand_f(&mut rng, DType::F32, &[1, 4, 140, 16], 1.0);
        let got = t.scaled_dot_product_attention(
            &tensor_f(&ctx, DType::F32, &k),
            &tensor_f(&ctx, DType::F32, &k),
            None,
            false,
            Some(0.3),
        );
        let xp = x.permute(&[0, 2, 1, 3]);
        let want = attention_ref(&xp, &k, &k, None, None, false, 0.3);
        check_f(&got, DType::F32, &want, 4.0, "attention of permuted query heads over a cache");
    });
}

fn matmul_ref(a: &Nd<f64>, w: &Nd<f64>) -> Nd<f64> {
    let (m, k, n) = (a.shape[0], a.shape[1], w.shape[1]);
    Nd::from_fn(&[m, n], |ix| (0..k).map(|e| a.get(&[ix[0], e]) * w.get(&[e, ix[1]])).sum())
}

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + libm_erf(x / std::f64::consts::SQRT_2))
}

/// erf to ~1e-12 (Abramowitz-Stegun 7.1.26 is too coarse for f64 checks):
/// the series for small |x|, the continued fraction's complement beyond.
fn libm_erf(x: f64) -> f64 {
    if x.abs() < 2.5 {
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..80 {
            term *= -x2 / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = e^{-x²}/(x√π) · 1/(1 + 1/(2x²)/(1 + 2/(2x²)/(1 + ...)))
        let ax = x.abs();
        let mut f = 0.0;
        for n in (1..60).rev() {
            f = (n as f64 / 2.0) / (ax + f);
        }
        let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f);
        x.signum() * (1.0 - erfc)
    }
}

/// Products of 1 to 8 rows by weights of 256 × 260 (read 4 columns at a
/// time in f32, `k` split over blocks), 257 columns (element loads) and
/// 264 (read 8 at a time in f16 and bf16, 4 in f32), stored
/// `[in, out]` as GPT-2's Conv1D and transposed as its tied LM head, with
/// each epilogue a decode step fuses: none, bias, gelu(x W + b), a residual
/// add, relu; f32, bf16 and f16.
#[test]
fn few_row_matmuls_with_epilogues_match_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3402);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (m, k, n, transposed) in [
                (1, 256, 260, false),
                (3, 256, 257, false),
                (8, 256, 260, false),
                (5, 300, 257, true),
                (2, 256, 264, false),
                (3, 264, 300, true),
                // A long k: a lane's column loads in several batches.
                (2, 4104, 24, true),
            ] {
                let a = rand_f(&mut rng, dtype, &[m, k], 1.0);
                let w = rand_f(&mut rng, dtype, &[k, n], 1.0);
                let bias = rand_f(&mut rng, dtype, &[n], 1.0);
                let res = rand_f(&mut rng, dtype, &[m, n], 1.0);
                let ta = tensor_f(&ctx, dtype, &a);
                // The transposed weight is stored [n, k] and read as its .t().
                let tw = if transposed {
                    tensor_f(&ctx, dtype, &w.transpose(0, 1).contiguous()).t()
                } else {
                    tensor_f(&ctx, dtype, &w)
                };
                let (tb, tr) = (tensor_f(&ctx, dtype, &bias), tensor_f(&ctx, dtype, &res));
                // The product rounded to the dtype, as the epilogue reads it.
                let mm = matmul_ref(&a, &w).map(|x| round(dtype, x));
                let biased = Nd::from_fn(&[m, n], |i| round(dtype, mm.get(i) + bias.get(&[i[1]])));
                let scale = (k as f64).sqrt();
                let what = |e: &str| {
                    format!("[{m}, {k}] x [{k}, {n}]{} {e} on {dtype}", if transposed { "ᵀ" } else { "" })
                };
                let plain = ta.matmul(&tw);
                check_f(&plain, dtype, &mm, scale, &what("plain"));
                let got = ta.matmul(&tw) + &tb;
                check_f(&got, dtype, &biased, scale, &what("+ bias"));
                let got = (ta.matmul(&tw) + &tb).gelu();
                check_f(&got, dtype, &biased.map(gelu_ref), scale, &what("gelu(+ bias)"));
                let got = &tr + ta.matmul(&tw);
                let want = Nd::from_fn(&[m, n], |i| res.get(i) + mm.get(i));
                check_f(&got, dtype, &want, scale, &what("residual +"));
                let got = (ta.matmul(&tw) + &tb).relu();
                check_f(&got, dtype, &biased.map(|x| x.max(0.0)), scale, &what("relu(+ bias)"));
                // A 3-d activation [1, m, k], as a model's [batch, seq, width].
                let got = ta.reshape([1, m, k]).matmul(&tw) + &tb;
                check_f(&got, dtype, &biased.reshape(&[1, m, n]), scale, &what("3-d + bias"));
            }
        }
    });
}

/// The split-`k` GEMV's arrival counters live across launches (each
/// launch must leave them at zero): three products that split `k`, each
/// run 8 times with fresh values and interleaved with the others, so each
/// plan's eager run, its capture and its replays follow the other plans'
/// launches; every result against f64.
#[test]
fn split_products_interleaved_over_many_calls_match_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3403);
        let dtype = DType::F32;
        for it in 0..8 {
            for (case, (m, k, n)) in
                [(1usize, 256usize, 260usize), (2, 512, 384), (4, 384, 256)].into_iter().enumerate()
            {
                let a = rand_f(&mut rng, dtype, &[m, k], 1.0);
                let w = rand_f(&mut rng, dtype, &[k, n], 1.0);
                let bias = rand_f(&mut rng, dtype, &[n], 1.0);
                let (ta, tw, tb) =
                    (tensor_f(&ctx, dtype, &a), tensor_f(&ctx, dtype, &w), tensor_f(&ctx, dtype, &bias));
                let mm = matmul_ref(&a, &w);
                let biased = Nd::from_fn(&[m, n], |i| mm.get(i) + bias.get(&[i[1]]));
                let (got, want) = match case {
                    0 => (ta.matmul(&tw) + &tb, biased),
                    1 => ((ta.matmul(&tw) + &tb).gelu(), biased.map(gelu_ref)),
                    _ => (ta.matmul(&tw), mm),
                };
                check_f(
                    &got,
                    dtype,
                    &want,
                    (k as f64).sqrt(),
                    &format!("case {case} ([{m}, {k}] x [{k}, {n}]), call {it}"),
                );
            }
        }
    });
}

/// The CPU's few-row product (`backends/cpu/matmul.rs`, `few_rows`) over
/// weights wide enough to be split across threads, stored `[in, out]` and
/// transposed, against f64.
#[test]
fn few_row_products_wide_enough_to_split_match_f64() {
    let ctx = Context::cpu();
    let mut rng = Rng::new(3);
    let (k, n) = (300usize, 1500usize);
    let w: Vec<f32> = (0..k * n).map(|_| rng.normal() as f32).collect();
    let weight = ctx.tensor(&w, [k, n]);
    let wt: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
    let transposed = ctx.tensor(&wt, [n, k]).transpose(0, 1);
    for m in 1..=4usize {
        let x: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
        let want: Vec<f64> = (0..m * n)
            .map(|o| (0..k).map(|kk| x[(o / n) * k + kk] as f64 * w[kk * n + o % n] as f64).sum())
            .collect();
        let xs = ctx.tensor(&x, [m, k]);
        for (what, b) in [("[in, out]", &weight), ("transposed", &transposed)] {
            let got = xs.matmul(b).to_vec::<f32>().expect("matmul");
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{m} rows, {what}, output {o}: {g} vs {w}"
                );
            }
        }
    }
}

/// Greedy sampling's argmax over a vocabulary (`codegen/argmax.rs` on
/// CUDA: a row over many blocks, the last to arrive combining them):
/// rows of 50257 and 16389 columns with the maximum planted anywhere,
/// ties (the lower index wins), a NaN (its index wins), a row of `-inf`
/// (index 0), several calls of each plan interleaved (the arrival counters
/// live across launches), f32, bf16 and f16.
#[test]
fn argmax_over_a_vocabulary_matches_the_reference() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3404);
        for it in 0..4 {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for (rows, cols) in [(1usize, 50257usize), (3, 16389)] {
                    let mut x = rand_f(&mut rng, dtype, &[rows, cols], 1.0).to_vec();
                    for r in 0..rows {
                        let at = rng.range(0, cols as i64) as usize;
                        x[r * cols + at] = 100.0;
                        match (r + it) % 4 {
                            // A tie after (or before) the planted maximum.
                            1 => x[r * cols + rng.range(0, cols as i64) as usize] = 100.0,
                            2 => x[r * cols + rng.range(0, cols as i64) as usize] = f64::NAN,
                            3 if rows > 1 => x[r * cols..][..cols].fill(f64::NEG_INFINITY),
                            _ => {}
                        }
                    }
                    let want: Vec<i64> = x.chunks(cols).map(super::reduce::argmax_f).collect();
                    let t = tensor_f(&ctx, dtype, &Nd::new(x, &[rows, cols]));
                    let got = t.argmax(1, false).to_vec::<i64>().expect("argmax");
                    assert_eq!(got, want, "argmax of {rows} x {cols} {dtype}, call {it}");
                }
            }
        }
    });
}
