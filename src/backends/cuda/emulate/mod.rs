//! A CPU emulation of the CUDA backend, for developing it without a GPU
//! (feature `cuda-emulator`; needs g++).
//!
//! It runs exactly what the CUDA backend would run: the plan is lowered to
//! the same [`Program`] and the same generated kernels, compiled with g++
//! against `kernels/emulate.h` (a block's threads are fibers that meet at
//! barriers and exchange through warp shuffles; a barrier some thread
//! skips fails the launch), and the library calls are carried out
//! by straightforward loops from their descriptors (`library.rs`), which
//! also checks the transposes, leading dimensions and strides lowering
//! chose. Memory regions start filled with `0xff` bytes (NaN), so an
//! element nothing wrote shows up. The op suite runs on it with
//! `KILN_TEST_EMULATE=1 cargo test --features cuda-emulator --test ops`.
//!
//! CUDA graphs are emulated too (`graphs.rs`): a plan's second run
//! "captures" an output set and later runs "replay" it, reading inputs from
//! static slots that are copied only when the replay bookkeeping shared
//! with the GPU (`replay.rs`) says so, and writing outputs into the set's
//! buffers, which the user may still hold. So a wrong replay decision
//! gives wrong values here as it does on the GPU.
//!
//! What it cannot check: speed, races between real threads of a warp,
//! streams running concurrently, cuBLAS/cuDNN themselves.

mod graphs;
mod library;

use super::codegen::{INCLUDE, KILN_CUH};
use super::program::{Launch, Loc, Output, Program, Region};
use crate::backends::cpu::CpuBackend;
use crate::backends::{Backend, Buffer, CompileOptions, DeviceStats, Executable, RngArgs};
use crate::ir::{DType, HostData, Plan, Shape};
use crate::{Error, Result};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The emulator's C++ shim.
const EMULATE_H: &str = include_str!("../../../../kernels/emulate.h");

/// The CUDA backend's programs, run on the CPU (see the module docs).
#[derive(Debug, Default)]
pub struct EmulatedCuda {
    cpu: CpuBackend,
}

impl EmulatedCuda {
    /// A new emulated device.
    pub fn new() -> EmulatedCuda {
        EmulatedCuda { cpu: CpuBackend::new() }
    }
}

impl Backend for EmulatedCuda {
    fn name(&self) -> &'static str {
        "cuda-emulated"
    }

    fn upload(&self, data: HostData, shape: &Shape) -> Result<Buffer> {
        self.cpu.upload(data, shape)
    }

    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        self.cpu.download(buffer)
    }

    fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>> {
        self.compile_with(plan, &CompileOptions::default())
    }

    fn join_group(&self, joining: crate::dist::Joining) -> Result<()> {
        self.cpu.join_group(joining)
    }

    fn member(&self) -> Option<crate::dist::Joining> {
        self.cpu.member()
    }

    fn compile_with(&self, plan: Arc<Plan>, options: &CompileOptions) -> Result<Arc<dyn Executable>> {
        let program = super::lower(&plan, options.tf32)?;
        let library = build(&program)?;
        let graphs = graphs::Graphs::new(program.inputs.len(), options.cuda_graphs, self.cpu.stats());
        Ok(Arc::new(Emulated { program, library, cpu: self.cpu.clone(), graphs: Mutex::new(graphs) }))
    }

    fn stats(&self) -> Arc<DeviceStats> {
        self.cpu.stats()
    }
}

/// A compiled program: its kernels in one shared library, and the replay
/// state a CUDA executable would have (`graphs.rs`).
struct Emulated {
    program: Program,
    library: Option<libloading::Library>,
    cpu: CpuBackend,
    graphs: Mutex<graphs::Graphs>,
}

