//! Every module's forward pass against f64 math on its own parameters
//! (read back from the context), on fresh random inputs; PyTorch's
//! initializations; scopes and names; train/eval mode.

use crate::{close, host, F32_TOL};
use kiln::nn::*;
use kiln::prelude::*;

fn rand_input(ctx: &Context, shape: &[usize]) -> (Tensor, Vec<f64>) {
    let x = ctx.randn(shape.to_vec());
    x.realize().unwrap();
    let v = host(&x);
    (x, v)
}

/// `y[r, o] = Σ_i x[r, i] w[o, i] + b[o]`.
fn linear_ref(x: &[f64], w: &[f64], b: &[f64], n_in: usize, n_out: usize) -> Vec<f64> {
    let rows = x.len() / n_in;
    let mut y = vec![0.0; rows * n_out];
    for r in 0..rows {
        for o in 0..n_out {
            y[r * n_out + o] = b[o] + (0..n_in).map(|i| x[r * n_in + i] * w[o * n_in + i]).sum::<f64>();
        }
    }
    y
}

#[test]
fn linear_is_x_times_weight_transposed_plus_bias() -> Result<()> {
    let ctx = Context::cpu().with_seed(1);
    let fc = Linear::new(&ctx, "fc", 5, 3)?;
    assert_eq!(fc.weight.shape(), &[3, 5]);
    let (x, xv) = rand_input(&ctx, &[4, 5]);
    let y = fc.forward(&x)?;
    let bias = fc.bias.as_ref().unwrap();
    close(&host(&y), &linear_ref(&xv, &host(&fc.weight), &host(bias), 5, 3), F32_TOL.0, F32_TOL.1);
    // Leading batch dims are kept.
    let (x3, xv3) = rand_input(&ctx, &[2, 3, 5]);
    let y3 = fc.forward(&x3)?;
    assert_eq!(y3.shape(), &[2, 3, 3]);
    close(&host(&y3), &linear_ref(&xv3, &host(&fc.weight), &host(bias), 5, 3), F32_TOL.0, F32_TOL.1);
    let nb = Linear::without_bias(&ctx, "nb", 5, 2)?;
    assert_eq!(nb.parameters().len(), 1);
    close(&host(&nb.forward(&x)?), &linear_ref(&xv, &host(&nb.weight), &[0.0, 0.0], 5, 2), 1e-5, 1e-5);
    Ok(())
}

/// `U(-1/√fan_in, 1/√fan_in)`: inside the bound, spread like it
/// (variance bound²/3), mean near 0; and a second layer draws other numbers.
#[test]
fn initializations_are_pytorchs() -> Result<()> {
    let ctx = Context::cpu().with_seed(2);
    let fc = Linear::new(&ctx, "fc", 256, 128)?;
    let conv = Conv2d::new(&ctx, "conv", 8, 16, 3)?;
    for (w, fan_in) in [(host(&fc.weight), 256.0), (host(&conv.weight), 72.0)] {
        let bound = 1.0 / f64::sqrt(fan_in);
        assert!(w.iter().all(|v| v.abs() <= bound), "outside ±{bound}");
        let n = w.len() as f64;
        let mean = w.iter().sum::<f64>() / n;
        let var = w.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.05 * bound, "mean {mean}");
        assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.05, "variance {var}");
    }
    let other = Linear::new(&ctx, "other", 256, 128)?;
    assert_ne!(host(&other.weight), host(&fc.weight));
    let ln = LayerNorm::new(&ctx, "ln", 6)?;
    assert_eq!(host(&ln.weight), vec![1.0; 6]);
    assert_eq!(host(&ln.bias), vec![0.0; 6]);
    let emb = Embedding::new(&ctx, "emb", 100, 50)?;
    let e = host(&emb.weight);
    let var = e.iter().map(|v| v * v).sum::<f64>() / e.len() as f64;
    assert!((var - 1.0).abs() < 0.05, "N(0,1) variance {var}");
    Ok(())
}

/// Direct convolution with zero padding, `[n, c, h, w]` by `[o, c/g, k, k]`.
#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    o: usize,
    k: usize,
    stride: usize,
    pad: usize,
    b: &[f64],
) -> (Vec<f64>, [usize; 4]) {
    let [n, c, h, wd] = xs;
    let (oh, ow) = ((h + 2 * pad - k) / stride + 1, (wd + 2 * pad - k) / stride + 1);
    let mut y = vec![0.0; n * o * oh * ow];
    for ni in 0..n {
        for oi in 0..o {
            for r in 0..oh {
                for col in 0..ow {
                    let mut s = b[oi];
                    for ci in 0..c {
                        for i in 0..k {
                            for j in 0..k {
                                let (yy, xx) = (
                                    (r * stride + i) as isize - pad as isize,
                                    (col * stride + j) as isize - pad as isize,
                                );
                                if yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < wd {
                                    s += x[((ni * c + ci) * h + yy as usize) * wd + xx as usize]
                                        * w[((oi * c + ci) * k + i) * k + j];
                                }
                            }
                        }
                    }
                    y[((ni * o + oi) * oh + r) * ow + col] = s;
                }
            }
        }
    }
    (y, [n, o, oh, ow])
}

