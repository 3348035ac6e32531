//! Kernel tests: reductions, matmul, conv, pooling, and the parallel
//! paths large shapes take (indexing: `indexing.rs`).

use super::{assert_close, host, tol, transpose, vals, FLOATS, T};
use crate::ir::*;

/// f64 reference reduction of a row-major array.
fn reduce_ref(v: &[f64], shape: &[usize], dims: &[usize], op: ReduceOp) -> Vec<f64> {
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let n_out: usize = kept.iter().map(|&d| shape[d]).product();
    let mut lanes = vec![Vec::new(); n_out];
    let strides = Shape::new(shape.to_vec()).contiguous_strides();
    for (i, &x) in v.iter().enumerate() {
        let mut o = 0;
        for &d in &kept {
            o = o * shape[d] + (i / strides[d]) % shape[d];
        }
        lanes[o].push(x);
    }
    lanes
        .iter()
        .map(|l| match op {
            ReduceOp::Sum => l.iter().sum(),
            ReduceOp::Mean => l.iter().sum::<f64>() / l.len() as f64,
            ReduceOp::Max => l.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => l.iter().copied().fold(f64::INFINITY, f64::min),
            ReduceOp::ArgMax => {
                l.iter()
                    .enumerate()
                    .fold((0, f64::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
                    .0 as f64
            }
        })
        .collect()
}

#[test]
fn reductions_over_dim_sets_of_permuted_input() {
    let shape = [5usize, 7, 9];
    for d in [DType::F32, DType::F64, DType::BF16, DType::I32] {
        let raw = host(&vals(9 * 7 * 5, 9, -50.0, 50.0), d);
        // Stored as [9,7,5]; permuted to logical [5,7,9].
        let stored = raw.to_f64_vec();
        let logical: Vec<f64> = (0..315).map(|i| stored[(i % 9) * 35 + ((i / 9) % 7) * 5 + i / 63]).collect();
        for dims in [vec![0], vec![1, 2], vec![0, 1, 2], vec![2], vec![]] {
            for &op in ReduceOp::ALL {
                if (op == ReduceOp::Mean && !d.is_float()) || (op == ReduceOp::ArgMax && dims.len() != 1) {
                    continue;
                }
                for keepdim in [false, true] {
                    let mut t = T::new();
                    let x = t.input(raw.clone(), [9, 7, 5]);
                    let p = t.op(Op::Permute(vec![2, 1, 0]), &[x]);
                    let r = t.op(Op::Reduce { op, dims: dims.clone(), keepdim, into: None }, &[p]);
                    let want = reduce_ref(&logical, &shape, &dims, op);
                    let tl = if op == ReduceOp::Sum || op == ReduceOp::Mean { tol(d) } else { 0.0 };
                    assert_close(&t.run1(r), &want, tl, &format!("{op:?} {dims:?} {d}"));
                }
            }
        }
    }
}

#[test]
fn reduction_nan_and_wrapping_rules() {
    let mut t = T::new();
    let x = t.input(HostData::F32(vec![1.0, f32::NAN, 3.0, 3.0, 5.0, 5.0]), [2, 3]);
    let (am, mx) = (
        t.op(Op::Reduce { op: ReduceOp::ArgMax, dims: vec![1], keepdim: false, into: None }, &[x]),
        t.op(Op::Reduce { op: ReduceOp::Max, dims: vec![1], keepdim: true, into: None }, &[x]),
    );
    let out = t.run(&[am, mx]).unwrap();
    assert_eq!(out[0], HostData::I64(vec![1, 1]));
    assert_close(&out[1], &[f64::NAN, 5.0], 0.0, "max nan");
    let mut t = T::new();
    let x = t.input(HostData::U8(vec![200, 100, 7]), [3]);
    let s = t.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false, into: None }, &[x]);
    assert_eq!(t.run1(s), HostData::U8(vec![51]));
}

