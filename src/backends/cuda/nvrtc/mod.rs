//! Compiling generated kernels with NVRTC, cached in memory and on disk.
//!
//! A kernel is compiled to a CUBIN for the device's architecture (`sm_90`
//! on an H100), with `--fmad=false` so that a fused chain rounds exactly as
//! the unfused kernels do. The cache key is the source, the architecture,
//! the NVRTC version and the options; a second process running the same
//! program loads every kernel from disk and compiles none
//! (`Stats::kernel_disk_hits`).
//!
//! The disk cache lives in `KILN_CACHE_DIR` if set (`off` switches it off),
//! else `$XDG_CACHE_HOME/kiln/kernels`, else `~/.cache/kiln/kernels`. Each
//! kernel is two files, `<hash>.cubin` and `<hash>.key` (the full key, so a
//! hash collision is a miss, never a wrong kernel); writes go through a
//! temporary file named for the process *and* the write (two threads of
//! one process writing the same kernel never share one) and a rename, so
//! no reader, in this process or another, ever sees half a file. Deleting
//! the folder is always safe.
//!
//! In memory, each key has one slot that the first thread to ask fills:
//! threads asking for a kernel being compiled wait for it instead of
//! compiling it again. A failed compile is not remembered (the next ask
//! tries again). Identical kernels, within a plan (the lowering keeps one
//! per source) and across plans of a device, are compiled once.
//!
//! A plan's missing kernels are compiled as a few NVRTC programs on as
//! many threads ([`KernelCache::get_all`]): each program is `kiln.cuh`
//! once, then its share of the kernels. What costs is ptxas, per kernel
//! (15-50 ms each on the H100's host; Philox normals the most), plus about
//! 20 ms per program whatever it holds. NVRTC runs programs of one process
//! on several threads at once, but with many more kernels than threads a
//! program per kernel pays the per-program cost once per kernel, and the
//! threads then gain little (measured: 62 one-kernel programs took as long
//! on 16 threads as on one). A program per thread gains both ways: a
//! 72-kernel plan took 2.1 s as one program and 0.5 s as 8 programs on 8
//! threads (`benches/nvrtc_probe.py`). The parts are balanced by source
//! length and depend only on the kernels memory lacks and the thread
//! count, so a second process finds each part on disk under the key of
//! its kernels. If a part
//! fails to compile, its kernels are compiled alone, so an error names its
//! own kernel and source.
//!
//! `KILN_COMPILE_THREADS` sets the threads (default: the host's cores, at
//! most 8; 1 compiles a plan's kernels as one program) and
//! `KILN_COMPILE_BATCH=0` compiles one program per kernel, as before
//! issue 19 (for comparison).

mod disk;
mod parts;

use super::codegen::Kernel;
use crate::backends::DeviceStats;
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{result as nv, sys as nvsys, Ptx};
pub use disk::cache_dir;
use disk::{hash_of, read_disk, write_disk};
use parts::{compile_threads, partition, Part};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Options every kernel is compiled with (after the architecture).
const OPTIONS: &[&str] = &["--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550"];

/// Leaves out the runtime API declarations NVRTC otherwise parses for
/// every program (about 4 ms of its 20); NVRTC 12.4 and later know it.
const MINIMAL: &str = "--minimal";

/// A kernel's slot in memory: filled once by the thread that compiles it.
type Slot = Arc<OnceLock<CudaFunction>>;

