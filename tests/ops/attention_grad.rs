//! The attention backward against f64 (issues 35 and 36): autodiff records
//! `attention_stats` and `attention_grad`; f16 and bf16 heads of 16 to
//! 128 run them fused (the CPU kernel and the tensor-core kernels of
//! `codegen/attention_grad.rs`), f32 and f64 expand them into matmuls and
//! a softmax. Every case checks dq, dk and dv against gradients computed
//! here in f64 from the same rounded inputs, on every backend.

use crate::reference::*;
use kiln::prelude::*;

/// The masks of a case: a `[b, 1, 1, sk]` key padding (1 keeps) and an
/// additive `[b, h, sq, sk]` one.
pub(crate) struct Masks<'a> {
    pub(crate) keep: Option<&'a Nd<i64>>,
    pub(crate) add: Option<&'a Nd<f64>>,
    pub(crate) causal: bool,
}

impl Masks<'_> {
    /// The attention's mask operand in `ctx`: the key padding as bool, or
    /// the additive mask in `dtype`.
    pub(crate) fn tensor(&self, ctx: &Context, dtype: DType) -> Option<Tensor> {
        match (self.keep, self.add) {
            (Some(keep), _) => Some(tensor_i(ctx, DType::Bool, keep)),
            (_, Some(add)) => Some(tensor_f(ctx, dtype, add)),
            _ => None,
        }
    }
}