/// f64 batched matmul of row-major arrays.
fn matmul_ref(a: &[f64], b: &[f64], nb: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; nb * m * n];
    for bi in 0..nb {
        for i in 0..m {
            for j in 0..n {
                c[(bi * m + i) * n + j] =
                    (0..k).map(|q| a[(bi * m + i) * k + q] * b[(bi * k + q) * n + j]).sum();
            }
        }
    }
    c
}

#[test]
fn matmul_transposed_and_expanded_operands() {
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::U8, DType::I64] {
        for (m, k, n) in [(7, 129, 5), (1, 7, 1), (33, 65, 70)] {
            let (lo, hi) = if d.is_float() { (-1.0, 1.0) } else { (0.0, 5.0) };
            let a = host(&vals(m * k, 10, lo, hi), d);
            let bt = host(&vals(n * k, 11, lo, hi), d);
            let (av, btv) = (a.to_f64_vec(), bt.to_f64_vec());
            let bv = transpose(&btv, n, k);
            let mut t = T::new();
            // A: [m,k] expanded to a stride-0 batch of 3; B: stored [3? no: n,k] transposed.
            let x = t.input(a, [1, m, k]);
            let xe = t.op(Op::Expand(Shape::new([3, m, k])), &[x]);
            let y = t.input(bt, [1, n, k]);
            let yt = t.op(Op::Permute(vec![0, 2, 1]), &[y]);
            let ye = t.op(Op::Expand(Shape::new([3, k, n])), &[yt]);
            let z = t.op(Op::MatMul, &[xe, ye]);
            let one = matmul_ref(&av, &bv, 1, m, k, n);
            let mut want: Vec<f64> = [one.clone(), one.clone(), one].concat();
            if !d.is_float() {
                want.iter_mut().for_each(|v| *v = Scalar::Int(*v as i64).cast(d).as_f64());
            }
            let tl = if d.is_float() { tol(d) * (k as f64).sqrt() * 4.0 } else { 0.0 };
            assert_close(&t.run1(z), &want, tl, &format!("matmul {d} {m}x{k}x{n}"));
        }
    }
}

/// A batch times one weight (`[nb, m, k] x [k, n]` expanded over the
/// batch, as `x.matmul(&w.t())` records a linear layer) runs as one GEMM
/// of `nb * m` rows (`Problem::batch_as_rows`): weights row-major and
/// transposed, A's rows a slice of wider rows, one row per item (m = 1),
/// few rows in all (the GEMV path), more rows than one tile; f32 (the
/// packed GEMM) and f64 (matrixmultiply), against an f64 reference.
#[test]
fn a_batch_times_one_weight_matches_the_reference() {
    let shapes = [(8, 24, 65, 70), (5, 1, 33, 17), (2, 2, 19, 300), (3, 150, 40, 35)];
    for d in [DType::F32, DType::F64] {
        for (case, &(nb, m, k, n)) in shapes.iter().enumerate() {
            for transposed in [false, true] {
                let seed = 40 + 2 * case as u64 + transposed as u64;
                // A is columns 1..k+1 of rows k + 3 wide.
                let wide = k + 3;
                let a = host(&vals(nb * m * wide, seed, -1.0, 1.0), d);
                let w = host(&vals(k * n, seed + 100, -1.0, 1.0), d);
                let (av, wv) = (a.to_f64_vec(), w.to_f64_vec());
                let mut t = T::new();
                let x = t.input(a, [nb, m, wide]);
                let xs = t.op(Op::Slice { dim: 2, start: 1, step: 1, len: k }, &[x]);
                let (y, bv) = if transposed {
                    let y = t.input(w, [n, k]);
                    (t.op(Op::Permute(vec![1, 0]), &[y]), transpose(&wv, n, k))
                } else {
                    (t.input(w, [k, n]), wv)
                };
                let ye = t.op(Op::Expand(Shape::new([nb, k, n])), &[y]);
                let z = t.op(Op::MatMul, &[xs, ye]);
                let a_dense: Vec<f64> = (0..nb * m * k).map(|e| av[(e / k) * wide + 1 + e % k]).collect();
                let want = matmul_ref(&a_dense, &bv.repeat(nb), nb, m, k, n);
                let what = format!("{d} {nb}x{m}x{k}x{n} transposed {transposed}");
                assert_close(&t.run1(z), &want, tol(d) * (k as f64).sqrt() * 4.0, &what);
            }
        }
    }
}

