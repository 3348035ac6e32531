//! A slice's zero-padded gradient, written by the row kernel that
//! computes it (`passes/multi_output/pad.rs`, `ir::Padded`): logits of a
//! head padded to aligned rows and narrowed to the vocabulary, under a
//! cross-entropy loss, as GPT-2's LM head is. The gradient of the padded
//! logits is checked against f64 and, bit for bit, against the plan
//! without the rewrite (`-multi-output`, which leaves the `cat`), on
//! every backend, for rows the row kernel keeps in registers and rows it
//! reads in chunks, with a NaN row (its padding stays 0).

use crate::nonfinite::{backends, expect, read, report, tensor, tol};
use crate::reference::{round, Rng};
use kiln::prelude::*;

/// The gradient of `cross_entropy(logits[:, ..vocab], targets)` with
/// respect to the `[rows, padded]` logits, and the optimized graph's text.
fn padded_gradient(
    ctx: &Context,
    logits: &[f64],
    targets: &[i64],
    shape: [usize; 3],
    dtype: DType,
) -> (Tensor, String) {
    let [rows, vocab, padded] = shape;
    let name = format!("logits{rows}x{padded}");
    let value = tensor(ctx, logits, &[rows, padded], dtype);
    let var = ctx.variable(&name, value.clone()).expect("a variable");
    // A later call with the same shape gets the same variable: new logits.
    var.assign(&value).expect("assign");
    let y = var.tensor().narrow(1, 0, vocab);
    let t = ctx.tensor(targets, [rows]);
    let loss = kiln::nn::cross_entropy(&y.cast(DType::F32), &t).expect("a loss");
    let grads = loss.backward().expect("backward");
    let g = grads.get(&var).expect("a gradient").clone();
    let text = ctx.explain(&[&g]).expect("explain");
    (g, text)
}

/// PyTorch's gradient in f64: `(softmax(row) - onehot) / rows` at the
/// vocabulary's columns (NaN across a row with a NaN), 0 at the padding.
fn reference(logits: &[f64], targets: &[i64], [rows, vocab, padded]: [usize; 3]) -> Vec<f64> {
    let mut out = vec![0.0; rows * padded];
    for r in 0..rows {
        let row = &logits[r * padded..r * padded + vocab];
        let m =
            row.iter()
                .fold(f64::NEG_INFINITY, |m, &x| if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x) });
        let sum: f64 = row.iter().map(|&x| (x - m).exp()).sum();
        for c in 0..vocab {
            let onehot = if c as i64 == targets[r] { 1.0 } else { 0.0 };
            out[r * padded + c] = ((row[c] - m).exp() / sum - onehot) / rows as f64;
        }
    }
    out
}

/// Whether the optimized graph has a fused body whose output is a `cat`
/// (an indented `cat` line: inside a body).
fn writes_padded_rows(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("    ") && l.contains(" = cat "))
}

#[test]
fn a_row_kernel_writes_the_padded_gradient_of_a_slice() {
    let mut failures = Vec::new();
    let mut rng = Rng::new(0x5eed_0035);
    // Rows in registers (37 of 40 columns), and rows read in chunks
    // (past 16384 columns), padded to a multiple of 8 as GPT-2's head.
    for shape in [[5, 37, 40], [3, 17_001, 17_008]] {
        let [rows, vocab, padded] = shape;
        for (name, make) in backends() {
            for dtype in [DType::F32, DType::BF16] {
                let mut logits: Vec<f64> =
                    (0..rows * padded).map(|_| round(dtype, rng.normal() * 2.0)).collect();
                logits[padded + 3] = f64::NAN;
                let targets: Vec<i64> = (0..rows).map(|_| rng.range(0, vocab as i64)).collect();
                let what = format!("{name} {dtype} {rows}x{vocab} padded to {padded}");
                let (g, text) = padded_gradient(&make(), &logits, &targets, shape, dtype);
                let (plain, plain_text) =
                    padded_gradient(&make().with_passes("-multi-output"), &logits, &targets, shape, dtype);
                if !writes_padded_rows(&text) || writes_padded_rows(&plain_text) {
                    failures.push(format!("{what}: the row kernel does not write the cat:\n{text}"));
                    continue;
                }
                let (got, want) = (read(&g), reference(&logits, &targets, shape));
                // Scaled by the rows: the gradient's entries are O(1 / rows).
                let scaled = |v: &[f64]| v.iter().map(|x| x * rows as f64).collect::<Vec<f64>>();
                failures.extend(expect(&what, &scaled(&got), &scaled(&want), 4.0 * tol(dtype)));
                let same_bits = got
                    .iter()
                    .zip(read(&plain))
                    .all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan());
                if !same_bits {
                    failures.push(format!("{what}: the padded row kernel's bits differ from the cat's"));
                }
            }
        }
    }
    report(&failures);
}