/// 256-byte aligned bytes, filled with `0xff`.
struct Region256 {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Region256 {
    fn new(bytes: u64) -> Result<Region256> {
        let size = usize::try_from(bytes.max(1)).map_err(|_| Error::OutOfMemory(format!("{bytes} bytes")))?;
        let layout = std::alloc::Layout::from_size_align(size, 256)
            .map_err(|_| Error::OutOfMemory(format!("{bytes} bytes")))?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory(format!("emulator: {bytes} bytes")));
        }
        // SAFETY: `size` bytes were just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0xff, size) };
        Ok(Region256 { ptr, layout })
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Copies `bytes` to the start of the region.
    fn fill(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > self.layout.size() {
            return Err(Error::Backend(format!(
                "emulator: {} bytes into a region of {}",
                bytes.len(),
                self.layout.size()
            )));
        }
        // SAFETY: the region has at least `bytes.len()` bytes (checked).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr, bytes.len()) };
        Ok(())
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: allocated with this layout, initialized.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
}

// SAFETY: the region is plain heap bytes this value owns; the emulator
// reaches it from one thread at a time (under the executable's lock).
unsafe impl Send for Region256 {}

impl Drop for Region256 {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// The emulator's global state (barriers, grid size) admits one launch at a time.
static LAUNCH: Mutex<()> = Mutex::new(());

type LaunchFn = unsafe extern "C" fn(i32, u32, u32, *mut *mut std::ffi::c_void) -> i32;

impl Executable for Emulated {
    fn donated(&self) -> &[u32] {
        &self.program.donated
    }

    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
        self.run_bound(inputs, false, rng)
    }

    fn launch_owned(&self, inputs: Vec<Buffer>, rng: &RngArgs) -> Result<crate::backends::Launched> {
        let outputs = self.run_bound(&inputs, true, rng)?;
        Ok(crate::backends::Launched { outputs, done: crate::runtime::Completion::done() })
    }
}

impl Emulated {
    /// A run; `owned` when the caller gave the inputs up (see
    /// `Executable::launch_owned`), which a replay needs to write over a
    /// donated input's slot without copying it in, as on the GPU.
    fn run_bound(&self, inputs: &[Buffer], owned: bool, rng: &RngArgs) -> Result<Vec<Buffer>> {
        let p = &self.program;
        if inputs.len() != p.inputs.len() {
            return Err(Error::Backend(format!("emulator: {} inputs for {}", inputs.len(), p.inputs.len())));
        }
        for (b, want) in inputs.iter().zip(&p.inputs) {
            let Some((shape, dtype)) = want else { continue };
            if b.shape() != shape || b.dtype() != *dtype {
                return Err(Error::Backend(format!(
                    "emulator: an input is {}{} but the plan expects {dtype}{shape}",
                    b.dtype(),
                    b.shape()
                )));
            }
        }
        let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        graphs.run(self, inputs, owned, rng)
    }
}

impl Emulated {
    /// A region holding input `k`'s bytes (a placeholder for an input the
    /// program does not read).
    fn input_region(&self, k: usize, b: &Buffer) -> Result<Region256> {
        if self.program.inputs[k].is_none() {
            return Region256::new(8);
        }
        let bytes = host_bytes(&self.cpu.download(b)?);
        let r = Region256::new(bytes.len() as u64)?;
        r.fill(&bytes)?;
        Ok(r)
    }

    /// Fresh output regions, one per slot (filled with `0xff`).
    fn out_regions(&self) -> Result<Vec<Region256>> {
        self.program.out_slots.iter().map(|&b| Region256::new(b)).collect()
    }

