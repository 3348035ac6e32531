//! The launches of each op: which generated kernel or library call, with
//! which operands. `mod.rs` decides where values live; this file decides
//! what runs.

use super::gemv::Epi;
use super::matmul::LtEpilogue;
use super::{bytes, Lowering, Storage, Value};
use crate::backends::cuda::codegen::body::{Operand, Source};
use crate::backends::cuda::codegen::index::Access;
use crate::backends::cuda::codegen::{argmax, columns, elementwise, ops, pool_grad, reduction, Kernel};
use crate::backends::cuda::program::{Conv, Epilogue, IndexCheck, Launch, Loc, Pool, Region, Tensor4};
use crate::backends::Layout;
use crate::ir::{DType, FusedBody, FusedKind, Graph, Node, NodeId, Op, Placement, ReduceOp, RegionId, Shape};
use std::borrow::Cow;

impl Lowering<'_> {
    /// Launches computing node `id` into `dst` (dense).
    pub(super) fn lower_compute(&mut self, id: NodeId, dst: Loc) -> Result<(), String> {
        let node = self.plan.graph.node(id).clone();
        let ops = self.operands(id)?;
        if node.shape.numel() == 0 {
            if let Op::Fused(body) = &node.op {
                self.place_extras(id, body)?;
                return Ok(());
            }
            // An attention's extra output can have elements where its
            // value has none (a `kv+q` gradient's `dq` with no keys):
            // then the op's own lowering writes it.
            if self.place_empty_extras(id)? {
                return Ok(());
            }
        }
        match &node.op {
            Op::Fused(body) => self.fused(id, body, &ops, dst),
            op if op.is_elementwise() => {
                let g = one_op_body(&node, &ops);
                let in_place = self.in_place(id);
                self.body_kernel("elementwise", &g, &ops, (dst, &[]), in_place, None)
            }
            Op::Reduce { op, dims, .. } => {
                let x = &ops[0];
                let rank = x.layout.shape.rank();
                if *op == ReduceOp::ArgMax && self.argmax_rows(x, dims, dst)? {
                    return Ok(());
                }
                let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
                // Leading dims reduced, trailing kept: a column reduction.
                let lead = dims.len();
                if dims.iter().enumerate().all(|(i, &d)| i == d) && lead < rank {
                    let rows: usize = x.layout.shape.0[..lead].iter().product();
                    let cols: usize = x.layout.shape.0[lead..].iter().product();
                    let xo = operand(x);
                    if columns::fits(&xo, *op, rows, cols) {
                        let k = self.add_kernel("reduce_columns", |n| {
                            Ok(columns::generate(n, &xo, *op, rows, cols, node.dtype))
                        })?;
                        let mut args = vec![dst];
                        let tiling = columns::Tiling::of(&xo, rows, cols);
                        if tiling.split() {
                            args.push(self.transient(tiling.workspace_bytes()));
                            args.push(self.new_counters(tiling.counters()));
                        }
                        args.extend(buffer_locs(&ops));
                        self.launches.push(Launch::Kernel { kernel: k, args });
                        return Ok(());
                    }
                }
                let perm: Vec<usize> = kept.iter().chain(dims.iter()).copied().collect();
                let domain = Shape(perm.iter().map(|&d| x.layout.shape.0[d]).collect());
                let split = kept.len();
                let mut g = Graph::new();
                let input = g.add_unchecked(leaf_node(Op::Input(0), &x.layout.shape, x.dtype), &[]);
                let mut p = g.add_unchecked(leaf_node(Op::Permute(perm), &domain, x.dtype), &[input]);
                if node.dtype != x.dtype && *op != ReduceOp::ArgMax {
                    // A widening sum (`into=`): the body widens as it reads.
                    p = g.add_unchecked(leaf_node(Op::Cast(node.dtype), &domain, node.dtype), &[p]);
                }
                let r = g.add_unchecked(
                    Node {
                        op: Op::Reduce { op: *op, dims: (split..rank).collect(), keepdim: false, into: None },
                        shape: Shape(domain.0[..split].to_vec()),
                        dtype: node.dtype,
                        region: RegionId::ROOT,
                    },
                    &[p],
                );
                g.set_outputs(vec![r]);
                self.body_kernel("reduce", &g, &ops, (dst, &[]), false, Some((&domain, split)))
            }
            Op::MatMul => {
                let (a, b) = (ops[0].clone(), ops[1].clone());
                if self.gemv(&a, &b, &node.shape, node.dtype, dst, None)? {
                    return Ok(());
                }
                self.matmul(&a, &b, &node.shape, node.dtype, node.dtype, dst, LtEpilogue::NONE)
            }
            Op::Conv2d { stride, padding, dilation, groups } => {
                let x = self.library_operand(&ops[0], false)?;
                let w = self.library_operand(&ops[1], true)?;
                self.launches.push(Launch::Conv(Conv {
                    dtype: node.dtype,
                    x: tensor4(&x)?,
                    w: tensor4(&w)?,
                    y: tensor4(&Value::dense(dst, node.shape.clone(), node.dtype))?,
                    stride: *stride,
                    padding: *padding,
                    dilation: *dilation,
                    groups: *groups,
                    tf32: self.tf32,
                }));
                Ok(())
            }
            Op::Pool2d { kind, kernel, stride, padding } => {
                let x = self.library_operand(&ops[0], false)?;
                self.launches.push(Launch::Pool(Pool {
                    dtype: node.dtype,
                    kind: *kind,
                    x: tensor4(&x)?,
                    y: tensor4(&Value::dense(dst, node.shape.clone(), node.dtype))?,
                    kernel: *kernel,
                    stride: *stride,
                    padding: *padding,
                }));
                Ok(())
            }
            Op::MaxPool2dGrad { kernel, stride, padding } => {
                let (x, g) = (operand(&ops[0]), operand(&ops[1]));
                let k = self.add_kernel("max_pool2d_grad", |n| {
                    Ok(pool_grad::generate(n, &x, &g, &node.shape, *kernel, *stride, *padding))
                })?;
                let mut args = vec![dst];
                args.extend(buffer_locs(&ops));
                self.launches.push(Launch::Kernel { kernel: k, args });
                Ok(())
            }
            Op::Gather { dim } | Op::IndexSelect { dim } => {
                let gather = matches!(node.op, Op::Gather { .. });
                self.index(id, gather, *dim, &ops, &node.shape, dst)
            }
            Op::IndexAdd { dim } => self.index_add(id, *dim, &ops, &node.shape, dst),
            Op::WriteAt { dim } => self.write_at(*dim, &ops, &node.shape, dst),
            Op::Collective { what, .. } => self.collective(*what, &ops[0], dst),
            Op::Attention { scale, causal, mask, layout } => {
                self.attention(id, &ops, *scale, *causal, *mask, *layout, &node.shape, dst)
            }
            Op::AttentionDelta => self.attention_delta(&ops, node.dtype, dst),
            Op::AttentionStats { scale, causal, mask } => {
                self.attention_backward(id, &ops, *scale, *causal, *mask, None, dst)
            }
            Op::AttentionGrad { scale, causal, mask, wrt } => {
                self.attention_backward(id, &ops, *scale, *causal, *mask, Some(*wrt), dst)
            }
            Op::Cat { dim } => {
                let parts: Vec<Operand> = ops.iter().map(operand).collect();
                let k = self.add_kernel("cat", |n| Ok(ops::cat(n, &parts, *dim, &node.shape)))?;
                let mut args = vec![dst];
                args.extend(buffer_locs(&ops));
                self.launches.push(Launch::Kernel { kernel: k, args });
                Ok(())
            }
            Op::Random { dist, stream } => {
                let numel = node.shape.numel();
                let k = self.add_kernel("random", |n| Ok(ops::random(n, node.dtype, numel, *dist)))?;
                // The parameter block holds the seed, then each stream's number.
                let stream_at = Loc::new(Region::Params, 8 * (1 + *stream));
                self.launches.push(Launch::Kernel {
                    kernel: k,
                    args: vec![dst, Loc::new(Region::Params, 0), stream_at],
                });
                Ok(())
            }
            Op::Arange { start, step } => {
                let numel = node.shape.numel();
                let k =
                    self.add_kernel("arange", |n| Ok(ops::arange(n, node.dtype, numel, *start, *step)))?;
                self.launches.push(Launch::Kernel { kernel: k, args: vec![dst] });
                Ok(())
            }
            op => Err(format!("the CUDA backend has no kernel for {}", op.mnemonic())),
        }
    }

    /// `g` (the body of fused node `id`) with each `input k` that reads a
    /// dense `arange` node replaced by that `arange`: the row kernel
    /// computes its elements where it reads them. GPT-2's loss gradient
    /// compares each of its 50257 columns with the row's target through
    /// an `i64` arange, and loading it was 8 of the 10 bytes the kernel's
    /// output pass read per element (from L2). The operand stays a
    /// parameter of the kernel, unread.
    fn with_aranges_computed<'g>(&self, id: NodeId, g: &'g Graph, ops: &[Value]) -> Cow<'g, Graph> {
        let graph = &self.plan.graph;
        let computed: Vec<(u32, Op)> = graph
            .operands(id)
            .iter()
            .zip(ops)
            .enumerate()
            .filter_map(|(k, (&o, v))| {
                let op = &graph.node(o).op;
                let dense = v.layout.offset == 0 && v.layout.is_contiguous();
                (matches!(op, Op::Arange { .. }) && dense).then(|| (k as u32, op.clone()))
            })
            .collect();
        if computed.is_empty() {
            return Cow::Borrowed(g);
        }
        let mut out = Graph::new();
        let mut map: std::collections::HashMap<NodeId, NodeId> = std::collections::HashMap::new();
        for n in g.topo_order() {
            let node = g.node(n);
            let arange = match node.op {
                Op::Input(k) => computed.iter().find(|(c, _)| *c == k).map(|(_, op)| op.clone()),
                _ => None,
            };
            let new = match arange {
                Some(op) => out.add_unchecked(leaf_node(op, &node.shape, node.dtype), &[]),
                None => {
                    let operands: Vec<NodeId> = g.operands(n).iter().map(|o| map[o]).collect();
                    out.add_unchecked(node.clone(), &operands)
                }
            };
            map.insert(n, new);
        }
        out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
        Cow::Owned(out)
    }

    /// True when the memory plan computes `id` in place of an operand,
    /// or over an input it reads: its output pointer then aliases an
    /// operand's, so the kernel's pointers must not be `__restrict__`.
    pub(super) fn in_place(&self, id: NodeId) -> bool {
        matches!(
            self.plan.graph.tables().memory.as_ref().and_then(|m| m.values.get(&id)).map(|v| &v.placement),
            Some(Placement::Arena { in_place_of: Some(_), .. } | Placement::OverInput(_))
        )
    }

    /// Adds a kernel generated under a placeholder name, renamed
    /// `<kind>_<hash of its source>` so that names are stable and identical
    /// kernels are one.
    pub(super) fn add_kernel(
        &mut self,
        kind: &str,
        gen: impl FnOnce(&str) -> Result<Kernel, String>,
    ) -> Result<usize, String> {
        const PLACEHOLDER: &str = "KILN_KERNEL_NAME";
        let mut k = gen(PLACEHOLDER)?;
        let hash = fnv1a(k.source.as_bytes()) as u32;
        let name = format!("{kind}_{hash:08x}");
        k.source = k.source.replace(PLACEHOLDER, &name);
        k.name = name;
        Ok(self.kernel(k))
    }

    /// An elementwise (or, with a domain, reduction) kernel of body `g`
    /// over `ops`, writing `dst`.
    fn body_kernel(
        &mut self,
        kind: &str,
        g: &Graph,
        ops: &[Value],
        (dst, extras): (Loc, &[Loc]),
        in_place: bool,
        reduction: Option<(&Shape, usize)>,
    ) -> Result<(), String> {
        let operands: Vec<Operand> = ops.iter().map(operand).collect();
        let k = match reduction {
            Some((domain, split)) => {
                self.add_kernel(kind, |n| reduction::generate(n, g, &operands, domain, split, in_place))?
            }
            None => self.add_kernel(kind, |n| elementwise::generate(n, g, &operands, in_place))?,
        };
        let mut args = vec![dst];
        args.extend(extras);
        args.extend(buffer_locs(ops));
        self.launches.push(Launch::Kernel { kernel: k, args });
        Ok(())
    }

    fn fused(&mut self, id: NodeId, body: &FusedBody, ops: &[Value], dst: Loc) -> Result<(), String> {
        match body.kind() {
            FusedKind::Elementwise => {
                let extras = self.place_extras(id, body)?;
                let in_place =
                    self.in_place(id) || self.extras_of(id).iter().flatten().any(|&e| self.in_place(e));
                self.body_kernel("fused_elementwise", body.graph(), ops, (dst, &extras), in_place, None)
            }
            FusedKind::Reduction { domain, split } => {
                let extras = self.place_extras(id, body)?;
                let reduction = Some((domain, *split));
                let in_place = self.in_place(id);
                let g = self.with_aranges_computed(id, body.graph(), ops);
                self.body_kernel("fused_reduction", &g, ops, (dst, &extras), in_place, reduction)
            }
            FusedKind::MatMul { matmul } => {
                let g = body.graph();
                let mm = *matmul;
                let node = g.node(mm).clone();
                let args = g.operands(mm);
                let a = self.leaf_value(g, args[0], ops)?;
                let b = self.leaf_value(g, args[1], ops)?;
                if body.output() == mm {
                    if self.gemv(&a, &b, &node.shape, node.dtype, dst, None)? {
                        return Ok(());
                    }
                    let epilogue = self.lt_epilogue(g, mm, body.output(), ops)?;
                    return self.matmul(&a, &b, &node.shape, node.dtype, node.dtype, dst, epilogue);
                }
                let out = g.node(body.output());
                let (epi, extra) = replace_with_input(g, mm, body.inputs());
                let fused = Epi { g: &epi, ops, product: extra, out: out.dtype };
                if !widens(g, mm, body.output())
                    && self.gemv(&a, &b, &node.shape, node.dtype, dst, Some(fused))?
                {
                    return Ok(());
                }
                let epilogue = self.lt_epilogue(g, mm, body.output(), ops)?;
                if widens(g, mm, body.output()) {
                    // `cast<f32>(a @ b)` of halves: the GEMM stores its f32
                    // accumulator in `dst` (no scratch, no epilogue kernel).
                    return self.matmul(&a, &b, &node.shape, node.dtype, out.dtype, dst, LtEpilogue::NONE);
                }
                // An epilogue cuBLASLt takes none of (the erf GELU, a cast):
                // on Hopper, in the GEMM's own registers.
                if epilogue.epilogue == Epilogue::None && epilogue.residual.is_none() {
                    let fused = Epi { g: &epi, ops, product: extra, out: out.dtype };
                    if self.gemm_wgmma(&a, &b, &node.shape, node.dtype, dst, fused)? {
                        return Ok(());
                    }
                }
                // The epilogue reads the product where the GEMM left it. In
                // `dst` itself, overwriting it element for element, when
                // the output has the product's shape and element size;
                // otherwise (a cast, as in `(a @ b) as f16`) the product
                // does not fit `dst`, whose bytes the memory plan sized for
                // the output, so it goes to scratch.
                let in_place = out.shape == node.shape && out.dtype.size() == node.dtype.size();
                let product = if in_place { dst } else { self.transient(bytes(&node.shape, node.dtype)) };
                self.matmul(&a, &b, &node.shape, node.dtype, node.dtype, product, epilogue)?;
                let mut epi_ops = ops.to_vec();
                epi_ops.push(Value::dense(product, node.shape.clone(), node.dtype));
                debug_assert_eq!(extra, epi_ops.len() - 1);
                self.body_kernel("matmul_epilogue", &epi, &epi_ops, (dst, &[]), in_place, None)
            }
        }
    }

    /// The value of a body leaf (an input, a constant, or views of one).
    pub(super) fn leaf_value(&mut self, g: &Graph, id: NodeId, ops: &[Value]) -> Result<Value, String> {
        let node = g.node(id).clone();
        match &node.op {
            Op::Input(k) => ops.get(*k as usize).cloned().ok_or_else(|| format!("body input {k} is missing")),
            Op::Full(v) => Ok(Value {
                storage: Storage::Const(*v),
                layout: Layout { shape: node.shape.clone(), strides: vec![0; node.shape.rank()], offset: 0 },
                dtype: node.dtype,
            }),
            op if op.is_view() => {
                let from = self.leaf_value(g, g.operands(id)[0], ops)?;
                if let Storage::Const(c) = from.storage {
                    return Ok(Value {
                        storage: Storage::Const(c),
                        layout: Layout {
                            shape: node.shape.clone(),
                            strides: vec![0; node.shape.rank()],
                            offset: 0,
                        },
                        dtype: node.dtype,
                    });
                }
                let viewed = match op {
                    Op::Reshape(t) => from.layout.reshape(t),
                    Op::Permute(p) => Some(from.layout.permute(p)),
                    Op::Expand(t) => Some(from.layout.expand(t)),
                    Op::Slice { dim, start, step, len } => Some(from.layout.slice(*dim, *start, *step, *len)),
                    _ => None,
                };
                match viewed {
                    Some(layout) => Ok(Value { layout, ..from }),
                    None => {
                        let access = Access::strided(from.layout.clone()).view(op);
                        let dst = self.transient(bytes(&node.shape, node.dtype));
                        self.copy_access(&from, access, &node.shape, node.dtype, dst)?;
                        Ok(Value::dense(dst, node.shape.clone(), node.dtype))
                    }
                }
            }
            op => Err(format!("{id} ({}) is not a leaf of the matmul body", op.mnemonic())),
        }
    }

    /// `value` read through `access` (over `shape`) into dense `dst`.
    pub(super) fn copy_access(
        &mut self,
        value: &Value,
        access: Access,
        shape: &Shape,
        dtype: DType,
        dst: Loc,
    ) -> Result<(), String> {
        let numel = shape.numel();
        if numel == 0 {
            return Ok(());
        }
        if let Storage::Const(c) = value.storage {
            let k = self.add_kernel("fill", |n| Ok(ops::fill(n, dtype, numel, c)))?;
            self.launches.push(Launch::Kernel { kernel: k, args: vec![dst] });
            return Ok(());
        }
        let mut g = Graph::new();
        let input = g.add_unchecked(leaf_node(Op::Input(0), shape, dtype), &[]);
        g.set_outputs(vec![input]);
        let operands = vec![Operand { source: Source::Buffer, access, dtype }];
        let k = self.add_kernel("copy", |n| elementwise::generate(n, &g, &operands, false))?;
        let Storage::Mem(at) = value.storage else { unreachable!("constants returned above") };
        self.launches.push(Launch::Kernel { kernel: k, args: vec![dst, at] });
        Ok(())
    }

    /// `value` copied densely into `dst`.
    pub(super) fn copy_into(&mut self, value: &Value, shape: &Shape, dst: Loc) -> Result<(), String> {
        self.copy_access(value, Access::strided(value.layout.clone()), shape, value.dtype, dst)
    }

    /// `value` as a dense tensor in scratch.
    pub(super) fn materialize(&mut self, value: &Value) -> Result<Value, String> {
        let shape = value.layout.shape.clone();
        let dst = self.transient(bytes(&shape, value.dtype));
        self.copy_into(value, &shape, dst)?;
        Ok(Value::dense(dst, shape, value.dtype))
    }

    /// A cuDNN operand: in memory with positive strides (`dense`: packed).
    pub(super) fn library_operand(&mut self, v: &Value, dense: bool) -> Result<Value, String> {
        let ok = matches!(v.storage, Storage::Mem(_))
            && if dense { v.layout.is_contiguous() } else { v.layout.strides.iter().all(|&s| s > 0) };
        if ok {
            Ok(v.clone())
        } else {
            self.materialize(v)
        }
    }

    /// Gather or index_select with the index check's status.
    fn index(
        &mut self,
        id: NodeId,
        gather: bool,
        dim: usize,
        ops: &[Value],
        out: &Shape,
        dst: Loc,
    ) -> Result<(), String> {
        let x = operand(&ops[0]);
        let idx = operand(&ops[1]);
        let status_at = 8 * (1 + self.plan.random_streams as u64) + 16 * self.checks.len() as u64;
        let status = Loc::new(Region::Params, status_at);
        let op = if gather { "gather" } else { "index_select" };
        let main = if gather {
            self.add_kernel(op, |n| Ok(ops::gather(n, &x, &idx, dim)))?
        } else {
            self.add_kernel(op, |n| Ok(ops::index_select(n, &x, &idx, dim, out)))?
        };
        let mut args = vec![dst];
        args.extend(buffer_locs(ops));
        args.push(status);
        self.launches.push(Launch::Kernel { kernel: main, args });
        let access = ops::index_access(gather, &idx, dim, out);
        let report = self.add_kernel("index_report", |n| Ok(ops::index_report(n, &idx, &access)))?;
        let mut args = vec![status];
        if let Storage::Mem(l) = ops[1].storage {
            args.push(l);
        }
        self.launches.push(Launch::Kernel { kernel: report, args });
        self.checks.push(IndexCheck {
            node: id,
            op,
            dim,
            size: ops[0].layout.shape.0[dim],
            status: status_at,
        });
        Ok(())
    }
}

