//! gather, index_select, cat and stack on every dtype, with i64 and i32
//! indices and non-contiguous operands.

use crate::reference::*;
use kiln::prelude::*;

/// Applies the same index computation to float or integer host data.
fn host_map(h: &Host, f: impl Fn(&Nd<f64>) -> Nd<f64>, g: impl Fn(&Nd<i64>) -> Nd<i64>) -> Host {
    match h {
        Host::F(a) => Host::F(f(a)),
        Host::I(a) => Host::I(g(a)),
    }
}

fn gather_ref<T: Copy>(x: &Nd<T>, dim: usize, idx: &Nd<i64>) -> Nd<T> {
    Nd::from_fn(&idx.shape, |i| {
        let mut j = i.to_vec();
        j[dim] = idx.get(i) as usize;
        x.get(&j)
    })
}

fn index_select_ref<T: Copy>(x: &Nd<T>, dim: usize, idx: &[i64]) -> Nd<T> {
    let mut shape = x.shape.clone();
    shape[dim] = idx.len();
    Nd::from_fn(&shape, |i| {
        let mut j = i.to_vec();
        j[dim] = idx[i[dim]] as usize;
        x.get(&j)
    })
}

fn cat_ref<T: Copy>(xs: &[&Nd<T>], dim: usize) -> Nd<T> {
    let mut shape = xs[0].shape.clone();
    shape[dim] = xs.iter().map(|x| x.shape[dim]).sum();
    Nd::from_fn(&shape, |i| {
        let mut j = i.to_vec();
        for x in xs {
            if j[dim] < x.shape[dim] {
                return x.get(&j);
            }
            j[dim] -= x.shape[dim];
        }
        unreachable!()
    })
}

#[test]
fn gather_on_every_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(40);
        let xs = [3usize, 4, 5];
        for dtype in DType::ALL {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &xs);
            for dim in 0..3 {
                for idx_dtype in [DType::I64, DType::I32] {
                    // The index may be longer than the input along `dim`, and
                    // shorter in the other dims.
                    let mut is = [2, 3, 4];
                    is[dim] = 6;
                    let idx = rand_small_i(&mut rng, idx_dtype, &is, 0, xs[dim] as i64);
                    let ti = tensor_i(&ctx, idx_dtype, &idx);
                    let want = host_map(&h, |a| gather_ref(a, dim, &idx), |a| gather_ref(a, dim, &idx));
                    check(
                        &t.gather(dim, &ti),
                        dtype,
                        &want,
                        0.0,
                        &format!("gather dim {dim} with {idx_dtype} index"),
                    );
                }
            }
            // A permuted, narrowed input and a transposed index.
            let idx = rand_small_i(&mut rng, DType::I64, &[4, 3], 0, 3);
            let ti3 = tensor_i(&ctx, DType::I64, &idx).t().unsqueeze(2); // [3, 4, 1]
            let idx3 = idx.transpose(0, 1).reshape(&[3, 4, 1]);
            let tv = t.narrow(2, 1, 3).permute(&[2, 1, 0]); // [3, 4, 3]
            let want = host_map(
                &h,
                |a| gather_ref(&a.slice(2, 1, 1, 3).permute(&[2, 1, 0]), 2, &idx3),
                |a| gather_ref(&a.slice(2, 1, 1, 3).permute(&[2, 1, 0]), 2, &idx3),
            );
            check(&tv.gather(2, &ti3), dtype, &want, 0.0, "gather of views");
        }
    });
}

#[test]
fn index_select_on_every_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(41);
        for dtype in DType::ALL {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[3, 4, 5]);
            for dim in 0..3 {
                for idx_dtype in [DType::I64, DType::I32] {
                    let size = [3, 4, 5][dim] as i64;
                    // Repeats, reversed order, and the last index.
                    let mut idx = vec![size - 1, 0, size - 1];
                    idx.extend(rand_small_i(&mut rng, DType::I64, &[4], 0, size).to_vec());
                    let ti = tensor_i(&ctx, idx_dtype, &Nd::new(idx.clone(), &[7]));
                    let want =
                        host_map(&h, |a| index_select_ref(a, dim, &idx), |a| index_select_ref(a, dim, &idx));
                    check(
                        &t.index_select(dim, &ti),
                        dtype,
                        &want,
                        0.0,
                        &format!("index_select dim {dim} ({idx_dtype})"),
                    );
                }
            }
            // Of a transposed input, with a strided index view.
            let idx = vec![3, 1, 2, 0, 4, 4];
            let ti = tensor_i(&ctx, DType::I64, &Nd::new(idx.clone(), &[6])).slice(0, 0, 6, 2); // 3, 2, 4
            let sel = [3, 2, 4];
            let want = host_map(
                &h,
                |a| index_select_ref(&a.transpose(0, 2), 0, &sel),
                |a| index_select_ref(&a.transpose(0, 2), 0, &sel),
            );
            check(&t.transpose(0, 2).index_select(0, &ti), dtype, &want, 0.0, "index_select of views");
        }
    });
}

