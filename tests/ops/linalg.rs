//! matmul (batched, broadcast batch dims, 1-D operands) on floats and ints;
//! conv2d with stride, padding, dilation and groups; max and average pooling.

use crate::reference::*;
use kiln::prelude::{DType, Tensor};

/// `torch.matmul` on host arrays: 1-D operands promoted and the added dim removed.
fn matmul_host<T: Copy>(a: &Nd<T>, b: &Nd<T>, zero: T, acc: impl FnMut(T, T, T) -> T) -> Nd<T> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let a2 = if ra == 1 { a.reshape(&[1, a.shape[0]]) } else { a.clone() };
    let b2 = if rb == 1 { b.reshape(&[b.shape[0], 1]) } else { b.clone() };
    let out = matmul_ref(&a2, &b2, zero, acc);
    let mut dims = out.shape.clone();
    if rb == 1 {
        dims.pop();
    }
    if ra == 1 {
        let at = dims.len() - if rb == 1 { 1 } else { 2 };
        dims.remove(at);
    }
    out.reshape(&dims)
}

const MATMUL_SHAPES: [(&[usize], &[usize]); 11] = [
    (&[7, 5], &[5, 3]),
    (&[1, 1], &[1, 1]),
    (&[3, 129], &[129, 2]),
    (&[2, 3, 4], &[2, 4, 5]),
    (&[2, 1, 3, 4], &[5, 4, 2]),
    (&[3, 4], &[2, 4, 6]),
    (&[4], &[4, 3]),
    (&[3, 4], &[4]),
    (&[4], &[4]),
    (&[4], &[2, 4, 3]),
    (&[2, 3, 4], &[4]),
];

#[test]
fn matmul_on_float_dtypes() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(30);
        for dtype in FLOATS {
            for (sa, sb) in MATMUL_SHAPES {
                let a = rand_f(&mut rng, dtype, sa, 1.0);
                let b = rand_f(&mut rng, dtype, sb, 1.0);
                let got = tensor_f(&ctx, dtype, &a).matmul(&tensor_f(&ctx, dtype, &b));
                let want = matmul_host(&a, &b, 0.0, |s, x, y| s + x * y);
                let k = sa[sa.len() - 1] as f64;
                let scale = k.sqrt() * max_abs(&a) * max_abs(&b);
                check_f(&got, dtype, &want, scale, &format!("matmul {sa:?} x {sb:?}"));
            }
        }
    });
}

/// `(a @ b) as f32` of halves, as autocast writes a weight gradient. CUDA
/// stores the GEMM's f32 accumulator (`Gemm::out_dtype`), so its result
/// is within f32 roundings of the exact product; the CPU rounds the
/// product to the half type first, as the graph reads, so it is within
/// half roundings. Fails on CUDA if the widening GEMM is not taken.
#[test]
fn a_half_product_widened_to_f32() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(32);
        for dtype in [DType::BF16, DType::F16] {
            for (sa, sb) in [
                (&[7usize, 5][..], &[5usize, 3][..]),
                (&[3, 129], &[129, 2]),
                (&[2, 3, 4], &[2, 4, 5]),
                (&[3, 0], &[0, 2]),
            ] {
                let a = rand_f(&mut rng, dtype, sa, 1.0);
                let b = rand_f(&mut rng, dtype, sb, 1.0);
                let got = tensor_f(&ctx, dtype, &a).matmul(&tensor_f(&ctx, dtype, &b)).cast(DType::F32);
                let want = matmul_host(&a, &b, 0.0, |s, x, y| s + x * y);
                let scale = (sa[sa.len() - 1] as f64).sqrt() * max_abs(&a) * max_abs(&b);
                let what = format!("({dtype} {sa:?} x {sb:?}) as f32 on {}", ctx.device());
                if ctx.device().starts_with("cuda") {
                    check_f(&got, DType::F32, &want, scale, &what);
                } else {
                    // Half values in f32: back to the half type exactly.
                    check_f(&got.cast(dtype), dtype, &want, scale, &what);
                }
            }
        }
    });
}