/// Whether a matmul body is only `cast<f32>(mm)` of an f16/bf16 product,
/// which one GEMM computes by storing its f32 accumulator.
fn widens(g: &Graph, mm: NodeId, out: NodeId) -> bool {
    matches!(g.node(out).op, Op::Cast(DType::F32))
        && g.operands(out) == [mm]
        && matches!(g.node(mm).dtype, DType::F16 | DType::BF16)
}

/// A cuDNN 4-d descriptor of a value in memory.
fn tensor4(v: &Value) -> Result<Tensor4, String> {
    let Storage::Mem(at) = v.storage else { return Err("a constant cuDNN operand".into()) };
    let l = &v.layout;
    if l.shape.rank() != 4 {
        return Err(format!("cuDNN needs a 4-d tensor, got {}", l.shape));
    }
    let d = |i: usize| l.shape.0[i];
    let s = |i: usize| l.strides[i];
    Ok(Tensor4 {
        at: at.plus(l.offset as u64 * v.dtype.size() as u64),
        dims: [d(0), d(1), d(2), d(3)],
        strides: [s(0).max(1), s(1).max(1), s(2).max(1), s(3).max(1)],
    })
}

fn leaf_node(op: Op, shape: &Shape, dtype: DType) -> Node {
    Node { op, shape: shape.clone(), dtype, region: RegionId::ROOT }
}

