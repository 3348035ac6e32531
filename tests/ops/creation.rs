//! Creation: tensor round trips, zeros / ones / full, arange, and the random
//! number generators (range, moments, determinism).

use crate::reference::*;
use half::{bf16, f16};
use kiln::prelude::*;

#[test]
fn tensor_round_trips_every_dtype_and_shape() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(60);
        for dtype in DType::ALL {
            for shape in [&[][..], &[1], &[7], &[129], &[3, 1, 5], &[2, 0, 3]] {
                let (t, h) = rand_tensor(&ctx, &mut rng, dtype, shape);
                check(&t, dtype, &h, 0.0, &format!("round trip of {shape:?}"));
            }
        }
        // Exact bit patterns survive (no arithmetic on the way).
        let v = [f32::MIN_POSITIVE, -0.0, f32::MAX, f32::EPSILON, 1e-45];
        let got = ctx.tensor(&v, [5]).to_vec::<f32>().unwrap();
        assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), v.map(f32::to_bits).to_vec());
        let v = [i64::MIN, i64::MAX, -1, 0];
        assert_eq!(ctx.tensor(&v, [2, 2]).to_vec::<i64>().unwrap(), v.to_vec());
        assert_eq!(
            ctx.tensor(&[f16::MAX, f16::MIN_POSITIVE], [2]).to_vec::<f16>().unwrap(),
            vec![f16::MAX, f16::MIN_POSITIVE]
        );
        assert_eq!(
            ctx.tensor(&[bf16::MAX, bf16::ONE], [2]).to_vec::<bf16>().unwrap(),
            vec![bf16::MAX, bf16::ONE]
        );
        assert_eq!(ctx.tensor(&[2.5f64], []).item::<f64>().unwrap(), 2.5);
    });
}

#[test]
fn zeros_ones_full_on_every_dtype() {
    each_backend(|| {
        let ctx = dev();
        for dtype in DType::ALL {
            for shape in [&[][..], &[1], &[7, 3]] {
                let n: usize = shape.iter().product();
                let z = ctx.zeros_dtype(shape, dtype);
                let o = ctx.ones_dtype(shape, dtype);
                let f = ctx.full_dtype(shape, 1, dtype);
                if dtype.is_float() {
                    check_f(&z, dtype, &Nd::new(vec![0.0; n], shape), 0.0, "zeros_dtype");
                    check_f(&o, dtype, &Nd::new(vec![1.0; n], shape), 0.0, "ones_dtype");
                    check_f(&f, dtype, &Nd::new(vec![1.0; n], shape), 0.0, "full_dtype 1");
                    let g = ctx.full_dtype(shape, -2.5, dtype);
                    check_f(&g, dtype, &Nd::new(vec![-2.5; n], shape), 0.0, "full_dtype -2.5");
                } else {
                    check_i(&z, dtype, &Nd::new(vec![0; n], shape), "zeros_dtype");
                    check_i(&o, dtype, &Nd::new(vec![1; n], shape), "ones_dtype");
                    check_i(&f, dtype, &Nd::new(vec![1; n], shape), "full_dtype 1");
                }
            }
        }
        for (v, dtype) in [(255i64, DType::U8), (i32::MIN as i64, DType::I32), (i64::MAX, DType::I64)] {
            check_i(&ctx.full_dtype([3], v, dtype), dtype, &Nd::new(vec![v; 3], &[3]), "full_dtype extreme");
        }
        check_i(
            &ctx.full_dtype([2], true, DType::Bool),
            DType::Bool,
            &Nd::new(vec![1, 1], &[2]),
            "full true",
        );
        check_f(&ctx.zeros([2, 3]), DType::F32, &Nd::new(vec![0.0; 6], &[2, 3]), 0.0, "zeros");
        check_f(&ctx.ones([4]), DType::F32, &Nd::new(vec![1.0; 4], &[4]), 0.0, "ones");
        check_f(&ctx.full([2], 0.75f32), DType::F32, &Nd::new(vec![0.75; 2], &[2]), 0.0, "full");
    });
}

