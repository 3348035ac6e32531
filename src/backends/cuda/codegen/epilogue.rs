//! A matmul body's elementwise epilogue, applied in the registers of the
//! kernel that computes the product (the GEMV kernels of `gemv.rs`, the
//! Hopper GEMM of `gemm_wgmma.rs`): bias, activation, residual add, cast,
//! before the one store, so the product never goes through memory.
//!
//! The product is rounded to its dtype before the epilogue reads it, as
//! when a GEMM stores it and a separate epilogue kernel loads it: the
//! fused kernel gives the unfused plan's bits.

use super::body::{Body, Leaf, Operand, Source};
use super::paired;
use super::types;
use crate::ir::{DType, Graph, NodeId, Op};
use std::fmt::Write;

/// The epilogue of a matmul body: `g` computes the output from its
/// `input`s, `operands[product]` being the product (computed in registers,
/// never read from memory).
pub(crate) struct Epilogue<'a> {
    pub g: &'a Graph,
    pub operands: &'a [Operand],
    pub product: usize,
}

/// Whether an epilogue can run in registers: the product is read only as
/// itself (no view of it) and the output has the product's elements in
/// order (`[.., m, n]`, `m * n` elements).
pub(crate) fn fusable(g: &Graph, product: usize, m: usize, n: usize) -> bool {
    let out = match g.outputs().first() {
        Some(&o) => o,
        None => return false,
    };
    let order = g.topo_order();
    let input = order.iter().find(|&&id| g.node(id).op == Op::Input(product as u32));
    let Some(&input) = input else { return false };
    g.node(out).shape.numel() == m * n
        && g.node(out).shape.0.last() == Some(&n)
        && g.node(out).shape == g.node(input).shape
        && order.iter().all(|&id| !(g.node(id).op.is_view() && g.operands(id).contains(&input)))
        && order.iter().all(|&id| {
            let node = g.node(id);
            matches!(node.op, Op::Input(_) | Op::Full(_))
                || node.op.is_view()
                || node.shape == g.node(out).shape
        })
}

/// A kernel's parameter list: `first` (`out`, then the kernel's own), then
/// the epilogue's buffers, `in{k}` for operand `k`.
pub(crate) fn params(first: &[String], epi: Option<&Epilogue<'_>>) -> String {
    let mut p: Vec<String> = first.to_vec();
    if let Some(e) = epi {
        for (k, o) in e.operands.iter().enumerate() {
            if k != e.product && o.source == Source::Buffer {
                p.push(format!("const {}* in{k}", types::storage(o.dtype)));
            }
        }
    }
    p.join(", ")
}

/// Operand indices of the pointer parameters after `out` (`Kernel::params`):
/// `first` fixed ones, then the epilogue's buffers.
pub(crate) fn param_indices(epi: Option<&Epilogue<'_>>, first: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..first).collect();
    if let Some(e) = epi {
        v.extend(
            e.operands
                .iter()
                .enumerate()
                .filter(|(k, o)| *k != e.product && o.source == Source::Buffer)
                .map(|(k, _)| first + k),
        );
    }
    v
}

/// Statements that compute output element `i` (an index expression into
/// the dense output) from the product's f32 sum `sum` of dtype `product`,
/// and the output's compute value (an expression valid after them). The
/// statements declare names (`pv`, `v{node}`): put each element's in a
/// block of its own.
pub(crate) fn value(
    product: DType,
    e: &Epilogue<'_>,
    sum: &str,
    i: &str,
) -> Result<(String, String), String> {
    let body = Body::new(e.g, e.operands)?;
    let mut s = format!("const float pv = {};", types::settle(product, sum));
    let product_leaf = |o: NodeId| body.g.node(o).op == Op::Input(e.product as u32);
    let operand = |o: NodeId| -> String {
        if product_leaf(o) {
            return "pv".into();
        }
        match body.leaves.get(&o) {
            Some(leaf) => leaf.read_at(&leaf.access.offset_of(i)),
            None => format!("v{}", o.index()),
        }
    };
    for id in body.cone(body.output, &|_| false) {
        let _ = write!(s, " {}", body.statement(id, &format!("v{}", id.index()), &operand)?);
    }
    Ok((s, operand(body.output)))
}

