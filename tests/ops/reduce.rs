//! sum / mean / max / min / argmax over several dim sets with and without
//! keepdim, on every dtype they accept; softmax and log_softmax.

use crate::reference::*;
use kiln::prelude::*;

const DIM_SETS: [&[usize]; 8] = [&[], &[0], &[1], &[2], &[0, 2], &[1, 2], &[0, 1, 2], &[0, 1]];

fn reduced_count(shape: &[usize], dims: &[usize]) -> usize {
    dims.iter().map(|&d| shape[d]).product()
}

fn fmax(v: &[f64]) -> f64 {
    v.iter()
        .copied()
        .fold(f64::NEG_INFINITY, |m, x| if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x) })
}

fn fmin(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, |m, x| if m.is_nan() || x.is_nan() { f64::NAN } else { m.min(x) })
}

/// Index of the first maximum; a NaN is the maximum (the first NaN wins).
pub(super) fn argmax_f(v: &[f64]) -> i64 {
    if let Some(i) = v.iter().position(|x| x.is_nan()) {
        return i as i64;
    }
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as i64
}

fn argmax_i(v: &[i64]) -> i64 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as i64
}

#[test]
fn sum_max_min_on_every_numeric_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(20);
        for dtype in NUMERIC {
            // [40, 2, 33] over leading dims: more rows than a column
            // kernel's block has warps (CUDA's `reduce_columns`); [300, 2,
            // 33]: rows the column kernel splits into chunks over blocks.
            for shape in [&[3usize, 4, 5][..], &[7, 1, 129], &[40, 2, 33], &[300, 2, 33]] {
                let (t, h) = rand_tensor(&ctx, &mut rng, dtype, shape);
                for (i, dims) in DIM_SETS.iter().enumerate() {
                    for keepdim in [false, true] {
                        if keepdim && i % 2 == 1 && shape[1] != 1 {
                            continue; // keepdim is covered on every other dim set
                        }
                        let what = |op: &str| format!("{op} of {shape:?} over {dims:?} keepdim={keepdim}");
                        let k = reduced_count(shape, dims) as f64;
                        match &h {
                            Host::F(a) => {
                                let scale = k.sqrt() * max_abs(a);
                                let sum = a.reduce(dims, keepdim, |v| v.iter().sum::<f64>());
                                check_f(&t.sum(dims, keepdim), dtype, &sum, scale, &what("sum"));
                                check_f(
                                    &t.max(dims, keepdim),
                                    dtype,
                                    &a.reduce(dims, keepdim, fmax),
                                    0.0,
                                    &what("max"),
                                );
                                check_f(
                                    &t.min(dims, keepdim),
                                    dtype,
                                    &a.reduce(dims, keepdim, fmin),
                                    0.0,
                                    &what("min"),
                                );
                                let mean =
                                    a.reduce(dims, keepdim, |v| v.iter().sum::<f64>() / v.len() as f64);
                                check_f(&t.mean(dims, keepdim), dtype, &mean, scale / k, &what("mean"));
                            }
                            Host::I(a) => {
                                let sum = a.reduce(dims, keepdim, |v| {
                                    v.iter().fold(0i64, |s, &x| s.wrapping_add(x))
                                });
                                check_i(&t.sum(dims, keepdim), dtype, &sum, &what("sum (wrapping)"));
                                let max = a.reduce(dims, keepdim, |v| *v.iter().max().unwrap());
                                check_i(&t.max(dims, keepdim), dtype, &max, &what("max"));
                                let min = a.reduce(dims, keepdim, |v| *v.iter().min().unwrap());
                                check_i(&t.min(dims, keepdim), dtype, &min, &what("min"));
                            }
                        }
                    }
                }
            }
        }
    });
}

