"""BERT-base's bias + erf GELU epilogue over [4096, 3072] bf16 timed alone
on the GPU (CuPy, NVRTC with kiln's options, CUDA events over 40
back-to-back launches, median of 30), as codegen emits it (read from the
`linear-bias-gelu-bf16.kir` codegen snapshot, sizes set to BERT's) and
changed one thing at a time; with the input rotated over 4 copies (not
in L2) and with one copy (in L2, as a GEMM's output just written may be).

    python3 benches/probes/erf_gelu.py   # from the checkout, on the GPU machine
"""
import os
import re

import cupy as cp
import numpy as np

R, C = 4096, 3072
OPTS = ("--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550", "-Ikernels",
        "--gpu-architecture=sm_90")


def generated():
    here = os.path.dirname(os.path.abspath(__file__))
    snap = os.path.join(here, "..", "..", "snapshots", "fused_op_cases_lower_to_cuda@linear-bias-gelu-bf16.kir.snap")
    text = open(snap).read()
    src = text[text.index('#include "kiln.cuh"'):]
    src = re.sub(r"void matmul_epilogue_[0-9a-f]+\(", "void k(", src)
    return src.replace("const I n = 3072;", f"const I n = {R * C};").replace("% 96)", f"% {C})")


def variants():
    gen = generated()
    v = {"generated": gen}
    v["bias as one 16-byte load a thread"] = gen.replace(
        "    kiln::vec8<kiln::bf16> o;",
        f"    const kiln::vec8<kiln::bf16> b8 = kiln::load8(in2 + base % {C});\n    kiln::vec8<kiln::bf16> o;").replace(
        f"kiln::to_float(in2[(i % {C})])", "kiln::to_float(b8.v[j])").replace(
        f"kiln::to_float(in2[(i1 % {C})])", "kiln::to_float(b8.v[j + 1])")
    v["no erf (wrong values: the rest's cost)"] = gen.replace("erff(", "(")
    # Two runs of 8 a thread, both loaded before either is computed (the
    # generated loop's store may alias the next load, so the compiler
    # keeps them in order), on half the grid.
    body = gen[gen.index("#pragma unroll"):gen.index("    kiln::store8(out + base, o);")]
    # The generated body of one run of 8 as a function, and the head of
    # a kernel `k` with the generated kernel's parameters.
    run8 = (
        '#include "kiln.cuh"\n'
        "__device__ __forceinline__ void run8(const kiln::vec8<kiln::bf16>& d3, const kiln::vec8<kiln::bf16>& d5,\n"
        "                                     kiln::vec8<kiln::bf16>& o, int base) {\n  typedef int I;\n"
        + body + "}\n"
        'extern "C" __global__ void k(kiln::bf16* out, const kiln::bf16* in0, const kiln::bf16* in1, '
        "const kiln::bf16* in2, const kiln::bf16* in3) {\n  typedef int I;\n"
        f"  const I n = {R * C};\n")
    two = (
        run8 +
        "  const I base = ((I)blockIdx.x * blockDim.x + threadIdx.x) * 16;\n  if (base >= n) return;\n"
        "  const kiln::vec8<kiln::bf16> a3 = kiln::load8(in3 + base), b3 = kiln::load8(in3 + base + 8);\n"
        f"  const kiln::vec8<kiln::bf16> a5 = kiln::load8(in2 + base % {C}), b5 = kiln::load8(in2 + (base + 8) % {C});\n"
        "  kiln::vec8<kiln::bf16> oa, ob;\n  run8(a3, a5, oa, base);\n  run8(b3, b5, ob, base + 8);\n"
        "  kiln::store8(out + base, oa);\n  kiln::store8(out + base + 8, ob);\n}\n")
    v["two runs a thread, loads first (grid / 2)"] = two
    # A grid of 8 blocks an SM striding over the rows, each thread
    # loading its next run before it computes this one (memory and the
    # erf's arithmetic overlap in every warp instead of in turns).
    stride = (
        run8 +
        "  const I stride = (I)gridDim.x * blockDim.x * 8;\n"
        "  I base = ((I)blockIdx.x * blockDim.x + threadIdx.x) * 8;\n  if (base >= n) return;\n"
        "  kiln::vec8<kiln::bf16> d3 = kiln::load8(in3 + base);\n"
        f"  kiln::vec8<kiln::bf16> d5 = kiln::load8(in2 + base % {C});\n"
        "  for (; base < n; base += stride) {\n"
        "    const I next = base + stride;\n"
        "    kiln::vec8<kiln::bf16> n3 = d3, n5 = d5;\n"
        "    if (next < n) {\n      n3 = kiln::load8(in3 + next);\n"
        f"      n5 = kiln::load8(in2 + next % {C});\n    }}\n"
        "    kiln::vec8<kiln::bf16> o;\n    run8(d3, d5, o, base);\n    kiln::store8(out + base, o);\n"
        "    d3 = n3;\n    d5 = n5;\n  }\n}\n")
    for blocks in (4, 8, 16):
        v[f"grid-stride, next run loaded first (132 x {blocks} blocks)"] = stride
    # The bias added by cuBLASLt's epilogue instead (one rounding, as the
    # other linear layers' biases are): the kernel is the GELU alone.
    only = gen.replace(f"    const kiln::vec8<kiln::bf16> d5 = kiln::load8(in2 + ((base % {C})));\n", "")
    only = re.sub(r"kiln::rnd2_bf16\(\(kiln::to_float\(d3\.v\[j\]\) \+ kiln::to_float\(d5\.v\[j\]\)\), "
                  r"\(kiln::to_float\(d3\.v\[j \+ 1\]\) \+ kiln::to_float\(d5\.v\[j \+ 1\]\)\), v6, v6_1\);",
                  "v6 = kiln::to_float(d3.v[j]); v6_1 = kiln::to_float(d3.v[j + 1]);", only)
    assert "d5" not in only, only
    v["GELU only (bias in the GEMM's epilogue)"] = only
    v["restrict pointers"] = gen.replace("kiln::bf16* out,", "kiln::bf16* __restrict__ out,").replace(
        "const kiln::bf16* in2, const kiln::bf16* in3)", "const kiln::bf16* __restrict__ in2, const kiln::bf16* __restrict__ in3)")
    v["copy of the same bytes"] = (
        '#include "kiln.cuh"\nextern "C" __global__ void k(kiln::bf16* out, const kiln::bf16* in0, const kiln::bf16* in1, '
        "const kiln::bf16* in2, const kiln::bf16* in3) {\n  typedef int I;\n"
        f"  const I n = {R * C};\n"
        "  for (I base = ((I)blockIdx.x * blockDim.x + threadIdx.x) * 8; base < n; base += (I)gridDim.x * blockDim.x * 8)\n"
        "    kiln::store8(out + base, kiln::load8(in3 + base));\n}\n")
    return v