/// How the caller reads a leaf for element `k` (0 or 1) of a pair, where
/// it has loaded it already (a bias's run of columns in registers); `None`:
/// read at the element's index.
pub(crate) type LeafRead<'r> = &'r dyn Fn(NodeId, usize) -> Option<String>;

/// [`value`] for two elements at once, `is[0]` and `is[1]`, from sums
/// `sums`, with each rounding of both one paired conversion
/// (`paired.rs`); `settled`: the sums are already the product's dtype
/// (read back from a narrow copy), so they are not rounded again; `read`
/// gives the leaves the caller loaded itself. The statements declare
/// `pv0`, `pv1` and `v{node}_0`, `v{node}_1`.
pub(crate) fn values2(
    product: DType,
    e: &Epilogue<'_>,
    sums: [&str; 2],
    is: [&str; 2],
    settled: bool,
    read: LeafRead<'_>,
) -> Result<(String, [String; 2]), String> {
    let body = Body::new(e.g, e.operands)?;
    let [s0, s1] = sums;
    let mut s = match product {
        _ if settled => format!("const float pv0 = {s0}, pv1 = {s1};"),
        DType::BF16 => format!("float pv0, pv1; kiln::rnd2_bf16({s0}, {s1}, pv0, pv1);"),
        DType::F16 => format!("float pv0, pv1; kiln::rnd2_f16({s0}, {s1}, pv0, pv1);"),
        _ => {
            format!("const float pv0 = {}, pv1 = {};", types::settle(product, s0), types::settle(product, s1))
        }
    };
    let product_leaf = |o: NodeId| body.g.node(o).op == Op::Input(e.product as u32);
    let operand = |k: usize| {
        let body = &body;
        move |o: NodeId| -> String {
            if product_leaf(o) {
                return format!("pv{k}");
            }
            if let Some(v) = read(o, k) {
                return v;
            }
            match body.leaves.get(&o) {
                Some(leaf) => leaf.read_at(&leaf.access.offset_of(is[k])),
                None => format!("v{}_{k}", o.index()),
            }
        }
    };
    let (first, second) = (operand(0), operand(1));
    for id in body.cone(body.output, &|_| false) {
        let vars = [format!("v{}_0", id.index()), format!("v{}_1", id.index())];
        for line in paired::statements(&body, id, [&vars[0], &vars[1]], [&first, &second])? {
            let _ = write!(s, " {line}");
        }
    }
    Ok((s, [first(body.output), second(body.output)]))
}

/// The leaves the epilogue reads from its buffers (not the product), each
/// once, as the nodes that read them name them: what a kernel may load
/// ahead of the epilogue's statements (and give them through a
/// [`LeafRead`]).
pub(crate) fn buffer_leaves(e: &Epilogue<'_>) -> Result<Vec<(NodeId, Leaf)>, String> {
    let body = Body::new(e.g, e.operands)?;
    let mut found: Vec<(NodeId, Leaf)> = Vec::new();
    for id in body.cone(body.output, &|_| false) {
        for o in e.g.operands(id) {
            let Some(leaf) = body.leaves.get(&o) else { continue };
            let is_buffer = leaf.constant.is_none() && leaf.arange.is_none();
            if is_buffer
                && leaf.operand.is_some_and(|k| k != e.product)
                && !found.iter().any(|(f, _)| *f == o)
            {
                found.push((o, leaf.clone()));
            }
        }
    }
    Ok(found)
}

/// Statements storing output element `i` (of dtype `out`) from the
/// product's f32 sum `sum` of dtype `product`, through the epilogue when
/// there is one.
pub(crate) fn store(
    product: DType,
    out: DType,
    epi: Option<&Epilogue<'_>>,
    sum: &str,
    i: &str,
) -> Result<String, String> {
    let Some(e) = epi else {
        return Ok(format!("out[{i}] = {};", types::store(product, &types::settle(product, sum))));
    };
    let (s, v) = value(product, e, sum, i)?;
    Ok(format!("{s} out[{i}] = {};", types::store(out, &v)))
}