#[test]
fn reductions_of_non_contiguous_views() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(21);
        for dtype in NUMERIC {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[6, 5, 4]);
            // permute + strided slice + expand: [5, 3, 2, 4]
            let v = t.permute(&[1, 0, 2]).slice(1, 1, 6, 2).unsqueeze(2).broadcast_to([5, 3, 2, 4]);
            for dims in [&[0usize][..], &[1, 3], &[0, 1, 2, 3]] {
                let what = format!("sum of a view over {dims:?}");
                match &h {
                    Host::F(a) => {
                        let av = a
                            .permute(&[1, 0, 2])
                            .slice(1, 1, 2, 3)
                            .reshape(&[5, 3, 1, 4])
                            .expand(&[5, 3, 2, 4]);
                        let k = reduced_count(&[5, 3, 2, 4], dims) as f64;
                        let want = av.reduce(dims, false, |v| v.iter().sum::<f64>());
                        check_f(&v.sum(dims, false), dtype, &want, k.sqrt() * max_abs(a), &what);
                        check_f(
                            &v.max(dims, true),
                            dtype,
                            &av.reduce(dims, true, fmax),
                            0.0,
                            "max of a view",
                        );
                    }
                    Host::I(a) => {
                        let av = a
                            .permute(&[1, 0, 2])
                            .slice(1, 1, 2, 3)
                            .reshape(&[5, 3, 1, 4])
                            .expand(&[5, 3, 2, 4]);
                        let want = av.reduce(dims, false, |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
                        check_i(&v.sum(dims, false), dtype, &want, &what);
                        check_i(
                            &v.min(dims, true),
                            dtype,
                            &av.reduce(dims, true, |v| *v.iter().min().unwrap()),
                            "min",
                        );
                    }
                }
            }
        }
    });
}

#[test]
fn sum_all_and_reductions_of_scalars() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(22);
        for dtype in NUMERIC {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[129]);
            match &h {
                Host::F(a) => {
                    let want = a.reduce(&[0], false, |v| v.iter().sum::<f64>());
                    check_f(&t.sum_all(), dtype, &want, 129f64.sqrt() * max_abs(a), "sum_all");
                }
                Host::I(a) => {
                    let want = a.reduce(&[0], false, |v| v.iter().fold(0i64, |s, &x| s.wrapping_add(x)));
                    check_i(&t.sum_all(), dtype, &want, "sum_all");
                }
            }
            // A rank-0 tensor reduced over no dims is itself.
            let (s, hs) = rand_tensor(&ctx, &mut rng, dtype, &[]);
            check(&s.sum::<usize>(&[], false), dtype, &hs, 0.0, "sum of a scalar over []");
            check(&s.sum_all(), dtype, &hs, 0.0, "sum_all of a scalar");
        }
    });
}

#[test]
fn max_min_argmax_on_bool() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(23);
        let a = rand_i(&mut rng, DType::Bool, &[4, 9]);
        let t = tensor_i(&ctx, DType::Bool, &a);
        check_i(
            &t.max(&[1], false),
            DType::Bool,
            &a.reduce(&[1], false, |v| *v.iter().max().unwrap()),
            "bool max",
        );
        check_i(
            &t.min(&[0], true),
            DType::Bool,
            &a.reduce(&[0], true, |v| *v.iter().min().unwrap()),
            "bool min",
        );
        check_i(&t.argmax(1, false), DType::I64, &a.reduce(&[1], false, argmax_i), "bool argmax");
    });
}

#[test]
fn argmax_on_every_numeric_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(24);
        for dtype in NUMERIC {
            // Tie-heavy values, so "first maximum" matters.
            let shape = [3, 4, 5];
            let h = if dtype.is_float() {
                Host::F(rand_small_i(&mut rng, DType::I64, &shape, -3, 4).map(|x| x as f64 * 0.5))
            } else {
                Host::I(rand_small_i(&mut rng, dtype, &shape, 0, 4))
            };
            let t = match &h {
                Host::F(a) => tensor_f(&ctx, dtype, a),
                Host::I(a) => tensor_i(&ctx, dtype, a),
            };
            for dim in 0..3 {
                for keepdim in [false, true] {
                    let want = match &h {
                        Host::F(a) => a.reduce(&[dim], keepdim, argmax_f),
                        Host::I(a) => a.reduce(&[dim], keepdim, argmax_i),
                    };
                    check_i(
                        &t.argmax(dim, keepdim),
                        DType::I64,
                        &want,
                        &format!("argmax dim {dim} keepdim={keepdim}"),
                    );
                }
            }
            // Full-range values along a long row, of a transposed view.
            let (t2, h2) = rand_tensor(&ctx, &mut rng, dtype, &[129, 3]);
            let want = match &h2 {
                Host::F(a) => a.transpose(0, 1).reduce(&[1], false, argmax_f),
                Host::I(a) => a.transpose(0, 1).reduce(&[1], false, argmax_i),
            };
            check_i(&t2.t().argmax(1, false), DType::I64, &want, "argmax of a transposed [129,3]");
        }
    });
}

