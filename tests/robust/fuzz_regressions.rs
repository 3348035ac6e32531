//! Inputs the fuzzers (`fuzz/`) found that broke a promise, minimized, as
//! plain tests: each one panicked before its fix.

use half::f16;
use kiln::prelude::*;

/// A slice whose step is past the end keeps one element; the view's
/// stride (step times the dim's stride) overflowed `usize`, and walking
/// the view overflowed the storage offset (a debug-build panic in the
/// CPU download, `attempt to add with overflow`; found by the api fuzzer
/// as `rand([5, 5], f16).slice(1, 1, usize::MAX, usize::MAX)`).
#[test]
fn slices_with_steps_past_the_end_read_one_element() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.arange(0.0f32, 25.0, 1.0).reshape([5, 5]);
    // The fuzzer's case: `x[:, 1::usize::MAX]`.
    assert_eq!(x.slice(1, 1, usize::MAX, usize::MAX).to_vec::<f32>()?, vec![1.0, 6.0, 11.0, 16.0, 21.0]);
    for step in [usize::MAX, usize::MAX / 2, 1 << 62, 6] {
        assert_eq!(x.slice(1, 1, 5, step).to_vec::<f32>()?, vec![1.0, 6.0, 11.0, 16.0, 21.0]);
        assert_eq!(x.slice(0, 2, 5, step).to_vec::<f32>()?, vec![10.0, 11.0, 12.0, 13.0, 14.0]);
        // Two such slices (view folding composes their steps).
        let twice = x.slice(0, 1, 5, step).slice(0, 0, 1, step);
        assert_eq!(twice.to_vec::<f32>()?, vec![5.0, 6.0, 7.0, 8.0, 9.0]);
        // A slice of an expanded tensor, and another dtype.
        let e = ctx.ones_dtype([1, 5], DType::F16).broadcast_to([5, 5]).slice(0, 3, 5, step);
        assert_eq!(e.to_vec::<f16>()?, vec![f16::ONE; 5]);
    }
    Ok(())
}

/// The gradient of such a slice (the vector-Jacobian product spreads the
/// kept elements `step` apart: `len * step` overflowed).
#[test]
fn gradients_flow_through_slices_with_steps_past_the_end() -> Result<()> {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.arange(0.0f32, 6.0, 1.0).reshape([2, 3]))?;
    let loss = (w.slice(1, 1, usize::MAX, usize::MAX) * 2.0).sum_all();
    let grads = loss.backward()?;
    let g = grads.get(&w).expect("w has a gradient");
    assert_eq!(g.to_vec::<f32>()?, vec![0.0, 2.0, 0.0, 0.0, 2.0, 0.0]);
    Ok(())
}