/// A body of one elementwise op over `input k` leaves.
fn one_op_body(node: &Node, ops: &[Value]) -> Graph {
    let mut g = Graph::new();
    let inputs: Vec<NodeId> = ops
        .iter()
        .enumerate()
        .map(|(k, v)| g.add_unchecked(leaf_node(Op::Input(k as u32), &v.layout.shape, v.dtype), &[]))
        .collect();
    let out = g.add_unchecked(Node { region: RegionId::ROOT, ..node.clone() }, &inputs);
    g.set_outputs(vec![out]);
    g
}

/// `g` with node `replaced` turned into `input k` (its shape and dtype):
/// a matmul body's epilogue reading the product. Returns `k`.
fn replace_with_input(g: &Graph, replaced: NodeId, k: usize) -> (Graph, usize) {
    let mut out = Graph::new();
    let mut map: std::collections::HashMap<NodeId, NodeId> = std::collections::HashMap::new();
    for id in g.topo_order() {
        let node = g.node(id);
        let new = if id == replaced {
            out.add_unchecked(leaf_node(Op::Input(k as u32), &node.shape, node.dtype), &[])
        } else {
            let operands: Vec<NodeId> = g.operands(id).iter().map(|o| map[o]).collect();
            out.add_unchecked(Node { region: RegionId::ROOT, ..node.clone() }, &operands)
        };
        map.insert(id, new);
    }
    out.set_outputs(g.outputs().iter().map(|o| map[o]).collect());
    (out, k)
}

