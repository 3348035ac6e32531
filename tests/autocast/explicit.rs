//! The autocast pass against the same training step written by hand with
//! explicit casts where the policy puts them: a bias-free MLP (784-style
//! but small), cross-entropy, SGD. The explicit step casts the input and
//! each weight to bf16, runs the products and relu in bf16 and casts the
//! logits back to f32 before the loss; autodiff then records the
//! gradients of those casts. The autocast step records plain f32 and the
//! pass rewrites it. Both must give the same bits: the loss of every step
//! and the weights after it.
//!
//! (Biases are left out on purpose: with an explicit `b.cast(bf16)`,
//! autodiff sums the bias gradient over the batch in bf16, where the
//! policy sums it in f32, so the two steps differ by design there.)

use kiln::nn;
use kiln::prelude::*;

/// Weights and data drawn in one order on either context.
fn setup(ctx: &Context) -> Result<(Vec<Variable>, Tensor, Tensor)> {
    let w1 = ctx.variable("w1", ctx.randn([12, 32]) * 0.3)?;
    let w2 = ctx.variable("w2", ctx.randn([32, 32]) * 0.2)?;
    let w3 = ctx.variable("w3", ctx.randn([32, 5]) * 0.2)?;
    let x = ctx.randn([16, 12]);
    let labels: Vec<i64> = (0..16).map(|i| (i * 3 % 5) as i64).collect();
    let y = ctx.tensor(&labels, [16]);
    Ok((vec![w1, w2, w3], x, y))
}

/// One SGD step (lr 0.1) on the loss `loss`; returns the loss read after
/// the step's plan ran.
fn step(ws: &[Variable], loss: Tensor) -> Result<f32> {
    let grads = loss.backward()?;
    for w in ws {
        let g = grads.get(w).expect("every weight has a gradient");
        w.assign(&**w - &(g * 0.1))?;
    }
    loss.context().expect("a live loss").zero_grad();
    loss.item::<f32>()
}

fn autocast_loss(ws: &[Variable], x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let h1 = x.matmul(&ws[0]).relu();
    let h2 = h1.matmul(&ws[1]).relu();
    nn::cross_entropy(&h2.matmul(&ws[2]), y)
}

fn explicit_loss(ws: &[Variable], x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let low: Vec<Tensor> = ws.iter().map(|w| w.cast(DType::BF16)).collect();
    let h1 = x.cast(DType::BF16).matmul(&low[0]).relu();
    let h2 = h1.matmul(&low[1]).relu();
    nn::cross_entropy(&h2.matmul(&low[2]).cast(DType::F32), y)
}

#[test]
fn autocast_gives_the_bits_of_explicit_casts() -> Result<()> {
    let auto = Context::cpu().with_seed(11).with_autocast(DType::BF16);
    let hand = Context::cpu().with_seed(11);
    let (wa, xa, ya) = setup(&auto)?;
    let (wh, xh, yh) = setup(&hand)?;
    for k in 0..4 {
        let la = step(&wa, autocast_loss(&wa, &xa, &ya)?)?;
        let lh = step(&wh, explicit_loss(&wh, &xh, &yh)?)?;
        assert_eq!(
            la.to_bits(),
            lh.to_bits(),
            "step {k}: loss {la} under autocast, {lh} with explicit casts"
        );
        for (a, h) in wa.iter().zip(&wh) {
            let (va, vh) = (a.to_vec::<f32>()?, h.to_vec::<f32>()?);
            assert!(
                va.iter().zip(&vh).all(|(p, q)| p.to_bits() == q.to_bits()),
                "step {k}: {} differs",
                a.name()
            );
        }
    }
    // And autocast did change the arithmetic: the f32 step gives other bits.
    let plain = Context::cpu().with_seed(11);
    let (wp, xp, yp) = setup(&plain)?;
    let lp = step(&wp, autocast_loss(&wp, &xp, &yp)?)?;
    let auto2 = Context::cpu().with_seed(11).with_autocast(DType::BF16);
    let (w2, x2, y2) = setup(&auto2)?;
    let l2 = step(&w2, autocast_loss(&w2, &x2, &y2)?)?;
    assert_ne!(lp.to_bits(), l2.to_bits(), "bf16 and f32 steps gave the same loss: autocast did nothing");
    assert!((lp - l2).abs() < 0.02 * lp.abs(), "bf16 loss {l2} is far from f32's {lp}");
    Ok(())
}

/// The two steps compile to the same optimized graph (regions aside: the
/// pass puts a cast in the region of the value it converts, the hand
/// written step where it was called).
#[test]
fn both_steps_compile_to_the_same_graph() -> Result<()> {
    let optimized = |ctx: &Context, explicit: bool| -> Result<String> {
        let (ws, x, y) = setup(ctx)?;
        let loss = if explicit { explicit_loss(&ws, &x, &y)? } else { autocast_loss(&ws, &x, &y)? };
        let grads = loss.backward()?;
        for w in &ws {
            w.assign(&**w - &(grads.get(w).expect("a gradient") * 0.1))?;
        }
        ctx.zero_grad();
        let text = kiln::ir::text::print(&ctx.optimized_graph(&[&loss])?);
        Ok(text.lines().map(|l| l.split(" @").next().unwrap_or(l)).collect::<Vec<_>>().join("\n"))
    };
    let a = optimized(&Context::cpu().with_seed(11).with_autocast(DType::BF16), false)?;
    let h = optimized(&Context::cpu().with_seed(11), true)?;
    assert_eq!(a, h);
    assert!(a.contains("bf16[16,32] = matmul") || a.contains("bf16[16,32] = fused"), "{a}");
    Ok(())
}
