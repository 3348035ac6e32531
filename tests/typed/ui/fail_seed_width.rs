use kiln::typed::*;

type Model = ((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>);

fn main() -> Result<()> {
    let ctx = Context::cpu().with_seed(0);
    let model = Model::build(&ctx, "net")?;
    let _ = model.forward(ctx.randn_typed((32usize, Const::<7>)))?;
    Ok(())
}
