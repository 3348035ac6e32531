//! Gradcheck: every differentiable op's gradient against central finite
//! differences in f64, from one table. Each case builds a value from its
//! inputs; the loss is `sum(value * r)` with fixed random weights `r` (so
//! every entry of the vector-Jacobian product is checked, not just its
//! sum), the analytic gradient comes from `backward` with the inputs as
//! variables, and the numeric one perturbs each input element by `±h` and
//! reads the loss again. Tolerances are PyTorch's gradcheck defaults
//! (`atol = 1e-5`, `rtol = 1e-3`). Inputs are seeded random normals, moved
//! away from kinks where the case says so.

use kiln::prelude::*;

/// Which values an input takes.
#[derive(Clone, Copy)]
enum Dom {
    /// Standard normal.
    Any,
    /// `0.5 + |normal|` (log, sqrt, a pow base, a divisor).
    Positive,
    /// Normal with `|x| >= 0.2` (relu, abs, recip: away from the kink or pole).
    AwayFromZero,
}

struct Case {
    name: &'static str,
    inputs: &'static [(&'static [usize], Dom)],
    f: fn(&Context, &[Tensor]) -> Tensor,
}

const fn case(
    name: &'static str,
    inputs: &'static [(&'static [usize], Dom)],
    f: fn(&Context, &[Tensor]) -> Tensor,
) -> Case {
    Case { name, inputs, f }
}

use super::splitmix::Rng;
use Dom::{Any, AwayFromZero as Away, Positive as Pos};

const M34: &[usize] = &[3, 4];

