//! digits' MLP and CNN (examples/digits.rs) in typed form train to the
//! accuracy of the untyped models on the same seed: the same graphs from
//! the same random numbers, so the same losses step for step. Short runs
//! (CI has 2 cores); `cargo run --release --example typed -- --digits`
//! trains the full 30 epochs.

use kiln::data::{Dataset, IteratorExt, Rng};
use kiln::nn::{self, Conv2dOptions, Ema, Module as _, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::typed::*;

type Mlp = (Linear<64, 256>, ReLU, DropoutOneIn<5>, Linear<256, 10>);

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

fn untyped_mlp(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![
            nn::Linear::new(ctx, "0", 64, 256)?.boxed(),
            nn::ReLU.boxed(),
            nn::Dropout::new(0.2)?.boxed(),
            nn::Linear::new(ctx, "3", 256, 10)?.boxed(),
        ])
    })
}

fn untyped_cnn(ctx: &Context) -> Result<Sequential> {
    let same = Conv2dOptions { padding: 1, ..Default::default() };
    Sequential::new(ctx, "cnn", |ctx| {
        Ok(vec![
            nn::Conv2d::with_options(ctx, "0", 1, 16, 3, same)?.boxed(),
            nn::ReLU.boxed(),
            nn::MaxPool2d::new(2).boxed(),
            nn::Conv2d::with_options(ctx, "3", 16, 32, 3, same)?.boxed(),
            nn::ReLU.boxed(),
            nn::MaxPool2d::new(2).boxed(),
            nn::Flatten.boxed(),
            nn::Dropout::new(0.2)?.boxed(),
            nn::Linear::new(ctx, "8", 128, 10)?.boxed(),
        ])
    })
}

fn data() -> Result<(Dataset, Dataset)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/digits.csv.gz");
    let all = Dataset::from_csv(path, &[64])?.map_features(|v| v / 16.0);
    all.split(0.8, &mut Rng::new(2024))
}

/// What a training run gives: every step's loss and the test accuracy.
struct Run {
    losses: Vec<f32>,
    accuracy: f64,
}

/// A model as the training loop sees it: untyped in, untyped out.
trait Net {
    fn forward(&self, x: &kiln::Tensor) -> Result<kiln::Tensor>;
    fn params(&self) -> Vec<Variable>;
    fn set_training(&mut self, training: bool);
}

impl Net for Sequential {
    fn forward(&self, x: &kiln::Tensor) -> Result<kiln::Tensor> {
        nn::Module::forward(self, x)
    }
    fn params(&self) -> Vec<Variable> {
        self.parameters()
    }
    fn set_training(&mut self, training: bool) {
        nn::Module::set_training(self, training)
    }
}

/// A typed model taking inputs of shape `S`; the loop's untyped batches
/// are checked into `S` once per step.
struct Typed<M, S>(M, std::marker::PhantomData<S>);

impl<M, S: Shape> Net for Typed<M, S>
where
    M: BuildModule + Module<Tensor<S>, Output = Tensor<(usize, Const<10>)>>,
{
    fn forward(&self, x: &kiln::Tensor) -> Result<kiln::Tensor> {
        Ok(self.0.forward(Tensor::<S>::from_untyped(x.clone())?)?.into_untyped())
    }
    fn params(&self) -> Vec<Variable> {
        self.0.parameters()
    }
    fn set_training(&mut self, training: bool) {
        self.0.set_training(training)
    }
}

/// digits' loop (AdamW 2e-3, smoothing 0.1, EMA 0.99) for `epochs`.
fn train(ctx: &Context, model: &mut dyn Net, sample: &[usize], epochs: usize) -> Result<Run> {
    let (train, test) = data()?;
    let params = model.params();
    let ema = Ema::new(&params)?;
    let mut opt = AdamW::new(&params, AdamConfig { lr: 2e-3, ..AdamConfig::adamw() })?;
    let mut rng = Rng::new(1);
    let mut losses = Vec::new();
    let shape = |n: usize| [&[n][..], sample].concat();
    for _ in 0..epochs {
        for batch in train.iter().shuffled(&mut rng).batch_exact(32).collate().stack(ctx) {
            let (x, y) = batch?;
            let loss = nn::cross_entropy_smoothed(&model.forward(&x.reshape(shape(32)))?, &y, 0.1)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            ema.update(&params, 0.99)?;
            losses.push(loss.item::<f32>()?);
        }
    }
    model.set_training(false);
    ema.copy_to(&params)?;
    let (x, y) = test.iter().batch(test.len()).collate().stack(ctx).next().expect("a test set")?;
    let predicted = model.forward(&x.reshape(shape(test.len())))?.argmax(1, false);
    let right = predicted.eq(&y).cast(DType::F32).sum_all().item::<f32>()?;
    Ok(Run { losses, accuracy: right as f64 / test.len() as f64 })
}

#[test]
fn typed_mlp_matches_the_untyped_mlp() -> Result<()> {
    let ctx = Context::cpu().with_seed(0);
    let mut typed = Typed::<_, (usize, Const<64>)>(Mlp::build(&ctx, "mlp")?, Default::default());
    let a = train(&ctx, &mut typed, &[64], 5)?;
    let ctx = Context::cpu().with_seed(0);
    let b = train(&ctx, &mut untyped_mlp(&ctx)?, &[64], 5)?;
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.accuracy, b.accuracy);
    assert!(a.accuracy > 0.93, "typed MLP accuracy {}", a.accuracy);
    Ok(())
}

#[test]
fn typed_cnn_matches_the_untyped_cnn() -> Result<()> {
    let ctx = Context::cpu().with_seed(0);
    let model = Cnn::build(&ctx, "cnn")?;
    let mut typed = Typed::<_, (usize, Const<1>, Const<8>, Const<8>)>(model, Default::default());
    let a = train(&ctx, &mut typed, &[1, 8, 8], 5)?;
    let ctx = Context::cpu().with_seed(0);
    let b = train(&ctx, &mut untyped_cnn(&ctx)?, &[1, 8, 8], 5)?;
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.accuracy, b.accuracy);
    assert!(a.accuracy > 0.9, "typed CNN accuracy {}", a.accuracy);
    Ok(())
}