/// Parts that are constants (`zeros`, a `full` that no kernel writes) and
/// joins along the last dim whose parts are not multiples of 4 while the
/// result is: the padding of a vocabulary to a multiple of 8 (rows of
/// zeros under a weight, zero columns after a gradient). CUDA writes such
/// results four elements a thread; every element must still come from
/// its part.
#[test]
fn cat_with_constant_parts_and_unaligned_last_dims() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(7);
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::I64] {
            for (rows, cols, pad) in [(3usize, 37usize, 3usize), (2, 5, 7), (4, 1, 3)] {
                let (tx, x) = rand_tensor(&ctx, &mut rng, dtype, &[rows, cols]);
                let zeros = ctx.zeros_dtype([rows, pad], dtype);
                let (ty, y) = rand_tensor(&ctx, &mut rng, dtype, &[rows, pad]);
                let zero = |shape: &[usize]| Nd::from_fn(shape, |_| 0.0);
                let izero = |shape: &[usize]| Nd::from_fn(shape, |_| 0i64);
                let (want_cols, want_both) = match (&x, &y) {
                    (Host::F(x), Host::F(y)) => (
                        Host::F(cat_ref(&[x, &zero(&[rows, pad])], 1)),
                        Host::F(cat_ref(&[x, y, &zero(&[rows, pad])], 1)),
                    ),
                    (Host::I(x), Host::I(y)) => (
                        Host::I(cat_ref(&[x, &izero(&[rows, pad])], 1)),
                        Host::I(cat_ref(&[x, y, &izero(&[rows, pad])], 1)),
                    ),
                    _ => unreachable!(),
                };
                let what = format!("{dtype:?} [{rows}, {cols}] and zero columns");
                check(&Tensor::cat(&[&tx, &zeros], 1), dtype, &want_cols, 0.0, &what);
                check(&Tensor::cat(&[&tx, &ty, &zeros], 1), dtype, &want_both, 0.0, &what);
                // Zero rows under a matrix: the result's rows of 4k columns.
                let (tw, w) = rand_tensor(&ctx, &mut rng, dtype, &[cols, 8]);
                let under = ctx.zeros_dtype([pad, 8], dtype);
                let want_rows = match &w {
                    Host::F(w) => Host::F(cat_ref(&[w, &zero(&[pad, 8])], 0)),
                    Host::I(w) => Host::I(cat_ref(&[w, &izero(&[pad, 8])], 0)),
                };
                check(&Tensor::cat(&[&tw, &under], 0), dtype, &want_rows, 0.0, &format!("{what}, rows"));
            }
        }
    });
}

