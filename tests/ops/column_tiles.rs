//! The CUDA column kernel's tilings (`codegen/columns.rs`, `Tiling`): a
//! lane reads four adjacent columns in one vector load where the columns
//! and the value's offset are multiples of four, else one, and loads
//! several rows before it adds them (an unrolled loop, then the rows
//! left). Each case below takes one path, checked against f64 on every
//! backend, the emulator in every CI run included (on the CPU they check
//! the CPU's own column sums).
//!
//! - wide `[163, 33800]`: more column tiles than the rows are split for,
//!   one block a tile, its 8 warps each unrolled with rows left over;
//! - tall `[300, 64]` in f32, f64, bf16 and i32: the rows split into
//!   chunks, each a different unroll (4, 2, 8, 4 rows) and width 4;
//! - `[300, 64]` read from offset 1 of a flat buffer: width 1 though the
//!   columns are a multiple of four.

use crate::nonfinite::backends;
use crate::reference::*;
use kiln::prelude::*;

/// `sum`, `mean` and `max` of `t` (host values `a`, `rows x cols`) over
/// dim 0, against f64.
fn check_columns(t: &Tensor, a: &Nd<f64>, dtype: DType, what: &str) {
    let rows = a.shape[0] as f64;
    let scale = rows.sqrt() * max_abs(a);
    let sum = a.reduce(&[0], false, |v| v.iter().sum::<f64>());
    let mean = a.reduce(&[0], false, |v| v.iter().sum::<f64>() / v.len() as f64);
    let max = a.reduce(&[0], false, |v| v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    check_f(&t.sum(&[0], false), dtype, &sum, scale, &format!("sum of {what}"));
    check_f(&t.mean(&[0], false), dtype, &mean, scale / rows, &format!("mean of {what}"));
    check_f(&t.max(&[0], false), dtype, &max, 0.0, &format!("max of {what}"));
}

#[test]
fn column_reductions_in_every_tiling() {
    for (backend, make) in backends() {
        let ctx = make();
        let mut rng = Rng::new(24);
        for (dtype, shape) in [
            (DType::F32, [163usize, 33800usize]),
            (DType::BF16, [163, 33800]),
            (DType::F32, [300, 64]),
            (DType::F64, [300, 64]),
            (DType::BF16, [300, 64]),
        ] {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &shape);
            check_columns(&t, h.f(), dtype, &format!("{dtype} {shape:?} on {backend}"));
        }
        let (t, h) = rand_tensor(&ctx, &mut rng, DType::I32, &[300, 64]);
        let Host::I(a) = &h else { unreachable!("an integer dtype") };
        let sum = a.reduce(&[0], false, |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
        check_i(&t.sum(&[0], false), DType::I32, &sum, &format!("sum of i32 [300, 64] on {backend}"));
        let max = a.reduce(&[0], false, |v| *v.iter().max().expect("rows"));
        check_i(&t.max(&[0], false), DType::I32, &max, &format!("max of i32 [300, 64] on {backend}"));
        // Offset 1: every row starts one element past a multiple of four.
        let (flat, h) = rand_tensor(&ctx, &mut rng, DType::F32, &[300 * 64 + 1]);
        let shifted = flat.narrow(0, 1, 300 * 64).reshape([300, 64]);
        let a = Nd::new(h.f().to_vec()[1..].to_vec(), &[300, 64]);
        check_columns(&shifted, &a, DType::F32, &format!("f32 [300, 64] at offset 1 on {backend}"));
    }
}
