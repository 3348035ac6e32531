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
//! on several threads at once, but a program per kernel pays the per-program
//! cost once per kernel, and threads then gain nothing (measured: 62
//! one-kernel programs took as long on 16 threads as on one). A few
//! programs of several kernels each gain both ways: a 72-kernel plan took
//! 2.1 s as one program and 0.5 s as 8 programs on 8 threads
//! (`benches/nvrtc_probe.py`). The parts are balanced by source length and
//! depend only on the set of kernels and the thread count, so a second
//! process finds each part on disk under the key of its kernels. If a part
//! fails to compile, its kernels are compiled alone, so an error names its
//! own kernel and source.
//!
//! `KILN_COMPILE_THREADS` sets the threads (default: the host's cores, at
//! most 8; 1 compiles a plan's kernels as one program) and
//! `KILN_COMPILE_BATCH=0` compiles one program per kernel, as before
//! issue 19 (for comparison).

use super::codegen::Kernel;
use crate::backends::DeviceStats;
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{result as nv, sys as nvsys, Ptx};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Options every kernel is compiled with (after the architecture).
const OPTIONS: &[&str] = &["--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550"];

/// Leaves out the runtime API declarations NVRTC otherwise parses for
/// every program (about 4 ms of its 20); NVRTC 12.4 and later know it.
const MINIMAL: &str = "--minimal";

/// Kernels per program at least, when a plan's kernels are split.
const MIN_PER_PART: usize = 2;

/// Threads compiling one plan's kernels at most, by default.
const MAX_THREADS: usize = 8;

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
}

/// The disk cache folder the environment asks for (see the module docs).
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var("KILN_CACHE_DIR") {
        Ok(v) if v == "off" || v == "0" => None,
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("kiln").join("kernels"))
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

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
        })
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

    /// The loaded functions of `kernels`, in order: from memory or disk
    /// where cached, the rest compiled as one program (see the module
    /// docs), and what that leaves one at a time.
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
        // Kernels a one-at-a-time compile left on disk load alone.
        let mut rest = Vec::new();
        for &i in todo {
            let hash = format!("{:016x}", fnv1a(keys[i].as_bytes()));
            match read_disk(self.dir.as_deref(), &hash, &keys[i]) {
                Some(c) => {
                    self.stats.kernel_disk_hits.fetch_add(1, Ordering::Relaxed);
                    let f = self.load_cubin(ctx, &kernels[i], c)?;
                    let _ = self.slot(&keys[i]).set(f.clone());
                    out[i] = Some(f);
                }
                None => rest.push(i),
            }
        }
        if rest.is_empty() {
            return Ok(());
        }
        // Each part from disk under the key of its kernels, else compiled.
        let mut ready: Vec<(Vec<usize>, Vec<u8>)> = Vec::new();
        let mut jobs: Vec<Part> = Vec::new();
        for kernels_of_part in partition(kernels, &rest, self.threads) {
            let key: String = kernels_of_part
                .iter()
                .map(|&i| keys[i].as_str())
                .collect::<Vec<_>>()
                .join("\n--- batch ---\n");
            let hash = format!("{:016x}", fnv1a(key.as_bytes()));
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
        let hash = format!("{:016x}", fnv1a(key.as_bytes()));
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
        let src =
            CString::new(source).map_err(|_| Error::Backend("cuda: a NUL in generated source".into()))?;
        let file = CString::new(format!("{name}.cu")).unwrap_or_default();
        let prog = nv::create_program(&src, Some(&file))
            .map_err(|e| Error::Backend(format!("cuda: NVRTC could not create a program: {e:?}")))?;
        let mut options: Vec<String> = vec![format!("--gpu-architecture={}", self.arch)];
        options.extend(self.options.iter().cloned());
        // SAFETY: `prog` is live until destroyed below; the options are C strings.
        let compiled = unsafe { nv::compile_program(prog, &options) };
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
}

/// Some of a plan's kernels, compiled as one program and cached under
/// `key` (their keys joined) at `hash`.
struct Part {
    kernels: Vec<usize>,
    key: String,
    hash: String,
}

/// Threads for one plan's kernels: `KILN_COMPILE_THREADS`, else the
/// host's cores up to [`MAX_THREADS`].
fn compile_threads() -> usize {
    match std::env::var("KILN_COMPILE_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(n) => n.max(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS),
    }
}