/// Compiled kernels by cache key.
pub(crate) struct KernelCache {
    arch: String,
    version: (i32, i32),
    /// [`OPTIONS`], and [`MINIMAL`] where NVRTC knows it.
    options: Vec<String>,
    /// Threads compiling one plan's kernels ([`compile_threads`]).
    threads: usize,
    memory: Mutex<HashMap<String, Slot>>,
    /// Serializes the filling of slots per key: held by the compiling thread.
    filling: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    dir: Option<PathBuf>,
    stats: Arc<DeviceStats>,
    /// The process's NVRTC warm-up, if this cache started it
    /// ([`KernelCache::start_warm_up`]); joined when the cache goes.
    warm_up: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Whether this process has started its NVRTC warm-up.
static WARM_UP_STARTED: AtomicBool = AtomicBool::new(false);

impl KernelCache {
    pub fn new(arch: String, stats: Arc<DeviceStats>) -> std::result::Result<KernelCache, String> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        let st = unsafe { nvsys::nvrtcVersion(&mut major, &mut minor) };
        if st != nvsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("NVRTC does not answer ({st:?})"));
        }
        let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
        if (major, minor) >= (12, 4) {
            options.push(MINIMAL.to_string());
        }
        Ok(KernelCache {
            arch,
            version: (major, minor),
            options,
            threads: compile_threads(),
            memory: Mutex::new(HashMap::new()),
            filling: Mutex::new(HashMap::new()),
            dir: cache_dir(),
            stats,
            warm_up: Mutex::new(None),
        })
    }

    /// Pays NVRTC's first-use cost in the background, once per process:
    /// the first program a process compiles takes about 130 ms more than
    /// the next (NVRTC loads its built-ins, the driver its module loader),
    /// and a script builds its model and reads its data meanwhile. A
    /// trivial kernel is compiled and loaded on a thread of its own; a
    /// plan compiled meanwhile just runs beside it.
    pub fn start_warm_up(&self, ctx: &Arc<CudaContext>) {
        if WARM_UP_STARTED.swap(true, Ordering::Relaxed) {
            return;
        }
        let (arch, options, ctx) = (self.arch.clone(), self.options.clone(), ctx.clone());
        let warm = move || {
            let _span = tracing::debug_span!("nvrtc warm-up").entered();
            let source = "extern \"C\" __global__ void kiln_warm_up() {}\n";
            if let Ok(cubin) = compile_with(&arch, &options, "kiln_warm_up", source) {
                let _ = ctx.load_module(Ptx::from_binary(cubin));
            }
        };
        let started = std::thread::Builder::new().name("kiln-nvrtc-warm-up".into()).spawn(warm);
        *self.warm_up.lock().unwrap_or_else(|e| e.into_inner()) = started.ok();
    }

    /// The cache key of `kernel`: everything its CUBIN depends on.
    fn key(&self, kernel: &Kernel) -> String {
        format!(
            "kiln kernel v1\narch={} nvrtc={}.{} options={}\n{}",
            self.arch,
            self.version.0,
            self.version.1,
            self.options.join(" "),
            kernel.source
        )
    }

    /// The loaded function of `kernel` for this device.
    pub fn get(&self, ctx: &Arc<CudaContext>, kernel: &Kernel) -> Result<CudaFunction> {
        let key = self.key(kernel);
        let slot: Slot =
            self.memory.lock().unwrap_or_else(|e| e.into_inner()).entry(key.clone()).or_default().clone();
        if let Some(f) = slot.get() {
            self.stats.kernel_memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(f.clone());
        }
        // One thread per key compiles; the others wait here, then find it.
        let gate =
            self.filling.lock().unwrap_or_else(|e| e.into_inner()).entry(key.clone()).or_default().clone();
        let _filling = gate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.get() {
            self.stats.kernel_memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(f.clone());
        }
        let f = self.load(ctx, kernel, &key)?;
        let _ = slot.set(f.clone());
        self.filling.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        Ok(f)
    }

    /// The loaded functions of `kernels`, in order: from memory where
    /// loaded, the rest in parts from disk or compiled on threads (see the
    /// module docs), and what a failed part leaves one at a time.
    pub fn get_all(&self, ctx: &Arc<CudaContext>, kernels: &[Kernel]) -> Result<Vec<CudaFunction>> {
        let _span = tracing::debug_span!("kernels", count = kernels.len()).entered();
        let mut out: Vec<Option<CudaFunction>> = vec![None; kernels.len()];
        let keys: Vec<String> = kernels.iter().map(|k| self.key(k)).collect();
        let mut missing = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.slot(key).get() {
                Some(f) => {
                    self.stats.kernel_memory_hits.fetch_add(1, Ordering::Relaxed);
                    out[i] = Some(f.clone());
                }
                None => missing.push(i),
            }
        }
        if missing.len() >= 2 && batching() {
            if let Err(e) = self.compile_batch(ctx, kernels, &keys, &missing, &mut out) {
                tracing::debug!(error = %e, "the batched compile failed; compiling kernel by kernel");
            }
        }
        kernels
            .iter()
            .zip(out)
            .map(|(k, f)| match f {
                Some(f) => Ok(f),
                None => self.get(ctx, k),
            })
            .collect()
    }

    fn slot(&self, key: &str) -> Slot {
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_default().clone()
    }

    /// Compiles the kernels `missing` (indices into `kernels`) that no
    /// thread has filled meanwhile as one program, or reads that program
    /// from disk, and fills their slots and `out`. Holds every one of
    /// their fill gates, taken in key order (so two batches never wait on
    /// each other), while it works.
    fn compile_batch(
        &self,
        ctx: &Arc<CudaContext>,
        kernels: &[Kernel],
        keys: &[String],
        missing: &[usize],
        out: &mut [Option<CudaFunction>],
    ) -> Result<()> {
        let mut order: Vec<usize> = missing.to_vec();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
        order.dedup_by(|a, b| keys[*a] == keys[*b]);
        let gates: Vec<Arc<Mutex<()>>> = {
            let mut filling = self.filling.lock().unwrap_or_else(|e| e.into_inner());
            order.iter().map(|&i| filling.entry(keys[i].clone()).or_default().clone()).collect()
        };
        let _held: Vec<_> = gates.iter().map(|g| g.lock().unwrap_or_else(|e| e.into_inner())).collect();
        let mut todo = Vec::new();
        for &i in &order {
            match self.slot(&keys[i]).get() {
                Some(f) => out[i] = Some(f.clone()),
                None => todo.push(i),
            }
        }
        let outcome = self.fill_batch(ctx, kernels, keys, &todo, out);
        let mut filling = self.filling.lock().unwrap_or_else(|e| e.into_inner());
        for &i in &order {
            filling.remove(&keys[i]);
        }
        // Duplicates of a kernel within `missing` take the filled slot.
        for &i in missing {
            if out[i].is_none() {
                out[i] = self.slot(&keys[i]).get().cloned();
            }
        }
        outcome
    }

    fn fill_batch(
        &self,
        ctx: &Arc<CudaContext>,
        kernels: &[Kernel],
        keys: &[String],
        todo: &[usize],
        out: &mut [Option<CudaFunction>],
    ) -> Result<()> {
        // The parts depend only on `todo` (what memory lacks) and the
        // threads, never on what the disk holds: a second process, whose
        // memory lacks the same kernels, asks the disk for the same parts.
        // (A part of one kernel is that kernel's own entry.)
        // Each part from disk under the key of its kernels, else compiled.
        let mut ready: Vec<(Vec<usize>, Vec<u8>)> = Vec::new();
        let mut jobs: Vec<Part> = Vec::new();
        for kernels_of_part in partition(kernels, todo, self.threads) {
            let key: String = kernels_of_part
                .iter()
                .map(|&i| keys[i].as_str())
                .collect::<Vec<_>>()
                .join("\n--- batch ---\n");
            let hash = hash_of(&key);
            match read_disk(self.dir.as_deref(), &hash, &key) {
                Some(c) => {
                    self.stats.kernel_disk_hits.fetch_add(kernels_of_part.len() as u64, Ordering::Relaxed);
                    ready.push((kernels_of_part, c));
                }
                None => jobs.push(Part { kernels: kernels_of_part, key, hash }),
            }
        }
        let compiled = self.compile_parts(kernels, &jobs);
        for (part, result) in jobs.into_iter().zip(compiled) {
            match result {
                Ok(c) => {
                    write_disk(self.dir.as_deref(), &part.hash, &part.key, &c);
                    ready.push((part.kernels, c));
                }
                // Its kernels are compiled alone by the caller.
                Err(e) => {
                    tracing::debug!(error = %e, kernels = part.kernels.len(), "a part failed to compile")
                }
            }
        }
        for (part, cubin) in ready {
            let module = ctx.load_module(Ptx::from_binary(cubin)).map_err(|e| {
                Error::Backend(format!("cuda: loading a batch of {} kernels: {e:?}", part.len()))
            })?;
            for i in part {
                let f = module.load_function(&kernels[i].name).map_err(|e| {
                    Error::Backend(format!("cuda: kernel {} is not in its batch: {e:?}", kernels[i].name))
                })?;
                let _ = self.slot(&keys[i]).set(f.clone());
                out[i] = Some(f);
            }
        }
        Ok(())
    }

    /// Compiles each part as one program, the parts on threads of their
    /// own (the first on this one). The wall time counts once in
    /// `Stats::kernel_compile_time`.
    fn compile_parts(&self, kernels: &[Kernel], parts: &[Part]) -> Vec<Result<Vec<u8>>> {
        if parts.is_empty() {
            return Vec::new();
        }
        let count: usize = parts.iter().map(|p| p.kernels.len()).sum();
        let _span = tracing::debug_span!("nvrtc", parts = parts.len(), kernels = count).entered();
        let started = std::time::Instant::now();
        let compile = |part: &Part| {
            let _span = tracing::debug_span!("nvrtc part", kernels = part.kernels.len()).entered();
            let mut source = format!("{}\n", super::codegen::KILN_CUH);
            for &i in &part.kernels {
                source.push_str(kernels[i].source.trim_start_matches(super::codegen::INCLUDE));
                source.push('\n');
            }
            self.compile_source(&format!("batch_{}", part.hash), &source)
        };
        let results: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
            let spawned: Vec<_> = parts[1..]
                .iter()
                .map(|part| {
                    // A thread that cannot start compiles on this one.
                    std::thread::Builder::new()
                        .name("kiln-nvrtc".into())
                        .spawn_scoped(s, || compile(part))
                        .map_err(|_| part)
                })
                .collect();
            let mut results = vec![compile(&parts[0])];
            for handle in spawned {
                results.push(match handle {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(Error::Backend("cuda: an NVRTC thread panicked".into()))),
                    Err(part) => compile(part),
                });
            }
            results
        });
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.kernel_compile_nanos.fetch_add(nanos, Ordering::Relaxed);
        let compiled: usize =
            parts.iter().zip(&results).filter(|(_, r)| r.is_ok()).map(|(p, _)| p.kernels.len()).sum();
        self.stats.kernel_compiles.fetch_add(compiled as u64, Ordering::Relaxed);
        results
    }

    /// From disk or NVRTC, loaded into the context.
    fn load(&self, ctx: &Arc<CudaContext>, kernel: &Kernel, key: &str) -> Result<CudaFunction> {
        let hash = hash_of(key);
        let cubin = match read_disk(self.dir.as_deref(), &hash, key) {
            Some(c) => {
                self.stats.kernel_disk_hits.fetch_add(1, Ordering::Relaxed);
                c
            }
            None => {
                let _span = tracing::debug_span!("nvrtc", kernel = %kernel.name).entered();
                let started = std::time::Instant::now();
                let c = self.compile(kernel)?;
                self.stats.kernel_compiles.fetch_add(1, Ordering::Relaxed);
                let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.stats.kernel_compile_nanos.fetch_add(nanos, Ordering::Relaxed);
                write_disk(self.dir.as_deref(), &hash, key, &c);
                c
            }
        };
        self.load_cubin(ctx, kernel, cubin)
    }

    /// Loads a kernel's own CUBIN into the context.
    fn load_cubin(&self, ctx: &Arc<CudaContext>, kernel: &Kernel, cubin: Vec<u8>) -> Result<CudaFunction> {
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| Error::Backend(format!("cuda: loading kernel {}: {e:?}", kernel.name)))?;
        module
            .load_function(&kernel.name)
            .map_err(|e| Error::Backend(format!("cuda: kernel {} is not in its module: {e:?}", kernel.name)))
    }

    /// NVRTC: a kernel's source to CUBIN. A failure carries NVRTC's log
    /// and the source.
    fn compile(&self, kernel: &Kernel) -> Result<Vec<u8>> {
        self.compile_source(&kernel.name, &kernel.compilable_source()).map_err(|e| match e {
            Error::Backend(m) => Error::Backend(format!("{m}\n--- source ---\n{}", kernel.source)),
            other => other,
        })
    }

    /// NVRTC: compilable source to CUBIN; a failure carries NVRTC's log.
    fn compile_source(&self, name: &str, source: &str) -> Result<Vec<u8>> {
        compile_with(&self.arch, &self.options, name, source)
    }
}

