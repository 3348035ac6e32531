//! Elementwise kernels: one grid-stride loop over the output's elements,
//! every compute node a local variable, leaves read where they live.
//!
//! Each thread handles four consecutive elements when the element count is
//! a multiple of four: operands read densely from a four-aligned offset are
//! then loaded with one vector load (16 bytes for f32), the output is
//! stored with one, an operand whose runs of four are consecutive (a bias
//! broadcast over rows, `Access::runs_of`) is loaded with one at the run's
//! first element, and other operands are read element by element
//! (broadcast values are read once per thread, before the loop). When every
//! such operand and every output is 16-bit (bf16, f16), a thread takes
//! eight: 16-byte accesses for halves too. With four, a warp's bf16 load
//! moved 256 bytes, too few in flight per SM for HBM's latency: BERT's
//! bias and erf GELU over `[4096, 3072]` bf16 took 26.2 us (1.9 TB/s), and
//! 24.0 with eight (ncu, H200; Inductor's takes 17.6).
//!
//! A body with several outputs (`extra` nodes) writes each one, `out`,
//! `out1`, ... at the same index. Every output is stored after every
//! value of its elements is computed, so an output written over an
//! operand (an optimizer's moment over its variable) never changes an
//! element another output still reads.

use super::body::{buffer_operands, out_name, params_named, Body, Operand};
use super::{paired, types, Kernel, BLOCK};
use crate::ir::{DType, Graph, NodeId, Padded};

/// Elements per thread when vector access is possible.
const VEC: usize = 4;
/// Elements per thread when every vector access is of 16-bit elements.
const VEC_HALF: usize = 8;

/// The kernel computing `body` (an elementwise graph: every compute node
/// has the output's shape) into a dense output of `numel` elements.
pub(crate) fn generate(
    name: &str,
    g: &Graph,
    operands: &[Operand],
    in_place: bool,
) -> Result<Kernel, String> {
    let (src, threads) = function(name, g, operands, in_place, Frame::Kernel)?;
    Ok(Kernel::new(name, src, super::grid_for(threads, BLOCK as usize), BLOCK, buffer_operands(operands)))
}

/// What [`function`] writes: a kernel of its own, or a device function
/// that a multi-tensor kernel calls for some of its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `extern "C" __global__ void name(out, in0, ...)` over the whole grid.
    Kernel,
    /// `static __device__ void name(out, in0, ..., count, blk, nblk)`:
    /// `count` elements, block `blk` of `nblk` blocks (`super::multi`).
    /// The element count is an argument, so members that differ only in
    /// size share one function.
    Member,
}