#[test]
fn arange_on_numeric_dtypes() {
    each_backend(|| {
        let ctx = dev();
        let ints = |v: Vec<i64>| {
            let n = v.len();
            Nd::new(v, &[n])
        };
        check_i(&ctx.arange(0i64, 5, 1), DType::I64, &ints(vec![0, 1, 2, 3, 4]), "arange i64");
        check_i(
            &ctx.arange(10i32, -3, -4),
            DType::I32,
            &ints(vec![10, 6, 2, -2]),
            "arange i32 negative step",
        );
        check_i(&ctx.arange(3u8, 250, 60), DType::U8, &ints(vec![3, 63, 123, 183, 243]), "arange u8");
        check_i(&ctx.arange(5i64, 5, 1), DType::I64, &ints(vec![]), "arange empty");
        check_i(&ctx.arange(5i64, 0, 1), DType::I64, &ints(vec![]), "arange backwards is empty");
        let start = i64::MAX - 3;
        check_i(
            &ctx.arange(start, i64::MAX, 2),
            DType::I64,
            &ints(vec![start, start + 2]),
            "arange near i64::MAX",
        );
        let floats = |v: Vec<f64>| {
            let n = v.len();
            Nd::new(v, &[n])
        };
        check_f(
            &ctx.arange(0.0f32, 1.0, 0.25),
            DType::F32,
            &floats(vec![0.0, 0.25, 0.5, 0.75]),
            0.0,
            "arange f32",
        );
        check_f(
            &ctx.arange(1.0f64, 0.0, -0.3),
            DType::F64,
            &floats(vec![1.0, 0.7, 0.4, 0.1]),
            1.0,
            "arange f64 down",
        );
        let want = floats((0..129).map(|i| -3.0 + 0.5 * i as f64).collect());
        check_f(
            &ctx.arange(f16::from_f32(-3.0), f16::from_f32(61.5), f16::from_f32(0.5)),
            DType::F16,
            &want,
            0.0,
            "f16",
        );
        let want = floats((0..7).map(|i| i as f64 * 2.0).collect());
        check_f(
            &ctx.arange(bf16::ZERO, bf16::from_f32(13.0), bf16::from_f32(2.0)),
            DType::BF16,
            &want,
            0.0,
            "bf16",
        );
    });
}

fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn rand_is_uniform_on_0_1_for_every_float_dtype() {
    each_backend(|| {
        let ctx = dev().with_seed(11);
        for dtype in FLOATS {
            let r = ctx.rand_dtype([100_000], dtype);
            assert_eq!(r.dtype(), dtype);
            let v = read_f(&r).to_vec();
            let (lo, hi) =
                v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
            assert!(lo >= 0.0 && hi < 1.0, "rand {dtype}: values in [{lo}, {hi}], want [0, 1)");
            let (mean, std) = moments(&v);
            assert!((mean - 0.5).abs() < 0.01, "rand {dtype}: mean {mean}");
            assert!((std - (1.0f64 / 12.0).sqrt()).abs() < 0.01, "rand {dtype}: std {std}");
            // Deciles are evenly filled.
            let mut bins = [0usize; 10];
            for &x in &v {
                bins[((x * 10.0) as usize).min(9)] += 1;
            }
            assert!(bins.iter().all(|&b| (9_000..11_000).contains(&b)), "rand {dtype}: deciles {bins:?}");
        }
        // f64 draws use more than f32's 24 bits.
        let v = ctx.rand_dtype([1000], DType::F64).to_vec::<f64>().unwrap();
        assert!(v.iter().filter(|&&x| x as f32 as f64 != x).count() > 900, "f64 rand has f32 precision");
        let v = ctx.randn_dtype([1000], DType::F64).to_vec::<f64>().unwrap();
        assert!(v.iter().filter(|&&x| x as f32 as f64 != x).count() > 900, "f64 randn has f32 precision");
        let f = ctx.rand([3, 5]);
        assert_eq!((f.shape(), f.dtype()), (&[3usize, 5][..], DType::F32));
    });
}

#[test]
fn randn_has_mean_0_and_std_1_for_every_float_dtype() {
    each_backend(|| {
        let ctx = dev().with_seed(12);
        for dtype in FLOATS {
            let r = ctx.randn_dtype([100_000], dtype);
            let v = read_f(&r).to_vec();
            assert!(v.iter().all(|x| x.is_finite()), "randn {dtype}: non-finite values");
            let (mean, std) = moments(&v);
            assert!(mean.abs() < 0.02, "randn {dtype}: mean {mean}");
            assert!((std - 1.0).abs() < 0.02, "randn {dtype}: std {std}");
            let tail = v.iter().filter(|x| x.abs() > 1.96).count() as f64 / v.len() as f64;
            assert!((tail - 0.05).abs() < 0.005, "randn {dtype}: P(|x| > 1.96) = {tail}");
        }
        let f = ctx.randn([2, 2]);
        assert_eq!(f.dtype(), DType::F32);
    });
}

