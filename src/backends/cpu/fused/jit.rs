//! Fused kernels as generated code: which compiled bodies qualify, the
//! [`codegen::Body`] built from their steps when the plan is compiled,
//! and the per-block call that replaces the interpreter's walk.
//!
//! A body qualifies when every step it computes is an elementwise op on
//! `f32`/`bool` with a definition in [`codegen`] (no reductions, no
//! computed row values read along rows) and its outputs are computed
//! full-size values. Leaves and a matmul's product stay the interpreter's
//! business: each block resolves them as ever (in place, one value, a
//! bias row, a value per row, or gathered into scratch), and their
//! addresses and read modes are the generated code's arguments. Code is
//! made on the first block that meets a set of modes (a run's layouts)
//! and kept for every later one. A body that does not qualify whole (a
//! reduction's) has its runs of elementwise steps generated as
//! [`Segment`]s between the interpreter's reductions. Anything else, and
//! any failure to generate code, stays on the interpreter; the reason is
//! logged at debug level.

use super::super::codegen::{self, Body, Codegen, Kernel, Mode, Node, Ty};
use super::super::storage::{Elem, HostSlice, Out};
use super::ops::{Arg, Blk, TArg};
use super::{Class, FusedKernel, Instr, Opnd, Step};
use crate::ir::{DType, NodeId};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A fused kernel's generated code: the body, the interpreter operands
/// its arguments are, and the code made so far per set of modes.
#[derive(Debug)]
pub(super) struct Jit {
    body: Body,
    /// Argument `k` of the body is this operand of the interpreter.
    args: Vec<Opnd>,
    kernels: Mutex<Vec<(Vec<Mode>, Arc<Kernel>)>>,
    /// Set when code generation failed: the kernel stays interpreted.
    failed: AtomicBool,
}

fn ty(d: DType) -> Option<Ty> {
    match d {
        DType::F32 => Some(Ty::F32),
        DType::Bool => Some(Ty::Bool),
        _ => None,
    }
}

/// The body of `instrs` as generated code and the interpreter operands
/// its arguments are, or why it does not qualify.
pub(super) fn plan(
    instrs: &[Instr],
    output: usize,
    extras: &[(usize, DType, Class)],
    cols: usize,
) -> std::result::Result<(Body, Vec<Opnd>), String> {
    let steps: Vec<usize> = (0..instrs.len())
        .filter(|&i| instrs[i].live && !matches!(instrs[i].step, Step::Leaf(_) | Step::MatMul(..)))
        .collect();
    let outputs: Vec<usize> = std::iter::once(output).chain(extras.iter().map(|e| e.0)).collect();
    plan_steps(instrs, &steps, &outputs, cols)
}

/// `steps` (in order) as a body whose outputs are the values of steps
/// `outputs`; what they read from other steps (leaves, the product,
/// earlier steps' scratch, row values along rows) are its arguments.
fn plan_steps(
    instrs: &[Instr],
    steps: &[usize],
    outputs: &[usize],
    cols: usize,
) -> std::result::Result<(Body, Vec<Opnd>), String> {
    let full = |c: Class| c == Class::Full || cols == 1;
    let mut inside = vec![false; instrs.len()];
    for &s in steps {
        inside[s] = true;
    }
    let mut b = Builder { instrs, inside, body: Body::default(), args: Vec::new(), arg_node: HashMap::new() };
    // The body node of each computed step.
    let mut node_of: Vec<Option<usize>> = vec![None; instrs.len()];
    for &i in steps {
        let ins = &instrs[i];
        let t = ty(ins.dtype).ok_or_else(|| format!("step {i} is {}", ins.dtype))?;
        if !full(ins.class) {
            return Err(format!("step {i} computes a row value"));
        }
        let node = match &ins.step {
            Step::Unary(op, a) => Node::Unary(*op, b.read(*a, &node_of)?),
            Step::Binary(op, x, y) => Node::Binary(*op, b.read(*x, &node_of)?, b.read(*y, &node_of)?),
            Step::Compare(op, x, y) => Node::Compare(*op, b.read(*x, &node_of)?, b.read(*y, &node_of)?),
            Step::Where(c, x, y) => {
                Node::Where(b.read(*c, &node_of)?, b.read(*x, &node_of)?, b.read(*y, &node_of)?)
            }
            Step::Cast(a) => Node::Cast(b.read(*a, &node_of)?),
            Step::Copy(a) => {
                node_of[i] = Some(b.read(*a, &node_of)?);
                continue;
            }
            Step::Reduce(op, _) => return Err(format!("step {i} reduces ({})", op.mnemonic())),
            Step::Leaf(_) | Step::MatMul(..) => return Err(format!("step {i} is a leaf")),
        };
        b.body.nodes.push((node, t));
        node_of[i] = Some(b.body.nodes.len() - 1);
    }
    for &o in outputs {
        if !full(instrs[o].class) {
            return Err("an output is a row value".into());
        }
        let n = node_of[o].ok_or("an output is a leaf or the product (a copy)")?;
        b.body.outputs.push(n);
    }
    if let Some(why) = b.body.unsupported() {
        return Err(why);
    }
    Ok((b.body, b.args))
}

