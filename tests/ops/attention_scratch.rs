//! The score-gradient scratch of the CUDA attention backward
//! (`codegen/attention_grad_ds.rs`): a `wrt=kv+q` or `wrt=qkv` node runs
//! its `dk, dv` kernel storing every `dSᵀ` tile and then a `dq` kernel
//! reading them, once per group of batches the scratch holds, each
//! launch's operands and outputs moved on to its group's first batch.
//!
//! The same gradients three ways, bit for bit: one launch for every batch
//! (the scratch holds them all here), a launch per batch
//! (`KILN_CUDA_ATTENTION_DS_BATCHES=1`), and the `dq` kernel that
//! recomputes the scores instead (`KILN_CUDA_ATTENTION_DS=0`). The last
//! two run in child processes of this test binary: the variables are read
//! when a plan is lowered, and setting them here would race with the
//! other tests' threads.

use crate::attention_grad::{grads_kiln, grads_ref, largest, pack_heads, packed_grads, Masks};
use crate::reference::*;
use kiln::prelude::*;

const TEST: &str = "attention_scratch::launches_per_batch_group_and_recomputing_give_the_same_bits";
/// Where a child writes its gradients' bits.
const OUT: &str = "KILN_TEST_SCRATCH_OUT";

/// A backend's name and how to make a fresh context on it.
type Backend = (&'static str, fn() -> Context);

/// The CUDA-backed contexts here: the emulator (with its feature) and a GPU.
fn cuda_contexts() -> Vec<Backend> {
    let mut out: Vec<Backend> = Vec::new();
    #[cfg(feature = "cuda-emulator")]
    out.push(("emulated", Context::cuda_emulated));
    if Context::cuda(0).is_ok() {
        out.push(("cuda", || Context::cuda(0).expect("CUDA went away")));
    }
    out
}

/// Every gradient's bits on context `make`, each gradient checked
/// against f64 first: dq, dk and dv of a causal attention with a key
/// padding mask that differs per batch (3 batches of 2 heads, 70 queries,
/// 75 keys, heads of 32 with values of 16), then the gradient of a fused
/// QKV projection's output (`[3, 70, 3, 2, 32]`, its own mask).
fn gradient_bits(name: &str, make: fn() -> Context) -> Vec<u64> {
    let mut rng = Rng::new(3040);
    let dtype = DType::BF16;
    let (b, h, sq, sk, d, dv) = (3, 2, 70, 75, 32, 16);
    let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
    let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
    let v = rand_f(&mut rng, dtype, &[b, h, sk, dv], 1.0);
    let g = rand_f(&mut rng, dtype, &[b, h, sq, dv], 1.0);
    let keep = Nd::from_fn(&[b, 1, 1, sk], |i| ((i[3] + 2 * i[0]) % 5 != 2) as i64);
    let m = Masks { keep: Some(&keep), add: None, causal: true };
    let want = grads_ref(&q, &k, &v, &g, &m, 1.0 / (d as f64).sqrt());
    let got = grads_kiln(make(), dtype, [&q, &k, &v, &g], &m, false);
    let mut bits = Vec::new();
    for ((x, got), want) in ["dq", "dk", "dv"].iter().zip(&got).zip(&want) {
        check_f(got, dtype, want, 2.0 * largest(want), &format!("{name}: {x}"));
        bits.extend(read_f(got).to_vec().into_iter().map(f64::to_bits));
    }
    let (s, d) = (70, 32);
    let qkv = rand_f(&mut rng, dtype, &[b, s, 3, h, d], 1.0);
    let g = rand_f(&mut rng, dtype, &[b, h, s, d], 1.0);
    let keep = Nd::from_fn(&[b, 1, 1, s], |i| ((i[3] + i[0]) % 4 != 1) as i64);
    let got = packed_grads(make(), dtype, &qkv, &g, Some(&keep));
    let heads = |i: usize| Nd::new(qkv.slice(2, i, 1, 1).to_vec(), &[b, s, h, d]).permute(&[0, 2, 1, 3]);
    let m = Masks { keep: Some(&keep), add: None, causal: false };
    let want = grads_ref(
        &heads(0).contiguous(),
        &heads(1).contiguous(),
        &heads(2).contiguous(),
        &g,
        &m,
        1.0 / (d as f64).sqrt(),
    );
    let want = pack_heads(want.map(|x| x.to_vec()), [b, s, h, d]);
    check_f(&got, dtype, &want, 2.0 * largest(&want), &format!("{name}: packed q, k, v gradients"));
    bits.extend(read_f(&got).to_vec().into_iter().map(f64::to_bits));
    bits
}

#[test]
fn launches_per_batch_group_and_recomputing_give_the_same_bits() {
    let contexts = cuda_contexts();
    if let Ok(path) = std::env::var(OUT) {
        // A child: this test alone, under the parent's variables.
        let text: Vec<String> = contexts
            .iter()
            .map(|&(name, make)| {
                gradient_bits(name, make).iter().map(|x| format!("{x:x}")).collect::<Vec<_>>().join(" ")
            })
            .collect();
        std::fs::write(&path, text.join("\n")).expect("the child writes its bits");
        return;
    }
    if contexts.is_empty() {
        return;
    }
    let here: Vec<String> = contexts
        .iter()
        .map(|&(name, make)| {
            gradient_bits(name, make).iter().map(|x| format!("{x:x}")).collect::<Vec<_>>().join(" ")
        })
        .collect();
    let dir = std::env::temp_dir();
    for (var, value) in [("KILN_CUDA_ATTENTION_DS_BATCHES", "1"), ("KILN_CUDA_ATTENTION_DS", "0")] {
        let path = dir.join(format!("kiln-scratch-{}-{var}", std::process::id()));
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = std::process::Command::new(exe)
            .args(["--exact", TEST, "--nocapture"])
            .env(var, value)
            .env(OUT, &path)
            .output()
            .expect("the test binary runs");
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && log.contains("1 passed"),
            "the child with {var}={value} failed:\n{log}"
        );
        let there = std::fs::read_to_string(&path).expect("the child's bits");
        let _ = std::fs::remove_file(&path);
        let there: Vec<&str> = there.lines().collect();
        assert_eq!(there.len(), here.len(), "{var}={value}: the child ran on other contexts");
        for ((name, _), (a, b)) in contexts.iter().zip(here.iter().zip(there)) {
            assert!(a == b, "{name}: the gradients with {var}={value} differ from one launch's");
        }
    }
}

