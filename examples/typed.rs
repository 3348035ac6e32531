//! The typed layer (`kiln::typed`): a model whose shapes rustc checks.
//!
//!     cargo run --release --example typed                  # the seed model, trained on a toy task
//!     cargo run --release --example typed -- --digits      # digits' MLP, typed
//!     cargo run --release --example typed -- --digits --conv   # digits' CNN, typed
//!
//! The digits runs are `examples/digits.rs`'s defaults (30 epochs, batch
//! 32, AdamW 2e-3, dropout 0.2, label smoothing 0.1, EMA 0.99, seed 0):
//! the typed models record the untyped models' graphs from the same
//! random numbers, so they print the same accuracy as `--example digits`.
use kiln::data::{Dataset, IteratorExt, Rng};
use kiln::nn::Ema;
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::typed::*;
use std::time::Instant;

/// The seed's model: `x -> relu(W1 x) -> + tanh(W2 ·) -> W3 ·`.
type Seed = ((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>);

/// digits' MLP, 64 -> 256 -> 10 (the layer names match `Sequential`'s).
type Mlp = (Linear<64, 256>, ReLU, DropoutOneIn<5>, Linear<256, 10>);

/// digits' CNN: [n,1,8,8] -> conv 3x3 (16) -> pool -> conv 3x3 (32) ->
/// pool -> [n, 128] -> 10. Every size is in the type.
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

/// Fits the seed model to a random teacher, `y = tanh(x · w)`.
fn seed() -> Result<()> {
    let ctx = Context::best().with_seed(0);
    let model = Seed::build(&ctx, "net")?;
    let mut opt = AdamW::new(&model, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() })?;
    let teacher: Tensor<Rank2<5, 2>> = ctx.randn_typed(Default::default());
    teacher.realize()?; // drawn once, then a stored value
    for step in 0..300 {
        let x: Tensor<(usize, Const<5>)> = ctx.randn_typed((64, Const));
        let y = x.matmul(&teacher).tanh(); // (usize, Const<2>), like the model's output
        let loss = mse(&model.forward(x)?, &y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        let l = loss.item()?;
        if step % 50 == 0 || step == 299 {
            println!("step {step:3}  loss {l:.4}");
        }
    }
    println!("{} compiles for 300 steps on {}", ctx.stats().compiles, ctx.device_description());
    Ok(())
}

/// Trains a typed digits model with `examples/digits.rs`'s recipe and
/// prints its test accuracy.
fn digits<M, S>(name: &str, sample: S) -> Result<()>
where
    M: BuildModule + Module<Tensor<S>, Output = Tensor<(usize, Const<10>)>>,
    S: Shape,
{
    let started = Instant::now();
    let ctx = Context::best().with_seed(0);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/digits.csv.gz");
    let all = Dataset::from_csv(path, &[64])?.map_features(|v| v / 16.0);
    let (train, test) = all.split(0.8, &mut Rng::new(2024))?;
    let mut model = M::build(&ctx, name)?;
    let ema = Ema::new(&model)?;
    let mut opt = AdamW::new(&model, AdamConfig { lr: 2e-3, ..AdamConfig::adamw() })?;
    // The loader stacks [n, 64]; each batch is checked into (n, ...) once.
    let batch_of = |x: kiln::Tensor, n: usize| {
        let mut dims = sample.dims();
        dims[0] = n;
        Tensor::<S>::from_untyped(x.reshape(dims))
    };
    let mut rng = Rng::new(1);
    for _epoch in 0..30 {
        for batch in train.iter().shuffled(&mut rng).batch_exact(32).collate().stack(&ctx) {
            let (x, y) = batch?;
            let y = Tensor::<(usize,), i64>::from_untyped(y)?;
            let loss = cross_entropy(&model.forward(batch_of(x, 32)?)?, &y, 0.1)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            ema.update(&model, 0.99)?;
            loss.item()?;
        }
    }
    model.set_training(false);
    ema.copy_to(&model)?;
    let (x, y) = test.iter().batch(test.len()).collate().stack(&ctx).next().expect("a test set")?;
    let predicted = model.forward(batch_of(x, test.len())?)?.argmax::<Axis<1>>();
    let y = Tensor::<(usize,), i64>::from_untyped(y)?;
    let right = predicted.eq(&y).cast::<f32>().sum_all().item()?;
    println!(
        "{name} (typed): test accuracy {:.2}% ({} images); {:.1} s, {} compiles",
        100.0 * right as f64 / test.len() as f64,
        test.len(),
        started.elapsed().as_secs_f64(),
        ctx.stats().compiles
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    match (has("--digits"), has("--conv")) {
        (false, _) => seed(),
        (true, false) => digits::<Mlp, _>("mlp", (0usize, Const::<64>)),
        (true, true) => digits::<Cnn, _>("cnn", (0usize, Const::<1>, Const::<8>, Const::<8>)),
    }
}