/// The source of [`generate`]'s loop in `frame`, and the threads it wants
/// (one per element, or per four).
pub(crate) fn function(
    name: &str,
    g: &Graph,
    operands: &[Operand],
    in_place: bool,
    frame: Frame,
) -> Result<(String, usize), String> {
    // A padded output 0 (`ir::Padded`, along dim 0): the loop computes
    // the value, then the fills follow it in memory.
    let pad = crate::ir::fused::padded_output(g);
    let unpadded;
    let g = match &pad {
        Some(p) if frame == Frame::Kernel => {
            unpadded = crate::ir::fused::without_cat(g, p.value);
            &unpadded
        }
        Some(_) => return Err("a multi-tensor member is never padded".into()),
        None => g,
    };
    let body = Body::new(g, operands)?;
    let outputs = g.outputs();
    let out_dtypes: Vec<_> = outputs.iter().map(|&o| g.node(o).dtype).collect();
    let numel = g.node(body.output).shape.numel();
    let computed = cone(&body, outputs);
    let index = body.index_type(pad.as_ref().map_or(numel, |p| p.width), operands);
    let aligned = |v: usize| {
        numel % v == 0
            && numel >= v
            && body
                .leaves
                .values()
                .all(|l| l.is_uniform() || l.access.dense_base().is_none_or(|b| b % v == 0))
    };
    // Eight a thread when the vector operands and outputs are all 16-bit
    // (a kernel of its own: a multi-tensor member's count is an argument).
    let halves = frame == Frame::Kernel
        && out_dtypes.iter().all(|d| d.size() == 2)
        && body.order.iter().all(|id| {
            body.leaves.get(id).is_none_or(|l| {
                l.is_uniform()
                    || l.access.dense_base().is_none()
                    || !needed(&body, outputs, &computed, *id)
                    || l.dtype.size() == 2
            })
        });
    let step = if halves && aligned(VEC_HALF) {
        VEC_HALF
    } else if aligned(VEC) {
        VEC
    } else {
        1
    };
    let vec = step > 1;
    // Two elements at a time where their roundings can share conversions.
    let pair = vec && paired::rounds(&body, &computed);

    let mut src = String::new();
    let (block, grid) = match frame {
        Frame::Kernel => {
            src.push_str(&format!(
                "extern \"C\" __global__ void {name}({}) {{\n",
                params_named(&out_dtypes, operands, in_place, "")
            ));
            ("blockIdx.x", "gridDim.x")
        }
        Frame::Member => {
            src.push_str(&format!(
                "static __device__ KILN_NOINLINE void {name}({}, const long long count, const unsigned blk, const unsigned nblk) {{\n",
                params_named(&out_dtypes, operands, in_place, "")
            ));
            ("blk", "nblk")
        }
    };
    let n = match frame {
        Frame::Kernel => numel.to_string(),
        Frame::Member => "(I)count".to_string(),
    };
    src.push_str(&format!("  typedef {index} I;\n  const I n = {n};\n"));
    // Broadcast leaves: one read per thread, before the loop.
    let mut hoisted: Vec<(NodeId, String)> = Vec::new();
    for &id in &body.order {
        let Some(leaf) = body.leaves.get(&id) else { continue };
        if leaf.is_uniform() && leaf.constant.is_none() && needed(&body, outputs, &computed, id) {
            let var = format!("u{}", id.index());
            src.push_str(&format!(
                "  const {} {var} = {};\n",
                types::compute(leaf.dtype),
                leaf.read_at(&leaf.access.offset_of("0"))
            ));
            hoisted.push((id, var));
        }
    }
    src.push_str(&format!(
        "  for (I base = ((I){block} * blockDim.x + threadIdx.x) * {step}; base < n; base += (I){grid} * blockDim.x * {step}) {{\n"
    ));
    // Dense, aligned leaves: one vector load each.
    let mut vectors: Vec<(NodeId, String)> = Vec::new();
    if vec {
        for &id in &body.order {
            let Some(leaf) = body.leaves.get(&id) else { continue };
            if leaf.is_uniform() || !needed(&body, outputs, &computed, id) {
                continue;
            }
            let at = match leaf.access.dense_base() {
                Some(0) => "base".to_string(),
                Some(b) => format!("base + {b}"),
                // A run of a row vector (a bias): one load at its first
                // element, where the vector is at most 16 bytes. Eight
                // scalar loads of BERT's bias (`in2[i % 3072]`) made its
                // erf GELU over [4096, 3072] bf16 take 24.9 us, one load
                // 22.8 (H200, benches/probes/erf_gelu.py).
                None if leaf.access.runs_of(step) && leaf.dtype.size() * step <= 16 => {
                    format!("({})", leaf.access.offset_of("base"))
                }
                None => continue,
            };
            let var = format!("d{}", id.index());
            src.push_str(&format!(
                "    const kiln::vec{step}<{}> {var} = kiln::load{step}({} + {at});\n",
                types::storage(leaf.dtype),
                leaf.param()
            ));
            vectors.push((id, var));
        }
        for (j, d) in out_dtypes.iter().enumerate() {
            src.push_str(&format!("    kiln::vec{step}<{}> {};\n", types::storage(*d), vec_name(j)));
        }
        let next = if pair { "j += 2" } else { "++j" };
        src.push_str(&format!("#pragma unroll\n    for (int j = 0; j < {step}; {next}) {{\n"));
        src.push_str(if pair {
            "      const I i = base + j, i1 = i + 1;\n"
        } else {
            "      const I i = base + j;\n"
        });
    } else {
        src.push_str("    {\n      const I i = base;\n");
    }
    // Element `k` of the pair (0 alone): its index, vector slot and names.
    let operand = |k: usize| {
        let (i, slot, suffix) = if k == 0 { ("i", "j", "") } else { ("i1", "j + 1", "_1") };
        let hoisted = &hoisted;
        let vectors = &vectors;
        let body = &body;
        move |o: NodeId| -> String {
            if let Some((_, v)) = hoisted.iter().find(|(h, _)| *h == o) {
                return v.clone();
            }
            if let Some((_, v)) = vectors.iter().find(|(h, _)| *h == o) {
                return types::load(g.node(o).dtype, &format!("{v}.v[{slot}]"));
            }
            match body.leaves.get(&o) {
                Some(leaf) => leaf.read_at(&leaf.access.offset_of(i)),
                None => format!("v{}{suffix}", o.index()),
            }
        }
    };
    let (first, second) = (operand(0), operand(1));
    for &id in &computed {
        let v = format!("v{}", id.index());
        if pair {
            for line in paired::statements(&body, id, [&v, &format!("{v}_1")], [&first, &second])? {
                src.push_str(&format!("      {line}\n"));
            }
        } else {
            src.push_str(&format!("      {}\n", body.statement(id, &v, &first)?));
        }
    }
    for (j, (&o, &d)) in outputs.iter().zip(&out_dtypes).enumerate() {
        // Every value of a node is already what its dtype holds.
        let result = types::store_exact(d, &first(o));
        match vec {
            true => src.push_str(&format!("      {}.v[j] = {result};\n", vec_name(j))),
            false => src.push_str(&format!("      {}[i] = {result};\n", out_name(j))),
        }
        if pair {
            src.push_str(&format!(
                "      {}.v[j + 1] = {};\n",
                vec_name(j),
                types::store_exact(d, &second(o))
            ));
        }
    }
    src.push_str("    }\n");
    if vec {
        for j in 0..outputs.len() {
            src.push_str(&format!("    kiln::store{step}({} + base, {});\n", out_name(j), vec_name(j)));
        }
    }
    src.push_str("  }\n");
    if let Some(p) = &pad {
        tail_fills(&mut src, p, out_dtypes[0]);
    }
    src.push_str("}\n");
    Ok((src, numel.div_ceil(step)))
}

