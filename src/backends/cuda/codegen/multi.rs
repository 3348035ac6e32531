//! Multi-tensor kernels: the members of a launch group
//! ([`crate::ir::LaunchGroup`]) in one launch, as PyTorch's
//! `multi_tensor_apply` runs a fused optimizer.
//!
//! Each member is its elementwise loop as a device function
//! ([`elementwise::Frame::Member`]) over a range of the grid's blocks: as
//! many as its own kernel would have had. Its element count is an
//! argument, so members that differ only in size (every parameter's
//! second-moment update) call one function, which is never inlined
//! (`KILN_NOINLINE`): NVRTC compiles a few functions, not a copy per
//! member (a group of 57 members, each with its loop inlined, added 1.8 s
//! or more to a cold start). The kernel takes every member's
//! pointers in member order (`m0_out, m0_in0, ..., m1_out, ...`; a member
//! with extra outputs has `m0_out1, ...` after `m0_out`) and each
//! block finds its member by a binary search over the block ranges, baked
//! into the source like every size. A member computes exactly what its
//! own kernel computes, so results are bit for bit the same; only the
//! launch count changes.
//!
//! Kernel parameters take at most 4 KiB (the limit of every CUDA
//! architecture), so a group whose pointers do not fit is split into
//! several kernels by [`chunks`].

use super::body::{buffer_operands, out_name, params_named, Operand};
use super::elementwise::{self, Frame};
use super::{grid_for, Kernel, BLOCK};
use crate::ir::Graph;

/// Bytes of kernel parameters CUDA accepts in every architecture.
const PARAM_BYTES: usize = 4096;

/// One member: an elementwise body over its operands, computed in place
/// of one when `in_place` (no `__restrict__` then).
pub(crate) struct Member<'a> {
    pub g: &'a Graph,
    pub operands: Vec<Operand>,
    pub in_place: bool,
}

/// Pointer parameters of a member: its outputs and its buffer operands.
pub(crate) fn pointers(outputs: usize, operands: &[Operand]) -> usize {
    outputs + buffer_operands(operands).len()
}

/// Splits members with these pointer counts into runs whose parameters
/// fit [`PARAM_BYTES`]: the member ranges of the kernels to launch.
pub(crate) fn chunks(pointers: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, &p) in pointers.iter().enumerate() {
        if i > start && bytes + 8 * p > PARAM_BYTES {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += 8 * p;
    }
    if start < pointers.len() {
        out.push(start..pointers.len());
    }
    out
}

/// The kernel running `members` (see the module docs).
pub(crate) fn generate(name: &str, members: &[Member<'_>]) -> Result<Kernel, String> {
    const FUNCTION: &str = "KILN_MEMBER_FUNCTION";
    let mut src = String::new();
    let mut functions: Vec<String> = Vec::new();
    let mut params = Vec::new();
    let mut calls = Vec::new();
    let mut starts = Vec::new();
    let mut grid = 0u64;
    for (i, m) in members.iter().enumerate() {
        let (text, threads) = elementwise::function(FUNCTION, m.g, &m.operands, m.in_place, Frame::Member)?;
        let j = match functions.iter().position(|f| *f == text) {
            Some(j) => j,
            None => {
                src.push_str(&text.replace(FUNCTION, &format!("{name}_f{}", functions.len())));
                functions.push(text);
                functions.len() - 1
            }
        };
        let out = m.g.node(*m.g.outputs().first().ok_or("a body has one output")?);
        let dtypes: Vec<_> = m.g.outputs().iter().map(|&o| m.g.node(o).dtype).collect();
        params.push(params_named(&dtypes, &m.operands, m.in_place, &format!("m{i}_")));
        let mut args: Vec<String> = (0..dtypes.len()).map(|j| format!("m{i}_{}", out_name(j))).collect();
        args.extend(buffer_operands(&m.operands).iter().map(|k| format!("m{i}_in{k}")));
        args.push(format!("{}ll", out.shape.numel()));
        let blocks = grid_for(threads, BLOCK as usize) as u64;
        starts.push(grid);
        calls.push((format!("{name}_f{j}"), args.join(", "), blocks));
        grid += blocks;
    }
    let grid = u32::try_from(grid).map_err(|_| format!("{grid} blocks do not fit one grid"))?;
    src.push_str(&format!("extern \"C\" __global__ void {name}({}) {{\n", params.join(", ")));
    src.push_str("  const unsigned b = blockIdx.x;\n");
    dispatch(&mut src, &calls, &starts, 0..members.len(), "  ");
    src.push_str("}\n");
    let params = members.iter().flat_map(|m| buffer_operands(&m.operands)).collect();
    Ok(Kernel::new(name, src, grid, BLOCK, params))
}

/// The binary search of block `b` over the members in `range`.
fn dispatch(
    src: &mut String,
    calls: &[(String, String, u64)],
    starts: &[u64],
    range: std::ops::Range<usize>,
    indent: &str,
) {
    if range.len() == 1 {
        let (f, args, blocks) = &calls[range.start];
        let from = starts[range.start];
        src.push_str(&format!("{indent}{f}({args}, b - {from}u, {blocks}u);\n"));
        return;
    }
    let mid = range.start + range.len() / 2;
    src.push_str(&format!("{indent}if (b < {}u) {{\n", starts[mid]));
    dispatch(src, calls, starts, range.start..mid, &format!("{indent}  "));
    src.push_str(&format!("{indent}}} else {{\n"));
    dispatch(src, calls, starts, mid..range.end, &format!("{indent}  "));
    src.push_str(&format!("{indent}}}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_parameters_under_the_limit() {
        assert_eq!(chunks(&[3, 3, 3]), vec![0..3]);
        // 512 pointers fit 4 KiB exactly; the 513th starts a new kernel.
        assert_eq!(chunks(&[256, 256, 1]), vec![0..2, 2..3]);
        // A member too large for the limit alone still gets a kernel.
        assert_eq!(chunks(&[600, 2]), vec![0..1, 1..2]);
        assert!(chunks(&[]).is_empty());
    }
}
