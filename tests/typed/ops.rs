//! Each typed op computes what the untyped op computes, and its result's
//! shape value is the untyped result's shape.

use kiln::typed::*;

/// The values and dims of a typed result, checked against an untyped one.
#[track_caller]
fn same<S: Shape>(typed: &Tensor<S>, untyped: &kiln::Tensor) {
    assert_eq!(typed.dims(), untyped.shape(), "dims");
    assert_eq!(typed.to_vec().unwrap(), untyped.to_vec::<f32>().unwrap(), "values");
}

#[test]
fn elementwise_broadcasts_by_type() {
    let ctx = Context::cpu().with_seed(1);
    let x: Tensor<(usize, Const<3>)> = ctx.randn_typed((4, Const));
    let b: Tensor<Rank1<3>> = ctx.randn_typed(Default::default());
    let (xu, bu) = (x.untyped(), b.untyped());
    same(&(&x + &b), &(xu + bu));
    same(&(&b * &x), &(bu * xu));
    same(&(&x - &x), &(xu - xu));
    same(&(x.clone() / 2.0), &(xu / 2.0));
    same(&(1.0 - &x), &(1.0 - xu));
    same(&-&x, &-xu);
    same(&x.relu().exp(), &xu.relu().exp());
    same(&x.maximum(&b), &xu.maximum(bu));
    let s: Tensor<Rank0> = ctx.scalar_typed(3.0f32);
    same(&(&x * &s), &(xu * s.untyped()));
    let mask = x.gt(&b);
    assert_eq!(mask.dims(), vec![4, 3]);
    assert_eq!(mask.to_vec().unwrap(), xu.gt(bu).to_vec::<bool>().unwrap());
}

#[test]
fn matmul_plain_and_batched() {
    let ctx = Context::cpu().with_seed(2);
    let a: Tensor<(usize, Const<4>)> = ctx.randn_typed((3, Const));
    let w: Tensor<Rank2<4, 5>> = ctx.randn_typed(Default::default());
    let y = a.matmul(&w);
    let _: &(usize, Const<5>) = y.shape();
    same(&y, &a.untyped().matmul(w.untyped()));
    let batch: Tensor<(usize, Const<2>, Const<4>)> = ctx.randn_typed((6, Const, Const));
    let rhs: Tensor<(usize, Const<4>, Const<3>)> = ctx.randn_typed((6, Const, Const));
    same(&batch.matmul(&rhs), &batch.untyped().matmul(rhs.untyped()));
    same(&batch.matmul(&w), &batch.untyped().matmul(w.untyped()));
    let v: Tensor<Rank1<4>> = ctx.randn_typed(Default::default());
    same(&v.matmul(&w), &v.untyped().matmul(w.untyped()));
    same(&a.matmul(&v), &a.untyped().matmul(v.untyped()));
}

#[test]
fn reductions_over_typed_axes() {
    let ctx = Context::cpu().with_seed(3);
    let x: Tensor<Rank3<2, 3, 4>> = ctx.randn_typed(Default::default());
    let u = x.untyped();
    let s: Tensor<Rank2<2, 4>> = x.sum::<Axis<1>>();
    same(&s, &u.sum(&[1], false));
    same(&x.mean::<Axis<2>>(), &u.mean(&[2], false));
    same(&x.max::<Axis<0>>(), &u.max(&[0], false));
    same(&x.min::<Axis<2>>(), &u.min(&[2], false));
    same(&x.softmax::<Axis<2>>(), &u.softmax(2));
    same(&x.log_softmax::<Axis<1>>(), &u.log_softmax(1));
    assert_eq!(x.argmax::<Axis<2>>().to_vec().unwrap(), u.argmax(2, false).to_vec::<i64>().unwrap());
    assert_eq!(x.sum_all().item().unwrap(), u.sum_all().item::<f32>().unwrap());
    assert_eq!(x.mean_all().item().unwrap(), u.mean(&[0, 1, 2], false).item::<f32>().unwrap());
    let (w, b): (Tensor<Rank1<4>>, Tensor<Rank1<4>>) =
        (ctx.randn_typed(Default::default()), ctx.zeros_typed((Const,)));
    same(&x.layer_norm(&w, &b, 1e-5), &u.layer_norm(w.untyped(), b.untyped(), 1e-5));
}

