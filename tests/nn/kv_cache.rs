//! `nn::KvCache` and `Variable::write_at`: attention over a cache filled
//! by a prefill and then one token at a time equals attention over the
//! whole sequence (f64 reference written here), for a left-padded batch;
//! a captured decode step equals the uncaptured one and compiles nothing
//! per position; interleaved caches and held snapshots keep their values.

use kiln::nn::KvCache;
use kiln::prelude::*;

use crate::splitmix::Rng;

/// The contexts to check: those of the GPT-2 tests (the CPU, the emulator
/// with its feature, the GPU when there is one).
fn contexts() -> Vec<Context> {
    crate::gpt2::devices().into_iter().map(|(_, make)| make()).collect()
}

const B: usize = 2;
const H: usize = 2;
const T: usize = 7;
const D: usize = 4;
const MAX: usize = 9;

/// Random `[B, H, T, D]` data.
fn data(rng: &mut Rng) -> Vec<f64> {
    (0..B * H * T * D).map(|_| rng.normal()).collect()
}

/// Attention of query `i` over keys `starts[b]..=i`, in f64: `[B, H, T, D]`.
fn reference(q: &[f64], k: &[f64], v: &[f64], starts: &[usize]) -> Vec<f64> {
    let at = |x: &[f64], b: usize, h: usize, t: usize| x[((b * H + h) * T + t) * D..][..D].to_vec();
    let scale = 1.0 / (D as f64).sqrt();
    let mut out = vec![0.0; B * H * T * D];
    for b in 0..B {
        for h in 0..H {
            for i in 0..T {
                let qi = at(q, b, h, i);
                let keys: Vec<usize> = (starts[b]..=i).collect();
                if keys.is_empty() {
                    continue; // a fully padded row: zeros
                }
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| qi.iter().zip(at(k, b, h, j)).map(|(a, c)| a * c).sum::<f64>() * scale)
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (&j, w) in keys.iter().zip(&e) {
                    for (d, vj) in at(v, b, h, j).iter().enumerate() {
                        out[((b * H + h) * T + i) * D + d] += w / z * vj;
                    }
                }
            }
        }
    }
    out
}

fn tensor(ctx: &Context, x: &[f64]) -> Tensor {
    ctx.tensor(&x.iter().map(|&v| v as f32).collect::<Vec<_>>(), [B, H, T, D])
}

fn close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((*g as f64 - w).abs() <= 1e-5 + 1e-5 * w.abs(), "{what}: element {i} is {g}, want {w}");
    }
}

/// Positions `t0..t1` of a `[B, H, T, D]` reference, flattened.
fn window(x: &[f64], t0: usize, t1: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for bh in 0..B * H {
        out.extend_from_slice(&x[(bh * T + t0) * D..(bh * T + t1) * D]);
    }
    out
}

#[test]
fn prefill_then_decode_equals_attention_over_the_whole_sequence() -> Result<()> {
    for ctx in contexts() {
        let mut rng = Rng(71);
        let (q, k, v) = (data(&mut rng), data(&mut rng), data(&mut rng));
        let starts = [0usize, 3];
        let want = reference(&q, &k, &v, &starts);
        let (tq, tk, tv) = (tensor(&ctx, &q), tensor(&ctx, &k), tensor(&ctx, &v));
        let cache = KvCache::new(&ctx, "cache", 1, B, H, MAX, D, DType::F32)?;
        let st = ctx.tensor(&starts.map(|s| s as i64), [B]);
        // Prefill 4 positions at once, then one at a time.
        let prefill = 4;
        let at0 = ctx.scalar(0i64);
        let (keys, values) = cache.append(0, &at0, &tk.narrow(2, 0, prefill), &tv.narrow(2, 0, prefill))?;
        let mask = cache.visible(&at0, prefill, &st);
        let out =
            tq.narrow(2, 0, prefill).scaled_dot_product_attention(&keys, &values, Some(&mask), false, None);
        close(&out.to_vec::<f32>()?, &window(&want, 0, prefill), &format!("{} prefill", ctx.device()));
        let compiles = ctx.stats().compiles;
        for t in prefill..T {
            let at = ctx.scalar(t as i64);
            let (keys, values) = cache.append(0, &at, &tk.narrow(2, t, 1), &tv.narrow(2, t, 1))?;
            let mask = cache.visible(&at, 1, &st);
            let out =
                tq.narrow(2, t, 1).scaled_dot_product_attention(&keys, &values, Some(&mask), false, None);
            close(
                &out.to_vec::<f32>()?,
                &window(&want, t, t + 1),
                &format!("{} decode at {t}", ctx.device()),
            );
        }
        // The narrow of each position is a view with its own offset, so
        // the decode plans differ only in constants: at most one each.
        let per_token = ctx.stats().compiles - compiles;
        assert!(per_token <= (T - prefill) as u64, "{}: {per_token} compiles", ctx.device());
        let positions = cache.positions(&ctx.scalar(4i64), 2, &st).to_vec::<i64>()?;
        assert_eq!(positions, vec![4, 5, 1, 2]);
    }
    Ok(())
}

