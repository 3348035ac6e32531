//! Regression tests: mismatches the differential run found, minimized to
//! the few ops that show them, each named after what broke.

use half::{bf16, f16};
use kiln::prelude::*;

/// Seed 74 of the f64 configuration. A bool computed in place of its
/// operand (here `c.maximum(&c)` on the result of a reduction, in the
/// arena) read `false` everywhere: the CPU backend cleared every bool
/// arena range before its kernel ran, the in-place operand included
/// (`backends/cpu/launch.rs`). The `where` broadcasts the bool, so the
/// elementwise op cannot fuse into it and runs on its own.
#[test]
fn bool_computed_in_place_keeps_its_operand() -> kiln::Result<()> {
    let ctx = Context::cpu();
    let x = ctx.tensor(&[-1.0f64, -1.1, -0.8, 0.2, 1.5], [5, 1]);
    let any = x.gt(1.0).max(&[0], false);
    for c in [any.maximum(&any), any.minimum(&any), any.eq(true), any.cast(DType::F32).gt(0.5)] {
        let t = ctx.tensor(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let f = ctx.tensor(&[-1.0f64; 12], [2, 2, 3]);
        let w = c.where_cond(&t, &f);
        let plan = ctx.explain(&[&w])?;
        assert!(plan.contains("!in-place="), "the case no longer computes in place:\n{plan}");
        assert_eq!(w.to_vec::<f64>()?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0].repeat(2), "plan:\n{plan}");
    }
    Ok(())
}

/// Seed 66 of the default configuration (shrunk by `KILN_DIFF_SHRINK`).
/// Constant folding forwards a `where` on a constant condition to its
/// taken branch, and DCE removes the other branch's input; when that was
/// the last input, the plan counted one input fewer than the context
/// binds, and the CPU backend refused the run ("the plan binds 1
/// input(s), 2 given"). Plans now bind every input of the extracted graph
/// (`Plan::binding`).
#[test]
fn an_input_folded_away_is_still_bound() -> kiln::Result<()> {
    let ctx = Context::cpu();
    let cond = ctx.full_dtype([1], true, DType::Bool);
    let t = ctx.tensor(&[-0.5f32], [1]);
    let f = ctx.tensor(&[0.25f32; 6], [2, 3, 1]);
    let w = cond.where_cond(&t, &f);
    assert_eq!(w.min(&[0, 2], true).to_vec::<f32>()?, vec![-0.5; 3]);
    // The other way round: the dropped input is not the last one.
    let cond = ctx.full_dtype([1], false, DType::Bool);
    let w = cond.where_cond(&f, &t);
    assert_eq!(w.min(&[0, 2], true).to_vec::<f32>()?, vec![-0.5; 3]);
    Ok(())
}

/// Seeds 7575 (default) and 9744 (f64) of the long run. The memory pass
/// may compute a fused node in place of an operand of another dtype of
/// the same size (here `cast` of an i64 argmax to f64); the CPU kernel
/// cannot, so that node falls back to an allocation of its own, and the
/// next node, planned in place of it, failed to compile ("%12 is placed
/// in place of %10, whose arena range differs"). It now writes the range
/// as its own (`backends/cpu/exec.rs`).
#[test]
fn in_place_of_a_node_that_could_not_be() -> kiln::Result<()> {
    // Without simplify, which makes the softmax over a dim of size 1 a
    // reshape (`sum-of-one`): the seed's plan chains its kernels in place.
    let ctx = Context::cpu().with_passes("-simplify");
    let x = ctx.tensor(&[3i32, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [3, 4]);
    let index = x.neg().argmax(0, true).cast(DType::F64);
    let y = index.softmax(0).sum_all();
    let plan = ctx.explain(&[&y])?;
    assert!(plan.matches("!in-place=").count() >= 2, "the case no longer chains in-place nodes:\n{plan}");
    assert_eq!(y.item::<f64>()?, 4.0, "plan:\n{plan}");
    Ok(())
}

// ------------------------------------------ found on CUDA (run everywhere)

/// Runs `case` on every device the differential tests use (the CPU, and
/// CUDA when there is one), naming the device in a failure.
fn on_every_device(case: impl Fn(&Context) -> kiln::Result<()>) {
    for &device in super::devices() {
        let ctx = device.context();
        if let Err(e) = case(&ctx) {
            panic!("on {device:?}: {e}");
        }
    }
}

/// Small whole numbers from a seed, so every product and sum below is
/// exact in every float type and results compare with `==`.
fn whole(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64).map(|i| ((i * 7 + seed * 3) % 5) as f32 - 2.0).collect()
}

