//! The ops a transformer needs beyond the basics (issue 20): `index_add`
//! (the scatter-add an embedding's gradient is), `tril`/`triu`,
//! `split`/`chunk`, negative dims, `Display`, and scaled dot-product
//! attention against an f64 reference, on every backend of the suite.

use crate::reference::*;
use kiln::prelude::*;

fn index_add_ref(x: &Nd<f64>, dim: usize, idx: &[i64], src: &Nd<f64>, dtype: DType) -> Nd<f64> {
    let mut out = x.contiguous().to_vec();
    let shape = x.shape.clone();
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let s = src.contiguous().to_vec();
    for o in 0..outer {
        for (j, &i) in idx.iter().enumerate() {
            for c in 0..inner {
                let at = (o * shape[dim] + i as usize) * inner + c;
                out[at] = round(dtype, out[at] + s[(o * idx.len() + j) * inner + c]);
            }
        }
    }
    Nd::new(out, &shape)
}

#[test]
fn index_add_on_every_numeric_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2001);
        let xs = [4usize, 3, 5];
        for dtype in NUMERIC {
            for dim in 0..3 {
                for idx_dtype in [DType::I64, DType::I32] {
                    let n = 7; // more rows than the dim: indices repeat
                    let idx = rand_small_i(&mut rng, idx_dtype, &[n], 0, xs[dim] as i64);
                    let mut ss = xs;
                    ss[dim] = n;
                    let what = format!("index_add dim {dim} ({idx_dtype} index)");
                    if dtype.is_float() {
                        let x = rand_f(&mut rng, dtype, &xs, 2.0);
                        let src = rand_f(&mut rng, dtype, &ss, 2.0);
                        let got = tensor_f(&ctx, dtype, &x).index_add(
                            dim,
                            &tensor_i(&ctx, idx_dtype, &idx),
                            &tensor_f(&ctx, dtype, &src),
                        );
                        let want = index_add_ref(&x, dim, &idx.to_vec(), &src, dtype);
                        // Each add rounds once, exactly as the reference does.
                        check_f(&got, dtype, &want, 0.0, &what);
                    } else {
                        let x = rand_small_i(&mut rng, dtype, &xs, 0, 50);
                        let src = rand_small_i(&mut rng, dtype, &ss, 0, 50);
                        let got = tensor_i(&ctx, dtype, &x).index_add(
                            dim,
                            &tensor_i(&ctx, idx_dtype, &idx),
                            &tensor_i(&ctx, dtype, &src),
                        );
                        let want = index_add_ref(
                            &x.map(|v| v as f64),
                            dim,
                            &idx.to_vec(),
                            &src.map(|v| v as f64),
                            DType::F64,
                        );
                        check_i(&got, dtype, &want.map(|v| v as i64), &what);
                    }
                }
            }
        }
        // A transposed source and a negative dim.
        let x = rand_f(&mut rng, DType::F32, &[3, 4], 1.0);
        let src = rand_f(&mut rng, DType::F32, &[2, 3], 1.0);
        let idx = Nd::new(vec![3i64, 3], &[2]);
        let got = tensor_f(&ctx, DType::F32, &x).index_add(
            -1,
            &tensor_i(&ctx, DType::I64, &idx),
            &tensor_f(&ctx, DType::F32, &src).t(),
        );
        let want = index_add_ref(&x, 1, &[3, 3], &src.transpose(0, 1), DType::F32);
        check_f(&got, DType::F32, &want, 0.0, "index_add of a transposed source along -1");
    });
}