#[test]
fn random_numbers_are_deterministic_per_seed_and_distinct_per_node() {
    each_backend(|| {
        let draw = |seed: u64| {
            let ctx = dev().with_seed(seed);
            let a = ctx.randn([1000]).to_vec::<f32>().unwrap();
            let b = ctx.rand([1000]).to_vec::<f32>().unwrap();
            (a, b)
        };
        let (a1, b1) = draw(5);
        let (a2, b2) = draw(5);
        assert_eq!(a1, a2, "same seed, two fresh contexts: randn differs");
        assert_eq!(b1, b2, "same seed, two fresh contexts: rand differs");
        let (a3, _) = draw(6);
        assert_ne!(a1, a3, "different seeds give the same numbers");

        let ctx = dev().with_seed(5);
        let x = ctx.rand([1000]);
        let y = ctx.rand([1000]);
        let (vx, vy) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        let same = vx.iter().zip(&vy).filter(|(a, b)| a == b).count();
        assert!(same < 10, "two random nodes agree in {same} of 1000 places");
        // Reading again gives the same values.
        assert_eq!(x.to_vec::<f32>().unwrap(), vx, "a second read of a random tensor differs");

        // A random tensor used by two reads that compile separately is drawn once.
        let r = ctx.randn([257]);
        let doubled = (&r * 2.0).to_vec::<f32>().unwrap();
        let plain = r.to_vec::<f32>().unwrap();
        let twice: Vec<f32> = plain.iter().map(|x| x * 2.0).collect();
        assert_eq!(doubled, twice, "r * 2 and r read separately disagree");
        let again = (&r + 0.0).to_vec::<f32>().unwrap();
        assert_eq!(again, plain, "r + 0 after r was read");

        // A random tensor that feeds two outputs of one read is one draw.
        let s = ctx.rand([64]);
        let d = (&s - &s).to_vec::<f32>().unwrap();
        assert!(d.iter().all(|&x| x == 0.0), "s - s is not zero: the node was drawn twice");
    });
}

/// Random tensors of one size in one plan: on CUDA they share a kernel
/// that reads its stream's number through a pointer (a model's
/// initializers are dozens of draws), so each must still draw its own
/// stream, the CPU's numbers, over many reads of interleaved plans.
#[test]
fn random_tensors_of_one_size_in_one_plan_draw_their_own_streams() {
    let draw = |ctx: &Context| {
        let parts = [ctx.randn([300]), ctx.randn([300]), ctx.rand([300]), ctx.rand([300]), ctx.randn([301])];
        Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0).to_vec::<f32>().unwrap()
    };
    // Each new random node draws a new stream: a context's second round
    // gives new numbers, the CPU context's second round's.
    let reference: Vec<Vec<Vec<f32>>> = (0..4)
        .map(|seed| {
            let ctx = Context::cpu().with_seed(seed);
            (0..3).map(|_| draw(&ctx)).collect()
        })
        .collect();
    each_backend(|| {
        let contexts: Vec<Context> = (0..4).map(|seed| dev().with_seed(seed)).collect();
        for round in 0..3 {
            for (seed, (ctx, rounds)) in contexts.iter().zip(&reference).enumerate() {
                let got = draw(ctx);
                let want = &rounds[round];
                // Double-precision log and cos may differ in their last
                // bits between libm and CUDA; as f32 they agree closely.
                let far =
                    got.iter().zip(want).filter(|(g, w)| (*g - *w).abs() > 1e-6 * w.abs().max(1.0)).count();
                assert_eq!(far, 0, "seed {seed}, round {round}: {far} values differ from the CPU's");
                for (a, b) in [(0, 300), (600, 900)] {
                    let same = (0..300).filter(|&i| got[a + i] == got[b + i]).count();
                    assert!(same < 5, "seed {seed}: parts at {a} and {b} agree in {same} of 300 places");
                }
            }
        }
    });
}