/// Splits `todo` (indices into `kernels`) into at most `threads` parts of
/// at least [`MIN_PER_PART`] kernels, balanced by source length: the
/// longest kernel goes to the lightest part first. Each part keeps the
/// order of `todo`, so the same kernels and threads give the same parts.
fn partition(kernels: &[Kernel], todo: &[usize], threads: usize) -> Vec<Vec<usize>> {
    let count = threads.min(todo.len().div_ceil(MIN_PER_PART)).max(1);
    // A kernel's cost: its length, plus what ptxas spends on any kernel.
    let cost = |i: usize| kernels[i].source.len() + 1000;
    let mut by_cost: Vec<(usize, usize)> = todo.iter().copied().enumerate().collect();
    by_cost.sort_by_key(|&(_, i)| std::cmp::Reverse(cost(i)));
    let mut load = vec![0usize; count];
    let mut parts: Vec<Vec<(usize, usize)>> = vec![Vec::new(); count];
    for (at, i) in by_cost {
        let lightest = (0..count).min_by_key(|&p| load[p]).unwrap_or(0);
        load[lightest] += cost(i);
        parts[lightest].push((at, i));
    }
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(|mut p| {
            p.sort_unstable();
            p.into_iter().map(|(_, i)| i).collect()
        })
        .collect()
}

/// Whether a plan's missing kernels compile as programs of several
/// kernels (`KILN_COMPILE_BATCH=0` turns it off).
fn batching() -> bool {
    std::env::var("KILN_COMPILE_BATCH").map_or(true, |v| v != "0" && v != "off")
}

/// The cached CUBIN of `key`, if the folder has it under `hash`.
fn read_disk(dir: Option<&Path>, hash: &str, key: &str) -> Option<Vec<u8>> {
    let dir = dir?;
    let stored = std::fs::read_to_string(dir.join(format!("{hash}.key"))).ok()?;
    if stored != key {
        return None;
    }
    std::fs::read(dir.join(format!("{hash}.cubin"))).ok().filter(|c| !c.is_empty())
}

