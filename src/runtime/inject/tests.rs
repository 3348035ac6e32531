//! Runs that fail while in flight, on the fake device (see `mod.rs`): at
//! the in-flight limit with 1 to 4 runs in flight, with 1 to 8 threads
//! reading and launching at once, and with futures dropped midway or
//! forgotten. Every reader of a failed value gets its error, later
//! independent work succeeds, `sync` reports each error once, and every
//! test runs under a watchdog, so a hang fails it.
use super::{watchdog, Delayed, Knobs};
use crate::{Context, Result, Tensor};
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;

/// The error of reading `gather(0, [.., 99, ..])` of a 16-element table,
/// with the plan's node number written `N` (see [`err_text`]).
fn gather_error() -> String {
    "runtime error: gather index 99 is out of range for dim 0 of size 16 (node N)".to_string()
}

/// Resumes a paused device when dropped, so a failed assertion leaves no
/// thread blocked on it.
struct Resume(Arc<Knobs>);
impl Drop for Resume {
    fn drop(&mut self) {
        self.0.resume();
    }
}

fn table(ctx: &Context) -> Tensor {
    ctx.tensor(&(0..16).map(|v| v as f32).collect::<Vec<_>>(), [16])
}

/// `table.gather(0, idx)` with one index out of range.
fn bad_gather(ctx: &Context) -> Tensor {
    table(ctx).gather(0, &ctx.tensor(&[1i64, 99, 2, 3], [4]))
}

/// A result as text; the node number of an index error (how the passes
/// numbered the plan) is written `N`.
fn err_text<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Ok(v) => format!("Ok({v:?})"),
        Err(e) => {
            let s = e.to_string();
            match s.rfind("(node %") {
                Some(k) if s.ends_with(')') => format!("{}(node N)", &s[..k]),
                _ => s,
            }
        }
    }
}

/// Polls a future on this thread, parking between polls.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut TaskContext::from_waker(&waker)) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut TaskContext::from_waker(Waker::noop()))
}

/// Issue 33, defect 4: a run that fails in flight, then two more
/// launches. The third waits for the failed one at the limit; it used to
/// deadlock on the context lock its own loop condition still held.
#[test]
fn a_failed_run_at_the_in_flight_limit_does_not_hang_the_next_launch() {
    watchdog(30, "launching after a failed run", || {
        let (ctx, _knobs) = Delayed::context(Duration::from_millis(5));
        let ctx = ctx.with_max_in_flight(2);
        let w = ctx.variable("w", ctx.zeros([4])).unwrap();
        let m = ctx.tensor(&[0.5f32; 64], [8, 8]);
        for k in 0..8i64 {
            let idx = ctx.tensor(&[k, if k == 4 { 99 } else { k }, 0, 1], [4]);
            let heavy = m.matmul(&m).sum_all();
            w.assign(&*w + table(&ctx).gather(0, &idx) + &heavy).unwrap();
            // In flight: the launch returns, the error comes later.
            ctx.realize(&[&w]).unwrap();
        }
        assert_eq!(err_text(w.to_vec::<f32>()), gather_error());
        assert_eq!(err_text(ctx.sync()), gather_error());
        ctx.sync().unwrap(); // reported once
        w.assign(ctx.ones([4])).unwrap();
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0; 4], "a new value replaces the failed one");
    });
}