impl Drop for KernelCache {
    fn drop(&mut self) {
        // The warm-up must not be inside NVRTC while the process exits.
        if let Some(h) = self.warm_up.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

/// NVRTC: compilable source to CUBIN for `arch` with `options`; a failure
/// carries NVRTC's log.
fn compile_with(arch: &str, options: &[String], name: &str, source: &str) -> Result<Vec<u8>> {
    let src = CString::new(source).map_err(|_| Error::Backend("cuda: a NUL in generated source".into()))?;
    let file = CString::new(format!("{name}.cu")).unwrap_or_default();
    let prog = nv::create_program(&src, Some(&file))
        .map_err(|e| Error::Backend(format!("cuda: NVRTC could not create a program: {e:?}")))?;
    let mut all: Vec<String> = vec![format!("--gpu-architecture={arch}")];
    all.extend(options.iter().cloned());
    // SAFETY: `prog` is live until destroyed below; the options are C strings.
    let compiled = unsafe { nv::compile_program(prog, &all) };
    let result = match compiled {
        Ok(()) => cubin(prog),
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { nv::get_program_log(prog) }
                .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_default();
            Err(Error::Backend(format!(
                "cuda: NVRTC failed to compile kernel {name} ({e:?}):\n{}",
                log.trim_end_matches('\0')
            )))
        }
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { nv::destroy_program(prog) };
    result
}

/// Whether a plan's missing kernels compile as programs of several
/// kernels (`KILN_COMPILE_BATCH=0` turns it off).
fn batching() -> bool {
    std::env::var("KILN_COMPILE_BATCH").map_or(true, |v| v != "0" && v != "off")
}

fn cubin(prog: nvsys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; the buffer has `size` bytes.
    unsafe {
        let st = nvsys::nvrtcGetCUBINSize(prog, &mut size);
        if st != nvsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Backend(format!("cuda: NVRTC has no CUBIN ({st:?})")));
        }
        let mut out = vec![0u8; size];
        let st = nvsys::nvrtcGetCUBIN(prog, out.as_mut_ptr() as *mut std::ffi::c_char);
        if st != nvsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Backend(format!("cuda: NVRTC has no CUBIN ({st:?})")));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::KernelCache;
    use crate::backends::cuda::codegen::Kernel;
    use crate::backends::DeviceStats;
    use cudarc::driver::PushKernelArg;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// Device 0, or `None` (the test skips) when there is no usable GPU
    /// and `KILN_REQUIRE_CUDA=1` does not demand one.
    fn gpu_or_skip() -> Option<Arc<cudarc::driver::CudaContext>> {
        // The libraries are checked first: cudarc's loaders panic.
        let opened = super::super::device::check_libraries()
            .and_then(|()| cudarc::driver::CudaContext::new(0).map_err(|e| format!("{e:?}")));
        match opened {
            Ok(ctx) => Some(ctx),
            Err(e) => {
                let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
                assert!(!required, "KILN_REQUIRE_CUDA=1 but there is no usable GPU: {e}");
                eprintln!("skipped: no CUDA ({e})");
                None
            }
        }
    }

