//! Futures: the same values as blocking reads under two executors (tokio's
//! multi-threaded runtime and a plain `block_on`), and the safety cases:
//! dropped before or after the first poll, forgotten, a thousand in
//! flight, a task that panics. None may corrupt memory, hang, or change a
//! later result (on the GPU these run under compute-sanitizer too).

use super::{data, devices};
use kiln::prelude::*;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};

/// Polls a future on this thread, parking between polls.
pub(super) fn block_on<F: Future>(f: F) -> F::Output {
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
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
}

/// Polls once with a waker that does nothing.
pub(super) fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    let mut cx = TaskContext::from_waker(Waker::noop());
    std::pin::Pin::new(f).poll(&mut cx)
}

fn work(ctx: &Context, k: u64) -> Tensor {
    let x = ctx.tensor(&data(4096, k), [64, 64]);
    x.matmul(&x).tanh().sum(&[1], false)
}

#[test]
fn futures_give_the_blocking_reads_values_under_block_on_and_tokio() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().expect("tokio runtime");
    for (name, make) in devices() {
        let ctx = make();
        let want: Vec<Vec<f32>> = (0..8).map(|k| work(&ctx, k).to_vec::<f32>()).collect::<Result<_>>()?;
        let futures: Vec<_> = (0..8).map(|k| work(&ctx, k).to_vec_async::<f32>()).collect();
        let got: Vec<Vec<f32>> = futures.into_iter().map(block_on).collect::<Result<_>>()?;
        assert_eq!(got, want, "{name}: block_on");
        let tasks: Vec<_> = (0..8).map(|k| rt.spawn(work(&ctx, k).to_vec_async::<f32>())).collect();
        for (k, t) in tasks.into_iter().enumerate() {
            let v = rt.block_on(t).expect("the task ran")?;
            assert_eq!(v, want[k], "{name}: tokio task {k}");
        }
        let total = rt.block_on(work(&ctx, 3).sum_all().item_async::<f32>())?;
        let want_total: f32 = want[3].iter().sum();
        assert!(
            (total - want_total).abs() <= 1e-3 * want_total.abs().max(1.0),
            "{name}: {total} vs {want_total}"
        );
        let v = ctx.variable("v", ctx.zeros([3]))?;
        v.assign(&*v + 2.0)?;
        rt.block_on(ctx.sync_async())?;
        assert_eq!(v.to_vec::<f32>()?, vec![2.0; 3], "{name}");
        let r = work(&ctx, 1);
        block_on(ctx.realize_async(&[&r]))?;
        assert_eq!(r.to_vec::<f32>()?, want[1], "{name}: realize_async");
        let err = block_on(ctx.ones([2]).item_async::<f32>()).unwrap_err().to_string();
        assert!(err.contains("one element"), "{err}");
        let err = block_on(ctx.ones([2]).to_vec_async::<i64>()).unwrap_err().to_string();
        assert!(err.contains("holds f32"), "{err}");
    }
    Ok(())
}

#[test]
fn dropping_forgetting_and_flooding_futures_is_safe() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make().with_max_in_flight(4);
        let want = work(&ctx, 7).to_vec::<f32>()?;
        // Dropped before the first poll.
        for k in 0..10 {
            drop(work(&ctx, k).to_vec_async::<f32>());
        }
        // Dropped after a poll that may have found it running.
        for k in 0..10 {
            let mut f = work(&ctx, k).to_vec_async::<f32>();
            let _ = poll_once(&mut f);
            drop(f);
        }
        // Forgotten: leaks its buffer, never frees it early.
        for k in 0..5 {
            std::mem::forget(work(&ctx, k).to_vec_async::<f32>());
        }
        // A thousand in flight, awaited in reverse (fewer on the slow
        // emulator).
        let n = if name == "cuda-emulated" { 100 } else { 1000 };
        let many: Vec<_> = (0..n).map(|k| (ctx.scalar(k as f32) * 2.0).item_async::<f32>()).collect();
        for (k, f) in many.into_iter().enumerate().rev() {
            assert_eq!(block_on(f)?, 2.0 * k as f32, "{name}");
        }
        // A future polled after it returned says so instead of panicking.
        let mut f = ctx.scalar(1.0f32).item_async::<f32>();
        while poll_once(&mut f).is_pending() {}
        assert!(matches!(poll_once(&mut f), Poll::Ready(Err(_))));
        assert_eq!(work(&ctx, 7).to_vec::<f32>()?, want, "{name}: later results unchanged");
    }
    Ok(())
}

#[test]
fn a_task_that_panics_while_holding_a_future_leaves_the_context_usable() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().expect("tokio runtime");
    for (name, make) in devices() {
        let ctx = make();
        let want = work(&ctx, 2).to_vec::<f32>()?;
        let c = ctx.clone();
        let task = rt.spawn(async move {
            let f = work(&c, 2).to_vec_async::<f32>();
            let pending = work(&c, 3).to_vec_async::<f32>();
            let v = f.await;
            drop(pending);
            if v.is_ok() {
                panic!("the task fails after its read (on purpose)");
            }
            v
        });
        assert!(rt.block_on(task).unwrap_err().is_panic(), "{name}");
        assert_eq!(rt.block_on(work(&ctx, 2).to_vec_async::<f32>())?, want, "{name}");
    }
    Ok(())
}