def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    rng = np.random.default_rng(2)
    copies = [cp.asarray(bf16(rng.standard_normal((R, C), dtype=np.float32))) for _ in range(4)]
    bias = cp.asarray(bf16(0.1 * rng.standard_normal(C, dtype=np.float32)))
    outs = [cp.zeros((R, C), dtype=cp.uint16) for _ in range(4)]
    dummy = cp.zeros(1, dtype=cp.uint16)
    threads = R * C // 8
    grid, block = (threads + 255) // 256, 256
    fns = {}
    ref = None
    grids = {}
    for name, src in variants().items():
        fn = cp.RawKernel(src, "k", options=OPTS)
        per_sm = re.search(r"132 x (\d+) blocks", name)
        grids[name] = (grid + 1) // 2 if "grid / 2" in name else 132 * int(per_sm.group(1)) if per_sm else grid
        fn((grids[name],), (block,), (outs[0], dummy, dummy, bias, copies[0]))
        o = cp.asnumpy(outs[0])
        if ref is None:
            ref = o
        fns[name] = (fn, (o != ref).mean(), fn.attributes["num_regs"])
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = {(n, m): [] for n in fns for m in (4, 1)}
    for _round in range(5):
        for name, (fn, _, _) in fns.items():
            for m in (4, 1):
                for _rep in range(6):
                    s.record()
                    for i in range(40):
                        j = i % m
                        fn((grids[name],), (block,), (outs[j], dummy, dummy, bias, copies[j]))
                    e.record()
                    e.synchronize()
                    times[(name, m)].append(cp.cuda.get_elapsed_time(s, e) / 40 * 1000)
    moved = 2 * R * C * 2
    print(f"bias + erf GELU [{R}, {C}] bf16, us a launch (median of 30 x 40): not in L2 / in L2")
    for name, (fn, diff, regs) in fns.items():
        a, b = (float(np.median(times[(name, m)])) for m in (4, 1))
        print(f"  {name:<40} {a:7.2f} ({moved / a / 1e6:4.2f} TB/s) / {b:7.2f}  regs {regs:3d}  bits differing {diff:.5f}")


if __name__ == "__main__":
    main()
