//! Products that read one left operand, merged into one GEMM by the
//! `merge-matmuls` pass (on CUDA and its emulator; a CPU context keeps
//! them apart): an encoder's q, k and v projections become one product
//! over the three weights side by side plus the three biases, and q, k
//! and v are column slices of it that the attention reads through
//! strides. Checked against f64 on every backend, forward and backward,
//! and over many steps of two interleaved plans while the weights are
//! updated in place between them (the weights' copy must read each
//! step's weights).

use crate::reference::*;
use crate::transformer::attention_ref;
use kiln::prelude::*;

/// `x [rows, k] · wᵀ + b` (`w` is `[n, k]`), in f64.
fn linear_ref(x: &Nd<f64>, w: &Nd<f64>, b: &Nd<f64>) -> Nd<f64> {
    let p = matmul_ref(x, &w.transpose(0, 1).contiguous(), 0.0, |s, a, b| s + a * b);
    Nd::from_fn(&p.shape.clone(), |i| p.get(i) + b.get(&[i[1]]))
}

/// `[b · s, h · d]` rows as `[b, h, s, d]` heads.
fn heads(x: &Nd<f64>, b: usize, s: usize, h: usize) -> Nd<f64> {
    let d = x.shape[1] / h;
    x.reshape(&[b, s, h, d]).permute(&[0, 2, 1, 3]).contiguous()
}

/// Variables `{prefix}0, {prefix}1, ..` holding `values` in `dtype`.
fn variables(ctx: &Context, prefix: &str, dtype: DType, values: &[Nd<f64>]) -> Vec<Variable> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| ctx.variable(&format!("{prefix}{i}"), tensor_f(ctx, dtype, v)).expect("variable"))
        .collect()
}

/// Whether this backend's plans merge products of `dtype`
/// (`PassOptions::merge_matmuls`; 16-bit products only).
fn merges(ctx: &Context, dtype: DType) -> bool {
    ctx.device() != "cpu" && matches!(dtype, DType::F16 | DType::BF16)
}

/// The plan's product nodes: a merged q, k, v is one, with the weights
/// and the biases joined by `cat`s.
fn products(plan: &str) -> usize {
    plan.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter(|l| l.contains("= matmul ") || l.contains("kind=matmul"))
        .count()
}

/// A layer's three projections of `x [b, s, w]` (weights `[w, w]`,
/// biases `[w]`), the attention over them with a key-padding mask, and
/// two more products of `x` without a bias (widths 8 and 12: a second
/// set): every value against f64, in f32, bf16 and f16.
#[test]
fn an_encoders_projections_match_f64() {
    each_backend(|| {
        let mut rng = Rng::new(3301);
        let (b, s, w, h) = (4, 64, 64, 2);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let ctx = dev();
            let x = rand_f(&mut rng, dtype, &[b * s, w], 1.0);
            let ws: Vec<Nd<f64>> = (0..3).map(|_| rand_f(&mut rng, dtype, &[w, w], 0.125)).collect();
            let bs: Vec<Nd<f64>> = (0..3).map(|_| rand_f(&mut rng, dtype, &[w], 0.5)).collect();
            let gates: Vec<Nd<f64>> =
                [8, 12].iter().map(|&n| rand_f(&mut rng, dtype, &[w, n], 0.125)).collect();
            let keep = Nd::from_fn(&[b, s], |i| (i[0] != 1 || i[1] % 4 != 3) as i64);

            let tx = tensor_f(&ctx, dtype, &x).reshape([b, s, w]);
            let projections: Vec<Tensor> = ws
                .iter()
                .zip(&bs)
                .map(|(wi, bi)| tx.matmul(&tensor_f(&ctx, dtype, wi).t()) + tensor_f(&ctx, dtype, bi))
                .collect();
            let split = |t: &Tensor| t.reshape([b, s, h, w / h]).permute(&[0, 2, 1, 3]);
            let mask = tensor_i(&ctx, DType::I64, &keep);
            let keep_mask = kiln::attention::key_padding_mask(&mask);
            let o = split(&projections[0]).scaled_dot_product_attention(
                &split(&projections[1]),
                &split(&projections[2]),
                Some(&keep_mask),
                false,
                None,
            );
            let flat = tx.reshape([b * s, w]);
            let gated: Vec<Tensor> = gates.iter().map(|g| flat.matmul(&tensor_f(&ctx, dtype, g))).collect();

            let mut all: Vec<&Tensor> = projections.iter().collect();
            all.push(&o);
            all.extend(&gated);
            let plan = ctx.explain(&all).expect("explain");
            let what = format!("{dtype} on {}", ctx.device());
            if merges(&ctx, dtype) {
                assert_eq!(
                    products(&plan),
                    2,
                    "{what}: q, k, v and the two gates merge into two products:\n{plan}"
                );
            } else {
                assert_eq!(products(&plan), 5, "{what}: the products stay apart:\n{plan}");
            }
            ctx.realize(&all).expect("realize");

            let want: Vec<Nd<f64>> = ws.iter().zip(&bs).map(|(wi, bi)| linear_ref(&x, wi, bi)).collect();
            for (name, (got, want)) in ["q", "k", "v"].iter().zip(projections.iter().zip(&want)) {
                check_f(got, dtype, &want.reshape(&[b, s, w]), 4.0, &format!("{what}: {name}"));
            }
            // The attention of the projections as the device rounded them.
            let rounded: Vec<Nd<f64>> =
                want.iter().map(|p| Nd::from_fn(&p.shape.clone(), |i| round(dtype, p.get(i)))).collect();
            let keep4 = keep.reshape(&[b, 1, 1, s]);
            let (q, k, v) =
                (heads(&rounded[0], b, s, h), heads(&rounded[1], b, s, h), heads(&rounded[2], b, s, h));
            let scale = 1.0 / ((w / h) as f64).sqrt();
            check_f(
                &o,
                dtype,
                &attention_ref(&q, &k, &v, Some(&keep4), None, false, scale),
                8.0,
                &format!("{what}: attention"),
            );
            for (i, (got, g)) in gated.iter().zip(&gates).enumerate() {
                let want = matmul_ref(&x, g, 0.0, |s, a, b| s + a * b);
                check_f(got, dtype, &want, 4.0, &format!("{what}: product {i} without a bias"));
            }
        }
    });
}