/// `(dq, dk, dv)` of `sum(attention(q, k, v) ⊙ g)` in f64: with `P` the
/// probabilities, `dP = g vᵀ`, `dS = P ⊙ (dP - rowsum(P ⊙ dP))`, `dq =
/// scale dS k`, `dk = scale dSᵀ q`, `dv = Pᵀ g`.
pub(crate) fn grads_ref(
    q: &Nd<f64>,
    k: &Nd<f64>,
    v: &Nd<f64>,
    g: &Nd<f64>,
    m: &Masks,
    scale: f64,
) -> [Nd<f64>; 3] {
    let (b, h, sq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (sk, dv) = (k.shape[2], v.shape[3]);
    let (mut dq, mut dk, mut dvv) =
        (vec![0.0; b * h * sq * d], vec![0.0; b * h * sk * d], vec![0.0; b * h * sk * dv]);
    for bi in 0..b {
        for hi in 0..h {
            let bh = bi * h + hi;
            for i in 0..sq {
                let kept: Vec<(usize, f64)> = (0..sk)
                    .filter(|&j| !(m.causal && j > i || m.keep.is_some_and(|x| x.get(&[bi, 0, 0, j]) == 0)))
                    .map(|j| {
                        let dot: f64 = (0..d).map(|e| q.get(&[bi, hi, i, e]) * k.get(&[bi, hi, j, e])).sum();
                        (j, dot * scale + m.add.map_or(0.0, |a| a.get(&[bi, hi, i, j])))
                    })
                    .collect();
                if kept.is_empty() {
                    continue;
                }
                let mx = kept.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = kept.iter().map(|x| (x.1 - mx).exp()).sum();
                let p: Vec<f64> = kept.iter().map(|x| (x.1 - mx).exp() / l).collect();
                let dp: Vec<f64> = kept
                    .iter()
                    .map(|&(j, _)| (0..dv).map(|c| g.get(&[bi, hi, i, c]) * v.get(&[bi, hi, j, c])).sum())
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for (t, &(j, _)) in kept.iter().enumerate() {
                    let ds = p[t] * (dp[t] - delta);
                    for e in 0..d {
                        dq[(bh * sq + i) * d + e] += scale * ds * k.get(&[bi, hi, j, e]);
                        dk[(bh * sk + j) * d + e] += scale * ds * q.get(&[bi, hi, i, e]);
                    }
                    for c in 0..dv {
                        dvv[(bh * sk + j) * dv + c] += p[t] * g.get(&[bi, hi, i, c]);
                    }
                }
            }
        }
    }
    [Nd::new(dq, &[b, h, sq, d]), Nd::new(dk, &[b, h, sk, d]), Nd::new(dvv, &[b, h, sk, dv])]
}

/// The largest magnitude of `x` (at least a small floor).
pub(crate) fn largest(x: &Nd<f64>) -> f64 {
    x.to_vec().iter().fold(1e-6f64, |m, v| m.max(v.abs()))
}

/// kiln's `(dq, dk, dv)` of `sum(attention(q, k, v) ⊙ g)`, q, k and v
/// variables of `dtype` (given as `[b, s, h, d]` and permuted to heads
/// when `permuted`, the layout of a projection's heads), in a context of
/// their own (`ctx`: gradients accumulate in a context's variables).
pub(crate) fn grads_kiln(
    ctx: Context,
    dtype: DType,
    [q, k, v, g]: [&Nd<f64>; 4],
    m: &Masks,
    permuted: bool,
) -> Vec<Tensor> {
    let ctx = &ctx;
    let mask = m.tensor(ctx, dtype);
    let (mask, causal) = (mask.as_ref(), m.causal);
    let vars: Vec<Variable> = [("q", q), ("k", k), ("v", v)]
        .iter()
        .map(|(n, x)| ctx.variable(n, tensor_f(ctx, dtype, x)).expect("a variable"))
        .collect();
    let view = |t: Tensor| if permuted { t.permute(&[0, 2, 1, 3]) } else { t };
    let (tq, tk, tv) = (view(vars[0].tensor()), view(vars[1].tensor()), view(vars[2].tensor()));
    let out = tq.scaled_dot_product_attention(&tk, &tv, mask, causal, None);
    let loss = (&out * &tensor_f(ctx, dtype, g)).sum_all();
    let grads = loss.backward().expect("backward");
    vars.iter().map(|x| view(grads.get(x).expect("a gradient").clone())).collect()
}

#[test]
fn attention_gradients_match_f64() {
    each_backend(|| {
        let mut rng = Rng::new(3035);
        // Past one block of 64 rows and one tile of 64 keys on both sides,
        // query and key lengths that differ; a value head narrower than
        // the query head; GPT's heads of 64; the largest heads the
        // kernels take (128, the most registers: keys and values stay in
        // shared memory); values wider than the queries' heads past 64.
        for (b, h, sq, sk, d, dv) in [
            (2, 2, 70, 75, 32, 16),
            (1, 2, 130, 130, 64, 64),
            (1, 1, 70, 66, 128, 128),
            (1, 1, 130, 70, 64, 96),
        ] {
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
                let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
                let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
                let g = rand_f(&mut rng, dtype, &[b, h, sq, dv], 1.0);
                let scale = 1.0 / (d as f64).sqrt();
                // The second batch row keeps no key: its gradients are 0.
                let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[0] == 0 && i[3] % 5 != 2) as i64);
                let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
                let cases = [
                    ("plain", Masks { keep: None, add: None, causal: false }),
                    ("causal", Masks { keep: None, add: None, causal: true }),
                    ("key padding, causal", Masks { keep: Some(&keep), add: None, causal: true }),
                    ("additive", Masks { keep: None, add: Some(&add), causal: false }),
                ];
                for (name, m) in cases {
                    let want = grads_ref(&q, &k, &v, &g, &m, scale);
                    let got = grads_kiln(dev(), dtype, [&q, &k, &v, &g], &m, false);
                    for ((x, got), want) in ["dq", "dk", "dv"].iter().zip(&got).zip(&want) {
                        // Errors relative to the gradient's largest entry:
                        // the kernels round P and dS to the input type
                        // before their products, as FlashAttention does.
                        let what = format!("attention {name} {x} [{b},{h},{sq},{sk},{d},{dv}] on {dtype}");
                        check_f(got, dtype, want, 2.0 * largest(want), &what);
                    }
                }
            }
        }
    });
}