#[test]
fn cat_and_stack_on_every_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(42);
        for dtype in DType::ALL {
            for dim in 0..3 {
                let mut sa = [2, 3, 4];
                let mut sb = [2, 3, 4];
                let mut sc = [2, 3, 4];
                sa[dim] = 1;
                sb[dim] = 5;
                sc[dim] = 2;
                let (ta, a) = rand_tensor(&ctx, &mut rng, dtype, &sa);
                let (tb, b) = rand_tensor(&ctx, &mut rng, dtype, &sb);
                let (tc, c) = rand_tensor(&ctx, &mut rng, dtype, &sc);
                let want2 = match (&a, &b) {
                    (Host::F(a), Host::F(b)) => Host::F(cat_ref(&[a, b], dim)),
                    (Host::I(a), Host::I(b)) => Host::I(cat_ref(&[a, b], dim)),
                    _ => unreachable!(),
                };
                check(&Tensor::cat(&[&ta, &tb], dim), dtype, &want2, 0.0, &format!("cat of 2 along {dim}"));
                let want3 = match (&a, &b, &c) {
                    (Host::F(a), Host::F(b), Host::F(c)) => Host::F(cat_ref(&[a, b, c], dim)),
                    (Host::I(a), Host::I(b), Host::I(c)) => Host::I(cat_ref(&[a, b, c], dim)),
                    _ => unreachable!(),
                };
                check(
                    &Tensor::cat(&[&ta, &tb, &tc], dim),
                    dtype,
                    &want3,
                    0.0,
                    &format!("cat of 3 along {dim}"),
                );
            }
            // Non-contiguous operands: a transpose, an expand and a strided slice.
            let (tx, x) = rand_tensor(&ctx, &mut rng, dtype, &[4, 3]);
            let (ty, y) = rand_tensor(&ctx, &mut rng, dtype, &[1, 4]);
            let (tz, z) = rand_tensor(&ctx, &mut rng, dtype, &[6, 4]);
            let got = Tensor::cat(&[&tx.t(), &ty.broadcast_to([2, 4]), &tz.slice(0, 1, 6, 3)], 0);
            let want = match (&x, &y, &z) {
                (Host::F(x), Host::F(y), Host::F(z)) => {
                    Host::F(cat_ref(&[&x.transpose(0, 1), &y.expand(&[2, 4]), &z.slice(0, 1, 3, 2)], 0))
                }
                (Host::I(x), Host::I(y), Host::I(z)) => {
                    Host::I(cat_ref(&[&x.transpose(0, 1), &y.expand(&[2, 4]), &z.slice(0, 1, 3, 2)], 0))
                }
                _ => unreachable!(),
            };
            check(&got, dtype, &want, 0.0, "cat of views");
            // Heads permuted out of [b, h, s, d] and joined along a new
            // dim of size 1 (GPT's qkv gradient): four elements at a time
            // on CUDA, read through the permutation.
            let heads: Vec<_> = (0..3).map(|_| rand_tensor(&ctx, &mut rng, dtype, &[2, 3, 5, 8])).collect();
            let views: Vec<Tensor> =
                heads.iter().map(|(t, _)| t.permute(&[0, 2, 1, 3]).reshape([2, 5, 1, 3, 8])).collect();
            let got = Tensor::cat(&views.iter().collect::<Vec<_>>(), 2);
            let want = match (&heads[0].1, &heads[1].1, &heads[2].1) {
                (Host::F(a), Host::F(b), Host::F(c)) => {
                    let v = |x: &Nd<f64>| x.permute(&[0, 2, 1, 3]).reshape(&[2, 5, 1, 3, 8]);
                    Host::F(cat_ref(&[&v(a), &v(b), &v(c)], 2))
                }
                (Host::I(a), Host::I(b), Host::I(c)) => {
                    let v = |x: &Nd<i64>| x.permute(&[0, 2, 1, 3]).reshape(&[2, 5, 1, 3, 8]);
                    Host::I(cat_ref(&[&v(a), &v(b), &v(c)], 2))
                }
                _ => unreachable!(),
            };
            check(&got, dtype, &want, 0.0, "cat of permuted heads");
            // stack along a new first, middle and last dim.
            let (tp, p) = rand_tensor(&ctx, &mut rng, dtype, &[3, 5]);
            let (tq, q) = rand_tensor(&ctx, &mut rng, dtype, &[3, 5]);
            for dim in 0..3 {
                let mut s = vec![3, 5];
                s.insert(dim, 1);
                let want = match (&p, &q) {
                    (Host::F(p), Host::F(q)) => Host::F(cat_ref(&[&p.reshape(&s), &q.reshape(&s)], dim)),
                    (Host::I(p), Host::I(q)) => Host::I(cat_ref(&[&p.reshape(&s), &q.reshape(&s)], dim)),
                    _ => unreachable!(),
                };
                check(&Tensor::stack(&[&tp, &tq], dim), dtype, &want, 0.0, &format!("stack along {dim}"));
            }
            // One tensor: cat is the identity.
            check(&Tensor::cat(&[&tp], 1), dtype, &p, 0.0, "cat of one tensor");
        }
    });
}

#[test]
fn gather_and_index_select_reject_out_of_range_indices_when_read() {
    each_backend(|| {
        let ctx = dev();
        let x = ctx.arange(0.0f32, 12.0, 1.0).reshape([3, 4]);
        for bad in [3i64, -1, i64::MAX] {
            let idx = ctx.tensor(&[0i64, bad, 1, 2], [1, 4]);
            let r = x.gather(0, &idx).to_vec::<f32>();
            assert!(matches!(r, Err(Error::Runtime(_))), "gather with index {bad}: {r:?}");
            let idx = ctx.tensor(&[0i64, bad], [2]);
            let r = x.index_select(0, &idx).to_vec::<f32>();
            assert!(matches!(r, Err(Error::Runtime(_))), "index_select with index {bad}: {r:?}");
        }
        // The context stays usable after a runtime error.
        let idx = ctx.tensor(&[2i32, 0], [2]);
        assert_eq!(x.index_select(1, &idx).to_vec::<f32>().unwrap(), vec![2.0, 0.0, 6.0, 4.0, 10.0, 8.0]);
    });
}

/// The vectorized `cat` (four elements a thread, through permuted views)
/// on the CPU emulator in every CI run, bit for bit against the CPU.
#[cfg(feature = "cuda-emulator")]
#[test]
fn vectorized_cat_runs_on_the_emulator() -> kiln::Result<()> {
    let run = |ctx: &Context| -> kiln::Result<Vec<f32>> {
        let mut rng = Rng::new(43);
        let heads: Vec<Tensor> = (0..3)
            .map(|_| tensor_f(ctx, DType::BF16, &rand_f(&mut rng, DType::BF16, &[2, 3, 5, 8], 1.0)))
            .collect();
        let views: Vec<Tensor> =
            heads.iter().map(|t| t.permute(&[0, 2, 1, 3]).reshape([2, 5, 1, 3, 8])).collect();
        Tensor::cat(&views.iter().collect::<Vec<_>>(), 2).cast(DType::F32).to_vec::<f32>()
    };
    assert_eq!(run(&Context::cpu())?, run(&Context::cuda_emulated())?);
    Ok(())
}