/// The fills of a padded output after its value's `n` elements, one
/// element a thread in a grid-stride loop.
fn tail_fills(src: &mut String, pad: &Padded, dtype: DType) {
    let (width, mut end) = (pad.width, pad.cols);
    src.push_str(&format!(
        "  for (I i = n + (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I){width}; i += (I)gridDim.x * blockDim.x) {{\n"
    ));
    let (last, init) = pad.fills.split_last().expect("a padded output has a fill");
    let mut value = String::new();
    for &(k, v) in init {
        end += k;
        value.push_str(&format!("i < {end} ? {} : ", types::literal(dtype, v)));
    }
    value.push_str(&types::literal(dtype, last.1));
    src.push_str(&format!("    out[i] = {};\n  }}\n", types::store(dtype, &format!("({value})"))));
}

/// The vector that collects output `j`'s four elements: `o`, `o1`, ...
fn vec_name(j: usize) -> String {
    match j {
        0 => "o".into(),
        j => format!("o{j}"),
    }
}

/// The compute nodes the outputs need, in body order.
fn cone(body: &Body<'_>, outputs: &[NodeId]) -> Vec<NodeId> {
    let need: std::collections::HashSet<NodeId> =
        outputs.iter().flat_map(|&o| body.cone(o, &|_| false)).collect();
    body.order.iter().copied().filter(|n| need.contains(n)).collect()
}

/// True when an output needs leaf `id` (bodies may hold dead leaves);
/// `computed` is the outputs' [`cone`].
fn needed(body: &Body<'_>, outputs: &[NodeId], computed: &[NodeId], id: NodeId) -> bool {
    outputs.contains(&id) || computed.iter().any(|&n| body.g.operands(n).contains(&id))
}
