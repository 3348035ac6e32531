//! Cranelift IR for a [`Body`]: the row and column loops, the loads and
//! stores of each argument mode, and every supported op, once for four
//! lanes and once for one (the tail), with the same operations.

use super::{Body, Mode, Node, Ty};
use crate::ir::fast_math::{EXP_HI, EXP_LO, EXP_P, LN2_HI, LN2_LO, ROUND_MAGIC};
use crate::ir::{BinaryOp, CompareOp, UnaryOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{types, BlockArg, Endianness, Function, InstBuilder, MemFlags, Type, Value};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// Whether generated code has a bit-exact definition of `op`.
pub(crate) fn unary_supported(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(op, Neg | Abs | Sqrt | Rsqrt | Recip | Relu | Exp | Sigmoid | Silu)
}

/// Lanes per vector step.
pub(super) const LANES: i64 = 4;

/// Four lanes or one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum W {
    V4,
    S,
}

/// An emitter at one width: `bool`s are `i32x4` masks (all ones or zero)
/// at four lanes and `i8` 0/1 at one.
struct E<'a, 'b> {
    b: &'a mut FunctionBuilder<'b>,
    w: W,
}

fn arg(v: Value) -> BlockArg {
    BlockArg::Value(v)
}

/// Flags for bitcasts between vector types (Cranelift asks for a lane order).
fn lanes_flags() -> MemFlags {
    MemFlags::new().with_endianness(Endianness::Little)
}

impl E<'_, '_> {
    fn f(&self) -> Type {
        if self.w == W::V4 {
            types::F32X4
        } else {
            types::F32
        }
    }

    fn i(&self) -> Type {
        if self.w == W::V4 {
            types::I32X4
        } else {
            types::I32
        }
    }

    fn fconst_bits(&mut self, bits: u32) -> Value {
        let c = self.b.ins().f32const(Ieee32::with_bits(bits));
        if self.w == W::V4 {
            self.b.ins().splat(types::F32X4, c)
        } else {
            c
        }
    }

    fn fconst(&mut self, v: f32) -> Value {
        self.fconst_bits(v.to_bits())
    }

    fn iconst(&mut self, v: i32) -> Value {
        let c = self.b.ins().iconst(types::I32, i64::from(v));
        if self.w == W::V4 {
            self.b.ins().splat(types::I32X4, c)
        } else {
            c
        }
    }

    fn bits(&mut self, x: Value) -> Value {
        let (t, fl) = (self.i(), self.flags());
        self.b.ins().bitcast(t, fl, x)
    }

    fn float_of_bits(&mut self, x: Value) -> Value {
        let (t, fl) = (self.f(), self.flags());
        self.b.ins().bitcast(t, fl, x)
    }

    fn flags(&self) -> MemFlags {
        if self.w == W::V4 {
            lanes_flags()
        } else {
            MemFlags::new()
        }
    }

    /// `m ? a : b` on floats, `m` a bool of this width.
    fn sel(&mut self, m: Value, a: Value, b: Value) -> Value {
        if self.w == W::V4 {
            let m = self.b.ins().bitcast(types::F32X4, lanes_flags(), m);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(m, a, b)
        }
    }

