"""Where a plan's NVRTC time goes, and what would cut it (issue 19).

Run on the GPU machine after a kiln run has filled a kernel cache folder:

    python3 benches/nvrtc_probe.py CACHE_DIR [--kernels kernels/kiln.cuh]  (kiln_mma.cuh beside it too)

It rebuilds the largest batched programs from the cache's `.key` files
(each key holds every kernel's full source) and times, on the same source:
NVRTC to CUBIN with kiln's options; to PTX only; the options that trade
compile time (`--split-compile`, `-Ofast-compile`, `--minimal`); the
compile's own time trace (`--fdevice-time-trace`), summed by phase; the
program split in P parts compiled by P threads of one process, by P forked
processes, and (PTX) by the driver's JIT on P threads. Options this NVRTC
does not know are reported, not fatal. Prints a table last.
"""
import ctypes
import glob
import json
import os
import sys
import threading
import time

BATCH = "\n--- batch ---\n"
INCLUDE = '#include "kiln.cuh"\n'
KILN_OPTIONS = ["--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550"]


def load(names):
    for n in names:
        for path in [n] + sorted(glob.glob(f"/usr/local/cuda/lib64/{n}*")) + sorted(glob.glob(f"/usr/lib/x86_64-linux-gnu/{n}*")):
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    raise SystemExit(f"cannot load {names}")


nvrtc = load(["libnvrtc.so"])
cuda = load(["libcuda.so.1", "libcuda.so"])
for f in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcGetPTXSize",
          "nvrtcGetPTX", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcDestroyProgram", "nvrtcVersion"):
    getattr(nvrtc, f).restype = ctypes.c_int


NONCE = [0]


def compile_source(source, options, want="cubin"):
    """(seconds, bytes or None, log) of one NVRTC compile. A fresh symbol
    makes every program new: NVRTC 13 answers a program it has compiled
    before (same PTX and options) from a cache of its own."""
    NONCE[0] += 1
    source += f"\n__device__ int kiln_probe_nonce_{os.getpid()}_{NONCE[0]};\n"
    prog = ctypes.c_void_p()
    st = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"probe.cu", 0, None, None)
    assert st == 0, st
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    t = time.perf_counter()
    st = nvrtc.nvrtcCompileProgram(prog, len(options), opts)
    dt = time.perf_counter() - t
    out = None
    if st == 0:
        size = ctypes.c_size_t()
        if want == "cubin":
            nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetCUBIN(prog, buf)
        else:
            nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetPTX(prog, buf)
        out = buf.raw
    lsize = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(lsize))
    lbuf = ctypes.create_string_buffer(max(lsize.value, 1))
    nvrtc.nvrtcGetProgramLog(prog, lbuf)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return dt, (out if st == 0 else None), (lbuf.value.decode(errors="replace") if st else f"status {st}")[:300]


def programs(cache_dir, cuh):
    """Each batched key as (arch, [kernel sources])."""
    out = []
    for path in glob.glob(os.path.join(cache_dir, "*.key")):
        key = open(path).read()
        parts = key.split(BATCH)
        kernels, arch = [], None
        for p in parts:
            head, _, rest = p.partition("\n")
            meta, _, src = rest.partition("\n")
            arch = meta.split()[0].split("=")[1]
            kernels.append(src)
        out.append((arch, kernels))
    out.sort(key=lambda p: -len(p[1]))
    return out


def source_of(cuh, kernels):
    return cuh + "\n" + "".join(k.replace(INCLUDE, "", 1) + "\n" for k in kernels)


def chunks(xs, p):
    return [xs[i::p] for i in range(p)]


def best(f, n=2):
    return min(f() for _ in range(n))


def by_threads(cuh, kernels, p, options):
    parts = chunks(kernels, p)
    res = [None] * p

    def work(i):
        res[i] = compile_source(source_of(cuh, parts[i]), options)[0]

    t = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(p)]
    [x.start() for x in ts]
    [x.join() for x in ts]
    return time.perf_counter() - t, sum(res)


def by_fork(cuh, kernels, p, options):
    """P children forked from this process (which holds a CUDA context),
    each compiling its share and sending back the CUBIN's size."""
    parts = chunks(kernels, p)
    t = time.perf_counter()
    pipes = []
    for i in range(p):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            dt, cub, _ = compile_source(source_of(cuh, parts[i]), options)
            os.write(w, f"{dt} {len(cub) if cub else -1}\n".encode())
            os._exit(0)
        os.close(w)
        pipes.append((pid, r))
    summed, sizes = 0.0, []
    for pid, r in pipes:
        data = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        dt, size = data.split()
        summed += float(dt)
        sizes.append(int(size))
    return time.perf_counter() - t, summed, min(sizes)


class Driver:
    def __init__(self):
        for f in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuModuleLoadData",
                  "cuModuleUnload"):
            getattr(cuda, f).restype = ctypes.c_int
        assert cuda.cuInit(0) == 0
        dev = ctypes.c_int()
        assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
        self.ctx = ctypes.c_void_p()
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev) == 0
        cuda.cuCtxSetCurrent(self.ctx)

    def load(self, image):
        cuda.cuCtxSetCurrent(self.ctx)
        m = ctypes.c_void_p()
        t = time.perf_counter()
        st = cuda.cuModuleLoadData(ctypes.byref(m), image)
        dt = time.perf_counter() - t
        assert st == 0, f"cuModuleLoadData: {st}"
        cuda.cuModuleUnload(m)
        return dt

    def jit_threads(self, ptxs):
        res = [None] * len(ptxs)

        def work(i):
            res[i] = self.load(ptxs[i])

        t = time.perf_counter()
        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(ptxs))]
        [x.start() for x in ts]
        [x.join() for x in ts]
        return time.perf_counter() - t, sum(res)