static CASES: &[Case] = &[
    // Unary elementwise.
    case("neg", &[(M34, Any)], |_, x| -&x[0]),
    case("abs", &[(M34, Away)], |_, x| x[0].abs()),
    case("exp", &[(M34, Any)], |_, x| x[0].exp()),
    case("log", &[(M34, Pos)], |_, x| x[0].log()),
    case("sqrt", &[(M34, Pos)], |_, x| x[0].sqrt()),
    case("rsqrt", &[(M34, Pos)], |_, x| x[0].rsqrt()),
    case("recip", &[(M34, Away)], |_, x| x[0].recip()),
    case("sin", &[(M34, Any)], |_, x| x[0].sin()),
    case("cos", &[(M34, Any)], |_, x| x[0].cos()),
    case("tanh", &[(M34, Any)], |_, x| x[0].tanh()),
    case("sigmoid", &[(M34, Any)], |_, x| x[0].sigmoid()),
    case("relu", &[(M34, Away)], |_, x| x[0].relu()),
    case("gelu", &[(M34, Any)], |_, x| x[0].gelu()),
    case("gelu_tanh", &[(M34, Any)], |_, x| x[0].gelu_tanh()),
    case("silu", &[(M34, Any)], |_, x| x[0].silu()),
    // Binary elementwise, with broadcasting on either side and Rust scalars.
    case("add-broadcast-row", &[(M34, Any), (&[4], Any)], |_, x| &x[0] + &x[1]),
    case("sub-broadcast-both", &[(&[3, 1], Any), (&[1, 4], Any)], |_, x| &x[0] - &x[1]),
    case("mul-broadcast-middle", &[(&[2, 3, 4], Any), (&[3, 1], Any)], |_, x| &x[0] * &x[1]),
    case("div-broadcast", &[(M34, Any), (&[4], Away)], |_, x| &x[0] / &x[1]),
    case("pow", &[(M34, Pos), (M34, Any)], |_, x| x[0].pow(&x[1])),
    case("pow-scalar-exponent", &[(M34, Pos)], |_, x| x[0].pow(2.5)),
    case("maximum-broadcast", &[(M34, Any), (&[4], Any)], |_, x| x[0].maximum(&x[1])),
    case("minimum", &[(M34, Any), (M34, Any)], |_, x| x[0].minimum(&x[1])),
    case("scalar-both-sides", &[(M34, Any)], |_, x| 1.5 - &x[0] * 2.5),
    case("square-shares-an-operand", &[(M34, Any)], |_, x| &x[0] * &x[0]),
    // Select and cast.
    case("where-broadcast", &[(M34, Any), (&[4], Any)], |ctx, x| {
        let cond = ctx
            .tensor(&[true, false, false, true, true, true, false, false, true, false, true, false], [3, 4]);
        cond.where_cond(&x[0], &x[1])
    }),
    case("where-by-own-sign", &[(M34, Away)], |_, x| x[0].gt(0.0).where_cond(&x[0] * 3.0, x[0].exp())),
    case("cast-through-f32", &[(M34, Any)], |_, x| (x[0].cast(DType::F32) * 2.0).cast(DType::F64)),
    // Reductions.
    case("sum-dim-keepdim", &[(&[2, 3, 4], Any)], |_, x| x[0].sum(&[1], true)),
    case("sum-all", &[(M34, Any)], |_, x| x[0].sum_all()),
    case("mean-two-dims", &[(&[2, 3, 4], Any)], |_, x| x[0].mean(&[0, 2], false)),
    case("max-dim", &[(M34, Any)], |_, x| x[0].max(&[1], false)),
    case("min-dim-keepdim", &[(&[2, 3, 4], Any)], |_, x| x[0].min(&[0], true)),
    // Views.
    case("reshape", &[(M34, Any)], |_, x| x[0].reshape([2, 6]).exp()),
    case("permute", &[(&[2, 3, 4], Any)], |_, x| x[0].permute(&[2, 0, 1]).sin()),
    case("transpose-then-elementwise", &[(M34, Any), (&[4, 3], Any)], |_, x| &x[0].t() * &x[1]),
    case("broadcast-to", &[(&[3, 1], Any)], |_, x| x[0].broadcast_to([2, 3, 4]).sin()),
    case("slice-step", &[(&[3, 7], Any)], |_, x| x[0].slice(1, 1, 7, 2)),
    case("slice-step-past-end", &[(&[3, 8], Any)], |_, x| x[0].slice(1, 0, 8, 3)),
    case("narrow-and-squeeze", &[(&[4, 1, 3], Any)], |_, x| x[0].narrow(0, 1, 2).squeeze(1)),
    case("unsqueeze-flatten", &[(M34, Any)], |_, x| x[0].unsqueeze(1).flatten().cos()),
    case("cat", &[(&[2, 3], Any), (&[2, 2], Any)], |_, x| Tensor::cat(&[&x[0], &x[1]], 1)),
    case("stack", &[(&[3], Any), (&[3], Any), (&[3], Any)], |_, x| Tensor::stack(&[&x[0], &x[1], &x[2]], 1)),
    // Linear algebra.
    case("matmul", &[(M34, Any), (&[4, 5], Any)], |_, x| x[0].matmul(&x[1])),
    case("matmul-batched", &[(&[2, 3, 4], Any), (&[2, 4, 2], Any)], |_, x| x[0].matmul(&x[1])),
    case("matmul-broadcast-batch", &[(&[2, 3, 4], Any), (&[4, 5], Any)], |_, x| x[0].matmul(&x[1])),
    case("matmul-vector", &[(&[4], Any), (&[4, 3], Any)], |_, x| x[0].matmul(&x[1])),
    case("matmul-of-transposes", &[(&[4, 3], Any), (&[5, 4], Any)], |_, x| x[0].t().matmul(&x[1].t())),
    // Softmax family and layer norm (composites, through their primitives).
    case("softmax", &[(M34, Any)], |_, x| x[0].softmax(1)),
    case("log-softmax", &[(M34, Any)], |_, x| x[0].log_softmax(0)),
    case("layer-norm", &[(&[3, 5], Any), (&[5], Any), (&[5], Any)], |_, x| {
        x[0].layer_norm(&x[1], &x[2], 1e-5)
    }),
    // Convolution and pooling.
    case("conv2d-grouped-strided-padded", &[(&[2, 4, 6, 5], Any), (&[6, 2, 3, 2], Any)], |_, x| {
        x[0].conv2d(&x[1], 2, 1, 1, 2)
    }),
    case("conv2d-dilated", &[(&[1, 2, 7, 7], Any), (&[3, 2, 3, 3], Any)], |_, x| {
        x[0].conv2d(&x[1], 1, 0, 2, 1)
    }),
    case("conv2d-stride-leaves-rows", &[(&[1, 1, 6, 6], Any), (&[2, 1, 2, 2], Any)], |_, x| {
        x[0].conv2d(&x[1], 3, 0, 1, 1)
    }),
    // Padding wider than the window, strided: the input gradient's
    // correlation keeps at least one row of its own (autodiff trims the
    // padding's rows from it only as far as that allows).
    case("conv2d-padding-wider-than-window", &[(&[1, 2, 3, 4], Any), (&[2, 2, 2, 3], Any)], |_, x| {
        x[0].conv2d(&x[1], 3, 3, 1, 1)
    }),
    case("max-pool2d-padded", &[(&[1, 2, 5, 5], Any)], |_, x| x[0].max_pool2d(3, 2, 1)),
    case("max-pool2d-tiling", &[(&[2, 2, 4, 6], Any)], |_, x| x[0].max_pool2d(2, 2, 0)),
    case("max-pool2d-overlapping", &[(&[1, 2, 5, 4], Any)], |_, x| x[0].max_pool2d(3, 1, 1)),
    // Its gradient's own rule (a second derivative through a CNN): linear
    // in the gradient, flat in x (the product gives x a gradient to check).
    case("max-pool2d-grad", &[(&[1, 2, 5, 5], Any), (&[1, 2, 3, 3], Any)], |_, x| {
        x[0].max_pool2d_grad(&x[1], 3, 2, 1) * &x[0]
    }),
    case("avg-pool2d", &[(&[2, 1, 4, 4], Any)], |_, x| x[0].avg_pool2d(2, 2, 0)),
    case("avg-pool2d-padded", &[(&[1, 2, 5, 4], Any)], |_, x| x[0].avg_pool2d(3, 1, 1)),
    // Indexing.
    case("gather-smaller-index", &[(M34, Any)], |ctx, x| {
        x[0].gather(1, &ctx.tensor(&[3i64, 0, 1, 1], [2, 2]))
    }),
    case("gather-dim0", &[(M34, Any)], |ctx, x| {
        x[0].gather(0, &ctx.tensor(&[2i32, 0, 1, 2, 0, 0, 1, 1], [2, 4]))
    }),
    // One position per row (a cross-entropy's target): the one-hot rule
    // in x's own shape.
    case("gather-one-per-row", &[(M34, Any)], |ctx, x| x[0].gather(1, &ctx.tensor(&[2i64, 0, 3], [3, 1]))),
    case("gather-one-per-column", &[(M34, Any)], |ctx, x| {
        x[0].gather(0, &ctx.tensor(&[2i32, 0, 1, 2], [1, 4]))
    }),
    case("index-select-repeats", &[(&[4, 3], Any)], |ctx, x| {
        x[0].index_select(0, &ctx.tensor(&[3i64, 1, 3], [3]))
    }),
    case("index-select-middle", &[(&[2, 4, 3], Any)], |ctx, x| {
        x[0].index_select(1, &ctx.tensor(&[0i64, 2], [2]))
    }),
    case("index-add", &[(&[4, 3], Any), (&[5, 3], Any)], |ctx, x| {
        x[0].index_add(0, &ctx.tensor(&[3i64, 1, 3, 0, 3], [5]), &x[1])
    }),
    case("write-at-middle", &[(&[2, 5, 3], Any), (&[2, 2, 3], Any)], |ctx, x| {
        x[0].write_at(1, ctx.scalar(2i64), &x[1]).exp()
    }),
    case("write-at-clamped-offset", &[(&[4, 3], Any), (&[3, 3], Any)], |ctx, x| {
        x[0].write_at(0, ctx.scalar(7i32), &x[1]).tanh()
    }),
    case("index-select-negative-dim", &[(&[2, 4], Any)], |ctx, x| {
        x[0].index_select(-1, &ctx.tensor(&[1i64, 1, 3], [3]))
    }),
    // Masks and splits.
    case("tril", &[(&[2, 3, 4], Any)], |_, x| x[0].tril(1).exp()),
    case("triu-below", &[(&[3, 3], Any)], |_, x| x[0].triu(-1)),
    case("chunk", &[(&[2, 6], Any)], |_, x| {
        let parts = x[0].chunk(3, -1).unwrap_or_default();
        &parts[0] * &parts[2] - &parts[1]
    }),
    case("split-sizes", &[(&[5, 2], Any)], |_, x| {
        let parts = x[0].split_sizes(&[2, 3], 0).unwrap_or_default();
        parts[1].sum(&[0], true) * &parts[0]
    }),
    // Attention: queries, keys and values (and an additive mask) at once.
    case("attention", &[(&[1, 2, 3, 4], Any), (&[1, 2, 5, 4], Any), (&[1, 2, 5, 3], Any)], |_, x| {
        x[0].scaled_dot_product_attention(&x[1], &x[2], None, false, None)
    }),
    case("attention-causal", &[(&[2, 1, 4, 3], Any), (&[2, 1, 4, 3], Any), (&[2, 1, 4, 2], Any)], |_, x| {
        x[0].scaled_dot_product_attention(&x[1], &x[2], None, true, Some(0.7))
    }),
    case(
        "attention-additive-mask",
        &[(&[1, 2, 3, 4], Any), (&[1, 2, 5, 4], Any), (&[1, 2, 5, 4], Any), (&[1, 1, 3, 5], Any)],
        |_, x| x[0].scaled_dot_product_attention(&x[1], &x[2], Some(&x[3]), false, None),
    ),
    case(
        "attention-key-padding",
        &[(&[2, 2, 3, 4], Any), (&[2, 2, 5, 4], Any), (&[2, 2, 5, 4], Any)],
        |ctx, x| {
            // The second batch row keeps no key: its output and gradients are zero.
            let keep = ctx.tensor(&[1i64, 1, 0, 1, 0, 0, 0, 0, 0, 0], [2, 5]);
            let mask = kiln::attention::key_padding_mask(&keep);
            x[0].scaled_dot_product_attention(&x[1], &x[2], Some(&mask), true, None)
        },
    ),
    // A small network: everything at once.
    case("mlp", &[(&[4, 3], Any), (&[3, 5], Any), (&[5], Any), (&[5, 2], Any)], |_, x| {
        let h = (x[0].matmul(&x[1]) + &x[2]).gelu();
        h.matmul(&x[3]).log_softmax(1)
    }),
];

