use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let a: Tensor<Rank1<4>> = ctx.zeros_typed(Default::default());
    let b: Tensor<Rank1<4>, f64> = a.cast();
    let _ = a + b;
}
