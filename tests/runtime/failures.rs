//! Runs that fail while in flight, on every device (issue 33's runtime
//! class): on a GPU a launch returns before its run finds a bad index, so
//! these reach the waits at the in-flight limit, several threads settling
//! one run, and futures waiting on the runtime thread; on the CPU and the
//! emulator runs fail before the launch returns, and the same reads must
//! give the same errors. Every test runs under a watchdog, so a hang fails
//! it. The fake device of `src/runtime/inject` runs the in-flight paths in
//! CPU CI; these run them on a GPU (`KILN_REQUIRE_CUDA=1`, and under
//! compute-sanitizer).

use super::{devices, futures::block_on, futures::poll_once};
use kiln::prelude::*;
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// Runs `body` on a thread of its own and fails if it has not finished
/// within `secs` seconds, times `KILN_TEST_WATCHDOG_SCALE` (default 1;
/// more under compute-sanitizer, which slows kernels many times). The
/// stuck thread is left behind.
fn watchdog<T: Send + 'static>(secs: u64, what: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    let scale = std::env::var("KILN_TEST_WATCHDOG_SCALE").ok().and_then(|v| v.parse::<u64>().ok());
    let secs = secs * scale.unwrap_or(1).max(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = body();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {secs} s (a hang)")
        }
    }
}

/// A result as text, with the node number of an index error (which
/// depends on how a backend's passes numbered the plan) written `N`.
fn text<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => {
            let s = e.to_string();
            match s.rfind("(node ") {
                Some(k) if s.ends_with(')') => format!("{}(node N)", &s[..k]),
                _ => s,
            }
        }
    }
}

/// The error of `table.gather(0, idx)` with index 99 into `size` rows.
fn gather_error(size: usize) -> String {
    format!("runtime error: gather index 99 is out of range for dim 0 of size {size} (node N)")
}

/// The side of a square matmul that keeps a GPU busy for a while, and
/// the slow emulator only briefly.
fn heavy_side(device: &str) -> usize {
    if device == "cuda" {
        2048
    } else {
        16
    }
}

