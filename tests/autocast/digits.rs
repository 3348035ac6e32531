//! digits' MLP (examples/digits.rs: 64-256-10, dropout 0.2, AdamW 2e-3,
//! label smoothing 0.1, weight average 0.99) trained under bf16 autocast
//! reaches the accuracy of the f32 run on the same seed, within half a
//! point; so does its CNN. Short runs (CI has 2 cores): 8 and 5 epochs
//! of the 30 that `cargo run --release --example digits -- --autocast
//! bf16` trains.

use kiln::data::{Dataset, IteratorExt, Rng};
use kiln::nn::{
    self, Conv2d, Conv2dOptions, Dropout, Ema, Flatten, Linear, MaxPool2d, Module, ReLU, Sequential,
};
use kiln::optim::{AdamConfig, AdamW, TrainStep};
use kiln::prelude::*;

fn mlp(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 64, 256)?.boxed(),
            ReLU.boxed(),
            Dropout::new(0.2)?.boxed(),
            Linear::new(ctx, "3", 256, 10)?.boxed(),
        ])
    })
}

fn cnn(ctx: &Context) -> Result<Sequential> {
    let same = Conv2dOptions { padding: 1, ..Default::default() };
    Sequential::new(ctx, "cnn", |ctx| {
        Ok(vec![
            Conv2d::with_options(ctx, "0", 1, 16, 3, same)?.boxed(),
            ReLU.boxed(),
            MaxPool2d::new(2).boxed(),
            Conv2d::with_options(ctx, "3", 16, 32, 3, same)?.boxed(),
            ReLU.boxed(),
            MaxPool2d::new(2).boxed(),
            Flatten.boxed(),
            Dropout::new(0.2)?.boxed(),
            Linear::new(ctx, "8", 128, 10)?.boxed(),
        ])
    })
}

/// Test accuracy after `epochs` of digits' loop (captured steps), and the
/// last step's loss.
fn train(
    ctx: &Context,
    make: fn(&Context) -> Result<Sequential>,
    sample: &[usize],
    epochs: usize,
) -> Result<(f64, f32)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/digits.csv.gz");
    let all = Dataset::from_csv(path, &[64])?.map_features(|v| v / 16.0);
    let (train, test) = all.split(0.8, &mut Rng::new(2024))?;
    let mut model = make(ctx)?;
    let ema = Ema::new(&model)?;
    let opt = AdamW::new(&model, AdamConfig { lr: 2e-3, ..AdamConfig::adamw() })?;
    let shape = |n: usize| [&[n][..], sample].concat();
    let mut step = TrainStep::new(ctx, opt, |b: &[Tensor]| {
        ema.update(&model, 0.99)?;
        nn::cross_entropy_smoothed(&model.forward(&b[0])?, &b[1], 0.1)
    });
    let mut rng = Rng::new(1);
    let mut last = None;
    for _ in 0..epochs {
        for batch in train.iter().shuffled(&mut rng).batch_exact(32).collate().stack(ctx) {
            let (x, y) = batch?;
            last = Some(step.call(&[&x.reshape(shape(32)), &y])?);
        }
    }
    let last = last.expect("at least one step").item::<f32>()?;
    drop(step);
    ema.update(&model, 0.99)?;
    model.set_training(false);
    ema.copy_to(&model)?;
    let (x, y) = test.iter().batch(test.len()).collate().stack(ctx).next().expect("a test set")?;
    let predicted = model.forward(&x.reshape(shape(test.len())))?.argmax(1, false);
    let right = predicted.eq(&y).cast(DType::F32).sum_all().item::<f32>()?;
    Ok((right as f64 / test.len() as f64, last))
}

fn compare(make: fn(&Context) -> Result<Sequential>, sample: &[usize], epochs: usize) -> Result<()> {
    let (f32_acc, f32_loss) = train(&Context::cpu().with_seed(0), make, sample, epochs)?;
    let ctx = Context::cpu().with_seed(0).with_autocast(DType::BF16);
    let (bf16_acc, bf16_loss) = train(&ctx, make, sample, epochs)?;
    eprintln!(
        "digits after {epochs} epochs: f32 {:.2}% (last loss {f32_loss}), bf16 autocast {:.2}% (last loss {bf16_loss})",
        100.0 * f32_acc,
        100.0 * bf16_acc
    );
    assert_ne!(f32_loss, bf16_loss, "the bf16 run computed the f32 run's losses: autocast did not run");
    assert!(f32_acc > 0.9, "the f32 run itself did not learn: {f32_acc}");
    assert!(
        bf16_acc >= f32_acc - 0.005,
        "bf16 autocast reached {:.2}%, f32 {:.2}%: more than half a point below",
        100.0 * bf16_acc,
        100.0 * f32_acc
    );
    Ok(())
}

#[test]
fn digits_mlp_in_bf16_reaches_the_f32_accuracy() -> Result<()> {
    compare(mlp, &[64], 8)
}

#[test]
fn digits_cnn_in_bf16_reaches_the_f32_accuracy() -> Result<()> {
    compare(cnn, &[1, 8, 8], 5)
}
