use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let batch: Tensor<(usize, Const<5>)> = ctx.zeros_typed((3, Const));
    let fixed: Tensor<Rank2<3, 5>> = ctx.zeros_typed(Default::default());
    let _ = batch + fixed;
}
