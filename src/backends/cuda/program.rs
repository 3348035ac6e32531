//! A lowered plan: every step's launches (generated kernels, cuBLAS GEMMs,
//! cuDNN convolutions and poolings, copies) with every pointer a symbolic
//! [`Loc`], the memory each region needs, and the streams and events of
//! the plan. Lowering is pure (`lower.rs`), so a program prints as text and
//! is snapshot-tested without a GPU; the executor binds the regions to
//! device memory per run, which is what lets one program run eagerly or be
//! captured once and replayed.

use super::codegen::Kernel;
use crate::ir::{DType, NodeId, PoolKind, Shape};
use std::fmt;

/// A region of device memory a launch reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// The plan's arena (the memory pass's offsets).
    Arena,
    /// Memory of the executable beyond the arena for values that outlive
    /// their step: values of plans without a memory plan.
    Scratch,
    /// Memory one step uses only while it runs, on stream `s`: operands
    /// made dense for a library, a GEMM's product before its epilogue,
    /// workspaces, extra outputs nothing reads. Every step of a stream
    /// starts at offset 0 again, so the region is as large as the largest
    /// step's need, not the sum of them all (GPT-2 small's f32 training
    /// step held 462 MB of scratch: 36 dense copies of 12.6 MB attention
    /// operands, each read by one GEMM): the steps of one stream run in
    /// order, and each stream has a region of its own.
    Transient(u32),
    /// Input slot `k` (the bound buffer, or its static copy in a graph).
    Input(u32),
    /// Output slot `k`: a fresh buffer per run (or per output set).
    Out(u32),
    /// The run's parameters: the seed, the random streams, index checks.
    Params,
    /// Arrival counters (u32) of kernels whose last block finishes the
    /// work of the others (the split-K GEMV): zeroed once when the
    /// executable is made, and every kernel that counts in them sets its
    /// counters back to zero before it ends, so each run (and each replay
    /// of a captured graph) finds them zero without a memset launch.
    Counters,
}

/// A byte offset into a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Which memory.
    pub region: Region,
    /// Bytes from its start.
    pub offset: u64,
}

impl Loc {
    /// `offset` bytes into `region`.
    pub fn new(region: Region, offset: u64) -> Loc {
        Loc { region, offset }
    }

    /// This location moved on by `bytes`.
    pub fn plus(self, bytes: u64) -> Loc {
        Loc { offset: self.offset + bytes, ..self }
    }
}

/// One strided, batched GEMM in cuBLAS's column-major terms:
/// `C[batch] (m x n) = op(A[batch]) (m x k) * op(B[batch]) (k x n)`.
/// A row-major kiln matmul `out = a . b` is `out^T = b^T . a^T`, so cuBLAS's
/// `A` is kiln's `b` and its `B` is kiln's `a`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Element type of A and B.
    pub dtype: DType,
    /// Element type of C: `dtype`, or f32 for an f16/bf16 product that
    /// is widened right away (the body `cast<f32>(a @ b)`): the GEMM then
    /// stores its f32 accumulator, skipping the round to the half type,
    /// the half-size scratch it would sit in and the cast kernel.
    pub out_dtype: DType,
    /// Whether A is transposed (`CUBLAS_OP_T`).
    pub transa: bool,
    /// Whether B is transposed.
    pub transb: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// A, its leading dimension and batch stride (elements).
    pub a: (Loc, usize, usize),
    /// B, its leading dimension and batch stride.
    pub b: (Loc, usize, usize),
    /// C, its leading dimension and batch stride.
    pub c: (Loc, usize, usize),
    /// Matrices in the batch.
    pub batch: usize,
    /// A bias (one value per row of C, i.e. per column of kiln's output)
    /// and a relu applied by cuBLASLt's epilogue, if any.
    pub epilogue: Epilogue,
    /// A residual laid out as C (its leading dimension and batch stride),
    /// added to the product by cuBLASLt (`D = A·B + 1·C`, C this matrix),
    /// before the bias, never under a relu. Only cuBLASLt reads it: the
    /// epilogue kernel lowered after the GEMM adds it when the GEMM runs
    /// on classic cuBLAS.
    pub residual: Option<Loc>,
    /// Whether float32 may use TF32 tensor cores (`Context::with_tf32`).
    pub tf32: bool,
}

