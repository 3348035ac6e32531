//! The Hopper attention forward (`codegen/attention_wgmma.rs`). On an sm_90
//! GPU the default takes it for every f16/bf16 attention whose heads it
//! takes, and `KILN_CUDA_WGMMA=0` keeps the `mma.sync` kernel. The cases run
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
//! rows).

use crate::reference::*;
use crate::transformer::{attention_ref, mask_cases};
use kiln::prelude::*;

const TEST: &str = "attention_wgmma::hopper_attention_matches_f64";
/// Set in the child (run with `KILN_CUDA_WGMMA=0`).
const CHILD: &str = "KILN_TEST_WGMMA_CHILD";

/// Whether `ctx` is an sm_90 GPU, whose plans may take the `wgmma` kernel.
fn hopper(ctx: &Context) -> bool {
    let device = ctx.device_description();
    device.starts_with("cuda:") && device.ends_with("(sm_90)")
}

#[test]
fn hopper_attention_matches_f64() {
    let child = std::env::var(CHILD).is_ok();
    let wgmma = std::env::var("KILN_CUDA_WGMMA").as_deref() != Ok("0");
    each_backend(|| cases(wgmma));
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
                    // (Before the read: a report of a computed tensor has no
                    // attention left.)
                    let report = ctx.report(&[&got]).unwrap_or_else(|e| panic!("{what}: report: {e}"));
                    let held = report.kernel_sources().iter().any(|k| k.source.contains("wgmma.mma_async"));
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
