//! Every misuse of scopes, variables, gradients and checkpoints is a
//! `kiln::Error` (never a panic) whose whole message, location included,
//! is a golden snapshot in `snapshots/workspace__*.snap`.

use crate::snapshots;
use kiln::prelude::*;

fn snap(name: &str, err: &Error) {
    let msg = stable(err.to_string());
    snapshots().bind(|| insta::assert_snapshot!(format!("workspace__{name}"), msg));
}

#[track_caller]
fn workspace_err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    match r {
        Err(e @ Error::Workspace { .. }) => e,
        other => panic!("expected a workspace error, got {other:?}"),
    }
}

#[test]
fn leaving_a_scope_that_is_not_open() {
    let ctx = Context::cpu();
    snap("pop_with_no_scope_open", &workspace_err(ctx.pop_scope("encoder")));
    ctx.push_scope("encoder").unwrap();
    ctx.push_scope("layer1").unwrap();
    snap("pop_not_the_innermost", &workspace_err(ctx.pop_scope("encoder")));
    assert_eq!(ctx.current_scope(), "encoder/layer1", "a refused pop changes nothing");
}

#[test]
fn bindings_that_do_not_fit() {
    let ctx = Context::cpu();
    ctx.variable("lr", ctx.scalar(0.1f32)).unwrap();
    snap(
        "binding_source_missing",
        &workspace_err(ctx.scope_with("dec", &[("lr", "learning_rate")], |_| Ok(()))),
    );
    snap(
        "binding_name_twice",
        &workspace_err(ctx.scope_with("dec", &[("a", "lr"), ("a", "lr")], |_| Ok(()))),
    );
    ctx.scope("enc", |ctx| ctx.variable("lr", ctx.scalar(1.0f32)).map(|_| ())).unwrap();
    snap("binding_name_taken", &workspace_err(ctx.scope_with("enc", &[("lr", "lr")], |_| Ok(()))));
    ctx.variable("other", ctx.scalar(0.2f32)).unwrap();
    ctx.scope_with("dec", &[("rate", "lr")], |_| Ok(())).unwrap();
    snap("bindings_differ", &workspace_err(ctx.scope_with("dec", &[("rate", "other")], |_| Ok(()))));
    snap("bindings_differ_none_now", &workspace_err(ctx.scope("dec", |_| Ok(()))));
    assert_eq!(ctx.current_scope(), "", "a refused scope is not entered");
}

#[test]
fn a_variable_made_again_with_another_type() {
    let ctx = Context::cpu();
    ctx.variable("w", ctx.zeros([2, 3])).unwrap();
    snap("variable_other_shape", &workspace_err(ctx.variable("w", ctx.zeros([3, 2]))));
    snap("variable_other_dtype", &workspace_err(ctx.variable("w", ctx.zeros_dtype([2, 3], DType::F64))));
}

#[test]
fn a_name_used_twice_or_badly() {
    let ctx = Context::cpu();
    ctx.variable("enc", ctx.zeros([1])).unwrap();
    snap("scope_named_like_a_variable", &workspace_err(ctx.scope("enc", |_| Ok(()))));
    ctx.scope("dec", |_| Ok(())).unwrap();
    snap("variable_named_like_a_scope", &workspace_err(ctx.variable("dec", ctx.zeros([1]))));
    snap("invalid_variable_name", &workspace_err(ctx.variable("layer1/w", ctx.zeros([1]))));
    snap("invalid_scope_name", &workspace_err(ctx.scope("", |_| Ok(()))));
    snap("reserved_scope_name", &workspace_err(ctx.scope("grad", |_| Ok(()))));
    snap("no_such_variable", &workspace_err(ctx.scope("dec", |ctx| ctx.get_variable("enc"))));
}

#[test]
fn assignments_that_do_not_fit() {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.zeros([2, 3])).unwrap();
    let e = w.assign(ctx.zeros([3])).unwrap_err();
    assert!(matches!(e, Error::Shape { op: "assign", .. }), "{e:?}");
    snap("assign_other_shape", &e);
    let e = w.assign(ctx.zeros_dtype([2, 3], DType::I32)).unwrap_err();
    assert!(matches!(e, Error::DType { op: "assign", .. }), "{e:?}");
    snap("assign_other_dtype", &e);
    let other = Context::cpu();
    let e = w.assign(other.zeros([2, 3])).unwrap_err();
    assert!(matches!(e, Error::Device { .. }), "{e:?}");
    snap("assign_from_another_context", &e);
    // A failed value passes its own error on, and the variable keeps its value.
    let bad = ctx.zeros([2, 3]) + ctx.zeros([4]);
    assert_eq!(w.assign(&bad).unwrap_err(), bad.error().unwrap().clone());
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

#[test]
fn backward_of_what_has_no_gradient() {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.ones([2, 3])).unwrap();
    let e = (&w * 2.0).backward().unwrap_err();
    assert!(matches!(e, Error::Shape { op: "backward", .. }), "{e:?}");
    snap("backward_non_scalar_without_seed", &e);
    let e = (&w * 2.0).backward_with(&ctx.ones([3, 2])).unwrap_err();
    snap("backward_seed_other_shape", &e);
    let e = w.argmax(1, false).sum_all().backward().unwrap_err();
    assert!(matches!(e, Error::DType { op: "backward", .. }), "{e:?}");
    snap("backward_of_integers", &e);
    // With a seed a non-scalar is fine: the vector-Jacobian product.
    let g = (&w * 2.0).backward_with(&ctx.full([2, 3], 3.0)).unwrap();
    assert_eq!(g.get(&w).unwrap().to_vec::<f32>().unwrap(), vec![6.0; 6]);
}

#[test]
fn checkpoints_that_do_not_fit() {
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let ctx = Context::cpu();
    ctx.scope("enc", |ctx| ctx.variable("w", ctx.ones([2, 2])).map(|_| ())).unwrap();
    ctx.save(&path).unwrap();
    let other = Context::cpu();
    let w = other.scope("enc", |ctx| ctx.variable("w", ctx.zeros([3]))).unwrap();
    snap("load_other_shape", &workspace_err(other.load(&path)));
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.0; 3], "a refused load changes nothing");
    let clash = Context::cpu();
    clash.variable("enc", clash.zeros([1])).unwrap();
    snap("load_scope_is_a_variable", &workspace_err(clash.load(&path)));
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"not a checkpoint").unwrap();
    let e = workspace_err(other.load(&garbage)).to_string().replace(&*dir.to_string_lossy(), "<dir>");
    snapshots().bind(|| insta::assert_snapshot!("workspace__load_not_safetensors", e));
    let missing = other.load(dir.join("missing.safetensors")).unwrap_err();
    assert!(matches!(missing, Error::Io(_)), "{missing:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `msg` with contexts (`cpu (context 12)`) written as `DEVICE (context
/// N)`: the number counts the contexts the test process made before, and
/// the device is each backend's (the same snapshot serves all).
fn stable(msg: String) -> String {
    let mut out = String::new();
    let mut rest = msg.as_str();
    while let Some(i) = rest.find(" (context ") {
        let word = rest[..i].rfind(' ').map_or(0, |s| s + 1);
        out.push_str(&rest[..word]);
        out.push_str("DEVICE (context N");
        rest = rest[i + 10..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out + rest
}
