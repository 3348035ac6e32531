//! `max_pool2d_grad` (the gradient `backward` records for `max_pool2d`)
//! against f64, on every backend: windows that tile, overlap and skip
//! rows, ties, NaN and infinities in the input and in the gradient, views,
//! and the gradient reached through `backward`.
//!
//! The reference routes each window's gradient as PyTorch's
//! `max_pool2d_with_indices_backward` does (its CPU and CUDA kernels move
//! the index on `v > best || isnan(v)` over the window in row-major
//! order): the first of tied maxima, the last NaN of a window holding any,
//! the first element inside the input of a window of `-inf`; padding is
//! never a candidate. Overlapping windows add.

use crate::reference::*;
use kiln::prelude::*;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// The gradient of `x` (NCHW) given `g`, the gradient of
/// `max_pool2d(x, k, stride, pad)`, in f64 (module docs).
fn grad_ref(x: &Nd<f64>, g: &Nd<f64>, k: usize, stride: usize, pad: usize) -> Nd<f64> {
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (oh, ow) = (g.shape[2], g.shape[3]);
    let mut out = vec![0.0; n * c * h * w];
    for b in 0..n {
        for ch in 0..c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut best, mut at) = (f64::NEG_INFINITY, None);
                    for ky in 0..k {
                        for kx in 0..k {
                            let iy = (oy * stride + ky) as isize - pad as isize;
                            let ix = (ox * stride + kx) as isize - pad as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            let (iy, ix) = (iy as usize, ix as usize);
                            let v = x.get(&[b, ch, iy, ix]);
                            if at.is_none() {
                                at = Some((iy, ix));
                            }
                            if v > best || v.is_nan() {
                                (best, at) = (v, Some((iy, ix)));
                            }
                        }
                    }
                    let (iy, ix) = at.expect("every window holds an input element");
                    out[((b * c + ch) * h + iy) * w + ix] += g.get(&[b, ch, oy, ox]);
                }
            }
        }
    }
    Nd::new(out, &x.shape)
}

/// The pooled size of `size` for a square window.
fn pooled(size: usize, k: usize, stride: usize, pad: usize) -> usize {
    (size + 2 * pad - k) / stride + 1
}

/// `(x shape, kernel, stride, padding)`: tiling 2x2 windows (the digits
/// CNN's), overlapping 3x3 ones with padding, stride 1, a stride past the
/// window (rows no window reads), and a 1x1 plane.
const CASES: [([usize; 4], usize, usize, usize); 6] = [
    ([2, 3, 8, 6], 2, 2, 0),
    ([1, 2, 7, 7], 3, 1, 1),
    ([2, 1, 7, 5], 3, 2, 1),
    ([1, 1, 5, 5], 2, 1, 1),
    ([1, 2, 7, 8], 2, 3, 0),
    ([1, 3, 1, 1], 1, 1, 0),
];

#[test]
fn max_pool2d_grad_matches_f64_with_ties() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3801);
        for dtype in FLOATS {
            for (xs, k, stride, pad) in CASES {
                let gs = [xs[0], xs[1], pooled(xs[2], k, stride, pad), pooled(xs[3], k, stride, pad)];
                // Values from a few integers: most windows hold ties.
                let x = rand_small_i(&mut rng, DType::I64, &xs, -3, 3).map(|v| v as f64);
                let g = rand_f(&mut rng, dtype, &gs, 1.0);
                let want = grad_ref(&x, &g, k, stride, pad);
                let (tx, tg) = (tensor_f(&ctx, dtype, &x), tensor_f(&ctx, dtype, &g));
                let what = format!("max_pool2d_grad {xs:?} kernel {k} stride {stride} pad {pad}");
                check_f(&tx.max_pool2d_grad(&tg, k, stride, pad), dtype, &want, max_abs(&g), &what);
                // Random values (no ties), through `backward`: autodiff
                // records the op.
                let x = rand_f(&mut rng, dtype, &xs, 2.0);
                let want = grad_ref(&x, &g, k, stride, pad);
                let cx = dev(); // a context per variable
                let v = cx.variable("x", tensor_f(&cx, dtype, &x)).expect("a variable");
                let y = v.tensor().max_pool2d(k, stride, pad);
                let grads = y.backward_with(&tensor_f(&cx, dtype, &g)).expect("backward");
                let got = grads.get(&v).expect("a gradient").clone();
                check_f(&got, dtype, &want, max_abs(&g), &format!("backward of {what}"));
            }
        }
    });
}

#[test]
fn max_pool2d_grad_of_views_and_constant_gradients() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(3802);
        for dtype in FLOATS {
            // x a permuted view, g a constant expanded over the windows
            // (the gradient of a sum).
            let y = rand_f(&mut rng, dtype, &[1, 6, 7, 2], 2.0);
            let tx = tensor_f(&ctx, dtype, &y).permute(&[0, 3, 2, 1]);
            let x = y.permute(&[0, 3, 2, 1]);
            let g = Nd::from_fn(&[1, 2, 4, 3], |_| 1.5);
            let tg = ctx.full([1, 1, 1, 1], 1.5).cast(dtype).broadcast_to([1, 2, 4, 3]);
            check_f(&tx.max_pool2d_grad(&tg, 3, 2, 1), dtype, &grad_ref(&x, &g, 3, 2, 1), 2.0, "of views");
            // g a sliced view.
            let big = rand_f(&mut rng, dtype, &[1, 2, 8, 6], 1.0);
            let tg = tensor_f(&ctx, dtype, &big).slice(2, 1, 8, 2).slice(3, 0, 6, 2);
            let g = big.slice(2, 1, 2, 4).slice(3, 0, 2, 3);
            check_f(&tx.max_pool2d_grad(&tg, 3, 2, 1), dtype, &grad_ref(&x, &g, 3, 2, 1), 2.0, "sliced g");
        }
    });
}

#[test]
fn max_pool2d_grad_routes_nan_and_infinities_as_pytorch() {
    each_backend(|| {
        let ctx = dev();
        // One 4x4 plane, 2x2 windows (stride 2) and 3x3 ones (stride 1,
        // padding 1): each window below holds one pattern.
        #[rustfmt::skip]
        let x = [
            NAN, 1.0,   -INF, -INF,   // a NaN first; a window of -inf
            2.0, NAN,   -INF, -INF,   // and a second NaN, last
            INF, INF,   3.0,  -1.0,   // tied +inf; a finite max
            0.5, 4.0,   -1.0, 3.0,    // a NaN-free window with a tie of 3
        ];
        let x = Nd::new(x.to_vec(), &[1, 1, 4, 4]);
        for dtype in FLOATS {
            let tx = tensor_f(&ctx, dtype, &x);
            for (k, stride, pad) in [(2, 2, 0), (3, 1, 1), (2, 1, 1)] {
                let side = pooled(4, k, stride, pad);
                let shape = [1, 1, side, side];
                // A finite gradient, then one holding NaN and infinities.
                let finite = Nd::from_fn(&shape, |i| (i[2] * side + i[3]) as f64 + 1.0);
                let wild = Nd::from_fn(&shape, |i| [NAN, INF, -INF, 2.0][(i[2] * side + i[3]) % 4]);
                for g in [finite, wild] {
                    let want = grad_ref(&x, &g, k, stride, pad);
                    let what = format!("non-finite kernel {k} stride {stride} pad {pad}");
                    check_f(
                        &tx.max_pool2d_grad(&tensor_f(&ctx, dtype, &g), k, stride, pad),
                        dtype,
                        &want,
                        1.0,
                        &what,
                    );
                }
            }
        }
    });
}