/// The gradients of `Σ q⊙Gq + Σ k⊙Gk + Σ v⊙Gv` with respect to `x`, the
/// weights and the biases, where the forward's products are merged:
/// `dWᵢ = Gᵢᵀ x`, `dbᵢ = Σ_rows Gᵢ`, `dx = Σᵢ Gᵢ Wᵢ`, in f64.
#[test]
fn gradients_through_merged_projections_match_f64() {
    each_backend(|| {
        let mut rng = Rng::new(3307);
        let (rows, w) = (96, 16);
        // 12 is no multiple of 8: the weights and the biases join in two
        // copies (the other tests take the one joined copy).
        let widths = [16, 16, 12];
        for dtype in [DType::F32, DType::BF16] {
            let ctx = dev();
            let x = rand_f(&mut rng, dtype, &[rows, w], 1.0);
            let ws: Vec<Nd<f64>> = widths.iter().map(|&n| rand_f(&mut rng, dtype, &[n, w], 0.25)).collect();
            let bs: Vec<Nd<f64>> = widths.iter().map(|&n| rand_f(&mut rng, dtype, &[n], 0.5)).collect();
            let gs: Vec<Nd<f64>> = widths.iter().map(|&n| rand_f(&mut rng, dtype, &[rows, n], 1.0)).collect();
            let vx = ctx.variable("x", tensor_f(&ctx, dtype, &x)).expect("variable");
            let vw = variables(&ctx, "w", dtype, &ws);
            let vb = variables(&ctx, "b", dtype, &bs);
            let mut loss: Option<Tensor> = None;
            for i in 0..3 {
                let p = vx.tensor().matmul(&vw[i].tensor().t()) + vb[i].tensor();
                let term = (&p * &tensor_f(&ctx, dtype, &gs[i])).cast(DType::F32).sum_all();
                loss = Some(match loss {
                    Some(l) => l + term,
                    None => term,
                });
            }
            let loss = loss.expect("three terms");
            let grads = loss.backward().expect("backward");
            let mut got: Vec<Tensor> = vec![grads.get(&vx).expect("dx").clone()];
            got.extend(vw.iter().map(|v| grads.get(v).expect("dw").clone()));
            got.extend(vb.iter().map(|v| grads.get(v).expect("db").clone()));
            let step: Vec<&Tensor> = std::iter::once(&loss).chain(&got).collect();
            let plan = ctx.explain(&step).expect("explain");
            let what = format!("{dtype} on {}", ctx.device());
            assert_eq!(
                plan.contains("cat "),
                merges(&ctx, dtype),
                "{what}: the forward's weights joined or not:\n{plan}"
            );
            ctx.realize(&step).expect("realize");

            let mm = |a: &Nd<f64>, b: &Nd<f64>| matmul_ref(a, b, 0.0, |s, x, y| s + x * y);
            // The loss reads the merged forward's values (its gradients do
            // not); in f32, where the bias's rounding does not blur it (the
            // first test checks the bf16 values).
            let (mut want_loss, mut magnitude) = (0.0, 0.0);
            for i in 0..3 {
                let p = linear_ref(&x, &ws[i], &bs[i]);
                for (pv, gv) in p.to_vec().into_iter().zip(gs[i].to_vec()) {
                    let term = round(dtype, round(dtype, pv) * gv);
                    want_loss += term;
                    magnitude += term.abs();
                }
            }
            if dtype == DType::F32 {
                check_f(
                    &loss,
                    DType::F32,
                    &Nd::new(vec![want_loss], &[]),
                    magnitude,
                    &format!("{what}: loss"),
                );
            }
            let mut dx = Nd::from_fn(&[rows, w], |_| 0.0);
            for (g, wi) in gs.iter().zip(&ws) {
                let part = mm(g, wi);
                dx = Nd::from_fn(&[rows, w], |i| dx.get(i) + part.get(i));
            }
            let k_scale = if dtype == DType::F32 { 4.0 } else { 8.0 };
            check_f(&got[0], dtype, &dx, k_scale, &format!("{what}: dx"));
            for i in 0..3 {
                let dw = mm(&gs[i].transpose(0, 1).contiguous(), &x);
                check_f(&got[1 + i], dtype, &dw, k_scale, &format!("{what}: dw{i}"));
                let db = Nd::from_fn(&[widths[i]], |c| (0..rows).map(|r| gs[i].get(&[r, c[0]])).sum());
                check_f(&got[4 + i], dtype, &db, k_scale, &format!("{what}: db{i}"));
            }
        }
    });
}

