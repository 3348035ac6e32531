"""Variants of the generated residual-add + layer-norm row kernel timed
alone on the GPU (CuPy, NVRTC with kiln's options, CUDA events): BERT-base's
`[4096, 768]` bf16 rows (and GPT-2's f32 `[8192, 768]` norm without the
add), inputs rotated over enough copies that L2 holds none of them.

    python3 benches/probes/layer_norm.py   # from the checkout, on the GPU machine
    git show REV:snapshots/fused_op_cases_lower_to_cuda@add-layernorm-bf16.kir.snap > prev.snap
    LAYER_NORM_PREVIOUS=prev.snap python3 benches/probes/layer_norm.py   # REV's kernel beside today's

`before` is the kernel codegen emitted before pairing (layer_norm_before.cu:
a block of 128 threads a row, two block-wide combines of doubles, one
conversion a rounding); `codegen` is what it emits now, read from the
`add-layernorm-bf16.kir` codegen snapshot (rows set to 4096); the others
change one thing at a time: threads a row, adjacent columns a thread
(vector loads), the accumulator's type, the roundings (one conversion
each, in pairs, in integer ops, none). Every variant's output is
compared with `before`'s bits.
"""
import os
import re
import sys
import cupy as cp
import numpy as np

OPTS = ("--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550", "-Ikernels",
        "--gpu-architecture=sm_90")
HEAD = r'''#include "kiln.cuh"
__device__ __forceinline__ float lo16(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi16(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned pack16(float a, float b) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}
__device__ __forceinline__ void rnd2(float a, float b, float& ra, float& rb) {
  const unsigned r = pack16(a, b);
  ra = lo16(r);
  rb = hi16(r);
}
__device__ __forceinline__ float rnd_int(float f) {
  const unsigned u = __float_as_uint(f);
  return __uint_as_float((u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) & 0xffff0000u
                                                           : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
'''


ROUNDINGS = {
    # one cvt.rn.bf16.f32 a value (kiln::rnd_bf16, what codegen emits)
    "cvt": "kiln::rnd_bf16({})",
    # the same rounding in integer ops (NaN kept quiet, as the cvt does)
    "int": "rnd_int({})",
    # none: wrong bits, the cost of rounding alone
    "none": "({})",
}