    fn fcmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }

    /// `fast_math::clamp_nan`: NaN passes through.
    fn clamp_nan(&mut self, x: Value, lo: f32, hi: f32) -> Value {
        let (lo, hi) = (self.fconst(lo), self.fconst(hi));
        let above = self.fcmp(FloatCC::GreaterThan, x, hi);
        let x = self.sel(above, hi, x);
        let below = self.fcmp(FloatCC::LessThan, x, lo);
        self.sel(below, lo, x)
    }

    /// `fast_math::pow2i`.
    fn pow2i(&mut self, k: Value) -> Value {
        let c = self.iconst(127);
        let k = self.b.ins().iadd(k, c);
        let s = self.b.ins().ishl_imm(k, 23);
        self.float_of_bits(s)
    }

    /// `fast_math::exp_f32`, operation for operation.
    fn exp(&mut self, x: Value) -> Value {
        let x = self.clamp_nan(x, EXP_LO, EXP_HI);
        let (log2e, magic) = (self.fconst(std::f32::consts::LOG2_E), self.fconst(ROUND_MAGIC));
        let big = self.b.ins().fma(x, log2e, magic);
        let n = self.b.ins().fsub(big, magic);
        let bb = self.bits(big);
        let mb = self.iconst(ROUND_MAGIC.to_bits() as i32);
        let ni = self.b.ins().isub(bb, mb);
        let (nhi, nlo) = (self.fconst(-LN2_HI), self.fconst(-LN2_LO));
        let r = self.b.ins().fma(n, nhi, x);
        let r = self.b.ins().fma(n, nlo, r);
        let z = self.b.ins().fmul(r, r);
        let mut p = self.fconst(EXP_P[0]);
        for &c in &EXP_P[1..] {
            let c = self.fconst(c);
            p = self.b.ins().fma(p, r, c);
        }
        let e = self.b.ins().fma(p, z, r);
        let one = self.fconst(1.0);
        let e = self.b.ins().fadd(e, one);
        let n1 = self.b.ins().sshr_imm(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let (s1, s2) = (self.pow2i(n1), self.pow2i(n2));
        let e = self.b.ins().fmul(e, s1);
        self.b.ins().fmul(e, s2)
    }

    fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Rsqrt => {
                let s = self.b.ins().sqrt(x);
                let one = self.fconst(1.0);
                self.b.ins().fdiv(one, s)
            }
            UnaryOp::Recip => {
                let one = self.fconst(1.0);
                self.b.ins().fdiv(one, x)
            }
            UnaryOp::Relu => {
                let zero = self.fconst(0.0);
                let neg = self.fcmp(FloatCC::LessThan, x, zero);
                self.sel(neg, zero, x)
            }
            UnaryOp::Exp => self.exp(x),
            UnaryOp::Sigmoid | UnaryOp::Silu => {
                let m = self.b.ins().fneg(x);
                let e = self.exp(m);
                let one = self.fconst(1.0);
                let d = self.b.ins().fadd(one, e);
                let top = if op == UnaryOp::Sigmoid { one } else { x };
                self.b.ins().fdiv(top, d)
            }
            // `unsupported()` refused every other op before emission.
            _ => x,
        }
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        match op {
            BinaryOp::Add => self.b.ins().fadd(a, b),
            BinaryOp::Sub => self.b.ins().fsub(a, b),
            BinaryOp::Mul => self.b.ins().fmul(a, b),
            BinaryOp::Div => self.b.ins().fdiv(a, b),
            BinaryOp::Maximum | BinaryOp::Minimum => {
                // eval: NaN if either is; else `a > b ? a : b` (`<` for min).
                let cc = if op == BinaryOp::Maximum { FloatCC::GreaterThan } else { FloatCC::LessThan };
                let pick = self.fcmp(cc, a, b);
                let r = self.sel(pick, a, b);
                let uno = self.fcmp(FloatCC::Unordered, a, b);
                let nan = self.fconst_bits(f32::NAN.to_bits());
                self.sel(uno, nan, r)
            }
            // `unsupported()` refused `pow` and the activation gradients.
            BinaryOp::Pow | BinaryOp::GeluTanhGrad | BinaryOp::GeluGrad | BinaryOp::SiluGrad => a,
        }
    }

    fn compare(&mut self, op: CompareOp, a: Value, b: Value) -> Value {
        // Rust's float compares: ordered, except `!=` (true with a NaN).
        let cc = match op {
            CompareOp::Eq => FloatCC::Equal,
            CompareOp::Ne => FloatCC::NotEqual,
            CompareOp::Lt => FloatCC::LessThan,
            CompareOp::Le => FloatCC::LessThanOrEqual,
            CompareOp::Gt => FloatCC::GreaterThan,
            CompareOp::Ge => FloatCC::GreaterThanOrEqual,
        };
        self.fcmp(cc, a, b)
    }

    fn where_(&mut self, ty: Ty, c: Value, a: Value, b: Value) -> Value {
        match (ty, self.w) {
            (Ty::F32, _) => self.sel(c, a, b),
            (Ty::Bool, W::V4) => self.b.ins().bitselect(c, a, b),
            (Ty::Bool, W::S) => self.b.ins().select(c, a, b),
        }
    }

    /// `cast_elem`: bool to `1.0`/`0.0`, `f32` to bool as `!= 0` (NaN is true).
    fn cast(&mut self, from: Ty, to: Ty, x: Value) -> Value {
        match (from, to) {
            (Ty::Bool, Ty::F32) => {
                let (one, zero) = (self.fconst(1.0), self.fconst(0.0));
                self.sel(x, one, zero)
            }
            (Ty::F32, Ty::Bool) => {
                let zero = self.fconst(0.0);
                self.fcmp(FloatCC::NotEqual, x, zero)
            }
            _ => x,
        }
    }

    /// A bool of this width from its byte(s) at `addr`.
    fn load_bool(&mut self, addr: Value, off: i32) -> Value {
        let fl = MemFlags::new().with_notrap();
        if self.w == W::V4 {
            let four = self.b.ins().load(types::I32, fl, addr, off);
            let v = self.b.ins().scalar_to_vector(types::I32X4, four);
            let v = self.b.ins().bitcast(types::I8X16, lanes_flags(), v);
            let v = self.b.ins().uwiden_low(v);
            let v = self.b.ins().uwiden_low(v);
            let zero = self.iconst(0);
            self.b.ins().icmp(IntCC::NotEqual, v, zero)
        } else {
            let v = self.b.ins().load(types::I8, fl, addr, off);
            self.b.ins().icmp_imm(IntCC::NotEqual, v, 0)
        }
    }

    /// The value at `addr + off` bytes.
    fn load(&mut self, ty: Ty, addr: Value, off: i32) -> Value {
        match ty {
            Ty::F32 => {
                let t = self.f();
                self.b.ins().load(t, MemFlags::new().with_notrap(), addr, off)
            }
            Ty::Bool => self.load_bool(addr, off),
        }
    }

    /// `v` stored at `addr + off` bytes.
    fn store(&mut self, ty: Ty, v: Value, addr: Value, off: i32) {
        let fl = MemFlags::new().with_notrap();
        match (ty, self.w) {
            (Ty::F32, _) | (Ty::Bool, W::S) => {
                self.b.ins().store(fl, v, addr, off);
            }
            (Ty::Bool, W::V4) => {
                // Masks to 0/1, narrowed to four bytes.
                let one = self.iconst(1);
                let v = self.b.ins().band(v, one);
                let v = self.b.ins().snarrow(v, v);
                let v = self.b.ins().snarrow(v, v);
                let v = self.b.ins().bitcast(types::I32X4, lanes_flags(), v);
                let four = self.b.ins().extractlane(v, 0);
                self.b.ins().store(fl, four, addr, off);
            }
        }
    }

    /// A loaded scalar (`f32`, or `i8` 0/1) made a value of this width.
    fn widen_scalar(&mut self, ty: Ty, s: Value) -> Value {
        match (ty, self.w) {
            (_, W::S) => s,
            (Ty::F32, W::V4) => self.b.ins().splat(types::F32X4, s),
            (Ty::Bool, W::V4) => {
                let m = self.b.ins().bmask(types::I32, s);
                self.b.ins().splat(types::I32X4, m)
            }
        }
    }
}