/// Heads permuted out of a `[b, s, h, d]` projection, as GPT's are: the
/// kernels read strided operands, and the gradients come back through
/// the permutation.
#[test]
fn attention_gradients_of_permuted_heads_match_f64() {
    each_backend(|| {
        let mut rng = Rng::new(3036);
        let (b, s, h, d) = (2, 67, 3, 32);
        for dtype in [DType::BF16, DType::F16] {
            let [q, k, v, g] = [0; 4].map(|_| rand_f(&mut rng, dtype, &[b, s, h, d], 1.0));
            let heads = |x: &Nd<f64>| x.permute(&[0, 2, 1, 3]);
            let m = Masks { keep: None, add: None, causal: true };
            let want = grads_ref(&heads(&q), &heads(&k), &heads(&v), &heads(&g), &m, 1.0 / (d as f64).sqrt());
            let got = grads_kiln(dev(), dtype, [&q, &k, &v, &heads(&g)], &m, true);
            for ((x, got), want) in ["dq", "dk", "dv"].iter().zip(&got).zip(&want) {
                check_f(got, dtype, want, 2.0 * largest(want), &format!("permuted heads {x} on {dtype}"));
            }
        }
    });
}

/// The gradient of a fused QKV projection's output, `[b, s, 3, h, d]`
/// sliced into heads as GPT-2 does: the `multi-output` pass writes the
/// three gradients into that layout (`attention_grad wrt=qkv`) where a
/// `cat` joined them. Against f64, and bit for bit against the same heads
/// as three variables of their own (`wrt=kv+q`, unpacked), on every
/// backend: causal, and with a key-padding mask. On CUDA both `dq`s read
/// the score gradients the `dk, dv` kernel stored
/// (`codegen/attention_grad_ds.rs`); `attention_scratch.rs` compares them
/// with the `dq` kernel that recomputes them.
#[test]
fn attention_gradients_in_a_fused_projections_layout() {
    each_backend(|| {
        let mut rng = Rng::new(3039);
        let (b, s, h) = (2, 70, 3);
        let keep = Nd::from_fn(&[b, 1, 1, s], |i| (i[3] % 5 != 2) as i64);
        // Heads of 128 take the kernels that keep keys and values (`dk,
        // dv`) and queries and gradients (`dq`) in shared memory.
        for (dtype, masked, d) in [
            (DType::BF16, false, 32),
            (DType::F16, false, 32),
            (DType::BF16, true, 32),
            (DType::BF16, false, 128),
            (DType::F16, true, 128),
        ] {
            let qkv = rand_f(&mut rng, dtype, &[b, s, 3, h, d], 1.0);
            let g = rand_f(&mut rng, dtype, &[b, h, s, d], 1.0);
            let got = packed_grads(dev(), dtype, &qkv, &g, masked.then_some(&keep));
            // The same heads as variables `[b, s, h, d]` of their own.
            let bshd = |i: usize| Nd::new(qkv.slice(2, i, 1, 1).to_vec(), &[b, s, h, d]);
            let m = Masks { keep: masked.then_some(&keep), add: None, causal: !masked };
            let apart = grads_kiln(dev(), dtype, [&bshd(0), &bshd(1), &bshd(2), &g], &m, true);
            let heads = |x: &Nd<f64>| x.permute(&[0, 2, 1, 3]).contiguous();
            let want = grads_ref(
                &heads(&bshd(0)),
                &heads(&bshd(1)),
                &heads(&bshd(2)),
                &g,
                &m,
                1.0 / (d as f64).sqrt(),
            );
            let want = pack_heads(want.map(|x| x.to_vec()), [b, s, h, d]);
            check_f(
                &got,
                dtype,
                &want,
                2.0 * largest(&want),
                &format!("packed q, k, v gradients on {dtype}"),
            );
            let apart = pack_heads([0, 1, 2].map(|i| read_f(&apart[i]).to_vec()), [b, s, h, d]);
            let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
            assert!(
                bits(read_f(&got).to_vec()) == bits(apart.to_vec()),
                "{dtype}: the packed kernels' bits differ from the unpacked ones"
            );
        }
    });
}

