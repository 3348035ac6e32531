//! User-facing errors, as golden snapshots of the whole message (location
//! included), and the error kind each one is.

use crate::reference::{dev, each_backend};
use kiln::prelude::*;

/// Snapshots `err`'s Display message as `snapshots/errors__<name>.snap`.
fn snap(name: &str, err: &Error) {
    let msg = stable(err.to_string());
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| insta::assert_snapshot!(format!("errors__{name}"), msg));
}

/// The error a read of `t` returns (f32 reads; failures happen before the type matters).
#[track_caller]
fn read_err(t: &Tensor) -> Error {
    match t.to_vec::<f32>() {
        Ok(v) => panic!("expected an error, read {} values", v.len()),
        Err(e) => e,
    }
}

#[test]
fn broadcast_mismatch() {
    each_backend(|| {
        let ctx = dev();
        let bad = ctx.zeros([2, 3]) + ctx.zeros([4]);
        let e = read_err(&bad);
        assert!(matches!(e, Error::Shape { op: "add", .. }), "{e:?}");
        assert_eq!(bad.error(), Some(&e));
        snap("broadcast_mismatch", &e);
        let bad = ctx.zeros([3, 1, 5]).maximum(ctx.zeros([2, 4, 1]));
        snap("broadcast_mismatch_leading_dim", &read_err(&bad));
    });
}

#[test]
fn matmul_inner_dim_mismatch() {
    each_backend(|| {
        let ctx = dev();
        let e = read_err(&ctx.zeros([2, 3]).matmul(&ctx.zeros([4, 5])));
        assert!(matches!(e, Error::Shape { op: "matmul", .. }), "{e:?}");
        snap("matmul_inner_dim_mismatch", &e);
        let e = read_err(&ctx.zeros([2, 2, 3]).matmul(&ctx.zeros([3, 3, 4])));
        snap("matmul_batch_mismatch", &e);
    });
}

#[test]
fn mixed_dtypes_suggest_a_cast() {
    each_backend(|| {
        let ctx = dev();
        let a = ctx.zeros([3]);
        let b = ctx.zeros_dtype([3], DType::F64);
        let e = read_err(&(&a * &b));
        assert!(matches!(e, Error::DType { op: "mul", .. }), "{e:?}");
        assert!(e.to_string().contains("cast"), "{e}");
        snap("mixed_dtypes", &e);
        let i = ctx.zeros_dtype([3], DType::I32);
        snap("mixed_dtypes_compare", &read_err(&a.lt(&i)));
    });
}

#[test]
fn float_only_op_on_ints() {
    each_backend(|| {
        let ctx = dev();
        let e = read_err(&ctx.zeros_dtype([3], DType::I32).exp());
        assert!(matches!(e, Error::DType { op: "exp", .. }), "{e:?}");
        snap("float_only_op_on_ints", &e);
        snap("mean_of_ints", &read_err(&ctx.zeros_dtype([3], DType::I64).mean(&[0], false)));
        snap("softmax_of_ints", &read_err(&ctx.zeros_dtype([2, 3], DType::U8).softmax(1)));
        snap(
            "add_on_bool",
            &read_err(&ctx.zeros_dtype([3], DType::Bool).add(ctx.zeros_dtype([3], DType::Bool))),
        );
        snap("rand_of_ints", &read_err(&ctx.rand_dtype([3], DType::I32)));
    });
}

#[test]
fn scalar_not_representable() {
    each_backend(|| {
        let ctx = dev();
        let x = ctx.zeros_dtype([3], DType::I32);
        let e = read_err(&(&x * 0.5));
        assert!(matches!(e, Error::DType { op: "mul", .. }), "{e:?}");
        snap("scalar_not_representable", &e);
        let u = ctx.zeros_dtype([3], DType::U8);
        snap("scalar_not_representable_lhs", &read_err(&(300 - &u)));
        // Floats round (0.1 is fine for f16), but not to infinity.
        assert!((ctx.zeros_dtype([3], DType::F16) + 0.1).error().is_none());
        snap("scalar_overflows_f16", &read_err(&(ctx.zeros_dtype([3], DType::F16) + 1e6)));
        snap("full_fraction_for_int", &read_err(&ctx.full_dtype([2], 2.5, DType::I64)));
    });
}

#[test]
fn reshape_to_wrong_numel() {
    each_backend(|| {
        let ctx = dev();
        let e = read_err(&ctx.zeros([2, 3]).reshape([4, 2]));
        assert!(matches!(e, Error::Shape { op: "reshape", .. }), "{e:?}");
        snap("reshape_wrong_numel", &e);
    });
}

#[test]
fn bad_permutation() {
    each_backend(|| {
        let ctx = dev();
        let e = read_err(&ctx.zeros([2, 3, 4]).permute(&[0, 0, 1]));
        assert!(matches!(e, Error::Shape { op: "permute", .. }), "{e:?}");
        snap("bad_permutation", &e);
        snap("permutation_wrong_length", &read_err(&ctx.zeros([2, 3]).permute(&[1, 0, 2])));
    });
}

#[test]
fn out_of_range_dims() {
    each_backend(|| {
        let ctx = dev();
        let x = ctx.zeros([2, 3]);
        let e = read_err(&x.sum(&[2], false));
        assert!(matches!(e, Error::Shape { op: "sum", .. }), "{e:?}");
        snap("sum_dim_out_of_range", &e);
        snap("transpose_dim_out_of_range", &read_err(&x.transpose(0, 2)));
        snap("narrow_past_the_end", &read_err(&x.narrow(1, 2, 2)));
        snap("squeeze_not_size_one", &read_err(&x.squeeze(0)));
        snap("softmax_dim_out_of_range", &read_err(&x.softmax(2)));
        snap("argmax_dim_out_of_range", &read_err(&x.argmax(5, false)));
        snap("reduce_dim_twice", &read_err(&x.max(&[1, 1], false)));
    });
}