/// A long index into few rows, as an embedding's gradient is: rows
/// repeat within and across the CUDA kernel's steps of 256 positions
/// (and runs of one row, summed in a register), and the sums must still
/// be the sequential walk's, bit for bit. 520 rows make the kernel's
/// blocks own ranges of two rows; 260 columns take a thread two.
#[test]
fn index_add_of_a_long_index_sums_in_index_order() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2002);
        for dtype in [DType::F32, DType::BF16, DType::I32] {
            for (rows, n, width) in [(3usize, 37usize, 5usize), (40, 61, 5), (3, 600, 5), (520, 300, 260)] {
                let idx = rand_small_i(&mut rng, DType::I64, &[n], 0, rows as i64);
                let what = format!("index_add of {n} positions into {rows} rows ({dtype})");
                if dtype.is_float() {
                    let x = rand_f(&mut rng, dtype, &[rows, width], 2.0);
                    let src = rand_f(&mut rng, dtype, &[n, width], 2.0);
                    let got = tensor_f(&ctx, dtype, &x).index_add(
                        0,
                        &tensor_i(&ctx, DType::I64, &idx),
                        &tensor_f(&ctx, dtype, &src),
                    );
                    let want = index_add_ref(&x, 0, &idx.to_vec(), &src, dtype);
                    check_f(&got, dtype, &want, 0.0, &what);
                } else {
                    let x = rand_small_i(&mut rng, dtype, &[rows, width], -50, 50);
                    let src = rand_small_i(&mut rng, dtype, &[n, width], -50, 50);
                    let got = tensor_i(&ctx, dtype, &x).index_add(
                        0,
                        &tensor_i(&ctx, DType::I64, &idx),
                        &tensor_i(&ctx, dtype, &src),
                    );
                    let want = index_add_ref(
                        &x.map(|v| v as f64),
                        0,
                        &idx.to_vec(),
                        &src.map(|v| v as f64),
                        DType::F64,
                    );
                    check_i(&got, dtype, &want.map(|v| v as i64), &what);
                }
            }
        }
    });
}

#[test]
fn index_add_reports_a_bad_index_and_a_bad_source() {
    each_backend(|| {
        let ctx = dev();
        let bad = ctx.zeros([3, 2]).index_add(0, &ctx.tensor(&[0i64, 3], [2]), &ctx.ones([2, 2]));
        let e = bad.to_vec::<f32>().expect_err("index 3 of 3 rows");
        assert!(matches!(e, Error::Runtime(_)), "{e:?}");
        assert!(e.to_string().contains("index_add index 3 is out of range for dim 0 of size 3"), "{e}");
        let bad = ctx.zeros([3, 2]).index_add(0, &ctx.tensor(&[0i64, 1], [2]), &ctx.ones([3, 2]));
        let e = bad.to_vec::<f32>().expect_err("a source of the wrong shape");
        assert!(matches!(e, Error::Shape { op: "index_add", .. }), "{e:?}");
        assert!(
            e.to_string().contains(
                "index_add of source [3,2] into [3,2] along dim 0 with 2 indices: the source must be [2,2]"
            ),
            "{e}"
        );
    });
}

#[test]
fn tril_and_triu_on_floats_and_ints() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2002);
        for dtype in [DType::F32, DType::BF16, DType::I32, DType::F64] {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[2, 4, 5]);
            for diag in [-2i64, -1, 0, 1, 3] {
                for lower in [true, false] {
                    let keep = |i: &[usize]| {
                        let off = i[2] as i64 - i[1] as i64;
                        if lower {
                            off <= diag
                        } else {
                            off >= diag
                        }
                    };
                    let got = if lower { t.tril(diag) } else { t.triu(diag) };
                    let what = format!("{} {diag} on {dtype}", if lower { "tril" } else { "triu" });
                    match &h {
                        Host::F(a) => {
                            let want = Nd::from_fn(&a.shape, |i| if keep(i) { a.get(i) } else { 0.0 });
                            check_f(&got, dtype, &want, 0.0, &what);
                        }
                        Host::I(a) => {
                            let want = Nd::from_fn(&a.shape, |i| if keep(i) { a.get(i) } else { 0 });
                            check_i(&got, dtype, &want, &what);
                        }
                    }
                }
            }
        }
        let e = ctx.ones([4]).tril(0).to_vec::<f32>().expect_err("rank 1");
        assert!(e.to_string().contains("tril needs a tensor of rank >= 2, got [4]"), "{e}");
    });
}