#[test]
fn conv2d_with_stride_and_padding_against_direct_convolution() -> Result<()> {
    let ctx = Context::cpu().with_seed(3);
    let opts = Conv2dOptions { stride: 2, padding: 1, ..Default::default() };
    let conv = Conv2d::with_options(&ctx, "conv", 3, 4, 3, opts)?;
    let (x, xv) = rand_input(&ctx, &[2, 3, 7, 6]);
    let y = conv.forward(&x)?;
    let (want, shape) =
        conv_ref(&xv, [2, 3, 7, 6], &host(&conv.weight), 4, 3, 2, 1, &host(conv.bias.as_ref().unwrap()));
    assert_eq!(y.shape(), &shape);
    close(&host(&y), &want, 1e-5, 1e-5);
    Ok(())
}

fn pool_ref(x: &[f64], xs: [usize; 4], k: usize, max: bool) -> Vec<f64> {
    let [n, c, h, w] = xs;
    let (oh, ow) = (h / k, w / k);
    let mut y = Vec::new();
    for plane in 0..n * c {
        for r in 0..oh {
            for col in 0..ow {
                let vals: Vec<f64> =
                    (0..k * k).map(|t| x[(plane * h + r * k + t / k) * w + col * k + t % k]).collect();
                y.push(if max {
                    vals.iter().cloned().fold(f64::MIN, f64::max)
                } else {
                    vals.iter().sum::<f64>() / (k * k) as f64
                });
            }
        }
    }
    y
}

#[test]
fn pooling_modules_against_window_loops() -> Result<()> {
    let ctx = Context::cpu().with_seed(4);
    let (x, xv) = rand_input(&ctx, &[2, 3, 6, 4]);
    let max = MaxPool2d::new(2).forward(&x)?;
    assert_eq!(max.shape(), &[2, 3, 3, 2]);
    close(&host(&max), &pool_ref(&xv, [2, 3, 6, 4], 2, true), 0.0, 0.0);
    let avg = AvgPool2d::new(2).forward(&x)?;
    close(&host(&avg), &pool_ref(&xv, [2, 3, 6, 4], 2, false), 1e-6, 1e-6);
    assert!(MaxPool2d::new(2).parameters().is_empty());
    Ok(())
}

/// erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), enough for f32.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    (1.0 - p * (-x * x).exp()).copysign(x)
}

/// A module and the f64 function it computes elementwise.
type Case<'a> = (&'a dyn Module, fn(f64) -> f64);

