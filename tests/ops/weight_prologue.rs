//! Kept values (`weight-prologue`): work on variables alone runs in a
//! prologue plan whose results a plan keeps between calls, and runs again
//! only when a variable it reads changes. Many plans interleaved over
//! many calls, the variables changed every way a user changes them
//! (assigned a recorded value, a host value,, a row written in place, a
//! training step's update, with snapshots of old values held): every
//! output matches an f64 model of the variables as they are at that call,
//! and the prologues run exactly once per plan and per change.

use crate::reference::*;
use kiln::prelude::*;

const F32: DType = DType::F32;

/// `x · w` in f64 (`w` is `[k, n]`).
fn mm(x: &Nd<f64>, w: &Nd<f64>) -> Nd<f64> {
    matmul_ref(x, w, 0.0, |s, a, b| s + a * b)
}

/// `a / 2 + b` as f32 computes it: the weight-only work the tests keep.
fn half_plus(a: &Nd<f64>, b: &Nd<f64>) -> Nd<f64> {
    Nd::from_fn(&a.shape.clone(), |i| round(F32, round(F32, a.get(i) * 0.5) + b.get(i)))
}

/// Four plans (two computations, two row counts each) read the same
/// variables in a random order for 60 calls: `x · (a/2 + b) + tanh(c)`
/// and `x · (a/2 + b)ᵀ`, whose weight-only parts (`a/2 + b`, `tanh(c)`)
/// are kept. Every sixth call changes one variable, in turn: a recorded
/// assignment realized on its own, a host value (with a snapshot of the
/// old one held), a row written in place, and a host value of `c`. A plan
/// runs its prologue on its first call and on its first call after each
/// change, never otherwise: counted exactly.
#[test]
fn kept_values_follow_every_change_of_the_variables() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(5101);
        let (k, n) = (24, 16);
        let mut a_m = rand_f(&mut rng, F32, &[k, n], 0.5);
        let mut b_m = rand_f(&mut rng, F32, &[k, n], 0.5);
        let mut c_m = rand_f(&mut rng, F32, &[n], 1.0);
        let a = ctx.variable("a", tensor_f(&ctx, F32, &a_m)).expect("a");
        let b = ctx.variable("b", tensor_f(&ctx, F32, &b_m)).expect("b");
        let c = ctx.variable("c", tensor_f(&ctx, F32, &c_m)).expect("c");
        // Realized first: a read of a pending value is another plan.
        ctx.sync().expect("initial values");
        let start = ctx.stats().prologue_runs;
        // Changes so far to `a` or `b`, and to `c` (which only plan 0 reads).
        let (mut changes, mut expected) = ([0usize; 2], 0u64);
        let mut seen: Vec<((i64, usize), [usize; 2])> = Vec::new();
        let mut snapshots = Vec::new();
        for call in 0..60 {
            let (which, rows) = (rng.range(0, 2), [3usize, 5][rng.range(0, 2) as usize]);
            let version = if which == 0 { changes } else { [changes[0], 0] };
            match seen.iter_mut().find(|(key, _)| *key == (which, rows)) {
                Some((_, v)) if *v == version => {}
                Some((_, v)) => {
                    *v = version;
                    expected += 1;
                }
                None => {
                    seen.push(((which, rows), version));
                    expected += 1;
                }
            }
            let w = &*a * 0.5 + &*b;
            let w_m = half_plus(&a_m, &b_m);
            let what = format!("call {call}, plan ({which}, {rows}) on {}", ctx.device());
            if which == 0 {
                let x = rand_f(&mut rng, F32, &[rows, k], 1.0);
                let y = tensor_f(&ctx, F32, &x).matmul(&w) + c.tanh();
                let p = mm(&x, &w_m);
                let want = Nd::from_fn(&[rows, n], |i| p.get(i) + c_m.get(&[i[1]]).tanh());
                check_f(&y, F32, &want, 4.0, &what);
            } else {
                let x = rand_f(&mut rng, F32, &[rows, n], 1.0);
                let y = tensor_f(&ctx, F32, &x).matmul(&w.t());
                check_f(&y, F32, &mm(&x, &w_m.transpose(0, 1).contiguous()), 4.0, &what);
            }
            if call % 6 == 5 {
                let change = (call / 6) % 4;
                match change {
                    0 => {
                        a.assign(&*a * 0.5 + 0.25).expect("assign");
                        a_m = a_m.map(|v| round(F32, v * 0.5 + 0.25));
                    }
                    1 => {
                        snapshots.push((b.detach(), b_m.clone(), call));
                        b_m = rand_f(&mut rng, F32, &[k, n], 0.5);
                        b.assign(tensor_f(&ctx, F32, &b_m)).expect("assign b");
                    }
                    2 => {
                        let row = rand_f(&mut rng, F32, &[1, n], 0.5);
                        let at = rng.range(0, k as i64) as usize;
                        a.write_at(0, at, &tensor_f(&ctx, F32, &row)).expect("write_at");
                        a_m = Nd::from_fn(
                            &[k, n],
                            |i| if i[0] == at { row.get(&[0, i[1]]) } else { a_m.get(i) },
                        );
                    }
                    _ => {
                        c_m = rand_f(&mut rng, F32, &[n], 1.0);
                        c.assign(tensor_f(&ctx, F32, &c_m)).expect("assign c");
                    }
                }
                // Realized now, so that the next read is the plan the
                // count models (a read that also computes a pending value
                // is a plan of its own, which keeps no work of it).
                ctx.sync().expect("the change");
                changes[(change == 3) as usize] += 1;
            }
        }
        for (t, want, call) in snapshots {
            check_f(&t, F32, &want, 0.0, &format!("the snapshot of b at call {call}"));
        }
        let ran = ctx.stats().prologue_runs - start;
        assert_eq!(ran, expected, "prologue runs on {}: {ran}, for {expected} first sights", ctx.device());
    });
}