/// Where each argument is read in the current row.
#[derive(Clone, Copy)]
enum At {
    /// The element at `base + c * size`.
    Base(Value),
    /// One value for the whole row: (four lanes, one lane).
    Value(Value, Value),
}

/// The loads, the body's nodes and the output stores for column `c + lane`
/// (`lane` an immediate offset in elements: the unrolled loop's second half).
fn body_at(e: &mut E<'_, '_>, body: &Body, at: &[At], outs: &[Value], c: Value, lane: i64) {
    let addr = |e: &mut E<'_, '_>, base: Value, ty: Ty| {
        let off = e.b.ins().imul_imm(c, ty.bytes());
        e.b.ins().iadd(base, off)
    };
    let mut vals: Vec<Value> = Vec::with_capacity(body.nodes.len());
    for &(node, ty) in &body.nodes {
        let ty_of = |o: usize| body.nodes[o].1;
        let v = match node {
            Node::Arg(k) => match at[k] {
                At::Base(base) => {
                    let a = addr(e, base, ty);
                    e.load(ty, a, (lane * ty.bytes()) as i32)
                }
                At::Value(v4, s) => {
                    if e.w == W::V4 {
                        v4
                    } else {
                        s
                    }
                }
            },
            Node::Unary(op, a) => e.unary(op, vals[a]),
            Node::Binary(op, a, b) => e.binary(op, vals[a], vals[b]),
            Node::Compare(op, a, b) => e.compare(op, vals[a], vals[b]),
            Node::Where(k, a, b) => e.where_(ty, vals[k], vals[a], vals[b]),
            Node::Cast(a) => e.cast(ty_of(a), ty, vals[a]),
        };
        vals.push(v);
    }
    for (&o, &base) in body.outputs.iter().zip(outs) {
        let ty = body.nodes[o].1;
        let a = addr(e, base, ty);
        e.store(ty, vals[o], a, (lane * ty.bytes()) as i32);
    }
}

/// A value read once (splat or per row) at `addr`: (four lanes, one).
fn once(b: &mut FunctionBuilder<'_>, ty: Ty, addr: Value) -> At {
    let fl = MemFlags::new().with_notrap();
    let s = match ty {
        Ty::F32 => b.ins().load(types::F32, fl, addr, 0),
        Ty::Bool => {
            let v = b.ins().load(types::I8, fl, addr, 0);
            b.ins().icmp_imm(IntCC::NotEqual, v, 0)
        }
    };
    let v4 = E { b, w: W::V4 }.widen_scalar(ty, s);
    At::Value(v4, s)
}

