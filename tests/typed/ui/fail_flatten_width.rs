use kiln::typed::*;

type Cnn = (Conv2d<1, 32, 3, 1, 1>, MaxPool2d<4>, Flatten<100>, Linear<100, 10>);

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let cnn = Cnn::build(&ctx, "cnn")?;
    let _ = cnn.forward(ctx.randn_typed((2usize, Const::<1>, Const::<8>, Const::<8>)))?;
    Ok(())
}