#[test]
fn split_and_chunk_cut_views() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.arange(0i64, 24, 1).reshape([2, 3, 4]);
    let parts = x.split(3, -1)?;
    assert_eq!(parts.iter().map(|p| p.shape().to_vec()).collect::<Vec<_>>(), [vec![2, 3, 3], vec![2, 3, 1]]);
    assert_eq!(parts[1].to_vec::<i64>()?, vec![3, 7, 11, 15, 19, 23]);
    let parts = x.split_sizes(&[1, 2], 1)?;
    assert_eq!(parts[1].shape(), &[2, 2, 4]);
    assert_eq!(parts[0].to_vec::<i64>()?, vec![0, 1, 2, 3, 12, 13, 14, 15]);
    // torch.chunk: ceil(4 / 3) = 2 per chunk, so only two chunks.
    let parts = x.chunk(3, 2)?;
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0].to_vec::<i64>()?[..4], [0, 1, 4, 5]);
    let qkv = ctx.randn([2, 5, 12]);
    let [q, k, v] =
        <[Tensor; 3]>::try_from(qkv.chunk(3, -1)?).map_err(|_| Error::Backend("3 chunks".into()))?;
    assert_eq!((q.shape(), k.shape(), v.shape()), (&[2, 5, 4][..], &[2, 5, 4][..], &[2, 5, 4][..]));
    let e = x.split_sizes(&[1, 1], 1).expect_err("sizes add up to 2, not 3");
    assert!(e.to_string().contains("sizes [1, 1] add up to 2 but dim 1 of [2,3,4] has size 3"), "{e}");
    let e = x.split(0, 0).expect_err("size 0");
    assert!(matches!(e, Error::Argument { op: "split", .. }), "{e:?}");
    let e = x.chunk(2, -4).expect_err("dim -4 of rank 3");
    assert!(e.to_string().contains("dim -4 is out of range for a tensor of rank 3"), "{e}");
    Ok(())
}

#[test]
fn negative_dims_mean_what_positive_ones_do() -> Result<()> {
    let ctx = Context::cpu().with_seed(3);
    let x = ctx.randn([2, 3, 4]);
    let same = |a: &Tensor, b: &Tensor, what: &str| -> Result<()> {
        assert_eq!(a.shape(), b.shape(), "{what}");
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{what}");
        Ok(())
    };
    same(&x.sum(&[-1, -3], true), &x.sum(&[0, 2], true), "sum")?;
    same(&x.mean(&[-2], false), &x.mean(&[1], false), "mean")?;
    same(&x.max(&[-1], false), &x.max(&[2], false), "max")?;
    same(&x.softmax(-1), &x.softmax(2), "softmax")?;
    same(&x.log_softmax(-2), &x.log_softmax(1), "log_softmax")?;
    same(&x.transpose(-1, -2), &x.transpose(2, 1), "transpose")?;
    same(&x.permute(&[-1, 0, -2]), &x.permute(&[2, 0, 1]), "permute")?;
    same(&x.narrow(-1, 1, 2), &x.narrow(2, 1, 2), "narrow")?;
    same(&x.slice(-2, 0, 3, 2), &x.slice(1, 0, 3, 2), "slice")?;
    same(&x.unsqueeze(-1), &x.unsqueeze(3), "unsqueeze")?;
    same(&x.unsqueeze(-1).squeeze(-1), &x, "squeeze")?;
    same(&Tensor::cat(&[&x, &x], -1), &Tensor::cat(&[&x, &x], 2), "cat")?;
    same(&Tensor::stack(&[&x, &x], -1), &Tensor::stack(&[&x, &x], 3), "stack")?;
    let i = ctx.tensor(&[1i64, 0], [2]);
    same(&x.index_select(-1, &i), &x.index_select(2, &i), "index_select")?;
    let g = ctx.tensor(&[0i64; 24], [2, 3, 4]);
    same(&x.gather(-3, &g), &x.gather(0, &g), "gather")?;
    assert_eq!(x.argmax(-1, false).to_vec::<i64>()?, x.argmax(2, false).to_vec::<i64>()?);
    let e = x.sum(&[-4], false).to_vec::<f32>().expect_err("dim -4 of rank 3");
    assert!(matches!(e, Error::Shape { op: "sum", .. }), "{e:?}");
    assert!(
        e.to_string().contains(
            "dim -4 is out of range for a tensor of rank 3 (negative dims count from the end: -1 is the last, -3 the first)"
        ),
        "{e}"
    );
    Ok(())
}