/// Which batched products `Problem::batch_as_rows` folds into one GEMM:
/// only those whose B is one matrix and whose A's items follow each other
/// `m` rows apart.
#[test]
fn batch_as_rows_folds_only_one_weight_over_evenly_spaced_items() {
    use crate::backends::cpu::matmul::Problem;
    use crate::backends::Layout;
    let lay = |shape: [usize; 3], strides: [usize; 3], offset| Layout {
        shape: Shape::new(shape),
        strides: strides.to_vec(),
        offset,
    };
    // A [6, 5] weight transposed and expanded over 4 items.
    let w = lay([4, 5, 6], [0, 1, 5], 0);
    let rows = |a: Layout, b: &Layout| Problem::new(&a, b).expect("problem").batch_as_rows();
    assert_eq!(rows(lay([4, 3, 5], [15, 5, 1], 0), &w), Some(5), "dense");
    assert_eq!(rows(lay([4, 3, 5], [24, 8, 1], 2), &w), Some(8), "a slice of wider rows");
    assert_eq!(rows(lay([4, 1, 5], [7, 99, 1], 0), &w), Some(7), "one row per item");
    assert_eq!(rows(lay([4, 3, 5], [5, 20, 1], 0), &w), None, "items interleaved (a permute)");
    assert_eq!(rows(lay([4, 3, 5], [0, 5, 1], 0), &w), None, "A expanded");
    assert_eq!(rows(lay([4, 3, 5], [16, 5, 1], 0), &w), None, "a gap between items");
    assert_eq!(
        rows(lay([4, 3, 5], [15, 5, 1], 0), &lay([4, 5, 6], [30, 1, 5], 0)),
        None,
        "a weight per item"
    );
    assert_eq!(rows(lay([1, 3, 5], [15, 5, 1], 0), &lay([1, 5, 6], [0, 1, 5], 0)), None, "one item");
}

