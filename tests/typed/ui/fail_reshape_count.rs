use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let a: Tensor<Rank2<3, 5>> = ctx.zeros_typed(Default::default());
    let _ = a.reshape::<Rank2<4, 4>>();
}
