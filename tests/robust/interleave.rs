//! Many plans interleaved on one context over many iterations: the test
//! class that missed issue 17 (a replayed CUDA graph read a stale input
//! because its input slot remembered an allocation, not the bytes in it).
//!
//! Each seed is a list of actions ([`actions::generate`]): per iteration it
//! records a few small programs whose operands are other plans' outputs,
//! variables or fresh data, realizes some, reads some (directly and through
//! a second plan), holds handles across iterations and drops others,
//! assigns variables and reads them from other plans. Every read is
//! compared with an f64 model of every value. A seed's plans come from a
//! small menu, so each is compiled once and then run (on CUDA: captured
//! and replayed) many times, and output sets cycle as handles are held
//! and dropped; each test checks that it did (the counts are printed).
//!
//! It runs on the CPU, on the CUDA emulator (feature `cuda-emulator`,
//! which emulates graph capture and replay with the GPU's bookkeeping) and
//! on a GPU when there is one (`KILN_REQUIRE_CUDA=1`: a missing GPU fails).
//!
//! Environment: `KILN_INTERLEAVE_SEEDS=n` (default 5, for CI's time;
//! more for a soak), `..._ITERS=n`
//! (default 100), `KILN_INTERLEAVE_SEED=s` (only seed `s`, its actions
//! printed); `KILN_INTERLEAVE_SHRINK=1` shrinks a failing seed's actions
//! to a short list that fails the same way, each try on a fresh context.

mod actions;

use actions::{generate, run, Action};
use kiln::prelude::*;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.trim().parse().unwrap_or_else(|_| panic!("{name}={v} is not a whole number")))
}

/// A device to test: its name and how to make a fresh context on it.
type Device = (&'static str, fn() -> Context);

/// The contexts to test, by name: a maker per device.
fn devices() -> Vec<Device> {
    let mut out: Vec<Device> = vec![("cpu", Context::cpu)];
    #[cfg(feature = "cuda-emulator")]
    out.push(("cuda-emulated", Context::cuda_emulated));
    match Context::cuda(0) {
        Ok(_) => out.push(("cuda", || Context::cuda(0).unwrap_or_else(|e| panic!("CUDA went away: {e}")))),
        Err(e) => {
            if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
            }
            eprintln!("interleave: CUDA skipped ({})", e.to_string().lines().next().unwrap_or_default());
        }
    }
    out
}

/// Removes chunks of `actions` while `fails` still holds (halves, then
/// quarters, down to single actions).
fn shrink(mut actions: Vec<Action>, fails: impl Fn(&[Action]) -> bool) -> Vec<Action> {
    let mut chunk = actions.len() / 2;
    while chunk >= 1 {
        let mut start = 0;
        while start < actions.len() {
            let mut fewer = actions.clone();
            fewer.drain(start..(start + chunk).min(actions.len()));
            if fails(&fewer) {
                actions = fewer;
            } else {
                start += chunk;
            }
        }
        chunk /= 2;
    }
    actions
}

#[test]
fn many_plans_interleaved_read_what_the_model_says() {
    let iters = env_u64("KILN_INTERLEAVE_ITERS").unwrap_or(100) as usize;
    let seeds: Vec<u64> = match env_u64("KILN_INTERLEAVE_SEED") {
        Some(s) => vec![s],
        None => (0..env_u64("KILN_INTERLEAVE_SEEDS").unwrap_or(5)).collect(),
    };
    let mut failures = Vec::new();
    for (name, make) in devices() {
        let mut totals = kiln::Stats::default();
        for &seed in &seeds {
            let actions = generate(seed, iters);
            if seeds.len() == 1 {
                for (i, a) in actions.iter().enumerate() {
                    eprintln!("{i:4}: {a}");
                }
            }
            let ctx = make();
            let result = run(&ctx, &actions);
            let s = ctx.stats();
            totals.compiles += s.compiles;
            totals.cache_hits += s.cache_hits;
            totals.graph_captures += s.graph_captures;
            totals.graph_replays += s.graph_replays;
            totals.graph_input_copies += s.graph_input_copies;
            if let Err(m) = result {
                let mut msg = format!("{name}, seed {seed}: action {} ({}): {}", m.at, m.action, m.message);
                if std::env::var("KILN_INTERLEAVE_SHRINK").is_ok_and(|v| v == "1") {
                    let small = shrink(actions[..=m.at].to_vec(), |a| run(&make(), a).is_err());
                    msg.push_str("\n  shrunk to:");
                    for a in &small {
                        msg.push_str(&format!("\n    {a}"));
                    }
                }
                eprintln!("{msg}");
                failures.push(msg);
            }
        }
        eprintln!(
            "interleave {name}: {} seeds x {iters} iterations: {} plans compiled, {} cache hits, {} graphs captured, {} replays, {} input copies",
            seeds.len(),
            totals.compiles,
            totals.cache_hits,
            totals.graph_captures,
            totals.graph_replays,
            totals.graph_input_copies
        );
        if seeds.len() > 1 && failures.is_empty() {
            // The point of the test: plans run many times, and on graph
            // devices their output sets cycle.
            assert!(totals.cache_hits >= 5 * totals.compiles, "{name}: plans were not rerun enough");
            if name != "cpu" && totals.graph_captures > 0 {
                assert!(totals.graph_replays >= 5 * totals.graph_captures, "{name}: too few replays");
                assert!(totals.graph_captures > totals.compiles / 2, "{name}: output sets never cycled");
            }
        }
    }
    assert!(failures.is_empty(), "{} seed(s) read wrong values:\n{}", failures.len(), failures.join("\n"));
}

/// Issue 17's repro: a realized intermediate read through a second plan,
/// then dropped, ten times. With input slots keyed by allocation, every
/// value from k = 2 on was k = 1's on the GPU.
#[test]
fn a_second_plan_reads_the_current_output_of_a_replayed_plan() {
    for (name, make) in devices() {
        let ctx = make();
        let n = 1024;
        let mut wrong = Vec::new();
        for k in 0..10 {
            let x = ctx.tensor(&vec![k as f32 * 0.1; n], [n]);
            let y = x.exp();
            y.realize().unwrap();
            let v = (&y * 2.0).sum_all().item::<f32>().unwrap() as f64;
            drop(y);
            ctx.tensor(&[0f32], [1]).sum_all().item::<f32>().unwrap();
            let want = 2.0 * n as f64 * (0.1 * k as f64).exp();
            if (v - want).abs() > 1e-5 * want {
                wrong.push(format!("k = {k}: {v}, want {want}"));
            }
        }
        assert!(wrong.is_empty(), "{name}: {}", wrong.join("; "));
    }
}