#[test]
fn views_joins_and_indexing() {
    let ctx = Context::cpu().with_seed(4);
    let x: Tensor<Rank3<2, 3, 4>> = ctx.randn_typed(Default::default());
    let u = x.untyped();
    same(&x.reshape::<Rank2<6, 4>>(), &u.reshape([6, 4]));
    same(&x.reshape_to((3usize, Const::<8>)), &u.reshape([3, 8]));
    let p: Tensor<Rank3<4, 2, 3>> = x.permute::<Axes3<2, 0, 1>>();
    same(&p, &u.permute(&[2, 0, 1]));
    let m: Tensor<Rank2<3, 4>> = x.select::<Axis<0>>(1);
    same(&m, &u.narrow(0, 1, 1).reshape([3, 4]));
    same(&m.t(), &u.narrow(0, 1, 1).reshape([3, 4]).t());
    let n: Tensor<(Const<2>, usize, Const<4>)> = x.narrow::<Axis<1>>(1, 2);
    same(&n, &u.narrow(1, 1, 2));
    let joined: Tensor<(Const<2>, usize, Const<4>)> = x.concat::<Axis<1>, _>(&n);
    assert_eq!(joined.shape().1, 5);
    same(&joined, &kiln::Tensor::cat(&[u, n.untyped()], 1));
    let ids: Tensor<(usize,), i64> = ctx.tensor_typed(&[3i64, 0, 0], (3,));
    let picked: Tensor<(Const<2>, Const<3>, usize)> = x.index_select::<Axis<2>, _>(&ids);
    same(&picked, &u.index_select(2, ids.untyped()));
    let bias: Tensor<Rank1<4>> = ctx.randn_typed(Default::default());
    same(&bias.broadcast_to((Const::<5>, Const::<4>)), &bias.untyped().broadcast_to([5, 4]));
}

#[test]
fn conv_and_pooling_sizes_in_the_type() {
    let ctx = Context::cpu().with_seed(5);
    let x: Tensor<(usize, Const<3>, Const<8>, Const<8>)> = ctx.randn_typed((2, Const, Const, Const));
    let w: Tensor<Rank4<4, 3, 3, 3>> = ctx.randn_typed(Default::default());
    let same_size: Tensor<(usize, Const<4>, Const<8>, Const<8>)> = x.conv2d(&w, Const::<1>, Const::<1>);
    same(&same_size, &x.untyped().conv2d(w.untyped(), 1, 1, 1, 1));
    let strided: Tensor<(usize, Const<4>, Const<4>, Const<4>)> = x.conv2d(&w, Const::<2>, Const::<1>);
    same(&strided, &x.untyped().conv2d(w.untyped(), 2, 1, 1, 1));
    let valid: Tensor<(usize, Const<4>, Const<6>, Const<6>)> = x.conv2d(&w, Const::<1>, Const::<0>);
    same(&valid, &x.untyped().conv2d(w.untyped(), 1, 0, 1, 1));
    let pooled: Tensor<(usize, Const<3>, Const<4>, Const<4>)> = x.max_pool2d::<2>();
    same(&pooled, &x.untyped().max_pool2d(2, 2, 0));
    same(&x.avg_pool2d::<4>(), &x.untyped().avg_pool2d(4, 4, 0));
    // Runtime spatial dims: the sizes are computed when recorded.
    let r: Tensor<(usize, Const<3>, usize, usize)> = x.reshape_to((2, Const, 8, 8));
    let out = r.conv2d(&w, Const::<1>, Const::<0>).max_pool2d::<3>();
    assert_eq!(out.dims(), vec![2, 4, 2, 2]);
    same(&out, &x.untyped().conv2d(w.untyped(), 1, 0, 1, 1).max_pool2d(3, 3, 0));
}

#[test]
fn conversion_checks_dims_once() {
    let ctx = Context::cpu();
    let t = ctx.ones([5, 3]);
    let x = Tensor::<(usize, Const<3>)>::from_untyped(t.clone()).unwrap();
    assert_eq!(*x.shape(), (5, Const));
    let back: kiln::Tensor = x.clone().into();
    assert_eq!(back.shape(), &[5, 3]);
    assert!(Tensor::<(usize, Const<4>)>::from_untyped(t.clone()).is_err());
    assert!(Tensor::<(usize,)>::from_untyped(t.clone()).is_err());
    assert!(Tensor::<(usize, Const<3>), f64>::from_untyped(t).is_err());
    assert_eq!(x.cast::<f64>().untyped().dtype(), DType::F64);
    assert_eq!(format!("{:?}", x).split('(').next(), Some("typed::Tensor<"));
}