/// Three `[b, h, s, d]` gradients (q's, k's, v's) laid out as a fused
/// QKV projection's rows are, `[b, s, 3, h, d]`.
pub(crate) fn pack_heads(parts: [Vec<f64>; 3], [b, s, h, d]: [usize; 4]) -> Nd<f64> {
    let mut out = vec![0.0; b * s * 3 * h * d];
    for (p, x) in parts.iter().enumerate() {
        let x = Nd::new(x.clone(), &[b, h, s, d]).permute(&[0, 2, 1, 3]).contiguous().to_vec();
        for (row, chunk) in x.chunks(h * d).enumerate() {
            out[(row * 3 + p) * h * d..][..h * d].copy_from_slice(chunk);
        }
    }
    Nd::new(out, &[b, s, 3, h, d])
}

/// kiln's gradient of `sum(attention(q, k, v) ⊙ g)` with respect to a
/// fused QKV projection's output `qkv` (`[b, s, 3, h, d]`, a variable of
/// `dtype`, sliced into heads as GPT-2 does): causal, or with the key
/// padding `keep` when given. Checks that the backward writes the
/// projection's layout itself (`attention_grad wrt=qkv`, no `cat`).
pub(crate) fn packed_grads(
    ctx: Context,
    dtype: DType,
    qkv: &Nd<f64>,
    g: &Nd<f64>,
    keep: Option<&Nd<i64>>,
) -> Tensor {
    let ctx = &ctx;
    let [b, s, _, h, d] = qkv.shape[..] else { panic!("qkv is [b, s, 3, h, d]") };
    let var = ctx.variable("qkv", tensor_f(ctx, dtype, qkv)).expect("a variable");
    let part = |i: usize| var.tensor().narrow(2, i, 1).reshape([b, s, h, d]).permute(&[0, 2, 1, 3]);
    let mask = keep.map(|k| tensor_i(ctx, DType::Bool, k));
    let out = part(0).scaled_dot_product_attention(&part(1), &part(2), mask.as_ref(), keep.is_none(), None);
    let loss = (&out * &tensor_f(ctx, dtype, g)).sum_all();
    let got = loss.backward().expect("backward").get(&var).expect("a gradient").clone();
    let text = ctx.explain(&[&got]).expect("explain");
    assert!(text.contains("wrt=qkv") && !text.contains(" = cat "), "{dtype}: the cat stays:\n{text}");
    got
}

/// The tensor-core backward kernels on the CPU emulator in every CI run
/// (the tests above cover them there with `KILN_TEST_EMULATE=1`, and on a
/// GPU): bf16 heads of 32 with values of 16, two query blocks and two key
/// tiles, causal with a key-padding mask and with an additive mask; heads
/// of 64 (the `dk, dv` kernel that keeps a block's own rows in shared
/// memory, capped at 168 registers where it stores `dSᵀ`) and heads of
/// 128 with values of 80 (both such kernels), causal.
#[cfg(feature = "cuda-emulator")]
#[test]
fn attention_backward_kernels_run_on_the_emulator() {
    let mut rng = Rng::new(3037);
    let dtype = DType::BF16;
    for (b, h, sq, sk, d, dv) in [(1, 2, 70, 75, 32, 16), (1, 1, 70, 75, 64, 64), (1, 1, 70, 75, 128, 80)] {
        let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
        let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
        let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
        let g = rand_f(&mut rng, dtype, &[b, h, sq, dv], 1.0);
        let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[3] % 4 != 3) as i64);
        let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
        let cases = [
            ("key padding, causal", Masks { keep: Some(&keep), add: None, causal: true }),
            ("additive", Masks { keep: None, add: Some(&add), causal: false }),
        ];
        for (name, m) in cases.into_iter().take(if d >= 64 { 1 } else { 2 }) {
            let want = grads_ref(&q, &k, &v, &g, &m, 1.0 / (d as f64).sqrt());
            let got = grads_kiln(Context::cuda_emulated(), dtype, [&q, &k, &v, &g], &m, false);
            for ((x, got), want) in ["dq", "dk", "dv"].iter().zip(&got).zip(&want) {
                let what = format!("emulated attention {name} {x} [{sq},{sk},{d},{dv}]");
                check_f(got, dtype, want, 2.0 * largest(want), &what);
            }
        }
    }
}

