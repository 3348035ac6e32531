//! Graph input slots (`backends/cuda/slots.rs`): a captured plan's slots
//! adopt the buffers bound to them, so several plans reading one variable
//! share its bytes and copy nothing. Whatever a call binds (a new value of
//! the variable, with or without a snapshot of the old one held), every
//! plan reads the value program order says, against a host model.

use crate::reference::*;

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// `x [r, k] @ w [k, n]` in f64.
fn matmul_ref(x: &[f32], w: &[f32], r: usize, k: usize, n: usize) -> Vec<f64> {
    let mut y = vec![0.0; r * n];
    for i in 0..r {
        for j in 0..n {
            y[i * n + j] = (0..k).map(|t| x[i * k + t] as f64 * w[t * n + j] as f64).sum();
        }
    }
    y
}

/// Three plans (three row counts) read one weight variable in a random
/// order for 90 calls. For the first 30 the weights stay put: a capture
/// adopts them (they were bound the run before too), and every replay
/// copies its fresh `x` alone into a slot (on CUDA and the emulator). Then
/// the weights get a new value every 5 calls, half the time with a
/// snapshot of the old value held; every result and every snapshot must
/// match the model.
#[test]
fn plans_reading_one_variable_share_it_and_see_each_new_value() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(41);
        let (k, n) = (48, 24);
        let mut w_model = random(&mut rng, k * n);
        let w = ctx.variable("w", ctx.tensor(&w_model, [k, n])).expect("variable");
        let rows = [1usize, 3, 7];
        let mut snapshots = Vec::new();
        let start = ctx.stats();
        for call in 0..90 {
            let r = rows[rng.range(0, 3) as usize];
            let x = random(&mut rng, r * k);
            let y = ctx.tensor(&x, [r, k]).matmul(&w).to_vec::<f32>().expect("read");
            if call == 29 && ctx.device().starts_with("cuda") {
                let s = ctx.stats();
                let copies = s.graph_input_copies - start.graph_input_copies;
                let captures = s.graph_captures - start.graph_captures;
                let replays = s.graph_replays - start.graph_replays;
                assert!(captures >= 3 && replays > captures, "{captures} captures, {replays} replays");
                assert_eq!(copies, replays, "a replay copies its x alone, never the weights");
            }
            let want = matmul_ref(&x, &w_model, r, k, n);
            for (i, (&g, &e)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - e).abs() < 1e-4 * (1.0 + e.abs()),
                    "call {call}, element {i}: {g} vs {e}"
                );
            }
            if call >= 30 && call % 5 == 0 {
                if call % 10 == 0 {
                    snapshots.push((w.detach(), w_model.clone(), call));
                }
                w.assign(&*w * 0.5 + 0.25).expect("assign");
                w_model = w_model.iter().map(|&v| v * 0.5 + 0.25).collect();
            }
        }
        for (t, want, call) in snapshots {
            let got = t.to_vec::<f32>().expect("snapshot");
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() <= 1e-6 * (1.0 + e.abs()), "the snapshot of call {call}: {g} vs {e}");
            }
        }
    });
}

/// On CUDA, what two more captured plans reading a 16 MB weight variable
/// add to the bytes a context holds: their own small buffers, not a copy
/// of the weights each.
#[test]
fn captured_plans_hold_no_copy_of_the_weights_they_read() {
    each_backend(|| {
        let ctx = dev();
        if ctx.device() != "cuda" {
            return;
        }
        let mut rng = Rng::new(43);
        let (k, n) = (2048, 2048);
        let w = ctx.variable("w", ctx.tensor(&random(&mut rng, k * n), [k, n])).expect("variable");
        let weight_bytes = (k * n * 4) as u64;
        let mut run = |r: usize| {
            let x = ctx.tensor(&random(&mut rng, r * k), [r, k]);
            x.matmul(&w).sum_all().item::<f32>().expect("read");
        };
        for _ in 0..3 {
            run(1);
        }
        let one_plan = ctx.stats().live_bytes;
        for r in [2, 5] {
            for _ in 0..3 {
                run(r);
            }
        }
        let s = ctx.stats();
        assert!(s.graph_captures >= 3, "{} captures", s.graph_captures);
        let more = s.live_bytes.saturating_sub(one_plan);
        assert!(
            more < weight_bytes / 4,
            "two more plans hold {more} B more, for {weight_bytes} B of weights"
        );
    });
}
