//! Machine code for fused bodies (Cranelift): the interpreter's one pass
//! per op over a block becomes one loop that computes every op of the
//! body element by element, four `f32` lanes at a time, and writes only
//! the outputs.
//!
//! # What is compiled
//!
//! A [`Body`]: arguments (a pointer each, read in one of four [`Mode`]s),
//! nodes in topological order (elementwise ops on `f32` and `bool`), and
//! outputs. The fused interpreter (`fused/jit.rs`) decides which bodies
//! qualify, when the plan is compiled, and builds a `Body` from its
//! steps; the argument modes depend on the layouts of a run's buffers, so
//! code is generated on the first run that meets a set of modes and kept
//! in memory with the kernel for every later run ([`Kernel`]).
//!
//! # The generated function
//!
//! `extern "C" fn(ptrs: *const *mut u8, rows: usize, cols: usize)`:
//! `ptrs` holds the arguments' pointers then the outputs'. It loops over
//! `rows` rows of `cols` elements; a row's columns run eight at a time
//! (two `f32x4` vectors, the second at immediate offsets, so the loop's
//! address arithmetic is shared; `bool` as `i32x4` masks), then four,
//! then the last `cols % 4` one at a time, with the same operations. Arguments read flat (`ptr[r*cols+c]`),
//! as one value (`ptr[0]`, loaded once), as a row broadcast over rows
//! (`ptr[c]`) or as a value per row (`ptr[r]`, loaded once per row).
//! Outputs are dense.
//!
//! # Semantics
//!
//! Bit for bit those of [`crate::ir::eval`] (the interpreter's element
//! functions): `+ - * /` and `sqrt` are IEEE in both; `maximum`/`minimum`
//! and `relu` are written as the same compares and selects (NaN wins,
//! ties take the second operand); `exp` is [`crate::ir::fast_math`]'s
//! Cephes kernel instruction for instruction, including its fused
//! multiply-adds, so generated code needs an FMA CPU ([`available`]).
//! Ops without such a definition here (`log`, `tanh`, `gelu`, `pow`,
//! integer and half types...) are not compiled: the kernel stays on the
//! interpreter, and the reason is logged (`tracing`, debug level).
//!
//! # Memory
//!
//! Each [`Kernel`] owns its `JITModule` (a few pages of executable
//! memory) and frees it when dropped; a call holds the kernel, so code is
//! never freed while it runs.

mod emit;

pub(crate) use emit::unary_supported;

use crate::ir::{BinaryOp, CompareOp, UnaryOp};
use crate::{Error, Result};
use cranelift_codegen::ir::{AbiParam, Signature};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use std::sync::{Mutex, OnceLock};

/// Which fused bodies run as generated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codegen {
    /// None: the interpreter alone (`KILN_CPU_CODEGEN=0`).
    Off,
    /// Those measured faster generated (the default): every body that
    /// qualifies except those with `exp` (and `sigmoid`, `silu`). Cranelift's
    /// x86 vectors are 128 bits, the interpreter's `exp` loop is AVX2 (8
    /// lanes): `exp(x/2) * sigmoid(y) + z` on 1M `f32` took 3.33 ms
    /// generated against 2.00 interpreted (4K: 16.7 against 12.7 us), while
    /// the AdamW update took 1.35 ms against 2.20 (4K: 18.6 against 23.1 us).
    Measured,
    /// Every body that qualifies (`KILN_CPU_CODEGEN=all`; tests).
    All,
}

/// What the environment asks for (so `CpuBackend::default()` is `new()`).
impl Default for Codegen {
    fn default() -> Codegen {
        Codegen::from_env()
    }
}

impl Codegen {
    /// `KILN_CPU_CODEGEN`: `0`/`off`, `all`, else (or unset) measured.
    pub(crate) fn from_env() -> Codegen {
        match std::env::var("KILN_CPU_CODEGEN").as_deref() {
            Ok("0") | Ok("off") => Codegen::Off,
            Ok("all") => Codegen::All,
            _ => Codegen::Measured,
        }
    }
}

/// The element types generated code handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Ty {
    F32,
    /// Rust's `bool`: one byte, 0 or 1.
    Bool,
}

impl Ty {
    fn bytes(self) -> i64 {
        match self {
            Ty::F32 => 4,
            Ty::Bool => 1,
        }
    }
}

/// How an argument is read (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// `ptr[r * cols + c]`.
    Flat,
    /// `ptr[0]` everywhere.
    Splat,
    /// `ptr[c]`: the same row for every row.
    Cols,
    /// `ptr[r]`: one value per row.
    PerRow,
}

/// One node of a [`Body`]; operands are earlier nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    /// Argument `k`.
    Arg(usize),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    /// On `f32` operands; the node is `bool`.
    Compare(CompareOp, usize, usize),
    Where(usize, usize, usize),
    /// To the node's type from the operand's.
    Cast(usize),
}