/// Builds the body's function into `func` (see the module docs of
/// [`super`] for its contract). `body` has passed `unsupported()`.
pub(super) fn build(func: &mut Function, body: &Body, modes: &[Mode], ptr: Type) {
    let mut fbc = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(func, &mut fbc);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let (ptrs, rows, cols) = {
        let p = b.block_params(entry);
        (p[0], p[1], p[2])
    };
    // The pointer array: aligned, and valid (the caller's contract).
    let pa: Vec<Value> = (0..body.args.len() + body.outputs.len())
        .map(|i| b.ins().load(ptr, MemFlags::trusted(), ptrs, (i * 8) as i32))
        .collect();
    let splats: Vec<Option<At>> = modes
        .iter()
        .zip(&body.args)
        .enumerate()
        .map(|(k, (&m, &ty))| (m == Mode::Splat).then(|| once(&mut b, ty, pa[k])))
        .collect();
    let row_head = b.create_block();
    let row_body = b.create_block();
    let uhead = b.create_block();
    let ubody = b.create_block();
    let vhead = b.create_block();
    let vbody = b.create_block();
    let thead = b.create_block();
    let tbody = b.create_block();
    let latch = b.create_block();
    let exit = b.create_block();
    let r = b.append_block_param(row_head, ptr);
    let cu = b.append_block_param(uhead, ptr);
    let cv = b.append_block_param(vhead, ptr);
    let ct = b.append_block_param(thead, ptr);
    let zero = b.ins().iconst(ptr, 0);
    b.ins().jump(row_head, &[arg(zero)]);

    b.switch_to_block(row_head);
    let more = b.ins().icmp(IntCC::UnsignedLessThan, r, rows);
    b.ins().brif(more, row_body, &[], exit, &[]);

    b.switch_to_block(row_body);
    let row0 = b.ins().imul(r, cols);
    let mut at = Vec::with_capacity(modes.len());
    for (k, (&m, &ty)) in modes.iter().zip(&body.args).enumerate() {
        at.push(match m {
            Mode::Splat => splats[k].unwrap_or(At::Base(pa[k])),
            Mode::Cols => At::Base(pa[k]),
            Mode::Flat => {
                let off = b.ins().imul_imm(row0, ty.bytes());
                At::Base(b.ins().iadd(pa[k], off))
            }
            Mode::PerRow => {
                let off = b.ins().imul_imm(r, ty.bytes());
                let a = b.ins().iadd(pa[k], off);
                once(&mut b, ty, a)
            }
        });
    }
    let outs: Vec<Value> = body
        .outputs
        .iter()
        .enumerate()
        .map(|(j, &o)| {
            let off = b.ins().imul_imm(row0, body.nodes[o].1.bytes());
            b.ins().iadd(pa[body.args.len() + j], off)
        })
        .collect();
    let uend = b.ins().band_imm(cols, !(2 * LANES - 1));
    let vend = b.ins().band_imm(cols, !(LANES - 1));
    b.ins().jump(uhead, &[arg(zero)]);

    // Eight columns an iteration (two vectors, the second at immediate
    // offsets), then four, then one at a time.
    b.switch_to_block(uhead);
    let more = b.ins().icmp(IntCC::UnsignedLessThan, cu, uend);
    b.ins().brif(more, ubody, &[], vhead, &[arg(cu)]);

    b.switch_to_block(ubody);
    body_at(&mut E { b: &mut b, w: W::V4 }, body, &at, &outs, cu, 0);
    body_at(&mut E { b: &mut b, w: W::V4 }, body, &at, &outs, cu, LANES);
    let next = b.ins().iadd_imm(cu, 2 * LANES);
    b.ins().jump(uhead, &[arg(next)]);

    b.switch_to_block(vhead);
    let more = b.ins().icmp(IntCC::UnsignedLessThan, cv, vend);
    b.ins().brif(more, vbody, &[], thead, &[arg(cv)]);

    b.switch_to_block(vbody);
    body_at(&mut E { b: &mut b, w: W::V4 }, body, &at, &outs, cv, 0);
    let next = b.ins().iadd_imm(cv, LANES);
    b.ins().jump(vhead, &[arg(next)]);

    b.switch_to_block(thead);
    let more = b.ins().icmp(IntCC::UnsignedLessThan, ct, cols);
    b.ins().brif(more, tbody, &[], latch, &[]);

    b.switch_to_block(tbody);
    body_at(&mut E { b: &mut b, w: W::S }, body, &at, &outs, ct, 0);
    let next = b.ins().iadd_imm(ct, 1);
    b.ins().jump(thead, &[arg(next)]);

    b.switch_to_block(latch);
    let next = b.ins().iadd_imm(r, 1);
    b.ins().jump(row_head, &[arg(next)]);

    b.switch_to_block(exit);
    b.ins().return_(&[]);
    b.seal_all_blocks();
    b.finalize();
}