def kernel(R, C, group, vec, acc, add, one_barrier=False, rounding="cvt"):
    """A row kernel: `group` threads a row, `vec` adjacent bf16 columns a
    load (1, 2, 4 or 8), sums in `acc` (double or float); `add`: the
    residual add of two inputs (BERT) or one input (GPT-2's norm);
    `rounding`: a key of ROUNDINGS, or "pair" (cvt.rn.bf16x2.f32 on two
    values at once)."""
    combine_double = acc == "float-double"
    if combine_double:
        acc = "float"
    runs = C // vec
    items = runs // group
    assert items * group * vec == C, (C, group, vec)
    block = group if group >= 96 else 256
    per_block = block // group
    cached = items * vec
    vt = {1: "unsigned short", 2: "unsigned", 4: "uint2", 8: "uint4"}[vec]
    words = max(vec // 2, 1)
    pair = rounding == "pair" and vec >= 2

    def rnd_stage(names, exprs, decl=True):
        """`names[j] = round(exprs[j])` for every j, in pairs when `pair`."""
        out = ""
        if pair:
            for j in range(0, len(names), 2):
                a, b = names[j], names[j + 1]
                d = "float " if decl else ""
                out += f"        {d}{a}, {b}; rnd2({exprs[j]}, {exprs[j + 1]}, {a}, {b});\n" if decl else \
                       f"        rnd2({exprs[j]}, {exprs[j + 1]}, {a}, {b});\n"
            return out
        r = ROUNDINGS["cvt" if rounding == "pair" else rounding]
        for n, e in zip(names, exprs):
            out += f"        {'const float ' if decl else ''}{n} = {r.format(e)};\n"
        return out

    def load(ptr, dst):
        s = f"        const {vt} w_{dst} = *reinterpret_cast<const {vt}*>(&{ptr}[rb + col]);\n"
        if vec == 1:
            s += f"        const float {dst}0 = __uint_as_float((unsigned)w_{dst} << 16);\n"
            return s
        s += f"        const unsigned* u_{dst} = reinterpret_cast<const unsigned*>(&w_{dst});\n"
        for w in range(words):
            s += f"        const float {dst}{2 * w} = lo16(u_{dst}[{w}]), {dst}{2 * w + 1} = hi16(u_{dst}[{w}]);\n"
        return s

    if combine_double:
        red = lambda v: f"    const double {v}d = kiln::group_reduce<{group}>((double){v}, kiln::Sum());\n    const float {v}f = (float)({v}d / (double)C);\n"
    elif group <= 32:
        red = lambda v: f"#pragma unroll\n    for (int o = {group // 2}; o > 0; o >>= 1) {v} += kiln::shfl_xor({v}, o);\n"
    elif one_barrier:
        red = lambda v: (f"#pragma unroll\n    for (int o = 16; o > 0; o >>= 1) {v} += kiln::shfl_xor({v}, o);\n"
                         f"    if (lane % 32 == 0) part_{v}[lane / 32] = {v};\n    __syncthreads();\n"
                         f"    {v} = part_{v}[0];\n"
                         f"    for (int w = 1; w < {group // 32}; ++w) {v} += part_{v}[w];\n")
    else:
        red = lambda v: f"    {v} = kiln::group_reduce<{group}>({v}, kiln::Sum());\n"
    J = range(vec)
    src = HEAD + 'extern "C" __global__ void k(unsigned short* __restrict__ out, const unsigned short* __restrict__ in0, '
    src += "const unsigned short* __restrict__ in1, const unsigned short* __restrict__ in2, const unsigned short* __restrict__ in3) {\n"
    src += f"  typedef int I;\n  const I R = {R}, C = {C};\n  const int lane = threadIdx.x % {group};\n"
    if one_barrier:
        src += f"  __shared__ {acc} part_a3[{group // 32}], part_a7[{group // 32}];\n"
    src += f"  for (I row = (I)blockIdx.x * {per_block} + threadIdx.x / {group}; row < R; row += (I)gridDim.x * {per_block}) {{\n"
    src += f"    const I rb = row * C;\n    float x[{cached}];\n    {acc} a3 = 0;\n"
    src += f"#pragma unroll\n    for (int it = 0; it < {items}; ++it) {{\n      const I col = (lane + it * {group}) * {vec};\n      {{\n"
    src += load("in0", "p")
    if add:
        src += load("in1", "q")
        src += rnd_stage([f"x[it * {vec} + {j}]" for j in J], [f"p{j} + q{j}" for j in J], decl=False)
    else:
        src += "".join(f"        x[it * {vec} + {j}] = p{j};\n" for j in J)
    src += "".join(f"        a3 += ({acc})(x[it * {vec} + {j}]);\n" for j in J)
    src += "      }\n    }\n" + red("a3")
    mean = lambda v: f"{v}f" if combine_double else f"(double)({v} / ({acc})C)"
    src += f"    const float r3 = kiln::to_float(kiln::bf16_from({mean('a3')}));\n    {acc} a7 = 0;\n"
    step = 2 if pair else 1
    src += f"#pragma unroll\n    for (int i = 0; i < {cached}; i += {step}) {{\n"
    K = range(step)
    src += rnd_stage([f"v{k}" for k in K], [f"x[i + {k}] - r3" for k in K])
    src += rnd_stage([f"s{k}" for k in K], [f"v{k} * v{k}" for k in K])
    src += "".join(f"        a7 += ({acc})(s{k});\n" for k in K) + "    }\n" + red("a7")
    src += f"    const float r7 = kiln::to_float(kiln::bf16_from({mean('a7')}));\n"
    src += "    const float r10 = kiln::rnd_bf16((r7 + 1.0018653e-12f));\n"
    src += "    const float r11 = kiln::rnd_bf16((1.0f / sqrtf(r10)));\n"
    src += f"#pragma unroll\n    for (int it = 0; it < {items}; ++it) {{\n      const I col = (lane + it * {group}) * {vec};\n"
    src += "      {\n" + load("in2", "g").replace("rb + col", "col") + load("in3", "b").replace("rb + col", "col")
    src += rnd_stage([f"c{j}" for j in J], [f"x[it * {vec} + {j}] - r3" for j in J])
    src += rnd_stage([f"n{j}" for j in J], [f"c{j} * r11" for j in J])
    src += rnd_stage([f"m{j}" for j in J], [f"n{j} * g{j}" for j in J])
    ys = [f"y{j}" for j in J]
    src += "".join(f"        const float y{j} = m{j} + b{j};\n" for j in J)
    if vec == 1:
        src += "        out[rb + col] = kiln::bf16_from(y0).bits;\n"
    else:
        packs = [f"pack16({ys[2 * w]}, {ys[2 * w + 1]})" for w in range(words)]
        init = packs[0] if words == 1 else "{" + ", ".join(packs) + "}"
        if words == 1:
            src += f"        *reinterpret_cast<unsigned*>(&out[rb + col]) = {init};\n"
        else:
            src += f"        *reinterpret_cast<{vt}*>(&out[rb + col]) = {vt}{init};\n"
    src += "      }\n    }\n  }\n}\n"
    grid = (R + per_block - 1) // per_block
    return src, grid, block


ADD_SRC = r'''extern "C" __global__ void k(uint4* __restrict__ out, const uint4* __restrict__ in0,
    const uint4* __restrict__ in1, const void* in2, const void* in3) {{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= {n}) return;
  const uint4 p = in0[i], q = in1[i];
  const unsigned* a = reinterpret_cast<const unsigned*>(&p);
  const unsigned* b = reinterpret_cast<const unsigned*>(&q);
  out[i] = uint4{{pack16(lo16(a[0]) + lo16(b[0]), hi16(a[0]) + hi16(b[0])), pack16(lo16(a[1]) + lo16(b[1]), hi16(a[1]) + hi16(b[1])),
                 pack16(lo16(a[2]) + lo16(b[2]), hi16(a[2]) + hi16(b[2])), pack16(lo16(a[3]) + lo16(b[3]), hi16(a[3]) + hi16(b[3]))}};
}}
'''


def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    R, C, COPIES = 4096, 768, 8
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "layer_norm_before.cu")) as f:
        before = f.read()
    snap = os.path.join(here, "..", "..", "snapshots", "fused_op_cases_lower_to_cuda@add-layernorm-bf16.kir.snap")
    with open(snap) as f:
        text = f.read()
    now = text[text.index('#include "kiln.cuh"'):]
    now = re.sub(r"void fused_reduction_[0-9a-f]+\(", "void k(", now).replace("const I R = 4,", f"const I R = {R},")
    rng = np.random.default_rng(1)
    ins = [(cp.asarray(bf16(rng.standard_normal((R, C), dtype=np.float32))),
            cp.asarray(bf16(rng.standard_normal((R, C), dtype=np.float32) * 0.5))) for _ in range(COPIES)]
    g = cp.asarray(bf16(1 + 0.1 * rng.standard_normal(C, dtype=np.float32)))
    b = cp.asarray(bf16(0.1 * rng.standard_normal(C, dtype=np.float32)))
    outs = [cp.zeros((R, C), dtype=cp.uint16) for _ in range(COPIES)]
    # The generated kernel's launch: 96 threads a row since row runs
    # (8 columns a thread), 128 before.
    threads = int(re.search(r"const int lane = threadIdx.x % (\d+);", now).group(1))
    variants = {"before (block 128, double, one cvt each)": (before, R, 128)}
    # LAYER_NORM_PREVIOUS=FILE: a snapshot of the same case from an earlier
    # commit (`git show REV:snapshots/...`), timed beside the current one.
    previous = os.environ.get("LAYER_NORM_PREVIOUS")
    if previous:
        with open(previous) as f:
            old = f.read()
        old = old[old.index('#include "kiln.cuh"'):]
        old = re.sub(r"void fused_reduction_[0-9a-f]+\(", "void k(", old).replace("const I R = 4,", f"const I R = {R},")
        old_threads = int(re.search(r"const int lane = threadIdx.x % (\d+);", old).group(1))
        variants[f"codegen from {os.path.basename(previous)}"] = (old, R, old_threads)
    variants["codegen (runs, paired, float partials, kept)"] = (now, R, threads)
    # The generated kernel with its threads' partials combined in float.
    float_combine = re.sub(r"const double (a\d+)d = kiln::group_reduce<(\d+)>\(\(double\)(a\d+), kiln::Sum\(\)\);",
                           r"const float \1d = kiln::group_reduce<\2>(\3, kiln::Sum());", now)
    variants["codegen, partials combined in float"] = (float_combine, R, threads)
    # ... and held to 32 registers (2048 threads an SM)
    bound = f"__launch_bounds__({threads}, {2048 // threads})"
    bounded = lambda t: t.replace('extern "C" __global__ void k(', f'extern "C" __global__ void {bound} k(')
    variants[f"codegen, {bound}"] = (bounded(now), R, threads)
    variants["codegen, float combine, launch bounds"] = (bounded(float_combine), R, threads)
    for group, vec, acc, rounding in [
        (128, 1, "double", "cvt"), (128, 2, "float", "cvt"), (128, 2, "float", "pair"), (128, 2, "float-double", "pair"),
        (96, 8, "double", "cvt"), (96, 8, "double", "pair"),
        (96, 8, "float", "cvt"), (96, 8, "float", "int"), (96, 8, "float", "pair"), (96, 8, "float", "none"),
        (32, 4, "float", "pair"), (32, 8, "float", "cvt"), (32, 8, "float", "pair"),
    ]:
        variants[f"group {group}, vec {vec}, {acc}, {rounding}"] = kernel(R, C, group, vec, acc, True, rounding=rounding)
    variants["bandwidth: out = in0 + in1, 16-byte loads"] = (HEAD + ADD_SRC.format(n=R * C // 8), R * C // 8 // 256, 256)
    fns = {}
    for name, (src, grid, block) in variants.items():
        try:
            fns[name] = (cp.RawKernel(src, "k", options=OPTS), grid, block)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name}: failed to compile: {str(e)[:600]}")
            if "-v" in sys.argv:
                print(src)
    ref = None
    for name, (fn, grid, block) in fns.items():
        fn((grid,), (block,), (outs[0], ins[0][0], ins[0][1], g, b))
        o = cp.asnumpy(outs[0])
        if ref is None:
            ref = o
        fns[name] = (fn, grid, block, (o != ref).mean(), fn.attributes["num_regs"])
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = {n: [] for n in fns}
    for _round in range(5):
        for name, (fn, grid, block, _, _) in fns.items():
            for rep in range(6):
                s.record()
                for i in range(40):
                    j = i % COPIES
                    fn((grid,), (block,), (outs[j], ins[j][0], ins[j][1], g, b))
                e.record()
                e.synchronize()
                times[name].append(cp.cuda.get_elapsed_time(s, e) / 40 * 1000)
    torch_rows = torch_times(R, C, COPIES)
    moved = (3 * R * C + 2 * C) * 2
    print(f"residual add + layer norm [{R}, {C}] bf16, {COPIES} input copies rotated, us a launch (median of 30 x 40):")
    for name, (fn, grid, block, diff, regs) in fns.items():
        us = float(np.median(times[name]))
        print(f"  {name:<42} {us:7.2f} us  {moved / us / 1e6:5.2f} TB/s  regs {regs:3d}  bits differing from before {diff:.5f}")
    for name, us in torch_rows.items():
        print(f"  {name:<42} {us:7.2f} us  {moved / us / 1e6:5.2f} TB/s")


def torch_times(R, C, COPIES):
    """PyTorch's add + layer norm on the same shapes, timed the same way:
    eager (two kernels) and torch.compile (Inductor's one)."""
    try:
        import torch
    except ImportError:
        return {}

    class AddNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(C, eps=1e-12, dtype=torch.bfloat16, device="cuda")

        def forward(self, a, b):
            return self.norm(a + b)

    torch.backends.cuda.matmul.allow_tf32 = False
    m = AddNorm()
    ins = [(torch.randn(R, C, device="cuda", dtype=torch.bfloat16),
            torch.randn(R, C, device="cuda", dtype=torch.bfloat16)) for _ in range(COPIES)]
    rows = {}
    for mode, fn in [("torch eager (add, then layer_norm)", m), ("torch.compile (Inductor)", torch.compile(m))]:
        with torch.no_grad():
            for j in range(COPIES):
                fn(*ins[j])
            torch.cuda.synchronize()
            ts = []
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(30):
                s.record()
                for i in range(40):
                    fn(*ins[i % COPIES])
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e) / 40 * 1000)
        rows[mode] = float(np.median(ts))
    return rows


if __name__ == "__main__":
    main()
