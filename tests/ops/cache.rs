//! The plan cache and graph collection: the same computation on new data
//! compiles once; a loop keeps the recording graph bounded; a new shape
//! compiles once more.

use crate::reference::{dev, each_backend};
use kiln::prelude::*;

fn step(ctx: &Context, data: &[f32], rows: usize) -> Vec<f32> {
    let x = ctx.tensor(data, [rows, data.len() / rows]);
    (x * 2.0 + 1.0).sum(&[0], false).to_vec::<f32>().unwrap()
}

fn want(data: &[f32], rows: usize) -> Vec<f32> {
    let cols = data.len() / rows;
    (0..cols).map(|c| (0..rows).map(|r| data[r * cols + c] * 2.0 + 1.0).sum()).collect()
}

#[test]
fn same_computation_on_new_data_compiles_once() {
    each_backend(|| {
        let ctx = dev();
        let a: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..12).map(|i| (i * i) as f32 - 3.5).collect();
        assert_eq!(step(&ctx, &a, 3), want(&a, 3));
        let s = ctx.stats();
        assert_eq!((s.compiles, s.cache_hits), (1, 0), "after the first run: {s:?}");
        assert_eq!(step(&ctx, &b, 3), want(&b, 3));
        let s = ctx.stats();
        assert_eq!((s.compiles, s.cache_hits), (1, 1), "after the second run on new data: {s:?}");

        // A new shape compiles once more, then hits.
        let c: Vec<f32> = (0..10).map(|i| 0.5 * i as f32).collect();
        assert_eq!(step(&ctx, &c, 2), want(&c, 2));
        assert_eq!(step(&ctx, &c, 5), want(&c, 5));
        let s = ctx.stats();
        assert_eq!((s.compiles, s.cache_hits), (3, 1), "after two new shapes: {s:?}");
        let d: Vec<f32> = (0..10).map(|i| 1.0 - i as f32).collect();
        assert_eq!(step(&ctx, &d, 2), want(&d, 2));
        let s = ctx.stats();
        assert_eq!((s.compiles, s.cache_hits), (3, 2), "a seen shape again: {s:?}");
    });
}

#[test]
fn different_constants_or_dtypes_do_not_share_a_plan() {
    each_backend(|| {
        let ctx = dev();
        let x = ctx.tensor(&[1.0f32, 2.0], [2]);
        assert_eq!((&x * 2.0).to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
        assert_eq!((&x * 3.0).to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
        let y = ctx.tensor(&[1.0f64, 2.0], [2]);
        assert_eq!((&y * 2.0).to_vec::<f64>().unwrap(), vec![2.0, 4.0]);
        let s = ctx.stats();
        assert_eq!((s.compiles, s.cache_hits), (3, 0), "{s:?}");
    });
}

#[test]
fn a_training_like_loop_keeps_the_graph_bounded() {
    each_backend(|| {
        let ctx = dev().with_seed(3);
        let mut w = ctx.randn([8, 4]);
        let mut sizes = Vec::new();
        let mut buffers = Vec::new();
        let mut last = Vec::new();
        for i in 0..20 {
            let x = ctx.tensor(&(0..16).map(|k| (k + i) as f32 * 0.01).collect::<Vec<_>>(), [2, 8]);
            let y = x.matmul(&w).relu().sum_all();
            last = y.to_vec::<f32>().unwrap();
            // Update the "weights" with a value computed from them.
            w = (&w * 0.5 + 0.25).realize().unwrap().clone();
            let s = ctx.stats();
            sizes.push(s.graph_nodes);
            buffers.push(s.buffers);
        }
        assert!(last[0].is_finite());
        let s = ctx.stats();
        assert!(sizes.iter().all(|&n| n <= sizes[1]), "graph nodes per iteration grew: {sizes:?}");
        assert!(buffers.iter().all(|&n| n <= buffers[1]), "buffers per iteration grew: {buffers:?}");
        assert!(sizes[19] <= 8, "graph nodes after the loop: {sizes:?}");
        // Two distinct computations per iteration (the first weight update reads
        // a random node, later ones a buffer): a handful of compiles, not 40.
        assert!(s.compiles <= 4, "{s:?}");
        assert!(s.cache_hits >= 36, "{s:?}");
    });
}

#[test]
fn dropped_tensors_are_collected() {
    each_backend(|| {
        let ctx = dev();
        let keep = ctx.tensor(&[1.0f32, 2.0, 3.0], [3]);
        for _ in 0..50 {
            let _unused = (&keep + 1.0).exp().sum_all();
        }
        // Reading anything collects nodes no live tensor needs.
        assert_eq!((&keep * 1.0).to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
        let s = ctx.stats();
        assert!(s.graph_nodes <= 3, "{s:?}");
        assert!(s.buffers <= 2, "{s:?}");
    });
}

#[test]
fn one_context_used_from_several_threads() {
    each_backend(|| {
        let ctx = dev();
        let base = ctx.tensor(&(0..64).map(|i| i as f32).collect::<Vec<_>>(), [8, 8]);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|k| {
                    let (ctx, base) = (ctx.clone(), base.clone());
                    s.spawn(move || {
                        let mut out = Vec::new();
                        for i in 0..10 {
                            let x = ctx.full([8, 8], (k * 10 + i) as f32);
                            out.push((&base + &x).sum_all().item::<f32>().unwrap());
                        }
                        out
                    })
                })
                .collect();
            for (k, h) in handles.into_iter().enumerate() {
                let got = h.join().unwrap();
                let want: Vec<f32> = (0..10).map(|i| 2016.0 + 64.0 * (k * 10 + i) as f32).collect();
                assert_eq!(got, want, "thread {k}");
            }
        });
    });
}

/// A diamond with two heavy branches: the same values on one stream, on
/// two (the CPU runs them as concurrent threads), without fusion and with
/// fast math; each setting compiles its own plan and a second read hits.
#[test]
fn streams_fusion_and_fast_math_keep_values_and_key_the_cache() {
    each_backend(|| {
        let data: Vec<f32> = (0..64 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let run = |ctx: &Context| {
            let x = ctx.tensor(&data, [64, 64]);
            let a = x.matmul(&x).tanh();
            let b = (x.exp() * 0.5).matmul(&x.transpose(0, 1));
            ((a + b) / 4.0).softmax(1).to_vec::<f32>().unwrap()
        };
        let base = run(&dev());
        for ctx in [dev().with_streams(2), dev().with_passes("-fusion")] {
            assert_eq!(run(&ctx), base);
            assert_eq!(run(&ctx), base);
            let s = ctx.stats();
            assert_eq!((s.compiles, s.cache_hits), (1, 1), "{s:?}");
        }
        // The two branches really are on two streams, ordered by an event.
        let ctx = dev().with_streams(2);
        let x = ctx.tensor(&data, [64, 64]);
        let y = x.matmul(&x).tanh() + (x.exp() * 0.5).matmul(&x.transpose(0, 1));
        let plan = ctx.explain(&[&y]).unwrap();
        assert!(plan.starts_with("plan schedule streams=2") && plan.contains("!wait=e0"), "{plan}");
        // Fast math may multiply by 1/4 instead of dividing: equal here (a power of two).
        let ctx = dev().with_fast_math(true);
        assert_eq!(run(&ctx), base);
        let ctx = dev();
        run(&ctx);
        let ctx = ctx.with_fast_math(true).with_streams(2);
        assert_eq!(run(&ctx), base);
        assert_eq!(ctx.stats().compiles, 2, "a new setting is a new plan");
    });
}
