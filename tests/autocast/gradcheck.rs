//! Gradients under autocast against central finite differences of the
//! same loss in f64. A bf16 gradient is not an f32 one: every product
//! rounds its inputs to 8 bits of mantissa and its result once more, so
//! the bound is a few units of bf16's rounding (2^-8 relative) of the
//! largest gradient entry; f32's gradient of the same loss must sit far
//! inside it (so the bound is not loose enough to pass anything), and
//! must differ from the bf16 one (so the products did run in bf16).
//! Fresh seeded inputs per case: a two-layer MLP with biases and tanh
//! under cross-entropy, and a conv -> relu -> linear net under MSE.

use super::splitmix::Rng;
use kiln::prelude::*;

/// The draws only this file needs.
impl Rng {
    fn values(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// One case: parameter shapes (with their initial scale), the data, and
/// the loss of parameters and data as tensors of any float dtype.
struct Case {
    name: &'static str,
    params: &'static [(&'static [usize], f64)],
    x: &'static [usize],
    loss: fn(&[Tensor], &Tensor, &Tensor) -> Result<Tensor>,
    /// The target, from the data generator's values.
    target: fn(&Context, &mut Rng, DType) -> Tensor,
}

fn mlp(p: &[Tensor], x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let h = (x.matmul(&p[0]) + &p[1]).tanh();
    kiln::nn::cross_entropy(&(h.matmul(&p[2]) + &p[3]), y)
}

fn cnn(p: &[Tensor], x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let h = x.conv2d(&p[0], 1, 1, 1, 1).relu().reshape([4, 3 * 5 * 5]);
    kiln::nn::mse(&h.matmul(&p[1]), y)
}

static CASES: &[Case] = &[
    Case {
        name: "mlp 12-24-5, tanh, cross-entropy",
        params: &[(&[12, 24], 0.3), (&[24], 0.1), (&[24, 5], 0.3), (&[5], 0.1)],
        x: &[16, 12],
        loss: mlp,
        target: |ctx, _, _| {
            let labels: Vec<i64> = (0..16).map(|i| (i * 7 % 5) as i64).collect();
            ctx.tensor(&labels, [16])
        },
    },
    Case {
        name: "conv 2->3 3x3, relu, linear 75-2, mse",
        params: &[(&[3, 2, 3, 3], 0.3), (&[75, 2], 0.2)],
        x: &[4, 2, 5, 5],
        loss: cnn,
        target: |ctx, rng, dtype| tensor_of(ctx, &rng.values(8, 1.0), &[4, 2], dtype),
    },
];

fn tensor_of(ctx: &Context, values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    match dtype {
        DType::F64 => ctx.tensor(values, shape.to_vec()),
        _ => ctx.tensor(&values.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape.to_vec()),
    }
}

/// The analytic gradients (as f64) of the case's loss at `params` on a
/// context, which may have autocast on.
fn gradients(ctx: &Context, case: &Case, params: &[Vec<f64>], x: &[f64], seed: u64) -> Result<Vec<Vec<f64>>> {
    let vars: Vec<Variable> = params
        .iter()
        .zip(case.params)
        .enumerate()
        .map(|(i, (v, (shape, _)))| ctx.variable(&format!("p{i}"), tensor_of(ctx, v, shape, DType::F32)))
        .collect::<Result<_>>()?;
    let p: Vec<Tensor> = vars.iter().map(|v| v.tensor()).collect();
    let xt = tensor_of(ctx, x, case.x, DType::F32);
    let y = (case.target)(ctx, &mut Rng(seed), DType::F32);
    let grads = (case.loss)(&p, &xt, &y)?.backward()?;
    vars.iter()
        .map(|v| grads.get(v).expect("every parameter has a gradient").to_vec::<f32>())
        .map(|g| g.map(|g| g.into_iter().map(f64::from).collect()))
        .collect()
}