struct ConvCase {
    x: [usize; 4],
    w: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

/// Direct f64 convolution of row-major NCHW / OIHW arrays.
fn conv_ref(k: &ConvCase, xv: &[f64], wv: &[f64]) -> Vec<f64> {
    let [n, c, h, w] = k.x;
    let [o, cg, kh, kw] = k.w;
    let oh = window_out(h, kh, k.stride[0], k.padding[0], k.dilation[0]).unwrap();
    let ow = window_out(w, kw, k.stride[1], k.padding[1], k.dilation[1]).unwrap();
    let mut want = vec![0.0; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            let gi = oc / (o / k.groups);
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = 0.0;
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy =
                                    (oy * k.stride[0] + ky * k.dilation[0]) as isize - k.padding[0] as isize;
                                let ix =
                                    (ox * k.stride[1] + kx * k.dilation[1]) as isize - k.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    continue;
                                }
                                let xc = gi * cg + ci;
                                s += xv[((b * c + xc) * h + iy as usize) * w + ix as usize]
                                    * wv[((oc * cg + ci) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    want[((b * o + oc) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    want
}

fn check_conv(k: &ConvCase, d: DType) {
    let x = host(&vals(k.x.iter().product(), 12, -1.0, 1.0), d);
    let wt = host(&vals(k.w.iter().product(), 13, -1.0, 1.0), d);
    let want = conv_ref(k, &x.to_f64_vec(), &wt.to_f64_vec());
    let mut t = T::new();
    let xi = t.input(x, k.x);
    let wi = t.input(wt, k.w);
    let op = Op::Conv2d { stride: k.stride, padding: k.padding, dilation: k.dilation, groups: k.groups };
    let y = t.op(op, &[xi, wi]);
    let fan_in = (k.w[1] * k.w[2] * k.w[3]) as f64;
    assert_close(&t.run1(y), &want, tol(d) * fan_in.sqrt() * 4.0, &format!("conv2d {d} {:?}", k.x));
}

#[test]
fn conv2d_groups_stride_padding_dilation() {
    let k = ConvCase {
        x: [2, 4, 9, 7],
        w: [6, 2, 3, 2],
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 2],
        groups: 2,
    };
    for d in FLOATS {
        check_conv(&k, d);
    }
}

/// A batch's convolution is each image's alone, bit for bit: one
/// product per batch of images (their column matrices side by side)
/// against one per image, whatever the stride, padding (wider than the
/// window, as a convolution's input gradient pads), dilation and groups;
/// the last case's column matrices are over the budget of one product,
/// so its images run as products of their own.
#[test]
fn a_batched_convolution_is_each_image_alone() {
    let cases = [
        ConvCase {
            x: [5, 4, 9, 7],
            w: [6, 2, 3, 2],
            stride: [2, 1],
            padding: [1, 1],
            dilation: [1, 2],
            groups: 2,
        },
        ConvCase {
            x: [6, 3, 4, 4],
            w: [5, 3, 3, 3],
            stride: [1, 2],
            padding: [2, 2],
            dilation: [1, 1],
            groups: 1,
        },
        ConvCase {
            x: [3, 2, 8, 8],
            w: [2, 2, 8, 8],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        },
        ConvCase {
            x: [2, 16, 128, 128],
            w: [8, 16, 3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        },
    ];
    for (i, k) in cases.iter().enumerate() {
        for d in if i < 3 { &FLOATS[..] } else { &[DType::F32][..] } {
            let d = *d;
            let xv = vals(k.x.iter().product(), 21, -1.0, 1.0);
            let wt = host(&vals(k.w.iter().product(), 22, -1.0, 1.0), d);
            let op =
                Op::Conv2d { stride: k.stride, padding: k.padding, dilation: k.dilation, groups: k.groups };
            let conv = |images: &[f64], n: usize| {
                let mut t = T::new();
                let xi = t.input(host(images, d), [n, k.x[1], k.x[2], k.x[3]]);
                let wi = t.input(wt.clone(), k.w);
                let y = t.op(op.clone(), &[xi, wi]);
                t.run1(y).to_f64_vec()
            };
            let all = conv(&xv, k.x[0]);
            let per = all.len() / k.x[0];
            let image = xv.len() / k.x[0];
            for b in 0..k.x[0] {
                let one = conv(&xv[b * image..][..image], 1);
                let same = one.iter().zip(&all[b * per..][..per]).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "case {i} {d}: image {b} differs from the batch's");
            }
        }
    }
}

#[test]
fn large_shapes_take_the_parallel_paths() {
    // conv: parallel over (batch, group) and a single-item conv with a parallel GEMM.
    let big = ConvCase {
        x: [2, 4, 32, 32],
        w: [8, 2, 3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        groups: 2,
    };
    check_conv(&big, DType::F32);
    let one = ConvCase {
        x: [1, 16, 40, 40],
        w: [32, 16, 3, 3],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
    };
    check_conv(&one, DType::F32);
    // matmul: one GEMM large enough for rayon; integers row-parallel.
    for d in [DType::F32, DType::I64] {
        let (m, k, n) = (70, 80, 90);
        let (lo, hi) = if d.is_float() { (-1.0, 1.0) } else { (0.0, 9.0) };
        let (a, b) = (host(&vals(m * k, 16, lo, hi), d), host(&vals(k * n, 17, lo, hi), d));
        let want = matmul_ref(&a.to_f64_vec(), &b.to_f64_vec(), 1, m, k, n);
        let mut t = T::new();
        let (x, y) = (t.input(a, [m, k]), t.input(b, [k, n]));
        let z = t.op(Op::MatMul, &[x, y]);
        assert_close(&t.run1(z), &want, tol(d) * 40.0, &format!("matmul {d}"));
    }
    // reductions: few long lanes are cut into fixed segments reduced in parallel.
    let n = 70_001;
    let v = vals(n, 19, -1.0, 1.0);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax] {
        let mut t = T::new();
        let x = t.input(host(&v, DType::F64), [1, n]);
        let red = t.op(Op::Reduce { op, dims: vec![1], keepdim: true, into: None }, &[x]);
        assert_close(&t.run1(red), &reduce_ref(&v, &[1, n], &[1], op), 1e-12, &format!("long {op:?}"));
    }
    let mut with_nan = v.clone();
    with_nan[40_000] = f64::NAN;
    with_nan[50_000] = f64::NAN;
    let mut t = T::new();
    let x = t.input(host(&with_nan, DType::F32), [n]);
    let am = t.op(Op::Reduce { op: ReduceOp::ArgMax, dims: vec![0], keepdim: false, into: None }, &[x]);
    let mn = t.op(Op::Reduce { op: ReduceOp::Min, dims: vec![0], keepdim: false, into: None }, &[x]);
    let out = t.run(&[am, mn]).unwrap();
    assert_eq!(out[0], HostData::I64(vec![40_000]));
    assert_close(&out[1], &[f64::NAN], 0.0, "long min with nan");
    let mut t = T::new();
    let x = t.input(HostData::I32(vec![i32::MAX; n]), [n]);
    let s = t.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false, into: None }, &[x]);
    assert_eq!(t.run1(s), HostData::I32(vec![(i32::MAX as i64 * n as i64) as i32]));
    // reductions: many lanes in parallel chunks, over either dim of a transposed input.
    let (r, c) = (300, 257);
    let v = vals(r * c, 18, -1.0, 1.0);
    let vt = transpose(&v, r, c);
    for dims in [vec![0], vec![1]] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::ArgMax] {
            let mut t = T::new();
            let x = t.input(host(&v, DType::F64), [r, c]);
            let p = t.op(Op::Permute(vec![1, 0]), &[x]);
            let red = t.op(Op::Reduce { op, dims: dims.clone(), keepdim: false, into: None }, &[p]);
            let want = reduce_ref(&vt, &[c, r], &dims, op);
            assert_close(&t.run1(red), &want, 1e-12, &format!("{op:?} {dims:?}"));
        }
    }
}