/// A body to compile: argument types, nodes (with their types) and the
/// nodes whose values are written, in output order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Body {
    pub args: Vec<Ty>,
    pub nodes: Vec<(Node, Ty)>,
    pub outputs: Vec<usize>,
}

impl Body {
    /// Whether the body computes `exp` (alone or in `sigmoid`/`silu`),
    /// which [`Codegen::Measured`] leaves to the interpreter.
    pub(crate) fn has_exp(&self) -> bool {
        self.nodes
            .iter()
            .any(|(n, _)| matches!(n, Node::Unary(UnaryOp::Exp | UnaryOp::Sigmoid | UnaryOp::Silu, _)))
    }

    /// Why `self` cannot be compiled, if it cannot: an op or a type this
    /// module has no bit-exact definition for, or a malformed body (an
    /// operand that is not an earlier node, an argument out of range).
    /// Checked before any code is generated.
    pub(crate) fn unsupported(&self) -> Option<String> {
        for (i, &(node, ty)) in self.nodes.iter().enumerate() {
            let earlier = |o: usize| o < i;
            let ty_of = |o: usize| self.nodes[o].1;
            let why = match node {
                Node::Arg(k) if k >= self.args.len() => Some(format!("argument {k} out of range")),
                Node::Arg(k) if self.args[k] != ty => Some(format!("argument {k} read as {ty:?}")),
                Node::Arg(_) => None,
                Node::Unary(op, a) if !earlier(a) => Some(format!("{} reads a later node", op.mnemonic())),
                Node::Unary(op, a) => (!emit::unary_supported(op) || ty != Ty::F32 || ty_of(a) != Ty::F32)
                    .then(|| format!("{} on {ty:?}", op.mnemonic())),
                Node::Binary(op, a, b) if !earlier(a) || !earlier(b) => {
                    Some(format!("{} reads a later node", op.mnemonic()))
                }
                Node::Binary(op, a, b) => (op == BinaryOp::Pow
                    || op.float_only()
                    || ty != Ty::F32
                    || ty_of(a) != Ty::F32
                    || ty_of(b) != Ty::F32)
                    .then(|| format!("{} on {ty:?}", op.mnemonic())),
                Node::Compare(_, a, b) if !earlier(a) || !earlier(b) => {
                    Some("a compare reads a later node".into())
                }
                Node::Compare(_, a, b) => (ty != Ty::Bool || ty_of(a) != Ty::F32 || ty_of(b) != Ty::F32)
                    .then(|| "a compare of non-f32 operands".into()),
                Node::Where(c, a, b) if !earlier(c) || !earlier(a) || !earlier(b) => {
                    Some("a where reads a later node".into())
                }
                Node::Where(c, a, b) => (ty_of(c) != Ty::Bool || ty_of(a) != ty || ty_of(b) != ty)
                    .then(|| "a where of mismatched types".into()),
                Node::Cast(a) if !earlier(a) => Some("a cast reads a later node".into()),
                Node::Cast(a) => {
                    (ty_of(a) == Ty::Bool && ty == Ty::Bool).then(|| "a bool to bool cast".into())
                }
            };
            if why.is_some() {
                return why;
            }
        }
        if self.outputs.is_empty() {
            return Some("no outputs".into());
        }
        if let Some(&o) = self.outputs.iter().find(|&&o| o >= self.nodes.len()) {
            return Some(format!("output node {o} out of range"));
        }
        None
    }
}

/// Whether this CPU can run generated code: x86-64 with SSE4.1 (the
/// lane inserts and blends) and FMA (`exp`'s fused multiply-adds, which
/// must be single instructions to match the interpreter's bits), and
/// Cranelift knows the host.
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // Miri cannot run machine code made at run time.
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            is_x86_feature_detected!("sse4.1") && is_x86_feature_detected!("fma") && isa().is_ok()
        }
        #[cfg(any(not(target_arch = "x86_64"), miri))]
        {
            false
        }
    })
}

/// The host's ISA, optimizing for speed.
fn isa() -> Result<OwnedTargetIsa> {
    let err = |m: String| Error::Backend(format!("cpu codegen: {m}"));
    let mut flags = settings::builder();
    for (k, v) in [("opt_level", "speed"), ("is_pic", "false"), ("use_colocated_libcalls", "false")] {
        flags.set(k, v).map_err(|e| err(format!("setting {k}: {e}")))?;
    }
    let host = cranelift_native::builder().map_err(|e| err(e.to_string()))?;
    host.finish(settings::Flags::new(flags)).map_err(|e| err(e.to_string()))
}

/// The generated function's type.
type KernelFn = unsafe extern "C" fn(*const *mut u8, usize, usize);

/// A compiled body for one set of argument modes.
pub(crate) struct Kernel {
    f: KernelFn,
    args: usize,
    outputs: usize,
    /// Owns the code `f` points into; freed on drop.
    module: Mutex<Option<Owned>>,
}

/// A `JITModule` moved between threads. After `compile` it is never used
/// again except to free its memory when the kernel drops.
struct Owned(JITModule);