    /// Runs the program once over `ins` and `outs` with a fresh arena,
    /// scratch and parameter block, and turns a failed index check into
    /// the CPU backend's error.
    fn execute(&self, ins: &[&Region256], outs: &[Region256], rng: &RngArgs) -> Result<()> {
        let p = &self.program;
        let arena = Region256::new(p.arena_bytes)?;
        let scratch = Region256::new(p.scratch_bytes)?;
        let transient = Region256::new(p.transient_total())?;
        let params = Region256::new(p.params_bytes.max(8))?;
        // Zero, as the GPU's are when its executable is made; checked below
        // to be zero again after the run, as the next run relies on.
        let counters = Region256::new(p.counter_bytes)?;
        counters.fill(&vec![0; p.counter_bytes as usize])?;
        let mut block: Vec<u64> = vec![rng.seed];
        block.extend(rng.streams.iter().take(p.random_streams));
        block.resize(1 + p.random_streams, 0);
        for _ in &p.checks {
            block.extend([u64::MAX, 0]);
        }
        // SAFETY: the parameter region has params_bytes >= 8 * block.len().
        unsafe { std::ptr::copy_nonoverlapping(block.as_ptr(), params.ptr as *mut u64, block.len()) };
        let resolve = |l: Loc| -> u64 {
            let base = match l.region {
                Region::Arena => arena.addr(),
                Region::Scratch => scratch.addr(),
                Region::Transient(s) => transient.addr() + p.transient_base(s),
                Region::Params => params.addr(),
                Region::Counters => counters.addr(),
                Region::Input(k) => ins.get(k as usize).map_or(0, |r| r.addr()),
                Region::Out(k) => outs.get(k as usize).map_or(0, Region256::addr),
            };
            base + l.offset
        };
        let launches = p.prelude.iter().chain(p.steps.iter().flat_map(|s| s.launches.iter()));
        for l in launches {
            self.launch(l, &resolve)?;
        }
        self.cpu.stats().launches.fetch_add(p.launch_count(), std::sync::atomic::Ordering::Relaxed);
        self.cpu.stats().grouped_nodes.fetch_add(p.grouped, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the region holds counter_bytes bytes (at least 1 allocated).
        let left = unsafe { std::slice::from_raw_parts(counters.ptr as *const u8, p.counter_bytes as usize) };
        if let Some(at) = left.iter().position(|&b| b != 0) {
            return Err(Error::Backend(format!(
                "cuda-emulated: a kernel left its arrival counter at counters+{} set (every kernel must reset its counters)",
                at / 4 * 4
            )));
        }
        let status: &[u64] =
            // SAFETY: the parameter region holds `block.len()` u64s.
            unsafe { std::slice::from_raw_parts(params.ptr as *const u64, block.len()) };
        for c in &p.checks {
            let at = (c.status / 8) as usize;
            if status[at] != u64::MAX {
                return Err(Error::Runtime(format!(
                    "{} index {} is out of range for dim {} of size {} (node {})",
                    c.op,
                    status[at + 1] as i64,
                    c.dim,
                    c.size,
                    c.node
                )));
            }
        }
        Ok(())
    }

    /// The outputs of an eager run: fresh buffers.
    fn fresh_outputs(
        &self,
        inputs: &[Buffer],
        ins: &[&Region256],
        outs: &[Region256],
    ) -> Result<Vec<Buffer>> {
        self.program
            .outputs
            .iter()
            .map(|o| match o {
                Output::Input { k, shape } => {
                    let data = self.cpu.download(&inputs[*k as usize])?;
                    self.cpu.upload(data, shape)
                }
                // The input's region is the emulator's copy of its bytes:
                // the write over it never reaches the caller's buffer.
                Output::OverInput { k, shape, dtype } => {
                    let data = from_bytes(ins[*k as usize].bytes(), shape.numel(), *dtype);
                    self.cpu.upload(data, shape)
                }
                Output::Slot { slot, shape, dtype } => {
                    let data = from_bytes(outs[*slot as usize].bytes(), shape.numel(), *dtype);
                    self.cpu.upload(data, shape)
                }
            })
            .collect()
    }

    fn launch(&self, l: &Launch, resolve: &dyn Fn(Loc) -> u64) -> Result<()> {
        match l {
            Launch::Kernel { kernel, args } => {
                let lib = self
                    .library
                    .as_ref()
                    .ok_or_else(|| Error::Backend("emulator: no kernels built".into()))?;
                let k = &self.program.kernels[*kernel];
                if !k.maps.is_empty() {
                    return Err(Error::Backend(format!(
                        "emulator: {} loads through TMA tensor maps, which only an sm_90 GPU has",
                        k.name
                    )));
                }
                let mut ptrs: Vec<*mut std::ffi::c_void> =
                    args.iter().map(|&a| resolve(a) as *mut _).collect();
                let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
                // SAFETY: the symbol has this signature (written by `build`);
                // every pointer is into a region lowering sized for it.
                let rc = unsafe {
                    let f: libloading::Symbol<LaunchFn> =
                        lib.get(b"kiln_emu_launch").map_err(|e| Error::Backend(format!("emulator: {e}")))?;
                    f(*kernel as i32, k.grid, k.block, ptrs.as_mut_ptr())
                };
                if rc != 0 {
                    let why = match rc {
                        1 => "a block size outside 1..=1024",
                        2 => "no memory for the block's fiber stacks",
                        3 => "no such kernel in the library",
                        4 => "threads of a block wait at a barrier some thread never reaches (a GPU would hang)",
                        _ => "an unknown status",
                    };
                    return Err(Error::Backend(format!(
                        "emulator: launching {} ({} blocks of {}) failed: {why} ({rc})",
                        k.name, k.grid, k.block
                    )));
                }
                Ok(())
            }
            Launch::Gemm(g) => library::gemm(g, resolve),
            Launch::Conv(c) => library::conv(c, resolve),
            Launch::Pool(p) => library::pool(p, resolve),
            Launch::Collective(c) => {
                let member = self.cpu.member().ok_or_else(|| {
                    Error::Backend("emulator: a collective in a plan of a device in no process group".into())
                })?;
                let size = c.dtype.size();
                let n = c.count * size;
                let out = c.what.result_count(c.count);
                // SAFETY: lowering sized the operand for `count` elements of
                // the dtype and the result for `result_count` (checked by
                // `bounds.rs`); they do not overlap the host result copied
                // out of the exchange.
                let src = unsafe { std::slice::from_raw_parts(resolve(c.src) as *const u8, n) };
                let sent = from_bytes(src, c.count, c.dtype);
                let got = member.host.exchange(member.rank, c.what, &Shape::new([c.count]), sent)?;
                let bytes = host_bytes(&got);
                // A reduce-scatter's rank takes its chunk of the shared result.
                let at = c.what.result_offset(member.rank, out) * size;
                let mine = bytes.get(at..at + out * size).ok_or_else(|| {
                    Error::Backend(format!(
                        "emulator: {} returned {} bytes, rank {} needs {at}..{}",
                        c.what.mnemonic(),
                        bytes.len(),
                        member.rank,
                        at + out * size
                    ))
                })?;
                // SAFETY: as above; `mine` holds exactly `out * size` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(mine.as_ptr(), resolve(c.dst) as *mut u8, mine.len())
                };
                Ok(())
            }
        }
    }
}

fn host_bytes(data: &HostData) -> Vec<u8> {
    fn b<T: Copy>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain-old-data elements viewed as bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }.to_vec()
    }
    match data {
        HostData::F16(v) => b(v),
        HostData::BF16(v) => b(v),
        HostData::F32(v) => b(v),
        HostData::F64(v) => b(v),
        HostData::U8(v) => b(v),
        HostData::I32(v) => b(v),
        HostData::I64(v) => b(v),
        HostData::Bool(v) => v.iter().map(|&x| x as u8).collect(),
    }
}