#[test]
fn activations_against_their_formulas() -> Result<()> {
    let ctx = Context::cpu().with_seed(5);
    let (x, xv) = rand_input(&ctx, &[3, 7]);
    let x = &(x * 3.0);
    let xv: Vec<f64> = xv.iter().map(|v| (*v as f32 * 3.0) as f64).collect();
    let cases: [Case; 4] = [
        (&ReLU, |v| v.max(0.0)),
        (&GELU, |v| v * 0.5 * (1.0 + erf(v / 2f64.sqrt()))),
        (&Tanh, f64::tanh),
        (&Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
    ];
    for (m, f) in cases {
        let want: Vec<f64> = xv.iter().map(|&v| f(v)).collect();
        close(&host(&m.forward(x)?), &want, 2e-6, 2e-6);
    }
    let (img, iv) = rand_input(&ctx, &[2, 3, 2, 2]);
    let flat = Flatten.forward(&img)?;
    assert_eq!(flat.shape(), &[2, 12]);
    assert_eq!(host(&flat), iv);
    Ok(())
}

#[test]
fn layer_norm_over_the_last_dim() -> Result<()> {
    let ctx = Context::cpu().with_seed(6);
    let ln = LayerNorm::new(&ctx, "ln", 5)?;
    // Non-trivial affine parameters, as after training.
    ln.weight.assign(ctx.randn([5]))?;
    ln.bias.assign(ctx.randn([5]))?;
    let (x, xv) = rand_input(&ctx, &[4, 5]);
    let (w, b) = (host(&ln.weight), host(&ln.bias));
    let mut want = Vec::new();
    for row in xv.chunks(5) {
        let mean = row.iter().sum::<f64>() / 5.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 5.0;
        want.extend(row.iter().enumerate().map(|(i, v)| (v - mean) / (var + 1e-5).sqrt() * w[i] + b[i]));
    }
    close(&host(&ln.forward(&x)?), &want, 1e-5, 1e-5);
    Ok(())
}

#[test]
fn embedding_looks_up_rows_for_ids_of_any_shape() -> Result<()> {
    let ctx = Context::cpu().with_seed(7);
    let emb = Embedding::new(&ctx, "emb", 6, 3)?;
    let table = host(&emb.weight);
    let ids = [4i64, 0, 5, 4];
    let y = emb.forward(&ctx.tensor(&ids, [2, 2]))?;
    assert_eq!(y.shape(), &[2, 2, 3]);
    let want: Vec<f64> =
        ids.iter().flat_map(|&i| table[i as usize * 3..i as usize * 3 + 3].to_vec()).collect();
    assert_eq!(host(&y), want);
    Ok(())
}

#[test]
fn dropout_drops_about_p_scales_the_rest_and_is_off_in_eval_mode() -> Result<()> {
    let ctx = Context::cpu().with_seed(8);
    let mut drop = Dropout::new(0.3)?;
    let x = ctx.rand([200, 100]) + 1.0; // never 0
    x.realize()?;
    let xv = host(&x);
    let a = host(&drop.forward(&x)?);
    let zeros = a.iter().filter(|v| **v == 0.0).count() as f64 / a.len() as f64;
    // 20,000 draws: the standard deviation of the fraction is 0.0032.
    assert!((zeros - 0.3).abs() < 0.015, "dropped {zeros}");
    for (y, x) in a.iter().zip(&xv) {
        assert!(*y == 0.0 || (y - x / 0.7).abs() < 1e-5 * x.abs(), "{y} vs {x}");
    }
    // A new mask every call, from the same compiled plan.
    let compiles = ctx.stats().compiles;
    let b = host(&drop.forward(&x)?);
    assert_ne!(a, b);
    assert_eq!(ctx.stats().compiles, compiles);
    drop.set_training(false);
    assert!(!drop.training());
    assert_eq!(host(&drop.forward(&x)?), xv);
    // p = 1 drops everything; p = 0 nothing.
    let mut all = Dropout::new(1.0)?;
    assert!(host(&all.forward(&x)?).iter().all(|v| *v == 0.0));
    all.set_training(false);
    assert_eq!(host(&all.forward(&x)?), xv);
    assert_eq!(host(&Dropout::new(0.0)?.forward(&x)?), xv);
    Ok(())
}

#[test]
fn sequential_names_its_children_and_chains_them() -> Result<()> {
    let ctx = Context::cpu().with_seed(9);
    let mut net = Sequential::new(&ctx, "net", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 4, 6)?.boxed(),
            Tanh.boxed(),
            Dropout::new(0.5)?.boxed(),
            Residual::new(Linear::new(ctx, "3", 6, 6)?).boxed(),
            Linear::new(ctx, "4", 6, 2)?.boxed(),
        ])
    })?;
    let names: Vec<String> = net.parameters().iter().map(|v| v.name()).collect();
    assert_eq!(
        names,
        ["net/0/weight", "net/0/bias", "net/3/weight", "net/3/bias", "net/4/weight", "net/4/bias"]
    );
    assert_eq!(net.num_parameters(), 4 * 6 + 6 + 36 + 6 + 12 + 2);
    net.set_training(false); // reaches the dropout inside
    let (x, xv) = rand_input(&ctx, &[3, 4]);
    let p: Vec<Vec<f64>> = net.parameters().iter().map(|v| host(v)).collect();
    let h: Vec<f64> = linear_ref(&xv, &p[0], &p[1], 4, 6).into_iter().map(f64::tanh).collect();
    let r = linear_ref(&h, &p[2], &p[3], 6, 6);
    let h: Vec<f64> = h.iter().zip(&r).map(|(a, b)| a + b).collect();
    close(&host(&net.forward(&x)?), &linear_ref(&h, &p[4], &p[5], 6, 2), 1e-5, 1e-5);
    // Forward nodes are recorded in the modules' regions.
    let y = net.forward(&x)?;
    let text = ctx.explain(&[&y])?;
    assert!(text.contains("@net/0") && text.contains("@net/4"), "{text}");
    // Built again, it finds the same variables.
    let again = Sequential::new(&ctx, "net", |ctx| Ok(vec![Linear::new(ctx, "0", 4, 6)?.boxed()]))?;
    assert!(again.parameters()[0].same(&net.parameters()[0]));
    Ok(())
}