/// Two plans interleaved over many steps: a training step (the merged
/// bf16 forward of f32 weights and biases, as mixed precision runs it, its
/// gradients, and the f32 weights and biases updated in place by `w -= lr
/// · dw`, with a learning rate that changes between steps) and an
/// inference forward of another input. Every inference output is the f64
/// model's under that step's weights: the weights' copy must read the
/// weights as each step left them, never a copy kept from an earlier run
/// nor bytes the update has already overwritten.
#[test]
fn merged_projections_read_each_steps_weights() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3313);
        let (rows, w, n) = (64, 8, 8);
        let (low, f32) = (DType::BF16, DType::F32);
        let mut model_w: Vec<Nd<f64>> = (0..3).map(|_| rand_f(&mut rng, f32, &[n, w], 0.5)).collect();
        let mut model_b: Vec<Nd<f64>> = (0..3).map(|_| rand_f(&mut rng, f32, &[n], 0.5)).collect();
        let vw = variables(&ctx, "w", f32, &model_w);
        let vb = variables(&ctx, "b", f32, &model_b);
        let forward = |x: &Tensor| -> Vec<Tensor> {
            (0..3).map(|i| x.matmul(&vw[i].tensor().cast(low).t()) + vb[i].tensor().cast(low)).collect()
        };
        let rounded = |m: &Nd<f64>| Nd::from_fn(&m.shape.clone(), |j| round(low, m.get(j)));
        for step in 0..12 {
            // Training: loss = Σᵢ Σ pᵢ ⊙ Gᵢ, so dWᵢ = Gᵢᵀ x and dbᵢ = Σ_rows
            // Gᵢ, each rounded to bf16 (the products' type) before the f32
            // update.
            let x = rand_f(&mut rng, low, &[rows, w], 1.0);
            let gs: Vec<Nd<f64>> = (0..3).map(|_| rand_f(&mut rng, low, &[rows, n], 1.0)).collect();
            let lr = 0.01 * (1 + step % 4) as f64;
            let ps = forward(&tensor_f(&ctx, low, &x));
            let loss = ps
                .iter()
                .zip(&gs)
                .map(|(p, g)| (p * &tensor_f(&ctx, low, g)).cast(f32).sum_all())
                .reduce(|a, b| a + b)
                .expect("three terms");
            let grads = loss.backward().expect("backward");
            for i in 0..3 {
                let dw = grads.get(&vw[i]).expect("dw").clone();
                let db = grads.get(&vb[i]).expect("db").clone();
                vw[i].assign(&*vw[i] - dw * lr).expect("assign w");
                vb[i].assign(&*vb[i] - db * lr).expect("assign b");
            }
            ctx.zero_grad();
            loss.realize().expect("the training step");
            for i in 0..3 {
                let dw = matmul_ref(&gs[i].transpose(0, 1).contiguous(), &x, 0.0, |s, a, b| s + a * b);
                model_w[i] =
                    Nd::from_fn(&[n, w], |j| round(f32, model_w[i].get(j) - lr * round(low, dw.get(j))));
                let db = |c: usize| round(low, (0..rows).map(|r| gs[i].get(&[r, c])).sum::<f64>());
                model_b[i] = Nd::from_fn(&[n], |c| round(f32, model_b[i].get(c) - lr * db(c[0])));
            }
            // Inference under the weights the step left.
            let x2 = rand_f(&mut rng, low, &[rows, w], 1.0);
            let outs = forward(&tensor_f(&ctx, low, &x2));
            let refs: Vec<&Tensor> = outs.iter().collect();
            if step == 0 {
                let plan = ctx.explain(&refs).expect("explain");
                assert_eq!(
                    plan.contains("cat "),
                    merges(&ctx, low),
                    "the inference plan merged or not:\n{plan}"
                );
            }
            ctx.realize(&refs).expect("inference");
            for i in 0..3 {
                let want = linear_ref(&x2, &rounded(&model_w[i]), &rounded(&model_b[i]));
                check_f(
                    &outs[i],
                    low,
                    &want,
                    8.0,
                    &format!("step {step}, projection {i} on {}", ctx.device()),
                );
            }
        }
    });
}