/// Central finite differences of the loss in f64 at the f32 values of
/// `params` (the point the f32 and bf16 gradients were taken at).
fn finite_differences(case: &Case, params: &[Vec<f64>], x: &[f64], seed: u64) -> Result<Vec<Vec<f64>>> {
    let ctx = Context::cpu();
    let xt = tensor_of(&ctx, x, case.x, DType::F64);
    let y = (case.target)(&ctx, &mut Rng(seed), DType::F64);
    let loss = |ps: &[Vec<f64>]| -> Result<f64> {
        let p: Vec<Tensor> =
            ps.iter().zip(case.params).map(|(v, (shape, _))| tensor_of(&ctx, v, shape, DType::F64)).collect();
        (case.loss)(&p, &xt, &y)?.item::<f64>()
    };
    let h = 1e-6;
    let mut out = Vec::new();
    let mut probe = params.to_vec();
    for (i, values) in params.iter().enumerate() {
        let mut g = Vec::with_capacity(values.len());
        for j in 0..values.len() {
            probe[i][j] = values[j] + h;
            let up = loss(&probe)?;
            probe[i][j] = values[j] - h;
            let down = loss(&probe)?;
            probe[i][j] = values[j];
            g.push((up - down) / (2.0 * h));
        }
        out.push(g);
    }
    Ok(out)
}

