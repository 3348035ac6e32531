//! Column reductions as one launch group (`passes/horizontal.rs`,
//! `ir::GroupKind::Columns`): sums, means and maxima over leading dims,
//! as a layer norm's parameter gradients and the bias gradient before it
//! are in GPT-2's backward. On the GPU the float sums and means run as
//! one kernel (`codegen/columns.rs`, `generate_group`), the others as
//! kernels of their own.
//!
//! Checked on every backend against f64, with a NaN, an inf and an
//! `inf - inf` in columns of their own, and bit for bit against the same
//! graph planned without the pass (`-horizontal`: a kernel each). The
//! group kernel's workspaces and arrival counters are reused by every
//! run, so two plans run interleaved, each eight times with fresh inputs,
//! and every run is checked.

use crate::nonfinite::{backends, expect, read, report, tensor, tol};
use crate::reference::{round, Rng};
use kiln::prelude::*;

/// One column reduction: its input's shape and dtype, the leading dims
/// it reduces, and which reduction.
#[derive(Clone, Copy)]
struct Member {
    shape: [usize; 3],
    lead: usize,
    dtype: DType,
    op: &'static str,
}

/// A layer norm's `dγ`, `dβ` and a bias gradient (f32 and bf16 read into
/// f32, rows split over blocks), a mean, a max (its own kernel on the
/// GPU) and a sum of too few rows to split (likewise).
const PLAN_A: [Member; 5] = [
    Member { shape: [4, 48, 96], lead: 2, dtype: DType::F32, op: "sum" },
    Member { shape: [1, 256, 64], lead: 2, dtype: DType::BF16, op: "sum" },
    Member { shape: [1, 320, 40], lead: 2, dtype: DType::F32, op: "mean" },
    Member { shape: [1, 200, 36], lead: 2, dtype: DType::F32, op: "max" },
    Member { shape: [1, 6, 40], lead: 2, dtype: DType::F32, op: "sum" },
];

/// Another group over other shapes: the kernel of the other plan must
/// not share its state.
const PLAN_B: [Member; 3] = [
    Member { shape: [2, 128, 33], lead: 2, dtype: DType::F32, op: "sum" },
    Member { shape: [3, 100, 64], lead: 2, dtype: DType::BF16, op: "mean" },
    Member { shape: [8, 16, 40], lead: 1, dtype: DType::F32, op: "sum" },
];

/// Each member's input, `rows x cols` in f64 (rounded to its dtype).
fn inputs(rng: &mut Rng, members: &[Member]) -> Vec<Vec<f64>> {
    members
        .iter()
        .map(|m| {
            let n: usize = m.shape.iter().product();
            let cols: usize = m.shape[m.lead..].iter().product();
            let mut x: Vec<f64> = (0..n).map(|_| round(m.dtype, rng.normal())).collect();
            // A NaN in column 3, an inf in column 5, inf - inf in column 7.
            x[cols + 3] = f64::NAN;
            x[2 * cols + 5] = f64::INFINITY;
            x[7] = f64::INFINITY;
            x[cols + 7] = f64::NEG_INFINITY;
            x
        })
        .collect()
}

/// The reductions, widened to f32 as autocast's gradients are (a bf16
/// sum reads bf16 and accumulates into f32 after fusion's `wide_sum`).
fn reduce(ctx: &Context, members: &[Member], xs: &[Vec<f64>]) -> Vec<Tensor> {
    members
        .iter()
        .zip(xs)
        .map(|(m, x)| {
            let t = tensor(ctx, x, &m.shape, m.dtype).cast(DType::F32);
            let dims: Vec<usize> = (0..m.lead).collect();
            match m.op {
                "sum" => t.sum(&dims, false),
                "mean" => t.mean(&dims, false),
                _ => t.max(&dims, false),
            }
        })
        .collect()
}

/// PyTorch's results in f64: IEEE sums (NaN wins, `inf - inf` is NaN),
/// a max with NaN winning.
fn reference(m: &Member, x: &[f64]) -> Vec<f64> {
    let cols: usize = m.shape[m.lead..].iter().product();
    let rows = x.len() / cols;
    (0..cols)
        .map(|c| {
            let column = (0..rows).map(|r| x[r * cols + c]);
            match m.op {
                "sum" => column.sum(),
                "mean" => column.sum::<f64>() / rows as f64,
                _ => {
                    column.fold(
                        f64::NEG_INFINITY,
                        |a, v| if a.is_nan() || v.is_nan() { f64::NAN } else { a.max(v) },
                    )
                }
            }
        })
        .collect()
}

/// The results' f32 bits, for comparing plans.
fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.to_vec::<f32>().expect("f32 results").into_iter().map(f32::to_bits).collect())
        .collect()
}

#[test]
fn grouped_column_reductions_equal_their_own_kernels_over_interleaved_runs() {
    let mut failures = Vec::new();
    let mut rng = Rng::new(0x5eed_0c01);
    for (name, make) in backends() {
        let ctx = make();
        let plain = make().with_passes("-horizontal");
        for run in 0..8 {
            for (plan, members) in [("A", &PLAN_A[..]), ("B", &PLAN_B[..])] {
                let xs = inputs(&mut rng, members);
                let got = reduce(&ctx, members, &xs);
                if run == 0 {
                    let text = ctx.explain(&got.iter().collect::<Vec<_>>()).expect("explain");
                    let grouped = text
                        .lines()
                        .filter(|l| l.contains(" = sum ") || l.contains(" = mean ") || l.contains(" = max "))
                        .filter(|l| l.contains("!group="))
                        .count();
                    if grouped != members.len() {
                        failures.push(format!(
                            "{name} plan {plan}: {grouped} of {} reductions grouped:\n{text}",
                            members.len()
                        ));
                    }
                }
                ctx.realize(&got.iter().collect::<Vec<_>>())
                    .unwrap_or_else(|e| panic!("{name} plan {plan}: {e}"));
                let alone = reduce(&plain, members, &xs);
                plain
                    .realize(&alone.iter().collect::<Vec<_>>())
                    .unwrap_or_else(|e| panic!("{name} plan {plan}: {e}"));
                for (k, (m, x)) in members.iter().zip(&xs).enumerate() {
                    let what = format!(
                        "{name} plan {plan} run {run} member {k} ({} {} of {:?})",
                        m.op, m.dtype, m.shape
                    );
                    failures.extend(expect(&what, &read(&got[k]), &reference(m, x), tol(DType::F32)));
                }
                if bits(&got) != bits(&alone) {
                    failures.push(format!(
                        "{name} plan {plan} run {run}: the group's bits differ from the kernels' alone"
                    ));
                }
            }
        }
        // Every run after the first reused the two plans.
        let compiles = ctx.stats().compiles;
        if compiles != 2 {
            failures.push(format!("{name}: {compiles} compiles for two plans run eight times each"));
        }
    }
    report(&failures);
}