/// A row kernel takes a thread's adjacent columns in runs (read with one
/// vector load) and, where its body rounds to a 16-bit float, two at a
/// time: each element's index must be its own column, and ties go to the
/// first. Rows of 8 (a thread a row), 64 (a warp) and 768 (96 threads of
/// 8 columns), of an input and of a sum rounded to the dtype.
#[test]
fn argmax_over_runs_of_columns_finds_the_first_maximum() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(25);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for shape in [[6usize, 8], [5, 64], [3, 768]] {
                // Tie-heavy halves: every sum is exact in each dtype.
                let mut halves = || rand_small_i(&mut rng, DType::I64, &shape, -3, 4).map(|x| x as f64 * 0.5);
                let (a, b) = (halves(), halves());
                let (ta, tb) = (tensor_f(&ctx, dtype, &a), tensor_f(&ctx, dtype, &b));
                let what = format!("argmax of {dtype} {shape:?}");
                check_i(&ta.argmax(1, false), DType::I64, &a.reduce(&[1], false, argmax_f), &what);
                let want = a.zip(&b, |x, y| x + y).reduce(&[1], false, argmax_f);
                check_i(&(&ta + &tb).argmax(1, false), DType::I64, &want, &format!("{what}, of a sum"));
            }
        }
    });
}

#[test]
fn nan_wins_in_max_min_and_argmax() {
    each_backend(|| {
        let ctx = dev();
        let nan = f64::NAN;
        let a = Nd::new(vec![1.0, nan, 3.0, nan, -1.0, 2.0, 5.0, 0.0, 7.0, 7.0, -2.0, nan], &[3, 4]);
        for dtype in FLOATS {
            let t = tensor_f(&ctx, dtype, &a);
            check_f(&t.max(&[1], false), dtype, &a.reduce(&[1], false, fmax), 0.0, "max with NaN");
            check_f(&t.min(&[1], false), dtype, &a.reduce(&[1], false, fmin), 0.0, "min with NaN");
            check_f(&t.max(&[0], false), dtype, &a.reduce(&[0], false, fmax), 0.0, "max with NaN over dim 0");
            check_i(&t.argmax(1, false), DType::I64, &a.reduce(&[1], false, argmax_f), "argmax with NaN");
        }
        // 70 rows of 40 columns: the column kernel's rows and warps; 300
        // rows: its row chunks, with NaN in the first and the last.
        for rows in [70, 300] {
            let mut rng = Rng::new(21);
            let mut v: Vec<f64> = (0..rows * 40).map(|_| rng.normal()).collect();
            for (row, col) in [(0, 3), (rows - 1, 5), (33, 39), (34, 39), (5, 0)] {
                v[row * 40 + col] = nan;
            }
            let a = Nd::new(v, &[rows, 40]);
            for dtype in FLOATS {
                let t = tensor_f(&ctx, dtype, &a);
                check_f(&t.max(&[0], false), dtype, &a.reduce(&[0], false, fmax), 0.0, "column max with NaN");
                check_f(&t.min(&[0], true), dtype, &a.reduce(&[0], true, fmin), 0.0, "column min with NaN");
            }
        }
    });
}

/// The column kernel with its rows split into chunks (a workspace and
/// arrival counters, the last block combining) on the CPU emulator in
/// every CI run, against the CPU: sums of f32 and i32, a mean, a max, bit
/// for bit (each accumulates in double or i64 and rounds once).
#[cfg(feature = "cuda-emulator")]
#[test]
fn split_column_reductions_run_on_the_emulator() -> kiln::Result<()> {
    let run = |ctx: &Context| -> kiln::Result<Vec<Vec<f64>>> {
        let mut rng = Rng::new(22);
        let x = tensor_f(ctx, DType::F32, &rand_f(&mut rng, DType::F32, &[600, 2, 40], 1.0));
        let i = ctx.tensor(&(0..600 * 40).map(|k: i32| k % 13 - 6).collect::<Vec<_>>(), [600, 40]);
        let outs = [
            x.sum(&[0, 1], false),
            x.mean(&[0], false),
            x.max(&[0], false),
            i.sum(&[0], false).cast(DType::F32),
        ];
        ctx.realize(&outs.iter().collect::<Vec<_>>())?;
        outs.iter().map(|o| Ok(o.to_vec::<f32>()?.into_iter().map(f64::from).collect())).collect()
    };
    let (cpu, emu) = (run(&Context::cpu())?, run(&Context::cuda_emulated())?);
    for (k, (c, e)) in cpu.iter().zip(&emu).enumerate() {
        assert_eq!(c, e, "output {k}: the emulated column kernel differs from the CPU");
    }
    Ok(())
}

