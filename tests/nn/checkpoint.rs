//! The exponential moving average against its formula in f64, and a
//! model's parameters through a safetensors file: save, load into a model
//! built from other random numbers, identical predictions.

use crate::{close, host};
use kiln::nn::{self, Ema, LayerNorm, Linear, Module, Params, Sequential, Tanh, GELU};
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::prelude::*;

#[test]
fn ema_follows_its_formula_with_a_decay_that_changes_without_recompiling() -> Result<()> {
    let ctx = Context::cpu().with_seed(41);
    let a = ctx.variable("a", ctx.randn([2, 3]))?;
    let b = ctx.variable("b", ctx.randn([4]))?;
    let params = vec![a.clone(), b.clone()];
    let ema = Ema::new(&params)?;
    let names: Vec<String> = ema.parameters().iter().map(|v| v.name()).collect();
    assert_eq!(names, ["ema/a", "ema/b"]);
    let mut want: Vec<Vec<f64>> = params.iter().map(|p| host(p)).collect();
    let mut compiles = Vec::new();
    for decay in [0.9, 0.5, 0.99, 0.0, 1.0] {
        // The model moves (as an optimizer step would), then the average.
        for p in &params {
            p.assign(&**p * 1.5 - 0.25)?;
        }
        ema.update(&params, decay)?;
        let shadows = ema.parameters();
        let all: Vec<&Tensor> = shadows.iter().map(|v| &**v).chain(params.iter().map(|v| &**v)).collect();
        ctx.realize(&all)?;
        for ((w, p), s) in want.iter_mut().zip(&params).zip(&shadows) {
            let now = host(p);
            w.iter_mut().zip(&now).for_each(|(e, p)| *e = *e * decay + p * (1.0 - decay));
            close(&host(s), w, 1e-5, 1e-5);
        }
        compiles.push(ctx.stats().compiles);
    }
    assert_eq!(compiles[1], compiles[4], "a new decay recompiled: {compiles:?}");
    // copy_to puts the averages into the model.
    ema.copy_to(&params)?;
    for (p, w) in params.iter().zip(&want) {
        close(&host(p), w, 1e-5, 1e-5);
    }
    Ok(())
}

#[test]
fn ema_made_again_keeps_loaded_averages() -> Result<()> {
    let ctx = Context::cpu().with_seed(42);
    let w = ctx.variable("w", ctx.ones([3]))?;
    let ema = Ema::new(&w)?;
    w.assign(ctx.zeros([3]))?;
    ema.update(&w, 0.75)?;
    let again = Ema::new(&w)?;
    assert_eq!(host(&again.parameters()[0]), [0.75; 3]);
    Ok(())
}

fn model(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "net", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 6, 8)?.boxed(),
            GELU.boxed(),
            LayerNorm::new(ctx, "2", 8)?.boxed(),
            Linear::new(ctx, "3", 8, 8)?.boxed(),
            Tanh.boxed(),
            Linear::new(ctx, "5", 8, 3)?.boxed(),
        ])
    })
}

fn path(name: &str) -> std::path::PathBuf {
    crate::scratch_dir().join(format!("nn-{name}-{}.safetensors", std::process::id()))
}

#[test]
fn save_load_round_trip_gives_identical_predictions() -> Result<()> {
    let x: Vec<f32> = (0..5 * 6).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
    // Train a few steps, so every parameter (LayerNorm's too) is off its init.
    let ctx = Context::cpu().with_seed(43);
    let mut net = model(&ctx)?;
    let mut opt = AdamW::new(&net, AdamConfig { lr: 0.05, ..AdamConfig::adamw() })?;
    let input = ctx.tensor(&x, [5, 6]);
    for _ in 0..3 {
        let loss = nn::cross_entropy(&net.forward(&input)?, &ctx.tensor(&[0i64, 1, 2, 1, 0], [5]))?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        loss.item::<f32>()?;
    }
    net.set_training(false);
    let before = net.forward(&input)?.to_vec::<f32>()?;
    let file = path("round-trip");
    nn::save(&net, &file)?;

    let other = Context::cpu().with_seed(44);
    let fresh = model(&other)?;
    let input2 = other.tensor(&x, [5, 6]);
    assert_ne!(fresh.forward(&input2)?.to_vec::<f32>()?, before, "another seed, other weights");
    nn::load(&fresh, &file)?;
    assert_eq!(fresh.forward(&input2)?.to_vec::<f32>()?, before, "bit for bit");
    for (a, b) in net.parameters().iter().zip(fresh.parameters()) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?, "{}", a.name());
    }
    // The file holds the parameters only, under their names: no optimizer state.
    let bytes = std::fs::read(&file).map_err(|e| Error::Io(e.to_string()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::Io(e.to_string()))?;
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut want: Vec<String> = net.parameters().iter().map(|v| v.name()).collect();
    want.sort();
    assert_eq!(names, want);
    let _ = std::fs::remove_file(&file);
    Ok(())
}

/// A file whose tensor has another shape: an error, and nothing assigned.
#[test]
fn a_mismatched_file_loads_nothing() -> Result<()> {
    let ctx = Context::cpu().with_seed(45);
    let small = Linear::new(&ctx, "fc", 4, 2)?;
    let file = path("mismatch");
    nn::save(&small, &file)?;
    let other = Context::cpu().with_seed(46);
    let big = Linear::new(&other, "fc", 5, 2)?;
    let before: Vec<Vec<f64>> = big.parameters().iter().map(|p| host(p)).collect();
    let err = nn::load(&big, &file).unwrap_err();
    let msg = err.to_string().replace(&file.display().to_string(), "[file]");
    crate::snapshots().bind(|| insta::assert_snapshot!("nn__load_shape_mismatch", msg));
    let after: Vec<Vec<f64>> = big.parameters().iter().map(|p| host(p)).collect();
    assert_eq!(before, after);
    let renamed = Linear::new(&other, "head", 4, 2)?;
    let msg =
        nn::load(&renamed, &file).unwrap_err().to_string().replace(&file.display().to_string(), "[file]");
    crate::snapshots().bind(|| insta::assert_snapshot!("nn__load_missing_tensor", msg));
    std::fs::write(&file, b"not a checkpoint").map_err(|e| Error::Io(e.to_string()))?;
    let msg =
        nn::load(&renamed, &file).unwrap_err().to_string().replace(&file.display().to_string(), "[file]");
    crate::snapshots().bind(|| insta::assert_snapshot!("nn__load_not_safetensors", msg));
    let _ = std::fs::remove_file(&file);
    Ok(())
}
