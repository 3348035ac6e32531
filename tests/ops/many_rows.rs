//! Row kernels over thousands of rows, in each of the CUDA backend's three
//! group shapes (`codegen/reduction.rs`): a block a row (768 columns), a
//! warp a row (64) and a thread a row (16; not fewer: bf16 rows of 4
//! random values are too often nearly constant for a layer norm's
//! tolerance), with row counts that no block count divides. NaN and `+inf`
//! are planted in single rows, so a row that borrowed another's columns
//! (a wrong row base, a group reading past its row) fails against f64, and
//! so does a non-finite value that leaks out of its row.

use crate::reference::*;
use kiln::prelude::*;

/// `[rows, cols]`: a block a row, a warp a row, a thread a row.
const SHAPES: [[usize; 2]; 3] = [[1501, 768], [9001, 64], [300_001, 16]];

/// Rows given a NaN and a `+inf` (PyTorch's rows turn NaN whole).
fn plant(x: &mut Nd<f64>, cols: usize) {
    let rows = x.shape[0];
    let mut v = x.to_vec();
    v[7 * cols + cols / 2] = f64::NAN;
    v[(rows - 2) * cols] = f64::INFINITY;
    *x = Nd::new(v, &x.shape);
}

fn softmax_rows(x: &Nd<f64>, n: usize) -> Nd<f64> {
    let rows: Vec<f64> = x
        .to_vec()
        .chunks(n)
        .flat_map(|v| {
            let m =
                v.iter().fold(
                    f64::NEG_INFINITY,
                    |m, &x| if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x) },
                );
            let s: f64 = v.iter().map(|x| (x - m).exp()).sum();
            v.iter().map(|x| (x - m).exp() / s).collect::<Vec<_>>()
        })
        .collect();
    Nd::new(rows, &x.shape)
}

#[test]
fn layer_norm_softmax_and_row_sums_of_many_rows_match_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(77);
        let eps = 1e-5;
        for dtype in [DType::BF16, DType::F32] {
            for [rows, cols] in SHAPES {
                let mut x = rand_f(&mut rng, dtype, &[rows, cols], 2.0);
                plant(&mut x, cols);
                let w = rand_f(&mut rng, dtype, &[cols], 1.0);
                let b = rand_f(&mut rng, dtype, &[cols], 1.0);
                let t = tensor_f(&ctx, dtype, &x);
                let want = layer_norm_ref(&x, &w.to_vec(), &b.to_vec(), eps);
                let got = t.layer_norm(&tensor_f(&ctx, dtype, &w), &tensor_f(&ctx, dtype, &b), eps);
                check_f(&got, dtype, &want, 8.0, &format!("layer_norm [{rows}, {cols}]"));
                let want = softmax_rows(&x, cols);
                check_f(&t.softmax(1), dtype, &want, 1.0, &format!("softmax [{rows}, {cols}]"));
                // A row sum beside its elementwise use: two outputs a row.
                let sums = x.reduce(&[1], true, |v| v.iter().sum::<f64>());
                let want = x.zip(&sums.expand(&[rows, cols]), |a, s| a * 0.5 - s);
                let got = &t * 0.5 - t.sum(&[1], true);
                check_f(&got, dtype, &want, cols as f64, &format!("x/2 - row sums [{rows}, {cols}]"));
            }
        }
    });
}
