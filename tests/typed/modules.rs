//! Typed modules: the seed model builds with `nn::Sequential`'s names,
//! trains with kiln's optimizers (AdamW, gradient accumulation, EMA), and
//! shares checkpoints with the untyped model of the same layout.

use kiln::nn::{self, Ema, Linear as UntypedLinear, Module as _, Residual as UntypedResidual, Sequential};
use kiln::optim::{Accumulate, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::typed::*;

type Seed = ((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>);

/// The seed model written with untyped modules.
fn untyped_seed(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "net", |ctx| {
        let first = Sequential::new(ctx, "0", |ctx| {
            Ok(vec![UntypedLinear::new(ctx, "0", 5, 10)?.boxed(), nn::ReLU.boxed()])
        })?;
        let inner = Sequential::new(ctx, "1", |ctx| {
            Ok(vec![UntypedLinear::new(ctx, "0", 10, 10)?.boxed(), nn::Tanh.boxed()])
        })?;
        Ok(vec![
            first.boxed(),
            UntypedResidual::new(inner).boxed(),
            UntypedLinear::new(ctx, "2", 10, 2)?.boxed(),
        ])
    })
}

#[test]
fn seed_model_has_sequential_names_and_shapes() -> Result<()> {
    let ctx = Context::cpu().with_seed(0);
    let model = Seed::build(&ctx, "net")?;
    let names: Vec<String> = model.parameters().iter().map(|v| v.name()).collect();
    assert_eq!(
        names,
        ["net/0/0/weight", "net/0/0/bias", "net/1/0/weight", "net/1/0/bias", "net/2/weight", "net/2/bias"]
    );
    assert_eq!(model.num_parameters(), 5 * 10 + 10 + 10 * 10 + 10 + 10 * 2 + 2);
    let y = model.forward(ctx.randn_typed((7usize, Const::<5>)))?;
    assert_eq!(y.dims(), vec![7, 2]);
    // One sample without a batch dim, and a sequence (B, T, 5).
    let one: Tensor<Rank1<2>> = model.forward(ctx.randn_typed((Const::<5>,)))?;
    assert_eq!(one.dims(), vec![2]);
    let seq: Tensor<(usize, Const<3>, Const<2>)> = model.forward(ctx.randn_typed((4usize, Const, Const)))?;
    assert_eq!(seq.dims(), vec![4, 3, 2]);
    Ok(())
}

#[test]
fn trains_with_adamw_accumulation_and_ema() -> Result<()> {
    let ctx = Context::cpu().with_seed(3);
    let model = Seed::build(&ctx, "net")?;
    let mut opt = AdamW::new(&model, AdamConfig { lr: 0.02, ..AdamConfig::adamw() })?;
    let ema = Ema::new(&model)?;
    let mut acc = Accumulate::new(2)?;
    let x: Tensor<(usize, Const<5>)> = ctx.randn_typed((32, Const));
    let y: Tensor<(usize, Const<2>)> = ctx.randn_typed((32, Const));
    let (x, y) = (x.detach().realize()?.clone(), y.detach().realize()?.clone());
    let mut losses = Vec::new();
    for _ in 0..40 {
        let loss = mse(&model.forward(x.clone())?, &y)?;
        if acc.backward(loss.untyped())? {
            opt.step()?;
            opt.zero_grad()?;
            ema.update(&model, 0.9)?;
        }
        losses.push(loss.item()?);
    }
    assert!(losses[39] < 0.7 * losses[0], "{losses:?}");
    assert!(ctx.stats().compiles <= 6, "{} compiles", ctx.stats().compiles);
    let names: Vec<String> = ema.parameters().iter().map(|v| v.name()).collect();
    assert_eq!(names[0], "ema/net/0/0/weight");
    // The average lags the model but follows it.
    ema.copy_to(&model)?;
    let averaged = mse(&model.forward(x.clone())?, &y)?.item()?;
    assert!(averaged < losses[0], "{averaged} vs {}", losses[0]);
    Ok(())
}

#[test]
fn checkpoints_interchange_with_untyped_models() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("kiln-typed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("seed.safetensors");
    let typed_ctx = Context::cpu().with_seed(10);
    let typed = Seed::build(&typed_ctx, "net")?;
    nn::save(&typed, &path)?;
    let untyped_ctx = Context::cpu().with_seed(99);
    let untyped = untyped_seed(&untyped_ctx)?;
    nn::load(&untyped, &path)?;
    let data: Vec<f32> = (0..15).map(|i| i as f32 / 7.0 - 1.0).collect();
    let a = typed.forward(typed_ctx.tensor_typed(&data, (3usize, Const::<5>)))?.to_vec()?;
    let b = untyped.forward(&untyped_ctx.tensor(&data, [3, 5]))?.to_vec::<f32>()?;
    assert_eq!(a, b);
    // And back: an untyped step, saved, loaded into the typed model.
    let mut sgd = Sgd::new(&untyped, SgdConfig { lr: 0.1, ..Default::default() })?;
    untyped.forward(&untyped_ctx.tensor(&data, [3, 5]))?.sum_all().backward()?;
    sgd.step()?;
    untyped_ctx.sync()?;
    nn::save(&untyped, &path)?;
    nn::load(&typed, &path)?;
    let a = typed.forward(typed_ctx.tensor_typed(&data, (3usize, Const::<5>)))?.to_vec()?;
    let b = untyped.forward(&untyped_ctx.tensor(&data, [3, 5]))?.to_vec::<f32>()?;
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn dropout_and_training_mode() -> Result<()> {
    let ctx = Context::cpu().with_seed(5);
    let mut model =
        <(Linear<4, 64>, DropoutOneIn<2>, LayerNorm<64>, GELU, Dropout, Sigmoid)>::build(&ctx, "m")?;
    assert_eq!(model.1.inner.p, 0.5);
    model.4.inner.p = 0.25;
    let x: Tensor<(usize, Const<4>)> = ctx.randn_typed((8, Const));
    let x = x.detach().realize()?.clone();
    let train_a = model.forward(x.clone())?.to_vec()?;
    let train_b = model.forward(x.clone())?.to_vec()?;
    assert_ne!(train_a, train_b, "dropout draws a new mask every step");
    model.set_training(false);
    let eval_a = model.forward(x.clone())?.to_vec()?;
    let eval_b = model.forward(x)?.to_vec()?;
    assert_eq!(eval_a, eval_b);
    Ok(())
}