/// The body being built from the steps.
struct Builder<'i> {
    instrs: &'i [Instr],
    /// Whether each step is compiled into the body (else it is read).
    inside: Vec<bool>,
    body: Body,
    args: Vec<Opnd>,
    /// The argument node of each (step, read per row).
    arg_node: HashMap<(usize, bool), usize>,
}

impl Builder<'_> {
    /// The body node that operand `o` reads: an argument for a step not
    /// compiled into the body (one per way it is read), else the step's node.
    fn read(&mut self, o: Opnd, node_of: &[Option<usize>]) -> std::result::Result<usize, String> {
        if !self.inside[o.slot] {
            if let Some(&n) = self.arg_node.get(&(o.slot, o.per_row)) {
                return Ok(n);
            }
            let src = &self.instrs[o.slot];
            let t = ty(src.dtype).ok_or_else(|| format!("an operand is {}", src.dtype))?;
            self.body.args.push(t);
            self.args.push(o);
            self.body.nodes.push((Node::Arg(self.body.args.len() - 1), t));
            self.arg_node.insert((o.slot, o.per_row), self.body.nodes.len() - 1);
            return Ok(self.body.nodes.len() - 1);
        }
        node_of[o.slot].ok_or_else(|| format!("step {} is not compiled before its reader", o.slot))
    }
}

/// A run of consecutive steps of a body that is not generated whole (a
/// reduction's): generated as one loop that writes the values later
/// steps read (to their scratch) or the output, so the interpreter's
/// passes between two reductions become one.
#[derive(Debug)]
pub(super) struct Segment {
    /// The first and one past the last step.
    pub start: usize,
    pub end: usize,
    /// The steps whose values it writes, in the body's output order.
    pub outputs: Vec<usize>,
    pub jit: Jit,
}

/// Whether step `ins` can be part of a segment under `codegen`.
fn fits(codegen: Codegen, instrs: &[Instr], ins: &Instr) -> bool {
    let f32s = |os: &[Opnd]| os.iter().all(|o| instrs[o.slot].dtype == DType::F32);
    let op_ok = match &ins.step {
        Step::Unary(op, a) => {
            codegen::unary_supported(*op)
                && f32s(&[*a])
                && (codegen == Codegen::All
                    || !matches!(
                        op,
                        crate::ir::UnaryOp::Exp | crate::ir::UnaryOp::Sigmoid | crate::ir::UnaryOp::Silu
                    ))
        }
        Step::Binary(op, a, b) => *op != crate::ir::BinaryOp::Pow && !op.float_only() && f32s(&[*a, *b]),
        Step::Compare(_, a, b) => f32s(&[*a, *b]),
        Step::Where(..) | Step::Cast(_) => true,
        _ => false,
    };
    ins.live && ins.class == Class::Full && ty(ins.dtype).is_some() && op_ok
}

/// The segments of a body that is not generated whole: maximal runs of
/// at least two computed steps that [`fits`] (leaves and steps no one
/// reads do not break a run; anything else does).
pub(super) fn segments(
    codegen: Codegen,
    node: NodeId,
    instrs: &[Instr],
    output: usize,
    extras: &[(usize, DType, Class)],
    cols: usize,
) -> Vec<Segment> {
    if codegen == Codegen::Off || !codegen::available() {
        return Vec::new();
    }
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); instrs.len()];
    for (i, ins) in instrs.iter().enumerate().filter(|(_, ins)| ins.live) {
        for o in ins.step.operands() {
            readers[o.slot].push(i);
        }
    }
    let mut out = Vec::new();
    let mut run: Vec<usize> = Vec::new();
    let passive = |ins: &Instr| !ins.live || matches!(ins.step, Step::Leaf(_) | Step::MatMul(..));
    for i in 0..=instrs.len() {
        let ins = instrs.get(i);
        if ins.is_some_and(passive) {
            continue;
        }
        if ins.is_some_and(|ins| fits(codegen, instrs, ins)) {
            run.push(i);
            continue;
        }
        if run.len() >= 2 {
            let (start, end) = (run[0], run[run.len() - 1] + 1);
            let outputs: Vec<usize> = run
                .iter()
                .copied()
                .filter(|&s| {
                    s == output || extras.iter().any(|e| e.0 == s) || readers[s].iter().any(|&r| r >= end)
                })
                .collect();
            match plan_steps(instrs, &run, &outputs, cols) {
                Ok((body, args)) => out.push(Segment {
                    start,
                    end,
                    outputs,
                    jit: Jit { body, args, kernels: Mutex::new(Vec::new()), failed: AtomicBool::new(false) },
                }),
                Err(why) => tracing::debug!(%node, start, reason = %why, "cpu codegen: segment interpreted"),
            }
        }
        run.clear();
    }
    out
}