/// Issue 33, defect 4 (second half): while a launch waits at the limit for
/// the oldest run, other threads record and upload; the context lock is
/// not held for the wait.
#[test]
fn waiting_at_the_in_flight_limit_does_not_hold_the_context_lock() {
    watchdog(30, "waiting at the limit", || {
        let (ctx, knobs) = Delayed::context(Duration::from_millis(1));
        let ctx = ctx.with_max_in_flight(1);
        let _resume = Resume(knobs.clone());
        let x = ctx.tensor(&[1.0f32, 2.0], [2]);
        knobs.pause();
        ctx.realize(&[&(&x * 2.0)]).unwrap(); // in flight until resumed
        let (c, y) = (ctx.clone(), &x * 3.0);
        let launcher = std::thread::spawn(move || c.realize(&[&y]));
        knobs.until_someone_waits();
        let c = ctx.clone();
        watchdog(5, "recording while a launch waits", move || {
            let z = c.tensor(&[4.0f32, 5.0], [2]) * 2.0;
            drop(z);
            c.stats()
        });
        knobs.resume();
        launcher.join().unwrap().unwrap();
        assert_eq!((&x * 3.0).to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    });
}

/// Issue 33, defect 5: threads reading one failed value in flight at
/// once. Settling used to let one thread take the check (and get the
/// error) while another found no check and returned `Ok` with garbage.
#[test]
fn every_thread_reading_a_failed_run_gets_its_error() {
    watchdog(60, "readers of a failed run", || {
        let (ctx, knobs) = Delayed::context(Duration::from_millis(1));
        let _resume = Resume(knobs.clone());
        let m = ctx.tensor(&[0.25f32; 16], [4, 4]);
        for round in 0..50 {
            let threads = 2 + round % 7;
            knobs.pause();
            let bad = bad_gather(&ctx).reshape([1, 4]).matmul(&m);
            ctx.realize(&[&bad]).unwrap();
            let readers: Vec<_> = (0..threads)
                .map(|_| {
                    let bad = bad.clone();
                    std::thread::spawn(move || bad.to_vec::<f32>())
                })
                .collect();
            while knobs.waiting.load(std::sync::atomic::Ordering::SeqCst) < threads {
                std::thread::yield_now();
            }
            knobs.resume();
            for (t, r) in readers.into_iter().enumerate() {
                assert_eq!(err_text(r.join().unwrap()), gather_error(), "round {round}, reader {t}");
            }
            assert_eq!(err_text((&bad + 1.0).to_vec::<f32>()), gather_error(), "a later dependent run");
            assert_eq!(err_text(ctx.sync()), gather_error(), "round {round}");
        }
    });
}

/// One scenario of the class: `before` good runs, then a failing one,
/// then a run that reads it and one that does not, all in flight under
/// `limit`; `threads` threads read everything at once.
fn fail_in_flight(limit: usize, before: usize, threads: usize) {
    let what = format!("limit {limit}, {before} run(s) before, {threads} thread(s)");
    let (ctx, _knobs) = Delayed::context(Duration::from_millis(3));
    let ctx = ctx.with_max_in_flight(limit);
    let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [4]);
    let good: Vec<Tensor> = (0..before).map(|k| &x * (k as f64 + 1.0)).collect();
    for g in &good {
        ctx.realize(&[g]).unwrap();
    }
    let bad = bad_gather(&ctx);
    ctx.realize(&[&bad]).unwrap();
    let dependent = &bad * 2.0 + &x;
    let independent = &x + 10.0;
    ctx.realize(&[&dependent]).unwrap();
    ctx.realize(&[&independent]).unwrap();
    let barrier = Arc::new(Barrier::new(threads));
    let readers: Vec<_> = (0..threads)
        .map(|t| {
            let (bad, dependent, independent) = (bad.clone(), dependent.clone(), independent.clone());
            let (good, x, barrier) = (good.clone(), x.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                // Threads read in different orders, and launch as they go.
                let mut reads: Vec<(String, Box<dyn Fn() -> String>)> = vec![
                    ("bad".into(), Box::new(move || err_text(bad.to_vec::<f32>()))),
                    ("dependent".into(), Box::new(move || err_text(dependent.to_vec::<f32>()))),
                    ("independent".into(), Box::new(move || err_text(independent.to_vec::<f32>()))),
                    ("launched now".into(), Box::new(move || err_text((&x * 3.0).to_vec::<f32>()))),
                ];
                for (k, g) in good.into_iter().enumerate() {
                    reads.push((format!("good {k}"), Box::new(move || err_text(g.to_vec::<f32>()))));
                }
                let n = reads.len();
                reads.rotate_left(t % n);
                let mut got: Vec<(String, String)> = reads.into_iter().map(|(k, read)| (k, read())).collect();
                got.sort();
                got
            })
        })
        .collect();
    let mut want: Vec<(String, String)> = vec![
        ("bad".into(), gather_error()),
        ("dependent".into(), gather_error()),
        ("independent".into(), "Ok([11.0, 12.0, 13.0, 14.0])".into()),
        ("launched now".into(), "Ok([3.0, 6.0, 9.0, 12.0])".into()),
    ];
    for k in 0..before {
        let values: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v * (k as f32 + 1.0)).collect();
        want.push((format!("good {k}"), format!("Ok({values:?})")));
    }
    want.sort();
    for (t, r) in readers.into_iter().enumerate() {
        assert_eq!(r.join().unwrap(), want, "{what}: thread {t}");
    }
    assert_eq!(err_text(ctx.sync()), gather_error(), "{what}");
    assert_eq!(err_text(ctx.sync()), "Ok(())", "{what}: reported once");
}

/// The class: a run failing in flight at every limit from 1 to 4, with 1
/// to `limit` runs in flight before it, read by 1 to 8 threads at once.
#[test]
fn a_run_failing_in_flight_reaches_every_reader_at_every_limit() {
    watchdog(120, "failures at the limit", || {
        for limit in 1..=4 {
            for before in 0..limit {
                for threads in [1, 2, 5, 8] {
                    fail_in_flight(limit, before, threads);
                }
            }
        }
    });
}

