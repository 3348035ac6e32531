//! Where dims are `usize` the types cannot check them: a mismatch is a
//! `kiln::Error` that names the shapes and the caller's line, snapshotted
//! whole in `snapshots/typed__*.snap` (STYLE rule 7).

use crate::snapshots;
use kiln::typed::*;

#[track_caller]
fn snap<T: std::fmt::Debug>(name: &str, r: Result<T>) {
    let msg = match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("{name}: expected an error, got {v:?}"),
    };
    snapshots().bind(|| insta::assert_snapshot!(format!("typed__{name}"), msg));
}

#[test]
fn runtime_dims_that_differ() {
    let ctx = Context::cpu();
    let a: Tensor<(usize, Const<5>)> = ctx.zeros_typed((3, Const));
    let b: Tensor<(usize, Const<5>)> = ctx.zeros_typed((4, Const));
    snap("add_batch_mismatch", (&a + &b).to_vec());
    let k3: Tensor<(Const<2>, usize)> = ctx.zeros_typed((Const, 3));
    let k4: Tensor<(usize, Const<6>)> = ctx.zeros_typed((4, Const));
    snap("matmul_inner_runtime", k3.matmul(&k4).to_vec());
    snap("select_out_of_range", a.select::<Axis<0>>(3).to_vec());
    snap("reshape_to_count", a.reshape_to((Const::<4>, Const::<4>)).to_vec());
}

#[test]
fn conversions_and_modules() {
    let ctx = Context::cpu();
    snap("from_untyped_shape", Tensor::<(usize, Const<784>)>::from_untyped(ctx.zeros([32, 28, 28])));
    snap("from_untyped_dtype", Tensor::<(usize, Const<3>), f64>::from_untyped(ctx.zeros([2, 3])));
    let flatten = Flatten::<128>::build(&ctx, "f").unwrap();
    let x: Tensor<(usize, Const<32>, usize, usize)> = ctx.zeros_typed((2, Const, 3, 3));
    snap("flatten_runtime_width", flatten.forward(x));
    let pooled: Tensor<(usize, Const<1>, usize, usize)> = ctx.zeros_typed((2, Const, 1, 1));
    snap("pool_window_too_big", pooled.max_pool2d::<2>().to_vec());
}
