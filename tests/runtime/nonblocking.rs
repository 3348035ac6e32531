//! Non-blocking runs: values with many runs in flight, assignment order,
//! the in-flight limit, and where a run's error is reported.

use super::{data, devices};
use kiln::prelude::*;

#[test]
fn assignments_keep_program_order_with_runs_in_flight() -> Result<()> {
    for (name, make) in devices() {
        for limit in [1usize, 2, 8] {
            let ctx = make().with_max_in_flight(limit);
            let w = ctx.variable("w", ctx.tensor(&data(64, 5), [64]))?;
            let mut model: Vec<f64> = data(64, 5).iter().map(|&v| v as f64).collect();
            let mut snapshots = Vec::new();
            for k in 0..40 {
                let scale = if k % 2 == 0 { 0.5 } else { -1.25 };
                w.assign(&*w * scale + 1.0)?;
                ctx.sync_launch()?;
                for v in &mut model {
                    *v = *v * scale + 1.0;
                }
                if k % 7 == 0 {
                    // A snapshot computed from this value, read at the end.
                    let s = (&*w * 1.0).realize()?.clone();
                    snapshots.push((s, model.clone()));
                }
            }
            let got = w.to_vec::<f32>()?;
            super::close(&got, &model, 1e-5, &format!("{name} limit {limit}"));
            for (i, (t, want)) in snapshots.iter().enumerate() {
                super::close(&t.to_vec::<f32>()?, want, 1e-5, &format!("{name} limit {limit} snapshot {i}"));
            }
        }
    }
    Ok(())
}

/// Realize without reading: launches and returns (on the CPU it has run).
trait SyncLaunch {
    fn sync_launch(&self) -> Result<()>;
}

impl SyncLaunch for Context {
    fn sync_launch(&self) -> Result<()> {
        self.realize(&[])
    }
}

#[test]
fn a_runs_error_is_returned_by_every_later_read_that_depends_on_it() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let x = ctx.tensor(&data(12, 1), [3, 4]);
        let idx = ctx.tensor(&[0i64, 3, 7, 1, 2, 0], [3, 2]);
        let bad = x.gather(1, &idx);
        let v = ctx.variable("v", ctx.zeros([3, 2]))?;
        v.assign(&bad * 2.0)?;
        // Launching may report it (the CPU runs before returning) or not
        // (a GPU finds it later); every dependent read must.
        let launched = ctx.realize(&[&bad]);
        let wants = |e: Error| {
            let s = e.to_string();
            assert!(s.contains("gather index 7 is out of range for dim 1 of size 4"), "{name}: {s}");
        };
        if let Err(e) = launched {
            wants(e);
        }
        wants((&bad + 1.0).to_vec::<f32>().unwrap_err());
        wants(v.to_vec::<f32>().unwrap_err());
        wants((&*v * 3.0).sum_all().item::<f32>().unwrap_err());
        // A new value replaces the failed one (on the CPU the failed
        // assignment is still pending, and rides with every read until
        // then), and the context goes on.
        v.assign(ctx.ones([3, 2]))?;
        assert_eq!(v.to_vec::<f32>()?, vec![1.0; 6], "{name}");
        assert_eq!((ctx.ones([3]) * 2.0).to_vec::<f32>()?, vec![2.0; 3], "{name}");
    }
    Ok(())
}

#[test]
fn sync_waits_for_every_run_and_returns_the_first_error() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let idx = ctx.tensor(&[5i64], [1]);
        let bad = ctx.tensor(&[1.0f32, 2.0], [2]).gather(0, &idx);
        let launched = ctx.realize(&[&bad]);
        let synced = ctx.sync();
        assert!(launched.is_err() || synced.is_err(), "{name}: the error was lost");
        ctx.sync()?; // reported once
        assert_eq!(ctx.scalar(2.0f32).item::<f32>()?, 2.0, "{name}");
    }
    Ok(())
}

/// `sync_async` reports a run's error as `sync` does: once. On the GPU the
/// launch returns before the run fails, so the error is the sync's to
/// report; a later `sync` (blocking or not) has nothing to say.
#[test]
fn sync_async_reports_each_error_once_as_sync_does() -> Result<()> {
    for (name, make) in devices() {
        let ctx = make();
        let idx = ctx.tensor(&[5i64], [1]);
        let bad = ctx.tensor(&[1.0f32, 2.0], [2]).gather(0, &idx);
        let launched = ctx.realize(&[&bad]);
        let synced = super::futures::block_on(ctx.sync_async());
        assert!(launched.is_err() || synced.is_err(), "{name}: the error was lost");
        ctx.sync()?;
        super::futures::block_on(ctx.sync_async())?;
        assert_eq!(ctx.scalar(2.0f32).item::<f32>()?, 2.0, "{name}");
    }
    Ok(())
}

#[test]
fn a_context_dropped_with_runs_in_flight_waits_for_them() -> Result<()> {
    for (_, make) in devices() {
        for _ in 0..5 {
            let ctx = make().with_max_in_flight(8);
            let x = ctx.randn([64, 64]);
            for _ in 0..6 {
                ctx.realize(&[&x.matmul(&x).tanh()])?;
            }
            drop(ctx);
        }
    }
    Ok(())
}