#[test]
fn matmul_on_integer_dtypes_wraps() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(31);
        for dtype in INTS {
            for (sa, sb) in MATMUL_SHAPES {
                let a = rand_i(&mut rng, dtype, sa);
                let b = rand_i(&mut rng, dtype, sb);
                let got = tensor_i(&ctx, dtype, &a).matmul(&tensor_i(&ctx, dtype, &b));
                let want = matmul_host(&a, &b, 0i64, |s, x, y| s.wrapping_add(x.wrapping_mul(y)));
                check_i(&got, dtype, &want, &format!("matmul {sa:?} x {sb:?}"));
            }
        }
    });
}

#[test]
fn matmul_of_non_contiguous_operands() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(32);
        for dtype in NUMERIC {
            let (ta, ha) = rand_tensor(&ctx, &mut rng, dtype, &[5, 7]);
            let (tb, hb) = rand_tensor(&ctx, &mut rng, dtype, &[2, 3, 10]);
            // a.t(): [7,5]; b permuted and strided: [2, 10, 3] -> slice -> [2, 5, 3]
            let got = ta.t().matmul(&tb.permute(&[0, 2, 1]).slice(1, 0, 10, 2));
            // Also an expanded (stride-0) batch operand.
            let (tc, hc) = rand_tensor(&ctx, &mut rng, dtype, &[1, 8, 4]);
            let got2 = ta.matmul(&tc.broadcast_to([3, 8, 4]).narrow(1, 1, 7));
            match (&ha, &hb, &hc) {
                (Host::F(a), Host::F(b), Host::F(c)) => {
                    let bv = b.permute(&[0, 2, 1]).slice(1, 0, 2, 5);
                    let want = matmul_host(&a.transpose(0, 1), &bv, 0.0, |s, x, y| s + x * y);
                    let scale = 5f64.sqrt() * max_abs(a) * max_abs(b);
                    check_f(&got, dtype, &want, scale, "matmul of a.t() and a permuted strided batch");
                    let cv = c.expand(&[3, 8, 4]).slice(1, 1, 1, 7);
                    let want2 = matmul_host(a, &cv, 0.0, |s, x, y| s + x * y);
                    let scale = 7f64.sqrt() * max_abs(a) * max_abs(c);
                    check_f(&got2, dtype, &want2, scale, "matmul with an expanded batch operand");
                }
                (Host::I(a), Host::I(b), Host::I(c)) => {
                    let f = |s: i64, x: i64, y: i64| s.wrapping_add(x.wrapping_mul(y));
                    let bv = b.permute(&[0, 2, 1]).slice(1, 0, 2, 5);
                    check_i(&got, dtype, &matmul_host(&a.transpose(0, 1), &bv, 0, f), "matmul of views");
                    let cv = c.expand(&[3, 8, 4]).slice(1, 1, 1, 7);
                    check_i(
                        &got2,
                        dtype,
                        &matmul_host(a, &cv, 0, f),
                        "matmul with an expanded batch operand",
                    );
                }
                _ => unreachable!(),
            }
        }
    });
}

/// A weight read again by a product as a linear layer reads it
/// (`x @ w.t()`): from the second call on, the CPU keeps its packing
/// (`sgemm/cache.rs`, keyed by the bytes' identity; products of 2^20
/// multiply-adds and up, as this one). Every call gives the
/// first call's bits, and after the weight is written in place
/// (`write_at`) or assigned, the product reads the new values.
#[test]
fn a_weight_read_again_keeps_its_bits_and_sees_its_writes() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(35);
        let dt = DType::F32;
        let a = rand_f(&mut rng, dt, &[130, 300], 1.0);
        let w0 = rand_f(&mut rng, dt, &[40, 300], 1.0);
        let x = tensor_f(&ctx, dt, &a);
        let w = ctx.variable("w", tensor_f(&ctx, dt, &w0)).expect("variable");
        let product = || x.matmul(&w.t());
        let bits =
            |t: Tensor| t.to_vec::<f32>().expect("product").iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let check = |wh: &Nd<f64>, what: &str| {
            let want = matmul_host(&a, &wh.transpose(0, 1), 0.0, |s, x, y| s + x * y);
            let scale = 300f64.sqrt() * max_abs(&a) * max_abs(wh);
            for call in 0..3 {
                check_f(&product(), dt, &want, scale, &format!("{what}, call {call}"));
            }
        };
        let first = bits(product());
        for call in 1..4 {
            assert_eq!(bits(product()), first, "call {call} changed bits");
        }
        check(&w0, "the weight as created");
        let row = rand_f(&mut rng, dt, &[1, 300], 1.0);
        w.write_at(0, 7, &tensor_f(&ctx, dt, &row)).expect("write");
        let w1 = Nd::from_fn(&[40, 300], |i| if i[0] == 7 { row.get(&[0, i[1]]) } else { w0.get(i) });
        check(&w1, "row 7 written");
        let w2 = rand_f(&mut rng, dt, &[40, 300], 1.0);
        w.assign(tensor_f(&ctx, dt, &w2)).expect("assign");
        check(&w2, "assigned");
    });
}

