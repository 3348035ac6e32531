use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let x: Tensor<Rank3<2, 3, 4>> = ctx.zeros_typed(Default::default());
    let _ = x.permute::<Axes3<0, 1, 1>>();
}
