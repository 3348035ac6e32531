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
//! temporary file and a rename, so concurrent processes never read half a
//! file. Deleting the folder is always safe.

use super::codegen::Kernel;
use crate::backends::DeviceStats;
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{result as nv, sys as nvsys, Ptx};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Options every kernel is compiled with (after the architecture).
const OPTIONS: &[&str] = &["--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550"];

/// Compiled kernels by cache key.
pub(crate) struct KernelCache {
    arch: String,
    version: (i32, i32),
    memory: Mutex<HashMap<String, CudaFunction>>,
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
        Ok(KernelCache {
            arch,
            version: (major, minor),
            memory: Mutex::new(HashMap::new()),
            dir: cache_dir(),
            stats,
        })
    }

    /// The loaded function of `kernel` for this device.
    pub fn get(&self, ctx: &Arc<CudaContext>, kernel: &Kernel) -> Result<CudaFunction> {
        let key = format!(
            "kiln kernel v1\narch={} nvrtc={}.{} options={}\n{}",
            self.arch,
            self.version.0,
            self.version.1,
            OPTIONS.join(" "),
            kernel.source
        );
        if let Some(f) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            self.stats.kernel_memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(f.clone());
        }
        let hash = format!("{:016x}", fnv1a(key.as_bytes()));
        let cubin = match self.read_disk(&hash, &key) {
            Some(c) => {
                self.stats.kernel_disk_hits.fetch_add(1, Ordering::Relaxed);
                c
            }
            None => {
                let _span = tracing::debug_span!("nvrtc", kernel = %kernel.name).entered();
                let c = self.compile(kernel)?;
                self.stats.kernel_compiles.fetch_add(1, Ordering::Relaxed);
                self.write_disk(&hash, &key, &c);
                c
            }
        };
        let module = ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| Error::Backend(format!("cuda: loading kernel {}: {e:?}", kernel.name)))?;
        let f = module.load_function(&kernel.name).map_err(|e| {
            Error::Backend(format!("cuda: kernel {} is not in its module: {e:?}", kernel.name))
        })?;
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(key, f.clone());
        Ok(f)
    }

    fn read_disk(&self, hash: &str, key: &str) -> Option<Vec<u8>> {
        let dir = self.dir.as_ref()?;
        let stored = std::fs::read_to_string(dir.join(format!("{hash}.key"))).ok()?;
        if stored != key {
            return None;
        }
        std::fs::read(dir.join(format!("{hash}.cubin"))).ok().filter(|c| !c.is_empty())
    }

    /// Best effort: a cache that cannot be written only costs compiles.
    fn write_disk(&self, hash: &str, key: &str, cubin: &[u8]) {
        let Some(dir) = self.dir.as_ref() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            tracing::warn!(dir = %dir.display(), "cannot create the kernel cache folder; kernels are not cached on disk");
            return;
        }
        let tmp = |ext: &str| dir.join(format!("{hash}.{ext}.{}.tmp", std::process::id()));
        let write = |ext: &str, bytes: &[u8]| -> std::io::Result<()> {
            std::fs::write(tmp(ext), bytes)?;
            std::fs::rename(tmp(ext), dir.join(format!("{hash}.{ext}")))
        };
        // The cubin first: a key without its cubin is a miss, never a wrong load.
        if write("cubin", cubin).and_then(|()| write("key", key.as_bytes())).is_err() {
            tracing::warn!(dir = %dir.display(), "cannot write to the kernel cache folder");
        }
    }

    /// NVRTC: source to CUBIN. A failure carries NVRTC's log and the source.
    fn compile(&self, kernel: &Kernel) -> Result<Vec<u8>> {
        let source = kernel.compilable_source();
        let src = CString::new(source.clone())
            .map_err(|_| Error::Backend("cuda: a NUL in generated source".into()))?;
        let name = CString::new(format!("{}.cu", kernel.name)).unwrap_or_default();
        let prog = nv::create_program(&src, Some(&name))
            .map_err(|e| Error::Backend(format!("cuda: NVRTC could not create a program: {e:?}")))?;
        let mut options: Vec<String> = vec![format!("--gpu-architecture={}", self.arch)];
        options.extend(OPTIONS.iter().map(|s| s.to_string()));
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
                    "cuda: NVRTC failed to compile kernel {} ({e:?}):\n{}\n--- source ---\n{}",
                    kernel.name,
                    log.trim_end_matches('\0'),
                    kernel.source
                )))
            }
        };
        // SAFETY: destroyed once, after its last use.
        let _ = unsafe { nv::destroy_program(prog) };
        result
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
