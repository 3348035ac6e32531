// Typed code that must compile (and run): the seed model, a CNN, and the
// ops whose shapes the types compute.
use kiln::typed::*;

type Model = ((Linear<5, 10>, ReLU), Residual<(Linear<10, 10>, Tanh)>, Linear<10, 2>);

fn main() -> Result<()> {
    let ctx = Context::cpu();
    let model = Model::build(&ctx, "net")?;
    let y: Tensor<(usize, Const<2>)> = model.forward(ctx.randn_typed((3, Const)))?;
    let cnn = <(Conv2d<1, 4, 3, 1, 1>, MaxPool2d<2>, Flatten<64>, Linear<64, 2>)>::build(&ctx, "cnn")?;
    let z = cnn.forward(ctx.randn_typed((2usize, Const::<1>, Const::<8>, Const::<8>)))?;
    let x: Tensor<Rank3<2, 3, 4>> = ctx.zeros_typed(Default::default());
    let _: Tensor<Rank2<6, 4>> = x.reshape();
    let _: Tensor<Rank2<2, 4>> = x.sum::<Axis<1>>();
    assert_eq!((y.dims(), z.dims()), (vec![3, 2], vec![2, 2]));
    Ok(())
}