/// PyTorch conv2d (cross-correlation), f64.
fn conv2d_ref(x: &Nd<f64>, w: &Nd<f64>, stride: usize, pad: usize, dil: usize, groups: usize) -> Nd<f64> {
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (o, cpg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    assert_eq!(cpg * groups, c);
    let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let ow = (wd + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let opg = o / groups;
    Nd::from_fn(&[n, o, oh, ow], |i| {
        let (b, oc, y, xx) = (i[0], i[1], i[2], i[3]);
        let g = oc / opg;
        let mut s = 0.0;
        for ci in 0..cpg {
            for ky in 0..kh {
                for kx in 0..kw {
                    let iy = (y * stride + ky * dil) as isize - pad as isize;
                    let ix = (xx * stride + kx * dil) as isize - pad as isize;
                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                        continue;
                    }
                    s += x.get(&[b, g * cpg + ci, iy as usize, ix as usize]) * w.get(&[oc, ci, ky, kx]);
                }
            }
        }
        s
    })
}

#[test]
fn conv2d_on_float_dtypes() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(33);
        // (input NCHW, weight OIHW, stride, padding, dilation, groups)
        type ConvCase = ([usize; 4], [usize; 4], usize, usize, usize, usize);
        let cases: [ConvCase; 7] = [
            ([2, 3, 7, 6], [4, 3, 3, 3], 1, 0, 1, 1),
            ([2, 3, 7, 6], [4, 3, 3, 3], 2, 1, 1, 1),
            ([1, 2, 9, 8], [3, 2, 3, 2], 1, 2, 2, 1),
            ([2, 6, 5, 5], [6, 2, 3, 3], 1, 1, 1, 3),
            ([1, 4, 5, 7], [4, 1, 3, 3], 2, 1, 1, 4),
            ([1, 3, 4, 4], [5, 3, 1, 1], 1, 0, 1, 1),
            ([1, 1, 1, 1], [1, 1, 1, 1], 1, 0, 1, 1),
        ];
        for dtype in FLOATS {
            for (xs, ws, stride, pad, dil, groups) in cases {
                let x = rand_f(&mut rng, dtype, &xs, 1.0);
                let w = rand_f(&mut rng, dtype, &ws, 1.0);
                let got =
                    tensor_f(&ctx, dtype, &x).conv2d(&tensor_f(&ctx, dtype, &w), stride, pad, dil, groups);
                let want = conv2d_ref(&x, &w, stride, pad, dil, groups);
                let k = (ws[1] * ws[2] * ws[3]) as f64;
                let scale = k.sqrt() * max_abs(&x) * max_abs(&w);
                let what =
                    format!("conv2d {xs:?} * {ws:?} stride {stride} pad {pad} dil {dil} groups {groups}");
                check_f(&got, dtype, &want, scale, &what);
            }
            // A non-contiguous (NHWC permuted to NCHW) input and a sliced weight.
            let x = rand_f(&mut rng, dtype, &[2, 6, 5, 3], 1.0);
            let w = rand_f(&mut rng, dtype, &[8, 3, 3, 3], 1.0);
            let tx = tensor_f(&ctx, dtype, &x).permute(&[0, 3, 1, 2]);
            let tw = tensor_f(&ctx, dtype, &w).slice(0, 0, 8, 2);
            let want = conv2d_ref(&x.permute(&[0, 3, 1, 2]), &w.slice(0, 0, 2, 4), 1, 1, 1, 1);
            let scale = 27f64.sqrt() * max_abs(&x) * max_abs(&w);
            check_f(&tx.conv2d(&tw, 1, 1, 1, 1), dtype, &want, scale, "conv2d of views");
        }
    });
}