#[test]
fn where_broadcasts_a_key_padding_mask() -> Result<()> {
    let ctx = Context::cpu();
    let scores = ctx.zeros([2, 3, 2, 4]);
    let keep = ctx.tensor(&[true, true, false, false, true, true, true, false], [2, 1, 1, 4]);
    let masked = keep.where_cond(&scores, f32::NEG_INFINITY);
    assert_eq!(masked.shape(), &[2, 3, 2, 4]);
    let v = masked.to_vec::<f32>()?;
    assert_eq!(&v[..4], &[0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
    assert_eq!(&v[24..28], &[0.0, 0.0, 0.0, f32::NEG_INFINITY]);
    Ok(())
}

#[test]
fn display_prints_like_pytorch() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.tensor(&[1.0f32, -2.5, 3.25, 4.0], [2, 2]);
    assert_eq!(x.to_string(), "tensor([[ 1.0000, -2.5000],\n        [ 3.2500,  4.0000]])");
    assert_eq!(ctx.tensor(&[1.0f32, 2.0], [2]).to_string(), "tensor([1., 2.])");
    assert_eq!(ctx.tensor(&[3i64, -12], [2]).to_string(), "tensor([  3, -12])");
    assert_eq!(ctx.tensor(&[true, false], [2]).to_string(), "tensor([ True, False])");
    assert_eq!(ctx.tensor(&[0.5f32], [1]).cast(DType::F16).to_string(), "tensor([0.5000], dtype=f16)");
    assert_eq!(ctx.tensor(&[1e-6f32, 1.0], [2]).to_string(), "tensor([1.0000e-06, 1.0000e+00])");
    assert_eq!(ctx.scalar(7i32).to_string(), "tensor(7, dtype=i32)");
    let big = ctx.arange(0i64, 2000, 1).reshape([2, 1000]);
    assert_eq!(big.to_string(), "tensor([[   0,    1,    2, ...,  997,  998,  999],\n        [1000, 1001, 1002, ..., 1997, 1998, 1999]])");
    let cube = ctx.arange(0i64, 8, 1).reshape([2, 2, 2]);
    assert_eq!(
        cube.to_string(),
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])"
    );
    let bad = ctx.zeros([2]) + ctx.zeros([3]);
    assert!(bad.to_string().starts_with("tensor(<error: "), "{bad}");
    Ok(())
}