#[test]
fn failed_tensor_descendants_report_the_original_error() {
    each_backend(|| {
        let ctx = dev();
        let a = ctx.zeros([2, 3]);
        let bad = &a + ctx.zeros([3, 2]); // the error is recorded here
        let later = (bad.exp().sum(&[0], false) * 2.0).matmul(&ctx.ones([3, 1])).relu();
        let also = Tensor::cat(&[&a, &bad], 0);
        let e = read_err(&later);
        assert_eq!(Some(&e), bad.error());
        assert_eq!(also.error(), bad.error());
        snap("failed_descendant", &e);
        // Reading as another type still reports the original error.
        assert_eq!(later.to_vec::<i64>().unwrap_err(), e);
        assert_eq!(later.item::<f32>().unwrap_err(), e);
    });
}

#[test]
fn to_vec_with_the_wrong_element_type() {
    each_backend(|| {
        let ctx = dev();
        let e = ctx.zeros([2]).to_vec::<i64>().unwrap_err();
        assert!(matches!(e, Error::DType { op: "to_vec", .. }), "{e:?}");
        snap("to_vec_wrong_type", &e);
        let e = ctx.zeros_dtype([1], DType::BF16).item::<f32>().unwrap_err();
        snap("item_wrong_type", &e);
    });
}

#[test]
fn item_on_a_multi_element_tensor() {
    each_backend(|| {
        let ctx = dev();
        let e = ctx.zeros([2, 2]).item::<f32>().unwrap_err();
        assert!(matches!(e, Error::Shape { op: "item", .. }), "{e:?}");
        snap("item_multi_element", &e);
    });
}

#[test]
fn tensors_from_two_contexts() {
    each_backend(|| {
        let (c1, c2) = (dev(), dev());
        let e = read_err(&(c1.zeros([2]) + c2.zeros([2])));
        assert!(matches!(e, Error::Device { .. }), "{e:?}");
        snap("two_contexts", &e);
        let e = c1.realize(&[&c2.zeros([2])]).unwrap_err();
        snap("realize_on_another_context", &e);
    });
}

#[test]
fn gather_index_out_of_range_is_a_runtime_error() {
    each_backend(|| {
        let ctx = dev();
        let x = ctx.zeros([3, 4]);
        let idx = ctx.tensor(&[0i64, 1, 7, 2], [1, 4]);
        let e = read_err(&x.gather(0, &idx));
        assert!(matches!(e, Error::Runtime(_)), "{e:?}");
        snap("gather_index_out_of_range", &e);
        let idx = ctx.tensor(&[-1i32], [1]);
        snap("index_select_negative_index", &read_err(&x.index_select(1, &idx)));
    });
}

#[test]
fn tensor_with_wrong_data_length() {
    each_backend(|| {
        let ctx = dev();
        let e = read_err(&ctx.tensor(&[1.0f32, 2.0, 3.0], [2, 2]));
        assert!(matches!(e, Error::Shape { op: "tensor", .. }), "{e:?}");
        snap("tensor_wrong_length", &e);
    });
}

#[test]
fn other_shape_errors() {
    each_backend(|| {
        let ctx = dev();
        let x = ctx.zeros([1, 4, 5, 5]);
        snap("conv2d_groups_mismatch", &read_err(&x.conv2d(&ctx.zeros([6, 3, 3, 3]), 1, 0, 1, 2)));
        snap("conv2d_kernel_too_large", &read_err(&x.conv2d(&ctx.zeros([2, 4, 7, 7]), 1, 0, 1, 1)));
        snap("cat_shape_mismatch", &read_err(&Tensor::cat(&[&ctx.zeros([2, 3]), &ctx.zeros([2, 4])], 0)));
        snap("where_condition_not_bool", &read_err(&ctx.zeros([2]).where_cond(ctx.zeros([2]), 1.0)));
        snap("gather_index_dtype", &read_err(&ctx.zeros([2]).gather(0, &ctx.zeros([2]))));
        snap("max_pool_padding_too_large", &read_err(&x.max_pool2d(2, 2, 2)));
        snap("slice_backwards", &read_err(&ctx.zeros([5]).slice(0, 3, 1, 1)));
        // The gradient of a pooling whose result is [1, 4, 2, 2].
        let g = ctx.zeros([1, 4, 2, 2]);
        snap("max_pool_grad_wrong_gradient_shape", &read_err(&x.max_pool2d_grad(&g, 3, 1, 1)));
        let g64 = g.cast(DType::F64);
        snap("max_pool_grad_mixed_dtypes", &read_err(&x.max_pool2d_grad(&g64, 2, 2, 0)));
        let xi = x.cast(DType::I32);
        snap("max_pool_grad_integer_input", &read_err(&xi.max_pool2d_grad(&g.cast(DType::I32), 2, 2, 0)));
        snap("max_pool_grad_zero_stride", &read_err(&x.max_pool2d_grad(&g, 2, 0, 0)));
    });
}

/// `msg` with contexts (`cpu (context 12)`) written as `DEVICE (context
/// N)`: the number counts the contexts the test process made before, and
/// the device is each backend's (the same snapshot serves all).
fn stable(msg: String) -> String {
    let mut out = String::new();
    let mut rest = msg.as_str();
    while let Some(i) = rest.find(" (context ") {
        let word = rest[..i].rfind(' ').map_or(0, |s| s + 1);
        out.push_str(&rest[..word]);
        out.push_str("DEVICE (context N");
        rest = rest[i + 10..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out + rest
}