/// A float sum or mean over leading dims of a widened f16 or bf16 value
/// (autocast's bias gradients) reads the narrow value and widens as it
/// reads (fusion's `wide_sum.rs`: `sum(x) into=f32`). Each case is a
/// path of the CUDA lowering: dense columns (the column kernel, split into
/// row chunks for the tall one), fewer than 32 columns and a permuted view
/// (the row kernel, widening in its body).
#[test]
fn column_sums_of_widened_half_values() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(23);
        for dtype in [DType::BF16, DType::F16] {
            for (shape, dims, permute) in [
                (&[37usize, 3, 70][..], &[0usize, 1][..], false),
                (&[600, 2, 40], &[0], false),
                (&[37, 3, 20], &[0, 1], false),
                (&[5, 7, 40], &[0], true),
            ] {
                let (t, h) = rand_tensor(&ctx, &mut rng, dtype, shape);
                let Host::F(a) = &h else { unreachable!("a float dtype") };
                let (w, a) = if permute {
                    (t.cast(DType::F32).permute(&[2, 1, 0]), a.permute(&[2, 1, 0]))
                } else {
                    (t.cast(DType::F32), a.clone())
                };
                let what = format!("sum of {dtype} {shape:?} widened, over {dims:?}, permuted {permute}");
                let n = reduced_count(&a.shape, dims) as f64;
                let sum = a.reduce(dims, false, |v| v.iter().sum::<f64>());
                check_f(&w.sum(dims, false), DType::F32, &sum, max_abs(&a), &what);
                let mean = a.reduce(dims, true, |v| v.iter().sum::<f64>() / n);
                check_f(&w.mean(dims, true), DType::F32, &mean, max_abs(&a), &format!("mean: {what}"));
            }
        }
    });
}

#[test]
fn softmax_and_log_softmax_on_every_float_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(25);
        let softmax = |v: &[f64]| -> Vec<f64> {
            let m = fmax(v);
            let s: f64 = v.iter().map(|x| (x - m).exp()).sum();
            v.iter().map(|x| (x - m).exp() / s).collect()
        };
        let log_softmax = |v: &[f64]| -> Vec<f64> {
            let m = fmax(v);
            let lse = v.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            v.iter().map(|x| x - m - lse).collect()
        };
        for dtype in FLOATS {
            let shape = [3, 4, 7];
            let a = rand_f(&mut rng, dtype, &shape, 2.0);
            let t = tensor_f(&ctx, dtype, &a);
            for (dim, &n) in shape.iter().enumerate() {
                // The reference along `dim`: move it last, compute per row, move back.
                let mut perm: Vec<usize> = (0..3).filter(|&d| d != dim).collect();
                perm.push(dim);
                let mut inv = [0; 3];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                let moved = a.permute(&perm).contiguous();
                let rows: Vec<f64> = moved.to_vec().chunks(n).flat_map(softmax).collect();
                let sm = Nd::new(rows, &moved.shape).permute(&inv);
                let rows: Vec<f64> = moved.to_vec().chunks(n).flat_map(log_softmax).collect();
                let lsm = Nd::new(rows, &moved.shape).permute(&inv);
                check_f(&t.softmax(dim), dtype, &sm, 1.0, &format!("softmax dim {dim}"));
                check_f(&t.log_softmax(dim), dtype, &lsm, 1.0, &format!("log_softmax dim {dim}"));
                // Rows sum to 1 (summed here in f64).
                let got = read_f(&t.softmax(dim)).reduce(&[dim], false, |v| v.iter().sum::<f64>());
                let ones = got.map(|_| 1.0);
                assert_close(
                    &got.to_vec(),
                    &ones.to_vec(),
                    dtype,
                    (n as f64).sqrt(),
                    &format!("softmax dim {dim} rows"),
                );
            }
            // Large logits do not overflow (the max is subtracted first).
            let big = Nd::new(vec![1000.0, 999.0, -1000.0, 0.0], &[1, 4]);
            let big = big.map(|x| round(dtype, x));
            let want = Nd::new(softmax(&big.to_vec()), &[1, 4]);
            let tb = tensor_f(&ctx, dtype, &big);
            check_f(&tb.softmax(1), dtype, &want, 1.0, "softmax of large logits");
            let want = Nd::new(log_softmax(&big.to_vec()), &[1, 4]);
            check_f(&tb.log_softmax(1), dtype, &want, 1.0, "log_softmax of large logits");
            // Of a transposed view.
            let (tv, hv) = rand_tensor(&ctx, &mut rng, dtype, &[5, 2]);
            let av = hv.f().transpose(0, 1);
            let want = Nd::new(av.to_vec().chunks(5).flat_map(softmax).collect(), &[2, 5]);
            check_f(&tv.t().softmax(1), dtype, &want, 1.0, "softmax of a transposed view");
        }
    });
}

