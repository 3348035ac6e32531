//! Safetensors checkpoints: a workspace saved and loaded with its scoped
//! names and every dtype, values bit for bit.

use kiln::prelude::*;

#[test]
fn a_checkpoint_round_trips_a_workspace() -> Result<()> {
    let path = std::env::temp_dir().join(format!("kiln-ckpt-{}.safetensors", std::process::id()));
    let ctx = Context::cpu().with_seed(5);
    ctx.scope("encoder", |ctx| {
        ctx.scope("layer1", |ctx| {
            ctx.variable("w", ctx.randn([3, 4]))?;
            ctx.variable("b", ctx.randn_dtype([4], DType::F64))
        })?;
        ctx.variable("mask", ctx.tensor(&[true, false, true], [3]))
    })?;
    let step = ctx.variable("step", ctx.tensor(&[41i64], []))?;
    ctx.variable("h", ctx.randn_dtype([2], DType::BF16))?;
    ctx.variable("f", ctx.randn_dtype([2], DType::F16))?;
    ctx.variable("i", ctx.tensor(&[-3i32, 7], [2]))?;
    ctx.variable("u", ctx.tensor(&[200u8], [1]))?;
    step.assign(&step + 1)?; // pending: saving runs it first
    ctx.save(&path)?;

    // The file is plain safetensors, named by scoped names.
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort();
    assert_eq!(names, ["encoder/layer1/b", "encoder/layer1/w", "encoder/mask", "f", "h", "i", "step", "u"]);

    // Loading into a fresh context makes the scopes and variables; a model
    // built afterwards finds them (its inits are not used).
    let fresh = Context::cpu();
    fresh.load(&path)?;
    assert_eq!(fresh.get_variable("step")?.item::<i64>()?, 42);
    let w = fresh.scope("encoder", |ctx| ctx.scope("layer1", |ctx| ctx.variable("w", ctx.zeros([3, 4]))))?;
    let original = ctx.get_variable("encoder/layer1/w")?;
    assert_eq!(w.to_vec::<f32>()?, original.to_vec::<f32>()?);
    for name in ["encoder/layer1/b", "encoder/mask", "f", "h", "i", "u"] {
        let (a, b) = (ctx.get_variable(name)?, fresh.get_variable(name)?);
        assert_eq!(a.dtype(), b.dtype());
        assert_eq!(a.shape(), b.shape());
        let same = a.cast(DType::F64).to_vec::<f64>()? == b.cast(DType::F64).to_vec::<f64>()?;
        assert!(same, "{name}");
    }
    // Loading over existing variables sets them; later assignments build on it.
    let w = ctx.get_variable("encoder/layer1/w")?;
    w.assign(&w * 0.0)?;
    ctx.load(&path)?;
    assert_eq!(w.to_vec::<f32>()?, original.to_vec::<f32>()?);
    std::fs::remove_file(&path).ok();
    Ok(())
}

#[test]
fn saving_inside_a_scope_saves_its_subtree() -> Result<()> {
    let path = std::env::temp_dir().join(format!("kiln-ckpt-sub-{}.safetensors", std::process::id()));
    let ctx = Context::cpu();
    ctx.variable("outside", ctx.zeros([1]))?;
    ctx.scope("enc", |ctx| {
        ctx.variable("w", ctx.ones([2]))?;
        ctx.save(&path)
    })?;
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.names(), ["enc/w"]);
    std::fs::remove_file(&path).ok();
    Ok(())
}