#[test]
fn pooling_padding_never_wins_and_avg_counts_pad() {
    let (n, c, h, w) = (1, 2, 5, 4);
    let xv = vals(n * c * h * w, 14, -3.0, -1.0); // all negative: padding zeros must not win max
    for kind in [PoolKind::Max, PoolKind::Avg] {
        let mut t = T::new();
        let x = t.input(host(&xv, DType::F64), [n, c, h, w]);
        let y = t.op(Op::Pool2d { kind, kernel: [3, 2], stride: [2, 1], padding: [1, 1] }, &[x]);
        let (oh, ow) = (window_out(h, 3, 2, 1, 1).unwrap(), window_out(w, 2, 1, 1, 1).unwrap());
        let mut want = Vec::new();
        for p in 0..n * c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut vs = Vec::new();
                    for ky in 0..3 {
                        for kx in 0..2 {
                            let (iy, ix) = ((oy * 2 + ky) as isize - 1, (ox + kx) as isize - 1);
                            if iy >= 0 && ix >= 0 && iy < h as isize && ix < w as isize {
                                vs.push(xv[p * h * w + iy as usize * w + ix as usize]);
                            }
                        }
                    }
                    want.push(match kind {
                        PoolKind::Max => vs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                        PoolKind::Avg => vs.iter().sum::<f64>() / 6.0,
                    });
                }
            }
        }
        assert_close(&t.run1(y), &want, 1e-12, &format!("{kind:?}"));
    }
}

