//! Sizes a machine cannot address or hold: a shape whose element count or
//! byte size overflows is a shape error when it is recorded; a request the
//! machine cannot allocate is an out-of-memory error, and the context stays
//! usable. Messages are golden.

use kiln::prelude::*;

fn snap(name: &str, err: &Error) {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| insta::assert_snapshot!(name, err.to_string()));
}

#[test]
fn a_shape_whose_size_overflows_is_a_shape_error_when_recorded() {
    let ctx = Context::cpu();
    let t = ctx.zeros([usize::MAX, 2]);
    let err = t.to_vec::<f32>().unwrap_err();
    assert!(matches!(err, Error::Shape { op: "full", .. }), "{err:?}");
    snap("limits_zeros_overflow", &err);
    // Element counts that fit but whose bytes do not; a zero dimension does
    // not excuse the others (their strides would still overflow).
    for dims in [vec![1usize << 62, 2], vec![0, usize::MAX, 3], vec![1 << 31, 1 << 31, 1 << 31]] {
        let err = ctx.zeros(dims.clone()).to_vec::<f32>().unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{dims:?}: {err:?}");
    }
    // Ops that compute a larger shape from addressable operands.
    let big = ctx.zeros([1usize << 40]);
    let err =
        big.reshape([1usize << 40, 1]).broadcast_to([1usize << 40, 1 << 30]).to_vec::<f32>().unwrap_err();
    snap("limits_broadcast_overflow", &err);
    let total =
        big.reshape([1usize << 20, 1 << 20]).cast(DType::F64).broadcast_to([1 << 24, 1 << 20, 1 << 20]);
    assert!(matches!(total.sum_all().to_vec::<f64>(), Err(Error::Shape { .. })));
    // The context is fine afterwards.
    assert_eq!((ctx.ones([2]) * 3.0).to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
}

#[test]
fn a_request_the_machine_cannot_hold_is_out_of_memory() {
    let ctx = Context::cpu();
    // 256 TiB of f32: addressable by the shape rules (under isize::MAX
    // bytes), but past the 128 TiB a process can map on x86-64 Linux, so
    // the allocation fails whatever the overcommit policy. (4 TiB, as
    // before, was refused here by the overcommit heuristic, but a machine
    // with `vm.overcommit_memory=1` granted it and the kernel's OOM killer
    // ended the test when the pages were touched.)
    let huge = [1usize << 46];
    // A value computed in the plan's arena.
    let err = ctx.randn(huge).sum_all().to_vec::<f32>().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err:?}");
    snap("limits_oom_arena", &err);
    // A value downloaded to the host (a broadcast constant made dense).
    let err = ctx.zeros(huge).to_vec::<f32>().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err:?}");
    snap("limits_oom_download", &err);
    // A plan output.
    let err = (ctx.randn(huge) + 1.0).to_vec::<f32>().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err:?}");
    // The context stays usable: the next read works and nothing leaked.
    let x = ctx.tensor(&[1.0f32, 2.0], [2]);
    assert_eq!((&x * &x).to_vec::<f32>().unwrap(), vec![1.0, 4.0]);
    let stats = ctx.stats();
    assert!(stats.live_bytes < 1 << 20, "{stats:?}");
}
