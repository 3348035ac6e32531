//! The first program in the README: a small MLP layer and softmax, recorded
//! lazily, run when a value is read, and the optimized graph printed.
use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    let ctx = Context::cpu().with_seed(7);
    let x = ctx.randn([64, 784]); // f32 by default
    let w = ctx.randn([784, 128]) * 0.05;
    let b = ctx.zeros([128]);
    let h = (x.matmul(&w) + &b).relu(); // nothing runs yet
    let p = h.softmax(1);
    let rows: Vec<f32> = p.sum(&[1], false).to_vec()?; // runs here
    assert!(rows.iter().all(|s| (s - 1.0).abs() < 1e-5));
    println!("{}", ctx.explain(&[&p])?); // optimized IR as text
    Ok(())
}