/// The fused backward reads the log-sum-exp its forward wrote: the
/// optimized graph of a bf16 gradient has `attention_delta` over the
/// forward's `extra output=1` and no `attention_stats` (which would
/// recompute every score), while an f32 one is expanded into matmuls and
/// a softmax and has neither. The values are checked by the tests above
/// on every backend.
#[test]
fn the_fused_backward_reads_the_forwards_log_sum_exp() {
    let mut rng = Rng::new(3038);
    let (b, h, s, d) = (1, 2, 20, 16);
    for dtype in [DType::BF16, DType::F32] {
        let [q, k, v, g] = [0; 4].map(|_| rand_f(&mut rng, dtype, &[b, h, s, d], 1.0));
        let ctx = Context::cpu();
        let m = Masks { keep: None, add: None, causal: true };
        let grads = grads_kiln(ctx.clone(), dtype, [&q, &k, &v, &g], &m, false);
        let text = ctx.explain(&grads.iter().collect::<Vec<_>>()).expect("explain");
        let fused = dtype == DType::BF16;
        assert_eq!(text.contains("attention_delta"), fused, "{dtype}:\n{text}");
        assert_eq!(text.contains("output=1"), fused, "{dtype}:\n{text}");
        assert!(!text.contains("attention_stats"), "{dtype}: the stats recompute the scores:\n{text}");
    }
}

/// A NaN in one query row (of one head) reaches that row's `dq`, and
/// the `dk` and `dv` of every key the row sees, as in PyTorch; the other
/// query rows' `dq` and the other head stay finite. Whether the keys the
/// row does not see get NaN is not specified: a product `dSᵀ q` meets the
/// NaN row with weight 0 (`0 · NaN`) in the expanded matmuls and inside a
/// tensor-core tile, not in the CPU kernel, which skips removed pairs
/// (PyTorch's math and flash backends differ the same way). bf16 runs
/// the fused kernels (the forward writes a NaN log-sum-exp for the row),
/// f32 the expanded matmuls; heads of 64 and 128 the kernels an sm_90
/// GPU runs on `wgmma` (`codegen/attention_grad_wgmma.rs`).
#[test]
fn a_nan_query_row_makes_its_gradients_nan_and_no_other_rows() {
    each_backend(|| {
        let mut rng = Rng::new(3039);
        let (b, h, s) = (1, 2, 70);
        let nan_row = 5;
        for (dtype, d) in [(DType::BF16, 32), (DType::F32, 32), (DType::BF16, 64), (DType::F16, 128)] {
            let q0 = rand_f(&mut rng, dtype, &[b, h, s, d], 1.0);
            let q = Nd::from_fn(&[b, h, s, d], |i| {
                if i[1] == 1 && i[2] == nan_row && i[3] == 3 {
                    f64::NAN
                } else {
                    q0.get(i)
                }
            });
            let [k, v, g] = [0; 3].map(|_| rand_f(&mut rng, dtype, &[b, h, s, d], 1.0));
            let m = Masks { keep: None, add: None, causal: true };
            let got = grads_kiln(dev(), dtype, [&q, &k, &v, &g], &m, false);
            let [dq, dk, dv] = [0, 1, 2].map(|x| read_f(&got[x]));
            for i in 0..s {
                for c in 0..d {
                    for head in 0..h {
                        let at = [0, head, i, c];
                        let what = format!("{dtype} heads of {d}: head {head} row {i} column {c}");
                        assert_eq!(dq.get(&at).is_nan(), head == 1 && i == nan_row, "dq {what}");
                        // Causal: row 5 sees keys 0..=5 of head 1.
                        if head == 0 || i <= nan_row {
                            let reached = head == 1;
                            assert_eq!(dk.get(&at).is_nan(), reached, "dk {what}");
                            assert_eq!(dv.get(&at).is_nan(), reached, "dv {what}");
                        }
                    }
                }
            }
        }
    });
}