#[test]
fn a_captured_decode_step_replays_every_position_without_compiling() -> Result<()> {
    for ctx in contexts() {
        let mut rng = Rng(72);
        let (q, k, v) = (data(&mut rng), data(&mut rng), data(&mut rng));
        let starts = [2usize, 0];
        let want = reference(&q, &k, &v, &starts);
        let (tq, tk, tv) = (tensor(&ctx, &q), tensor(&ctx, &k), tensor(&ctx, &v));
        let cache = std::sync::Arc::new(KvCache::new(&ctx, "cache", 2, B, H, MAX, D, DType::F32)?);
        let st = ctx.tensor(&starts.map(|s| s as i64), [B]);
        let (c, s) = (cache.clone(), st.clone());
        // Arguments: q, k, v of one position and its cache index. Layer 1
        // gets the same data doubled, so the two layers' caches differ.
        let mut step = ctx.capture(move |args: &[Tensor]| {
            let (q, k, v, at) = (&args[0], &args[1], &args[2], &args[3]);
            let mask = c.visible(at, 1, &s);
            let mut outs = Vec::new();
            for layer in 0..2 {
                let scale = (layer + 1) as f64;
                let (keys, values) = c.append(layer, at, &(k * scale), &(v * scale))?;
                outs.push(q.scaled_dot_product_attention(&keys, &values, Some(&mask), false, None));
            }
            Ok(outs)
        });
        // Every position's arguments, computed first: reading a narrow
        // compiles a plan of its own, which is not the step's.
        let per_position: Vec<[Tensor; 4]> = (0..T)
            .map(|t| [tq.narrow(2, t, 1), tk.narrow(2, t, 1), tv.narrow(2, t, 1), ctx.scalar(t as i64)])
            .collect();
        for args in &per_position {
            ctx.realize(&args.iter().collect::<Vec<_>>())?;
        }
        let mut compiles = None;
        for (t, args) in per_position.iter().enumerate() {
            let outs = step.call(&[&args[0], &args[1], &args[2], &args[3]])?;
            let w = window(&want, t, t + 1);
            close(&outs[0].to_vec::<f32>()?, &w, &format!("{} captured layer 0 at {t}", ctx.device()));
            // Layer 1: keys and values doubled, so scores doubled.
            assert_eq!(outs[1].shape(), &[B, H, 1, D]);
            if t == 0 {
                compiles = Some(ctx.stats().compiles);
            }
        }
        assert_eq!(step.captures(), 1, "{}: one signature", ctx.device());
        assert_eq!(step.replays(), (T - 1) as u64);
        assert_eq!(compiles, Some(ctx.stats().compiles), "{}: a replay compiled", ctx.device());
        // The cache holds every position's keys: layer 0 unscaled.
        let keys = cache.variables()[0].to_vec::<f32>()?;
        for bh in 0..B * H {
            let got = &keys[bh * MAX * D..][..T * D];
            let w: Vec<f64> = k[bh * T * D..][..T * D].to_vec();
            close(got, &w, &format!("{} cached keys", ctx.device()));
        }
    }
    Ok(())
}

#[test]
fn interleaved_caches_and_held_snapshots_keep_their_values() -> Result<()> {
    for ctx in contexts() {
        let mut rng = Rng(73);
        let n = 6;
        let a = ctx.variable("a", ctx.zeros([3, n]))?;
        let b = ctx.variable("b", ctx.zeros([n, 2]))?;
        let (mut ha, mut hb) = (vec![0.0f32; 3 * n], vec![0.0f32; n * 2]);
        let mut held: Vec<(Tensor, Vec<f32>)> = Vec::new();
        for i in 0..40 {
            let col: Vec<f32> = (0..3).map(|_| rng.normal() as f32).collect();
            let row: Vec<f32> = (0..2).map(|_| rng.normal() as f32).collect();
            let (ca, rb) = (rng.next() as usize % n, rng.next() as usize % n);
            // Tensors that read `a` before a write and are read only at
            // the end (recorded, not computed) and snapshots taken after
            // one must keep what they read.
            if i % 7 == 0 {
                held.push((&*a * 1.0, ha.clone()));
            }
            a.write_at(1, ca, &ctx.tensor(&col, [3, 1]))?;
            for (r, v) in col.iter().enumerate() {
                ha[r * n + ca] = *v;
            }
            if i % 3 == 0 {
                b.write_at(0, ctx.scalar(rb as i64), &ctx.tensor(&row, [1, 2]))?;
                hb[rb * 2..rb * 2 + 2].copy_from_slice(&row);
            }
            if i % 4 == 0 {
                held.push((a.detach(), ha.clone()));
            }
            if i % 5 == 0 {
                assert_eq!(b.to_vec::<f32>()?, hb, "{} b at {i}", ctx.device());
            }
            if i % 2 == 0 {
                assert_eq!(a.to_vec::<f32>()?, ha, "{} a at {i}", ctx.device());
            }
        }
        for (k, (t, want)) in held.iter().enumerate() {
            assert_eq!(&t.to_vec::<f32>()?, want, "{} snapshot {k}", ctx.device());
        }
    }
    Ok(())
}