// SAFETY: `JITModule` is not `Send` only because its memory provider is a
// `Box<dyn JITMemoryProvider>` without a `Send` bound. The provider used
// here is cranelift-jit's default (`SystemMemoryProvider`): mmap'd pages
// and bookkeeping `Vec`s, with no thread-local or thread-affine state. The
// module is only ever touched behind the kernel's `Mutex`, once, to free
// those pages (`Kernel::drop`), which any thread may do.
unsafe impl Send for Owned {}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({} args, {} outputs)", self.args, self.outputs)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(Owned(m)) = self.module.get_mut().ok().and_then(|m| m.take()) {
            // SAFETY: `f` is the only pointer into the module's code; it
            // is a private field of `self`, and every call borrows `self`,
            // so no call is running and none can start after this drop.
            unsafe { m.free_memory() };
        }
    }
}

impl Kernel {
    /// Runs the body over `rows` rows of `cols` elements.
    ///
    /// # Safety
    ///
    /// `ptrs` holds the body's arguments then its outputs. For `rows` rows
    /// of `cols` columns, each argument must be valid for reads, and each
    /// output for writes, of every element its mode addresses (flat:
    /// `rows * cols`, splat: 1, cols: `cols`, per-row: `rows` elements of
    /// its type), a `bool` argument must hold only 0 or 1, and no output
    /// may overlap another output or an argument other than one that is
    /// read flat at the same address (read before written per element).
    pub(crate) unsafe fn call(&self, ptrs: &[*mut u8], rows: usize, cols: usize) -> Result<()> {
        if ptrs.len() != self.args + self.outputs {
            return Err(Error::Backend(format!(
                "cpu codegen: {} pointers for {} arguments and {} outputs",
                ptrs.len(),
                self.args,
                self.outputs
            )));
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        // SAFETY: the code was generated for exactly this many pointers
        // (checked above) with the modes it was compiled for; the caller
        // guarantees the memory they address.
        unsafe { (self.f)(ptrs.as_ptr(), rows, cols) };
        Ok(())
    }
}

/// The generated function's signature (System V on x86-64).
fn signature(isa: &dyn cranelift_codegen::isa::TargetIsa) -> Signature {
    let mut sig = Signature::new(CallConv::triple_default(isa.triple()));
    let p = isa.pointer_type();
    for _ in 0..3 {
        sig.params.push(AbiParam::new(p));
    }
    sig
}

/// The Cranelift IR of `body` for argument `modes`, unoptimized (what a
/// snapshot shows).
#[cfg(test)]
pub(crate) fn ir(body: &Body, modes: &[Mode]) -> Result<cranelift_codegen::ir::Function> {
    use cranelift_codegen::ir::{types, Function, UserFuncName};
    check(body, modes)?;
    let isa = isa()?;
    let mut func = Function::with_name_signature(UserFuncName::user(0, 0), signature(&*isa));
    emit::build(&mut func, body, modes, types::I64);
    Ok(func)
}

fn check(body: &Body, modes: &[Mode]) -> Result<()> {
    if let Some(why) = body.unsupported() {
        return Err(Error::Backend(format!("cpu codegen: {why}")));
    }
    if modes.len() != body.args.len() {
        return Err(Error::Backend(format!(
            "cpu codegen: {} modes for {} arguments",
            modes.len(),
            body.args.len()
        )));
    }
    Ok(())
}

/// Compiles `body` for argument `modes` to machine code. A body that
/// [`Body::unsupported`] refuses is an error before any code is made.
pub(crate) fn compile(body: &Body, modes: &[Mode]) -> Result<Kernel> {
    check(body, modes)?;
    if !available() {
        return Err(Error::Backend("cpu codegen: this CPU has no SSE4.1 and FMA".into()));
    }
    let _span =
        tracing::debug_span!("cpu_codegen", nodes = body.nodes.len(), args = body.args.len()).entered();
    let err = |m: String| Error::Backend(format!("cpu codegen: {m}"));
    let isa = isa()?;
    let ptr = isa.pointer_type();
    let mut module = JITModule::new(JITBuilder::with_isa(isa, cranelift_module::default_libcall_names()));
    let mut ctx = module.make_context();
    ctx.func.signature = signature(module.isa());
    emit::build(&mut ctx.func, body, modes, ptr);
    let id = module
        .declare_function("fused", Linkage::Local, &ctx.func.signature)
        .map_err(|e| err(e.to_string()))?;
    module.define_function(id, &mut ctx).map_err(|e| err(format!("{e:?}")))?;
    module.clear_context(&mut ctx);
    module.finalize_definitions().map_err(|e| err(e.to_string()))?;
    let code = module.get_finalized_function(id);
    // SAFETY: `code` is the entry of the function just defined with
    // `signature()` (three pointer-sized integers, no result, the host's
    // C convention), which is `KernelFn`; the module that owns the code
    // moves into the returned kernel with it.
    let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
    Ok(Kernel {
        f,
        args: body.args.len(),
        outputs: body.outputs.len(),
        module: Mutex::new(Some(Owned(module))),
    })
}
