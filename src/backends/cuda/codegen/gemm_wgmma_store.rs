//! The Hopper GEMM's stores (`gemm_wgmma.rs`): each consumer stages its
//! accumulators in shared memory, then runs the matmul body's epilogue
//! over them eight columns at a time and stores whole rows.
//!
//! Staging costs a round trip through shared memory, and buys what the
//! accumulators' own layout cannot give: the epilogue is a short loop, not
//! every accumulator's code unrolled; two neighbouring elements share
//! their roundings' conversions (`paired.rs`); and a thread stores eight
//! neighbouring columns at once. On an H200 (benches/RESULTS.md, the
//! thirty-second measurement) the bias and erf GELU cost 0.26 ms over a
//! one-multiply epilogue for 8 of BERT-base's FFN up projections when
//! each accumulator ran it in registers, and 0.19 ms staged.

use super::epilogue::{self, Epilogue};
use super::gemm_wgmma::{Spec, Tile};
use super::types;
use crate::ir::{DType, NodeId};
use std::fmt::Write;

/// The stores, through shared memory so that the epilogue is a short loop
/// and the output's writes are whole rows: the consumer's accumulators
/// are rounded to the product's dtype (what the epilogue's first step
/// does) into its staging rows ([`stage`]), then read back eight
/// neighbouring columns at a time ([`drain`]). A barrier of the
/// consumer's own threads (named `1 + wg`) on each side of the staging
/// keeps the rows from being written before the last tile's epilogue has
/// read them, and read before they are whole.
pub(super) fn store(
    s: &mut String,
    spec: &Spec,
    tile: Tile,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<(), String> {
    s.push_str("  asm volatile(\"bar.sync %0, 128;\" :: \"r\"(1 + wg) : \"memory\");\n");
    stage(s, spec, tile);
    s.push_str("  asm volatile(\"bar.sync %0, 128;\" :: \"r\"(1 + wg) : \"memory\");\n");
    drain(s, spec, tile, out, epi)
}

/// The consumer's accumulators, rounded to the product's dtype, into its
/// staging rows (`mine`).
fn stage(s: &mut String, spec: &Spec, tile: Tile) {
    let stacked = tile.consumer_rows() / 64;
    let pitch = tile.staged_pitch();
    let st = types::storage(spec.dtype);
    let _ = writeln!(s, "  #pragma unroll\n  for (int r = 0; r < {stacked}; ++r)");
    let _ = writeln!(s, "    #pragma unroll\n    for (int j = 0; j < {}; ++j)", tile.cols / 8);
    s.push_str("      #pragma unroll\n      for (int h = 0; h < 2; ++h)\n");
    let _ = writeln!(
        s,
        "        *(U*)(mine + (r * 64 + (w % 4) * 16 + g + 8 * h) * {pitch} + (j * 8 + 2 * c) * 2) = kiln::pack2(acc[r][j][2 * h], acc[r][j][2 * h + 1], {st}());"
    );
}

/// The staged rows (`mine`, the tile at `m0`, `n0`, the consumer's rows
/// from `own0`) through the epilogue into `out`: each of a warpgroup's
/// threads takes eight neighbouring columns of a row at a time, stored
/// with one vector store where the output's rows allow it.
fn drain(
    s: &mut String,
    spec: &Spec,
    tile: Tile,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<(), String> {
    let Spec { dtype, m, n, .. } = *spec;
    let own = tile.consumer_rows();
    let pitch = tile.staged_pitch();
    let st = types::storage(dtype);
    let per_row = tile.cols / 8;
    let _ = writeln!(
        s,
        "  #pragma unroll {}\n  for (int x = t % 128; x < {}; x += 128) {{",
        tile.unroll,
        own * per_row
    );
    let _ = writeln!(s, "    const int rr = x / {per_row}, cc = x % {per_row} * 8;");
    let _ = writeln!(s, "    const I row = (I)m0 + own0 + rr, col = (I)n0 + cc;");
    let _ = writeln!(s, "    if (row >= {m} || col >= {n}) continue;");
    let _ = writeln!(s, "    const uint4 raw = *(const uint4*)(mine + rr * {pitch} + cc * 2);");
    let _ = writeln!(s, "    const {st}* const p = (const {st}*)&raw;");
    let _ = writeln!(s, "    const I i0 = row * {n}LL + col;");
    // The epilogue's index in 32 bits where the output allows: its
    // operands' offsets are divisions by the shape's dims.
    let ix = if m * n < i32::MAX as usize { "int" } else { "I" };
    let to = types::storage(out);
    // Eight columns inside the output: two at a time, their roundings
    // paired; one vector store where the output's rows keep it aligned.
    let _ = writeln!(s, "    if (col + 8 <= {n}) {{");
    // The eight columns' runs of the epilogue's operands, loaded ahead.
    let runs = match epi {
        Some(e) => run_loads(s, e, n, ix)?,
        None => Vec::new(),
    };
    let read = |o: NodeId, k: usize| {
        let &(_, width, dtype) = runs.iter().find(|(r, _, _)| *r == o)?;
        let at = format!("d{}[(e + {k}) / {width}].v[(e + {k}) % {width}]", o.index());
        Some(types::load(dtype, &at))
    };
    let (pair, [v0, v1]) = match epi {
        Some(e) => epilogue::values2(
            dtype,
            e,
            ["kiln::to_float(p[e])", "kiln::to_float(p[e + 1])"],
            ["i", "(i + 1)"],
            true,
            &read,
        )?,
        None => (String::new(), ["kiln::to_float(p[e])".to_string(), "kiln::to_float(p[e + 1])".to_string()]),
    };
    let vector = match out {
        DType::F16 | DType::BF16 if n % 8 == 0 => Some((
            "U r[4];",
            format!("r[e / 2] = kiln::pack2_exact({v0}, {v1}, {to}());"),
            "*(uint4*)(out + i0) = make_uint4(r[0], r[1], r[2], r[3]);",
        )),
        DType::F32 if n % 4 == 0 => Some((
            "float r[8];",
            format!("r[e] = {v0}; r[e + 1] = {v1};"),
            "*(float4*)(out + i0) = make_float4(r[0], r[1], r[2], r[3]);\n      *(float4*)(out + i0 + 4) = make_float4(r[4], r[5], r[6], r[7]);",
        )),
        _ => None,
    };
    match &vector {
        Some((decl, keep, _)) => {
            let _ = writeln!(s, "      {decl}");
            let _ = writeln!(
                s,
                "      #pragma unroll\n      for (int e = 0; e < 8; e += 2) {{\n        const {ix} i = ({ix})i0 + e; {pair}\n        {keep}\n      }}"
            );
        }
        None => {
            let _ = writeln!(
                s,
                "      #pragma unroll\n      for (int e = 0; e < 8; e += 2) {{\n        const {ix} i = ({ix})i0 + e; {pair}\n        out[i] = {};\n        out[i + 1] = {};\n      }}",
                types::store_exact(out, &v0),
                types::store_exact(out, &v1)
            );
        }
    }
    if let Some((_, _, write)) = &vector {
        let _ = writeln!(s, "      {write}");
    }
    s.push_str("      continue;\n    }\n");
    // The row's last columns, one at a time.
    let (one, v) = match epi {
        Some(e) => epilogue::value(dtype, e, "kiln::to_float(p[e])", "i")?,
        None => (String::new(), "kiln::to_float(p[e])".to_string()),
    };
    let _ = writeln!(
        s,
        "    #pragma unroll\n    for (int e = 0; e < 8; ++e) {{\n      if (col + e >= {n}) break;\n      const {ix} i = ({ix})i0 + e; {one} out[i] = {};\n    }}",
        types::store_exact(out, &v)
    );
    s.push_str("  }\n");
    Ok(())
}

/// Loads, into registers ahead of the epilogue's statements, each operand
/// of it that reads the chunk's eight columns as runs of consecutive,
/// aligned elements (`Access::runs_of`): a bias broadcast over rows, a
/// residual. One 16-byte load per run (two for f32) instead of eight loads
/// whose offsets each divide the element's index by the output's shape.
/// On BERT's FFN (bias and erf GELU over `[4096, 3072]` bf16) those were
/// 64 of the epilogue's 364 instructions per eight elements (ncu's source
/// view, H200, benches/RESULTS.md). Returns each loaded leaf with its run
/// width and dtype; the chunk starts at `i0` of an output with rows of
/// `n`.
fn run_loads(
    s: &mut String,
    e: &Epilogue<'_>,
    n: usize,
    ix: &str,
) -> Result<Vec<(NodeId, usize, DType)>, String> {
    let mut runs = Vec::new();
    for (id, leaf) in epilogue::buffer_leaves(e)? {
        let width = (16 / leaf.dtype.size().max(1)).min(8);
        // The chunk's first element must start a run: `i0` is a multiple of
        // the width when the rows are.
        if leaf.is_uniform() || n % width != 0 || !leaf.access.runs_of(width) {
            continue;
        }
        let var = format!("d{}", id.index());
        let st = types::storage(leaf.dtype);
        let _ = writeln!(s, "      kiln::vec{width}<{st}> {var}[{}];", 8 / width);
        for j in 0..8 / width {
            let at = leaf.access.offset_of(&format!("(({ix})i0 + {})", j * width));
            let _ = writeln!(s, "      {var}[{j}] = kiln::load{width}({} + {at});", leaf.param());
        }
        runs.push((id, width, leaf.dtype));
    }
    Ok(runs)
}
