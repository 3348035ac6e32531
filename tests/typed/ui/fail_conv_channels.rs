use kiln::typed::*;

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let conv = Conv2d::<3, 8, 3, 1, 1>::build(&ctx, "conv")?;
    let gray: Tensor<(usize, Const<1>, Const<28>, Const<28>)> = ctx.zeros_typed((4, Const, Const, Const));
    let _ = conv.forward(gray)?;
    Ok(())
}
