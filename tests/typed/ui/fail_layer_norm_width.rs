use kiln::typed::*;

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let model = <(Linear<4, 10>, LayerNorm<8>)>::build(&ctx, "net")?;
    let _ = model.forward(ctx.randn_typed((2usize, Const::<4>)))?;
    Ok(())
}