/// Under `with_autocast(bf16)`, an inference loop over f32 weights casts
/// them once, not every call: the casts are kept, and made again after
/// the weights are assigned. The output is the f64 product of the bf16
/// roundings, at every call.
#[test]
fn autocast_keeps_its_casts_of_the_weights() {
    each_backend(|| {
        let ctx = dev().with_autocast(DType::BF16);
        let mut rng = Rng::new(5107);
        let (rows, k, n) = (16, 32, 24);
        let mut w_m = rand_f(&mut rng, F32, &[k, n], 0.25);
        let w = ctx.variable("w", tensor_f(&ctx, F32, &w_m)).expect("w");
        ctx.sync().expect("the initial value");
        let start = ctx.stats().prologue_runs;
        for call in 0..10 {
            if call == 6 {
                w_m = rand_f(&mut rng, F32, &[k, n], 0.25);
                w.assign(tensor_f(&ctx, F32, &w_m)).expect("assign");
                ctx.sync().expect("the new value");
            }
            let x = rand_f(&mut rng, F32, &[rows, k], 1.0);
            let y = tensor_f(&ctx, F32, &x).matmul(&w);
            let low = |m: &Nd<f64>| m.map(|v| round(DType::BF16, v));
            let want = mm(&low(&x), &low(&w_m));
            // The product runs in bf16 and comes back as f32, autocast's
            // output type: bf16's tolerance.
            let what = format!("call {call} on {}", ctx.device());
            assert_close(&read_f(&y).to_vec(), &want.to_vec(), DType::BF16, 4.0, &what);
            let ran = ctx.stats().prologue_runs - start;
            assert_eq!(ran, if call < 6 { 1 } else { 2 }, "prologue runs after call {call}");
        }
        let plan = ctx.explain(&[&(ctx.zeros([rows, k]).matmul(&w))]).expect("explain");
        assert!(plan.contains(";; prologue"), "the plan keeps the cast:\n{plan}");
    });
}