fn pool_ref(x: &Nd<f64>, max: bool, k: usize, stride: usize, pad: usize) -> Nd<f64> {
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let oh = (h + 2 * pad - k) / stride + 1;
    let ow = (w + 2 * pad - k) / stride + 1;
    Nd::from_fn(&[n, c, oh, ow], |i| {
        let mut best = f64::NEG_INFINITY;
        let mut sum = 0.0;
        for ky in 0..k {
            for kx in 0..k {
                let iy = (i[2] * stride + ky) as isize - pad as isize;
                let ix = (i[3] * stride + kx) as isize - pad as isize;
                if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                    continue; // padding: never the max, zero in the sum
                }
                let v = x.get(&[i[0], i[1], iy as usize, ix as usize]);
                best = if best.is_nan() || v.is_nan() { f64::NAN } else { best.max(v) };
                sum += v;
            }
        }
        if max {
            best
        } else {
            sum / (k * k) as f64
        }
    })
}

#[test]
fn max_and_avg_pool_on_float_dtypes() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(34);
        let cases: [([usize; 4], usize, usize, usize); 5] = [
            ([2, 3, 8, 6], 2, 2, 0),
            ([1, 2, 7, 7], 3, 1, 1),
            ([2, 1, 7, 5], 3, 2, 1),
            ([1, 1, 5, 5], 2, 1, 1),
            ([1, 3, 1, 1], 1, 1, 0),
        ];
        for dtype in FLOATS {
            for (xs, k, stride, pad) in cases {
                let x = rand_f(&mut rng, dtype, &xs, 2.0);
                let t = tensor_f(&ctx, dtype, &x);
                let what = |op: &str| format!("{op} {xs:?} kernel {k} stride {stride} pad {pad}");
                check_f(
                    &t.max_pool2d(k, stride, pad),
                    dtype,
                    &pool_ref(&x, true, k, stride, pad),
                    0.0,
                    &what("max_pool2d"),
                );
                let scale = max_abs(&x);
                check_f(
                    &t.avg_pool2d(k, stride, pad),
                    dtype,
                    &pool_ref(&x, false, k, stride, pad),
                    scale,
                    &what("avg_pool2d"),
                );
            }
            // All-negative input: a zero from padding must never win the max.
            let x = rand_pos(&mut rng, dtype, &[1, 2, 4, 4]).map(|v| -v);
            let t = tensor_f(&ctx, dtype, &x);
            check_f(
                &t.max_pool2d(3, 2, 1),
                dtype,
                &pool_ref(&x, true, 3, 2, 1),
                0.0,
                "max_pool2d: padding never wins",
            );
            check_f(
                &t.avg_pool2d(3, 2, 1),
                dtype,
                &pool_ref(&x, false, 3, 2, 1),
                max_abs(&x),
                "avg_pool2d counts padding",
            );
            // Of a non-contiguous view.
            let y = rand_f(&mut rng, dtype, &[1, 6, 6, 2], 2.0);
            let ty = tensor_f(&ctx, dtype, &y).permute(&[0, 3, 2, 1]);
            let yv = y.permute(&[0, 3, 2, 1]);
            check_f(
                &ty.max_pool2d(2, 2, 0),
                dtype,
                &pool_ref(&yv, true, 2, 2, 0),
                0.0,
                "max_pool2d of a view",
            );
            check_f(
                &ty.avg_pool2d(2, 2, 1),
                dtype,
                &pool_ref(&yv, false, 2, 2, 1),
                max_abs(&y),
                "avg_pool2d of a view",
            );
        }
    });
}
