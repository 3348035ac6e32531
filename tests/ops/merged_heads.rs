//! Attention whose heads are merged right after it, as a transformer's
//! output projection reads them (`o.permute(0, 2, 1, 3).reshape(b, sq,
//! h * dv)`): the `attention-layout` pass has the attention write `[b,
//! sq, h, dv]` itself (`layout=bshd`), so every kernel that can run an
//! attention stores its rows in that order. Each case is checked against
//! the f64 reference merged the same way, on every backend of the suite.

use crate::reference::*;
use crate::transformer::attention_ref;
use kiln::prelude::*;

/// `o [b, h, sq, dv]` merged into `[b, sq, h * dv]`.
fn merged(o: &Nd<f64>) -> Nd<f64> {
    let (b, h, sq, dv) = (o.shape[0], o.shape[1], o.shape[2], o.shape[3]);
    o.permute(&[0, 2, 1, 3]).contiguous().reshape(&[b, sq, h * dv])
}

/// One kernel family per shape (on CUDA; the CPU runs them all through
/// its own kernels): the one-row CUDA-core kernel with a row's keys split
/// over threads (f64, few rows) and without (f64 heads of 200, whose
/// merge would not fit in shared memory), the
/// register-tiled f32 kernel whole (30 rows) and with its keys split over
/// blocks (a head of 260 rows), the 3xTF32 tensor-core kernel (f32, 80
/// rows), the tensor-core kernel (f16 and bf16, head dims
/// 32 and 64, more than one block of query rows), and the split-key
/// decode kernel (a few query rows) with one chunk of keys and several.
/// Plain, causal and with a key-padding mask.
#[test]
fn merged_heads_match_f64_on_every_attention_kernel() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2011);
        let shapes = [
            // (dtype, b, h, sq, sk, d)
            (DType::F64, 1, 2, 19, 40, 24),
            (DType::F64, 1, 2, 19, 30, 200),
            (DType::F32, 1, 2, 80, 80, 32),
            (DType::F32, 1, 2, 30, 80, 32),
            (DType::F32, 1, 1, 260, 260, 32),
            (DType::F32, 2, 3, 37, 45, 20),
            (DType::F16, 2, 2, 70, 75, 32),
            (DType::BF16, 1, 2, 70, 90, 64),
            (DType::F32, 2, 3, 1, 40, 16),
            (DType::BF16, 2, 3, 2, 700, 64),
        ];
        for (dtype, b, h, sq, sk, d) in shapes {
            let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
            let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
            let v = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
            let (tq, tk, tv) =
                (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
            let scale = 1.0 / (d as f64).sqrt();
            // Batch row 0 keeps two keys in three; any other keeps all.
            let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[0] != 0 || i[3] % 3 != 1) as i64);
            let cases: [(&str, bool, Option<&Nd<i64>>); 3] =
                [("plain", false, None), ("causal", true, None), ("key padding", false, Some(&keep))];
            for (name, causal, mask) in cases {
                let tm = mask.map(|m| tensor_i(&ctx, DType::Bool, m));
                let o = tq.scaled_dot_product_attention(&tk, &tv, tm.as_ref(), causal, None);
                let got = o.permute(&[0, 2, 1, 3]).reshape([b, sq, h * d]);
                let want = merged(&attention_ref(&q, &k, &v, mask, None, causal, scale));
                let tol = if dtype == DType::F64 { 1.0 } else { 8.0 };
                let what = format!("merged heads, {name}, {dtype} [{b},{h},{sq},{d}] over {sk} keys");
                let plan = ctx.explain(&[&got]).expect("explain");
                assert!(plan.contains("layout=bshd"), "{what}: the attention kept its layout:\n{plan}");
                check_f(&got, dtype, &want, tol, &what);
            }
        }
    });
}