/// A training step that updates the weights in place between inference
/// reads: each read's kept values are made from the weights the step
/// left (read back from the device as the reference), never from bytes
/// kept from before the step.
#[test]
fn an_update_in_place_between_reads_is_seen_by_the_next_read() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(5113);
        let (rows, k, n) = (8, 16, 12);
        let a = ctx.variable("a", tensor_f(&ctx, F32, &rand_f(&mut rng, F32, &[k, n], 0.5))).expect("a");
        let b = ctx.variable("b", tensor_f(&ctx, F32, &rand_f(&mut rng, F32, &[k, n], 0.5))).expect("b");
        ctx.sync().expect("initial values");
        let start = ctx.stats().prologue_runs;
        for step in 0..8 {
            let x = tensor_f(&ctx, F32, &rand_f(&mut rng, F32, &[rows, k], 1.0));
            let p = x.matmul(&(&*a * 0.5 + &*b));
            let loss = (&p * &p).sum_all();
            let grads = loss.backward().expect("backward");
            let lr = 0.05 * (1 + step % 3) as f64;
            let (da, db) = (grads.get(&a).expect("da").clone(), grads.get(&b).expect("db").clone());
            a.assign(&*a - da * lr).expect("assign a");
            b.assign(&*b - db * lr).expect("assign b");
            ctx.zero_grad();
            loss.realize().expect("step");
            let (a_m, b_m) = (read_f(&a), read_f(&b));
            let x2 = rand_f(&mut rng, F32, &[rows, k], 1.0);
            let y = tensor_f(&ctx, F32, &x2).matmul(&(&*a * 0.5 + &*b));
            let w_m = half_plus(&a_m, &b_m);
            check_f(&y, F32, &mm(&x2, &w_m), 4.0, &format!("step {step} on {}", ctx.device()));
        }
        let ran = ctx.stats().prologue_runs - start;
        assert_eq!(ran, 8, "the inference plan's prologue runs once per step on {}", ctx.device());
    });
}

/// A captured step whose weight-only work is kept: the user assigns the
/// weights between calls (a host value, a recorded update), and every
/// call's result is the f64 model's under the weights of that call, as
/// the uncaptured call's would be.
#[test]
fn a_captured_step_sees_each_new_value_of_its_weights() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(5119);
        let (rows, k, n) = (6, 16, 10);
        let mut a_m = rand_f(&mut rng, F32, &[k, n], 0.5);
        let b_m = rand_f(&mut rng, F32, &[k, n], 0.5);
        let a = ctx.variable("a", tensor_f(&ctx, F32, &a_m)).expect("a");
        let b = ctx.variable("b", tensor_f(&ctx, F32, &b_m)).expect("b");
        ctx.sync().expect("initial values");
        let start = ctx.stats().prologue_runs;
        let mut step = ctx.capture(|x: &[Tensor]| Ok(vec![x[0].matmul(&(&*a * 0.5 + &*b))]));
        for call in 0..12 {
            match call % 4 {
                1 => {
                    a_m = rand_f(&mut rng, F32, &[k, n], 0.5);
                    a.assign(tensor_f(&ctx, F32, &a_m)).expect("assign a");
                }
                3 => {
                    a.assign(&*a * 0.5 + 0.25).expect("update a");
                    a_m = a_m.map(|v| round(F32, v * 0.5 + 0.25));
                }
                _ => {}
            }
            ctx.sync().expect("the change");
            let x = rand_f(&mut rng, F32, &[rows, k], 1.0);
            let y = step.call(&[&tensor_f(&ctx, F32, &x)]).expect("captured call").remove(0);
            let w_m = half_plus(&a_m, &b_m);
            check_f(&y, F32, &mm(&x, &w_m), 4.0, &format!("call {call} on {}", ctx.device()));
        }
        assert_eq!(step.captures(), 1, "one recording on {}", ctx.device());
        // Its first call and the six calls after a change.
        assert_eq!(ctx.stats().prologue_runs - start, 7, "prologue runs on {}", ctx.device());
    });
}