/// 1 to 8 threads each launch a chain of runs on one context while the
/// others do; some chains have a run that fails in flight. A chain is
/// an error from its failed run on, and only there.
#[test]
fn threads_launching_and_reading_at_once_get_only_their_own_errors() {
    watchdog(120, "threads launching at once", || {
        for threads in 1..=8usize {
            let (ctx, _knobs) = Delayed::context(Duration::from_millis(1));
            let ctx = ctx.with_max_in_flight(1 + threads % 4);
            let barrier = Arc::new(Barrier::new(threads));
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (ctx, barrier) = (ctx.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        // Thread t's chain fails at step t (never, for t >= 6).
                        let mut acc = ctx.tensor(&[t as f32; 4], [4]);
                        let mut got = Vec::new();
                        for step in 0..6 {
                            acc = if step == t { &acc + bad_gather(&ctx) } else { &acc + 1.0 };
                            ctx.realize(&[&acc]).unwrap();
                            if step % 2 == 1 {
                                got.push(err_text(acc.to_vec::<f32>()));
                            }
                        }
                        got.push(err_text((ctx.ones([2]) * t as f64).to_vec::<f32>()));
                        got
                    })
                })
                .collect();
            for (t, w) in workers.into_iter().enumerate() {
                let mut want = Vec::new();
                for step in [1usize, 3, 5] {
                    want.push(if step >= t && t < 6 {
                        gather_error()
                    } else {
                        let v = t as f32 + step as f32 + 1.0;
                        format!("Ok({:?})", vec![v; 4])
                    });
                }
                want.push(format!("Ok({:?})", vec![t as f32; 2]));
                assert_eq!(w.join().unwrap(), want, "{threads} thread(s): thread {t}");
            }
            assert_eq!(err_text(ctx.sync()), gather_error(), "{threads} thread(s)");
            assert_eq!(err_text(ctx.sync()), "Ok(())", "{threads} thread(s): reported once");
        }
    });
}

/// Futures of a failed run: dropped before and after a poll that found
/// it running, forgotten, awaited from several threads. Every awaited one
/// gets the error; independent futures and later work are unaffected.
#[test]
fn futures_of_a_failed_run_dropped_midway_forgotten_or_awaited() {
    watchdog(60, "futures of a failed run", || {
        for limit in 1..=4 {
            let (ctx, knobs) = Delayed::context(Duration::from_millis(5));
            let ctx = ctx.with_max_in_flight(limit);
            let _resume = Resume(knobs.clone());
            let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [4]);
            knobs.pause();
            let bad = bad_gather(&ctx);
            let mut early = bad.to_vec_async::<f32>();
            assert!(poll_once(&mut early).is_pending(), "limit {limit}: in flight");
            // Dropped midway (watched by the runtime thread), dropped
            // before any poll, and forgotten. Nothing here launches: at
            // limit 1 a launch would wait for the paused run.
            drop(early);
            drop(bad.to_vec_async::<f32>());
            let mut forgotten = bad.to_vec_async::<f32>();
            let _ = poll_once(&mut forgotten);
            std::mem::forget(forgotten);
            knobs.resume();
            let awaited: Vec<_> = (0..4)
                .map(|t| {
                    let (bad, x, ctx) = (bad.clone(), x.clone(), ctx.clone());
                    std::thread::spawn(move || match t {
                        0 => err_text(block_on(bad.to_vec_async::<f32>())),
                        1 => err_text(block_on(bad.sum_all().item_async::<f32>())),
                        2 => err_text(block_on(ctx.realize_async(&[&(&bad + &x)]))),
                        _ => err_text(block_on((&x + 1.0).to_vec_async::<f32>())),
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            let want = [gather_error(), gather_error(), gather_error(), "Ok([2.0, 3.0, 4.0, 5.0])".into()];
            assert_eq!(awaited, want, "limit {limit}");
            assert_eq!(err_text(block_on(ctx.sync_async())), gather_error(), "limit {limit}");
            assert_eq!(err_text(ctx.sync()), "Ok(())", "limit {limit}: reported once");
            assert_eq!(err_text(block_on((&x * 2.0).to_vec_async::<f32>())), "Ok([2.0, 4.0, 6.0, 8.0])");
        }
    });
}

/// What `mem::forget` does to a future (the runtime module docs): a
/// future holds its context as a tensor does, so a forgotten one leaks it
/// (still usable, its run completed); a dropped one, even one the runtime
/// thread was watching, releases it.
#[test]
fn a_forgotten_future_leaks_its_context_and_a_dropped_one_releases_it() {
    watchdog(30, "forgetting a future", || {
        for forget in [false, true] {
            let (ctx, knobs) = Delayed::context(Duration::from_millis(1));
            let _resume = Resume(knobs.clone());
            let weak = Arc::downgrade(&ctx.inner);
            let x = ctx.tensor(&[1.0f32, 2.0], [2]);
            knobs.pause();
            let mut f = (&x * 2.0).to_vec_async::<f32>();
            assert!(poll_once(&mut f).is_pending(), "watched by the runtime thread");
            if forget {
                std::mem::forget(f);
            } else {
                drop(f);
            }
            knobs.resume();
            // The last handle's drop waits for the run in flight.
            drop((x, ctx));
            match weak.upgrade() {
                None => assert!(!forget, "a forgotten future released its context"),
                Some(inner) => {
                    assert!(forget, "a dropped future kept its context");
                    let ctx = Context { inner };
                    assert_eq!(ctx.sync().map_err(|e| e.to_string()), Ok(()));
                    assert_eq!((ctx.ones([2]) * 3.0).to_vec::<f32>().unwrap(), vec![3.0; 2]);
                }
            }
        }
    });
}