/// What cuBLASLt applies to the product before it is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// The product as it is.
    None,
    /// `relu(product)`.
    Relu,
    /// `product + bias` (bias read densely from the location).
    Bias(Loc),
    /// `relu(product + bias)`.
    BiasRelu(Loc),
    /// `gelu_tanh(product)` (cuBLASLt's GELU is the tanh approximation).
    Gelu,
    /// `gelu_tanh(product + bias)`.
    BiasGelu(Loc),
}

impl Epilogue {
    /// Where the bias is read, if the epilogue adds one.
    pub fn bias(&self) -> Option<Loc> {
        match *self {
            Epilogue::Bias(b) | Epilogue::BiasRelu(b) | Epilogue::BiasGelu(b) => Some(b),
            Epilogue::None | Epilogue::Relu | Epilogue::Gelu => None,
        }
    }
}

/// A 4-d tensor for cuDNN: where it starts, its NCHW sizes and strides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor4 {
    /// First element.
    pub at: Loc,
    /// N, C, H, W.
    pub dims: [usize; 4],
    /// Strides (elements) of N, C, H, W.
    pub strides: [usize; 4],
}

/// A cuDNN forward convolution (cross-correlation, no bias).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv {
    /// Element type.
    pub dtype: DType,
    /// The input.
    pub x: Tensor4,
    /// The filter (dense OIHW).
    pub w: Tensor4,
    /// The output (dense NCHW).
    pub y: Tensor4,
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Zero padding (h, w).
    pub padding: [usize; 2],
    /// Dilation (h, w).
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
    /// Whether float32 may use TF32 tensor cores.
    pub tf32: bool,
}

/// A cuDNN pooling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Element type.
    pub dtype: DType,
    /// Max or average (padding counted).
    pub kind: PoolKind,
    /// The input.
    pub x: Tensor4,
    /// The output (dense).
    pub y: Tensor4,
    /// Window (h, w).
    pub kernel: [usize; 2],
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Padding (h, w).
    pub padding: [usize; 2],
}

/// One thing a step puts on its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// Generated kernel `kernel` (an index into [`Program::kernels`]) with
    /// these pointer arguments, in parameter order.
    Kernel {
        /// Which kernel.
        kernel: usize,
        /// Its pointer arguments.
        args: Vec<Loc>,
    },
    /// A cuBLAS (or cuBLASLt) GEMM.
    Gemm(Gemm),
    /// A cuDNN convolution.
    Conv(Conv),
    /// A cuDNN pooling.
    Pool(Pool),
    /// An NCCL collective (see `crate::dist`).
    Collective(CollectiveCall),
}

/// One NCCL call of the rank's communicator: `count` dense elements from
/// `src` combined across ranks into `dst` (which may be `src` for an
/// all-reduce or broadcast; the result holds
/// [`Collective::result_count`](crate::ir::Collective::result_count)
/// elements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveCall {
    /// What is computed.
    pub what: crate::ir::Collective,
    /// Element type.
    pub dtype: DType,
    /// Elements.
    pub count: usize,
    /// This rank's operand.
    pub src: Loc,
    /// The result.
    pub dst: Loc,
}

/// The launches of one plan node, on its stream, between its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The plan node (errors name it).
    pub node: NodeId,
    /// Its op's mnemonic (spans and errors).
    pub op: &'static str,
    /// The stream it runs on.
    pub stream: u32,
    /// Events to wait for first.
    pub waits: Vec<u32>,
    /// Events to record after.
    pub records: Vec<u32>,
    /// What it runs.
    pub launches: Vec<Launch>,
}

/// A gather or index_select whose indices are checked while it runs: its
/// status (two u64s at `status` in the parameter block) reports the first
/// bad position and its index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexCheck {
    /// The node, for the error.
    pub node: NodeId,
    /// `gather` or `index_select`.
    pub op: &'static str,
    /// The indexed dimension and its size.
    pub dim: usize,
    /// Size of that dimension.
    pub size: usize,
    /// Byte offset of the status in the parameter block.
    pub status: u64,
}

/// Where a graph output's buffer comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Output slot `slot`, read as `shape` (a dense buffer).
    Slot {
        /// The slot.
        slot: u32,
        /// The output's shape.
        shape: Shape,
        /// Its dtype.
        dtype: DType,
    },
    /// Input `k`'s buffer, handed back as it is (read as `shape`: a
    /// reshape of an input shares its bytes).
    Input {
        /// The input.
        k: u32,
        /// The output's shape.
        shape: Shape,
    },
    /// Input `k`'s allocation, which the run wrote the output over
    /// ([`crate::ir::Placement::OverInput`]): new bytes, read as `shape`.
    OverInput {
        /// The input.
        k: u32,
        /// The output's shape.
        shape: Shape,
        /// Its dtype.
        dtype: DType,
    },
}