/// `a @ b` in f64, row-major, with `a` `[m, k]` and `b` `[k, n]`.
fn product(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
        }
    }
    out
}

/// Seeds 782 (default), 471 and 750 (f64) on CUDA. A matmul fused with an
/// epilogue that casts to a narrower type (`(a @ b * s) as f16`) had its
/// GEMM write the f32/f64 product into the output's bytes, which the
/// memory plan sized for the f16/bf16 result: the product ran past them
/// into the next arena value (782: the broadcast `s`, so every element was
/// wrong) or past the arena (750: an illegal address, which also ends the
/// CUDA context; the emulator's heap was corrupted the same way). The
/// product now goes to scratch unless it fits (`cuda/lower/ops.rs`).
#[test]
fn a_product_cast_to_a_narrower_type() {
    on_every_device(|ctx| {
        // 782's shape: a batched product, scaled by a pooled value the
        // plan puts in the arena right after the product's bytes.
        let (x, w) = (whole(32, 1), whole(6, 2));
        let scale = ctx.tensor(&[2.0f32, 1.0, -1.0], [1, 1, 3, 1]).max_pool2d(2, 2, 1); // [[2], [1]]
        let y = (ctx.tensor(&x, [2, 4, 2, 2]).matmul(&ctx.tensor(&w, [2, 3])) * scale).cast(DType::F16);
        let p = product(&x, &w, 16, 2, 3);
        let want: Vec<f16> = p
            .iter()
            .enumerate()
            .map(|(i, &v)| f16::from_f64(v * if (i / 3) % 2 == 0 { 2.0 } else { 1.0 }))
            .collect();
        assert_eq!(y.to_vec::<f16>()?, want, "f32 product cast to f16");
        // 750's shape: a @ a^T in f64, cast to bf16, past the end of the arena.
        let a = whole(12 * 20, 3);
        let at = ctx.tensor(&a.iter().map(|&v| v as f64).collect::<Vec<_>>(), [12, 20]);
        let g = at.t().matmul(&at).cast(DType::BF16);
        let mut a_t = vec![0.0f32; 240];
        for i in 0..12 {
            for j in 0..20 {
                a_t[j * 12 + i] = a[i * 20 + j];
            }
        }
        let want: Vec<bf16> = product(&a_t, &a, 20, 12, 20).iter().map(|&v| bf16::from_f64(v)).collect();
        assert_eq!(g.to_vec::<bf16>()?, want, "f64 a^T a cast to bf16");
        Ok(())
    });
}

/// Seeds 1152 and 1791 on CUDA: a gather from a constant f16 or bf16
/// source (`full`, not folded because the index is computed) did not
/// compile: the kernel stored the constant's float literal into the half
/// type without converting it (`cuda/codegen/ops.rs`).
#[test]
fn a_gather_from_a_constant_half_source() {
    on_every_device(|ctx| {
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::I32] {
            let value = if dtype.is_float() { 0.5f32 } else { 2.0 };
            let src = ctx.full_dtype([1, 4, 1], value, dtype);
            let idx = ctx.tensor(&[3i64, 1, 4, 1], [1, 4, 1]).gt(9).cast(DType::I64); // zeros, computed
            let g = src.gather(0, &idx).cast(DType::F32);
            assert_eq!(g.to_vec::<f32>()?, vec![value; 4], "{dtype}");
        }
        Ok(())
    });
}