/// Issue 33, defect 4, as filed: two runs in flight, a loop that assigns
/// `w + table.gather(0, idx) + heavy_matmul_sum` and realizes, with one
/// bad index at iteration 4. It made no progress on an H100; it must
/// return the error.
#[test]
fn a_failed_run_in_flight_at_the_limit_is_an_error_not_a_hang() {
    for (name, make) in devices() {
        watchdog(120, &format!("{name}: the defect-4 loop"), move || {
            let ctx = make().with_max_in_flight(2);
            let n = heavy_side(name);
            let table = ctx.tensor(&super::data(64 * 4, 3), [64, 4]);
            let big = ctx.tensor(&super::data(n * n, 4), [n, n]) * 0.01;
            let w = ctx.variable("w", ctx.zeros([4, 4]))?;
            for k in 0..10i64 {
                let bad = if k == 4 { 99 } else { k };
                let idx = ctx.tensor(&[k, bad, 2 * k, 1, 0, 1, 2, 3, 3, 2, 1, 0, 5, 6, 7, 8], [4, 4]);
                let heavy = big.matmul(&big).sum_all();
                w.assign(&*w + table.gather(0, &idx) + &heavy)?;
                // A GPU launches and returns; the CPU runs, and from
                // iteration 4 on every realize fails (the assignment stays
                // pending).
                let r = ctx.realize(&[&w]);
                if r.is_err() {
                    assert_eq!(text(r), gather_error(64), "{name}: iteration {k}");
                    assert!(k >= 4, "{name}: iteration {k} failed");
                }
            }
            assert_eq!(text(w.to_vec::<f32>()), gather_error(64), "{name}");
            let synced = text(ctx.sync());
            assert!(synced == "Ok(())" || synced == gather_error(64), "{name}: {synced}");
            // A new value replaces the failed one; the context goes on.
            w.assign(ctx.ones([4, 4]))?;
            assert_eq!(w.to_vec::<f32>()?, vec![1.0; 16], "{name}");
            ctx.sync()
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Issue 33, defect 5, as filed: a bad gather plus a matmul, read by
/// `to_vec` from two threads at once, 50 times. On an H100 46 of the 100
/// reads returned `Ok` with garbage; every one must be the error.
#[test]
fn two_threads_reading_a_failed_run_both_get_its_error() {
    for (name, make) in devices() {
        watchdog(180, &format!("{name}: the defect-5 reads"), move || {
            let ctx = make();
            let n = heavy_side(name) * 2;
            let table = ctx.tensor(&super::data(64 * n, 5), [64, n]);
            let big = ctx.tensor(&super::data(n * n, 6), [n, n]) * 0.01;
            let mut idx = vec![0i64; n];
            idx[n / 2] = 99;
            let idx = ctx.tensor(&idx, [1, n]);
            // The race needs a run in flight: 50 rounds on a GPU; the CPU
            // and the emulator only check the errors (each read reruns
            // the failed plan there, slowly on the emulator).
            let rounds = if name == "cuda" { 50 } else { 5 };
            for round in 0..rounds {
                let bad = table.gather(0, &idx) + big.matmul(&big).sum(&[0], true);
                let launched = ctx.realize(&[&bad]);
                if launched.is_err() {
                    assert_eq!(text(launched), gather_error(64), "{name}: round {round}");
                }
                let barrier = Arc::new(Barrier::new(2));
                let readers: Vec<_> = (0..2)
                    .map(|_| {
                        let (bad, barrier) = (bad.clone(), barrier.clone());
                        std::thread::spawn(move || {
                            barrier.wait();
                            text(bad.to_vec::<f32>())
                        })
                    })
                    .collect();
                for (t, r) in readers.into_iter().enumerate() {
                    assert_eq!(
                        r.join().expect("reader"),
                        gather_error(64),
                        "{name}: round {round}, reader {t}"
                    );
                }
            }
            let _ = ctx.sync();
            assert_eq!(ctx.ones([2]).to_vec::<f32>()?, vec![1.0; 2], "{name}: later work");
            ctx.sync()
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The class on a device: at every limit from 1 to 4, with runs in flight
/// before a failing one, read (and launched from) by 1, 2 and 8 threads at
/// once, with futures of it dropped midway, forgotten and awaited. The
/// CPU and the emulator finish a run before its launch returns, so the
/// limit and the thread count change little there: they take the ends of
/// each range (CI's time), a GPU every value.
#[test]
fn runs_failing_in_flight_reach_every_reader_on_every_device() {
    for (name, make) in devices() {
        let (limits, thread_counts): (Vec<usize>, Vec<usize>) =
            if name == "cuda" { ((1..=4).collect(), vec![1, 2, 8]) } else { (vec![1, 4], vec![1, 8]) };
        watchdog(300, &format!("{name}: the failure class"), move || {
            for &limit in &limits {
                for &threads in &thread_counts {
                    scenario(name, make().with_max_in_flight(limit), threads)
                        .unwrap_or_else(|e| panic!("{name}: limit {limit}, {threads} thread(s): {e}"));
                }
            }
        });
    }
}

fn scenario(name: &str, ctx: Context, threads: usize) -> Result<()> {
    let n = heavy_side(name);
    let big = ctx.tensor(&super::data(n * n, 7), [n, n]) * 0.01;
    let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [4]);
    let table = ctx.tensor(&super::data(64, 8), [64]);
    // Busy work in flight before the failing run.
    for _ in 0..3 {
        ctx.realize(&[&big.matmul(&big).tanh()])?;
    }
    let bad = table.gather(0, &ctx.tensor(&[1i64, 99, 2, 3], [4])) + big.matmul(&big).sum_all();
    let launched = text(ctx.realize(&[&bad]));
    assert!(launched == "Ok(())" || launched == gather_error(64), "{launched}");
    let dependent = &bad * 2.0 + &x;
    let _ = ctx.realize(&[&dependent]);
    // Futures: dropped after a poll that may find the run in flight,
    // dropped unpolled, and forgotten (which leaks the context's handle).
    let mut early = bad.to_vec_async::<f32>();
    let _ = poll_once(&mut early);
    drop(early);
    drop((&bad + 1.0).to_vec_async::<f32>());
    let mut forgotten = bad.sum_all().item_async::<f32>();
    let _ = poll_once(&mut forgotten);
    std::mem::forget(forgotten);
    let barrier = Arc::new(Barrier::new(threads));
    let readers: Vec<_> = (0..threads)
        .map(|t| {
            let (ctx, bad, dependent, x, big) =
                (ctx.clone(), bad.clone(), dependent.clone(), x.clone(), big.clone());
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                // Each thread launches work of its own between reads.
                let own = big.matmul(&big).sum_all() * 0.0 + &x * t as f64;
                let _ = ctx.realize(&[&own]);
                let mut got = vec![
                    text(bad.to_vec::<f32>()),
                    text(block_on(dependent.to_vec_async::<f32>())),
                    text(block_on(ctx.realize_async(&[&(&dependent - 1.0)]))),
                    text(block_on((&bad * 3.0).sum_all().item_async::<f32>())),
                ];
                got.rotate_left(t % 4);
                let mut all_failed = got.iter().all(|g| *g == gather_error(64));
                let own = own.to_vec::<f32>();
                all_failed &= own.is_ok();
                (all_failed, got, text(own))
            })
        })
        .collect();
    for (t, r) in readers.into_iter().enumerate() {
        let (ok, got, own) = r.join().expect("reader");
        assert!(ok, "thread {t}: {got:?}, {own}");
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v * t as f32).collect();
        assert_eq!(own, format!("Ok({want:?})"), "thread {t}");
    }
    let synced = text(ctx.sync());
    assert!(synced == "Ok(())" || synced == gather_error(64), "{synced}");
    ctx.sync()?;
    assert_eq!((&x * 2.0).to_vec::<f32>()?, vec![2.0, 4.0, 6.0, 8.0], "later work");
    Ok(())
}