def trace_summary(path):
    try:
        events = json.load(open(path))
    except Exception as e:  # noqa: BLE001
        return f"no trace ({e})"
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    total = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            total[e["name"]] = total.get(e["name"], 0) + e["dur"] / 1000
    top = sorted(total.items(), key=lambda kv: -kv[1])[:18]
    return "\n".join(f"    {ms:9.1f} ms  {name}" for name, ms in top)


def main():
    cache = sys.argv[1]
    # kiln.cuh, then the tensor-core helpers, as codegen/mod.rs's KILN_CUH.
    cuh_path = sys.argv[sys.argv.index("--kernels") + 1] if "--kernels" in sys.argv else "kernels/kiln.cuh"
    cuh = open(cuh_path).read() + open(os.path.join(os.path.dirname(cuh_path), "kiln_mma.cuh")).read()
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"NVRTC {major.value}.{minor.value}, {os.cpu_count()} CPUs")
    progs = programs(cache, cuh)
    print("batched programs in the cache (kernels each):", [len(k) for _, k in progs[:12]])
    arch, kernels = progs[0]
    base = [f"--gpu-architecture={arch}"] + KILN_OPTIONS
    ptx_opts = [f"--gpu-architecture={arch.replace('sm_', 'compute_')}"] + KILN_OPTIONS
    src = source_of(cuh, kernels)
    print(f"largest: {len(kernels)} kernels, {len(src.splitlines())} lines, arch {arch}")
    rows = []

    def row(name, seconds, note=""):
        rows.append((name, seconds * 1000, note))
        print(f"  {name:58s} {seconds * 1000:9.1f} ms  {note}", flush=True)

    compile_source(source_of(cuh, kernels[:1]), base)  # NVRTC's start-up
    one = kernels[:1]
    row("kiln.cuh + 1 kernel, cubin", best(lambda: compile_source(source_of(cuh, one), base)[0], 3))
    row("kiln.cuh + 1 kernel, cubin, --minimal", best(lambda: compile_source(source_of(cuh, one), base + ["--minimal"])[0], 3))
    row("kiln.cuh + 1 kernel, PTX", best(lambda: compile_source(source_of(cuh, one), ptx_opts, "ptx")[0], 3))
    t, cub, log = compile_source(src, base)
    row(f"all {len(kernels)} kernels, cubin", t, f"{len(cub) if cub else log}")
    row(f"all {len(kernels)} kernels, cubin again", compile_source(src, base)[0])
    row(f"all {len(kernels)} kernels, PTX only", compile_source(src, ptx_opts, "ptx")[0])
    for extra in (["--minimal"], ["--ptxas-options=-O0"], ["--ptxas-options=-O1"], ["--ptxas-options=-O2"],
                  ["--split-compile=0"], ["--ptxas-options=--split-compile=0"], ["--ptxas-options=-allow-expensive-optimizations=false"]):
        t, out, log = compile_source(src, base + extra)
        row(f"  + {' '.join(extra)}", t, f"{len(out)} bytes" if out else f"REFUSED: {log[:100]}")
    for opts, tag in ((base, ""), (base + ["--minimal"], " --minimal")):
        for p in (4, 6, 8, 10, 12, 16):
            wall, summed = by_threads(cuh, kernels, p, opts)
            row(f"{p} threads, one part each{tag}", wall, f"summed {summed * 1000:.0f} ms")
    for p, split in ((8, 2), (4, 4), (2, 8)):
        wall, summed = by_threads(cuh, kernels, p, base + ["--minimal", f"--split-compile={split}"])
        row(f"{p} threads --minimal --split-compile={split}", wall, f"summed {summed * 1000:.0f} ms")
    for p in (8, 12):
        wall, summed, size = by_fork(cuh, kernels, p, base + ["--minimal"])
        row(f"{p} forked processes --minimal", wall, f"summed {summed * 1000:.0f} ms")
    # Each kernel alone: which ones ptxas spends its time on.
    empty = best(lambda: compile_source(source_of(cuh, one), base)[0], 3)
    per = []
    for k in kernels:
        t = compile_source(source_of(cuh, [k]), base)[0]
        name = k.split("void ", 1)[1].split("(", 1)[0] if "void " in k else "?"
        per.append((t - empty, name, len(k.splitlines()), k))
    per.sort(key=lambda x: -x[0])
    total = sum(x[0] for x in per)
    print(f"\nper kernel above the empty program (sum {total * 1000:.0f} ms):")
    for t, name, lines, _ in per[:15]:
        print(f"    {t * 1000:7.1f} ms  {lines:4d} lines  {name}")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "slowest-kernels.cu"), "w") as f:
        for t, name, lines, k in per[:6]:
            f.write(f"// {t * 1000:.1f} ms\n{k}\n")
    for i, (arch2, ks) in enumerate(progs[1:4]):
        o2 = [f"--gpu-architecture={arch2}"] + KILN_OPTIONS
        row(f"program {i + 2}: {len(ks)} kernels, cubin", compile_source(source_of(cuh, ks), o2)[0])
        wall, summed = by_threads(cuh, ks, min(8, len(ks)), o2 + ["--minimal"])
        row(f"program {i + 2}: {min(8, len(ks))} threads --minimal", wall, f"summed {summed * 1000:.0f} ms")
    print("\n| experiment | ms | note |\n|---|---|---|")
    for name, ms, note in rows:
        print(f"| {name.strip()} | {ms:.1f} | {note} |")


if __name__ == "__main__":
    main()