/// An attention with no keys, no queries or no batch: its `q` and `kv`
/// gradients are one `wrt=kv+q` node whose value (`dk, dv`) or extra
/// output (`dq`) can be empty while the other is not. With no keys every
/// query row's gradient is 0 (the forward writes zeros there); with no
/// queries every key's. On the CPU and the CUDA-backed contexts.
#[test]
fn gradients_of_attentions_with_nothing_to_attend() {
    let dtype = DType::BF16;
    let mut rng = Rng::new(3041);
    let mut contexts: Vec<Backend> = vec![("cpu", Context::cpu)];
    contexts.extend(cuda_contexts());
    for (b, sq, sk) in [(2, 70, 0), (2, 0, 75), (0, 70, 75)] {
        let (h, d) = (2, 32);
        let q = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
        let k = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
        let v = rand_f(&mut rng, dtype, &[b, h, sk, d], 1.0);
        let g = rand_f(&mut rng, dtype, &[b, h, sq, d], 1.0);
        let m = Masks { keep: None, add: None, causal: false };
        for &(name, make) in &contexts {
            let got = grads_kiln(make(), dtype, [&q, &k, &v, &g], &m, false);
            for (x, (got, len)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip([sq, sk, sk])) {
                let values = read_f(got).to_vec();
                assert_eq!(values.len(), b * h * len * d, "{name}: {x} of [{b},{h},{sq},{sk}]");
                assert!(values.iter().all(|&x| x == 0.0), "{name}: {x} of [{b},{h},{sq},{sk}] is not 0");
            }
        }
    }
}
