use kiln::typed::*;

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let fc = Linear::<5, 10>::build(&ctx, "fc")?;
    let x: Tensor<(usize, Const<7>)> = ctx.zeros_typed((4, Const));
    let _ = fc.forward(x)?;
    Ok(())
}
