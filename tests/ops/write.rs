//! `write_at` on every dtype along every dim, with host offsets, device
//! offsets (clamped as XLA clamps) and non-contiguous operands, against a
//! reference written here; and its errors.

use crate::reference::*;
use kiln::prelude::*;

/// `x` with `v` written at `start` (already clamped) along `dim`.
fn write_ref<T: Copy>(x: &Nd<T>, v: &Nd<T>, dim: usize, start: usize) -> Nd<T> {
    Nd::from_fn(&x.shape, |i| {
        let j = i[dim];
        if j >= start && j < start + v.shape[dim] {
            let mut k = i.to_vec();
            k[dim] = j - start;
            v.get(&k)
        } else {
            x.get(i)
        }
    })
}

fn write_host(x: &Host, v: &Host, dim: usize, start: usize) -> Host {
    match (x, v) {
        (Host::F(x), Host::F(v)) => Host::F(write_ref(x, v, dim, start)),
        (Host::I(x), Host::I(v)) => Host::I(write_ref(x, v, dim, start)),
        _ => unreachable!("one dtype"),
    }
}

#[test]
fn write_at_on_every_dtype_and_dim() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(61);
        let xs = [3usize, 5, 4];
        for dtype in DType::ALL {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &xs);
            // Every dim, a one-row window and a whole-dim window on one
            // dtype each way round (each pair is a plan of its own; the
            // offsets are runtime values, so they share it).
            for (dim, len) in [(0, 1), (1, 2), (2, xs[2]), (1, xs[1])] {
                let mut vs = xs;
                vs[dim] = len;
                let (v, hv) = rand_tensor(&ctx, &mut rng, dtype, &vs);
                for start in 0..=xs[dim] - len {
                    let want = write_host(&h, &hv, dim, start);
                    let what = format!("{dtype} write_at dim {dim} len {len} at {start}");
                    check(&t.write_at(dim, start, &v), dtype, &want, 0.0, &what);
                }
                // Device offsets, clamped into range; i32 ones on one dtype.
                let last = (xs[dim] - len) as i64;
                for at in [-3i64, 0, last, last + 1, 100] {
                    let want = write_host(&h, &hv, dim, at.clamp(0, last) as usize);
                    let what = format!("{dtype} write_at dim {dim} len {len} at device {at}");
                    check(&t.write_at(dim, ctx.scalar(at), &v), dtype, &want, 0.0, &what);
                    if dtype == DType::F32 {
                        let off32 = ctx.scalar(at as i32);
                        check(&t.write_at(dim, &off32, &v), dtype, &want, 0.0, &(what + " (i32)"));
                    }
                }
            }
        }
    });
}

#[test]
fn write_at_reads_and_writes_through_views() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(62);
        // A transposed target, a broadcast value and a sliced offset.
        let a = rand_f(&mut rng, DType::F32, &[4, 6], 2.0);
        let t = tensor_f(&ctx, DType::F32, &a).t(); // [6, 4]
        let row = rand_f(&mut rng, DType::F32, &[1, 4], 2.0);
        let v = tensor_f(&ctx, DType::F32, &row).broadcast_to([2, 4]);
        let offsets = ctx.tensor(&[9i64, 3, 1], [3]);
        let at = offsets.narrow(0, 1, 1).reshape([]);
        let want = write_ref(&a.transpose(0, 1), &row.expand(&[2, 4]), 0, 3);
        check(&t.write_at(0, &at, &v), DType::F32, &Host::F(want), 0.0, "views");
        // The target stays what it was.
        check(&t, DType::F32, &Host::F(a.transpose(0, 1)), 0.0, "target unchanged");
    });
}

#[test]
fn write_at_errors_name_the_sizes() {
    let ctx = Context::cpu();
    let x = ctx.zeros([2, 8, 4]);
    let msg = |t: Tensor| t.error().map(|e| e.to_string()).unwrap_or_else(|| "no error".into());
    let late = msg(x.write_at(1, 7, &ctx.zeros([2, 3, 4])));
    assert!(late.contains("offset 7") && late.contains("ends at 10") && late.contains("size 8"), "{late}");
    let shape = msg(x.write_at(1, 0, &ctx.zeros([2, 3, 5])));
    assert!(shape.contains("[2,3,5]") && shape.contains("[2,8,4]"), "{shape}");
    let long = msg(x.write_at(1, ctx.scalar(0i64), &ctx.zeros([2, 9, 4])));
    assert!(long.contains("may be shorter"), "{long}");
    let float = msg(x.write_at(1, ctx.scalar(1.0f32), &ctx.zeros([2, 1, 4])));
    assert!(float.contains("i64 or i32"), "{float}");
    let dim = msg(x.write_at(3, 0, &ctx.zeros([2, 1, 4])));
    assert!(dim.contains("out of range") || dim.contains("dim"), "{dim}");
    let dtype = msg(x.write_at(1, 0, &ctx.zeros_dtype([2, 1, 4], DType::F64)));
    assert!(dtype.contains("f64") && dtype.contains("f32"), "{dtype}");
}