/// A lowered plan (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// Distinct generated kernels.
    pub kernels: Vec<Kernel>,
    /// Launches on stream 0 before any step, e.g. outputs that are constants.
    pub prelude: Vec<Launch>,
    /// The steps, in schedule order.
    pub steps: Vec<Step>,
    /// Bytes of the arena.
    pub arena_bytes: u64,
    /// Bytes of scratch.
    pub scratch_bytes: u64,
    /// Bytes of each stream's [`Region::Transient`] (index: stream).
    pub transient_bytes: Vec<u64>,
    /// Bytes of the parameter block.
    pub params_bytes: u64,
    /// Bytes of [`Region::Counters`].
    pub counter_bytes: u64,
    /// Shape and dtype of every input slot the plan reads (`None`: a slot
    /// no live node reads, bound but ignored).
    pub inputs: Vec<Option<(Shape, DType)>>,
    /// Bytes of every output slot.
    pub out_slots: Vec<u64>,
    /// The graph outputs, in order.
    pub outputs: Vec<Output>,
    /// Streams the steps use.
    pub streams: u32,
    /// Events between streams.
    pub events: u32,
    /// Random streams the plan draws from (their numbers follow the seed in
    /// the parameter block).
    pub random_streams: usize,
    /// Input slots an output is written over (`Plan::donated`): a run
    /// writes into the bound buffer itself only when it holds the only
    /// reference to it, and into a private copy otherwise.
    pub donated: Vec<u32>,
    /// Index checks.
    pub checks: Vec<IndexCheck>,
    /// Plan nodes launched in multi-tensor kernels (launch group members).
    pub grouped: u64,
}

impl Program {
    /// Where stream `s`'s [`Region::Transient`] starts in the one block
    /// that holds every stream's, each 256-byte aligned.
    pub fn transient_base(&self, s: u32) -> u64 {
        self.transient_bytes.iter().take(s as usize).map(|b| b.next_multiple_of(256)).sum()
    }

    /// Bytes of the block that holds every stream's [`Region::Transient`].
    pub fn transient_total(&self) -> u64 {
        self.transient_base(self.transient_bytes.len() as u32)
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.region {
            Region::Arena => write!(f, "arena+{}", self.offset),
            Region::Scratch => write!(f, "scratch+{}", self.offset),
            Region::Transient(s) => write!(f, "transient{s}+{}", self.offset),
            Region::Input(k) => write!(f, "in{k}+{}", self.offset),
            Region::Out(k) => write!(f, "out{k}+{}", self.offset),
            Region::Params => write!(f, "params+{}", self.offset),
            Region::Counters => write!(f, "counters+{}", self.offset),
        }
    }
}

fn locs(args: &[Loc]) -> String {
    args.iter().map(Loc::to_string).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for Tensor4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?} strides {:?}", self.at, self.dims, self.strides)
    }
}