/// GPT-2's embedding for its LM head under autocast: the f32 weight cast
/// to bf16 (an elementwise kernel) and padded with zero rows (`cat` along
/// dim 0). The cast's kernel writes the rows and the zeros after them;
/// bit for bit the cat's values, on every backend, with a NaN and an
/// infinity among the weights.
#[test]
fn an_elementwise_kernel_writes_the_zero_rows_after_it() {
    let mut failures = Vec::new();
    let mut rng = Rng::new(0x5eed_0036);
    let (rows, width, pad) = (37, 24, 3);
    for (name, make) in backends() {
        for dtype in [DType::BF16, DType::F16] {
            let mut w: Vec<f64> = (0..rows * width).map(|_| rng.normal() * 2.0).collect();
            w[5] = f64::NAN;
            w[77] = f64::INFINITY;
            let what = format!("{name} {dtype} [{rows}, {width}] + {pad} zero rows");
            let padded = |ctx: &Context| {
                let x = tensor(ctx, &w, &[rows, width], DType::F32);
                let y = Tensor::cat(&[&x.cast(dtype), &ctx.zeros_dtype([pad, width], dtype)], 0);
                let text = ctx.explain(&[&y]).expect("explain");
                (read(&y), text)
            };
            let (got, text) = padded(&make());
            let (plain, plain_text) = padded(&make().with_passes("-multi-output"));
            if !writes_padded_rows(&text) || writes_padded_rows(&plain_text) {
                failures.push(format!("{what}: the cast's kernel does not write the cat:\n{text}"));
                continue;
            }
            let mut want: Vec<f64> = w.iter().map(|&v| round(dtype, round(DType::F32, v))).collect();
            want.extend(vec![0.0; pad * width]);
            failures.extend(expect(&what, &got, &want, 0.0));
            if !got.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()) {
                failures.push(format!("{what}: the padded kernel's bits differ from the cat's"));
            }
        }
    }
    report(&failures);
}

/// The padded kernel keeps buffers between runs (the CPU its unpadded
/// rows, a replayed plan its slots): two plans of different shapes,
/// interleaved over several runs with fresh logits each, every gradient
/// against f64.
#[test]
fn padded_gradients_stay_right_over_interleaved_runs() {
    let mut failures = Vec::new();
    let mut rng = Rng::new(0x5eed_0037);
    for (name, make) in backends() {
        let ctx = make();
        for run in 0..6 {
            let shape = if run % 2 == 0 { [5, 37, 40] } else { [4, 21, 24] };
            let [rows, vocab, padded] = shape;
            let logits: Vec<f64> =
                (0..rows * padded).map(|_| round(DType::F32, rng.normal() * 2.0)).collect();
            let targets: Vec<i64> = (0..rows).map(|_| rng.range(0, vocab as i64)).collect();
            // Gradients accumulate in the context's variables: each run's own.
            ctx.zero_grad();
            let (g, _) = padded_gradient(&ctx, &logits, &targets, shape, DType::F32);
            let scaled = |v: &[f64]| v.iter().map(|x| x * rows as f64).collect::<Vec<f64>>();
            let want = reference(&logits, &targets, shape);
            failures.extend(expect(
                &format!("{name} run {run}"),
                &scaled(&read(&g)),
                &scaled(&want),
                4.0 * tol(DType::F32),
            ));
        }
    }
    report(&failures);
}
