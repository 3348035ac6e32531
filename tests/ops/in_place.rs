//! `write_at` into variables written in place (the plan's `!over`
//! placement, given up by the context when nothing else reads the old
//! value): against a host model of every variable and of every value a
//! reader held, over many steps of several interleaved plans, uncaptured
//! and captured; and the evidence that the writes were in place (no
//! allocation per step on the CPU, no graph input copy of the cache on
//! CUDA).

use crate::reference::*;
use kiln::prelude::*;

/// A cache variable `[2, len, 3]` of f32 and its host model.
struct Cache {
    var: Variable,
    model: Vec<f32>,
    len: usize,
}

impl Cache {
    fn new(ctx: &Context, rng: &mut Rng, name: &str, len: usize) -> Cache {
        let model: Vec<f32> = (0..2 * len * 3).map(|_| rng.normal() as f32).collect();
        let var = ctx.variable(name, ctx.tensor(&model, [2, len, 3])).expect("variable");
        Cache { var, model, len }
    }

    /// Writes `rows` random rows at `at` (clamped as the op clamps), on the
    /// variable and the model; the offset on the host or the device.
    fn write(&mut self, ctx: &Context, rng: &mut Rng, rows: usize, at: i64, device_offset: bool) {
        let value: Vec<f32> = (0..2 * rows * 3).map(|_| rng.normal() as f32).collect();
        let v = ctx.tensor(&value, [2, rows, 3]);
        let start = at.clamp(0, (self.len - rows) as i64) as usize;
        if device_offset {
            self.var.write_at(1, ctx.scalar(at), &v).expect("write_at");
        } else {
            self.var.write_at(1, start, &v).expect("write_at");
        }
        for b in 0..2 {
            for r in 0..rows {
                for c in 0..3 {
                    self.model[(b * self.len + start + r) * 3 + c] = value[(b * rows + r) * 3 + c];
                }
            }
        }
    }
}

/// Many steps over three caches (three plans per kind of step), with
/// readers that hold old values: snapshots (`detach`), pending ops recorded
/// before a write (`&*cache * 2.0`), and reads in between. Every value must
/// be what the program order says, whichever writes ran in place.
#[test]
fn in_place_writes_keep_every_value_a_reader_holds() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(907);
        let mut caches: Vec<Cache> = [5usize, 8, 13]
            .iter()
            .enumerate()
            .map(|(i, &l)| Cache::new(&ctx, &mut rng, &format!("c{i}"), l))
            .collect();
        // (tensor, what it must read, which step made it)
        let mut held: Vec<(Tensor, Vec<f32>, usize)> = Vec::new();
        for step in 0..150 {
            let c = rng.range(0, caches.len() as i64) as usize;
            match rng.range(0, 10) {
                0..=4 => {
                    let cache = &mut caches[c];
                    let rows = rng.range(1, 3) as usize;
                    let at = rng.range(-2, cache.len as i64 + 1);
                    let device = rng.range(0, 2) == 1;
                    cache.write(&ctx, &mut rng, rows, at, device);
                }
                5 => {
                    let cache = &caches[c];
                    held.push((cache.var.detach(), cache.model.clone(), step));
                }
                6 => {
                    let cache = &caches[c];
                    let doubled = cache.model.iter().map(|x| x * 2.0).collect();
                    held.push((&*cache.var * 2.0, doubled, step));
                }
                7 => {
                    let cache = &caches[c];
                    let got = cache.var.to_vec::<f32>().expect("read");
                    assert_eq!(got, cache.model, "cache {c} at step {step}");
                }
                8 => {
                    let cache = &caches[c];
                    let got = cache.var.sum_all().item::<f32>().expect("sum");
                    let want: f64 = cache.model.iter().map(|&x| x as f64).sum();
                    assert!(
                        (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "sum of cache {c} at {step}"
                    );
                }
                _ => {
                    if !held.is_empty() {
                        let k = rng.range(0, held.len() as i64) as usize;
                        let (t, want, made) = held.swap_remove(k);
                        let got = t.to_vec::<f32>().expect("held read");
                        assert_eq!(got, want, "a value held since step {made}, read at step {step}");
                    }
                }
            }
        }
        for (t, want, made) in held {
            assert_eq!(t.to_vec::<f32>().expect("held read"), want, "a value held since step {made}");
        }
        for (c, cache) in caches.iter().enumerate() {
            assert_eq!(cache.var.to_vec::<f32>().expect("read"), cache.model, "cache {c} at the end");
        }
    });
}