/// The draws only this file needs.
impl Rng {
    fn value(&mut self, dom: Dom) -> f64 {
        let x = self.normal();
        match dom {
            Dom::Any => x,
            Dom::Positive => 0.5 + x.abs(),
            Dom::AwayFromZero => x.signum() * (0.2 + x.abs()),
        }
    }
}

fn loss_of(ctx: &Context, c: &Case, inputs: &[Tensor], weights: &[f64]) -> Tensor {
    let y = (c.f)(ctx, inputs);
    let r = ctx.tensor(weights, y.shape().to_vec());
    (y * r).sum_all()
}

/// The loss at the given input data, read as f64.
fn eval(ctx: &Context, c: &Case, data: &[Vec<f64>], weights: &[f64]) -> f64 {
    let inputs: Vec<Tensor> =
        data.iter().zip(c.inputs).map(|(d, (shape, _))| ctx.tensor(d, shape.to_vec())).collect();
    loss_of(ctx, c, &inputs, weights).item::<f64>().unwrap_or_else(|e| panic!("{}: {e}", c.name))
}

/// One case; returns a description of the first mismatch.
fn check(c: &Case, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let data: Vec<Vec<f64>> = c
        .inputs
        .iter()
        .map(|(shape, dom)| (0..shape.iter().product::<usize>()).map(|_| rng.value(*dom)).collect())
        .collect();
    let ctx = Context::cpu();
    // Analytic: the inputs are variables.
    let vars: Vec<Variable> = data
        .iter()
        .zip(c.inputs)
        .enumerate()
        .map(|(i, (d, (shape, _)))| ctx.variable(&format!("x{i}"), ctx.tensor(d, shape.to_vec())))
        .collect::<Result<_>>()
        .map_err(|e| e.to_string())?;
    let tensors: Vec<Tensor> = vars.iter().map(|v| v.tensor()).collect();
    let out_len = (c.f)(&ctx, &tensors).numel();
    let weights: Vec<f64> = (0..out_len).map(|_| rng.normal()).collect();
    let loss = loss_of(&ctx, c, &tensors, &weights);
    let grads = loss.backward().map_err(|e| e.to_string())?;
    let analytic: Vec<Vec<f64>> = vars
        .iter()
        .map(|v| match grads.get(v) {
            Some(g) => g.to_vec::<f64>().map_err(|e| e.to_string()),
            None => Err(format!("no gradient for {}", v.name())),
        })
        .collect::<Result<_, _>>()?;
    ctx.zero_grad();
    // Numeric: central differences.
    let h = 1e-6;
    let (atol, rtol) = if c.name == "cast-through-f32" { (2e-3, 2e-3) } else { (1e-5, 1e-3) };
    let h = if c.name == "cast-through-f32" { 1e-2 } else { h };
    let mut probe = data.clone();
    for (i, input) in data.iter().enumerate() {
        for j in 0..input.len() {
            probe[i][j] = input[j] + h;
            let up = eval(&ctx, c, &probe, &weights);
            probe[i][j] = input[j] - h;
            let down = eval(&ctx, c, &probe, &weights);
            probe[i][j] = input[j];
            let numeric = (up - down) / (2.0 * h);
            let got = analytic[i][j];
            if (got - numeric).abs() > atol + rtol * numeric.abs() {
                return Err(format!(
                    "input {i} element {j}: backward gives {got}, finite differences {numeric}"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn every_rule_matches_finite_differences() {
    let mut failures = Vec::new();
    for (k, c) in CASES.iter().enumerate() {
        if let Err(e) = check(c, 0x5eed_0000 + k as u64) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(failures.is_empty(), "gradcheck failures:\n{}", failures.join("\n"));
}

#[test]
fn the_table_covers_every_differentiable_op() {
    let names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    for op in [
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "recip",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "relu",
        "gelu",
        "silu",
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "maximum",
        "minimum",
        "where",
        "cast",
        "sum",
        "mean",
        "max",
        "min",
        "reshape",
        "permute",
        "broadcast",
        "slice",
        "narrow",
        "cat",
        "stack",
        "matmul",
        "softmax",
        "log-softmax",
        "layer-norm",
        "conv2d",
        "max-pool2d",
        "max-pool2d-grad",
        "avg-pool2d",
        "gather",
        "index-select",
        "index-add",
        "tril",
        "triu",
        "chunk",
        "split",
        "attention",
    ] {
        assert!(names.iter().any(|n| n.starts_with(op)), "no gradcheck case for {op}");
    }
}

/// `gelu'(x) = Φ(x) + x φ(x)`; at and near 0 the rule must not divide by
/// zero (its `gelu(x) / x` reading of Φ switches to 1/2 there).
#[test]
fn gelu_gradient_at_zero_and_tiny_values() -> Result<()> {
    let ctx = Context::cpu();
    for dtype in [DType::F64, DType::F32] {
        let x =
            ctx.variable(&format!("x{dtype}"), ctx.tensor(&[0.0f64, 1e-300, -1e-30, 1e-8], [4]).cast(dtype))?;
        let g = x.gelu().sum_all().backward()?;
        let got = g.get(&x).unwrap().cast(DType::F64).to_vec::<f64>()?;
        for (v, want) in got.iter().zip([0.5, 0.5, 0.5, 0.5 + 2.0 * 1e-8 * 0.3989422804014327]) {
            assert!((v - want).abs() < 1e-7, "{dtype}: {got:?}");
        }
    }
    Ok(())
}

/// The harness itself: a value whose backward pass is wrong on purpose (a
/// detached factor halves the gradient of `x²`) must fail the check.
#[test]
fn gradcheck_catches_a_wrong_gradient() {
    let wrong = case("square-with-a-detached-factor", &[(M34, Any)], |_, x| &x[0] * &x[0].detach());
    let err = check(&wrong, 7).expect_err("a wrong gradient passed");
    assert!(err.starts_with("input 0 element 0: backward gives"), "{err}");
}