impl Launch {
    fn write(&self, f: &mut fmt::Formatter<'_>, kernels: &[Kernel]) -> fmt::Result {
        match self {
            Launch::Kernel { kernel, args } => {
                let k = &kernels[*kernel];
                if k.shared > 0 {
                    write!(f, "{}<<<{}, {}, {}>>>({})", k.name, k.grid, k.block, k.shared, locs(args))?;
                } else {
                    write!(f, "{}<<<{}, {}>>>({})", k.name, k.grid, k.block, locs(args))?;
                }
                for m in &k.maps {
                    write!(f, " {m}")?;
                }
                Ok(())
            }
            Launch::Gemm(g) => {
                let t = |b: bool| if b { "T" } else { "N" };
                write!(
                    f,
                    "gemm {} {}{} m={} n={} k={} batch={} A={} lda={} sA={} B={} ldb={} sB={} C={} ldc={} sC={}",
                    g.dtype,
                    t(g.transa),
                    t(g.transb),
                    g.m,
                    g.n,
                    g.k,
                    g.batch,
                    g.a.0,
                    g.a.1,
                    g.a.2,
                    g.b.0,
                    g.b.1,
                    g.b.2,
                    g.c.0,
                    g.c.1,
                    g.c.2
                )?;
                match &g.epilogue {
                    Epilogue::None => {}
                    Epilogue::Relu => write!(f, " epilogue=relu")?,
                    Epilogue::Bias(b) => write!(f, " epilogue=bias({b})")?,
                    Epilogue::BiasRelu(b) => write!(f, " epilogue=bias-relu({b})")?,
                    Epilogue::Gelu => write!(f, " epilogue=gelu-tanh")?,
                    Epilogue::BiasGelu(b) => write!(f, " epilogue=bias-gelu-tanh({b})")?,
                }
                if let Some(r) = &g.residual {
                    write!(f, " residual({r})")?;
                }
                if g.out_dtype != g.dtype {
                    write!(f, " out={}", g.out_dtype)?;
                }
                if g.tf32 {
                    write!(f, " tf32")?;
                }
                Ok(())
            }
            Launch::Conv(c) => write!(
                f,
                "conv2d {} x={} w={} y={} stride={:?} padding={:?} dilation={:?} groups={}{}",
                c.dtype,
                c.x,
                c.w,
                c.y,
                c.stride,
                c.padding,
                c.dilation,
                c.groups,
                if c.tf32 { " tf32" } else { "" }
            ),
            Launch::Collective(c) => {
                write!(f, "nccl {} {} count={} {} -> {}", c.what.mnemonic(), c.dtype, c.count, c.src, c.dst)?;
                match c.what {
                    crate::ir::Collective::Broadcast(root) => write!(f, " root={root}")?,
                    crate::ir::Collective::ReduceScatter { ranks, .. }
                    | crate::ir::Collective::AllGather { ranks } => write!(f, " ranks={ranks}")?,
                    crate::ir::Collective::AllReduce(_) => {}
                }
                Ok(())
            }
            Launch::Pool(p) => write!(
                f,
                "{} {} x={} y={} kernel={:?} stride={:?} padding={:?}",
                match p.kind {
                    PoolKind::Max => "max_pool2d",
                    PoolKind::Avg => "avg_pool2d",
                },
                p.dtype,
                p.x,
                p.y,
                p.kernel,
                p.stride,
                p.padding
            ),
        }
    }
}

impl Program {
    /// Kernels and library calls one run enqueues: the prelude's and every
    /// step's, as lowered (`exec.rs` launches a GEMM and the epilogue
    /// kernel after it as one cuBLASLt call where it can).
    pub fn launch_count(&self) -> u64 {
        (self.prelude.len() + self.steps.iter().map(|s| s.launches.len()).sum::<usize>()) as u64
    }
}

impl fmt::Display for Program {
    /// The launch list, then every kernel's source: what snapshots hold.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "program streams={} events={} arena={} scratch={} params={} inputs={} outputs={}",
            self.streams,
            self.events,
            self.arena_bytes,
            self.scratch_bytes,
            self.params_bytes,
            self.inputs.len(),
            self.outputs.len()
        )?;
        if self.counter_bytes > 0 {
            writeln!(f, "counters={}", self.counter_bytes)?;
        }
        if self.transient_bytes.iter().any(|&b| b > 0) {
            writeln!(f, "transient={:?}", self.transient_bytes)?;
        }
        for l in &self.prelude {
            write!(f, "prelude: ")?;
            l.write(f, &self.kernels)?;
            writeln!(f)?;
        }
        for s in &self.steps {
            write!(f, "{} ({}) s{}", s.node, s.op, s.stream)?;
            for w in &s.waits {
                write!(f, " wait=e{w}")?;
            }
            for r in &s.records {
                write!(f, " record=e{r}")?;
            }
            writeln!(f)?;
            for l in &s.launches {
                write!(f, "  ")?;
                l.write(f, &self.kernels)?;
                writeln!(f)?;
            }
        }
        for (i, o) in self.outputs.iter().enumerate() {
            match o {
                Output::Slot { slot, shape, dtype } => writeln!(f, "output {i}: out{slot} {dtype}{shape}")?,
                Output::Input { k, shape } => writeln!(f, "output {i}: in{k} as {shape}")?,
                Output::OverInput { k, shape, dtype } => {
                    writeln!(f, "output {i}: in{k} written over, {dtype}{shape}")?
                }
            }
        }
        for k in &self.kernels {
            writeln!(f, "\n// ---- {} ----", k.name)?;
            f.write_str(&k.source)?;
        }
        Ok(())
    }
}
