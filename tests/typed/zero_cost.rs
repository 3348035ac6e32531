//! The typed layer only wraps: a typed model and its untyped twin record
//! the same graph. A whole training step (forward, loss, backward, AdamW,
//! EMA) is compared as text, both as recorded (every pass off) and as
//! optimized, so plans, caching and speed are the untyped model's.

use kiln::nn::{self, Conv2d as UConv2d, Conv2dOptions, Ema, Flatten as UFlatten, Module as _, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::typed::*;

type Seed = ((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>);

type Cnn = (
    Conv2d<1, 16, 3, 1, 1>,
    ReLU,
    MaxPool2d<2>,
    Conv2d<16, 32, 3, 1, 1>,
    ReLU,
    MaxPool2d<2>,
    Flatten<128>,
    DropoutOneIn<5>,
    Linear<128, 10>,
);

fn untyped_seed(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "net", |ctx| {
        let first = Sequential::new(ctx, "0", |ctx| {
            Ok(vec![nn::Linear::new(ctx, "0", 5, 10)?.boxed(), nn::ReLU.boxed()])
        })?;
        let inner = Sequential::new(ctx, "1", |ctx| {
            Ok(vec![nn::Linear::new(ctx, "0", 10, 10)?.boxed(), nn::Tanh.boxed()])
        })?;
        Ok(vec![first.boxed(), nn::Residual::new(inner).boxed(), nn::Linear::new(ctx, "2", 10, 2)?.boxed()])
    })
}

fn untyped_cnn(ctx: &Context) -> Result<Sequential> {
    let same = Conv2dOptions { padding: 1, ..Default::default() };
    Sequential::new(ctx, "cnn", |ctx| {
        Ok(vec![
            UConv2d::with_options(ctx, "0", 1, 16, 3, same)?.boxed(),
            nn::ReLU.boxed(),
            nn::MaxPool2d::new(2).boxed(),
            UConv2d::with_options(ctx, "3", 16, 32, 3, same)?.boxed(),
            nn::ReLU.boxed(),
            nn::MaxPool2d::new(2).boxed(),
            UFlatten.boxed(),
            nn::Dropout::new(0.2)?.boxed(),
            nn::Linear::new(ctx, "8", 128, 10)?.boxed(),
        ])
    })
}

/// Every pass switched off: what `explain` prints is the recorded graph.
fn recorded(seed: u64) -> Context {
    let off: Vec<String> = kiln::passes::pass_names().iter().map(|p| format!("-{p}")).collect();
    Context::cpu().with_seed(seed).with_passes(&off.join(","))
}

/// One training step on `ctx`, returning the loss (not yet read).
fn step(
    ctx: &Context,
    forward: &dyn Fn(&kiln::Tensor) -> Result<kiln::Tensor>,
    params: &dyn kiln::nn::Params,
    shape: &[usize],
) -> Result<kiln::Tensor> {
    let mut opt = AdamW::new(&params.parameters(), AdamConfig::adamw())?;
    let ema = Ema::new(&params.parameters())?;
    let x = ctx.randn(shape.to_vec());
    let targets: Vec<i64> = (0..shape[0] as i64).map(|i| i % 2).collect();
    let y = ctx.tensor(&targets, [shape[0]]);
    let loss = nn::cross_entropy_smoothed(&forward(&x)?, &y, 0.1)?;
    loss.backward()?;
    opt.step()?;
    opt.zero_grad()?;
    ema.update(&params.parameters(), 0.99)?;
    Ok(loss)
}

#[test]
fn a_typed_training_step_records_the_untyped_graph() -> Result<()> {
    for (name, ctx_of) in
        [("recorded", recorded as fn(u64) -> Context), ("optimized", |s| Context::cpu().with_seed(s))]
    {
        let (a, b) = (ctx_of(7), ctx_of(7));
        let typed = Seed::build(&a, "net")?;
        let typed_forward = |x: &kiln::Tensor| -> Result<kiln::Tensor> {
            Ok(typed.forward(Tensor::<(usize, Const<5>)>::from_untyped(x.clone())?)?.into_untyped())
        };
        let typed_loss = step(&a, &typed_forward, &typed, &[16, 5])?;
        let untyped = untyped_seed(&b)?;
        let untyped_loss = step(&b, &|x| untyped.forward(x), &untyped, &[16, 5])?;
        let (ta, tb) = (a.explain(&[&typed_loss])?, b.explain(&[&untyped_loss])?);
        assert!(ta.contains("@net/1/0"), "{ta}");
        assert_eq!(ta, tb, "{name} graphs differ");
        assert_eq!(typed_loss.item::<f32>()?, untyped_loss.item::<f32>()?);
    }
    Ok(())
}

#[test]
fn a_typed_cnn_records_the_untyped_graph() -> Result<()> {
    for (name, ctx_of) in
        [("recorded", recorded as fn(u64) -> Context), ("optimized", |s| Context::cpu().with_seed(s))]
    {
        let (a, b) = (ctx_of(8), ctx_of(8));
        let typed = Cnn::build(&a, "cnn")?;
        let typed_forward = |x: &kiln::Tensor| -> Result<kiln::Tensor> {
            let x = Tensor::<(usize, Const<1>, Const<8>, Const<8>)>::from_untyped(x.clone())?;
            Ok(typed.forward(x)?.into_untyped())
        };
        let typed_loss = step(&a, &typed_forward, &typed, &[4, 1, 8, 8])?;
        let untyped = untyped_cnn(&b)?;
        let untyped_loss = step(&b, &|x| untyped.forward(x), &untyped, &[4, 1, 8, 8])?;
        assert_eq!(a.explain(&[&typed_loss])?, b.explain(&[&untyped_loss])?, "{name} graphs differ");
    }
    Ok(())
}