    /// Sixteen threads ask one cache for the same new kernel at once: it
    /// is compiled once, and every thread gets it (needs a GPU; skips
    /// without one unless `KILN_REQUIRE_CUDA=1`).
    #[test]
    fn threads_asking_for_one_kernel_at_once_compile_it_once() {
        let Some(ctx) = gpu_or_skip() else { return };
        let stats = Arc::new(DeviceStats::default());
        let mut cache = KernelCache::new("sm_90".into(), stats.clone()).expect("NVRTC");
        let (major, minor) = ctx.compute_capability().expect("capability");
        cache.arch = format!("sm_{major}{minor}");
        cache.dir = None;
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let body =
            format!("extern \"C\" __global__ void k_once(float* y) {{ y[threadIdx.x] = {nonce}.0f; }}\n");
        let kernel = Kernel::new("k_once", body, 1, 32, vec![]);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| cache.get(&ctx, &kernel).expect("compiles"));
            }
        });
        assert_eq!(stats.kernel_compiles.load(Ordering::Relaxed), 1);
        assert_eq!(stats.kernel_memory_hits.load(Ordering::Relaxed), 15);
    }

    /// Twelve new kernels compiled through `get_all` in parts on eight
    /// threads (four parts of two, four of one, which are those kernels'
    /// own entries): each function loads under its name and computes its
    /// own kernel's value, and a second cache on the same folder reads
    /// them all from disk and compiles none (needs a GPU; skips without
    /// one unless `KILN_REQUIRE_CUDA=1`).
    #[test]
    fn a_plans_kernels_compile_in_parts_and_a_second_process_reads_them_from_disk() {
        let Some(ctx) = gpu_or_skip() else { return };
        let dir = std::env::temp_dir().join(format!("kiln-parts-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (major, minor) = ctx.compute_capability().expect("capability");
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() % 1_000_000);
        let kernels: Vec<Kernel> = (0..12)
            .map(|i| {
                let name = format!("k_part_{i}");
                let body = format!(
                    "extern \"C\" __global__ void {name}(float* y) {{ y[threadIdx.x] = {i}.0f + {nonce}.0f; }}\n"
                );
                Kernel::new(&name, body, 1, 32, vec![])
            })
            .collect();
        let new_cache = || {
            let stats = Arc::new(DeviceStats::default());
            let mut cache = KernelCache::new("sm_90".into(), stats.clone()).expect("NVRTC");
            cache.arch = format!("sm_{major}{minor}");
            cache.dir = Some(dir.clone());
            cache.threads = 8;
            (cache, stats)
        };
        let (first, stats) = new_cache();
        let functions = first.get_all(&ctx, &kernels).expect("compiles");
        assert_eq!(stats.kernel_compiles.load(Ordering::Relaxed), 12);
        let stream = ctx.default_stream();
        for (i, f) in functions.iter().enumerate() {
            let mut y = stream.alloc_zeros::<f32>(32).expect("alloc");
            let mut launch = stream.launch_builder(f);
            launch.arg(&mut y);
            let one_warp = cudarc::driver::LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one warp: the kernel writes the 32 floats of `y`, one per thread.
            unsafe { launch.launch(one_warp) }.expect("launch");
            let host = stream.clone_dtoh(&y).expect("copy");
            assert!(
                host.iter().all(|&v| v == i as f32 + nonce as f32),
                "kernel {i} computed {:?}",
                &host[..4]
            );
        }
        let (second, stats) = new_cache();
        second.get_all(&ctx, &kernels).expect("loads");
        assert_eq!(stats.kernel_compiles.load(Ordering::Relaxed), 0);
        assert_eq!(stats.kernel_disk_hits.load(Ordering::Relaxed), 12);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
