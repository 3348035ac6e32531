//! The Hopper attention forward (`codegen/attention_wgmma.rs`) and the
//! backward's `dk, dv` kernel (`codegen/attention_grad_wgmma.rs`). On an
//! sm_90 GPU the default takes them for every f16/bf16 attention whose
//! heads they take, and `KILN_CUDA_WGMMA=0` keeps the `mma.sync` kernels. The cases run
//! on every backend under the default, where each sm_90 plan must hold the
//! `wgmma` kernel, then, where CUDA device 0 is an sm_90 part, again in a
//! child process of this test binary with `KILN_CUDA_WGMMA=0` (the variable
//! is read when a plan is lowered; setting it here would race with the
//! other tests' threads), where none may: so the `mma.sync` kernel stays
//! checked on the GPU too. The emulator has no `wgmma`: its plans keep the
//! `mma.sync` kernel.
//!
//! Cases: more query blocks (64 rows) and key tiles (64) than one, the last
//! of each short, so both key buffers alternate; heads of 64 and 128 for
//! queries and keys (one and two swizzled column blocks) and for values
//! (`m64n64k16` and `m64n128k16`), in every pairing; every mask kind and
//! causal; heads permuted out of a `[b, s, h, d]` projection (strided
//! rows). The gradients: dq, dk and dv together (the `dk, dv` kernel
//! storing `dSᵀ` for the `dq` kernel) and dk, dv alone (no scratch), with
//! more key blocks and query tiles than one, the last of each short
//! (both buffers of queries and gradients alternate), causal with a key
//! padding and with an additive mask, heads of 64 and 128 in every pairing.

use crate::attention_grad::{grads_ref, largest, Masks};
use crate::reference::*;
use crate::transformer::{attention_ref, mask_cases};
use kiln::prelude::*;

const TEST: &str = "attention_wgmma::hopper_attention_matches_f64";
/// Set in the child (run with `KILN_CUDA_WGMMA=0`).
const CHILD: &str = "KILN_TEST_WGMMA_CHILD";

/// Whether `ctx` is an sm_90 GPU, whose plans may take the `wgmma` kernel.
pub fn hopper(ctx: &Context) -> bool {
    let device = ctx.device_description();
    device.starts_with("cuda:") && device.ends_with("(sm_90)")
}

#[test]
fn hopper_attention_matches_f64() {
    let child = std::env::var(CHILD).is_ok();
    let wgmma = std::env::var("KILN_CUDA_WGMMA").as_deref() != Ok("0");
    each_backend(|| cases(wgmma));
    each_backend(|| gradient_cases(wgmma));
    if child || !Context::cuda(0).is_ok_and(|ctx| hopper(&ctx)) {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--exact", TEST, "--nocapture"])
        .env("KILN_CUDA_WGMMA", "0")
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && log.contains("1 passed"),
        "the child with KILN_CUDA_WGMMA=0 failed:\n{log}"
    );
}

/// Whether a kernel of `ctx`'s plan for `t` whose name starts with
/// `prefix` is a `wgmma` one; panics (naming `what`) where the plan has no
/// such kernel. Taken before `t` is read: a report of a computed tensor
/// holds no attention.
fn holds_wgmma(ctx: &Context, t: &Tensor, prefix: &str, what: &str) -> bool {
    let report = ctx.report(&[t]).unwrap_or_else(|e| panic!("{what}: report: {e}"));
    let kernels: Vec<_> = report.kernel_sources().iter().filter(|k| k.name.starts_with(prefix)).collect();
    assert!(!kernels.is_empty(), "{what}: the plan has no {prefix} kernel");
    kernels.iter().any(|k| k.source.contains("wgmma.mma_async"))
}

/// The gradient cases on the current backend; an sm_90 plan must hold the
/// `wgmma` `dk, dv` kernel exactly where `wgmma`.
fn gradient_cases(wgmma: bool) {
    let mut rng = Rng::new(2032);
    for (dtype, b, h, sq, sk, d, dv) in [
        (DType::BF16, 1, 2, 200, 140, 128, 128),
        (DType::F16, 2, 1, 130, 200, 64, 64),
        (DType::BF16, 1, 1, 70, 130, 128, 64),
        (DType::F16, 1, 2, 130, 70, 64, 128),
    ] {
        let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
        let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
        let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
        let g = rand_f(&mut rng, dtype, &[b, h, sq, dv], 1.0);
        let scale = 1.0 / (d as f64).sqrt();
        let keep = Nd::from_fn(&[b, 1, 1, sk], |i| (i[3] % 6 != 4) as i64);
        let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
        let cases = [
            ("plain", Masks { keep: None, add: None, causal: false }),
            ("key padding, causal", Masks { keep: Some(&keep), add: None, causal: true }),
            ("additive", Masks { keep: None, add: Some(&add), causal: false }),
        ];
        for (name, m) in cases {
            let want = grads_ref(&q, &k, &v, &g, &m, scale);
            for with_q in [true, false] {
                let ctx = dev();
                let what = format!(
                    "attention {name} gradients{}, {dtype} [{b},{h},{sq},{sk}] heads {d}/{dv}",
                    if with_q { "" } else { " of k, v alone" }
                );
                let got = gradients(&ctx, dtype, [&q, &k, &v, &g], &m, with_q);
                if hopper(&ctx) {
                    let held = holds_wgmma(&ctx, &got[1], "attention_grad", &what);
                    assert_eq!(held, wgmma, "{what}: does the sm_90 plan hold the wgmma dk, dv kernel?");
                }
                let names = if with_q { &["dq", "dk", "dv"][..] } else { &["dk", "dv"][..] };
                let wants = if with_q { &want[..] } else { &want[1..] };
                for ((x, got), want) in names.iter().zip(&got).zip(wants) {
                    check_f(got, dtype, want, 2.0 * largest(want), &format!("{what}: {x}"));
                }
            }
        }
    }
}

