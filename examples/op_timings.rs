//! Times single elementwise ops and the benches' 8-op chain on 2^24 f32
//! (median of 7 runs after one warm-up), to see where a chain's time goes.
//! Compare with numpy on the same machine. Run:
//! `cargo run --release --example op_timings`
use kiln::prelude::*;
use std::time::Instant;

fn time(name: &str, f: impl Fn() -> Tensor) -> kiln::Result<()> {
    f().realize()?;
    let mut ms = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        f().realize()?;
        ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    println!("{name:12} {:.1} ms", ms[3]);
    Ok(())
}

fn main() -> kiln::Result<()> {
    let ctx = Context::cpu();
    let x = ctx.randn([1 << 24]);
    let y = ctx.randn([1 << 24]);
    ctx.realize(&[&x, &y])?;
    time("mul scalar", || &x * 2.0)?;
    time("add tensor", || &x + &y)?;
    time("abs", || x.abs())?;
    time("exp", || x.exp())?;
    time("tanh", || x.tanh())?;
    time("gelu", || x.gelu())?;
    time("chain", || ((&x * 2.0 + 1.0).abs().neg().exp() * &x - 0.5).tanh())?;
    Ok(())
}