/// On the CPU a write nobody else reads goes into the variable's own
/// storage: a thousand steps allocate far less than one copy of the cache
/// each (the copying path allocated 64 KiB per step).
#[test]
fn a_cpu_variable_written_in_place_allocates_no_copy_per_step() {
    let ctx = Context::cpu();
    let cache = ctx.variable("cache", ctx.zeros([4, 1024, 4])).expect("variable");
    let row = ctx.ones([4, 1, 4]);
    cache.write_at(1, 0, &row).expect("write");
    cache.realize().expect("first run");
    let before = ctx.stats().bytes_allocated;
    for pos in 1..1001 {
        cache.write_at(1, pos % 1024, &row).expect("write");
        cache.realize().expect("run");
    }
    let per_step = (ctx.stats().bytes_allocated - before) / 1000;
    let cache_bytes = 4 * 1024 * 4 * 4;
    assert!(per_step < cache_bytes / 16, "{per_step} B allocated per step for a {cache_bytes} B cache");
    let sum = cache.sum_all().item::<f32>().expect("sum");
    assert_eq!(sum, (1001 * 16) as f32);
}

/// A captured step that writes a variable's window each call: its results
/// equal the uncaptured program's for every call, with snapshots taken
/// between calls; on CUDA the cache is bound in place (no graph input
/// copy of it: the copies per replay are the step's two arguments).
#[test]
fn a_captured_step_writes_its_variable_in_place() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(5);
        let len = 12;
        let mut cache = Cache::new(&ctx, &mut rng, "kv", len);
        let var = cache.var.clone();
        let mut step = ctx.capture(move |args: &[Tensor]| {
            var.write_at(1, &args[1], &args[0])?;
            Ok(vec![var.sum_all()])
        });
        let mut snapshots = Vec::new();
        let mut copies_after_warm_up = None;
        for call in 0..40 {
            if call == 3 {
                copies_after_warm_up = Some(ctx.stats().graph_input_copies);
            }
            let value: Vec<f32> = (0..6).map(|_| rng.normal() as f32).collect();
            let at = rng.range(-1, len as i64 + 1);
            let out = step.call(&[&ctx.tensor(&value, [2, 1, 3]), &ctx.scalar(at)]).expect("call");
            let start = at.clamp(0, len as i64 - 1) as usize;
            for b in 0..2 {
                for c in 0..3 {
                    cache.model[(b * len + start) * 3 + c] = value[b * 3 + c];
                }
            }
            let want: f64 = cache.model.iter().map(|&x| x as f64).sum();
            let got = out[0].item::<f32>().expect("sum") as f64;
            assert!((got - want).abs() < 1e-4 * (1.0 + want.abs()), "call {call}: sum {got} vs {want}");
            if call % 7 == 3 {
                snapshots.push((cache.var.detach(), cache.model.clone(), call));
            }
            if call % 11 == 5 {
                assert_eq!(cache.var.to_vec::<f32>().expect("read"), cache.model, "call {call}");
            }
        }
        for (t, want, call) in snapshots {
            assert_eq!(t.to_vec::<f32>().expect("snapshot"), want, "the snapshot of call {call}");
        }
        assert_eq!(step.captures(), 1);
        if ctx.device().starts_with("cuda") {
            let copies = ctx.stats().graph_input_copies - copies_after_warm_up.expect("counted");
            // 37 replays: the value and the offset are new bytes each call
            // (2 per call); the cache never is, except after the calls that
            // took a snapshot (a held old value makes the next call write
            // over a copy, and the one after copies it into its slot).
            let snapshots_taken = (3..40).filter(|c| c % 7 == 3).count() as u64;
            assert!(copies <= 37 * 2 + 2 * snapshots_taken, "{copies} graph input copies in 37 replays");
        }
    });
}

/// A tensor a captured step uploads itself is a constant of the step:
/// every replay must read it unchanged, so no run writes over it (the
/// recording run gave it to the run, and replays wrote into what they
/// then bound as that constant).
#[test]
fn a_captured_step_never_writes_over_its_constants() {
    each_backend(|| {
        let ctx = dev();
        let inner = ctx.clone();
        let mut step = ctx.capture(move |args: &[Tensor]| {
            let base = inner.tensor(&[0.0f32; 6], [6]);
            Ok(vec![base.write_at(0, &args[1], &args[0])])
        });
        for call in 0..8usize {
            let value = ctx.tensor(&[call as f32 + 1.0], [1]);
            let out = step.call(&[&value, &ctx.scalar((call % 6) as i64)]).expect("call");
            let mut want = vec![0.0f32; 6];
            want[call % 6] = call as f32 + 1.0;
            assert_eq!(out[0].to_vec::<f32>().expect("read"), want, "call {call}");
        }
    });
}

/// `warm_up` compiles a plan that writes a variable in place without
/// running it: the variable keeps its value for the read that runs it.
#[test]
fn warm_up_of_an_in_place_write_loses_nothing() {
    each_backend(|| {
        let ctx = dev();
        let cache = ctx.variable("cache", ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [1, 4])).expect("variable");
        cache.write_at(1, 2, &ctx.tensor(&[9.0f32], [1, 1])).expect("write");
        ctx.warm_up(&[&cache]).expect("warm up");
        assert_eq!(cache.to_vec::<f32>().expect("read"), vec![1.0, 2.0, 9.0, 4.0]);
    });
}
