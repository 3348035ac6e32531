use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let x: Tensor<Rank4<1, 3, 1000, 1000>> = ctx.zeros_typed(Default::default());
    let _ = x.max_pool2d::<2>();
}
