//! Gradients under autocast against central finite differences of the
//! same loss in f64. A bf16 gradient is not an f32 one: every product
//! rounds its inputs to 8 bits of mantissa and its result once more, so
//! the bound is a few units of bf16's rounding (2^-8 relative) of the
//! largest gradient entry; f32's gradient of the same loss must sit far
//! inside it (so the bound is not loose enough to pass anything), and
//! must differ from the bf16 one (so the products did run in bf16).
//! Fresh seeded inputs per case: a two-layer MLP with biases and tanh
//! under cross-entropy, and a conv -> relu -> linear net under MSE.

use kiln::prelude::*;

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn normal(&mut self) -> f64 {
        let u = 1.0 - (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
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