/// A value as a kernel operand.
pub(super) fn operand(v: &Value) -> Operand {
    Operand {
        source: match v.storage {
            Storage::Mem(_) => Source::Buffer,
            Storage::Const(c) => Source::Const(c),
        },
        access: Access::strided(v.layout.clone()),
        dtype: v.dtype,
    }
}

/// The locations of the values in memory, in order (kernel pointer args).
pub(super) fn buffer_locs(vs: &[Value]) -> Vec<Loc> {
    vs.iter()
        .filter_map(|v| match v.storage {
            Storage::Mem(l) => Some(l),
            Storage::Const(_) => None,
        })
        .collect()
}

/// 64-bit FNV-1a (stable names for generated kernels).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl Lowering<'_> {
    /// An argmax over the trailing dims of a few long dense rows with the
    /// split kernel (`codegen/argmax.rs`). `Ok(false)`: not taken, use the
    /// general reduction.
    fn argmax_rows(&mut self, x: &Value, dims: &[usize], dst: Loc) -> Result<bool, String> {
        let rank = x.layout.shape.rank();
        let Some(&first) = dims.iter().min() else { return Ok(false) };
        let trailing = dims.len() == rank - first && (first..rank).all(|d| dims.contains(&d));
        let Storage::Mem(loc) = x.storage else { return Ok(false) };
        let rows: usize = x.layout.shape.0[..first].iter().product();
        let cols: usize = x.layout.shape.0[first..].iter().product();
        if !trailing || !x.layout.is_contiguous() || !argmax::applies(x.dtype, rows, cols) {
            return Ok(false);
        }
        let ws = self.transient(argmax::workspace_bytes(rows, cols));
        let counts = self.new_counters(rows);
        let (dtype, offset) = (x.dtype, x.layout.offset);
        let kernel = self.add_kernel("argmax", |n| Ok(argmax::kernel(n, dtype, rows, cols, offset)))?;
        self.launches.push(Launch::Kernel { kernel, args: vec![dst, ws, counts, loc] });
        Ok(true)
    }
}
