//! Scopes and workspaces: reuse across iterations, explicit bindings only,
//! regions in the IR and in stats, LIFO gradient workspaces, inspection.

use crate::snapshots;
use kiln::prelude::*;

#[test]
fn a_scope_is_reused_across_iterations() -> Result<()> {
    let ctx = Context::cpu().with_seed(1);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let w =
            ctx.scope("encoder", |ctx| ctx.scope("layer1", |ctx| ctx.variable("w", ctx.randn([3, 2]))))?;
        assert_eq!(w.name(), "encoder/layer1/w");
        seen.push(w);
    }
    assert!(seen.iter().all(|w| w.same(&seen[0])));
    assert_eq!(ctx.workspace().names(), ["encoder/layer1/w"]);
    assert_eq!(ctx.current_scope(), "");
    Ok(())
}

#[test]
fn names_resolve_in_the_scope_and_its_bindings_only() -> Result<()> {
    let ctx = Context::cpu();
    let lr = ctx.variable("lr", ctx.scalar(0.1f32))?;
    ctx.scope("enc", |ctx| ctx.variable("w", ctx.ones([2])).map(|_| ()))?;
    // Without a binding the parent's `lr` is not visible, and a variable
    // made under that name is the scope's own.
    let own = ctx.scope("plain", |ctx| {
        assert!(ctx.get_variable("lr").is_err());
        ctx.variable("lr", ctx.scalar(5.0f32))
    })?;
    assert_eq!(own.name(), "plain/lr");
    assert!(!own.same(&lr));
    // With bindings: the parent's variable, and one of a sibling scope by path.
    let (bound, shared) = ctx.scope_with("dec", &[("rate", "lr"), ("w_enc", "enc/w")], |ctx| {
        assert_eq!(ctx.current_scope(), "dec");
        Ok((ctx.variable("rate", ctx.scalar(9.0f32))?, ctx.get_variable("w_enc")?))
    })?;
    assert!(bound.same(&lr), "the binding wins over making a new variable");
    assert_eq!(bound.item::<f32>()?, 0.1);
    assert_eq!(shared.name(), "enc/w");
    // Re-entering with the same bindings is fine.
    ctx.scope_with("dec", &[("w_enc", "enc/w"), ("rate", "lr")], |_| Ok(()))?;
    // From the root, paths reach into child scopes.
    assert_eq!(ctx.get_variable("plain/lr")?.item::<f32>()?, 5.0);
    Ok(())
}

#[test]
fn push_and_pop_nest_like_the_closures() -> Result<()> {
    let ctx = Context::cpu();
    ctx.push_scope("a")?;
    ctx.push_scope("b")?;
    assert_eq!(ctx.current_scope(), "a/b");
    let v = ctx.variable("v", ctx.zeros([1]))?;
    ctx.pop_scope("b")?;
    ctx.pop_scope("a")?;
    assert_eq!(v.name(), "a/b/v");
    assert_eq!(ctx.current_scope(), "");
    // An error inside a closure still leaves the scope.
    let r: Result<()> = ctx.scope("c", |ctx| ctx.pop_scope("nope"));
    assert!(matches!(r, Err(Error::Workspace { .. })));
    assert_eq!(ctx.current_scope(), "");
    Ok(())
}

#[test]
fn scopes_are_regions_in_the_ir_and_in_stats() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let y = ctx.scope("encoder", |ctx| {
        let w = ctx.variable("w", ctx.ones([2, 2]))?;
        ctx.scope("act", |_| Ok(x.matmul(&w).relu()))
    })?;
    let loss = y.sum_all();
    loss.backward()?;
    let text = ctx.explain(&[&loss])?;
    assert!(text.contains("@encoder/act"), "{text}");
    assert!(text.contains("@grad"), "{text}");
    let stats = ctx.stats();
    let paths: Vec<&str> = stats.regions.iter().map(|r| r.path.as_str()).collect();
    for want in ["encoder", "encoder/act", "grad/encoder/act"] {
        assert!(paths.contains(&want), "{paths:?}");
    }
    let enc = stats.regions.iter().find(|r| r.path == "encoder").unwrap();
    assert_eq!((enc.variables, enc.variable_bytes), (1, 16));
    let dot = kiln::ir::dot::to_dot(&ctx.optimized_graph(&[&loss])?);
    assert!(dot.contains("encoder"), "{dot}");
    Ok(())
}

#[test]
fn gradient_workspaces_are_made_in_backward_order_and_released_lifo() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.tensor(&[0.5f32, -1.0], [1, 2]);
    let (w1, w2) = (
        ctx.scope("layer1", |ctx| ctx.variable("w", ctx.ones([2, 3])))?,
        ctx.scope("layer2", |ctx| ctx.variable("w", ctx.ones([3, 1])))?,
    );
    let bias = ctx.variable("bias", ctx.zeros([1, 1]))?;
    let loss = (x.matmul(&w1).tanh().matmul(&w2) + &bias).sum_all();
    loss.backward()?;
    // The backward pass meets the root's bias and layer2 before layer1.
    assert_eq!(ctx.grad_workspaces(), ["grad", "grad/layer2", "grad/layer1"]);
    let err = ctx.pop_grad_workspace("layer2").unwrap_err();
    snapshots().bind(|| insta::assert_snapshot!("workspace__grad_workspace_not_newest", err.to_string()));
    let g1 = ctx.pop_grad_workspace("layer1")?;
    assert_eq!(g1.names(), ["layer1/w"]);
    assert!(g1.get(&w1).is_some() && g1.get(&w2).is_none());
    let g2 = ctx.pop_grad_workspace("layer2")?;
    assert_eq!(g2.names(), ["layer2/w"]);
    let g0 = ctx.pop_grad_workspace("")?;
    assert_eq!(g0.by_name("bias").unwrap().to_vec::<f32>()?, vec![1.0]);
    let err = ctx.pop_grad_workspace("").unwrap_err();
    snapshots().bind(|| insta::assert_snapshot!("workspace__grad_workspace_none_held", err.to_string()));
    // Released gradients start again from zero.
    let once = loss.backward()?;
    assert_eq!(once.get(&bias).unwrap().to_vec::<f32>()?, vec![1.0]);
    Ok(())
}

#[test]
fn the_workspace_table() -> Result<()> {
    let ctx = Context::cpu();
    ctx.scope("encoder", |ctx| {
        ctx.variable("w", ctx.zeros([4, 3]))?;
        ctx.variable("b", ctx.zeros_dtype([3], DType::F64))
    })?;
    let step = ctx.variable("step", ctx.zeros_dtype([], DType::I64))?;
    ctx.sync()?;
    step.assign(&step + 1)?;
    let w = ctx.get_variable("encoder/w")?;
    w.sum_all().backward()?;
    let ws = ctx.workspace();
    assert_eq!(ws.bytes(), 48 + 24 + 8);
    assert!(ws.get("step").unwrap().pending && ws.get("encoder/w").unwrap().has_grad);
    snapshots().bind(|| insta::assert_snapshot!("workspace__table", ws.to_string()));
    let inner = ctx.scope_with("encoder", &[], |ctx| Ok(ctx.workspace()))?;
    assert_eq!(inner.names(), ["encoder/b", "encoder/w"]);
    Ok(())
}
