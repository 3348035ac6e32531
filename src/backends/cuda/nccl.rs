//! NCCL, loaded at run time: one communicator per device (rank), and the
//! calls a [`CollectiveCall`] makes on a stream.
//!
//! Why not cudarc's `nccl` module: its loader looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` (and older CUDA majors), but NCCL's soname is
//! `libnccl.so.2`, which is all the pip wheel (`nvidia-nccl-cu13`) and
//! Debian's `libnccl2` install, and a library it cannot find is a panic.
//! kiln needs the eleven entry points of [`Api`]; it loads them here with
//! `libloading` (already in the build through cudarc's `dynamic-loading`)
//! from `KILN_NCCL_LIBRARY`, `libnccl.so.2` or `libnccl.so`, and a missing
//! library is an error naming those.
//!
//! Ownership: a [`Comm`] belongs to the backend of one device and lives as
//! long as the plans that call it (they hold an `Arc`). NCCL calls are
//! stream-ordered: a call enqueues work and returns; the buffers it reads
//! and writes belong to the run that enqueued it, like any kernel's.
//!
//! Failure: NCCL has no timeout, and a rank whose partner never issues
//! the matching call spins in its kernel (or, on a first call, in the
//! host's connection set-up) forever. A communicator is therefore also a
//! member of its group's health (`dist/host.rs`): when the group breaks
//! (a rank's run with collectives failed, or a rank waited past the
//! group's timeout: `group.rs`), every rank's communicator is aborted
//! (`ncclCommAbort`, which NCCL documents as the way to unblock a hung
//! communicator from another thread). An aborted communicator is never
//! called again: its later calls are errors naming why the group broke.

use super::program::CollectiveCall;
use crate::dist::host::Rendezvous;
use crate::ir::{Collective, DType, ReduceOp};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

type NcclResult = c_int;
type RawComm = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

/// The entry points kiln calls (eleven).
struct Api {
    _lib: libloading::Library,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    comm_get_async_error: unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> NcclResult,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> NcclResult,
    /// `ncclReduceScatter(send, recv, recvcount, dtype, op, comm, stream)`.
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> NcclResult,
    /// `ncclAllGather(send, recv, sendcount, dtype, comm, stream)`.
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, *mut c_void) -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
}

/// The library names tried, in order.
fn candidates() -> Vec<String> {
    let mut names: Vec<String> = std::env::var("KILN_NCCL_LIBRARY").into_iter().collect();
    names.extend(["libnccl.so.2".to_string(), "libnccl.so".to_string()]);
    names
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Api, String> {
    let names = candidates();
    // SAFETY: loading NCCL runs its (trusted, system-installed) initializers.
    let lib = names.iter().find_map(|n| unsafe { libloading::Library::new(n) }.ok()).ok_or_else(|| {
        format!(
            "NCCL could not be loaded (looked for {}); install it (the nvidia-nccl-cu13 wheel or libnccl2) and add its folder to LD_LIBRARY_PATH, or set KILN_NCCL_LIBRARY to the file",
            names.join(", ")
        )
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the signature of NCCL's header (2.x),
            // which the field's type spells out.
            *unsafe { lib.get($name) }.map_err(|e| format!("NCCL lacks {}: {e}", stringify!($name)))?
        };
    }
    Ok(Api {
        get_unique_id: sym!(b"ncclGetUniqueId"),
        comm_init_rank: sym!(b"ncclCommInitRank"),
        comm_destroy: sym!(b"ncclCommDestroy"),
        comm_abort: sym!(b"ncclCommAbort"),
        comm_get_async_error: sym!(b"ncclCommGetAsyncError"),
        all_reduce: sym!(b"ncclAllReduce"),
        broadcast: sym!(b"ncclBroadcast"),
        reduce_scatter: sym!(b"ncclReduceScatter"),
        all_gather: sym!(b"ncclAllGather"),
        error_string: sym!(b"ncclGetErrorString"),
        get_version: sym!(b"ncclGetVersion"),
        _lib: lib,
    })
}

fn check(api: &Api, what: &str, r: NcclResult) -> Result<(), String> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for every result code.
    let text = unsafe { CStr::from_ptr((api.error_string)(r)) }.to_string_lossy();
    Err(format!("NCCL {what} failed ({r}): {text}"))
}