/// The f32 unary kernels (contiguous and strided: the AVX2+FMA copies
/// where the CPU has them) give exactly eval's scalar result, which is
/// what constant folding computes: that code is compiled for baseline
/// x86-64, where `exp`'s `mul_add` is libm's `fmaf`, so this also shows
/// the FMA instruction and the plain loops agree to the bit.
#[test]
fn f32_unary_kernels_match_scalar_eval_bit_for_bit() {
    let mut xs: Vec<f32> =
        (0..0x7f80_0000u32).step_by(49_999).map(f32::from_bits).flat_map(|v| [v, -v]).collect();
    xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.722_84, -103.9, 0.625, 9.0]);
    xs.resize(2 * 33 * 1024, 0.5); // past the parallel threshold
    let n = xs.len();
    for &op in UnaryOp::ALL {
        let want: Vec<u32> = xs
            .iter()
            .map(|&v| (eval::unary(op, DType::F32, Scalar::Float(v as f64)).as_f64() as f32).to_bits())
            .collect();
        for strided in [false, true] {
            let mut t = T::new();
            let i = if strided {
                // stored [2, n/2] and transposed back: a non-contiguous view
                let half = n / 2;
                let stored: Vec<f32> = (0..n).map(|k| xs[(k % half) * 2 + k / half]).collect();
                t.input(HostData::F32(stored), [2, half])
            } else {
                t.input(HostData::F32(xs.clone()), [n])
            };
            let y = if strided {
                let p = t.op(Op::Permute(vec![1, 0]), &[i]);
                let y = t.op(Op::Unary(op), &[p]);
                t.op(Op::Reshape(Shape::new([n])), &[y])
            } else {
                t.op(Op::Unary(op), &[i])
            };
            let HostData::F32(got) = t.run1(y) else { panic!("not f32") };
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == *w || (g.is_nan() && f32::from_bits(*w).is_nan());
                assert!(same, "{op:?} strided={strided} at {:e}: {g:e} vs {:e}", xs[k], f32::from_bits(*w));
            }
        }
    }
}

/// A permuted view made dense (a reshape that cannot be a view): rows of
/// a contiguous last dimension are copied as runs, chunks of the parallel
/// copy starting and ending inside rows (34,320 elements in chunks of
/// 16,384, rows of 40); a short last dimension and a strided one take
/// the element-by-element path. Every element lands where the permutation
/// says.
#[test]
fn permuted_views_copy_as_runs_of_their_last_dimension() {
    for (shape, perm) in [
        ([6, 13, 11, 40], [0, 2, 1, 3]),
        ([6, 13, 11, 40], [2, 0, 1, 3]),
        ([3, 4, 5, 6], [0, 2, 1, 3]),
        ([6, 13, 11, 40], [0, 1, 3, 2]),
    ] {
        let n: usize = shape.iter().product();
        let mut t = T::new();
        let i = t.input(HostData::I64((0..n as i64).collect()), shape);
        let p = t.op(Op::Permute(perm.to_vec()), &[i]);
        let y = t.op(Op::Reshape(Shape::new([n])), &[p]);
        let HostData::I64(got) = t.run1(y) else { panic!("not i64") };
        let pshape: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
        let strides = [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1];
        let want: Vec<i64> = (0..n)
            .map(|mut e| {
                let mut at = 0;
                for d in (0..4).rev() {
                    at += (e % pshape[d]) * strides[perm[d]];
                    e /= pshape[d];
                }
                at as i64
            })
            .collect();
        assert_eq!(got, want, "{shape:?} permuted {perm:?}");
    }
}
