//! The same mixed-precision training on every backend: the CPU, the CUDA
//! emulator (feature `cuda-emulator`: the CUDA lowering of bf16/f16
//! GEMMs, their cast epilogues and the scaler's gating, run on the CPU)
//! and a GPU when there is one (`KILN_REQUIRE_CUDA=1`: a missing GPU
//! fails). Each runs a captured AdamW step of a small MLP in bf16, and in
//! f16 under the loss scaler with one poisoned batch; the losses must
//! agree with the CPU's within a few low-precision roundings (backends
//! accumulate products in different orders), the skipped step must skip
//! everywhere, and the scaler's state must be the same.

use kiln::autocast::{GradScaler, ScalerConfig};
use kiln::nn::{self, Linear, Module, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;

type Device = (&'static str, fn() -> Context);

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
        }
    }
    out
}

/// Losses of 6 captured steps (the fourth batch poisoned with an inf
/// under f16) and the scaler's final scale.
fn run(ctx: Context, low: DType) -> Result<(Vec<f32>, f32)> {
    let ctx = ctx.with_seed(3).with_autocast(low);
    let model = Sequential::new(&ctx, "mlp", |ctx| {
        Ok(vec![Linear::new(ctx, "0", 20, 64)?.boxed(), ReLU.boxed(), Linear::new(ctx, "2", 64, 4)?.boxed()])
    })?;
    let adamw = AdamW::new(&model, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() })?;
    let config = ScalerConfig { init_scale: 1024.0, growth_interval: 2, ..ScalerConfig::default() };
    let opt = GradScaler::new(&ctx, adamw, config)?;
    let scale = opt.scale();
    let mut step = TrainStep::new(&ctx, opt, |b: &[Tensor]| nn::cross_entropy(&model.forward(&b[0])?, &b[1]));
    let labels: Vec<i64> = (0..32).map(|i| (i * 5 % 4) as i64).collect();
    let y = ctx.tensor(&labels, [32]);
    let mut losses = Vec::new();
    for k in 0..6 {
        let mut xs: Vec<f32> = (0..32 * 20).map(|i| (((i * 7 + k * 3) % 17) as f32 - 8.0) / 8.0).collect();
        if k == 3 && low == DType::F16 {
            xs[5] = f32::INFINITY;
        }
        let x = ctx.tensor(&xs, [32, 20]);
        losses.push(step.call(&[&x, &y])?.item::<f32>()?);
    }
    Ok((losses, scale.item::<f32>()?))
}

#[test]
fn mixed_precision_steps_agree_across_backends() -> Result<()> {
    for low in [DType::BF16, DType::F16] {
        let (want, want_scale) = run(Context::cpu(), low)?;
        // One rounding of the low type, a few times over (the products'
        // roundings compound through two layers and the update).
        let tol = if low == DType::BF16 { 2e-2 } else { 4e-3 };
        for (name, make) in devices().into_iter().skip(1) {
            let (got, scale) = run(make(), low)?;
            assert_eq!(scale, want_scale, "{name} {low}: the scaler's state differs");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                if w.is_nan() {
                    assert!(g.is_nan(), "{name} {low}: step {k} gave {g}, the CPU a NaN");
                } else {
                    assert!((g - w).abs() <= tol * w.abs(), "{name} {low}: step {k} loss {g}, the CPU's {w}");
                }
            }
        }
        if low == DType::F16 {
            assert!(want[3].is_nan(), "the poisoned batch gave a finite loss {}", want[3]);
        }
    }
    Ok(())
}

/// Loss and gradients of a pre-norm MLP block under bf16 autocast: a layer
/// norm, a bf16 product, `tanh`, a second product reshaped back and added
/// to the f32 residual. The second product reaches the residual only
/// widened (`reshape(cast(mm))`), and the layer norm's backward reads the
/// first product's input gradient widened, as does its `dβ` column sum.
/// No bias or GELU follows a product: on a GPU those become cuBLASLt
/// epilogues, which round once where the unfused graph rounds after each
/// op (by design, and not what this test is about).
fn block_gradients(ctx: Context) -> Result<Vec<Vec<f32>>> {
    let ctx = ctx.with_autocast(DType::BF16);
    // Drawn on the host: the same numbers on every backend and plan.
    let mut rng = super::splitmix::Rng(5);
    let mut draw = |name: &str, shape: &[usize], scale: f64, shift: f64| -> Result<Variable> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| (rng.normal() * scale + shift) as f32).collect();
        ctx.variable(name, ctx.tensor(&v, shape.to_vec()))
    };
    let x = draw("x", &[2, 8, 32], 1.0, 0.0)?;
    let gamma = draw("gamma", &[32], 0.1, 1.0)?;
    let beta = draw("beta", &[32], 0.1, 0.0)?;
    let w = draw("w", &[32, 48], 0.2, 0.0)?;
    let w2 = draw("w2", &[48, 32], 0.2, 0.0)?;
    let h = x.layer_norm(&gamma, &beta, 1e-5).reshape([16, 32]);
    let u = h.matmul(&w).tanh();
    let y = &*x + &u.matmul(&w2).reshape([2, 8, 32]);
    let loss = (&y * &y).mean(&[0, 1, 2], false);
    let grads = loss.backward()?;
    let mut out = vec![loss.to_vec::<f32>()?];
    for v in [&x, &gamma, &beta] {
        out.push(grads.get(v).expect("every variable has a gradient").to_vec::<f32>()?);
    }
    Ok(out)
}

/// Fusion changes no bit of an autocast block's loss and activation-side
/// gradients on any backend: a matmul's product that is only widened is
/// stored in bf16 by the GEMM and widened by each reader (the residual
/// add, the layer norm's backward, the `dβ` column sum), as the unfused
/// graph rounds it. (A GEMM that stored its f32 accumulator instead, as
/// the widening cast fused into its epilogue did before, gave other
/// bits.) The weights' gradients are left out on purpose: a bf16 weight
/// gradient widened to its f32 variable is returned as it is computed,
/// and there the GEMM does store its f32 accumulator
/// (`tests/cuda/fused/matmul-widen.kir`), more precise than the unfused
/// graph's rounding.
#[test]
fn fusion_keeps_the_bits_of_an_autocast_block() -> Result<()> {
    let names = ["the loss", "x's gradient", "gamma's", "beta's"];
    for (name, make) in devices() {
        let fused = block_gradients(make())?;
        let unfused = block_gradients(make().with_passes("-fusion"))?;
        for (k, what) in names.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&fused[k]), bits(&unfused[k]), "{name}: {what} differs with fusion");
        }
    }
    Ok(())
}