/// A fresh NCCL unique id (what rank 0 hands every rank of a new group).
pub(crate) fn unique_id() -> Result<[u8; 128], String> {
    let api = api()?;
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out-pointer of the right size.
    check(api, "ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

/// NCCL's version (`22703` for 2.27.3).
pub(crate) fn version() -> Result<i32, String> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok(v)
}

/// One rank's communicator, and the group it is a rank of.
pub(crate) struct Comm {
    raw: RawComm,
    api: &'static Api,
    /// Set (once, before `ncclCommAbort`) when the group broke: no NCCL
    /// call is made with `raw` from then on, and drop does not destroy it.
    aborted: AtomicBool,
    /// This rank.
    pub rank: usize,
    /// The group's health, shared by every rank (`dist/host.rs`).
    pub group: Arc<Rendezvous>,
    /// The device's context, kept alive while the communicator is: an
    /// abort runs on a thread of its own and may outlive the rank's
    /// context handles (`dist/host.rs`, `run_detached`).
    _device: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: NCCL communicators may be used from any thread; kiln serializes
// the calls of one device under its launch lock.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Comm {
    /// Rank `rank` of `size` for the group `id`; the device must be current
    /// on this thread. Blocks until every rank has called it. The
    /// communicator is aborted when `group` breaks (see the module docs).
    pub(crate) fn init(
        id: &[u8; 128],
        size: usize,
        rank: usize,
        group: Arc<Rendezvous>,
        device: Arc<cudarc::driver::CudaContext>,
    ) -> Result<Arc<Comm>, String> {
        let api = api()?;
        let mut raw: RawComm = std::ptr::null_mut();
        let id = UniqueId { internal: id.map(|b| b as c_char) };
        let (n, r) = (c_int::try_from(size).map_err(|e| e.to_string())?, rank as c_int);
        // SAFETY: `raw` is a valid out-pointer; `id` is passed by value.
        check(api, "ncclCommInitRank", unsafe { (api.comm_init_rank)(&mut raw, n, id, r) })?;
        let comm = Arc::new(Comm {
            raw,
            api,
            aborted: AtomicBool::new(false),
            rank,
            group: group.clone(),
            _device: device,
        });
        let weak = Arc::downgrade(&comm);
        group.on_break(Box::new(move || {
            if let Some(comm) = weak.upgrade() {
                comm.abort();
            }
        }));
        Ok(comm)
    }

    /// Aborts the communicator (once): NCCL stops its kernels and host
    /// waits in flight on it and frees it. Called when the group breaks.
    pub(crate) fn abort(&self) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(rank = self.rank, why = ?self.group.broken(), "aborting the NCCL communicator");
        // SAFETY: `raw` is a live communicator (`aborted` was false, and
        // only this call sets it); NCCL allows the abort while another
        // thread is blocked in a call on it, which then returns an error.
        let r = unsafe { (self.api.comm_abort)(self.raw) };
        if let Err(e) = check(self.api, "ncclCommAbort", r) {
            tracing::warn!(error = %e, "aborting an NCCL communicator");
        }
    }

    /// An error if the group broke (naming why), or if NCCL reports an
    /// asynchronous error on the communicator (a peer's failure it saw).
    pub(crate) fn health(&self) -> Result<(), String> {
        if let Some(why) = self.group.broken() {
            return Err(format!("the process group is broken: {why}"));
        }
        if self.aborted.load(Ordering::SeqCst) {
            return Err("the NCCL communicator was aborted".into());
        }
        let mut state: NcclResult = 0;
        // SAFETY: a live communicator (not aborted, checked above; an
        // abort racing this call is the case NCCL allows) and an out-pointer.
        let r = unsafe { (self.api.comm_get_async_error)(self.raw, &mut state) };
        check(self.api, "ncclCommGetAsyncError", r)?;
        // ncclInProgress (7) is a non-blocking communicator still working.
        if state != 0 && state != 7 {
            return check(self.api, "a collective", state);
        }
        Ok(())
    }

    /// Enqueues `call` on `stream`, reading `src` and writing `dst` (device
    /// pointers).
    ///
    /// # Safety
    /// `src` must hold `call.count` elements of `call.dtype` and `dst`
    /// `call.what.result_count(call.count)`, on this communicator's device,
    /// valid until the stream reaches the call; a reduce-scatter's or an
    /// all-gather's `dst` must not overlap `src` (NCCL's in-place forms
    /// need a particular offset, which lowering never produces).
    pub(crate) unsafe fn enqueue(
        &self,
        call: &CollectiveCall,
        src: u64,
        dst: u64,
        stream: *mut c_void,
    ) -> Result<(), String> {
        self.health()?;
        let dtype = nccl_dtype(call.dtype)?;
        let (s, d) = (src as *const c_void, dst as *mut c_void);
        // SAFETY: the caller's contract; the enum values are NCCL's.
        let r = unsafe {
            match call.what {
                Collective::AllReduce(op) => {
                    (self.api.all_reduce)(s, d, call.count, dtype, nccl_op(op)?, self.raw, stream)
                }
                Collective::Broadcast(root) => {
                    (self.api.broadcast)(s, d, call.count, dtype, root as c_int, self.raw, stream)
                }
                // NCCL counts a reduce-scatter by its result (per rank) and an
                // all-gather by its operand (per rank).
                Collective::ReduceScatter { op, .. } => {
                    let per_rank = call.what.result_count(call.count);
                    (self.api.reduce_scatter)(s, d, per_rank, dtype, nccl_op(op)?, self.raw, stream)
                }
                Collective::AllGather { .. } => {
                    (self.api.all_gather)(s, d, call.count, dtype, self.raw, stream)
                }
            }
        };
        check(self.api, call.what.mnemonic(), r)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.aborted.load(Ordering::SeqCst) {
            return; // `ncclCommAbort` freed it
        }
        // SAFETY: the communicator is valid and no plan uses it any more
        // (plans hold the `Arc` this is dropped from).
        let r = unsafe { (self.api.comm_destroy)(self.raw) };
        if let Err(e) = check(self.api, "ncclCommDestroy", r) {
            tracing::warn!(error = %e, "destroying an NCCL communicator");
        }
    }
}

fn nccl_dtype(d: DType) -> Result<c_int, String> {
    Ok(match d {
        DType::U8 => 1,
        DType::I32 => 2,
        DType::I64 => 4,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
        DType::Bool => return Err("NCCL has no bool collectives".into()),
    })
}

fn nccl_op(op: ReduceOp) -> Result<c_int, String> {
    Ok(match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Mean => 4,
        ReduceOp::ArgMax => return Err("NCCL has no argmax".into()),
    })
}