#[test]
fn empty_tensors() {
    each_backend(|| {
        let ctx = dev();
        for dtype in NUMERIC {
            let e = ctx.zeros_dtype([2, 0, 3], dtype);
            // Elementwise and views of an empty tensor are empty.
            let y = (&e + 1).t();
            assert_eq!(y.shape(), &[2, 3, 0]);
            assert_eq!(read_f(&y).numel(), 0, "{dtype}");
            // A sum over an empty dim is 0; over no dims it is the (empty) input.
            let s = e.sum(&[1], false);
            if dtype.is_float() {
                check_f(&s, dtype, &Nd::new(vec![0.0; 6], &[2, 3]), 0.0, "sum over an empty dim");
                let m = e.mean(&[1], true);
                check_f(
                    &m,
                    dtype,
                    &Nd::new(vec![f64::NAN; 6], &[2, 1, 3]),
                    0.0,
                    "mean over an empty dim is NaN",
                );
            } else {
                check_i(&s, dtype, &Nd::new(vec![0; 6], &[2, 3]), "sum over an empty dim");
            }
            // matmul with k = 0 is zeros; with m = 0 it is empty.
            let a = ctx.zeros_dtype([3, 0], dtype);
            let b = ctx.zeros_dtype([0, 4], dtype);
            let mm = a.matmul(&b);
            if dtype.is_float() {
                check_f(&mm, dtype, &Nd::new(vec![0.0; 12], &[3, 4]), 0.0, "matmul with k = 0");
            } else {
                check_i(&mm, dtype, &Nd::new(vec![0; 12], &[3, 4]), "matmul with k = 0");
            }
            assert_eq!(read_f(&b.t().matmul(&ctx.zeros_dtype([0, 2], dtype))).shape, vec![4, 2]);
            // cat with an empty operand, index_select with an empty index.
            let (t, h) = rand_tensor(&ctx, &mut Rng::new(26), dtype, &[2, 3]);
            check(
                &Tensor::cat(&[&t, &ctx.zeros_dtype([0, 3], dtype)], 0),
                dtype,
                &h,
                0.0,
                "cat with an empty operand",
            );
            let none = ctx.tensor(&[0i64; 0], [0]);
            assert_eq!(read_f(&t.index_select(1, &none)).shape, vec![2, 0]);
        }
    });
}

#[test]
fn layer_norm_on_every_float_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(31);
        let eps = 1e-5;
        for dtype in FLOATS {
            for shape in [vec![3, 7], vec![2, 3, 33], vec![1]] {
                let n = *shape.last().expect("rank >= 1");
                let x = rand_f(&mut rng, dtype, &shape, 2.0);
                let w = rand_f(&mut rng, dtype, &[n], 1.0);
                let b = rand_f(&mut rng, dtype, &[n], 1.0);
                let want = layer_norm_ref(&x, &w.to_vec(), &b.to_vec(), eps);
                let got = tensor_f(&ctx, dtype, &x).layer_norm(
                    &tensor_f(&ctx, dtype, &w),
                    &tensor_f(&ctx, dtype, &b),
                    eps,
                );
                // Nine roundings in the dtype, and a division by a small standard
                // deviation for nearly constant rows: a few ulps.
                check_f(&got, dtype, &want, 8.0, &format!("layer_norm {shape:?}"));
            }
        }
        let x = ctx.randn([2, 4]);
        let err = x.layer_norm(&ctx.ones([3]), &ctx.zeros([4]), eps).to_vec::<f32>().unwrap_err();
        assert!(err.to_string().contains("weight has shape [3], but it must be [4]"), "{err}");
    });
}
