//! Regression tests: mismatches the differential run found, minimized to
//! the few ops that show them, each named after what broke.

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
    let ctx = Context::cpu();
    let x = ctx.tensor(&[3i32, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [3, 4]);
    let index = x.neg().argmax(0, true).cast(DType::F64);
    let y = index.softmax(0).sum_all();
    let plan = ctx.explain(&[&y])?;
    assert!(plan.matches("!in-place=").count() >= 2, "the case no longer chains in-place nodes:\n{plan}");
    assert_eq!(y.item::<f64>()?, 4.0, "plan:\n{plan}");
    Ok(())
}
