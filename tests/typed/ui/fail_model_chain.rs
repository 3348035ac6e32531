use kiln::typed::*;

type Model = (Linear<5, 10>, ReLU, Linear<20, 2>);

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let model = Model::build(&ctx, "net")?;
    let _ = model.forward(ctx.randn_typed((8usize, Const::<5>)))?;
    Ok(())
}