fn from_bytes(bytes: &[u8], n: usize, dtype: DType) -> HostData {
    let size = dtype.size();
    let el = |i: usize| &bytes[i * size..(i + 1) * size];
    match dtype {
        DType::F16 => HostData::F16((0..n).map(|i| half::f16::from_le_bytes([el(i)[0], el(i)[1]])).collect()),
        DType::BF16 => {
            HostData::BF16((0..n).map(|i| half::bf16::from_le_bytes([el(i)[0], el(i)[1]])).collect())
        }
        DType::F32 => {
            HostData::F32((0..n).map(|i| f32::from_le_bytes(el(i).try_into().unwrap_or([0; 4]))).collect())
        }
        DType::F64 => {
            HostData::F64((0..n).map(|i| f64::from_le_bytes(el(i).try_into().unwrap_or([0; 8]))).collect())
        }
        DType::U8 => HostData::U8(bytes[..n].to_vec()),
        DType::I32 => {
            HostData::I32((0..n).map(|i| i32::from_le_bytes(el(i).try_into().unwrap_or([0; 4]))).collect())
        }
        DType::I64 => {
            HostData::I64((0..n).map(|i| i64::from_le_bytes(el(i).try_into().unwrap_or([0; 8]))).collect())
        }
        DType::Bool => HostData::Bool(bytes[..n].iter().map(|&b| b != 0).collect()),
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Builds (or finds) the shared library of a program's kernels.
fn build(program: &Program) -> Result<Option<libloading::Library>> {
    if program.kernels.is_empty() {
        return Ok(None);
    }
    let kernels: Vec<(&str, String)> =
        program.kernels.iter().map(|k| (k.name.as_str(), k.source.replacen(INCLUDE, "", 1))).collect();
    compile(&source(KILN_CUH, &kernels)).map(Some)
}

/// The C++ of a library: the emulator's header, `prelude`, the kernels,
/// and `kiln_emu_launch`, which runs kernel `k` (an index into `kernels`).
fn source(prelude: &str, kernels: &[(&str, String)]) -> String {
    let mut src = format!("{EMULATE_H}\n{prelude}\n");
    for (_, body) in kernels {
        src.push_str(body);
    }
    for (i, (name, _)) in kernels.iter().enumerate() {
        src.push_str(&format!("static void body{i}(void** a) {{ emu::invoke({name}, a); }}\n"));
    }
    src.push_str("extern \"C\" int kiln_emu_launch(int k, unsigned grid, unsigned block, void** args) {\n  switch (k) {\n");
    for i in 0..kernels.len() {
        src.push_str(&format!("    case {i}: return emu::run(grid, block, body{i}, args);\n"));
    }
    src.push_str("  }\n  return 3;\n}\n");
    src
}

/// Compiles `src` with g++ into a shared library named by its hash, once
/// per source, and loads it.
fn compile(src: &str) -> Result<libloading::Library> {
    let dir = std::env::var_os("KILN_EMU_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("kiln-emu"));
    std::fs::create_dir_all(&dir)?;
    let hash = fnv1a(src.as_bytes());
    let so = dir.join(format!("{hash:016x}.so"));
    if !so.exists() {
        // Named per build, not per process: two threads of one process
        // building the same program must not share a temporary file.
        static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cpp = dir.join(format!("{hash:016x}.{}.{n}.cpp", std::process::id()));
        std::fs::write(&cpp, src)?;
        let tmp = dir.join(format!("{hash:016x}.{}.{n}.so", std::process::id()));
        let out = std::process::Command::new("g++")
            .args(["-std=c++20", "-O1", "-fPIC", "-shared", "-w", "-o"])
            .arg(&tmp)
            .arg(&cpp)
            .output()
            .map_err(|e| Error::Backend(format!("emulator: cannot run g++: {e}")))?;
        if !out.status.success() {
            return Err(Error::Backend(format!(
                "emulator: g++ failed on {}:\n{}",
                cpp.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let _ = std::fs::remove_file(&cpp);
        std::fs::rename(&tmp, &so)?;
    }
    // SAFETY: a library this function built from kiln's own sources.
    unsafe { libloading::Library::new(&so) }.map_err(|e| Error::Backend(format!("emulator: {e}")))
}

#[cfg(test)]
mod tests;