impl Jit {
    /// The compiled body.
    pub(super) fn body(&self) -> &Body {
        &self.body
    }

    /// The interpreter operand each argument is.
    pub(super) fn args(&self) -> &[Opnd] {
        &self.args
    }

    /// Generated code for a kernel, if its body qualifies and this CPU runs it.
    pub(super) fn new(
        codegen: Codegen,
        node: NodeId,
        instrs: &[Instr],
        output: usize,
        extras: &[(usize, DType, Class)],
        cols: usize,
    ) -> Option<Jit> {
        if codegen == Codegen::Off {
            return None;
        }
        if !codegen::available() {
            tracing::debug!(%node, "cpu codegen: interpreted (this CPU has no SSE4.1 and FMA)");
            return None;
        }
        match plan(instrs, output, extras, cols) {
            Ok((body, _)) if codegen == Codegen::Measured && body.has_exp() => {
                tracing::debug!(%node, "cpu codegen: interpreted (exp is faster in the interpreter's AVX2 loop)");
                None
            }
            Ok((body, args)) => {
                Some(Jit { body, args, kernels: Mutex::new(Vec::new()), failed: AtomicBool::new(false) })
            }
            Err(why) => {
                tracing::debug!(%node, reason = %why, "cpu codegen: interpreted");
                None
            }
        }
    }

    /// The code for `modes`, made now if it is the first block to need it;
    /// `None` once generation failed.
    pub(super) fn kernel(&self, node: NodeId, modes: &[Mode]) -> Option<Arc<Kernel>> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let mut ks = self.kernels.lock().ok()?;
        if let Some((_, k)) = ks.iter().find(|(m, _)| m == modes) {
            return Some(k.clone());
        }
        match codegen::compile(&self.body, modes) {
            Ok(k) => {
                let k = Arc::new(k);
                ks.push((modes.to_vec(), k.clone()));
                Some(k)
            }
            Err(e) => {
                tracing::debug!(%node, error = %e, "cpu codegen failed; interpreted");
                self.failed.store(true, Ordering::Relaxed);
                None
            }
        }
    }
}

/// The address and read mode of operand `a` of element type `T` in a
/// block of shape `b`, checked against the block as the interpreter's
/// typed operands are.
pub(super) fn address<T: Elem>(a: Arg<'_>, b: Blk) -> Result<(*mut u8, Mode)> {
    let one = |h: HostSlice<'_>, s: usize| -> Result<*mut u8> {
        let v = h
            .typed::<T>()?
            .get(s)
            .ok_or_else(|| Error::Backend("cpu: fused operand past its storage".into()))?;
        Ok((v as *const T).cast_mut().cast())
    };
    let p = |x: &[T]| x.as_ptr().cast_mut().cast::<u8>();
    Ok(match (a, b.cols == 1) {
        (Arg::Splat(h, s), _) | (Arg::Cols(h, s), true) => (one(h, s)?, Mode::Splat),
        _ => match a.typed::<T>(b)? {
            TArg::Flat(x) => (p(x), Mode::Flat),
            TArg::Cols(x) => (p(x), Mode::Cols),
            TArg::PerRow(x) => (p(x), Mode::PerRow),
            TArg::Splat(_) => return Err(Error::Backend("cpu: fused operand mode".into())),
        },
    })
}

/// An output's address, checked to hold `len` elements of `ty`.
pub(super) fn out_address(o: Out<'_>, ty: Ty, len: usize) -> Result<*mut u8> {
    let short = || Error::Backend("cpu: fused output block too short".into());
    Ok(match ty {
        Ty::F32 => o.get::<f32>()?.get_mut(..len).ok_or_else(short)?.as_mut_ptr().cast(),
        Ty::Bool => o.get::<bool>()?.get_mut(..len).ok_or_else(short)?.as_mut_ptr().cast(),
    })
}