/// A prologue whose run fails (an index variable out of range, gathered
/// from a table variable: both kept work): the read that needed it gets
/// the error, every read after it too (nothing failed is kept), and once
/// the index is assigned a good value the next read runs the prologue
/// again and is right.
#[test]
fn a_failed_prologue_reaches_every_read_until_its_inputs_change() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(5123);
        let (rows, k) = (3, 4);
        let table_m = rand_f(&mut rng, F32, &[8, k], 1.0);
        let table = ctx.variable("table", tensor_f(&ctx, F32, &table_m)).expect("table");
        let idx = ctx.variable("idx", ctx.tensor(&[1i64, 9, 2], [3])).expect("idx");
        ctx.sync().expect("initial values");
        let x_m = rand_f(&mut rng, F32, &[rows, k], 1.0);
        let x = tensor_f(&ctx, F32, &x_m);
        let read = || x.matmul(&table.index_select(0, &idx).t()).to_vec::<f32>();
        let start = ctx.stats().prologue_runs;
        for attempt in 0..3 {
            let e = read().expect_err("index 9 of 8 rows");
            assert!(e.to_string().contains("out of range"), "attempt {attempt} on {}: {e}", ctx.device());
        }
        let ran = ctx.stats().prologue_runs - start;
        assert_eq!(ran, 3, "a failed prologue is run again by each read on {}", ctx.device());
        // Where runs fail after their launch (CUDA), `sync` reports the
        // failed runs once more: taken here, as a caller would.
        let _ = ctx.sync();
        idx.assign(ctx.tensor(&[1i64, 5, 2], [3])).expect("assign");
        ctx.sync().expect("the good index");
        let y = tensor_f(&ctx, F32, &x_m).matmul(&table.index_select(0, &idx).t());
        let rows_m = Nd::from_fn(&[3, k], |i| table_m.get(&[[1, 5, 2][i[0]], i[1]]));
        check_f(
            &y,
            F32,
            &mm(&x_m, &rows_m.transpose(0, 1).contiguous()),
            4.0,
            &format!("on {}", ctx.device()),
        );
    });
}

/// The profiler shows a prologue on the calls that ran it: its nodes come
/// first, marked `prologue` (numbered in the prologue's graph), and end
/// before the plan's start; a call that kept its values has the plan's
/// nodes alone; after a variable changes, the prologue's nodes are back.
/// `by_op` keeps them in rows of their own.
#[test]
fn profiles_show_the_prologue_on_the_calls_that_ran_it() {
    each_backend(|| {
        let ctx = dev().with_profiling(true);
        if ctx.device() == "cuda-emulated" {
            return; // the emulator has no profiler: its runs carry no times
        }
        let mut rng = Rng::new(5131);
        let (rows, k, n) = (4, 16, 8);
        let a = ctx.variable("a", tensor_f(&ctx, F32, &rand_f(&mut rng, F32, &[k, n], 0.5))).expect("a");
        let b = ctx.variable("b", tensor_f(&ctx, F32, &rand_f(&mut rng, F32, &[k, n], 0.5))).expect("b");
        ctx.sync().expect("initial values");
        let mut call = |what: &str| -> kiln::profile::RunProfile {
            let x = tensor_f(&ctx, F32, &rand_f(&mut rng, F32, &[rows, k], 1.0));
            let before = ctx.profile().runs.len();
            x.matmul(&(&*a * 0.5 + &*b)).to_vec::<f32>().expect(what);
            let runs = ctx.profile().runs;
            assert_eq!(runs.len(), before + 1, "{what}: one profiled run on {}", ctx.device());
            runs.last().cloned().expect("a run")
        };
        let device = ctx.device();
        for (what, with_prologue) in [("first call", true), ("second call", false), ("third call", false)] {
            let run = call(what);
            let (kept, plan): (Vec<_>, Vec<_>) = run.nodes.iter().partition(|t| t.prologue);
            assert_eq!(!kept.is_empty(), with_prologue, "{what} on {device}: prologue nodes {kept:?}");
            assert!(!plan.is_empty(), "{what} on {device}: no node of the plan");
            let end = kept.iter().map(|t| t.start_us + t.dur_us).fold(0.0, f64::max);
            let start = plan.iter().map(|t| t.start_us).fold(f64::INFINITY, f64::min);
            assert!(
                end <= start,
                "{what} on {device}: the prologue ends at {end} us, the plan starts at {start}"
            );
        }
        a.assign(&*a * 0.5).expect("assign");
        ctx.sync().expect("the change");
        let run = call("after the change");
        assert!(run.nodes.iter().any(|t| t.prologue), "after a change on {device}: no prologue node");
        let ops = ctx.profile().by_op();
        assert!(ops.iter().any(|r| r.key.ends_with(" (prologue)")), "{device}: by_op rows {ops:?}");
        assert!(ops.iter().any(|r| !r.key.ends_with(" (prologue)")), "{device}: by_op rows {ops:?}");
    });
}
