//! Variables: creation, program-order reads, assignments that run with
//! the next read, runtime scalars, and what the context keeps.

use kiln::prelude::*;

#[test]
fn reads_see_assignments_in_program_order() -> Result<()> {
    let ctx = Context::cpu();
    let v = ctx.variable("v", ctx.tensor(&[1.0f32, 2.0], [2]))?;
    let before = &v * 10.0;
    v.assign(&v + 1.0)?;
    let middle = &v * 10.0;
    v.assign(&v * 3.0)?;
    let after = v.tensor();
    // Read out of program order: each sees the value it was recorded with.
    assert_eq!(after.to_vec::<f32>()?, vec![6.0, 9.0]);
    assert_eq!(middle.to_vec::<f32>()?, vec![20.0, 30.0]);
    assert_eq!(before.to_vec::<f32>()?, vec![10.0, 20.0]);
    Ok(())
}

#[test]
fn an_assignment_runs_with_the_next_read_of_anything() -> Result<()> {
    let ctx = Context::cpu();
    let v = ctx.variable("v", ctx.zeros([3]))?;
    v.assign(ctx.ones([3]))?;
    assert!(ctx.workspace().get("v").unwrap().pending);
    // Reading an unrelated value runs the pending assignment in its plan.
    let x = ctx.tensor(&[5i64], [1]);
    assert_eq!((&x + 1).to_vec::<i64>()?, vec![6]);
    assert!(!ctx.workspace().get("v").unwrap().pending);
    assert_eq!(ctx.stats().compiles, 1, "one plan computed the read and the assignment");
    assert_eq!(v.to_vec::<f32>()?, vec![1.0; 3]);
    // sync runs pending work without a read.
    v.assign(&v * 4.0)?;
    ctx.sync()?;
    assert!(!ctx.workspace().get("v").unwrap().pending);
    assert_eq!(v.to_vec::<f32>()?, vec![4.0; 3]);
    Ok(())
}

#[test]
fn a_variable_is_made_once_and_found_after() -> Result<()> {
    let ctx = Context::cpu().with_seed(3);
    let a = ctx.variable("w", ctx.randn([2, 2]))?;
    let first = a.to_vec::<f32>()?;
    // The second init is recorded but never computed, and does not replace the value.
    let b = ctx.variable("w", ctx.randn([2, 2]))?;
    assert!(a.same(&b));
    assert_eq!(b.to_vec::<f32>()?, first);
    assert_eq!(ctx.variables().len(), 1);
    assert!(ctx.get_variable("w")?.same(&a));
    Ok(())
}

#[test]
fn assigning_a_value_the_user_also_reads_keeps_both_right() -> Result<()> {
    let ctx = Context::cpu();
    let v = ctx.variable("v", ctx.zeros([2]))?;
    let h = ctx.tensor(&[1.0f32, 2.0], [2]).exp();
    v.assign(&h)?;
    // Reading h and the pending v in one plan: both outputs are h's value.
    assert_eq!(h.to_vec::<f32>()?, vec![1f32.exp(), 2f32.exp()]);
    assert_eq!(v.to_vec::<f32>()?, vec![1f32.exp(), 2f32.exp()]);
    // Two variables given one value.
    let w = ctx.variable("w", ctx.zeros([2]))?;
    let z = ctx.tensor(&[3.0f32, 4.0], [2]) * 2.0;
    v.assign(&z)?;
    w.assign(&z)?;
    assert_eq!(v.to_vec::<f32>()?, vec![6.0, 8.0]);
    assert_eq!(w.to_vec::<f32>()?, vec![6.0, 8.0]);
    Ok(())
}

#[test]
fn runtime_scalars_never_recompile_but_rust_numbers_do() -> Result<()> {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.ones([8]))?;
    for step in 0..20 {
        let lr = ctx.scalar(0.5f32 / (1.0 + step as f32));
        w.assign(&w - &(ctx.ones([8]) * &lr))?;
        w.to_vec::<f32>()?;
    }
    let with_scalars = ctx.stats().compiles;
    assert!(with_scalars <= 3, "{with_scalars} compiles");
    let expected: f32 = 1.0 - (0..20).map(|s| 0.5f32 / (1.0 + s as f32)).sum::<f32>();
    assert!((w.to_vec::<f32>()?[0] - expected).abs() < 1e-5);
    let baked = Context::cpu();
    let w = baked.variable("w", baked.ones([8]))?;
    for step in 0..5 {
        w.assign(&w - &(baked.ones([8]) * (0.5f32 / (1.0 + step as f32))))?;
        w.to_vec::<f32>()?;
    }
    assert!(baked.stats().compiles >= 5, "each baked constant is a new graph");
    Ok(())
}

#[test]
fn an_integer_step_counter_and_a_variable_learning_rate() -> Result<()> {
    let ctx = Context::cpu();
    let step = ctx.variable("step", ctx.zeros_dtype([], DType::I64))?;
    let lr = ctx.variable("lr", ctx.scalar(1.0f64))?;
    for _ in 0..10 {
        step.assign(&step + 1)?;
        lr.assign(&lr * 0.5)?;
        ctx.sync()?;
    }
    assert_eq!(step.item::<i64>()?, 10);
    assert_eq!(lr.item::<f64>()?, 0.5f64.powi(10));
    assert!(ctx.stats().compiles <= 3);
    Ok(())
}

#[test]
fn the_graph_stays_flat_when_a_loop_assigns_every_step() -> Result<()> {
    let ctx = Context::cpu();
    let v = ctx.variable("v", ctx.zeros([4]))?;
    let mut sizes = Vec::new();
    for _ in 0..30 {
        v.assign(&v + 1.0)?;
        ctx.sync()?;
        sizes.push(ctx.stats().graph_nodes);
    }
    assert_eq!(sizes[5], sizes[29], "graph sizes {sizes:?}");
    assert_eq!(v.to_vec::<f32>()?, vec![30.0; 4]);
    Ok(())
}

#[test]
fn variables_of_every_dtype() -> Result<()> {
    let ctx = Context::cpu();
    let b = ctx.variable("b", ctx.tensor(&[true, false], [2]))?;
    b.assign(b.eq(false))?;
    assert_eq!(b.to_vec::<bool>()?, vec![false, true]);
    let h = ctx.variable("h", ctx.ones_dtype([2], DType::F16))?;
    h.assign(&h * 3.0)?;
    assert_eq!(h.to_vec::<half::f16>()?, vec![half::f16::from_f32(3.0); 2]);
    Ok(())
}