/// `softmax(scale q kᵀ + mask) v` in f64, one query row at a time; a row
/// with every key removed is zeros.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_ref(
    q: &Nd<f64>,
    k: &Nd<f64>,
    v: &Nd<f64>,
    keep: Option<&Nd<i64>>,
    add: Option<&Nd<f64>>,
    causal: bool,
    scale: f64,
) -> Nd<f64> {
    let (b, h, sq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (sk, dv) = (k.shape[2], v.shape[3]);
    let mut out = vec![0.0; b * h * sq * dv];
    for (row, o) in out.chunks_mut(dv.max(1)).enumerate().take(b * h * sq) {
        let (bi, hi, i) = (row / (h * sq), row / sq % h, row % sq);
        let mut s = Vec::new();
        for j in 0..sk {
            if causal && j > i || keep.is_some_and(|m| m.get(&[bi, 0, 0, j]) == 0) {
                continue;
            }
            let dot: f64 = (0..d).map(|e| q.get(&[bi, hi, i, e]) * k.get(&[bi, hi, j, e])).sum();
            s.push((j, dot * scale + add.map_or(0.0, |a| a.get(&[bi, hi, i, j]))));
        }
        let m = s.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let l: f64 = s.iter().map(|x| (x.1 - m).exp()).sum();
        for (c, oc) in o.iter_mut().enumerate() {
            *oc = s.iter().map(|&(j, x)| (x - m).exp() / l * v.get(&[bi, hi, j, c])).sum();
        }
    }
    Nd::new(out, &[b, h, sq, dv])
}

/// An attention case: its name, its mask, whether it is causal, and the
/// f64 reference.
pub(crate) type MaskCase = (&'static str, Option<Tensor>, bool, Nd<f64>);

/// The mask cases the kernel tests run over `q, k, v` (f64 values, `dtype`
/// tensors on `ctx`): plain, causal, a bool key-padding mask `keep` with
/// causal on top, and an additive mask `add`.
pub(crate) fn mask_cases(
    ctx: &Context,
    dtype: DType,
    [q, k, v]: [&Nd<f64>; 3],
    keep: &Nd<i64>,
    add: &Nd<f64>,
    scale: f64,
) -> Vec<MaskCase> {
    vec![
        ("plain", None, false, attention_ref(q, k, v, None, None, false, scale)),
        ("causal", None, true, attention_ref(q, k, v, None, None, true, scale)),
        (
            "key padding, causal",
            Some(tensor_i(ctx, DType::Bool, keep)),
            true,
            attention_ref(q, k, v, Some(keep), None, true, scale),
        ),
        (
            "additive",
            Some(tensor_f(ctx, dtype, add)),
            false,
            attention_ref(q, k, v, None, Some(add), false, scale),
        ),
    ]
}

#[test]
fn attention_matches_f64_on_every_float_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2003);
        // Lengths past one key tile and one query block of both kernels;
        // the second shape has value rows of one full register chunk of
        // the CPU kernel (32) and a part of another, and two full key
        // blocks (64) and a part; the third has three blocks of query rows
        // (48) and three of keys (128) of the CPU's f32 kernel, the last
        // of each short, and a head dim that is not a multiple of 16.
        for ((b, h, sq, sk, d, dv), dtype) in
            [(2, 3, 37, 70, 8, 12), (1, 2, 19, 130, 32, 40), (1, 2, 101, 300, 20, 24)]
                .into_iter()
                .flat_map(|s| FLOATS.map(|d| (s, d)))
        {
            let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
            let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
            let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
            let (tq, tk, tv) =
                (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
            let scale = 1.0 / (d as f64).sqrt();
            // The second batch row keeps no key at all: its output is zeros.
            let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[0] == 0 && i[3] % 3 != 1) as i64);
            let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
            let cases: [(&str, Option<Tensor>, Nd<f64>); 4] = [
                ("plain", None, attention_ref(&q, &k, &v, None, None, false, scale)),
                ("causal", None, attention_ref(&q, &k, &v, None, None, true, scale)),
                (
                    "key padding",
                    Some(tensor_i(&ctx, DType::Bool, &keep)),
                    attention_ref(&q, &k, &v, Some(&keep), None, false, scale),
                ),
                (
                    "additive",
                    Some(tensor_f(&ctx, dtype, &add)),
                    attention_ref(&q, &k, &v, None, Some(&add), false, scale),
                ),
            ];
            for (name, mask, want) in cases {
                let causal = name == "causal";
                let got = tq.scaled_dot_product_attention(&tk, &tv, mask.as_ref(), causal, None);
                // f32 accumulation, one rounding to the dtype at the end.
                let tol = if dtype == DType::F64 { 1.0 } else { 4.0 };
                check_f(&got, dtype, &want, tol, &format!("attention {name} on {dtype}"));
            }
        }
        // Heads of a [b, s, h, d] projection, permuted (strided operands),
        // with an explicit scale and causal on top of a bool mask.
        let x = rand_f(&mut rng, DType::F32, &[2, 9, 2, 4], 1.0);
        let t = tensor_f(&ctx, DType::F32, &x).permute(&[0, 2, 1, 3]);
        let xp = x.permute(&[0, 2, 1, 3]);
        let keep = Nd::from_fn(&[2, 1, 1, 9], |i| (i[3] != 4) as i64);
        let got = t.scaled_dot_product_attention(
            &t,
            &t,
            Some(&tensor_i(&ctx, DType::Bool, &keep)),
            true,
            Some(0.3),
        );
        let want = attention_ref(&xp, &xp, &xp, Some(&keep), None, true, 0.3);
        check_f(&got, DType::F32, &want, 4.0, "attention over permuted heads");
    });
}

