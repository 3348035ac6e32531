use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let a: Tensor<Rank2<2, 3>> = ctx.zeros_typed(Default::default());
    let b: Tensor<Rank2<2, 4>> = ctx.zeros_typed(Default::default());
    let _ = a.concat::<Axis<0>, _>(&b);
}
