//! Deep graphs: every walk (recording, extraction, collection, verify, the
//! passes, the printer and parser, the executor, autodiff, dropping
//! tensors) is iterative, so a graph as deep as a long unrolled loop runs
//! on the default test-thread stack (2 MiB; nothing here raises it).

use kiln::ir::text::{parse, print};
use kiln::ir::verify;
use kiln::passes::{optimize, PipelineConfig};
use kiln::prelude::*;

const DEPTH: usize = 200_000;

/// The same recurrence in plain f32, one rounding per op as kiln does it.
fn recurrence_in_f32(x: &[f32], steps: usize) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let mut y = v;
            for _ in 0..steps {
                y = y * 1.0001 + 0.0;
            }
            y
        })
        .collect()
}

#[test]
fn a_chain_of_200k_ops_is_recorded_and_read() -> Result<()> {
    let ctx = Context::cpu();
    let x = ctx.randn([4]);
    let x0 = x.to_vec::<f32>()?;
    let mut y = x;
    for _ in 0..DEPTH {
        y = y * 1.0001 + 0.0;
    }
    // Per step: a scalar constant, its broadcast and the op, twice.
    assert_eq!(ctx.stats().graph_nodes, 6 * DEPTH + 1);
    let got = y.to_vec::<f32>()?;
    let want = recurrence_in_f32(&x0, DEPTH);
    for (g, w) in got.iter().zip(&want) {
        // Fusion keeps every product in f32 in order; allow a few ulps for
        // `+ 0.0` folding and the like.
        assert!((g - w).abs() <= 4.0 * f32::EPSILON * w.abs(), "got {got:?}, want {want:?}");
    }
    let stats = ctx.stats();
    assert_eq!((stats.graph_nodes, stats.buffers), (1, 1), "the read collected the chain to its result");
    Ok(())
}

#[test]
fn the_gradient_of_a_deep_chain() -> Result<()> {
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.tensor(&[0.5f32, -2.0], [2]))?;
    let depth = DEPTH / 4;
    let mut y = w.tensor();
    for _ in 0..depth {
        y = y * 1.00001;
    }
    let g = y.sum_all().backward()?;
    let got = g.get(&w).expect("w has a gradient").to_vec::<f32>()?;
    let want = 1.00001f64.powi(depth as i32) as f32;
    for v in got {
        assert!((v - want).abs() <= 1e-3 * want, "d/dw = {v}, want {want}");
    }
    Ok(())
}

/// A `.kir` chain: `%0` an input, then `mul` and `add` by broadcast
/// constants, alternating, `DEPTH` nodes in all.
fn chain_kir(depth: usize) -> String {
    let mut s = String::with_capacity(depth * 40);
    s.push_str("%0: f32[8] = input 0\n%1: f32[] = full 1.5\n%2: f32[8] = expand %1\n");
    for i in 3..depth {
        let op = if i % 2 == 0 { "mul" } else { "add" };
        let prev = if i == 3 { 0 } else { i - 1 };
        s.push_str(&format!("%{i}: f32[8] = {op} %{prev}, %2\n"));
    }
    s.push_str(&format!("return %{}\n", depth - 1));
    s
}

#[test]
fn a_200k_node_kir_graph_is_parsed_optimized_and_printed() -> Result<()> {
    let graph = parse(&chain_kir(DEPTH))?;
    assert_eq!(graph.len(), DEPTH);
    verify(&graph)?;
    let text = print(&graph);
    assert_eq!(print(&parse(&text)?), text, "print → parse → print is stable");
    let optimized = optimize(graph, &PipelineConfig::default())?;
    verify(&optimized)?;
    let planned = print(&optimized);
    assert_eq!(print(&parse(&planned)?), planned, "the optimized graph round-trips too");
    Ok(())
}

#[test]
fn a_deep_chain_sharing_one_operand() -> Result<()> {
    // Every step uses the same `w`: one node with 200,000 users, which the
    // passes and collection must edit without walking its edge list per user.
    let ctx = Context::cpu();
    let w = ctx.tensor(&[1.0001f32, 0.9999], [2]);
    let mut y = ctx.tensor(&[1.0f32, 1.0], [2]);
    for _ in 0..DEPTH {
        y = &y * &w;
    }
    let got = y.to_vec::<f32>()?;
    let mut want = [1.0f32, 1.0];
    for _ in 0..DEPTH {
        want[0] *= 1.0001;
        want[1] *= 0.9999;
    }
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 4.0 * f32::EPSILON * w.abs(), "got {got:?}, want {want:?}");
    }
    Ok(())
}