/// An attention that is also read whole keeps the `[b, h, sq, dv]`
/// layout, and both of its readers see the right values.
#[test]
fn an_attention_read_twice_keeps_its_layout() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(2013);
        let (b, h, s, d) = (2, 3, 11, 8);
        let x = rand_f(&mut rng, DType::F32, &[b, h, s, d], 1.0);
        let t = tensor_f(&ctx, DType::F32, &x);
        let o = t.scaled_dot_product_attention(&t, &t, None, true, None);
        let m = o.permute(&[0, 2, 1, 3]).reshape([b, s, h * d]);
        let want = attention_ref(&x, &x, &x, None, None, true, 1.0 / (d as f64).sqrt());
        let plan = ctx.explain(&[&m, &o]).expect("explain");
        assert!(!plan.contains("layout=bshd"), "an attention read twice changed its layout:\n{plan}");
        ctx.realize(&[&m, &o]).expect("realize both");
        check_f(&m, DType::F32, &merged(&want), 4.0, "merged heads beside the whole output");
        check_f(&o, DType::F32, &want, 4.0, "the whole output beside the merged heads");
    });
}

/// A trained attention whose heads are merged for the projection: the
/// forward writes `[b, sq, h, dv]` all the same, and the gradient's
/// statistics (and on CUDA the log-sum-exp the forward writes) read its
/// output back through the permute. The gradients of `sum(merge(o) ⊙
/// G)` are the f64 reference's, for tensor-core heads (bf16, f16) and
/// f32 (whose gradient is expanded into plain ops, so its attention keeps
/// the `[b, h, sq, dv]` layout), causal and with a key-padding mask.
#[test]
fn gradients_through_merged_heads_match_f64() {
    use crate::attention_grad::{grads_ref, largest, Masks};
    each_backend(|| {
        let mut rng = Rng::new(2017);
        let (b, h, s, d) = (2, 3, 70, 32);
        let keep = Nd::from_fn(&[b, 1, 1, s], |i| (i[3] % 5 != 2) as i64);
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for m in [
                Masks { keep: None, add: None, causal: true },
                Masks { keep: Some(&keep), add: None, causal: false },
            ] {
                let ctx = dev();
                let (q, k, v) = (
                    rand_f(&mut rng, dtype, &[b, h, s, d], 1.0),
                    rand_f(&mut rng, dtype, &[b, h, s, d], 1.0),
                    rand_f(&mut rng, dtype, &[b, h, s, d], 1.0),
                );
                let g = rand_f(&mut rng, dtype, &[b, h, s, d], 1.0);
                let vars: Vec<Variable> = [("q", &q), ("k", &k), ("v", &v)]
                    .iter()
                    .map(|(n, x)| ctx.variable(n, tensor_f(&ctx, dtype, x)).expect("a variable"))
                    .collect();
                let mask = m.keep.map(|keep| tensor_i(&ctx, DType::Bool, keep));
                let o = vars[0].tensor().scaled_dot_product_attention(
                    &vars[1].tensor(),
                    &vars[2].tensor(),
                    mask.as_ref(),
                    m.causal,
                    None,
                );
                let merged_o = o.permute(&[0, 2, 1, 3]).reshape([b, s, h * d]);
                let loss = (&merged_o * &tensor_f(&ctx, dtype, &merged(&g))).sum_all();
                let grads = loss.backward().expect("backward");
                let got: Vec<Tensor> =
                    vars.iter().map(|x| grads.get(x).expect("a gradient").clone()).collect();
                // The loss and the gradients in one plan, as a training
                // step runs them: the forward's merge is in it.
                let step: Vec<&Tensor> = std::iter::once(&loss).chain(&got).collect();
                let plan = ctx.explain(&step).expect("explain");
                let what = format!("{dtype}, causal {}, masked {}", m.causal, m.keep.is_some());
                // An f32 gradient is expanded into plain ops (the
                // attention-grad pass), which read the output as a value:
                // the attention keeps its layout there.
                let merged_forward = dtype != DType::F32;
                assert_eq!(
                    plan.contains("layout=bshd"),
                    merged_forward,
                    "{what}: layout as expected:\n{plan}"
                );
                ctx.realize(&step).expect("the step");
                let want = grads_ref(&q, &k, &v, &g, &m, 1.0 / (d as f64).sqrt());
                for ((x, got), want) in ["dq", "dk", "dv"].iter().zip(&got).zip(&want) {
                    check_f(got, dtype, want, 2.0 * largest(want), &format!("merged heads {x}, {what}"));
                }
            }
        }
    });
}