/// Head dims that are multiples of 16 take the CUDA backend's tensor-core
/// kernel for f16 and bf16 (`codegen/attention_mma.rs`): more than one
/// block of 64 query rows and one tile of 64 keys, each kind of mask,
/// heads read 16 bytes at a time (contiguous, and permuted out of a
/// `[b, s, h, d]` projection) and element by element (a head dim narrowed
/// at an odd offset). Probabilities are rounded to the input type before
/// `p · v`, as FlashAttention does: the bound is a few units of the
/// dtype's last place. At head dim 128 (bf16) the double-buffered tiles
/// take shared memory sized at launch.
#[test]
fn tensor_core_attention_matches_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2005);
        // Head dim 128: two buffers of keys and values outgrow static
        // shared memory, so the tiles are sized at launch.
        for (dtype, d, dv) in [(DType::F16, 32, 16), (DType::BF16, 32, 16), (DType::BF16, 128, 128)] {
            let (b, h, sq, sk) = (1, 2, 70, 75);
            let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
            let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
            let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
            let (tq, tk, tv) =
                (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
            let scale = 1.0 / (d as f64).sqrt();
            let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[3] % 5 != 2) as i64);
            let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
            let cases = mask_cases(&ctx, dtype, [&q, &k, &v], &keep, &add, scale);
            for (name, mask, causal, want) in cases {
                let got = tq.scaled_dot_product_attention(&tk, &tv, mask.as_ref(), causal, None);
                check_f(&got, dtype, &want, 8.0, &format!("tensor-core attention {name} on {dtype}"));
            }
            // Heads permuted out of [b, s, h, d] (16-byte loads), and a
            // head dim narrowed at offset 3 (element loads).
            let x = rand_f(&mut rng, dtype, &[b, sk, h, d + 5], 1.0);
            let t = tensor_f(&ctx, dtype, &x).permute(&[0, 2, 1, 3]);
            let (wide, narrow) = (t.narrow(3, 0, d), t.narrow(3, 3, d));
            let xp = x.permute(&[0, 2, 1, 3]);
            let (xw, xn) = (xp.slice(3, 0, 1, d), xp.slice(3, 3, 1, d));
            let got = wide.scaled_dot_product_attention(&narrow, &wide, None, true, Some(0.2));
            let want = attention_ref(&xw, &xn, &xw, None, None, true, 0.2);
            check_f(&got, dtype, &want, 8.0, &format!("tensor-core attention, strided heads, {dtype}"));
        }
    });
}

/// The CUDA-core kernels on CUDA: the one-row kernel splits a query row's
/// keys over several threads and merges their partial softmaxes, except
/// where the merge would not fit in shared memory (f64 heads of 200: one
/// thread a row); f32 heads of 16-64 over at most 32 queries take the
/// register-tiled kernel (12 heads of 30 rows, 32 rows of 48 dims: tiles
/// cut short, and a head of 260 rows: few blocks, so each query block's
/// keys are split over 2 blocks and merged; more rows in more blocks take
/// the 3xTF32 tensor-core kernel, `attention_tf32.rs`).
/// Causal and not, over more keys than a tile.
#[test]
fn cuda_core_attention_kernels_match_f64() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2007);
        let shapes = [
            (DType::F64, 1, 19, 200),
            (DType::F32, 12, 30, 64),
            (DType::F32, 3, 32, 48),
            (DType::F32, 2, 45, 72),
            (DType::F16, 2, 45, 40),
            (DType::F32, 1, 260, 32),
        ];
        for (dtype, h, s, d) in shapes {
            let q = rand_f(&mut rng, dtype, &[1, h, s, d], 1.0);
            let k = rand_f(&mut rng, dtype, &[1, h, s, d], 1.0);
            let v = rand_f(&mut rng, dtype, &[1, h, s, d], 1.0);
            let (tq, tk, tv) =
                (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
            let scale = 1.0 / (d as f64).sqrt();
            for causal in [false, true] {
                let want = attention_ref(&q, &k, &v, None, None, causal, scale);
                let got = tq.scaled_dot_product_attention(&tk, &tv, None, causal, None);
                let tol = if dtype == DType::F64 { 1.0 } else { 4.0 };
                check_f(&got, dtype, &want, tol, &format!("attention {dtype} head dim {d}, causal {causal}"));
            }
        }
    });
}

#[test]
fn attention_refuses_what_it_cannot_take() {
    let ctx = Context::cpu();
    let q = ctx.zeros([2, 3, 4, 8]);
    let msg = |t: Tensor| t.to_vec::<f32>().expect_err("an error").to_string();
    let m = msg(q.scaled_dot_product_attention(&ctx.zeros([2, 3, 4, 6]), &q, None, false, None));
    assert!(
        m.contains("attention queries [2,3,4,8] and keys [2,3,4,6] have different head dims (8 and 6)"),
        "{m}"
    );
    let m = msg(q.scaled_dot_product_attention(&q, &q, Some(&ctx.ones([2, 4])), false, None));
    assert!(
        m.contains(
            "the attention mask [2,4] does not broadcast to [batch, heads, queries, keys] = [2,3,4,4]"
        ),
        "{m}"
    );
    let m = msg(q.reshape([6, 4, 8]).scaled_dot_product_attention(&q, &q, None, false, None));
    assert!(m.contains("attention takes [batch, heads, seq, dim] queries, keys and values"), "{m}");
    let m = msg(q.scaled_dot_product_attention(&q, &q.cast(DType::F64), None, false, None));
    assert!(m.contains("attention values are f64 but the queries are f32"), "{m}");
}

