use kiln::typed::*;

fn main() {
    let ctx = Context::cpu();
    let a: Tensor<(usize, Const<10>)> = ctx.zeros_typed((4, Const));
    let _ = a.sum::<Axis<2>>();
}
