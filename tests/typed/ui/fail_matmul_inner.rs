use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let a: Tensor<Rank2<3, 4>> = ctx.zeros_typed(Default::default());
    let b: Tensor<Rank2<5, 2>> = ctx.zeros_typed(Default::default());
    let _ = a.matmul(&b);
}