/// kiln's gradients of `sum(attention(q, k, v) ⊙ g)` in `ctx`: `[dq, dk,
/// dv]` with `with_q`, else `[dk, dv]` (q a constant, so the backward
/// runs the `dk, dv` kernel alone).
fn gradients(
    ctx: &Context,
    dtype: DType,
    [q, k, v, g]: [&Nd<f64>; 4],
    m: &Masks,
    with_q: bool,
) -> Vec<Tensor> {
    let mask = m.tensor(ctx, dtype);
    let tq = tensor_f(ctx, dtype, q);
    let named: Vec<(&str, &Nd<f64>)> =
        if with_q { vec![("q", q), ("k", k), ("v", v)] } else { vec![("k", k), ("v", v)] };
    let vars: Vec<Variable> =
        named.iter().map(|(n, x)| ctx.variable(n, tensor_f(ctx, dtype, x)).expect("a variable")).collect();
    let t = |i: usize| vars[i].tensor();
    let (tq, tk, tv) = if with_q { (t(0), t(1), t(2)) } else { (tq, t(0), t(1)) };
    let out = tq.scaled_dot_product_attention(&tk, &tv, mask.as_ref(), m.causal, None);
    let loss = (&out * &tensor_f(ctx, dtype, g)).sum_all();
    let grads = loss.backward().expect("backward");
    vars.iter().map(|x| grads.get(x).expect("a gradient").clone()).collect()
}

/// Every case on the current backend; an sm_90 plan must hold the `wgmma`
/// kernel exactly where `wgmma`.
fn cases(wgmma: bool) {
    {
        let mut rng = Rng::new(2031);
        for (dtype, b, h, sq, sk, d, dv) in [
            (DType::BF16, 1, 2, 200, 200, 128, 128),
            (DType::F16, 2, 3, 70, 130, 64, 64),
            (DType::BF16, 1, 2, 64, 64, 128, 64),
            (DType::BF16, 2, 1, 130, 65, 64, 128),
        ] {
            let ctx = dev();
            let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
            let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
            let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
            let (tq, tk, tv) =
                (tensor_f(&ctx, dtype, &q), tensor_f(&ctx, dtype, &k), tensor_f(&ctx, dtype, &v));
            let scale = 1.0 / (d as f64).sqrt();
            // The last batch keeps no key: its rows are zeros.
            let keep = Nd::from_fn(&[b, 1, 1, sk], |i| ((i[0] + 1 < b || b == 1) && i[3] % 7 != 3) as i64);
            let add = rand_f(&mut rng, dtype, &[b, h, sq, sk], 1.0);
            let cases = mask_cases(&ctx, dtype, [&q, &k, &v], &keep, &add, scale);
            for (name, mask, causal, want) in cases {
                let what = format!("attention {name}, {dtype} [{b},{h},{sq},{sk}] heads {d}/{dv}");
                let got = tq.scaled_dot_product_attention(&tk, &tv, mask.as_ref(), causal, None);
                if hopper(&ctx) {
                    let held = holds_wgmma(&ctx, &got, "attention", &what);
                    assert_eq!(held, wgmma, "{what}: does the sm_90 plan hold the wgmma kernel?");
                }
                check_f(&got, dtype, &want, 8.0, &what);
            }
        }
        // Heads permuted out of [b, s, h, d]: rows 3 · 2 · 64 elements apart.
        let ctx = dev();
        let dtype = DType::BF16;
        let x = rand_f(&mut rng, dtype, &[2, 150, 3, 2, 64], 1.0);
        let t = tensor_f(&ctx, dtype, &x);
        let heads = |i: usize| t.narrow(2, i, 1).reshape([2, 150, 2, 64]).permute(&[0, 2, 1, 3]);
        let got = heads(0).scaled_dot_product_attention(&heads(1), &heads(2), None, true, None);
        let part =
            |i: usize| x.slice(2, i, 1, 1).reshape(&[2, 150, 2, 64]).permute(&[0, 2, 1, 3]).contiguous();
        let want = attention_ref(&part(0), &part(1), &part(2), None, None, true, 0.125);
        check_f(&got, dtype, &want, 8.0, "attention over heads of a packed projection");
    }
}