impl FusedKernel {
    /// Runs one block (`nb` rows, its leaves already resolved into
    /// `args`' sources by the interpreter) through generated code,
    /// writing `out` and `extras`. An argument for which `over` says
    /// `Some(j)` is read from output `j`'s block itself (0 `out`, `e + 1`
    /// `extras[e]`): the operand the output is written over, read flat at
    /// the output's type. `Ok(false)` when there is no code for this block
    /// (the caller interprets it).
    pub(super) fn jit_block<'a>(
        &self,
        jit: &Jit,
        arg: impl Fn(Opnd) -> Arg<'a>,
        over: impl Fn(Opnd) -> Option<usize>,
        nb: usize,
        mut out: Out<'_>,
        extras: &mut [Out<'_>],
    ) -> Result<bool> {
        let blk = Blk { rows: nb, cols: self.cols };
        let len = blk.len();
        // The outputs' addresses first: an argument may be one of them.
        let mut outs = Vec::with_capacity(1 + extras.len());
        let out_ty = jit.body.nodes[jit.body.outputs[0]].1;
        outs.push((out_address(out.reborrow(), out_ty, len)?, out_ty));
        for (e, &o) in extras.iter_mut().zip(&jit.body.outputs[1..]) {
            let ty = jit.body.nodes[o].1;
            outs.push((out_address(e.reborrow(), ty, len)?, ty));
        }
        let mut ptrs = Vec::with_capacity(jit.args.len() + outs.len());
        let mut modes = Vec::with_capacity(jit.args.len());
        for (&o, &t) in jit.args.iter().zip(&jit.body.args) {
            let (p, m) = match over(o) {
                Some(j) => match outs.get(j) {
                    Some(&(p, ty)) if ty == t => (p, Mode::Flat),
                    _ => {
                        return Err(Error::Backend(
                            "cpu: fused operand read from an output of another type".into(),
                        ))
                    }
                },
                None => match t {
                    Ty::F32 => address::<f32>(arg(o), blk)?,
                    Ty::Bool => address::<bool>(arg(o), blk)?,
                },
            };
            ptrs.push(p);
            modes.push(m);
        }
        let Some(kernel) = jit.kernel(self.node, &modes) else { return Ok(false) };
        ptrs.extend(outs.iter().map(|&(p, _)| p));
        // Without a row broadcast the block is one row: longer vector runs.
        let (rows, cols) = if modes.iter().any(|m| matches!(m, Mode::Cols | Mode::PerRow)) {
            (nb, self.cols)
        } else {
            (1, len)
        };
        // SAFETY: `address` checked every argument against this block as
        // its mode reads it (flat `nb * cols`, cols `cols`, per-row `nb`,
        // splat one element; flattening keeps the flat extent), bools are
        // Rust `bool`s, `out_address` checked `len` elements of each
        // output, and the outputs are this block's own `&mut` pieces, so
        // they overlap no argument but those read from an output, which
        // are that output exactly (the same address, type and flat
        // extent; no Rust reference to them is alive). Such an element is
        // read before it is overwritten: the generated loop loads every
        // argument of an element before it stores that element's outputs,
        // and each element is loaded and stored by one step of the loop
        // (`codegen/emit.rs`, `body_at`).
        unsafe { kernel.call(&ptrs, rows, cols)? };
        Ok(true)
    }
}

#[cfg(test)]
impl FusedKernel {
    /// How many sets of modes code was made for, for the whole body or
    /// all its segments (0 when interpreted).
    pub(crate) fn generated_kernels(&self) -> usize {
        let made = |j: &Jit| j.kernels.lock().map(|k| k.len()).unwrap_or(0);
        self.jit.iter().chain(self.segments.iter().map(|s| &s.jit)).map(made).sum()
    }

    /// The Cranelift IR made for the first run's modes: `None` when the
    /// body is interpreted or has not run.
    pub(crate) fn generated_ir(&self) -> Option<Result<cranelift_codegen::ir::Function>> {
        let jit = self.jit.as_ref()?;
        let modes = jit.kernels.lock().ok()?.first()?.0.clone();
        Some(codegen::ir(&jit.body, &modes))
    }

    /// [`FusedKernel::generated_ir`] of each generated segment, in order:
    /// `None` for a segment that has not run.
    pub(crate) fn segment_irs(&self) -> Vec<Option<Result<cranelift_codegen::ir::Function>>> {
        let first = |j: &Jit| j.kernels.lock().ok().and_then(|k| k.first().map(|(m, _)| m.clone()));
        self.segments.iter().map(|s| first(&s.jit).map(|modes| codegen::ir(&s.jit.body, &modes))).collect()
    }
}