/// The generated CUDA kernels this file's ops add (attention with each
/// kind of mask, in f32 and bf16, on CUDA cores and on tensor cores (f32
/// by 3xTF32 too), and
/// index_add) run on the CPU emulator
/// in every CI run, against the CPU backend, as one plan (one g++ build).
/// The tests above cover every dtype on the emulator with
/// `KILN_TEST_EMULATE=1`, and on a GPU (the tensor-core kernel's in
/// `tensor_core_attention_matches_f64`).
#[cfg(feature = "cuda-emulator")]
#[test]
fn generated_attention_and_index_add_kernels_run_on_the_emulator() -> Result<()> {
    let run = |ctx: &Context| -> Result<Vec<Vec<f32>>> {
        let mut rng = Rng::new(2004);
        let mut t = |shape: &[usize]| tensor_f(ctx, DType::F32, &rand_f(&mut rng, DType::F32, shape, 1.0));
        let (q, k, v) = (t(&[2, 2, 20, 8]), t(&[2, 2, 40, 8]), t(&[2, 2, 40, 8]));
        let add = t(&[2, 2, 20, 40]);
        let keep = key_mask(ctx, 2, 40);
        let (x, src) = (t(&[6, 3]), t(&[5, 3]));
        let idx = ctx.tensor(&[5i64, 0, 5, 2, 5], [5]);
        // Head dims of 16: the tensor-core kernel, two query blocks and two
        // key tiles.
        let (q2, k2, v2) = (t(&[1, 2, 70, 16]), t(&[1, 2, 75, 16]), t(&[1, 2, 75, 16]));
        let add2 = t(&[1, 2, 70, 75]);
        let keep2 = key_mask(ctx, 1, 75);
        let bf = |a: &Tensor| a.cast(DType::BF16);
        let hf = |a: &Tensor| a.cast(DType::F16);
        let outs = [
            q.scaled_dot_product_attention(&k, &v, None, false, None),
            q.scaled_dot_product_attention(&k, &v, None, true, None),
            q.scaled_dot_product_attention(&k, &v, Some(&keep), false, Some(0.5)),
            q.scaled_dot_product_attention(&k, &v, Some(&add), true, None),
            bf(&q).scaled_dot_product_attention(&bf(&k), &bf(&v), Some(&keep), true, None).cast(DType::F32),
            x.index_add(0, &idx, &src),
            hf(&q2)
                .scaled_dot_product_attention(&hf(&k2), &hf(&v2), Some(&keep2), true, None)
                .cast(DType::F32),
            bf(&q2)
                .scaled_dot_product_attention(&bf(&k2), &bf(&v2), Some(&bf(&add2)), false, None)
                .cast(DType::F32),
            // f32 at head dim 16: the 3xTF32 tensor-core kernel.
            q2.scaled_dot_product_attention(&k2, &v2, Some(&keep2), true, None),
            q2.scaled_dot_product_attention(&k2, &v2, Some(&add2), false, None),
        ];
        ctx.realize(&outs.iter().collect::<Vec<_>>())?;
        outs.iter().map(|o| o.to_vec::<f32>()).collect()
    };
    let (cpu, emu) = (run(&Context::cpu())?, run(&Context::cuda_emulated())?);
    for (i, (c, e)) in cpu.iter().zip(&emu).enumerate() {
        let tol = if matches!(i, 4 | 6 | 7) { 1e-2 } else { 1e-5 };
        for (j, (a, b)) in c.iter().zip(e).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + a.abs()),
                "output {i} element {j}: cpu {a}, emulated cuda {b}"
            );
        }
    }
    Ok(())
}

/// A `[b, 1, 1, s]` key-padding mask keeping all but every fourth key.
#[cfg(feature = "cuda-emulator")]
fn key_mask(ctx: &Context, b: usize, s: usize) -> Tensor {
    let keep: Vec<bool> = (0..b * s).map(|i| i % 4 != 3).collect();
    ctx.tensor(&keep, [b, 1, 1, s])
}