/// Best effort: a cache that cannot be written only costs compiles.
fn write_disk(dir: Option<&Path>, hash: &str, key: &str, cubin: &[u8]) {
    let Some(dir) = dir else { return };
    if std::fs::create_dir_all(dir).is_err() {
        tracing::warn!(dir = %dir.display(), "cannot create the kernel cache folder; kernels are not cached on disk");
        return;
    }
    // A name no other write uses, in this process or another.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let write = |ext: &str, bytes: &[u8]| -> std::io::Result<()> {
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{hash}.{ext}.{}.{n}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join(format!("{hash}.{ext}"))).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    };
    // The cubin first: a key without its cubin is a miss, never a wrong load.
    if write("cubin", cubin).and_then(|()| write("key", key.as_bytes())).is_err() {
        tracing::warn!(dir = %dir.display(), "cannot write to the kernel cache folder");
    }
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
    use super::{partition, read_disk, write_disk, KernelCache, MIN_PER_PART};
    use crate::backends::cuda::codegen::Kernel;
    use crate::backends::DeviceStats;
    use cudarc::driver::PushKernelArg;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    /// Sixteen threads ask one cache for the same new kernel at once: it
    /// is compiled once, and every thread gets it (needs a GPU; skips
    /// without one unless `KILN_REQUIRE_CUDA=1`).
    #[test]
    fn threads_asking_for_one_kernel_at_once_compile_it_once() {
        // The libraries are checked first: cudarc's loaders panic.
        let opened = super::super::device::check_libraries()
            .and_then(|()| cudarc::driver::CudaContext::new(0).map_err(|e| format!("{e:?}")));
        let ctx = match opened {
            Ok(ctx) => ctx,
            Err(e) => {
                let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
                assert!(!required, "KILN_REQUIRE_CUDA=1 but there is no usable GPU: {e}");
                eprintln!("skipped: no CUDA ({e})");
                return;
            }
        };
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

    /// Eight threads of one process write the same kernel with different
    /// bytes at once (each its own length and fill), while others read:
    /// every read finds a whole file, one writer's, or nothing.
    #[test]
    fn concurrent_writes_of_one_kernel_never_publish_half_a_file() {
        let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let key = "kiln kernel test\nsame key";
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let dir = &dir;
                s.spawn(move || {
                    for _ in 0..20 {
                        let cubin = vec![t + 1; 200_000 + t as usize * 1000];
                        write_disk(Some(dir), "00000000000000aa", key, &cubin);
                        if let Some(got) = read_disk(Some(dir), "00000000000000aa", key) {
                            let fill = got[0];
                            assert!(
                                got.len() == 200_000 + (fill as usize - 1) * 1000
                                    && got.iter().all(|&b| b == fill),
                                "a torn cache file: {} bytes starting {fill}",
                                got.len()
                            );
                        }
                    }
                });
            }
        });
        assert!(read_disk(Some(&dir), "00000000000000aa", key).is_some());
        let left: Vec<_> =
            std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "temporary files left behind: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn kernel_of_length(i: usize, len: usize) -> Kernel {
        Kernel::new(&format!("k{i}"), "x".repeat(len), 1, 32, vec![])
    }

    /// A plan's kernels split into parts: every kernel in exactly one part,
    /// no more parts than threads, none below the minimum, each part in the
    /// order it was given, the costs balanced, and the same split twice.
    #[test]
    fn a_plans_kernels_split_into_balanced_parts() {
        let lengths = [9000, 100, 200, 4000, 50, 50, 3000, 700, 800, 60, 70, 5000, 10, 20, 30, 40, 2000];
        let kernels: Vec<Kernel> = lengths.iter().enumerate().map(|(i, &l)| kernel_of_length(i, l)).collect();
        let todo: Vec<usize> = (0..kernels.len()).rev().collect();
        for threads in [1, 2, 3, 8, 64] {
            let parts = partition(&kernels, &todo, threads);
            assert_eq!(parts, partition(&kernels, &todo, threads), "not deterministic");
            assert!(parts.len() <= threads && parts.len() <= todo.len().div_ceil(MIN_PER_PART));
            let mut seen: Vec<usize> = parts.concat();
            seen.sort_unstable();
            assert_eq!(seen, (0..kernels.len()).collect::<Vec<_>>(), "{threads} threads: {parts:?}");
            for p in &parts {
                let at: Vec<usize> = p.iter().map(|i| todo.iter().position(|t| t == i).unwrap()).collect();
                assert!(at.windows(2).all(|w| w[0] < w[1]), "a part out of order: {p:?}");
            }
            let cost = |p: &Vec<usize>| p.iter().map(|&i| kernels[i].source.len() + 1000).sum::<usize>();
            let (lo, hi) = (parts.iter().map(cost).min().unwrap(), parts.iter().map(cost).max().unwrap());
            // Longest first onto the lightest: no part exceeds another by
            // more than the longest kernel.
            assert!(hi - lo <= 9000 + 1000 + 20, "{threads} threads: costs {lo}..{hi}");
        }
        assert_eq!(partition(&kernels, &todo[..3], 8).len(), 2, "three kernels: two parts of two and one");
        assert_eq!(partition(&kernels, &todo[..1], 8), vec![vec![todo[0]]]);
    }

    /// Twelve new kernels compiled through `get_all` in parts on four
    /// threads: each function loads under its name and computes its own
    /// kernel's value, and a second cache on the same folder reads them
    /// all from disk and compiles none (needs a GPU; skips without one
    /// unless `KILN_REQUIRE_CUDA=1`).
    #[test]
    fn a_plans_kernels_compile_in_parts_and_a_second_process_reads_them_from_disk() {
        let opened = super::super::device::check_libraries()
            .and_then(|()| cudarc::driver::CudaContext::new(0).map_err(|e| format!("{e:?}")));
        let ctx = match opened {
            Ok(ctx) => ctx,
            Err(e) => {
                let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
                assert!(!required, "KILN_REQUIRE_CUDA=1 but there is no usable GPU: {e}");
                eprintln!("skipped: no CUDA ({e})");
                return;
            }
        };
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
            cache.threads = 4;
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
            // SAFETY: the kernel writes 32 floats of `y`, one per thread.
            unsafe { launch.launch(cudarc::driver::LaunchConfig::for_num_elems(32)) }.expect("launch");
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