/// The largest difference over the largest magnitude of `want`.
fn relative(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

#[test]
fn bf16_gradients_match_f64_finite_differences_within_bf16_rounding() -> Result<()> {
    // A few roundings of bf16 (unit roundoff 2^-9) through two products
    // and their backward products: 2^-5 of the largest entry.
    let bf16_bound = 2f64.powi(-5);
    for case in CASES {
        for seed in [1u64, 2, 3] {
            let mut rng = Rng(seed * 1000 + case.name.len() as u64);
            // Parameters and data as f32 values, so every dtype sees one point.
            let round = |v: Vec<f64>| v.into_iter().map(|x| x as f32 as f64).collect::<Vec<_>>();
            let params: Vec<Vec<f64>> =
                case.params.iter().map(|(s, scale)| round(rng.values(s.iter().product(), *scale))).collect();
            let x = round(rng.values(case.x.iter().product(), 1.0));
            let numeric = finite_differences(case, &params, &x, seed)?;
            let low = gradients(&Context::cpu().with_autocast(DType::BF16), case, &params, &x, seed)?;
            let full = gradients(&Context::cpu(), case, &params, &x, seed)?;
            for k in 0..params.len() {
                let (e_low, e_full) = (relative(&low[k], &numeric[k]), relative(&full[k], &numeric[k]));
                let what = format!("{} seed {seed} parameter {k}", case.name);
                assert!(e_low <= bf16_bound, "{what}: bf16 gradient off by {e_low:.2e} of its largest entry");
                assert!(e_full <= 1e-4, "{what}: f32 gradient off by {e_full:.2e}");
                assert!(
                    relative(&low[k], &full[k]) > 4.0 * e_full,
                    "{what}: the bf16 gradient is as close as f32's ({e_full:.2e}): it did not run in bf16"
                );
            }
        }
    }
    Ok(())
}

/// Attention's loss: `mse(attention(q, k, x), y)` over `[1, 1, 6, 64]`
/// queries and keys and `[1, 1, 6, 8]` values, with a scale of 1/12800.
fn attention_small_scale(p: &[Tensor], x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let a = p[0].scaled_dot_product_attention(&p[1], x, None, false, Some(1.0 / 12800.0));
    kiln::nn::mse(&a, y)
}

static ATTENTION: Case = Case {
    name: "attention d=64, |q|, |k| ~ 40, scale 1/12800",
    params: &[(&[1, 1, 6, 64], 40.0), (&[1, 1, 6, 64], 40.0)],
    x: &[1, 1, 6, 8],
    loss: attention_small_scale,
    target: |ctx, rng, dtype| tensor_of(ctx, &rng.values(48, 1.0), &[1, 1, 6, 8], dtype),
};

/// Rows of `±40` that share one sign pattern except for `flips · r`
/// entries in row `r`, plus noise: row 0 of the queries against row 0 of
/// the keys is `40 · 40 · 64 = 102400` before the scale, far past f16's
/// 65504, while the scaled scores (at most 8) are ordinary.
fn aligned_rows(rng: &mut Rng, signs: &[f64], flips: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(6 * 64);
    for r in 0..6 {
        for (c, s) in signs.iter().enumerate() {
            let flip = if c < flips * r { -1.0 } else { 1.0 };
            out.push(((40.0 * s * flip + rng.normal()) as f32) as f64);
        }
    }
    out
}

/// Autocast overflow (issue 33): f16 gradients of a loss whose unscaled
/// intermediate products exceed f16's range (65504) while every value the
/// loss is made of, and its gradient, is finite and ordinary. Attention's
/// gradient recomputes `q kᵀ`: it must scale before the product (or keep
/// it wider), as its forward kernel does by accumulating in f32; the
/// gradients must then match f64 finite differences within f16's
/// rounding. (Matmul has no such intermediate: its forward product is the
/// value itself, and its backward products are those of the gradient.)
#[test]
fn f16_gradients_whose_unscaled_products_overflow_f16_match_f64_finite_differences() -> Result<()> {
    // f16's unit roundoff is 2^-11; the scores (up to 8) are rounded
    // once more in the backward's recomputed probabilities.
    let f16_bound = 2f64.powi(-6);
    let case = &ATTENTION;
    for seed in [1u64, 2] {
        let mut rng = Rng(seed * 77);
        let signs: Vec<f64> = (0..64).map(|_| if rng.next() % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let params = vec![aligned_rows(&mut rng, &signs, 4), aligned_rows(&mut rng, &signs, 3)];
        let dot: f64 = params[0][..64].iter().zip(&params[1][..64]).map(|(a, b)| a * b).sum();
        assert!(dot > 65504.0, "the case as designed: q0 · k0 = {dot}");
        let x: Vec<f64> = rng.values(48, 1.0).into_iter().map(|v| v as f32 as f64).collect();
        let numeric = finite_differences(case, &params, &x, seed)?;
        let low = gradients(&Context::cpu().with_autocast(DType::F16), case, &params, &x, seed)?;
        let full = gradients(&Context::cpu(), case, &params, &x, seed)?;
        for k in 0..params.len() {
            let what = format!("{} seed {seed} parameter {k}", case.name);
            assert!(low[k].iter().all(|g| g.is_finite()), "{what}: the f16 gradient is not finite");
            let (e_low, e_full) = (relative(&low[k], &numeric[k]), relative(&full[k], &numeric[k]));
            assert!(e_low <= f16_bound, "{what}: f16 gradient off by {e_low:.2e} of its largest entry");
            assert!(e_full <= 1e-4, "{what}: f32 gradient off by {e_full:.2e}");
            assert!(
                relative(&low[k], &full[k]) > 4.0 * e_full,
                "{what}: the f16 gradient is as close as f32's ({e_full:.2e}): it did not run in f16"
            );
        }
    }
    Ok(())
}

/// Issue 33, defect 9: attention's f16 backward computed `q kᵀ` in f16
/// before scaling; with head dim 64 and entries of 32 that is 65536,
/// inf in f16, and every gradient was NaN (the forward, accumulating in
/// f32, was fine). Here every score is equal (8192 after the scale), so
/// the probabilities are exactly uniform and the f16 gradients must
/// equal the f32 ones within f16's rounding.
#[test]
fn f16_attention_gradients_with_head_dim_64_and_entries_of_32_are_finite() -> Result<()> {
    let run = |ctx: Context| -> Result<Vec<Vec<f64>>> {
        let qk = ctx.variable("qk", ctx.full([1, 2, 8, 64], 32.0f32))?;
        let v = ctx.variable(
            "v",
            ctx.tensor(&(0..1024).map(|i| (i % 7) as f32 / 7.0).collect::<Vec<_>>(), [1, 2, 8, 64]),
        )?;
        let y = ctx.tensor(&(0..1024).map(|i| (i % 5) as f32 / 5.0).collect::<Vec<_>>(), [1, 2, 8, 64]);
        let a = qk.scaled_dot_product_attention(&qk, &v, None, false, None);
        let grads = kiln::nn::mse(&a, &y)?.backward()?;
        [&qk, &v]
            .iter()
            .map(|p| {
                Ok(grads.get(p).expect("a gradient").to_vec::<f32>()?.into_iter().map(f64::from).collect())
            })
            .collect()
    };
    let low = run(Context::cpu().with_autocast(DType::F16))?;
    let full = run(Context::cpu())?;
    // q and k's gradient is 0 up to rounding (uniform probabilities):
    // errors are measured against the largest gradient entry of either.
    let scale = full.iter().flatten().fold(0.0f64, |m, g| m.max(g.abs()));
    for (name, (l, f)) in ["q and k", "v"].iter().zip(low.iter().zip(&full)) {
        assert!(l.iter().all(|g| g.is_finite()), "the f16 gradient of {name} is not finite: {:?}", &l[..4]);
        let err = l.iter().zip(f).fold(0.0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
        assert!(
            err <= 2f64.powi(-7),
            "the f16 gradient of {name} is off by {err:.2e} of the largest f32 entry"
        );
    }
    Ok(())
}
