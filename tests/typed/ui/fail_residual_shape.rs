use kiln::typed::*;

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let block = Residual::<Linear<10, 5>>::build(&ctx, "block")?;
    let _ = block.forward(ctx.randn_typed((8usize, Const::<10>)))?;
    Ok(())
}
